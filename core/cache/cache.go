// Package cache holds per-sequence model state between forward passes: for
// each KDA layer the raw conv window and the fp32 recurrent state, for each
// DSA layer the post-norm c_kv latents (not expanded K/V) and the indexer's
// pooled keys plus the pending rows of the incomplete pool. Sequences live
// in numbered slots of a Store, which holds the state of a chosen set of
// layers: the trunk's, or the MTP layer's (whose positions are its own).
//
// The latents and pooled keys are paged (vLLM's block table): a store has a
// fixed pool of pages of PageTokens tokens, one page id standing for one
// page in every DSA layer of the store (PageTokens latent rows, and
// PageTokens/index_kpool pooled keys where the layer has its own indexer).
// Each sequence has a page table; pages are taken when a run extends the
// sequence into them (Reserve, all or nothing: ErrNoPages when the pool is
// short) and returned by Free and Truncate. The per-slot state (KDA conv
// windows and recurrent states, the indexer's pending rows) is the slot
// pool ("state slots"). Page buffers live on the Go heap, made when a page
// id is first taken and kept for reuse.
//
// The latents and pooled keys are fp32, or fp8 (Options.KV = KVFP8,
// runtime.kv_dtype fp8): e4m3 codes with a power-of-two fp32 scale per
// block of 128 values (paged.FP8Block), quantized as the kernels write
// them and dequantized as they read them. fp8 is lossy; the KDA state and
// the pending indexer rows stay fp32 in either.
package cache

import (
	"errors"
	"fmt"
	"sync"

	"github.com/glmflash/glmflash/kernels/indexer"
	"github.com/glmflash/glmflash/kernels/paged"
	"github.com/glmflash/glmflash/model"
)

// ErrNoPages is the error (errors.Is) of a run, reservation or copy that
// needs more pages than the store has free; it changed no state. A
// scheduler preempts on it.
var ErrNoPages = errors.New("no free KV cache pages")

// DefaultPageTokens is the page size when none is configured
// (runtime.kv_page_tokens).
const DefaultPageTokens = 64

// KV is the dtype a store holds its latents and pooled keys in.
type KV int

const (
	// KVF32 holds fp32 latents and pooled keys (the CPU's default, the
	// parity mode).
	KVF32 KV = iota
	// KVBF16 holds bf16 latents and fp32 pooled keys (the CUDA store's
	// kv dtype bf16; the CPU store does not hold it).
	KVBF16
	// KVFP8 holds latents and pooled keys as e4m3 codes with a
	// power-of-two fp32 scale per 128 values (paged.FP8Block).
	KVFP8
)

// String names the dtype as runtime.kv_dtype does.
func (k KV) String() string {
	switch k {
	case KVBF16:
		return "bf16"
	case KVFP8:
		return "fp8"
	}
	return "fp32"
}

// RowBytes is the bytes of one row of width values in the dtype (latents:
// width kv_lora_rank; pooled keys: index_head_dim, where bf16 stores keep
// them fp32).
func (k KV) RowBytes(width int, key bool) int64 {
	switch {
	case k == KVFP8:
		return int64(paged.FP8RowBytes(width))
	case k == KVBF16 && !key:
		return 2 * int64(width)
	}
	return 4 * int64(width)
}

// Options size a store.
type Options struct {
	// Slots is the number of sequence slots (the state pool).
	Slots int
	// PageTokens is the tokens per page, a positive multiple of the
	// model's index_kpool (0: DefaultPageTokens).
	PageTokens int
	// Pages is the size of the page pool (0: Slots × ⌈MaxPositions /
	// PageTokens⌉, every slot can hold MaxPositions tokens).
	Pages int
	// MaxPositions sizes the default pool (0: max_position_embeddings).
	MaxPositions int
	// KV is the latents' and pooled keys' dtype: KVF32 (the zero value) or
	// KVFP8 (KVBF16 is refused: the CPU kernels do not read it).
	KV KV
}

// PageStats are a paged store's page pool: its page size, the pages in
// all, those held by sequences and those free, and what a page and a
// state slot cost in bytes (one page id over every DSA layer of the store;
// a slot's fixed KDA state and pending indexer rows).
type PageStats struct {
	PageTokens       int
	Total, Used      int
	Free             int
	PageBytes        int64
	StateSlotBytes   int64
	StateSlots, Held int
}

// Seq is one sequence's state.
type Seq struct {
	// Len is the number of tokens already processed (the next position).
	Len int
	// Per layer index (zero or nil where the store holds no such state):
	Conv  [][]float32      // KDA: [3P][K−1] raw pre-conv inputs, oldest first
	State [][]float32      // KDA: [heads][Dk][Dv] recurrent state
	CKV   []paged.Rows     // DSA: latents, rows of kv_lora_rank (Width > 0 for a held DSA layer); in a store, in the sequence's pages
	Index []*indexer.State // DSA layers with their own indexer
	// Rollback is the open rollback record (Store.Checkpoint), nil when
	// none is open.
	Rollback *Rollback
	// rb is the slot's record buffers, kept between checkpoints.
	rb *Rollback
	// pages is the page table: page i holds positions [i·P, (i+1)·P).
	pages []int32
}

// PageTable is the sequence's page ids in position order (page i holds
// positions [i·PageTokens, (i+1)·PageTokens)); the store's, not a copy.
func (q *Seq) PageTable() []int32 { return q.pages }

// Rollback is what a checkpointed sequence keeps so that it can be cut
// back to any length from its checkpoint (Store.Truncate): per KDA layer
// the conv window and recurrent state after every position run since the
// checkpoint, and per indexer the raw key and gate rows of every position
// from the start of the pool that was pending at the checkpoint. The
// kernels that advance a sequence write them (Record* methods) while the
// record is open.
type Rollback struct {
	// Base is the sequence length at the checkpoint; Depth bounds the
	// positions that may run after it.
	Base, Depth int
	// IdxBase is the first position of the indexer rows (Base rounded down
	// to a pool boundary).
	IdxBase int
	conv    [][]float32 // per KDA layer: [Depth][conv window]
	state   [][]float32 // per KDA layer: [Depth][recurrent state]
	idxK    [][]float32 // per indexer layer: raw keys from IdxBase, [rows][Dim]
	idxG    [][]float32 // per indexer layer: raw gates from IdxBase
}

// Check refuses a run of n new tokens from position pos0 that would pass
// the record's depth.
func (r *Rollback) Check(pos0, n int) error {
	if pos0+n-r.Base > r.Depth {
		return fmt.Errorf("the rollback record from position %d holds %d positions; %d more from position %d would pass it", r.Base, r.Depth, n, pos0)
	}
	return nil
}

// RecordKDAConv stores layer l's conv window after position pos.
func (r *Rollback) RecordKDAConv(l, pos int, conv []float32) {
	n := len(conv)
	copy(r.conv[l][(pos-r.Base)*n:(pos-r.Base+1)*n], conv)
}

// RecordKDAState stores layer l's recurrent state (or one head's slice of
// it, at offset off) after position pos.
func (r *Rollback) RecordKDAState(l, pos, off int, state []float32, stateLen int) {
	i := pos - r.Base
	copy(r.state[l][i*stateLen+off:i*stateLen+off+len(state)], state)
}

// RecordIndexer stores an indexer layer's raw key and gate rows ([n][Dim])
// of positions pos0.. (appended in order; positions before Base were taken
// at the checkpoint).
func (r *Rollback) RecordIndexer(l, pos0 int, k, g []float32) {
	r.idxK[l] = append(r.idxK[l], k...)
	r.idxG[l] = append(r.idxG[l], g...)
}

// KDA returns layer l's conv window and recurrent state, or an error when
// the sequence holds no KDA state for l.
func (q *Seq) KDA(l int) (conv, state []float32, err error) {
	if l < 0 || l >= len(q.State) || q.State[l] == nil {
		return nil, nil, fmt.Errorf("the cache holds no KDA state for layer %d", l)
	}
	return q.Conv[l], q.State[l], nil
}

// Latents returns layer l's c_kv cache (CKV[l].Len rows), or an error
// when the sequence holds no MLA state for l.
func (q *Seq) Latents(l int) (*paged.Rows, error) {
	if l < 0 || l >= len(q.CKV) || q.CKV[l].Width == 0 {
		return nil, fmt.Errorf("the cache holds no MLA latents for layer %d", l)
	}
	return &q.CKV[l], nil
}

// Indexer returns layer l's indexer state, or an error when the sequence
// holds none for l.
func (q *Seq) Indexer(l int) (*indexer.State, error) {
	if l < 0 || l >= len(q.Index) || q.Index[l] == nil {
		return nil, fmt.Errorf("the cache holds no indexer state for layer %d", l)
	}
	return q.Index[l], nil
}

// Store is a fixed number of sequence slots. It is safe for concurrent use;
// a slot's contents belong to whoever allocated it.
type Store struct {
	cfg    *model.Config
	layers []int
	mu     sync.Mutex
	slots  []*Seq
	used   []bool
	depth  int // rollback depth (0: no checkpoints)
	pool   pagePool
	kv     KV
}

// pagePool is a store's pages: ids [0, total), the free ones on a stack
// (the last freed is taken first), each id's buffers made on its first
// take: per DSA layer a latent page and, for a layer with its own indexer,
// a pooled-key page. fp32 pages are floats of bufs; fp8 pages are codes
// (bytes of cbufs) and their scales (floats of bufs).
type pagePool struct {
	tokens int // P
	total  int
	free   []int32
	made   int         // ids whose buffers exist
	bufs   [][]float32 // per id: its pages (fp8: their scales) over the layers, one allocation (nil until first taken)
	cbufs  [][]byte    // per id: its fp8 pages' codes over the layers (fp8 only)
	// per layer, the offsets of its latent page (P·R floats; fp8: P·R
	// code bytes and P·⌈R/128⌉ scales) and pooled-key page (P/kpool·D
	// floats; fp8 likewise) in an id's buffers (−1: none)
	ckvOff, keyOff   []int
	ckvCOff, keyCOff []int
	floats, bytes    int // floats and code bytes of one id's buffers
}

// idBytes is one page id's bytes over the store's layers.
func (pp *pagePool) idBytes() int64 { return 4*int64(pp.floats) + int64(pp.bytes) }

// SetRollbackDepth lets slots be checkpointed with records of up to depth
// positions (a verify span's drafts + 1, a drafter's steps); 0 disallows
// checkpoints.
func (s *Store) SetRollbackDepth(depth int) error {
	if depth < 0 {
		return fmt.Errorf("cache: rollback depth must be ≥ 0, got %d", depth)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.depth = depth
	return nil
}

// NewStore makes a store with max slots holding the state of the given
// layers of cfg (cfg.TrunkLayers() for the trunk, cfg.MTPLayers() for the
// MTP layer), each a trunk or MTP layer index, listed once, with the
// default page pool (every slot can hold max_position_embeddings tokens).
func NewStore(cfg *model.Config, layers []int, max int) (*Store, error) {
	return New(cfg, layers, Options{Slots: max})
}

// New makes a store of the given layers sized by o.
func New(cfg *model.Config, layers []int, o Options) (*Store, error) {
	if o.Slots < 1 {
		return nil, fmt.Errorf("cache: need at least one slot, got %d", o.Slots)
	}
	if err := CheckLayers(cfg, layers); err != nil {
		return nil, err
	}
	P, err := PageTokens(cfg, o.PageTokens)
	if err != nil {
		return nil, err
	}
	if o.KV != KVF32 && o.KV != KVFP8 {
		return nil, fmt.Errorf("cache: kv dtype %s is not held by the heap store (fp32 or fp8)", o.KV)
	}
	pages := o.Pages
	switch {
	case pages < 0:
		return nil, fmt.Errorf("cache: the page pool must be ≥ 0 pages (0: the default), got %d", pages)
	case pages == 0:
		maxPos := o.MaxPositions
		if maxPos <= 0 {
			maxPos = cfg.MaxPositionEmbeddings
		}
		pages = o.Slots * ((max(maxPos, 1) + P - 1) / P)
	}
	if pages > 1<<31-1 {
		return nil, fmt.Errorf("cache: a page pool of %d pages is more than %d", pages, 1<<31-1)
	}
	s := &Store{cfg: cfg, layers: append([]int(nil), layers...), slots: make([]*Seq, o.Slots), used: make([]bool, o.Slots), kv: o.KV}
	L := cfg.NumHiddenLayers + max(cfg.NumNextNPredictLayers, 0)
	pp := &s.pool
	*pp = pagePool{tokens: P, total: pages, ckvOff: make([]int, L), keyOff: make([]int, L), ckvCOff: make([]int, L), keyCOff: make([]int, L)}
	for l := range L {
		pp.ckvOff[l], pp.keyOff[l], pp.ckvCOff[l], pp.keyCOff[l] = -1, -1, -1, -1
	}
	// page places rows of width values: floats (fp32), or code bytes and
	// scale floats (fp8)
	page := func(rows, width int) (floatOff, codeOff int) {
		if o.KV == KVFP8 {
			floatOff, codeOff = pp.floats, pp.bytes
			pp.floats += rows * paged.FP8Blocks(width)
			pp.bytes += rows * width
			return floatOff, codeOff
		}
		floatOff = pp.floats
		pp.floats += rows * width
		return floatOff, -1
	}
	for _, l := range layers {
		if cfg.IsDSA(l) {
			pp.ckvOff[l], pp.ckvCOff[l] = page(P, cfg.KVLoraRank)
			if cfg.HasOwnIndexer(l) {
				pp.keyOff[l], pp.keyCOff[l] = page(P/cfg.IndexKPool, cfg.IndexHeadDim)
			}
		}
	}
	return s, nil
}

// PageTokens resolves a page size setting for cfg: 0 is
// DefaultPageTokens, anything else must be a positive multiple of
// index_kpool (a page then holds whole pools). The error says what was
// given; the caller names the setting.
func PageTokens(cfg *model.Config, p int) (int, error) {
	if p == 0 {
		p = DefaultPageTokens
		if kp := cfg.IndexKPool; kp > 0 && p%kp != 0 {
			p = (p + kp - 1) / kp * kp
		}
	}
	if p < 1 || p > 1<<20 {
		return 0, fmt.Errorf("cache: page tokens must be in [1, %d], got %d", 1<<20, p)
	}
	if kp := cfg.IndexKPool; kp > 0 && p%kp != 0 {
		return 0, fmt.Errorf("cache: page tokens must be a multiple of index_kpool (%d), got %d", kp, p)
	}
	return p, nil
}

// CheckLayers validates a store's layer list: at least one layer, each a
// trunk or MTP layer of cfg, none twice.
func CheckLayers(cfg *model.Config, layers []int) error {
	if len(layers) == 0 {
		return fmt.Errorf("cache: a store needs at least one layer")
	}
	n := cfg.NumHiddenLayers + max(cfg.NumNextNPredictLayers, 0)
	seen := make(map[int]bool, len(layers))
	for _, l := range layers {
		if l < 0 || l >= n {
			return fmt.Errorf("cache: layer %d is not a layer of the model (%d trunk + %d MTP layers)", l, cfg.NumHiddenLayers, cfg.NumNextNPredictLayers)
		}
		if seen[l] {
			return fmt.Errorf("cache: layer %d is listed twice", l)
		}
		seen[l] = true
	}
	return nil
}

// KV is the dtype the store holds its latents and pooled keys in.
func (s *Store) KV() KV { return s.kv }

// Layers lists the layers whose state the store holds.
func (s *Store) Layers() []int { return append([]int(nil), s.layers...) }

// Capacity is the number of slots.
func (s *Store) Capacity() int { return len(s.slots) }

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

// Alloc reserves a free slot with an empty sequence.
func (s *Store) Alloc() (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, u := range s.used {
		if !u {
			s.used[i] = true
			if s.slots[i] == nil {
				s.slots[i] = s.newSeq()
			} else {
				s.slots[i].reset()
			}
			return i, nil
		}
	}
	return -1, fmt.Errorf("cache: all %d slots are in use", len(s.slots))
}

// allocatedLocked refuses a slot that is not allocated.
func (s *Store) allocatedLocked(slot int) error {
	if slot < 0 || slot >= len(s.slots) || !s.used[slot] {
		return fmt.Errorf("cache: slot %d is not allocated", slot)
	}
	return nil
}

// Free releases a slot.
func (s *Store) Free(slot int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.allocatedLocked(slot); err != nil {
		return err
	}
	s.used[slot] = false
	q := s.slots[slot]
	q.Rollback = nil
	s.releaseLocked(q, 0)
	q.Len = 0
	return nil
}

// pagesFor is the pages that hold n tokens.
func (s *Store) pagesFor(n int) int { return (n + s.pool.tokens - 1) / s.pool.tokens }

// releaseLocked returns q's pages past its first keep to the pool.
func (s *Store) releaseLocked(q *Seq, keep int) {
	for i := len(q.pages) - 1; i >= keep; i-- {
		s.pool.free = append(s.pool.free, q.pages[i])
	}
	if keep >= len(q.pages) {
		return
	}
	q.pages = q.pages[:keep]
	for l := range q.CKV {
		if q.CKV[l].Paged() {
			q.CKV[l].KeepPages(keep)
		}
		if ix := q.Index[l]; ix != nil && ix.Pools.Paged() {
			ix.Pools.KeepPages(keep)
		}
	}
}

// takeLocked gives q pages until it has n (the pool holds enough: checked
// by the caller).
func (s *Store) takeLocked(q *Seq, n int) {
	pp := &s.pool
	for len(q.pages) < n {
		id := pp.free[len(pp.free)-1]
		pp.free = pp.free[:len(pp.free)-1]
		buf, cbuf := s.pageLocked(id)
		q.pages = append(q.pages, id)
		c := s.cfg
		for l := range q.CKV {
			if o := pp.ckvOff[l]; o >= 0 {
				addPage(&q.CKV[l], pp.tokens, buf, cbuf, o, pp.ckvCOff[l])
			}
			if o := pp.keyOff[l]; o >= 0 {
				addPage(&q.Index[l].Pools, pp.tokens/c.IndexKPool, buf, cbuf, o, pp.keyCOff[l])
			}
		}
	}
}

// addPage appends to r the page of rows rows at float offset fo (fp32: the
// rows; fp8: their scales) and code offset co (fp8) of an id's buffers.
func addPage(r *paged.Rows, rows int, buf []float32, cbuf []byte, fo, co int) {
	if !r.FP8 {
		n := rows * r.Width
		r.Pages = append(r.Pages, buf[fo:fo+n:fo+n])
		return
	}
	n, ns := rows*r.Width, rows*paged.FP8Blocks(r.Width)
	r.Codes = append(r.Codes, cbuf[co:co+n:co+n])
	r.Scales = append(r.Scales, buf[fo:fo+ns:fo+ns])
}

// pageLocked is page id's buffers (floats; fp8 codes), made (one
// allocation each over the layers) the first time the id is taken.
func (s *Store) pageLocked(id int32) ([]float32, []byte) {
	pp := &s.pool
	if pp.bufs == nil {
		pp.bufs = make([][]float32, pp.total)
		if pp.bytes > 0 {
			pp.cbufs = make([][]byte, pp.total)
		}
	}
	if pp.bufs[id] == nil {
		pp.bufs[id] = make([]float32, pp.floats)
		if pp.bytes > 0 {
			pp.cbufs[id] = make([]byte, pp.bytes)
		}
		pp.made++
	}
	if pp.cbufs == nil {
		return pp.bufs[id], nil
	}
	return pp.bufs[id], pp.cbufs[id]
}

// freeLocked lazily fills the free stack (ids are handed out from 0 up on
// a fresh store) and returns how many pages are free.
func (s *Store) freeLocked() int {
	pp := &s.pool
	if pp.free == nil {
		pp.free = make([]int32, pp.total)
		for i := range pp.free {
			pp.free[i] = int32(pp.total - 1 - i)
		}
	}
	return len(pp.free)
}

// Reserve makes each allocated slots[i] hold pages for tokens[i] tokens,
// taking pages from the pool, all or nothing: when the pool has fewer free
// pages than the slots need together it fails with ErrNoPages (errors.Is)
// and nothing changes. A slot already holding enough pages takes none; a
// slot listed twice is refused.
func (s *Store) Reserve(slots, tokens []int) error {
	if len(slots) != len(tokens) {
		return fmt.Errorf("cache: reserving %d slots with %d token counts", len(slots), len(tokens))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	need := 0
	for i, sl := range slots {
		if err := s.allocatedLocked(sl); err != nil {
			return err
		}
		for _, o := range slots[:i] {
			if o == sl {
				return fmt.Errorf("cache: slot %d is reserved twice", sl)
			}
		}
		if tokens[i] < 0 {
			return fmt.Errorf("cache: slot %d: reserving %d tokens", sl, tokens[i])
		}
		need += max(0, s.pagesFor(tokens[i])-len(s.slots[sl].pages))
	}
	if free := s.freeLocked(); need > free {
		return fmt.Errorf("cache: %w: the run needs %d more pages of %d tokens, %d of %d are free", ErrNoPages, need, s.pool.tokens, free, s.pool.total)
	}
	for i, sl := range slots {
		s.takeLocked(s.slots[sl], s.pagesFor(tokens[i]))
	}
	return nil
}

// Trim returns an allocated slot's pages that lie wholly past its length
// (those a failed run reserved).
func (s *Store) Trim(slot int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.allocatedLocked(slot); err != nil {
		return err
	}
	q := s.slots[slot]
	s.releaseLocked(q, s.pagesFor(q.Len))
	return nil
}

// PageStats reports the page pool and the state slots.
func (s *Store) PageStats() PageStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	free := s.freeLocked()
	held := 0
	for _, u := range s.used {
		if u {
			held++
		}
	}
	return PageStats{PageTokens: s.pool.tokens, Total: s.pool.total, Used: s.pool.total - free, Free: free,
		PageBytes: s.pool.idBytes(), StateSlotBytes: StateSlotBytes(s.cfg, s.layers), StateSlots: len(s.slots), Held: held}
}

// StateSlotBytes is one slot's fixed state for a store of the given
// layers: per KDA layer the conv window and recurrent state, per indexer
// the pending rows of an incomplete pool (keys and gates).
func StateSlotBytes(cfg *model.Config, layers []int) int64 {
	var n int64
	for _, l := range layers {
		if cfg.IsKDA(l) {
			n += int64(cfg.KDAConvLen() + cfg.KDAStateLen())
		} else if cfg.HasOwnIndexer(l) {
			n += 2 * int64(max(cfg.IndexKPool-1, 0)) * int64(cfg.IndexHeadDim)
		}
	}
	return 4 * n
}

// PageBytes is one page id's bytes over a store's layers, in fp32: per
// DSA layer P latent rows, and P/kpool pooled keys where it has its own
// indexer. Divided by P and the DSA layers it is the KV bytes per token
// per DSA layer.
func PageBytes(cfg *model.Config, layers []int, P int) int64 {
	return PageBytesKV(cfg, layers, P, KVF32)
}

// PageBytesKV is PageBytes in the kv dtype kv (KV.RowBytes per row).
func PageBytesKV(cfg *model.Config, layers []int, P int, kv KV) int64 {
	var n int64
	for _, l := range layers {
		if cfg.IsDSA(l) {
			n += int64(P) * kv.RowBytes(cfg.KVLoraRank, false)
			if cfg.HasOwnIndexer(l) {
				n += int64(P/cfg.IndexKPool) * kv.RowBytes(cfg.IndexHeadDim, true)
			}
		}
	}
	return n
}

// Checkpoint opens a rollback record on an allocated slot at its current
// length (replacing an open one): until Truncate, the next Checkpoint or
// Free, the kernels keep what it takes to cut the slot back to any length
// from the checkpoint on, for at most the store's rollback depth of
// positions.
func (s *Store) Checkpoint(slot int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.allocatedLocked(slot); err != nil {
		return err
	}
	if s.depth < 1 {
		return fmt.Errorf("cache: the store keeps no rollback records (its rollback depth is 0)")
	}
	q := s.slots[slot]
	c := s.cfg
	if q.rb == nil || q.rb.Depth != s.depth {
		L := len(q.Conv)
		q.rb = &Rollback{Depth: s.depth, conv: make([][]float32, L), state: make([][]float32, L), idxK: make([][]float32, L), idxG: make([][]float32, L)}
		for l := range q.Conv {
			if q.State[l] != nil {
				q.rb.conv[l] = make([]float32, s.depth*len(q.Conv[l]))
				q.rb.state[l] = make([]float32, s.depth*len(q.State[l]))
			}
		}
	}
	r := q.rb
	r.Base = q.Len
	r.IdxBase = q.Len
	if c.IndexKPool > 0 {
		r.IdxBase = q.Len / c.IndexKPool * c.IndexKPool
	}
	for l, ix := range q.Index {
		if ix != nil {
			r.idxK[l] = append(r.idxK[l][:0], ix.PendK...)
			r.idxG[l] = append(r.idxG[l][:0], ix.PendG...)
		}
	}
	q.Rollback = r
	return nil
}

// Truncate cuts a checkpointed slot back to n tokens, Base ≤ n ≤ Len, and
// closes its record: MLA latents and indexer rows past n are dropped, a
// pool that a dropped token completed is reopened (its pending raw rows
// restored), and each KDA layer's conv window and recurrent state become
// those after position n−1. A store holding KDA state needs n > Base (the
// state at the checkpoint itself is not kept: a verify span always keeps
// its first token, the last accepted one).
func (s *Store) Truncate(slot, n int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.allocatedLocked(slot); err != nil {
		return err
	}
	q := s.slots[slot]
	r := q.Rollback
	if r == nil {
		return fmt.Errorf("cache: slot %d has no open checkpoint", slot)
	}
	if n < r.Base || n > q.Len {
		return fmt.Errorf("cache: slot %d can be cut back to [%d, %d] tokens, not %d", slot, r.Base, q.Len, n)
	}
	hasKDA := false
	for l := range q.State {
		hasKDA = hasKDA || q.State[l] != nil
	}
	if hasKDA && n == r.Base && q.Len > r.Base {
		return fmt.Errorf("cache: slot %d: the KDA state at the checkpoint (%d tokens) is not kept; keep at least one token after it", slot, r.Base)
	}
	if n < q.Len {
		kp, D := s.cfg.IndexKPool, s.cfg.IndexHeadDim
		for l := range q.Conv {
			if q.State[l] != nil {
				i := n - 1 - r.Base
				nc, ns := len(q.Conv[l]), len(q.State[l])
				copy(q.Conv[l], r.conv[l][i*nc:(i+1)*nc])
				copy(q.State[l], r.state[l][i*ns:(i+1)*ns])
			}
			if q.CKV[l].Width > 0 {
				q.CKV[l].Len = n
			}
			if ix := q.Index[l]; ix != nil {
				pools := n / kp
				ix.Pools.Len = pools
				lo, hi := (pools*kp-r.IdxBase)*D, (n-r.IdxBase)*D
				ix.PendK = append(ix.PendK[:0], r.idxK[l][lo:hi]...)
				ix.PendG = append(ix.PendG[:0], r.idxG[l][lo:hi]...)
				if ix.SharePos >= n {
					ix.Share = ix.Share[:0]
				}
			}
		}
	}
	q.Len = n
	q.Rollback = nil
	s.releaseLocked(q, s.pagesFor(n))
	return nil
}

// Copy makes allocated slot dst hold what allocated slot src holds: its
// length, every KDA layer's conv window and recurrent state, every DSA
// layer's latents, every indexer's pools, pending rows and saved
// selection. dst's buffers are reused and its open rollback record, if
// any, is closed; src is unchanged. A src with an open rollback record is
// refused (its record belongs to a speculative step in flight), as is
// src = dst.
func (s *Store) Copy(src, dst int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.allocatedLocked(src); err != nil {
		return err
	}
	if err := s.allocatedLocked(dst); err != nil {
		return err
	}
	if src == dst {
		return fmt.Errorf("cache: copying slot %d onto itself", src)
	}
	a, b := s.slots[src], s.slots[dst]
	if a.Rollback != nil {
		return fmt.Errorf("cache: slot %d has an open checkpoint: copy it after its Truncate", src)
	}
	np := s.pagesFor(a.Len)
	if need, free := np-len(b.pages), s.freeLocked(); need > free {
		return fmt.Errorf("cache: copying slot %d to slot %d: %w: it needs %d more pages of %d tokens, %d of %d are free", src, dst, ErrNoPages, need, s.pool.tokens, free, s.pool.total)
	}
	s.releaseLocked(b, np)
	s.takeLocked(b, np)
	b.Len = a.Len
	b.Rollback = nil
	// a page id's buffers hold its pages of every DSA layer, in any dtype
	pp := &s.pool
	for i := 0; i < np; i++ {
		from, to := a.pages[i], b.pages[i]
		copy(pp.bufs[to], pp.bufs[from])
		if pp.cbufs != nil {
			copy(pp.cbufs[to], pp.cbufs[from])
		}
	}
	for l := range a.Conv {
		copy(b.Conv[l], a.Conv[l])
		copy(b.State[l], a.State[l])
		if a.CKV[l].Width > 0 {
			b.CKV[l].Len = a.CKV[l].Len
		}
		if x := a.Index[l]; x != nil {
			y := b.Index[l]
			y.Pools.Len = x.Pools.Len
			y.PendK = append(y.PendK[:0], x.PendK...)
			y.PendG = append(y.PendG[:0], x.PendG...)
			y.Share = append(y.Share[:0], x.Share...)
			y.SharePos = x.SharePos
		}
	}
	return nil
}

// Len is the number of tokens an allocated slot has processed.
func (s *Store) Len(slot int) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.allocatedLocked(slot); err != nil {
		return 0, err
	}
	return s.slots[slot].Len, nil
}

// Advance records that an allocated slot processed n more tokens. Lengths
// change only under the store's lock (here and in Alloc): a scheduler may
// read them (Len) while a step that advances them executes.
func (s *Store) Advance(slot, n int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.allocatedLocked(slot); err != nil {
		return err
	}
	s.slots[slot].Len += n
	return nil
}

// Seq returns an allocated slot's sequence.
func (s *Store) Seq(slot int) (*Seq, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.allocatedLocked(slot); err != nil {
		return nil, err
	}
	return s.slots[slot], nil
}

func (s *Store) newSeq() *Seq {
	c := s.cfg
	L := c.NumHiddenLayers + c.NumNextNPredictLayers
	q := &Seq{Conv: make([][]float32, L), State: make([][]float32, L), CKV: make([]paged.Rows, L), Index: make([]*indexer.State, L)}
	P := s.pool.tokens
	for _, l := range s.layers {
		switch {
		case c.IsKDA(l):
			q.Conv[l] = make([]float32, c.KDAConvLen())
			q.State[l] = make([]float32, c.KDAStateLen())
		case c.IsDSA(l):
			fp8 := s.kv == KVFP8
			q.CKV[l] = paged.Rows{Width: c.KVLoraRank, PageRows: P, FP8: fp8}
			if c.HasOwnIndexer(l) {
				q.Index[l] = &indexer.State{Pools: paged.Rows{Width: c.IndexHeadDim, PageRows: P / c.IndexKPool, FP8: fp8}}
			}
		}
	}
	return q
}

// reset empties a sequence that holds no pages (Free returned them).
func (q *Seq) reset() {
	q.Len = 0
	q.Rollback = nil
	for l := range q.Conv {
		clear(q.Conv[l])
		clear(q.State[l])
		q.CKV[l].Len = 0
		if q.Index[l] != nil {
			q.Index[l].Reset()
		}
	}
}

// Bytes estimates the memory the sequence holds: its slot's state and
// pending rows, and the bytes of the pages in its table.
func (q *Seq) Bytes() int {
	n := 0
	for l := range q.Conv {
		n += 4 * (len(q.Conv[l]) + len(q.State[l]))
		n += rowsBytes(&q.CKV[l])
		if ix := q.Index[l]; ix != nil {
			n += 4 * (cap(ix.PendK) + cap(ix.PendG))
			n += rowsBytes(&ix.Pools)
		}
	}
	return n
}

// rowsBytes is the bytes of r's pages.
func rowsBytes(r *paged.Rows) int {
	n := 0
	for _, pg := range r.Pages {
		n += 4 * cap(pg)
	}
	for i, pg := range r.Codes {
		n += cap(pg) + 4*cap(r.Scales[i])
	}
	return n
}

// Bytes is the memory the store holds now: every slot's state (free slots
// too: their buffers are kept for reuse) and every page made so far (held
// or free).
func (s *Store) Bytes() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := int64(s.pool.made) * s.pool.idBytes()
	for _, q := range s.slots {
		if q == nil {
			continue
		}
		for l := range q.Conv {
			n += 4 * int64(len(q.Conv[l])+len(q.State[l]))
			if ix := q.Index[l]; ix != nil {
				n += 4 * int64(cap(ix.PendK)+cap(ix.PendG))
			}
		}
	}
	return n
}

// Memory is the store's bytes by category: "kv_pages" (the pages made so
// far) and "state_slots" (the slots' fixed state).
func (s *Store) Memory() map[string]int64 {
	pages := func() int64 {
		s.mu.Lock()
		defer s.mu.Unlock()
		return int64(s.pool.made) * s.pool.idBytes()
	}()
	return map[string]int64{"kv_pages": pages, "state_slots": s.Bytes() - pages}
}

// SlotBytes bounds the memory of one slot holding tokens tokens: the fixed
// KDA state plus, per token, the MLA latents of every DSA layer and the
// indexer keys of every layer with its own indexer (append growth may add
// up to as much again). Servers check slots × SlotBytes(context) against
// the machine before they accept a configuration.
func SlotBytes(cfg *model.Config, tokens int) int64 {
	return LayerSlotBytes(cfg, cfg.TrunkLayers(), tokens)
}

// LayerSlotBytes is SlotBytes for a store of the given layers (the MTP
// layer's: cfg.MTPLayers()).
func LayerSlotBytes(cfg *model.Config, layers []int, tokens int) int64 {
	var fixed, perToken int64
	for _, l := range layers {
		if cfg.IsKDA(l) {
			fixed += int64(cfg.KDAConvLen() + cfg.KDAStateLen())
			continue
		}
		perToken += int64(cfg.KVLoraRank)
		if cfg.HasOwnIndexer(l) {
			perToken += int64(cfg.IndexHeadDim) // pooled keys (at most one per token)
		}
	}
	return 4 * (fixed + perToken*int64(tokens))
}

// ReadState returns a deep copy of an allocated slot's state (its open
// rollback record left out): what tests compare across runs and backends.
func (s *Store) ReadState(slot int) (*Seq, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.allocatedLocked(slot); err != nil {
		return nil, err
	}
	return s.slots[slot].Clone(), nil
}

// Clone deep-copies the sequence's state (without its rollback record and
// its pages): latents and pooled keys unpaged, Len rows each.
func (q *Seq) Clone() *Seq {
	c := &Seq{Len: q.Len, Conv: make([][]float32, len(q.Conv)), State: make([][]float32, len(q.State)),
		CKV: make([]paged.Rows, len(q.CKV)), Index: make([]*indexer.State, len(q.Index))}
	for l := range q.Conv {
		c.Conv[l] = cloneF(q.Conv[l])
		c.State[l] = cloneF(q.State[l])
		c.CKV[l] = q.CKV[l].Clone()
		if ix := q.Index[l]; ix != nil {
			c.Index[l] = &indexer.State{Pools: ix.Pools.Clone(), PendK: cloneF(ix.PendK), PendG: cloneF(ix.PendG),
				Share: append([]int32(nil), ix.Share...), SharePos: ix.SharePos}
		}
	}
	return c
}

func cloneF(x []float32) []float32 {
	if x == nil {
		return nil
	}
	return append([]float32{}, x...)
}

// RollbackSlotBytes bounds one slot's rollback record of depth positions
// for a store of the given layers: per KDA layer depth conv windows and
// recurrent states, per indexer the raw key and gate rows of kpool−1+depth
// positions.
func RollbackSlotBytes(cfg *model.Config, layers []int, depth int) int64 {
	var n int64
	for _, l := range layers {
		if cfg.IsKDA(l) {
			n += int64(depth) * int64(cfg.KDAConvLen()+cfg.KDAStateLen())
		} else if cfg.HasOwnIndexer(l) {
			n += 2 * int64(cfg.IndexKPool-1+depth) * int64(cfg.IndexHeadDim)
		}
	}
	return 4 * n
}
