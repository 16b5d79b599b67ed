package gemm

import (
	"sync"
	"unsafe"

	"github.com/glmflash/glmflash/kernels/parallel"
)

// BF16 activations (the precision bf16 mode): the activations are rounded
// to bfloat16 (nearest even, Float32ToBF16) once per product and multiplied
// by bfloat16 weights with fp32 accumulation. With AVX-512 BF16 (and the
// avx512 implementation in use) the microkernels use VDPBF16PS, which
// multiplies pairs of bf16 exactly and adds them into fp32 lanes; elsewhere
// the rounded activations are widened back to fp32 and multiplied with the
// bf16-weight kernels (same products, different fp32 summation order).

// bf16Lanes is the number of bf16 elements in one VDPBF16PS vector.
const bf16Lanes = 32

// MatMulTBF16Act computes dst[T×N] = bf16(x)[T×K] · w[N×K]ᵀ: the
// activations rounded to bfloat16, bfloat16 weights, fp32 accumulation.
func MatMulTBF16Act(dst, x []float32, T, K int, w []uint16, N int) {
	MatMulTBF16ActWith(Default(), dst, x, T, K, w, N)
}

// MatMulTBF16ActWith is MatMulTBF16Act with explicit tuning parameters
// (results do not depend on them).
func MatMulTBF16ActWith(p Params, dst, x []float32, T, K int, w []uint16, N int) {
	matMulTBF16Act(p.norm(), false, dst, x, T, K, w, N)
}

// MatMulTBF16ActSerial is MatMulTBF16Act on the calling goroutine only.
func MatMulTBF16ActSerial(dst, x []float32, T, K int, w []uint16, N int) {
	matMulTBF16Act(Default(), true, dst, x, T, K, w, N)
}

// BF16Dot reports whether MatMulTBF16Act runs on the VDPBF16PS kernels
// (AVX-512 BF16 present and the avx512 implementation in use); otherwise
// it widens the rounded activations and uses the fp32 FMA kernels.
func BF16Dot() bool {
	s := cur.Load().simd
	return s != nil && s.bb != nil
}

var buf16Pool = sync.Pool{New: func() any { return new([]uint16) }}

func getBuf16(n int) *[]uint16 {
	b := buf16Pool.Get().(*[]uint16)
	if cap(*b) < n {
		*b = make([]uint16, n)
	}
	*b = (*b)[:n]
	return b
}

func matMulTBF16Act(p Params, serial bool, dst, x []float32, T, K int, w []uint16, N int) {
	if !checkShapes(dst, x, T, K, N, len(w)) {
		return
	}
	im := cur.Load()
	if s := im.simd; s != nil && s.bb != nil {
		// Round once into rows padded to whole vectors (zeros past K).
		kp := (K + bf16Lanes - 1) / bf16Lanes * bf16Lanes
		xb := getBuf16(T * kp)
		defer buf16Pool.Put(xb)
		if serial || T < roundParallelRows {
			roundRows(*xb, x, K, kp, 0, T)
		} else { // a prefill's rows: rounded on every core
			r := roundPool.Get().(*rounder)
			r.xb, r.x, r.K, r.kp = *xb, x, K, kp
			parallel.For(T, roundParallelRows/2, r.fn)
			r.xb, r.x = nil, nil
			roundPool.Put(r)
		}
		o := getOp(p, dst, x, T, K, N, unsafe.Pointer(&w[0]), 2, opBB)
		o.im, o.xb, o.kp = im, *xb, kp
		o.start(serial)
		return
	}
	// Fallback: the rounded activations widened back to fp32.
	xr := getBuf(T * K)
	defer bufPool.Put(xr)
	for i, v := range x[:T*K] {
		(*xr)[i] = BF16ToFloat32(Float32ToBF16(v))
	}
	matMulTBF16(p, serial, dst, *xr, T, K, w, N)
}

// roundParallelRows is the row count from which matMulTBF16Act rounds the
// activations on every core.
const roundParallelRows = 64

// roundRows rounds rows [t0,t1) of x (rows of K) into xb (rows of kp, zeros
// past K).
func roundRows(xb []uint16, x []float32, K, kp, t0, t1 int) {
	for t := t0; t < t1; t++ {
		row := xb[t*kp : t*kp+kp]
		roundRowBF16(row, x[t*K:t*K+K])
		clear(row[K:])
	}
}

// rounder is one parallel rounding's operands; fn is made once per pooled
// rounder so that a call allocates nothing.
type rounder struct {
	xb    []uint16
	x     []float32
	K, kp int
	fn    func(lo, hi int)
}

var roundPool = sync.Pool{New: func() any {
	r := new(rounder)
	r.fn = func(lo, hi int) { roundRows(r.xb, r.x, r.K, r.kp, lo, hi) }
	return r
}}

// runBB is run for the VDPBF16PS kernels: rows [t0,t1) × columns [n0,n1)
// of dst on the calling goroutine. xb holds the rounded activations, rows
// of kp (K padded to whole vectors) bf16 values.
func (s *simdImpl) runBB(p Params, dst unsafe.Pointer, xb []uint16, kp int, w unsafe.Pointer, K, N, t0, t1, n0, n1 int) {
	var sb [stripsOnStack]strip
	var bb [8]int
	strips := sb[:0]
	blocks := bb[:0]
	sl := getStrips(t1 - t0)
	defer sl.put()
	var packed int
	nv := kp / bf16Lanes
	rb := min(p.RowBlock, max(8, blockBytes/(kp*2)/8*8))
	strips, blocks, packed = cutInto(sl, s.rows, t0, t1, rb, nv*bf16Lanes, strips, blocks)
	if pb := s.packBB(strips, packed, xb, kp); pb != nil {
		defer buf16Pool.Put(pb)
	}
	nc := n1 - n0
	if len(blocks) > 2 {
		nc = max(1, panelBytes/(K*2*24)) * 24
	}
	for np := n0; np < n1; np += nc {
		ne := min(np+nc, n1)
		for b := 0; b+1 < len(blocks); b++ {
			s.sweepBB(strips[blocks[b]:blocks[b+1]], dst, N, w, K, np, ne)
		}
	}
}

// packBB points each strip at its rounded activation rows (xb: rows of kp
// bf16 values): row t itself for a strip of one row, else a copy repacked
// vector by vector (the layout of packStrip, in bf16) in a pooled buffer of
// packed values, returned (nil if none) for the caller to put back.
func (s *simdImpl) packBB(strips []strip, packed int, xb []uint16, kp int) *[]uint16 {
	var pb *[]uint16
	var buf []uint16
	if packed > 0 {
		pb = getBuf16(packed)
		buf = *pb
	}
	s.packBBInto(strips, buf, xb, kp)
	return pb
}

// packBBInto is packBB with the packed strips laid out in buf (at least
// their packed elements).
func (s *simdImpl) packBBInto(strips []strip, pbuf []uint16, xb []uint16, kp int) {
	s.placeBB(strips, pbuf, xb, kp)
	s.packBBRange(strips, xb, kp)
}

// placeBB points each strip at its rounded rows: a row of xb for a strip
// of one row, else its place in pbuf (packed by packBBRange).
func (s *simdImpl) placeBB(strips []strip, pbuf []uint16, xb []uint16, kp int) {
	nv := kp / bf16Lanes
	off := 0
	for i := range strips {
		st := &strips[i]
		if st.r == 1 {
			st.x = unsafe.Pointer(&xb[st.t*kp])
			continue
		}
		st.x = unsafe.Pointer(&pbuf[off])
		off += nv * st.r * bf16Lanes
	}
}

// packBBRange packs the strips of more than one row (placed by placeBB)
// from xb.
func (s *simdImpl) packBBRange(strips []strip, xb []uint16, kp int) {
	nv := kp / bf16Lanes
	for _, st := range strips {
		if st.r == 1 {
			continue
		}
		buf := unsafe.Slice((*uint16)(st.x), nv*st.r*bf16Lanes)
		if s.vw*4 == bf16Lanes*2 { // a vector of bf16 is one of fp32: the fp32 packer moves it
			s.pack(unsafe.Pointer(&buf[0]), unsafe.Pointer(&xb[st.t*kp]), uintptr(kp)*2, uintptr(nv), uintptr(st.r))
		} else {
			for v := 0; v < nv; v++ {
				for i := 0; i < st.r; i++ {
					o := (st.t+i)*kp + v*bf16Lanes
					copy(buf[(v*st.r+i)*bf16Lanes:], xb[o:o+bf16Lanes])
				}
			}
		}
	}
}

// sweepBB runs the VDPBF16PS kernels of one row block's strips (packed by
// packBB) against bf16 weight rows [n0,n1) of w (rows of K values): weight
// row n lands in column n of dst, whose rows are ldd floats apart.
// Consecutive strips of equal height share the column tiling.
func (s *simdImpl) sweepBB(blk []strip, dst unsafe.Pointer, ldd int, w unsafe.Pointer, K, n0, n1 int) {
	ldw, lddb := uintptr(K)*2, uintptr(ldd)*4
	nvec, tail := uintptr(K/bf16Lanes), uintptr(1)<<(K%bf16Lanes)-1
	for len(blk) > 0 {
		r := blk[0].r
		g := 1
		for g < len(blk) && blk[g].r == r {
			g++
		}
		var flags uintptr
		if r >= prefetchRows {
			flags = kPrefetch
		}
		for n := n0; n < n1; {
			c := min(s.cTile[r], n1-n)
			k := s.bb[r][c]
			wp := unsafe.Add(w, uintptr(n)*ldw)
			for _, st := range blk[:g] {
				k(st.x, wp, unsafe.Add(dst, uintptr(st.t*ldd+n)*4), ldw, lddb, nvec, tail, flags)
			}
			n += c
		}
		blk = blk[g:]
	}
}
