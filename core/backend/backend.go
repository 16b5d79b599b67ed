// Package backend is the boundary between a compiled graph and the device
// that runs it. A Backend binds every step of a plan.Plan to one of its
// kernels (one binding table per backend, one binding per op) and keeps the
// sequences' state (KDA conv and recurrent states, MLA latents, indexer
// pools) in a Store of its own memory. The engine, the scheduler and the
// passes see only these interfaces; they never know which device runs.
//
// Backends register themselves by name (Register); core/backend/cpu is
// "cpu" and core/backend/cuda is "cuda".
package backend

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"

	"github.com/glmflash/glmflash/core/cache"
	"github.com/glmflash/glmflash/core/collective"
	"github.com/glmflash/glmflash/core/plan"
	"github.com/glmflash/glmflash/model"
)

// Backend runs plans on one device.
type Backend interface {
	// Name is the device name used in YAML and flags ("cpu", "cuda").
	Name() string
	// Compile binds every step of p to a kernel of this backend; an op
	// without a binding is an error naming it.
	Compile(p *plan.Plan) (Program, error)
	// NewStore makes a store holding the state of the given layers of cfg
	// (cfg.TrunkLayers() for the trunk's programs, cfg.MTPLayers() for the
	// MTP layer's, whose positions are its own), sized by o. A program run
	// on a store without the state of one of its layers fails, naming the
	// layer.
	NewStore(cfg *model.Config, layers []int, o StoreOptions) (Store, error)
	// Ops lists the ops this backend binds (the table BoundOps reports).
	Ops() []string
	// Info describes the device and its memory use.
	Info() Info
	// Close releases the device; programs and stores become unusable.
	Close() error
}

// Info describes a backend's device.
type Info struct {
	Backend   string
	Device    string // e.g. "NVIDIA H200" or the CPU model
	Precision Precision
	// Memory in bytes by category (weights by dtype, caches, workspace);
	// empty where the backend does not track it.
	Memory map[string]int64
}

// Program is a plan bound to a backend's kernels. Run calls are serialized.
type Program interface {
	Plan() *plan.Plan
	// Run validates and executes one batch; on success every sequence's
	// state has advanced by its new tokens. An invalid batch changes no state.
	Run(b *Batch, st Store) (*Result, error)
	// Execute runs a batch prepared with Prepare.
	Execute(pr *Prepared) (*Result, error)
	// Stats are the program's counters since it was compiled.
	Stats() Stats
}

// Stats count what a program did, on every backend.
type Stats struct {
	// Runs is the number of executed batches.
	Runs int64
	// DeviceLengthReads counts reads of executor-produced sequence lengths
	// (seq_lengths) instead of the host metadata.
	DeviceLengthReads int64
	// FusedMHCRuns counts mhc_post_pre executions that took the fused path.
	FusedMHCRuns int64
}

// DeviceStats are a device backend's program counters: Stats and what the
// device did. DeviceStatsOf reads them from any program.
type DeviceStats struct {
	Stats
	// HostSyncs counts waits of the host for the device (length
	// read-backs and result copies).
	HostSyncs int64
	// LengthSyncs counts the host syncs that were length read-backs.
	LengthSyncs int64
	// Launches counts kernel launches.
	Launches int64
	// GraphReplays counts batches run by replaying a captured CUDA graph;
	// GraphCaptures the graphs captured, GraphEvictions those destroyed to
	// keep the program's bound on graphs (the least recently replayed
	// first), GraphsHeld those the program keeps now.
	GraphReplays, GraphCaptures, GraphEvictions, GraphsHeld int64
	// Kernels counts kernels executed: eager launches plus the kernels
	// every graph replay runs; a cuBLAS or cuBLASLt call counts as one.
	Kernels int64
	// DeviceNs is the device time of the executed batches, from CUDA
	// events recorded before a batch's first upload and after its last
	// kernel.
	DeviceNs int64
	// PrepNs is the host's time preparing the executed batches before their
	// first device work (metadata, the arena plan, a graph capture); it is
	// not in DeviceNs.
	PrepNs int64
	// ByKind breaks the executed batches down by step kind (KindOf),
	// indexed by StepKind.
	ByKind [NumStepKinds]KindStats
}

// StepKind is what a batch holds (KindOf).
type StepKind int

// The step kinds.
const (
	// StepDecode: decode tokens only (one token a sequence, or verify
	// spans whose every row gets logits).
	StepDecode StepKind = iota
	// StepMixed: prompt chunks beside decode tokens.
	StepMixed
	// StepPrefill: prompt chunks only.
	StepPrefill
	// NumStepKinds counts the kinds.
	NumStepKinds
)

// String is the kind's name in reports: decode, mixed or prefill.
func (k StepKind) String() string {
	switch k {
	case StepDecode:
		return "decode"
	case StepMixed:
		return "mixed"
	case StepPrefill:
		return "prefill"
	}
	return fmt.Sprintf("StepKind(%d)", int(k))
}

// KindOf classifies a prepared batch: a span of one token, or one whose
// every row gets logits (a speculative verify span), is a decode span, any
// other a prompt chunk; a batch of decode spans only is StepDecode, of
// prompt chunks only StepPrefill, of both StepMixed.
func KindOf(pr *Prepared) StepKind {
	dec, chunk := false, false
	for _, s := range pr.Spans {
		if s.N <= max(s.Rows, 1) {
			dec = true
		} else {
			chunk = true
		}
	}
	switch {
	case dec && chunk:
		return StepMixed
	case chunk:
		return StepPrefill
	}
	return StepDecode
}

// KindStats are a device program's counters over the batches of one step
// kind: the batches, their kernel launches (a graph replay is one), graph
// replays and kernels run, their tokens and the padding tokens that ran
// beside them (a batch padded to a bucket graph), and their device time.
type KindStats struct {
	Steps, Launches, GraphReplays, Kernels, Tokens, PadTokens, DeviceNs int64
}

// Sub is s − o, counter by counter.
func (s KindStats) Sub(o KindStats) KindStats {
	return KindStats{Steps: s.Steps - o.Steps, Launches: s.Launches - o.Launches, GraphReplays: s.GraphReplays - o.GraphReplays, Kernels: s.Kernels - o.Kernels,
		Tokens: s.Tokens - o.Tokens, PadTokens: s.PadTokens - o.PadTokens, DeviceNs: s.DeviceNs - o.DeviceNs}
}

// Add is s + o, counter by counter.
func (s KindStats) Add(o KindStats) KindStats {
	return KindStats{Steps: s.Steps + o.Steps, Launches: s.Launches + o.Launches, GraphReplays: s.GraphReplays + o.GraphReplays, Kernels: s.Kernels + o.Kernels,
		Tokens: s.Tokens + o.Tokens, PadTokens: s.PadTokens + o.PadTokens, DeviceNs: s.DeviceNs + o.DeviceNs}
}

// DeviceCounter is a program that counts its device work (device
// backends).
type DeviceCounter interface {
	DeviceStats() DeviceStats
}

// DeviceStatsOf returns p's counters: its DeviceStats where it is a
// DeviceCounter, else its Stats with every device counter zero.
func DeviceStatsOf(p Program) DeviceStats {
	if d, ok := p.(DeviceCounter); ok {
		return d.DeviceStats()
	}
	return DeviceStats{Stats: p.Stats()}
}

// KernelCounter is a program that counts its kernels by name (device
// backends): how many times each ran, graph replays included.
type KernelCounter interface {
	KernelRuns() map[string]int64
}

// OpTime is the device time one op took over a program's runs.
type OpTime struct {
	Op    string
	Calls int64
	Ms    float64
}

// OpProfiler is a program that times its ops (a device backend's option,
// e.g. cuda.Options.ProfileOps).
type OpProfiler interface {
	OpTimes() []OpTime
}

// StoreOptions size a store.
type StoreOptions struct {
	// Slots is the number of sequence slots.
	Slots int
	// MaxPositions is the tokens one slot can hold (device stores allocate
	// their caches for it).
	MaxPositions int
	// Rollback is the most positions a checkpointed slot may run past its
	// checkpoint (Store.Checkpoint): a speculative verify span's drafts + 1,
	// a drafter's steps. Device stores allocate per-position KDA states and
	// indexer rows for it in every slot; 0 allows no checkpoints.
	Rollback int
	// PageTokens is the tokens per page of a paged store's MLA latents and
	// indexer pooled keys, a multiple of index_kpool (0: the backend's
	// default, cache.DefaultPageTokens).
	PageTokens int
	// Pages is a paged store's page pool (0: Slots × ⌈MaxPositions /
	// PageTokens⌉, so that every slot can hold MaxPositions tokens).
	Pages int
	// KVDType is the MLA latents' dtype (KVAuto: the backend's default for
	// its precision); a backend refuses one it does not hold.
	KVDType KVDType
}

// KVDType is the dtype a store holds the MLA latents in, parsed once from a
// setting (ParseKVDType).
type KVDType string

const (
	// KVAuto is the backend's choice: bf16 on CUDA under precision bf16,
	// fp32 otherwise (the parity mode keeps fp32).
	KVAuto KVDType = "auto"
	// KVFP32 holds fp32 latents.
	KVFP32 KVDType = "fp32"
	// KVBF16 holds bf16 latents (rounded to nearest even as appended).
	KVBF16 KVDType = "bf16"
	// KVFP8 holds the latents and the indexer's pooled keys as e4m3 codes
	// with a power-of-two fp32 scale per 128 values (paged.FP8Block),
	// quantized as they are appended and dequantized as the kernels read
	// them: lossy (logits within the quantization error of fp32's, not
	// bit-identical).
	KVFP8 KVDType = "fp8"
)

// ErrKVDType is the error of a kv dtype that is not auto, fp32, bf16 or fp8.
var ErrKVDType = errors.New("must be auto, fp32, bf16 or fp8")

// ParseKVDType parses a kv dtype setting ("" is KVAuto). The error says what
// was given; the caller names the setting.
func ParseKVDType(s string) (KVDType, error) {
	switch d := KVDType(s); d {
	case "":
		return KVAuto, nil
	case KVAuto, KVFP32, KVBF16, KVFP8:
		return d, nil
	}
	return "", fmt.Errorf("%w, got %q", ErrKVDType, s)
}

// ErrNoPages is the error (errors.Is) of a run or Copy that needs more KV
// pages than its store has free; it changed no state. A scheduler preempts
// a sequence on it.
var ErrNoPages = cache.ErrNoPages

// PageStats are a paged store's pages (size, total, used, free) and the
// bytes of a page and of a state slot.
type PageStats = cache.PageStats

// PagedStore is a store whose MLA latents and indexer pooled keys live in a
// fixed pool of pages: it reports the pool.
type PagedStore interface {
	PageStats() PageStats
}

// MemoryReporter is a backend that says how much memory it could still
// allocate, the memory planner's input (core/engine: PlanMemory): a
// device's free memory (CUDA: cuMemGetInfo, after the weights, workspace
// and graphs it holds), the host's available memory on the CPU
// (/proc/meminfo MemAvailable). Total is the memory in all (0: unknown).
type MemoryReporter interface {
	FreeMemory() (free, total int64, err error)
}

// StoreCost is what a store would take of the memory a MemoryReporter
// reports: per page id (one page in every DSA layer of the store), per
// state slot (its fixed KDA and indexer state, rollback record and page
// table row) and once (Fixed).
type StoreCost struct {
	PageBytes, SlotBytes, FixedBytes int64
}

// StoreSizer is a backend that says what a store of the given layers,
// sized by o (its Slots and Pages aside), would cost, before it is made:
// the memory planner sizes the page pool and the state slots from it.
type StoreSizer interface {
	StoreCost(cfg *model.Config, layers []int, o StoreOptions) (StoreCost, error)
}

// Store holds sequence state in numbered slots. It is safe for concurrent
// use; a slot's contents belong to whoever allocated it.
type Store interface {
	// Alloc reserves a free slot with an empty sequence.
	Alloc() (int, error)
	// Free releases a slot.
	Free(slot int) error
	// Len is the number of tokens an allocated slot has processed.
	Len(slot int) (int, error)
	// Capacity is the number of slots; InUse counts allocated ones.
	Capacity() int
	InUse() int
	// Checkpoint opens a rollback record on an allocated slot at its
	// current length (replacing an open one). Until Truncate, the next
	// Checkpoint or Free, the programs that advance the slot keep what it
	// takes to cut it back to any length from the checkpoint on: each KDA
	// layer's conv window and recurrent state after every position, and
	// each indexer's raw key and gate rows from the start of the pool
	// pending at the checkpoint. A run that would take the slot past
	// StoreOptions.Rollback positions after it fails.
	Checkpoint(slot int) error
	// Truncate cuts a checkpointed slot back to n tokens (checkpoint ≤ n ≤
	// Len) and closes the record: MLA latents and indexer rows past n are
	// dropped, a pool that a dropped token completed is reopened (its
	// pending rows restored), and KDA states become those after position
	// n−1, exactly the state a run of the first n tokens leaves. A store
	// holding KDA state needs n > checkpoint (the state at the checkpoint
	// itself is not kept: a verify span keeps its first token).
	Truncate(slot, n int) error
	// Copy makes allocated slot dst hold src's state (n > 1 choices forked
	// from one prefill): its length, KDA conv windows and recurrent
	// states, MLA latents, the indexer's pools, pending rows and saved
	// selection; dst's open rollback record is closed, src is unchanged.
	// A src with an open checkpoint, and src = dst, are refused.
	Copy(src, dst int) error
}

// DraftStorer is a backend that keeps a DFlash drafter's per-sequence K/V
// state (the op dflash_attn): NewDraftStore makes a store of layers draft
// layers of width (kv_heads·head_dim) values per context position, sized
// by o (Rollback is unused: the state is K/V rows appended per position).
// Its Len counts a sequence's context positions; a draft program advances
// it by each sequence's context rows (Seq.Context).
type DraftStorer interface {
	NewDraftStore(layers, width int, o StoreOptions) (Store, error)
}

// StateReader is a store that copies a slot's state to the host: tests
// compare a speculative run's state after rollback with a plain run's, on
// every backend.
type StateReader interface {
	// ReadState copies an allocated slot's state: KDA conv windows and
	// recurrent states, MLA latents of its Len positions, the indexer's
	// complete pools and pending rows (and its shared selection, if saved).
	ReadState(slot int) (*cache.Seq, error)
}

// Options configure a backend.
type Options struct {
	// Precision is FP32 (default: fp32 activations and accumulation, the
	// parity mode) or BF16 (bf16 activations, fp32 accumulation).
	Precision Precision
	// FP32Weights keeps every GEMM weight in float32 even when it is exactly
	// representable in bfloat16.
	FP32Weights bool
	// Device holds one device backend's own options (cuda.Options for the
	// cuda backend); a backend ignores options of another.
	Device DeviceOptions
	// Comm is the rank's communicator when the backend runs one rank of a
	// tensor-parallel group (its programs' ir.OpAllReduce and
	// ir.OpAllGatherCols nodes run through it); nil: one device, and a
	// program holding a collective is refused at compile.
	Comm collective.Communicator
}

// DeviceOptions are the options of the device backend Backend names
// (cuda.Options), carried in Options.Device.
type DeviceOptions interface {
	Backend() string
}

// Precision is a backend's arithmetic, parsed once from a setting
// (ParsePrecision).
type Precision string

const (
	// FP32 computes in fp32 (the parity mode).
	FP32 Precision = "fp32"
	// BF16 gives GEMMs bf16 activations, accumulating in fp32.
	BF16 Precision = "bf16"
)

// ErrPrecision is the error of a precision that is neither fp32 nor bf16.
var ErrPrecision = errors.New("must be fp32 or bf16")

// ParsePrecision parses a precision setting ("" is FP32). The error says
// what was given; the caller names the setting (its key, flag or field).
func ParsePrecision(s string) (Precision, error) {
	switch p := Precision(s); p {
	case "":
		return FP32, nil
	case FP32, BF16:
		return p, nil
	}
	return "", fmt.Errorf("%w, got %q", ErrPrecision, s)
}

// Factory opens a backend.
type Factory func(opts Options) (Backend, error)

type registration struct {
	open Factory
	ops  func() []string
}

var (
	regMu    sync.Mutex
	registry = map[string]registration{}
)

// Register makes a backend available under name; ops lists the ops its
// binding table covers (static: known without opening a device, so that a
// test can check every backend against the IR). It panics on a duplicate.
func Register(name string, open Factory, ops func() []string) {
	regMu.Lock()
	defer regMu.Unlock()
	if _, dup := registry[name]; dup {
		panic("backend: " + name + " registered twice")
	}
	registry[name] = registration{open: open, ops: ops}
}

// BoundOps lists the ops the backend registered as name binds, sorted (nil
// for an unknown backend).
func BoundOps(name string) []string {
	regMu.Lock()
	r, ok := registry[name]
	regMu.Unlock()
	if !ok {
		return nil
	}
	ops := slices.Clone(r.ops())
	sort.Strings(ops)
	return ops
}

// Names lists the registered backends, sorted.
func Names() []string {
	regMu.Lock()
	defer regMu.Unlock()
	var n []string
	for k := range registry {
		n = append(n, k)
	}
	sort.Strings(n)
	return n
}

// Open opens the backend registered as name.
func Open(name string, opts Options) (Backend, error) {
	if name == "" {
		name = "cpu"
	}
	p, err := ParsePrecision(string(opts.Precision))
	if err != nil {
		return nil, fmt.Errorf("backend options: precision: %w", err)
	}
	opts.Precision = p
	regMu.Lock()
	r, ok := registry[name]
	regMu.Unlock()
	if !ok {
		return nil, fmt.Errorf("unknown device %q (have %v)", name, Names())
	}
	return r.open(opts)
}

// LazyWeights is a backend that reads its constants through plan.Raw and
// Plan.Const as it uploads them (the CUDA backend): the engine then compiles
// lazy plans, so a large checkpoint's weights are never all held as float32
// in host memory.
type LazyWeights interface {
	LazyWeights() bool
}
