package cuda

import (
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/cache"
	"github.com/glmflash/glmflash/core/ir"
	kc "github.com/glmflash/glmflash/kernels/cuda"
	"github.com/glmflash/glmflash/kernels/indexer"
	"github.com/glmflash/glmflash/kernels/paged"
	"github.com/glmflash/glmflash/model"
)

// Store is sequence state in device memory. The MLA latents and the
// indexer's pooled keys are paged: per DSA layer a pool of pages
// ([pages][P][R] latents, [pages][P/kpool][D] pooled keys; one page id
// stands for one page in every DSA layer), a page table per slot
// ([slots][⌈maxPositions/P⌉] ids, at a fixed device address for the store's
// life: captured graphs read whatever it holds), pages taken as runs extend
// the slots (all or none: backend.ErrNoPages) and returned by Free and
// Truncate. Per slot (the state slots): the KDA conv window and recurrent
// state and the indexer's pending pool; with a rollback depth, the
// rollback record's buffers (per KDA layer the window and state after each
// of depth positions, per indexer the raw rows from the pending pool's
// start), and the MTP layer's indexer a saved selection row (index
// sharing).
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
	// the page pool: page tokens, pages in all, the free ids (a stack),
	// each slot's page table (host) and the device tables' stride and
	// address
	page, pages int
	free        []int32
	tables      [][]int32
	ptStride    int
	pt          kc.DevicePtr
	pageBytes   int64 // one page id over the DSA layers
	kvBF16      bool  // the latents are bf16 (kv dtype)
	// pad: the store keeps a padding slot for bucket graphs (Options
	// GraphBuckets): state slot len(used), never allocated, whose KDA
	// windows, states and pending indexer rows the padding rows of a
	// bucketed step read and write, and whose page table row points every
	// entry at one scratch page (id pages, past the pool). No sequence's
	// state is ever in it; what it holds is garbage of finite values.
	pad bool
}

type sized struct {
	p kc.DevicePtr
	n int64
}

// layerState holds one layer's buffers; strides are in floats per slot.
// ckv and pools are page pools ([pages][P][R], [pages][P/kpool][D]).
type layerState struct {
	conv, state             kc.DevicePtr
	convStride, stateStride int64
	ckv                     kc.DevicePtr
	pools, pendK, pendG     kc.DevicePtr
	pendStride              int64
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
// cfg on the GPU, and a pool of o.Pages pages of o.PageTokens tokens
// (defaults: cache.DefaultPageTokens, and pages enough for every slot to
// hold MaxPositions tokens).
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
	P, err := cache.PageTokens(cfg, o.PageTokens)
	if err != nil {
		return nil, err
	}
	kd, err := backend.ParseKVDType(string(o.KVDType))
	if err != nil {
		return nil, fmt.Errorf("cuda: kv dtype: %w", err)
	}
	if kd == backend.KVFP8 {
		return nil, fmt.Errorf("cuda: kv dtype fp8 is not implemented on the cuda backend yet (its kernels read fp32 or bf16 latents: auto, fp32 or bf16)")
	}
	ptStride := (maxPositions + P - 1) / P
	pages := o.Pages
	switch {
	case pages < 0:
		return nil, fmt.Errorf("cuda: the page pool must be ≥ 0 pages (0: the default), got %d", pages)
	case pages == 0:
		pages = slots * ptStride
	}
	if int64(pages) > 1<<31-1 {
		return nil, fmt.Errorf("cuda: a page pool of %d pages is more than %d", pages, 1<<31-1)
	}
	pad := b.bucketsOn()
	padN := 0 // the padding slot and scratch page
	if pad {
		padN = 1
	}
	s := &Store{b: b, id: storeIDs.Add(1), pad: pad, cfg: cfg, maxPos: maxPositions, depth: o.Rollback, used: make([]bool, slots), lens: make([]int, slots),
		ckpt: make([]int, slots), share: make([]int, slots), layers: make([]layerState, cfg.NumHiddenLayers+cfg.NumNextNPredictLayers),
		page: P, pages: pages, free: make([]int32, pages), tables: make([][]int32, slots), ptStride: ptStride,
		kvBF16: kd == backend.KVBF16 || kd == backend.KVAuto && b.opts.Precision == backend.BF16}
	for i := range s.ckpt {
		s.ckpt[i], s.share[i] = -1, -1
	}
	for i := range s.free {
		s.free[i] = int32(pages - 1 - i) // id 0 is taken first
	}
	depth := int64(o.Rollback)
	err = b.dev.Do(func() error {
		allocBytes := func(n int64, what string) (kc.DevicePtr, error) {
			p, err := b.dev.Alloc(n)
			if err != nil {
				return 0, fmt.Errorf("cuda: allocating %s: %w", what, err)
			}
			s.bufs = append(s.bufs, sized{p, n})
			b.sh.caches.Add(n)
			return p, nil
		}
		// alloc: per slot (rollback records); stateAlloc: per state slot,
		// the padding slot's included and zeroed (the slots' own are cleared
		// by Alloc)
		alloc := func(floatsPerSlot int64) (kc.DevicePtr, error) {
			return allocBytes(4*floatsPerSlot*int64(slots), fmt.Sprintf("the cache (%d slots × %d positions)", slots, maxPositions))
		}
		stateAlloc := func(floatsPerSlot int64) (kc.DevicePtr, error) {
			p, err := allocBytes(4*floatsPerSlot*int64(slots+padN), fmt.Sprintf("the cache (%d slots × %d positions)", slots, maxPositions))
			if err == nil && pad {
				err = b.dev.Zero(p+kc.DevicePtr(4*floatsPerSlot*int64(slots)), floatsPerSlot)
			}
			return p, err
		}
		pool := func(bytesPerPage int64) (kc.DevicePtr, error) {
			p, err := allocBytes(bytesPerPage*int64(pages+padN), fmt.Sprintf("the KV page pool (%d pages of %d tokens)", pages, P))
			if err == nil && pad { // the scratch page, finite from the start
				err = b.dev.Zero(p+kc.DevicePtr(bytesPerPage*int64(pages)), bytesPerPage/4)
			}
			return p, err
		}
		var err error
		if s.pt, err = stateAlloc(int64(ptStride)); err != nil { // int32 ids
			return err
		}
		if err := b.dev.Zero(s.pt, int64(slots*ptStride)); err != nil {
			return err
		}
		if pad { // the padding slot's row: every entry the scratch page
			row := make([]int32, ptStride)
			for i := range row {
				row[i] = int32(pages)
			}
			if err := b.dev.Upload(s.pt+kc.DevicePtr(4*int64(slots)*int64(ptStride)), unsafe.Pointer(unsafe.SliceData(row)), 4*int64(ptStride)); err != nil {
				return err
			}
			if err := b.dev.Sync(); err != nil { // row may go once this returns
				return err
			}
		}
		for _, l := range layers {
			ls := &s.layers[l]
			if cfg.IsKDA(l) {
				ls.convStride = int64(cfg.KDAConvLen())
				ls.stateStride = int64(cfg.KDAStateLen())
				if ls.conv, err = stateAlloc(max(ls.convStride, 1)); err != nil {
					return err
				}
				if ls.state, err = stateAlloc(ls.stateStride); err != nil {
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
			if ls.ckv, err = pool(s.latentPageBytes()); err != nil {
				return err
			}
			s.pageBytes += s.latentPageBytes()
			if cfg.HasOwnIndexer(l) {
				kp, di := int64(cfg.IndexKPool), int64(cfg.IndexHeadDim)
				ls.pendStride = kp * di
				if ls.pools, err = pool(4 * int64(P) / kp * di); err != nil {
					return err
				}
				s.pageBytes += 4 * int64(P) / kp * di
				if ls.pendK, err = stateAlloc(ls.pendStride); err != nil {
					return err
				}
				if ls.pendG, err = stateAlloc(ls.pendStride); err != nil {
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
					if ls.saved, err = stateAlloc(ls.savedStride); err != nil {
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
	s.releaseLocked(slot, 0)
	return nil
}

// latentPageBytes is one latent page's bytes (P rows of kv_lora_rank in
// the kv dtype).
func (s *Store) latentPageBytes() int64 {
	el := int64(4)
	if s.kvBF16 {
		el = 2
	}
	return el * int64(s.page) * int64(s.cfg.KVLoraRank)
}

// KVDType is the dtype the store holds its latents in.
func (s *Store) KVDType() backend.KVDType {
	if s.kvBF16 {
		return backend.KVBF16
	}
	return backend.KVFP32
}

// pagesFor is the pages that hold n tokens.
func (s *Store) pagesFor(n int) int { return (n + s.page - 1) / s.page }

// releaseLocked returns slot's pages past its first keep to the pool (the
// device table's entries past them are never read).
func (s *Store) releaseLocked(slot, keep int) {
	t := s.tables[slot]
	for i := len(t) - 1; i >= keep; i-- {
		s.free = append(s.free, t[i])
	}
	if keep < len(t) {
		s.tables[slot] = t[:keep]
	}
}

// tableUpload is new entries of a slot's page table for the device.
type tableUpload struct {
	slot, first int
	ids         []int32
}

// takeLocked gives slot pages until it has n (the pool holds enough:
// checked by the caller) and returns its new entries.
func (s *Store) takeLocked(slot, n int) tableUpload {
	u := tableUpload{slot: slot, first: len(s.tables[slot])}
	for len(s.tables[slot]) < n {
		id := s.free[len(s.free)-1]
		s.free = s.free[:len(s.free)-1]
		s.tables[slot] = append(s.tables[slot], id)
	}
	u.ids = append([]int32(nil), s.tables[slot][u.first:]...)
	return u
}

// upload writes new page table entries to the device table
// (stream-ordered: before the kernels of the step that needs them); the
// device lock is held.
func (s *Store) upload(us []tableUpload) error {
	for _, u := range us {
		if len(u.ids) == 0 {
			continue
		}
		at := s.pt + kc.DevicePtr(4*(int64(u.slot)*int64(s.ptStride)+int64(u.first)))
		if err := s.b.dev.Upload(at, unsafe.Pointer(unsafe.SliceData(u.ids)), 4*int64(len(u.ids))); err != nil {
			return err
		}
	}
	return nil
}

// reserve gives the batch's slots the pages of their new tokens, all or
// none (backend.ErrNoPages, nothing changed), and uploads the new page
// table entries; the device lock is held.
func (s *Store) reserve(pr *backend.Prepared) error {
	s.mu.Lock()
	need := 0
	for _, sp := range pr.Spans {
		need += max(0, s.pagesFor(sp.Pos0+sp.N)-len(s.tables[sp.Slot]))
	}
	if need > len(s.free) {
		free := len(s.free)
		s.mu.Unlock()
		return fmt.Errorf("cuda: %w: the run needs %d more pages of %d tokens, %d of %d are free", backend.ErrNoPages, need, s.page, free, s.pages)
	}
	var us []tableUpload
	if need > 0 {
		for _, sp := range pr.Spans {
			if u := s.takeLocked(sp.Slot, s.pagesFor(sp.Pos0+sp.N)); len(u.ids) > 0 {
				us = append(us, u)
			}
		}
	}
	s.mu.Unlock()
	return s.upload(us)
}

// trim returns the pages past the slots' lengths (those a failed run
// reserved).
func (s *Store) trim(slots []int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sl := range slots {
		if s.used[sl] {
			s.releaseLocked(sl, s.pagesFor(s.lens[sl]))
		}
	}
}

// PageStats reports the page pool and the state slots
// (backend.PagedStore).
func (s *Store) PageStats() backend.PageStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	held := 0
	for _, u := range s.used {
		if u {
			held++
		}
	}
	layers := make([]int, 0, len(s.layers))
	for l, ls := range s.layers {
		if ls.state != 0 || ls.ckv != 0 {
			layers = append(layers, l)
		}
	}
	return backend.PageStats{PageTokens: s.page, Total: s.pages, Used: s.pages - len(s.free), Free: len(s.free), PageBytes: s.pageBytes,
		StateSlotBytes: cache.StateSlotBytes(s.cfg, layers), StateSlots: len(s.used), Held: held}
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
	s.releaseLocked(slot, s.pagesFor(n))
	return nil
}

// Copy makes allocated slot dst hold src's state (backend.Store.Copy):
// dst gets pages of its own for src's length (backend.ErrNoPages, dst
// unchanged, when the pool is short), then stream-ordered device copies of
// each layer's KDA conv window and recurrent state, the pages of src's
// latents and pooled keys, the pending rows, and the MTP indexer's saved
// selection; dst's open checkpoint is closed. Rows past src's length in
// its last page are copied with it and left to be overwritten, as
// Truncate leaves them.
func (s *Store) Copy(src, dst int) error {
	s.mu.Lock()
	for _, sl := range []int{src, dst} {
		if sl < 0 || sl >= len(s.used) || !s.used[sl] {
			s.mu.Unlock()
			return fmt.Errorf("cache: slot %d is not allocated", sl)
		}
	}
	if src == dst {
		s.mu.Unlock()
		return fmt.Errorf("cache: copying slot %d onto itself", src)
	}
	if s.ckpt[src] >= 0 {
		s.mu.Unlock()
		return fmt.Errorf("cache: slot %d has an open checkpoint: copy it after its Truncate", src)
	}
	n, sharePos := int64(s.lens[src]), s.share[src]
	np := s.pagesFor(int(n))
	if need := np - len(s.tables[dst]); need > len(s.free) {
		free := len(s.free)
		s.mu.Unlock()
		return fmt.Errorf("cuda: copying slot %d to slot %d: %w: it needs %d more pages of %d tokens, %d of %d are free", src, dst, backend.ErrNoPages, need, s.page, free, s.pages)
	}
	s.releaseLocked(dst, np)
	up := s.takeLocked(dst, np)
	srcPages, dstPages := append([]int32(nil), s.tables[src][:np]...), append([]int32(nil), s.tables[dst][:np]...)
	s.mu.Unlock()
	c := s.cfg
	a, b := int64(src), int64(dst)
	cp := func(p kc.DevicePtr, stride, floats int64) error {
		return s.b.dev.Copy(p+kc.DevicePtr(4*b*stride), p+kc.DevicePtr(4*a*stride), 4*floats)
	}
	cpPages := func(p kc.DevicePtr, bytesPerPage int64) error {
		for i := range srcPages {
			if err := s.b.dev.Copy(p+kc.DevicePtr(int64(dstPages[i])*bytesPerPage), p+kc.DevicePtr(int64(srcPages[i])*bytesPerPage), bytesPerPage); err != nil {
				return err
			}
		}
		return nil
	}
	err := s.b.dev.Do(func() error {
		if err := s.upload([]tableUpload{up}); err != nil {
			return err
		}
		for _, ls := range s.layers {
			if ls.state != 0 {
				if err := cp(ls.conv, ls.convStride, ls.convStride); err != nil {
					return err
				}
				if err := cp(ls.state, ls.stateStride, ls.stateStride); err != nil {
					return err
				}
			}
			if ls.ckv != 0 {
				if err := cpPages(ls.ckv, s.latentPageBytes()); err != nil {
					return err
				}
			}
			if ls.pools != 0 {
				kp, di := int64(c.IndexKPool), int64(c.IndexHeadDim)
				if err := cpPages(ls.pools, 4*int64(s.page)/kp*di); err != nil {
					return err
				}
				if err := cp(ls.pendK, ls.pendStride, n%kp*di); err != nil {
					return err
				}
				if err := cp(ls.pendG, ls.pendStride, n%kp*di); err != nil {
					return err
				}
				if ls.saved != 0 && sharePos >= 0 {
					if err := cp(ls.saved, ls.savedStride, ls.savedStride); err != nil {
						return err
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lens[dst] = int(n)
	s.ckpt[dst] = -1
	s.share[dst] = sharePos
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
	table := append([]int32(nil), s.tables[slot]...)
	s.mu.Unlock()
	c := s.cfg
	L := len(s.layers)
	q := &cache.Seq{Len: n, Conv: make([][]float32, L), State: make([][]float32, L), CKV: make([]paged.Rows, L), Index: make([]*indexer.State, L)}
	sl := int64(slot)
	down := func(p kc.DevicePtr, off, count int64) ([]float32, error) {
		x := make([]float32, count)
		if count == 0 {
			return x, nil
		}
		return x, s.b.dev.Download(unsafe.Pointer(unsafe.SliceData(x)), p+kc.DevicePtr(4*off), 4*count)
	}
	// downPages reads rows [0, rows) of width floats from a page pool of
	// per rows a page, through the slot's table
	downPages := func(p kc.DevicePtr, per, width, rows int64, bf16 bool) ([]float32, error) {
		x := make([]float32, rows*width)
		var b []uint16
		if bf16 {
			b = make([]uint16, rows*width)
		}
		for i := int64(0); i*per < rows; i++ {
			k := min(per, rows-i*per)
			if i >= int64(len(table)) {
				return nil, fmt.Errorf("cuda: slot %d holds %d pages, not the %d its %d rows need", slot, len(table), (rows+per-1)/per, rows)
			}
			off := int64(table[i]) * per * width
			var err error
			if bf16 {
				err = s.b.dev.Download(unsafe.Pointer(&b[i*per*width]), p+kc.DevicePtr(2*off), 2*k*width)
			} else {
				err = s.b.dev.Download(unsafe.Pointer(&x[i*per*width]), p+kc.DevicePtr(4*off), 4*k*width)
			}
			if err != nil {
				return nil, err
			}
		}
		for i, v := range b {
			x[i] = math.Float32frombits(uint32(v) << 16)
		}
		return x, nil
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
				x, err := downPages(ls.ckv, int64(s.page), int64(c.KVLoraRank), int64(n), s.kvBF16)
				if err != nil {
					return err
				}
				q.CKV[l] = paged.Flat(c.KVLoraRank, x)
			}
			if ls.pools != 0 {
				kp, di := c.IndexKPool, int64(c.IndexHeadDim)
				ix := &indexer.State{SharePos: sharePos}
				x, err := downPages(ls.pools, int64(s.page/kp), di, int64(n/kp), false)
				if err != nil {
					return err
				}
				ix.Pools = paged.Flat(c.IndexHeadDim, x)
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

// batchState checks a batch against the store (every sequence within its
// positions and its open rollback record; with shareExtra > 0, the program
// reusing a shared indexer selection, a saved selection at most that many
// steps back) and returns its slots and, per sequence, the open
// checkpoint's position and the saved selection's (−1: none).
func (s *Store) batchState(pr *backend.Prepared, shareExtra int) (slots, ckpt, share []int, err error) {
	slots = make([]int, len(pr.Spans))
	for i, sp := range pr.Spans {
		if sp.Pos0+sp.N > s.maxPos {
			return nil, nil, nil, fmt.Errorf("cuda: batch sequence %d: %d cached + %d new tokens exceed the store's %d positions", i, sp.Pos0, sp.N, s.maxPos)
		}
		slots[i] = sp.Slot
	}
	ckpt, share = s.spanState(slots)
	for i, sp := range pr.Spans {
		if ckpt[i] >= 0 && sp.Pos0+sp.N-ckpt[i] > s.depth {
			return nil, nil, nil, fmt.Errorf("cuda: batch sequence %d (slot %d): the rollback record from position %d holds %d positions; %d more from position %d would pass it", i, sp.Slot, ckpt[i], s.depth, sp.N, sp.Pos0)
		}
	}
	if k := shareExtra; k > 0 {
		for i, sp := range pr.Spans {
			if share[i] < 0 || sp.Pos0 <= share[i] || sp.Pos0+sp.N-1-share[i] > k {
				return nil, nil, nil, fmt.Errorf("cuda: batch sequence %d (slot %d): no saved indexer selection to share for positions %d…%d (saved at %d, at most %d steps after it)", i, sp.Slot, sp.Pos0, sp.Pos0+sp.N-1, share[i], k)
			}
		}
	}
	return slots, ckpt, share, nil
}

// commit advances the batch's slots by their new tokens and, where the
// program saves its selections (saves), records each sequence's last
// position as its saved selection's.
func (s *Store) commit(pr *backend.Prepared, slots []int, saves bool) {
	for _, sp := range pr.Spans {
		s.advance(sp.Slot, sp.N)
	}
	if saves {
		pos := make([]int, len(pr.Spans))
		for i, sp := range pr.Spans {
			pos[i] = sp.Pos0 + sp.N - 1
		}
		s.setShare(slots, pos)
	}
}

// shareReuse is the extra width of the program's reusing indexer (0: it
// does not reuse a shared selection).
func (p *Program) shareReuse() int {
	for _, st := range p.steps {
		if st.node.Op == ir.OpDSATopK && ir.AttrShare.Get(st.node) == ir.IndexShareReuse {
			return ir.AttrShareExtra.Get(st.node)
		}
	}
	return 0
}

// shareSave reports whether the program saves its sequences' last
// selections for sharing.
func (p *Program) shareSave() bool {
	for _, st := range p.steps {
		if st.node.Op == ir.OpDSATopK && ir.AttrShare.Get(st.node) == ir.IndexShareSave {
			return true
		}
	}
	return false
}
