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
	"github.com/glmflash/glmflash/core/cache"
	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/plan"
	kc "github.com/glmflash/glmflash/kernels/cuda"
	"github.com/glmflash/glmflash/kernels/indexer"
	"github.com/glmflash/glmflash/model"
	"github.com/glmflash/glmflash/model/safetensors"
)

func init() {
	backend.Register("cuda", func(o backend.Options) (backend.Backend, error) { return Open(o) }, boundOps)
}

// Backend runs plans on one GPU. Backends of one GPU in a process share
// the device (one context, module and stream) and its uploaded weights,
// which live until the last of them closes.
type Backend struct {
	dev    *kc.Device
	sh     *shared
	opts   backend.Options
	gemm   *gemmPolicy // the GEMM dispatch, built from the options
	closed bool
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

// Open initialises the GPU o.DeviceIndex with the GEMM options of the
// environment (GEMMOptionsFromEnv); it fails at once, naming what is
// missing (driver, GPU, cuBLAS), where CUDA cannot run.
func Open(o backend.Options) (*Backend, error) { return OpenWith(o, GEMMOptionsFromEnv()) }

// OpenWith is Open with GEMM options g.
func OpenWith(o backend.Options, g GEMMOptions) (*Backend, error) {
	switch o.Precision {
	case "":
		o.Precision = "fp32"
	case "fp32", "bf16":
	default:
		return nil, fmt.Errorf("cuda backend: precision %q is not available (fp32 and bf16 are)", o.Precision)
	}
	sharedMu.Lock()
	defer sharedMu.Unlock()
	pol, err := newGEMMPolicy(g, o.Precision, 0) // before the device opens: bad options fail alone
	if err != nil {
		return nil, err
	}
	sh := devices[o.DeviceIndex]
	if sh == nil {
		dev, err := kc.Open(o.DeviceIndex)
		if err != nil {
			return nil, err
		}
		sh = &shared{dev: dev, idx: o.DeviceIndex, weights: map[string]devTensor{}, wbytes: map[string]int64{}, ids: map[any]int{}}
		devices[o.DeviceIndex] = sh
	}
	pol.sms = sh.dev.SMs
	sh.refs++
	return &Backend{dev: sh.dev, sh: sh, opts: o, gemm: pol}, nil
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
		if raw != nil && (raw.DType == safetensors.BF16 || fp8OK && raw.Block == [2]int{fp8Block, fp8Block}) {
			t, err := b.uploadRaw(raw)
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

// Store is sequence state in device memory: per layer and slot the KDA conv
// window and recurrent state, the MLA latent cache and the indexer's pooled
// keys and pending pool, each sized for maxPositions tokens. With a
// rollback depth, every slot also has its rollback record's buffers (per
// KDA layer the window and state after each of depth positions, per
// indexer the raw rows from the pending pool's start), and the MTP layer's
// indexer a saved selection row (index sharing).
type Store struct {
	b      *Backend
	id     uint64 // unique per process: the graphs captured on it are keyed by it
	cfg    *model.Config
	maxPos int
	depth  int
	mu     sync.Mutex
	used   []bool
	lens   []int
	ckpt   []int // open checkpoint's position per slot, −1 when none
	share  []int // the saved selection's position per slot, −1 when none
	layers []layerState
	bufs   []sized
}

type sized struct {
	p kc.DevicePtr
	n int64
}

// layerState holds one layer's buffers; strides are in floats per slot.
type layerState struct {
	conv, state             kc.DevicePtr
	convStride, stateStride int64
	ckv                     kc.DevicePtr
	ckvStride               int64
	pools, pendK, pendG     kc.DevicePtr
	poolsStride, pendStride int64
	// rollback records: per slot depth windows and states, raw indexer rows
	snapConv, snapState kc.DevicePtr
	recK, recG          kc.DevicePtr
	recStride           int64
	saved               kc.DevicePtr // the MTP indexer's saved selection row per slot (int32)
	savedStride         int64
}

// storeIDs numbers the stores (Store.id).
var storeIDs atomic.Uint64

// NewStore allocates slots slots holding the state of the given layers of
// cfg on the GPU.
func (b *Backend) NewStore(cfg *model.Config, layers []int, o backend.StoreOptions) (backend.Store, error) {
	slots, maxPositions := o.Slots, o.MaxPositions
	if slots < 1 {
		return nil, fmt.Errorf("cuda: need at least one slot, got %d", slots)
	}
	if maxPositions < 1 {
		return nil, fmt.Errorf("cuda: a store needs a positive context limit, got %d", maxPositions)
	}
	if err := cache.CheckLayers(cfg, layers); err != nil {
		return nil, err
	}
	if o.Rollback < 0 {
		return nil, fmt.Errorf("cuda: rollback depth must be ≥ 0, got %d", o.Rollback)
	}
	s := &Store{b: b, id: storeIDs.Add(1), cfg: cfg, maxPos: maxPositions, depth: o.Rollback, used: make([]bool, slots), lens: make([]int, slots),
		ckpt: make([]int, slots), share: make([]int, slots), layers: make([]layerState, cfg.NumHiddenLayers+cfg.NumNextNPredictLayers)}
	for i := range s.ckpt {
		s.ckpt[i], s.share[i] = -1, -1
	}
	depth := int64(o.Rollback)
	err := b.dev.Do(func() error {
		alloc := func(floatsPerSlot int64) (kc.DevicePtr, error) {
			n := 4 * floatsPerSlot * int64(slots)
			p, err := b.dev.Alloc(n)
			if err != nil {
				return 0, fmt.Errorf("cuda: allocating the cache (%d slots × %d positions): %w", slots, maxPositions, err)
			}
			s.bufs = append(s.bufs, sized{p, n})
			b.sh.caches.Add(n)
			return p, nil
		}
		var err error
		for _, l := range layers {
			ls := &s.layers[l]
			if cfg.IsKDA(l) {
				ls.convStride = int64(cfg.KDAConvLen())
				ls.stateStride = int64(cfg.KDAStateLen())
				if ls.conv, err = alloc(max(ls.convStride, 1)); err != nil {
					return err
				}
				if ls.state, err = alloc(ls.stateStride); err != nil {
					return err
				}
				if depth > 0 {
					if ls.snapConv, err = alloc(max(depth*ls.convStride, 1)); err != nil {
						return err
					}
					if ls.snapState, err = alloc(depth * ls.stateStride); err != nil {
						return err
					}
				}
				continue
			}
			ls.ckvStride = int64(maxPositions) * int64(cfg.KVLoraRank)
			if ls.ckv, err = alloc(ls.ckvStride); err != nil {
				return err
			}
			if cfg.HasOwnIndexer(l) {
				kp, di := int64(cfg.IndexKPool), int64(cfg.IndexHeadDim)
				ls.poolsStride = (int64(maxPositions)/kp + 1) * di
				ls.pendStride = kp * di
				if ls.pools, err = alloc(ls.poolsStride); err != nil {
					return err
				}
				if ls.pendK, err = alloc(ls.pendStride); err != nil {
					return err
				}
				if ls.pendG, err = alloc(ls.pendStride); err != nil {
					return err
				}
				if depth > 0 {
					ls.recStride = (kp - 1 + depth) * di
					if ls.recK, err = alloc(ls.recStride); err != nil {
						return err
					}
					if ls.recG, err = alloc(ls.recStride); err != nil {
						return err
					}
				}
				if cfg.IsMTP(l) { // index sharing between draft steps
					ls.savedStride = int64(cfg.IndexTopK + cfg.IndexKPool - 1)
					if ls.saved, err = alloc(ls.savedStride); err != nil {
						return err
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// Close frees the store's device memory.
func (s *Store) Close() error {
	return s.b.dev.Do(func() error {
		for _, b := range s.bufs {
			s.b.dev.Free(b.p, b.n)
			s.b.sh.caches.Add(-b.n)
		}
		s.bufs = nil
		return nil
	})
}

// Capacity is the number of slots.
func (s *Store) Capacity() int { return len(s.used) }

// InUse counts allocated slots.
func (s *Store) InUse() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, u := range s.used {
		if u {
			n++
		}
	}
	return n
}

// layer returns layer l's buffers (all zero where the store holds no state
// for l, which the binders report).
func (s *Store) layer(l int) layerState {
	if l < 0 || l >= len(s.layers) {
		return layerState{}
	}
	return s.layers[l]
}

// Alloc reserves a free slot and clears its KDA states on the device.
func (s *Store) Alloc() (int, error) {
	s.mu.Lock()
	slot := -1
	for i, u := range s.used {
		if !u {
			slot = i
			s.used[i] = true
			s.lens[i] = 0
			s.ckpt[i], s.share[i] = -1, -1
			break
		}
	}
	s.mu.Unlock()
	if slot < 0 {
		return -1, fmt.Errorf("cache: all %d slots are in use", len(s.used))
	}
	err := s.b.dev.Do(func() error {
		for _, ls := range s.layers {
			if ls.conv != 0 && ls.convStride > 0 {
				if err := s.b.dev.Zero(ls.conv+kc.DevicePtr(4*int64(slot)*ls.convStride), ls.convStride); err != nil {
					return err
				}
			}
			if ls.state != 0 {
				if err := s.b.dev.Zero(ls.state+kc.DevicePtr(4*int64(slot)*ls.stateStride), ls.stateStride); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		s.mu.Lock()
		s.used[slot] = false
		s.mu.Unlock()
		return -1, err
	}
	return slot, nil
}

// Free releases a slot.
func (s *Store) Free(slot int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if slot < 0 || slot >= len(s.used) || !s.used[slot] {
		return fmt.Errorf("cache: slot %d is not allocated", slot)
	}
	s.used[slot] = false
	s.ckpt[slot], s.share[slot] = -1, -1
	return nil
}

// Len is the number of tokens an allocated slot has processed.
func (s *Store) Len(slot int) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if slot < 0 || slot >= len(s.used) || !s.used[slot] {
		return 0, fmt.Errorf("cache: slot %d is not allocated", slot)
	}
	return s.lens[slot], nil
}

func (s *Store) advance(slot, n int) {
	s.mu.Lock()
	s.lens[slot] += n
	s.mu.Unlock()
}

// spanState returns, for a batch's slots, their open checkpoints' positions
// and saved selections' positions (−1: none).
func (s *Store) spanState(slots []int) (ckpt, share []int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ckpt, share = make([]int, len(slots)), make([]int, len(slots))
	for i, sl := range slots {
		ckpt[i], share[i] = s.ckpt[sl], s.share[sl]
	}
	return ckpt, share
}

// setShare records the positions of the selections a save run left.
func (s *Store) setShare(slots, pos []int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, sl := range slots {
		s.share[sl] = pos[i]
	}
}

// Checkpoint opens a rollback record on an allocated slot at its current
// length: the raw indexer rows pending at the checkpoint are copied into the
// record, and the kernels write the rest while it is open.
func (s *Store) Checkpoint(slot int) error {
	s.mu.Lock()
	if slot < 0 || slot >= len(s.used) || !s.used[slot] {
		s.mu.Unlock()
		return fmt.Errorf("cache: slot %d is not allocated", slot)
	}
	if s.depth < 1 {
		s.mu.Unlock()
		return fmt.Errorf("cache: the store keeps no rollback records (its rollback depth is 0)")
	}
	base := s.lens[slot]
	s.ckpt[slot] = base
	s.mu.Unlock()
	kp := int64(s.cfg.IndexKPool)
	return s.b.dev.Do(func() error {
		for _, ls := range s.layers {
			if ls.recK == 0 {
				continue
			}
			di := ls.pendStride / kp
			n := (int64(base) % kp) * di * 4 // pending rows: positions ⌊base/kp⌋·kp … base−1
			sl := int64(slot)
			if err := s.b.dev.Copy(ls.recK+kc.DevicePtr(4*sl*ls.recStride), ls.pendK+kc.DevicePtr(4*sl*ls.pendStride), n); err != nil {
				return err
			}
			if err := s.b.dev.Copy(ls.recG+kc.DevicePtr(4*sl*ls.recStride), ls.pendG+kc.DevicePtr(4*sl*ls.pendStride), n); err != nil {
				return err
			}
		}
		return nil
	})
}

// Truncate cuts a checkpointed slot back to n tokens and closes its record
// (backend.Store.Truncate): KDA windows and states from the record, the
// pending indexer rows of the pool n falls in from the record's raw rows;
// latents and pools past n are left to be overwritten.
func (s *Store) Truncate(slot, n int) error {
	s.mu.Lock()
	if slot < 0 || slot >= len(s.used) || !s.used[slot] {
		s.mu.Unlock()
		return fmt.Errorf("cache: slot %d is not allocated", slot)
	}
	base, cur := s.ckpt[slot], s.lens[slot]
	s.mu.Unlock()
	if base < 0 {
		return fmt.Errorf("cache: slot %d has no open checkpoint", slot)
	}
	if n < base || n > cur {
		return fmt.Errorf("cache: slot %d can be cut back to [%d, %d] tokens, not %d", slot, base, cur, n)
	}
	hasKDA := false
	for _, ls := range s.layers {
		hasKDA = hasKDA || ls.state != 0
	}
	if hasKDA && n == base && cur > base {
		return fmt.Errorf("cache: slot %d: the KDA state at the checkpoint (%d tokens) is not kept; keep at least one token after it", slot, base)
	}
	if n < cur {
		kp := int64(s.cfg.IndexKPool)
		sl := int64(slot)
		err := s.b.dev.Do(func() error {
			for _, ls := range s.layers {
				if ls.snapState != 0 {
					i := int64(n - 1 - base)
					if err := s.b.dev.Copy(ls.conv+kc.DevicePtr(4*sl*ls.convStride), ls.snapConv+kc.DevicePtr(4*(sl*int64(s.depth)+i)*ls.convStride), 4*ls.convStride); err != nil {
						return err
					}
					if err := s.b.dev.Copy(ls.state+kc.DevicePtr(4*sl*ls.stateStride), ls.snapState+kc.DevicePtr(4*(sl*int64(s.depth)+i)*ls.stateStride), 4*ls.stateStride); err != nil {
						return err
					}
				}
				if ls.recK != 0 {
					di := ls.pendStride / kp
					rbase := int64(base) / kp * kp
					first := int64(n) / kp * kp // the pool n falls in starts here
					off, cnt := (first-rbase)*di, (int64(n)-first)*di
					if err := s.b.dev.Copy(ls.pendK+kc.DevicePtr(4*sl*ls.pendStride), ls.recK+kc.DevicePtr(4*(sl*ls.recStride+off)), 4*cnt); err != nil {
						return err
					}
					if err := s.b.dev.Copy(ls.pendG+kc.DevicePtr(4*sl*ls.pendStride), ls.recG+kc.DevicePtr(4*(sl*ls.recStride+off)), 4*cnt); err != nil {
						return err
					}
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lens[slot] = n
	s.ckpt[slot] = -1
	if s.share[slot] >= n {
		s.share[slot] = -1
	}
	return nil
}

// ReadState copies an allocated slot's state to the host
// (backend.StateReader).
func (s *Store) ReadState(slot int) (*cache.Seq, error) {
	n, err := s.Len(slot)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	sharePos := s.share[slot]
	s.mu.Unlock()
	c := s.cfg
	L := len(s.layers)
	q := &cache.Seq{Len: n, Conv: make([][]float32, L), State: make([][]float32, L), CKV: make([][]float32, L), Index: make([]*indexer.State, L)}
	sl := int64(slot)
	down := func(p kc.DevicePtr, off, count int64) ([]float32, error) {
		x := make([]float32, count)
		if count == 0 {
			return x, nil
		}
		return x, s.b.dev.Download(unsafe.Pointer(unsafe.SliceData(x)), p+kc.DevicePtr(4*off), 4*count)
	}
	err = s.b.dev.Do(func() error {
		var err error
		for l, ls := range s.layers {
			if ls.state != 0 {
				if q.Conv[l], err = down(ls.conv, sl*ls.convStride, ls.convStride); err != nil {
					return err
				}
				if q.State[l], err = down(ls.state, sl*ls.stateStride, ls.stateStride); err != nil {
					return err
				}
			}
			if ls.ckv != 0 {
				if q.CKV[l], err = down(ls.ckv, sl*ls.ckvStride, int64(n*c.KVLoraRank)); err != nil {
					return err
				}
			}
			if ls.pools != 0 {
				kp, di := c.IndexKPool, int64(c.IndexHeadDim)
				ix := &indexer.State{SharePos: sharePos}
				if ix.Pools, err = down(ls.pools, sl*ls.poolsStride, int64(n/kp)*di); err != nil {
					return err
				}
				if ix.PendK, err = down(ls.pendK, sl*ls.pendStride, int64(n%kp)*di); err != nil {
					return err
				}
				if ix.PendG, err = down(ls.pendG, sl*ls.pendStride, int64(n%kp)*di); err != nil {
					return err
				}
				if ls.saved != 0 && sharePos >= 0 {
					ix.Share = make([]int32, ls.savedStride)
					if err := s.b.dev.Download(unsafe.Pointer(unsafe.SliceData(ix.Share)), ls.saved+kc.DevicePtr(4*sl*ls.savedStride), 4*ls.savedStride); err != nil {
						return err
					}
				}
				q.Index[l] = ix
			}
		}
		return nil
	})
	return q, err
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
