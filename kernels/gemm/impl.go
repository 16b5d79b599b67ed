package gemm

import (
	"fmt"
	"github.com/glmflash/glmflash/kernels/parallel"
	"os"
	"sync"
	"sync/atomic"
	"unsafe"
)

// An implementation of the kernels: pure Go, or SIMD microkernels chosen by
// CPU features. Within one implementation every output of MatMulT (and of
// MatMulTBF16) is computed the same way whatever T, N, Params or the tile it
// falls in, so results are batch-invariant; implementations differ from each
// other (and from MatMulTNaive) only by the order of the fp32 summation.
type impl struct {
	name string
	simd *simdImpl // nil for pure Go
}

// ImplEnv names the environment variable read at start-up to force an
// implementation (same values as SetImpl).
const ImplEnv = "GLMFLASH_GEMM"

var (
	goImpl = &impl{name: "go"}
	// registered holds the implementations usable on this machine, the
	// preferred one last.
	registered = append([]*impl{goImpl}, simdImpls()...)
	cur        atomic.Pointer[impl]
)

func init() {
	cur.Store(registered[len(registered)-1])
	if v := os.Getenv(ImplEnv); v != "" {
		if err := SetImpl(v); err != nil {
			fmt.Fprintf(os.Stderr, "gemm: %v; using %s\n", err, Impl())
		}
	}
}

// Impls lists the implementations available on this machine: "go" first,
// the one chosen by default last (e.g. [go avx2 avx512]).
func Impls() []string {
	s := make([]string, len(registered))
	for i, im := range registered {
		s[i] = im.name
	}
	return s
}

// Impl returns the name of the implementation in use.
func Impl() string { return cur.Load().name }

// SetImpl selects the implementation by name ("go", "avx2", "avx512"; "" or
// "auto" picks the best available). It returns an error, changing nothing,
// when the name is unknown or the CPU lacks the features. Meant for tests,
// benchmarks and start-up: it is safe to call concurrently with kernels, but
// a call in flight may finish with the previous implementation.
func SetImpl(name string) error {
	if name == "" || name == "auto" {
		cur.Store(registered[len(registered)-1])
		return nil
	}
	for _, im := range registered {
		if im.name == name {
			cur.Store(im)
			return nil
		}
	}
	return fmt.Errorf("gemm implementation %q not available (have %v)", name, Impls())
}

// ukernel computes an R×C tile dst[i*ldd+j] = Σ_k x_i[k]·w[j*ldw+k] for
// k < nvec·VW plus a masked tail (tail: lane mask on AVX-512, lane count on
// AVX2), strides in bytes. The R activation rows are packed vector by
// vector (see packStrip). flags&kPrefetch also prefetches the next C weight
// rows into L2.
type ukernel func(x, w, dst unsafe.Pointer, ldw, ldd, nvec, tail, flags uintptr)

const kPrefetch = 1

// kernelSet[r][c] is the r×c microkernel (nil where absent).
type kernelSet [5][9]ukernel

// f8kernel is ukernel on FP8 e4m3 weights (bytes, ldw bytes apart) whose
// rows share one row of block scales: k-vectors in blocks of vpb, block b
// scaled by sc[b], the tail vector by *tsc (see kernelF8 in gen_asm.go).
type f8kernel func(x, w, dst, sc, tsc unsafe.Pointer, ldw, ldd, nvec, tail, vpb, flags uintptr)

// f8KernelSet[r][c] is the r×c FP8 microkernel (nil where absent).
type f8KernelSet [9][9]f8kernel

// simdImpl describes one set of SIMD microkernels.
type simdImpl struct {
	vw       int  // fp32 lanes per vector
	maskTail bool // tail argument is a lane mask (else a count)
	f32      *kernelSet
	bf16     *kernelSet
	bb       *kernelSet   // VDPBF16PS kernels (bf16 activations); nil without AVX-512 BF16
	f8       *f8KernelSet // FP8-weight kernels; nil where absent
	// rows are the row-tile heights, descending, ending with 1; cTile[r] is
	// the main tile width (weight rows) for row-tile height r.
	rows  []int
	cTile [5]int
	axpy  func(y, x unsafe.Pointer, n uintptr, a float32)
	pack  func(dst, x unsafe.Pointer, ldx, nv, r uintptr)
}

func (s *simdImpl) tail(K int) uintptr {
	rem := K % s.vw
	if s.maskTail {
		return uintptr(1)<<rem - 1
	}
	return uintptr(rem)
}

// Cache blocking (bytes): a row block of packed activations and a panel of
// weights are kept in L2 together while the row blocks sweep the panel.
var (
	blockBytes = 256 << 10
	panelBytes = 256 << 10
)

// prefetchRows is the strip height from which kernels prefetch the next
// tile of weights into L2 (this keeps memory busy while a tile computes;
// it pays for every height once weights come from DRAM).
var prefetchRows = 1

// bufPool holds activation packing buffers.
var bufPool = sync.Pool{New: func() any { return new([]float32) }}

func getBuf(n int) *[]float32 {
	b := bufPool.Get().(*[]float32)
	if cap(*b) < n {
		*b = make([]float32, n)
	}
	*b = (*b)[:n]
	return b
}

// strip is r consecutive activation rows from t, packed at x.
type strip struct {
	t, r int
	x    unsafe.Pointer
}

// stripBuf is the strip and block storage of a product too tall for its
// caller's stack arrays (stripsOnStack rows): pooled, so that the GEMMs of
// a prefill allocate nothing in the steady state.
type stripBuf struct {
	strips []strip
	blocks []int
}

// stripsOnStack is the most rows whose strips (at most one a row) and row
// blocks (RowBlock ≥ 8: at most five with the end) fit the callers' stack
// arrays, [32]strip and [8]int.
const stripsOnStack = 32

var stripPool = sync.Pool{New: func() any { return new(stripBuf) }}

// getStrips returns pooled strip storage for a product of rows rows, or nil
// when the caller's stack arrays hold them (see cutInto); return it with put.
func getStrips(rows int) *stripBuf {
	if rows <= stripsOnStack {
		return nil
	}
	return stripPool.Get().(*stripBuf)
}

// cutInto is cutStrips into the caller's stack arrays (strips, blocks) when
// sl is nil, else into sl's storage, which keeps what it grew to. (The
// pooled storage is never mixed with the stack arrays' slices, so that
// these stay on the stack.)
func cutInto(sl *stripBuf, rows []int, t0, t1, rb, perRow int, strips []strip, blocks []int) ([]strip, []int, int) {
	if sl == nil {
		return cutStrips(rows, t0, t1, rb, perRow, strips, blocks)
	}
	ps, pb, packed := cutStrips(rows, t0, t1, rb, perRow, sl.strips[:0], sl.blocks[:0])
	sl.strips, sl.blocks = ps, pb
	return ps, pb, packed
}

// put drops the strips' pointers into the packed activations and returns b
// to the pool (nil receiver: nothing).
func (b *stripBuf) put() {
	if b != nil {
		clear(b.strips)
		stripPool.Put(b)
	}
}

// cutStrips cuts rows [t0,t1) into blocks of rb rows and each block into
// strips of the tallest row tile of rows (tallest first) that fits,
// appending them to strips and each block's first strip index, then the end
// index, to blocks (strips[blocks[b]:blocks[b+1]] is block b). packed is the
// elements the packed strips (r > 1) need, perRow per row.
func cutStrips(rows []int, t0, t1, rb, perRow int, strips []strip, blocks []int) (_ []strip, _ []int, packed int) {
	for tb := t0; tb < t1; tb += rb {
		blocks = append(blocks, len(strips))
		te := min(tb+rb, t1)
		for t := tb; t < te; {
			r := 1
			for _, h := range rows {
				if h <= te-t {
					r = h
					break
				}
			}
			strips = append(strips, strip{t: t, r: r})
			if r > 1 {
				packed += perRow * r
			}
			t += r
		}
	}
	return strips, append(blocks, len(strips)), packed
}

// run computes rows [t0,t1) × columns [n0,n1) of dst on the calling
// goroutine with microkernels from ks; wsz is the byte size of a weight
// element. Rows are taken RowBlock at a time, each block cut into strips of
// the tallest row tile that fits (then shorter ones); when there are several
// blocks, columns go in panels of about panelBytes of weights so the weights
// are streamed from memory once.
func (s *simdImpl) run(ks *kernelSet, p Params, dst, x, w unsafe.Pointer, wsz uintptr, K, N, t0, t1, n0, n1 int) {
	// Cut rows into strips and pack the activations once for all panels.
	var sb [stripsOnStack]strip
	var bb [8]int
	strips := sb[:0]
	blocks := bb[:0] // strips[blocks[b]:blocks[b+1]] is row block b
	sl := getStrips(t1 - t0)
	defer sl.put()
	var packed int
	nv := (K + s.vw - 1) / s.vw
	strips, blocks, packed = cutInto(sl, s.rows, t0, t1, s.rowBlock(p, K), nv*s.vw, strips, blocks)
	if pb := s.packStrips(strips, packed, x, K); pb != nil {
		defer bufPool.Put(pb)
	}
	s.sweep(ks, strips, blocks, dst, w, wsz, K, N, n0, n1)
}

// rowBlock is the rows of a row block: RowBlock, fewer when K is large, to
// keep a row block of packed activations within about blockBytes.
func (s *simdImpl) rowBlock(p Params, K int) int {
	return min(p.RowBlock, max(8, blockBytes/(K*4)/8*8))
}

// sweep computes columns [n0,n1) of dst for the rows of strips, cut into
// row blocks by blocks and packed (see run).
func (s *simdImpl) sweep(ks *kernelSet, strips []strip, blocks []int, dst, w unsafe.Pointer, wsz uintptr, K, N, n0, n1 int) {
	nc := n1 - n0
	if len(blocks) > 2 {
		nc = max(1, panelBytes/(K*int(wsz)*24)) * 24
	}
	ldw, ldd := uintptr(K)*wsz, uintptr(N)*4
	for np := n0; np < n1; np += nc {
		ne := min(np+nc, n1)
		for b := 0; b+1 < len(blocks); b++ {
			blk := strips[blocks[b]:blocks[b+1]]
			// Consecutive strips of equal height share the column tiling.
			for len(blk) > 0 {
				r := blk[0].r
				g := 1
				for g < len(blk) && blk[g].r == r {
					g++
				}
				s.group(ks, blk[:g], dst, w, wsz, ldw, ldd, K, N, np, ne)
				blk = blk[g:]
			}
		}
	}
}

// group computes strips of equal height r against columns [n0,n1): for each
// tile of weight rows, every strip (the tile stays in L1 meanwhile).
func (s *simdImpl) group(ks *kernelSet, strips []strip, dst, w unsafe.Pointer, wsz, ldw, ldd uintptr, K, N, n0, n1 int) {
	r := strips[0].r
	cMain := s.cTile[r]
	nvec, tail := uintptr(K/s.vw), s.tail(K)
	var flags uintptr
	if r >= prefetchRows {
		flags = kPrefetch
	}
	for n := n0; n < n1; {
		c := min(cMain, n1-n)
		k := ks[r][c]
		wp := unsafe.Add(w, uintptr(n)*ldw)
		for _, st := range strips {
			k(st.x, wp, unsafe.Add(dst, uintptr(st.t*N+n)*4), ldw, ldd, nvec, tail, flags)
		}
		n += c
	}
}

// sharedPackRows is the fewest rows whose activations a product split over
// columns packs once for all workers (prepack) instead of once per worker
// (run): a prefill's products. Below it (decode) packing is a few vectors.
const sharedPackRows = 64

// prepacked is the activations of a product of T rows cut into strips and
// packed once, read by every worker's columns (op.forTiles). Pooled with
// its packing body; its buffer comes from packSlot.
type prepacked struct {
	sl     stripBuf
	strips []strip
	blocks []int
	buf    []float32
	// the packing's operands, read by pack
	s    *simdImpl
	x    unsafe.Pointer
	K    int
	pack func(lo, hi int)
}

var prepackPool = sync.Pool{New: func() any {
	pp := new(prepacked)
	pp.pack = pp.packRange
	return pp
}}

// packSlot keeps prepack's buffer between products: one slot, the largest
// buffer given back, as a program's arena keeps its largest extent. (Not a
// sync.Pool: its per-P caches would keep a copy of a prefill's largest
// packing for every P its caller ran on; nor bufPool, whose small
// per-worker buffers would be grown in its place.) Products running at once
// take a buffer each.
var packSlot struct {
	sync.Mutex
	buf []float32
}

// takePackBuf returns n floats (contents undefined).
func takePackBuf(n int) []float32 {
	packSlot.Lock()
	b := packSlot.buf
	packSlot.buf = nil
	packSlot.Unlock()
	if cap(b) < n {
		b = make([]float32, n) // the old one is dead here: the collector may take it
	}
	return b[:n]
}

// givePackBuf keeps b for the next product unless a larger one is kept.
func givePackBuf(b []float32) {
	packSlot.Lock()
	if cap(b) > cap(packSlot.buf) {
		packSlot.buf = b
	}
	packSlot.Unlock()
}

// prepack cuts rows [0,T) as run would, lays the packed strips out in one
// buffer and packs them over the workers (every strip is independent).
func (s *simdImpl) prepack(p Params, x unsafe.Pointer, K, T int) *prepacked {
	return s.prepackRows(x, K, T, s.rowBlock(p, K), 8)
}

// prepackRows is prepack with row blocks of rb rows, the strips packed
// grain at a time over the workers.
func (s *simdImpl) prepackRows(x unsafe.Pointer, K, T, rb, grain int) *prepacked {
	pp := prepackPool.Get().(*prepacked)
	nv := (K + s.vw - 1) / s.vw
	strips, blocks, packed := cutStrips(s.rows, 0, T, rb, nv*s.vw, pp.sl.strips[:0], pp.sl.blocks[:0])
	pp.sl.strips, pp.sl.blocks = strips, blocks
	pp.strips, pp.blocks = strips, blocks
	pp.buf = takePackBuf(packed)
	buf := pp.buf
	off := 0
	for i := range strips {
		st := &strips[i]
		st.x = unsafe.Add(x, uintptr(st.t*K)*4)
		if st.r > 1 {
			st.x = unsafe.Pointer(&buf[off]) // packed by pack
			off += nv * st.r * s.vw
		}
	}
	pp.s, pp.x, pp.K = s, x, K
	parallel.For(len(strips), grain, pp.pack)
	return pp
}

// packRange packs strips [lo, hi) (those of r > 1 rows) into their places.
func (pp *prepacked) packRange(lo, hi int) {
	s, K, nv := pp.s, pp.K, (pp.K+pp.s.vw-1)/pp.s.vw
	for _, st := range pp.strips[lo:hi] {
		if st.r > 1 {
			buf := unsafe.Slice((*float32)(st.x), nv*st.r*s.vw)
			s.packStrip(buf, unsafe.Add(pp.x, uintptr(st.t*K)*4), K, st.r)
		}
	}
}

// release returns the buffer and pp to their pools.
func (pp *prepacked) release() {
	givePackBuf(pp.buf)
	clear(pp.sl.strips)
	pp.strips, pp.blocks, pp.buf, pp.s, pp.x = nil, nil, nil, nil, nil
	prepackPool.Put(pp)
}

// packStrip stores r activation rows of length K (row i at x + i·K·4) into
// buf vector by vector: buf[(v*r+i)*vw+l] = x_i[v*vw+l], zero past K.
func (s *simdImpl) packStrip(buf []float32, x unsafe.Pointer, K, r int) {
	full := K / s.vw
	if full > 0 {
		s.pack(unsafe.Pointer(&buf[0]), x, uintptr(K)*4, uintptr(full), uintptr(r))
	}
	if rem := K - full*s.vw; rem > 0 {
		xs := unsafe.Slice((*float32)(x), (r-1)*K+K)
		for i := 0; i < r; i++ {
			o := (full*r + i) * s.vw
			n := copy(buf[o:o+s.vw], xs[i*K+full*s.vw:i*K+K])
			clear(buf[o+n : o+s.vw])
		}
	}
}
