// Package cuda is the CUDA backend: every op of the IR bound to a kernel of
// kernels/cuda (or to cuBLAS), weights uploaded once per backend in their
// checkpoint dtype (bf16 stays bf16), activations in one device arena laid
// out by liveness for each batch, sequence state in device memory per slot,
// and sampling on the device so that only token ids and requested logprobs
// come back.
package cuda

import (
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/plan"
	kc "github.com/glmflash/glmflash/kernels/cuda"
	"github.com/glmflash/glmflash/model/safetensors"
)

func init() {
	backend.Register("cuda", func(o backend.Options) (backend.Backend, error) { return Open(o) }, boundOps)
}

// Backend runs plans on one GPU. Backends of one GPU in a process share
// the device (one context, module and stream) and its uploaded weights,
// which live until the last of them closes.
type Backend struct {
	dev *kc.Device
	sh  *shared
	// opts are the backend's options, cuda its own among them
	// (opts.Device).
	opts backend.Options
	cuda Options
	gemm *gemmPolicy // the GEMM dispatch, built from the options
	// poisonLengths makes seq_lengths nodes write wrong lengths (set by
	// tests through export_test.go: a graph that never reads them is
	// unaffected).
	poisonLengths bool
	closed        bool
}

// Options are the CUDA backend's own options, carried in
// backend.Options.Device.
type Options struct {
	// DeviceIndex selects the GPU.
	DeviceIndex int
	// GraphMaxTokens bounds the batches captured into CUDA graphs and
	// replayed (0: DefaultGraphMaxTokens; negative: no graphs, every
	// launch eager).
	GraphMaxTokens int
	// GraphBuckets are the token counts of bucket graphs (nil:
	// DefaultGraphBuckets): a batch of more than GraphMaxTokens tokens up
	// to the largest bucket is padded to a bucket (padBatch) and replays
	// the bucket's graph; NoGraphBuckets turns them off (such batches
	// launch eagerly). Ascending, each positive (config.CheckGraphBuckets).
	GraphBuckets   []int
	NoGraphBuckets bool
	// MaxGraphs bounds the graphs a program keeps (0: DefaultMaxGraphs);
	// past it the least recently replayed is destroyed.
	MaxGraphs int
	// ProfileOps times every step on the device (events around each op's
	// launches; graphs off) for a per-op breakdown (backend.OpProfiler).
	ProfileOps bool
	// GEMM builds the backend's GEMM policy (gemm_policy.go).
	GEMM GEMMOptions
}

// IsZero reports whether o is the zero Options (every default).
func (o Options) IsZero() bool {
	return o.DeviceIndex == 0 && o.GraphMaxTokens == 0 && o.GraphBuckets == nil && !o.NoGraphBuckets && o.MaxGraphs == 0 && !o.ProfileOps && o.GEMM == (GEMMOptions{})
}

// Backend names the backend the options are for (backend.DeviceOptions).
func (Options) Backend() string { return "cuda" }

// OptionsOf returns the CUDA options o carries (the zero Options where it
// carries none, or another backend's).
func OptionsOf(o backend.Options) Options {
	c, _ := o.Device.(Options)
	return c
}

// shared is a GPU's state common to every Backend on it.
type shared struct {
	dev     *kc.Device
	idx     int
	refs    int
	mu      sync.Mutex
	weights map[string]devTensor // device copies of constants, by source and canonical key
	wbytes  map[string]int64     // weight bytes by dtype
	ids     map[any]int          // weight sources seen (for keys)
	// caches counts the bytes of the stores' device buffers, work those of
	// the programs' arenas, metadata and sampling buffers and the tuner's
	// scratch (Info's "caches" and "workspace").
	caches, work atomic.Int64
}

var (
	sharedMu sync.Mutex
	devices  = map[int]*shared{}
)

// devTensor is a constant on the device: fp32, bf16, or (GEMM weights
// only) fp8 e4m3 with fp32 scales per 128×128 block.
type devTensor struct {
	ptr   kc.DevicePtr
	bf16  bool
	n     int64 // elements
	bytes int64
	// fp8: the codes at ptr, the block scales at scale, sld scales per row
	// block (ceil(cols/128)) and sgoff scales per stacked matrix
	fp8         bool
	scale       kc.DevicePtr
	scaleBytes  int64
	sld, sgoff  int64
	rows, cols  int64 // one matrix's shape (fp8)
	matrixCount int64
}

// flag is the weight-storage flag of the kernels that take bf16 or fp32
// (an fp8 tensor never reaches them: upload keeps fp8 only for GEMMs).
func (t devTensor) flag() int64 {
	if t.bf16 {
		return 1
	}
	return 0
}

// wtype is GemmArgs.w_type: WT_F32, WT_BF16 or WT_FP8 of gemm.cu.
func (t devTensor) wtype() int64 {
	if t.fp8 {
		return 2
	}
	return t.flag()
}

// setW points GEMM args at weight t (scales included).
func (t devTensor) setW(a *kc.GemmArgs) {
	a.W, a.WType = t.ptr, t.wtype()
	if t.fp8 {
		a.Ws, a.WsLd, a.WsGoff = t.scale, t.sld, t.sgoff
	}
}

// Open initialises the GPU OptionsOf(o).DeviceIndex with the GEMM options
// OptionsOf(o).GEMM; it fails at once, naming what is missing (driver,
// GPU, cuBLAS), where CUDA cannot run.
func Open(o backend.Options) (*Backend, error) { return OpenWith(o, OptionsOf(o).GEMM) }

// OpenWith is Open with GEMM options g.
func OpenWith(o backend.Options, g GEMMOptions) (*Backend, error) {
	prec, err := backend.ParsePrecision(string(o.Precision))
	if err != nil {
		return nil, fmt.Errorf("cuda backend: precision %q is not available (fp32 and bf16 are)", o.Precision)
	}
	o.Precision = prec
	co := OptionsOf(o)
	sharedMu.Lock()
	defer sharedMu.Unlock()
	pol, err := newGEMMPolicy(g, string(o.Precision), 0) // before the device opens: bad options fail alone
	if err != nil {
		return nil, err
	}
	sh := devices[co.DeviceIndex]
	if sh == nil {
		dev, err := kc.Open(co.DeviceIndex)
		if err != nil {
			return nil, err
		}
		sh = &shared{dev: dev, idx: co.DeviceIndex, weights: map[string]devTensor{}, wbytes: map[string]int64{}, ids: map[any]int{}}
		devices[co.DeviceIndex] = sh
	}
	pol.sms = sh.dev.SMs
	sh.refs++
	return &Backend{dev: sh.dev, sh: sh, opts: o, cuda: co, gemm: pol}, nil
}

// Name is "cuda".
func (b *Backend) Name() string { return "cuda" }

// Device returns the GPU.
func (b *Backend) Device() *kc.Device { return b.dev }

// LazyWeights implements backend.LazyWeights: constants are read as they
// are uploaded (stored BF16 and FP8 bytes through plan.Raw).
func (b *Backend) LazyWeights() bool { return true }

// Ops lists the bound ops.
func (b *Backend) Ops() []string { return boundOps() }

// Info describes the GPU and the device memory in use, in bytes by
// category: "weights_<dtype>" (the uploaded constants by the dtype they
// are held in), "caches" (every store's sequence state: KDA windows and
// states, MLA latents, indexer pools, rollback records), "workspace" (the
// programs' activation arenas, which hold the ops' temporaries too, their
// metadata and sampling buffers, the tuner's scratch while it measures, and
// the cuBLASLt workspace once allocated) and "total_allocated" (everything
// allocated on the device through this process's Device, which the other
// categories sum to at most).
func (b *Backend) Info() backend.Info {
	b.sh.mu.Lock()
	defer b.sh.mu.Unlock()
	mem := map[string]int64{}
	for k, v := range b.sh.wbytes {
		mem["weights_"+k] = v
	}
	mem["caches"] = b.sh.caches.Load()
	mem["workspace"] = b.sh.work.Load() + b.dev.LtWorkspaceBytes()
	mem["total_allocated"] = b.dev.Live()
	pdl := "programmatic dependent launch off"
	if b.dev.PDL {
		pdl = "programmatic dependent launch on"
	}
	return backend.Info{Backend: "cuda", Device: fmt.Sprintf("%s (compute %d.%d, %d SMs, %s, %s)", b.dev.Name, b.dev.CC[0], b.dev.CC[1], b.dev.SMs, b.dev.BlasVersion(), pdl), Precision: b.opts.Precision, Memory: mem}
}

// Close releases this backend; the last one on a GPU frees the weights and
// the device.
func (b *Backend) Close() error {
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	sh := b.sh
	if sh.refs--; sh.refs > 0 {
		return nil
	}
	delete(devices, sh.idx)
	err := sh.dev.Do(func() error {
		for _, t := range sh.weights {
			sh.dev.Free(t.ptr, t.bytes)
			if t.scale != 0 {
				sh.dev.Free(t.scale, t.scaleBytes)
			}
		}
		return nil
	})
	sh.weights = nil
	if cerr := sh.dev.Close(); err == nil {
		err = cerr
	}
	return err
}

// upload returns the device copy of constant v of plan p, uploading it on
// first use. Unless FP32Weights, a constant stored as BF16 is uploaded as
// its bytes, and one stored as FP8 stays FP8 (codes and block scales) when
// fp8OK (every reader is a GEMM that takes fp8): no float32 copy is made
// (plan.Raw). Otherwise it goes through the plan's float32 values: as bf16
// when every value is bf16-exact, else fp32. Must run inside dev.Do.
func (b *Backend) upload(p *plan.Plan, v *ir.Value, fp8OK bool) (devTensor, error) {
	sh := b.sh
	sh.mu.Lock()
	defer sh.mu.Unlock()
	id, ok := sh.ids[p.Source()]
	if !ok {
		id = len(sh.ids)
		sh.ids[p.Source()] = id
	}
	key := fmt.Sprintf("%d|%v|%v|%s", id, b.opts.FP32Weights, fp8OK, plan.ConstKey(v))
	if t, ok := sh.weights[key]; ok {
		return t, nil
	}
	if !b.opts.FP32Weights {
		raw, err := p.Raw(v)
		if err != nil {
			return devTensor{}, fmt.Errorf("reading %s: %w", v.Name, err)
		}
		use := raw != nil && (raw.DType == safetensors.BF16 || fp8OK && raw.Block == [2]int{fp8Block, fp8Block})
		var t devTensor
		if use {
			t, err = b.uploadRaw(raw)
		}
		p.ReleaseRaw(raw) // copied to the device (or not used): generated host bytes may go
		if use {
			if err != nil {
				return devTensor{}, fmt.Errorf("uploading %s: %w", v.Name, err)
			}
			sh.weights[key] = t
			return t, nil
		}
	}
	data, err := p.ConstErr(v)
	if err != nil {
		return devTensor{}, err
	}
	if data == nil {
		return devTensor{}, fmt.Errorf("%s is not a constant", v.Name)
	}
	var t devTensor
	var src unsafe.Pointer
	var bf []uint16
	if !b.opts.FP32Weights {
		bf = p.BF16(v)
	}
	if bf != nil {
		t = devTensor{bf16: true, n: int64(len(bf)), bytes: 2 * int64(len(bf))}
		src = unsafe.Pointer(unsafe.SliceData(bf))
	} else {
		t = devTensor{n: int64(len(data)), bytes: 4 * int64(len(data))}
		src = unsafe.Pointer(unsafe.SliceData(data))
	}
	ptr, err := b.dev.Alloc(t.bytes)
	if err != nil {
		return devTensor{}, fmt.Errorf("uploading %s: %w", v.Name, err)
	}
	t.ptr = ptr
	if err := b.dev.Upload(ptr, src, t.bytes); err != nil {
		return devTensor{}, err
	}
	if err := b.dev.Sync(); err != nil { // the host copy may go once this returns
		return devTensor{}, err
	}
	sh.weights[key] = t
	if t.bf16 {
		sh.wbytes["bf16"] += t.bytes
	} else {
		sh.wbytes["fp32"] += t.bytes
	}
	return t, nil
}

// fp8Block is the FP8 block size the kernels take (128×128, the released
// checkpoint's).
const fp8Block = 128

// uploadRaw copies a stored constant to the device: BF16 parts end to end
// as bf16, FP8 parts as their codes plus every part's block scales end to
// end. sh.mu held, inside dev.Do.
func (b *Backend) uploadRaw(raw *plan.RawTensor) (devTensor, error) {
	sh := b.sh
	t := devTensor{bytes: raw.Bytes(), n: raw.Bytes() / int64(raw.DType.Size())}
	t.bf16 = raw.DType == safetensors.BF16
	t.fp8 = raw.DType == safetensors.F8E4M3
	ptr, err := b.dev.Alloc(t.bytes)
	if err != nil {
		return devTensor{}, err
	}
	t.ptr = ptr
	off := int64(0)
	var scales []float32
	for _, pt := range raw.Parts {
		if len(pt.Data) > 0 {
			if err := b.dev.Upload(ptr+kc.DevicePtr(off), unsafe.Pointer(unsafe.SliceData(pt.Data)), int64(len(pt.Data))); err != nil {
				return devTensor{}, err
			}
		}
		off += int64(len(pt.Data))
		scales = append(scales, pt.Scales...)
	}
	if t.fp8 {
		p0 := raw.Parts[0]
		t.rows, t.cols = int64(p0.Rows), int64(p0.Cols)
		t.sld = (t.cols + fp8Block - 1) / fp8Block
		t.sgoff = (t.rows + fp8Block - 1) / fp8Block * t.sld
		t.matrixCount = int64(len(raw.Parts))
		t.scaleBytes = 4 * int64(len(scales))
		if t.scale, err = b.dev.Alloc(t.scaleBytes); err != nil {
			return devTensor{}, err
		}
		if err := b.dev.Upload(t.scale, unsafe.Pointer(unsafe.SliceData(scales)), t.scaleBytes); err != nil {
			return devTensor{}, err
		}
		sh.wbytes["fp8"] += t.bytes
		sh.wbytes["fp8_scales"] += t.scaleBytes
	} else {
		sh.wbytes["bf16"] += t.bytes
	}
	if err := b.dev.Sync(); err != nil { // the mapped bytes may go once this returns
		return devTensor{}, err
	}
	return t, nil
}

// binder binds one node: it reports the temporaries the node needs for a
// batch (bytes each; nil: none) and returns the launch.
type binder func(p *Program, n *ir.Node) (*kstep, error)

var bindings = map[string]binder{}

func bind(op string, f binder) {
	if _, dup := bindings[op]; dup {
		panic("cuda: op " + op + " bound twice")
	}
	bindings[op] = f
}

func boundOps() []string {
	var ops []string
	for op := range bindings {
		ops = append(ops, op)
	}
	sort.Strings(ops)
	return ops
}
