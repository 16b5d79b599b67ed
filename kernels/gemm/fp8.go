package gemm

import (
	"encoding/binary"
	"math"
	"sync"
	"sync/atomic"
	"unsafe"
)

// FP8 is an [N][K] weight matrix stored as FP8 e4m3 codes (row-major, one
// byte per value) with float32 block scales: value (n, k) is
// e4m3(Codes[n*K+k]) · Scales[(n/BlockRows)*ScaleCols + k/BlockCols]. The
// codes are used where they are (e.g. the checkpoint's mapping): the
// products dequantize a tile of weight rows at a time into a small float32
// buffer and run the fp32 microkernels on it, so their results equal
// MatMulT on the dequantized matrix bit for bit (and MatMulTBF16 on it
// when every value is bf16-exact).
type FP8 struct {
	Codes                []byte
	Scales               []float32
	BlockRows, BlockCols int
	ScaleCols            int // ceil(K / BlockCols)

	// fast caches whether the codes and scales suit the fast paths (no
	// NaN code, no scale so large that scale·2^8 overflows): 0 not yet
	// checked, fp8Fast or fp8Slow (read and written atomically).
	fast uint32
	// bf16 caches BF16Exact the same way.
	bf16 uint32
}

const (
	fp8Fast = 1
	fp8Slow = 2
)

// fastOK reports whether w has no NaN code and every scale s has s·2^8
// finite where s is (checked once, then cached): then a code widened to
// its value·2^−8 (exact) times s·2^8 (exact) is code value × s rounded
// once, as the table gives it.
func (w *FP8) fastOK() bool {
	return checkedOnce(&w.fast, func() bool {
		if fp8HasNaN(w.Codes) {
			return false
		}
		for _, sc := range w.Scales {
			if a := math.Abs(float64(sc)); a > math.MaxFloat32/256 && !math.IsInf(a, 0) {
				return false
			}
		}
		return true
	})
}

// checkedOnce returns check's answer, cached in *flag (0 not yet checked,
// fp8Fast true, fp8Slow false; read and written atomically).
func checkedOnce(flag *uint32, check func() bool) bool {
	switch atomic.LoadUint32(flag) {
	case fp8Fast:
		return true
	case fp8Slow:
		return false
	}
	st := uint32(fp8Slow)
	if check() {
		st = fp8Fast
	}
	atomic.StoreUint32(flag, st)
	return st == fp8Fast
}

// fp8Table maps an e4m3 code to its value (0x7f and 0xff are NaN).
var fp8Table = func() (t [256]float32) {
	for i := range t {
		b := uint8(i)
		e, m := int(b>>3)&0xf, float64(b&7)
		var v float64
		switch {
		case e == 0xf && m == 7:
			v = math.NaN()
		case e == 0:
			v = math.Ldexp(m, -9)
		default:
			v = math.Ldexp(8+m, e-10)
		}
		if b&0x80 != 0 {
			v = -v
		}
		t[i] = float32(v)
	}
	return
}()

// FP8ToFloat32 returns the value of e4m3 code b.
func FP8ToFloat32(b byte) float32 { return fp8Table[b] }

// DequantRow writes row n of w (K values) into dst: code value × block
// scale, one float32 multiplication each (as Dequant does).
func (w *FP8) DequantRow(dst []float32, n, K int) { w.dequantRow(dst, n, K, false) }

// dequantRow is DequantRow, through the fp16 widening when fast (w.fastOK).
func (w *FP8) dequantRow(dst []float32, n, K int, fast bool) {
	src := w.Codes[n*K : n*K+K]
	srow := w.Scales[(n/w.BlockRows)*w.ScaleCols:]
	dst = dst[:K]
	bc := w.BlockCols
	if !fast {
		for k0 := 0; k0 < K; k0 += bc {
			k1 := min(k0+bc, K)
			dequantFP8(dst[k0:k1], src[k0:k1], srow[k0/bc])
		}
		return
	}
	// whole vectors in one call where the blocks allow, then the rest
	// block by block
	for k := dequantFP8RowFast(dst, src, srow, bc); k < K; {
		k1 := min((k/bc+1)*bc, K)
		dequantFP8Fast(dst[k:k1], src[k:k1], srow[k/bc])
		k = k1
	}
}

// dequantFP8Go is the pure-Go dequantization of a run of codes sharing one
// scale.
func dequantFP8Go(dst []float32, src []byte, s float32) {
	dst = dst[:len(src)]
	for i, b := range src {
		dst[i] = fp8Table[b] * s
	}
}

// Dequant returns w as float32 ([N][K]).
func (w *FP8) Dequant(N, K int) []float32 {
	out := make([]float32, N*K)
	for n := 0; n < N; n++ {
		w.DequantRow(out[n*K:(n+1)*K], n, K)
	}
	return out
}

// fp8TileBytes bounds the float32 tile of dequantized weight rows (kept in
// L2 while the microkernels sweep it).
var fp8TileBytes = 128 << 10

// fp8HasNaN reports whether some code is 0x7f or 0xff, 8 codes at a time:
// a byte b&0x7f plus 1 has its top bit set only when b&0x7f is 0x7f (no
// carry leaves a byte).
func fp8HasNaN(codes []byte) bool {
	const lo, hi = 0x7f7f7f7f7f7f7f7f, 0x8080808080808080
	n := len(codes) &^ 7
	for i := 0; i < n; i += 8 {
		v := binary.LittleEndian.Uint64(codes[i:])
		if (v&lo+0x0101010101010101)&hi != 0 {
			return true
		}
	}
	for _, b := range codes[n:] {
		if b&0x7f == 0x7f {
			return true
		}
	}
	return false
}

// fp8FusedRows is the most rows a product runs through the FP8 kernels,
// which dequantize each weight vector in registers per strip of rows;
// taller products dequantize a tile of weights once for all rows.
var fp8FusedRows = 8

var fp8Flags uintptr = kPrefetch

// fp8Rows are the FP8 kernels' strip heights (tallest first) and fp8CTile
// their column tiles (see f8Shapes in gen_asm.go).
var (
	fp8Rows  = [...]int{8, 4, 2, 1}
	fp8CTile = [9]int{1: 8, 2: 8, 4: 6, 8: 3}
)

// runF8 computes columns [n0,n1) of x·wᵀ (T rows) with the FP8 kernels on
// the calling goroutine into dst, whose row t starts ldd floats after row
// t−1 (weight row n lands in column n): rows cut into strips (packed as
// run packs them); columns go by row block of scales, in chunks of 24
// weight rows (kept in L1 while every strip passes over them) cut into the
// strip height's column tiles.
func (s *simdImpl) runF8(dst unsafe.Pointer, ldd int, x []float32, T, K int, w *FP8, n0, n1 int) {
	var sb [stripsOnStack]strip
	var bb [8]int
	sl := getStrips(T)
	defer sl.put()
	nv := (K + s.vw - 1) / s.vw
	strips, _, packed := cutInto(sl, fp8Rows[:], 0, T, T, nv*s.vw, sb[:0], bb[:0])
	if pb := s.packStrips(strips, packed, unsafe.Pointer(&x[0]), K); pb != nil {
		defer bufPool.Put(pb)
	}
	nvec, tail := uintptr(K/s.vw), s.tail(K)
	vpb := w.BlockCols / s.vw
	ldw, lddb := uintptr(K), uintptr(ldd)*4
	codes := unsafe.Pointer(&w.Codes[0])
	br := w.BlockRows
	for nb := n0 - n0%br; nb < n1; nb += br {
		srow := w.Scales[(nb/br)*w.ScaleCols:]
		sc, tsc := unsafe.Pointer(&srow[0]), unsafe.Pointer(&srow[0])
		if tail != 0 {
			tsc = unsafe.Pointer(&srow[int(nvec)/vpb])
		}
		ne := min(nb+br, n1)
		for c0 := max(nb, n0); c0 < ne; c0 += 24 {
			c1 := min(c0+24, ne)
			for _, st := range strips {
				cm := fp8CTile[st.r]
				ks := &s.f8[st.r]
				for n := c0; n < c1; {
					c := min(cm, c1-n)
					ks[c](st.x, unsafe.Add(codes, uintptr(n)*ldw), unsafe.Add(dst, uintptr(st.t*ldd+n)*4), sc, tsc, ldw, lddb, nvec, tail, uintptr(vpb), fp8Flags)
					n += c
				}
			}
		}
	}
}

// packStrips points each strip at its activation rows (x: T rows of K
// floats): row t itself for a strip of one row, else a packed copy in a pooled
// buffer of packed floats, returned (nil if none) for the caller to put
// back.
func (s *simdImpl) packStrips(strips []strip, packed int, x unsafe.Pointer, K int) *[]float32 {
	var pb *[]float32
	if packed > 0 {
		pb = getBuf(packed)
	}
	nv := (K + s.vw - 1) / s.vw
	off := 0
	for i := range strips {
		st := &strips[i]
		xr := unsafe.Add(x, uintptr(st.t*K)*4)
		if st.r == 1 {
			st.x = xr
			continue
		}
		buf := (*pb)[off : off+nv*st.r*s.vw]
		off += len(buf)
		s.packStrip(buf, xr, K, st.r)
		st.x = unsafe.Pointer(&buf[0])
	}
	return pb
}

// runF8Tiles computes columns [n0,n1) of x·wᵀ (T rows) into dst (rows of
// ldd floats, as runF8) on the calling goroutine with the fp32 kernels on
// tiles of dequantized weight rows: the rows are cut into strips and
// packed once, in blocks of about blockBytes of activations; each tile of
// weight rows is dequantized once and swept by every block in turn (as run
// sweeps a panel), so a weight is dequantized once whatever T.
func (s *simdImpl) runF8Tiles(dst unsafe.Pointer, ldd int, x []float32, T, K int, w *FP8, n0, n1 int, fast bool) {
	var sb [stripsOnStack]strip
	var bb [8]int
	sl := getStrips(T)
	defer sl.put()
	nv := (K + s.vw - 1) / s.vw
	strips, blocks, packed := cutInto(sl, s.rows, 0, T, f8TileRowBlock(K), nv*s.vw, sb[:0], bb[:0])
	if pb := s.packStrips(strips, packed, unsafe.Pointer(&x[0]), K); pb != nil {
		defer bufPool.Put(pb)
	}
	s.sweepF8Tiles(dst, ldd, strips, blocks, K, w, n0, n1, fast)
}

// f8TileRowBlock is runF8Tiles's row block for rows of K floats: about
// blockBytes of packed activations.
func f8TileRowBlock(K int) int { return max(8, blockBytes/(K*4)/8*8) }

// sweepF8Tiles is runF8Tiles on rows already cut into strips and row blocks
// (strips[blocks[b]:blocks[b+1]]) and packed, as runF8Tiles cuts them.
func (s *simdImpl) sweepF8Tiles(dst unsafe.Pointer, ldd int, strips []strip, blocks []int, K int, w *FP8, n0, n1 int, fast bool) {
	nb := min(n1-n0, max(24, fp8TileBytes/(4*K)/24*24))
	tb := tilePool.Get().(*[]float32)
	defer tilePool.Put(tb)
	tile := grow32(tb, nb*K)
	ldw, lddb := uintptr(K)*4, uintptr(ldd)*4
	for c0 := n0; c0 < n1; c0 += nb {
		c1 := min(c0+nb, n1)
		for n := c0; n < c1; n++ {
			w.dequantRow(tile[(n-c0)*K:(n-c0+1)*K], n, K, fast)
		}
		// the tile's columns [0, c1−c0) land at dst columns c0…
		d := unsafe.Add(dst, uintptr(c0)*4)
		for b := 0; b+1 < len(blocks); b++ {
			for blk := strips[blocks[b]:blocks[b+1]]; len(blk) > 0; {
				g := 1
				for g < len(blk) && blk[g].r == blk[0].r {
					g++
				}
				s.group(s.f32, blk[:g], d, unsafe.Pointer(&tile[0]), 4, ldw, lddb, K, ldd, 0, c1-c0)
				blk = blk[g:]
			}
		}
	}
}

var tilePool = sync.Pool{New: func() any { return new([]float32) }}

// MatMulTFP8Serial computes dst[T×N] = x[T×K] · wᵀ for an FP8 weight on the
// calling goroutine (for callers that parallelize at a coarser level, such
// as MoE experts): weight rows are dequantized a tile at a time.
func MatMulTFP8Serial(dst, x []float32, T, K int, w *FP8, N int) {
	if !checkShapes(dst, x, T, K, N, len(w.Codes)) {
		return
	}
	f8Cols(cur.Load(), unsafe.Pointer(&dst[0]), N, x, T, K, w, 0, N)
}

// f8Cols computes columns [n0,n1) of x[T×K]·wᵀ on the calling goroutine
// into dst, whose row t starts t·ldd floats in (weight row n lands in
// column n): the FP8 kernels for short products, else tiles of weight rows
// dequantized to float32 for the fp32 kernels. Every output is the same
// fixed-order sum whatever the column range, so a product split by columns
// over several calls equals one call over all of them, bit for bit.
func f8Cols(im *impl, dst unsafe.Pointer, ldd int, x []float32, T, K int, w *FP8, n0, n1 int) {
	fast := w.fastOK()
	if s := im.simd; s != nil && s.f8 != nil && fast && T <= fp8FusedRows && w.BlockCols%s.vw == 0 {
		s.runF8(dst, ldd, x, T, K, w, n0, n1)
		return
	}
	if s := im.simd; s != nil {
		s.runF8Tiles(dst, ldd, x, T, K, w, n0, n1, fast)
		return
	}
	nb := min(n1-n0, max(8, fp8TileBytes/(4*K)/8*8))
	tb := tilePool.Get().(*[]float32)
	defer tilePool.Put(tb)
	tile := grow32(tb, nb*K+T*nb)
	out := unsafe.Slice((*float32)(dst), (T-1)*ldd+n1)
	for c0 := n0; c0 < n1; c0 += nb {
		c1 := min(c0+nb, n1)
		for n := c0; n < c1; n++ {
			w.dequantRow(tile[(n-c0)*K:(n-c0+1)*K], n, K, fast)
		}
		c := c1 - c0
		tmp := tile[nb*K : nb*K+T*c]
		block(tmp, x, tile, K, c, 0, T, 0, c)
		for t := 0; t < T; t++ {
			copy(out[t*ldd+c0:t*ldd+c1], tmp[t*c:(t+1)*c])
		}
	}
}

// MatMulTFP8ActSerial is MatMulTFP8Serial with the activations rounded to
// bfloat16 first (precision bf16); the products are then fp32 FMAs of the
// rounded activations and the exact weights.
func MatMulTFP8ActSerial(dst, x []float32, T, K int, w *FP8, N int) {
	xr := getBuf(T * K)
	defer bufPool.Put(xr)
	for i, v := range x[:T*K] {
		(*xr)[i] = BF16ToFloat32(Float32ToBF16(v))
	}
	MatMulTFP8Serial(dst, *xr, T, K, w, N)
}

func grow32(b *[]float32, n int) []float32 {
	if cap(*b) < n {
		*b = make([]float32, n)
	}
	*b = (*b)[:n]
	return *b
}
