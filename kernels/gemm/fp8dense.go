package gemm

import (
	"math"
	"sync"
	"unsafe"

	"github.com/glmflash/glmflash/kernels/parallel"
)

// Dense FP8 products: a linear layer's FP8 weight used where it is stored
// (one checkpoint matrix, or several stacked by rows as concat_rows makes
// them), its rows split over the workers. The MoE experts' products
// (MatMulTFP8Serial) run one expert per worker instead.

// f8Unit is the weight rows of one work item of a dense FP8 product. A
// worker's range need not follow the scale blocks: the kernels look the
// block scales up per row block wherever a range starts, and every output
// is the same sum whatever range it is computed in.
const f8Unit = 8

// MatMulTFP8 computes dst[T×N] = x[T×K] · wᵀ for an FP8 weight [N][K],
// its rows split over the workers (each takes all T rows against its
// range): the result equals MatMulTFP8Serial's (MatMulT on the dequantized
// weights) bit for bit.
func MatMulTFP8(dst, x []float32, T, K int, w *FP8, N int) {
	matMulTFP8Parts(false, dst, x, T, K, nil, w, N)
}

// MatMulTFP8Parts is MatMulTFP8 for a weight stored as FP8 matrices
// stacked by rows (a concat_rows of checkpoint tensors, each with its own
// codes and block scales): parts[i] is [N_i][K] with N_i = len(Codes)/K,
// it holds rows N_0+…+N_{i−1} onward, and the N_i add up to N. Each part
// is read where it is (no copy of the whole); each output equals that of
// MatMulTFP8Serial on its part, bit for bit.
func MatMulTFP8Parts(dst, x []float32, T, K int, parts []*FP8, N int) {
	matMulTFP8Parts(false, dst, x, T, K, parts, nil, N)
}

// MatMulTFP8PartsAct is MatMulTFP8Parts with the activations rounded to
// bfloat16 (the precision bf16 mode). When every part is BF16Exact, the
// VDPBF16PS kernels are in use (BF16Dot) and T > 8, tiles of weight rows
// are dequantized to bf16 and go through those kernels: the result is
// MatMulTBF16Act's on the dequantized weights, bit for bit. Otherwise
// (decode heights, where reading one byte a weight is what counts) the
// rounded activations go through MatMulTFP8Parts's kernels: the same
// exact products (a bf16 activation times an FP8 value times a
// power-of-two scale is exact in fp32) summed in another order.
func MatMulTFP8PartsAct(dst, x []float32, T, K int, parts []*FP8, N int) {
	matMulTFP8Parts(true, dst, x, T, K, parts, nil, N)
}

// f8op is one dense FP8 product in flight; its func values are made once
// per pooled op so that a product allocates nothing.
type f8op struct {
	im    *impl
	dst   unsafe.Pointer
	N     int
	x     []float32 // activations (rounded to bf16 values under act)
	xin   []float32 // the caller's activations, while rounding
	xb    []uint16  // rounded activations in rows of kp (the bf16 tiles)
	kp    int
	T, K  int
	parts []*FP8
	one   [1]*FP8
	bb    bool
	// pre is the activations packed once for every worker (a prefill's
	// rows on the fp32 tiles), else nil: each column range packs its own.
	pre *prepacked
	// bbPre: the same for the bf16 tiles (o.bb): the rounded rows cut and
	// packed once (strips in bbSL, packed in bbBuf from the pack slot).
	bbSL     *stripBuf
	bbBuf    []float32
	bbStrips []strip
	bbBlocks []int
	cols     func(lo, hi int)
	packBB   func(lo, hi int)
	round    func(lo, hi int)
}

var f8opPool = sync.Pool{New: func() any {
	o := new(f8op)
	o.cols, o.round, o.packBB = o.colRange, o.roundRange, o.packBBRange
	return o
}}

func matMulTFP8Parts(act bool, dst, x []float32, T, K int, parts []*FP8, one *FP8, N int) {
	o := f8opPool.Get().(*f8op)
	if one != nil {
		o.one[0] = one
		parts = o.one[:]
	}
	rows, codes := 0, 0
	for _, w := range parts {
		codes += len(w.Codes)
		if K > 0 {
			if len(w.Codes)%K != 0 {
				panic("gemm: FP8 part codes not a whole number of rows")
			}
			rows += len(w.Codes) / K
		}
	}
	if K > 0 && rows != N {
		panic("gemm: FP8 parts do not add up to N rows")
	}
	if !checkShapes(dst, x, T, K, N, codes) {
		o.one[0] = nil
		f8opPool.Put(o)
		return
	}
	o.im, o.dst, o.N, o.x, o.T, o.K, o.parts, o.bb = cur.Load(), unsafe.Pointer(&dst[0]), N, x, T, K, parts, false
	var xr *[]float32
	var xb *[]uint16
	if act {
		exact := true
		for _, w := range parts {
			exact = exact && w.BF16Exact(K)
		}
		o.xin = x
		if s := o.im.simd; s != nil && s.bb != nil && exact && T > fp8FusedRows {
			o.kp = (K + bf16Lanes - 1) / bf16Lanes * bf16Lanes
			xb = getBuf16(T * o.kp)
			o.xb, o.bb = *xb, true
		} else {
			xr = getBuf(T * K)
			o.x = *xr
		}
		if T < roundParallelRows {
			o.roundRange(0, T)
		} else { // a prefill's rows: rounded on every core
			parallel.For(T, roundParallelRows/2, o.round)
		}
		o.xin = nil
	}
	units := (N + f8Unit - 1) / f8Unit
	if s := o.im.simd; s != nil && T >= sharedPackRows && T > fp8FusedRows && units > 1 && parallel.Workers > 1 {
		// Every worker's columns take all T rows: pack them once as
		// runF8Tiles (runF8BB) would cut them (the same strips, the same
		// sums), instead of once per worker and part.
		if !o.bb {
			o.pre = s.prepackRows(unsafe.Pointer(&o.x[0]), K, T, f8TileRowBlock(K), 1)
		} else {
			nv := o.kp / bf16Lanes
			o.bbSL = getStrips(T) // non-nil: T > stripsOnStack
			var packed int
			o.bbStrips, o.bbBlocks, packed = cutInto(o.bbSL, s.rows, 0, T, f8BBRowBlock(o.kp), nv*bf16Lanes, nil, nil)
			o.bbBuf = takePackBuf((packed + 1) / 2)
			var pb []uint16
			if packed > 0 {
				pb = unsafe.Slice((*uint16)(unsafe.Pointer(&o.bbBuf[0])), packed)
			}
			s.placeBB(o.bbStrips, pb, o.xb, o.kp)
			parallel.For(len(o.bbStrips), 1, o.packBB) // over the workers
		}
	}
	parallel.For(units, 1, o.cols)
	if o.pre != nil {
		o.pre.release()
		o.pre = nil
	}
	if o.bbSL != nil {
		givePackBuf(o.bbBuf)
		o.bbSL.put()
		o.bbSL, o.bbBuf, o.bbStrips, o.bbBlocks = nil, nil, nil, nil
	}
	if xr != nil {
		bufPool.Put(xr)
	}
	if xb != nil {
		buf16Pool.Put(xb)
	}
	o.dst, o.x, o.xb, o.parts, o.one[0] = nil, nil, nil, nil, nil
	f8opPool.Put(o)
}

// roundRange rounds activation rows [lo,hi) to bfloat16: into xb (rows of
// kp, zeros past K) for the bf16 tiles, else to their float32 values in x.
func (o *f8op) roundRange(lo, hi int) {
	K := o.K
	if o.bb {
		roundRows(o.xb, o.xin, K, o.kp, lo, hi)
		return
	}
	for i := lo * K; i < hi*K; i++ {
		o.x[i] = BF16ToFloat32(Float32ToBF16(o.xin[i]))
	}
}

// packBBRange packs the rounded rows of strips [lo,hi) of bbStrips.
func (o *f8op) packBBRange(lo, hi int) {
	o.im.simd.packBBRange(o.bbStrips[lo:hi], o.xb, o.kp)
}

// colRange computes weight rows [lo·f8Unit, hi·f8Unit) of the whole (one
// call per part they cross), all T rows.
func (o *f8op) colRange(lo, hi int) {
	a, b := lo*f8Unit, min(hi*f8Unit, o.N)
	r0 := 0
	for _, w := range o.parts {
		n := len(w.Codes) / o.K
		if c0, c1 := max(a, r0), min(b, r0+n); c0 < c1 {
			// the part's row n lands in column r0+n
			d := unsafe.Add(o.dst, uintptr(r0)*4)
			switch {
			case o.bbSL != nil:
				o.im.simd.sweepF8BB(d, o.N, o.bbStrips, o.bbBlocks, o.K, w, c0-r0, c1-r0, w.fastOK())
			case o.bb:
				o.im.simd.runF8BB(d, o.N, o.xb, o.kp, o.T, o.K, w, c0-r0, c1-r0)
			case o.pre != nil:
				o.im.simd.sweepF8Tiles(d, o.N, o.pre.strips, o.pre.blocks, o.K, w, c0-r0, c1-r0, w.fastOK())
			default:
				f8Cols(o.im, d, o.N, o.x, o.T, o.K, w, c0-r0, c1-r0)
			}
		}
		r0 += n
	}
}

// runF8BB computes columns [n0,n1) of bf16(x)·wᵀ (T rows) into dst (rows
// of ldd floats, as runF8) on the calling goroutine with the VDPBF16PS
// kernels, for a BF16Exact weight: the rounded activations (xb, rows of
// kp) are cut into strips and packed once, in blocks of about blockBytes;
// each tile of weight rows is dequantized once to bf16 and swept by every
// block in turn (as runBB sweeps a panel). Each output is the one runBB
// computes.
func (s *simdImpl) runF8BB(dst unsafe.Pointer, ldd int, xb []uint16, kp, T, K int, w *FP8, n0, n1 int) {
	var sb [stripsOnStack]strip
	var bb [8]int
	fast := w.fastOK()
	nv := kp / bf16Lanes
	sl := getStrips(T)
	defer sl.put()
	strips, blocks, packed := cutInto(sl, s.rows, 0, T, f8BBRowBlock(kp), nv*bf16Lanes, sb[:0], bb[:0])
	if pb := s.packBB(strips, packed, xb, kp); pb != nil {
		defer buf16Pool.Put(pb)
	}
	s.sweepF8BB(dst, ldd, strips, blocks, K, w, n0, n1, fast)
}

// f8BBRowBlock is runF8BB's row block for rounded rows of kp: about
// blockBytes of packed activations.
func f8BBRowBlock(kp int) int { return max(8, blockBytes/(kp*2)/8*8) }

// sweepF8BB is runF8BB on rows already cut into strips and row blocks and
// packed, as runF8BB cuts and packs them.
func (s *simdImpl) sweepF8BB(dst unsafe.Pointer, ldd int, strips []strip, blocks []int, K int, w *FP8, n0, n1 int, fast bool) {
	nb := min(n1-n0, max(24, fp8TileBytes/(2*K)/24*24))
	tb := tilePool.Get().(*[]float32)
	defer tilePool.Put(tb)
	row := grow32(tb, K)
	tb16 := getBuf16(nb * K)
	defer buf16Pool.Put(tb16)
	tile := *tb16
	for c0 := n0; c0 < n1; c0 += nb {
		c1 := min(c0+nb, n1)
		for n := c0; n < c1; n++ {
			w.dequantRow(row, n, K, fast)
			roundRowBF16(tile[(n-c0)*K:(n-c0+1)*K], row) // exact: BF16Exact
		}
		// the tile's columns [0, c1−c0) land at dst columns c0…
		d := unsafe.Add(dst, uintptr(c0)*4)
		for b := 0; b+1 < len(blocks); b++ {
			s.sweepBB(strips[blocks[b]:blocks[b+1]], d, ldd, unsafe.Pointer(&tile[0]), K, 0, c1-c0)
		}
	}
}

// BF16Exact reports whether every value of w ([N][K], code × block scale as
// Dequant computes it) is exactly a bfloat16 (its float32 bits end in 16
// zeros), checked once and cached. Power-of-two scales in the normal range
// guarantee it (an e4m3 value has 4 significant bits); other scales are
// checked code by code.
func (w *FP8) BF16Exact(K int) bool {
	return checkedOnce(&w.bf16, func() bool { return w.bf16Exact(K) })
}

func (w *FP8) bf16Exact(K int) bool {
	if K <= 0 {
		return true
	}
	N := len(w.Codes) / K
	br, bc := w.BlockRows, w.BlockCols
	for bi, s := range w.Scales {
		r0, k0 := (bi/w.ScaleCols)*br, (bi%w.ScaleCols)*bc
		if r0 >= N || k0 >= K {
			continue
		}
		// s = 2^e with the product's lowest bit (2^(e−9)) at or above
		// bf16's smallest subnormal (2^−133) and 448·s finite: exact
		if b := math.Float32bits(s); b&0x7fffff == 0 {
			if e := int(b>>23&0xff) - 127; e >= -124 && e <= 119 {
				continue
			}
		}
		for r := r0; r < min(r0+br, N); r++ {
			for _, c := range w.Codes[r*K+k0 : r*K+min(k0+bc, K)] {
				if math.Float32bits(fp8Table[c]*s)&0xffff != 0 {
					return false
				}
			}
		}
	}
	return true
}
