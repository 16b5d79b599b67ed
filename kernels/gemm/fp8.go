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
	switch atomic.LoadUint32(&w.fast) {
	case fp8Fast:
		return true
	case fp8Slow:
		return false
	}
	st := uint32(fp8Fast)
	if fp8HasNaN(w.Codes) {
		st = fp8Slow
	}
	for _, sc := range w.Scales {
		if a := math.Abs(float64(sc)); a > math.MaxFloat32/256 && !math.IsInf(a, 0) {
			st = fp8Slow
		}
	}
	atomic.StoreUint32(&w.fast, st)
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

// runF8 computes dst = x·wᵀ (T rows) with the FP8 kernels on the calling
// goroutine: rows cut into strips (packed as run packs them); columns go
// by row block of scales, in chunks of 24 weight rows (kept in L1 while
// every strip passes over them) cut into the strip height's column tiles.
func (s *simdImpl) runF8(dst, x []float32, T, K int, w *FP8, N int) {
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
	ldw, ldd := uintptr(K), uintptr(N)*4
	codes, dp := unsafe.Pointer(&w.Codes[0]), unsafe.Pointer(&dst[0])
	br := w.BlockRows
	for nb := 0; nb < N; nb += br {
		srow := w.Scales[(nb/br)*w.ScaleCols:]
		sc, tsc := unsafe.Pointer(&srow[0]), unsafe.Pointer(&srow[0])
		if tail != 0 {
			tsc = unsafe.Pointer(&srow[int(nvec)/vpb])
		}
		ne := min(nb+br, N)
		for n0 := nb; n0 < ne; n0 += 24 {
			n1 := min(n0+24, ne)
			for _, st := range strips {
				cm := fp8CTile[st.r]
				ks := &s.f8[st.r]
				for n := n0; n < n1; {
					c := min(cm, n1-n)
					ks[c](st.x, unsafe.Add(codes, uintptr(n)*ldw), unsafe.Add(dp, uintptr(st.t*N+n)*4), sc, tsc, ldw, ldd, nvec, tail, uintptr(vpb), fp8Flags)
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

// runF8Tiles computes dst = x·wᵀ (T rows) on the calling goroutine with
// the fp32 kernels on tiles of dequantized weight rows: rows go in blocks
// of about blockBytes of activations, packed once per block; for each
// block every tile of weight rows is dequantized once and swept by every
// strip (as group sweeps a panel).
func (s *simdImpl) runF8Tiles(dst, x []float32, T, K int, w *FP8, N int, fast bool) {
	nv := (K + s.vw - 1) / s.vw
	rb := max(8, blockBytes/(K*4)/8*8)
	nb := min(N, max(24, fp8TileBytes/(4*K)/24*24))
	tb := tilePool.Get().(*[]float32)
	defer tilePool.Put(tb)
	tile := grow32(tb, nb*K)
	ldw, ldd := uintptr(K)*4, uintptr(N)*4
	var sb [stripsOnStack]strip
	var bb [8]int
	sl := getStrips(min(rb, T))
	defer sl.put()
	for t0 := 0; t0 < T; t0 += rb {
		strips, _, packed := cutInto(sl, s.rows, t0, min(t0+rb, T), rb, nv*s.vw, sb[:0], bb[:0])
		pb := s.packStrips(strips, packed, unsafe.Pointer(&x[0]), K)
		for n0 := 0; n0 < N; n0 += nb {
			n1 := min(n0+nb, N)
			for n := n0; n < n1; n++ {
				w.dequantRow(tile[(n-n0)*K:(n-n0+1)*K], n, K, fast)
			}
			// the tile's columns [0, n1−n0) land at dst columns n0…
			d := unsafe.Pointer(&dst[n0])
			for blk := strips; len(blk) > 0; {
				g := 1
				for g < len(blk) && blk[g].r == blk[0].r {
					g++
				}
				s.group(s.f32, blk[:g], d, unsafe.Pointer(&tile[0]), 4, ldw, ldd, K, N, 0, n1-n0)
				blk = blk[g:]
			}
		}
		if pb != nil {
			bufPool.Put(pb)
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
	im := cur.Load()
	fast := w.fastOK()
	if s := im.simd; s != nil && s.f8 != nil && fast && T <= fp8FusedRows && w.BlockCols%s.vw == 0 {
		s.runF8(dst, x, T, K, w, N)
		return
	}
	if s := im.simd; s != nil {
		s.runF8Tiles(dst, x, T, K, w, N, fast)
		return
	}
	nb := min(N, max(8, fp8TileBytes/(4*K)/8*8))
	tb := tilePool.Get().(*[]float32)
	defer tilePool.Put(tb)
	tile := grow32(tb, nb*K+T*nb)
	for n0 := 0; n0 < N; n0 += nb {
		n1 := min(n0+nb, N)
		for n := n0; n < n1; n++ {
			w.dequantRow(tile[(n-n0)*K:(n-n0+1)*K], n, K, fast)
		}
		c := n1 - n0
		tmp := tile[nb*K : nb*K+T*c]
		block(tmp, x, tile, K, c, 0, T, 0, c)
		for t := 0; t < T; t++ {
			copy(dst[t*N+n0:t*N+n1], tmp[t*c:(t+1)*c])
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
