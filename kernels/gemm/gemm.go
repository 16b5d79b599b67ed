// Package gemm multiplies activations by weight matrices stored PyTorch-style
// ([out_features, in_features], row-major): y[t][n] = Σ_k x[t][k]·w[n][k],
// with fp32 weights (MatMulT) or bfloat16 weights widened exactly to fp32
// (MatMulTBF16), accumulating in fp32; MatMulTBF16Act (precision bf16)
// also rounds the activations to bfloat16 and, with AVX-512 BF16, multiplies
// with VDPBF16PS.
//
// Implementations: pure Go ("go"), and register-blocked SIMD microkernels in
// Go assembly ("avx2": AVX2+FMA, "avx512": AVX-512 F/BW/DQ/VL) chosen at
// start-up from the CPU features; SetImpl or the GLMFLASH_GEMM environment
// variable forces one, and the purego build tag leaves only pure Go. The
// microkernels work in dot-product form (weights stay [N][K]; no weight
// packing, so decode streams them straight from memory): an R×C tile of
// outputs keeps one vector accumulator per output, runs over k a vector at
// a time (masked tail), then reduces each accumulator with a fixed tree.
//
// Within one implementation, every output is computed the same way whatever
// T, N, Params or the tile it lands in: results are deterministic and
// batch-invariant (a row of a batched product equals the product of that row
// alone, bit for bit, and MatMulTBF16 equals MatMulT on the widened
// weights). Implementations differ from each other and from the naive
// left-to-right sum only by summation order (and FMA rounding).
package gemm

import (
	"math"
	"sync"
	"unsafe"

	"github.com/glmflash/glmflash/kernels/parallel"
)

// Params are the tunable knobs of MatMulT. The zero value picks defaults.
type Params struct {
	// ColGrain is the number of output columns (weight rows) one work item
	// covers; larger values mean fewer, bigger tasks.
	ColGrain int
	// RowBlock is the number of activation rows processed against one block
	// of weight rows before moving on (cache blocking over T; the SIMD
	// kernels use fewer rows when K is large).
	RowBlock int
}

// Default returns the parameters used when none are tuned.
func Default() Params { return Params{ColGrain: 16, RowBlock: 64} }

func (p Params) norm() Params {
	d := Default()
	if p.ColGrain <= 0 {
		p.ColGrain = d.ColGrain
	}
	if p.RowBlock <= 0 {
		p.RowBlock = d.RowBlock
	}
	return p
}

// MatMulT computes dst[T×N] = x[T×K] · w[N×K]ᵀ with default parameters.
func MatMulT(dst, x []float32, T, K int, w []float32, N int) {
	MatMulTWith(Default(), dst, x, T, K, w, N)
}

// MatMulTWith is MatMulT with explicit tuning parameters. Results do not
// depend on the parameters (nor on T or on which other rows and columns are
// computed alongside): every output is one fixed-order sum over k.
func MatMulTWith(p Params, dst, x []float32, T, K int, w []float32, N int) {
	matMulTF32(p.norm(), false, dst, x, T, K, w, N)
}

// MatMulTSerial is MatMulT on the calling goroutine only (for callers that
// already parallelize at a coarser level, such as one expert per worker).
func MatMulTSerial(dst, x []float32, T, K int, w []float32, N int) {
	matMulTF32(Default(), true, dst, x, T, K, w, N)
}

func matMulTF32(p Params, serial bool, dst, x []float32, T, K int, w []float32, N int) {
	if !checkShapes(dst, x, T, K, N, len(w)) {
		return
	}
	o := getOp(p, dst, x, T, K, N, unsafe.Pointer(&w[0]), 4, opF32)
	o.wf = w
	o.start(serial)
}

// checkShapes validates operand lengths (panicking like an index out of
// range) and reports whether there is anything to compute; with K = 0 the
// product is zero.
func checkShapes(dst, x []float32, T, K, N, nw int) bool {
	if T == 0 || N == 0 {
		return false
	}
	_ = dst[T*N-1]
	if K == 0 {
		clear(dst[:T*N])
		return false
	}
	_ = x[T*K-1]
	if nw < N*K {
		panic("gemm: weights shorter than N×K")
	}
	return true
}

// Kinds of product an op runs.
const (
	opF32  = iota // fp32 weights
	opBF16        // bf16 weights, fp32 activations
	opBB          // bf16 weights and activations (VDPBF16PS)
)

// op is one product in flight: its operands and the func values handed to
// parallel.For, made once per pooled op so that a product allocates nothing.
type op struct {
	im           *impl
	p            Params
	kind         int
	dst, x       []float32
	T, K, N      int
	w            unsafe.Pointer
	wsz          int
	wf           []float32 // fp32 weights (pure-Go block)
	wb           []uint16  // bf16 weights (pure-Go block)
	xb           []uint16  // rounded activations (opBB), rows of kp
	kp           int
	nTasks, rows int
	pre          *prepacked               // the activations packed once for every worker's columns, or nil
	cols, tiles  func(lo, hi int)         // forTiles' bodies (method values)
	goBlock      func(t0, t1, n0, n1 int) // o.block (method value)
}

var opPool = sync.Pool{New: func() any {
	o := new(op)
	o.cols, o.tiles, o.goBlock = o.colRange, o.tileRange, o.block
	return o
}}

func getOp(p Params, dst, x []float32, T, K, N int, w unsafe.Pointer, wsz, kind int) *op {
	o := opPool.Get().(*op)
	o.im, o.p, o.kind = cur.Load(), p, kind
	o.dst, o.x, o.T, o.K, o.N, o.w, o.wsz = dst, x, T, K, N, w, wsz
	return o
}

// start runs o serially or spread over the workers, then returns it to the
// pool.
func (o *op) start(serial bool) {
	if serial {
		o.body(0, o.T, 0, o.N)
	} else {
		o.forTiles()
	}
	o.dst, o.x, o.w, o.wf, o.wb, o.xb = nil, nil, nil, nil, nil, nil
	opPool.Put(o)
}

// body computes rows [t0,t1) × columns [n0,n1) on the calling goroutine:
// the SIMD microkernels (the set of o.kind) or the pure-Go block.
func (o *op) body(t0, t1, n0, n1 int) {
	s := o.im.simd
	switch {
	case o.kind == opBB:
		s.runBB(o.p, unsafe.Pointer(&o.dst[0]), o.xb, o.kp, o.w, o.K, o.N, t0, t1, n0, n1)
	case s != nil:
		ks := s.f32
		if o.kind == opBF16 {
			ks = s.bf16
		}
		if o.pre != nil { // rows [0,T), packed once for every worker
			s.sweep(ks, o.pre.strips, o.pre.blocks, unsafe.Pointer(&o.dst[0]), o.w, uintptr(o.wsz), o.K, o.N, n0, n1)
			return
		}
		s.run(ks, o.p, unsafe.Pointer(&o.dst[0]), unsafe.Pointer(&o.x[0]), o.w, uintptr(o.wsz), o.K, o.N, t0, t1, n0, n1)
	default:
		walk(o.p, t0, t1, n0, n1, o.wsz*o.K, o.goBlock)
	}
}

// block is the pure-Go block of o's weight type.
func (o *op) block(t0, t1, n0, n1 int) {
	if o.kind == opBF16 {
		blockBF16(o.dst, o.x, o.wb, o.K, o.N, t0, t1, n0, n1)
		return
	}
	block(o.dst, o.x, o.wf, o.K, o.N, t0, t1, n0, n1)
}

// forTiles splits rows [0,T) × columns [0,N) into work items of ColGrain
// columns and spreads them over the workers with parallel.For; each worker
// gets one call for its contiguous range of columns and all rows (so a
// GEMV splits over N). When there are fewer column items than workers
// (narrow outputs), items are RowBlock rows × ColGrain columns instead.
// A product of at least sharedPackRows rows split over columns has its
// activations packed once, over the workers, before the column region,
// instead of by every worker for all rows (the same strips and packing:
// the same results, with one packed copy instead of one per worker).
func (o *op) forTiles() {
	grain := o.p.ColGrain
	o.nTasks = (o.N + grain - 1) / grain
	o.rows = 1
	if o.nTasks < parallel.Workers {
		o.rows = (o.T + o.p.RowBlock - 1) / o.p.RowBlock
	}
	if o.rows == 1 {
		if s := o.im.simd; s != nil && o.kind != opBB && o.T >= sharedPackRows && o.nTasks > 1 && parallel.Workers > 1 {
			o.pre = s.prepack(o.p, unsafe.Pointer(&o.x[0]), o.K, o.T)
			defer func() { o.pre.release(); o.pre = nil }()
		}
		parallel.For(o.nTasks, 1, o.cols)
		return
	}
	parallel.For(o.nTasks*o.rows, 1, o.tiles)
}

func (o *op) colRange(lo, hi int) {
	grain := o.p.ColGrain
	o.body(0, o.T, lo*grain, min(hi*grain, o.N))
}

func (o *op) tileRange(lo, hi int) {
	grain := o.p.ColGrain
	for i := lo; i < hi; i++ {
		t0, n0 := (i/o.nTasks)*o.p.RowBlock, (i%o.nTasks)*grain
		o.body(t0, min(t0+o.p.RowBlock, o.T), n0, min(n0+grain, o.N))
	}
}

// walk calls fn over rows [t0,t1) × columns [n0,n1) for the pure-Go
// blocks: RowBlock rows at a time and, when there are several row blocks,
// panels of about panelBytes of weights (wrow bytes per weight row), so
// the weights are streamed from memory once.
func walk(p Params, t0, t1, n0, n1, wrow int, fn func(t0, t1, n0, n1 int)) {
	nc := n1 - n0
	if t1-t0 > p.RowBlock {
		nc = max(1, panelBytes/(wrow*24)) * 24
	}
	for np := n0; np < n1; np += nc {
		ne := min(np+nc, n1)
		for tb := t0; tb < t1; tb += p.RowBlock {
			fn(tb, min(tb+p.RowBlock, t1), np, ne)
		}
	}
}

// block computes rows [t0,t1) × columns [n0,n1) with 4×4 register tiles,
// each output summed left to right in float64 and rounded once (pure Go has
// no vector lanes to split a sum over: a float32 running sum's error would
// grow with K, and the portable kernels are the ones every CPU can run).
func block(dst, x, w []float32, K, N, t0, t1, n0, n1 int) {
	n := n0
	for ; n+4 <= n1; n += 4 {
		w0 := w[n*K : n*K+K]
		w1 := w[(n+1)*K : (n+1)*K+K]
		w2 := w[(n+2)*K : (n+2)*K+K]
		w3 := w[(n+3)*K : (n+3)*K+K]
		t := t0
		for ; t+4 <= t1; t += 4 {
			x0 := x[t*K : t*K+K]
			x1 := x[(t+1)*K : (t+1)*K+K]
			x2 := x[(t+2)*K : (t+2)*K+K]
			x3 := x[(t+3)*K : (t+3)*K+K]
			var a00, a01, a02, a03, a10, a11, a12, a13 float64
			var a20, a21, a22, a23, a30, a31, a32, a33 float64
			for k := range w0 {
				b0, b1, b2, b3 := float64(w0[k]), float64(w1[k]), float64(w2[k]), float64(w3[k])
				v := float64(x0[k])
				a00 += v * b0
				a01 += v * b1
				a02 += v * b2
				a03 += v * b3
				v = float64(x1[k])
				a10 += v * b0
				a11 += v * b1
				a12 += v * b2
				a13 += v * b3
				v = float64(x2[k])
				a20 += v * b0
				a21 += v * b1
				a22 += v * b2
				a23 += v * b3
				v = float64(x3[k])
				a30 += v * b0
				a31 += v * b1
				a32 += v * b2
				a33 += v * b3
			}
			d := dst[t*N+n : t*N+n+4]
			d[0], d[1], d[2], d[3] = float32(a00), float32(a01), float32(a02), float32(a03)
			d = dst[(t+1)*N+n : (t+1)*N+n+4]
			d[0], d[1], d[2], d[3] = float32(a10), float32(a11), float32(a12), float32(a13)
			d = dst[(t+2)*N+n : (t+2)*N+n+4]
			d[0], d[1], d[2], d[3] = float32(a20), float32(a21), float32(a22), float32(a23)
			d = dst[(t+3)*N+n : (t+3)*N+n+4]
			d[0], d[1], d[2], d[3] = float32(a30), float32(a31), float32(a32), float32(a33)
		}
		for ; t < t1; t++ {
			x0 := x[t*K : t*K+K]
			var a0, a1, a2, a3 float64
			for k, v := range x0 {
				v := float64(v)
				a0 += v * float64(w0[k])
				a1 += v * float64(w1[k])
				a2 += v * float64(w2[k])
				a3 += v * float64(w3[k])
			}
			d := dst[t*N+n : t*N+n+4]
			d[0], d[1], d[2], d[3] = float32(a0), float32(a1), float32(a2), float32(a3)
		}
	}
	for ; n < n1; n++ {
		wr := w[n*K : n*K+K]
		for t := t0; t < t1; t++ {
			dst[t*N+n] = dotGo(x[t*K:t*K+K], wr)
		}
	}
}

// Dot returns Σ a[i]·b[i] (len(b) ≥ len(a)); the summation order is that of
// MatMulT with the implementation in use. It does not allocate.
func Dot(a, b []float32) float32 {
	b = b[:len(a)]
	if s := cur.Load().simd; s != nil && len(a) > 0 {
		var r float32
		s.dot(unsafe.Pointer(&a[0]), unsafe.Pointer(&b[0]), unsafe.Pointer(&r), uintptr(len(a)/s.vw), s.tail(len(a)))
		return r
	}
	return dotGo(a, b)
}

// dotGo is Dot summed left to right in float64, rounded once (as block).
func dotGo(a, b []float32) float32 {
	b = b[:len(a)]
	var s float64
	for i, v := range a {
		s += float64(v) * float64(b[i])
	}
	return float32(s)
}

// MatMulTNaive is the reference for MatMulT: a plain triple loop.
func MatMulTNaive(dst, x []float32, T, K int, w []float32, N int) {
	for t := 0; t < T; t++ {
		for n := 0; n < N; n++ {
			var s float32
			for k := 0; k < K; k++ {
				s += x[t*K+k] * w[n*K+k]
			}
			dst[t*N+n] = s
		}
	}
}

// MatMul computes dst[M×N] = a[M×K] · b[K×N] (both row-major); used by the
// small inner products of attention and KDA. dst is overwritten.
func MatMul(dst, a []float32, M, K int, b []float32, N int) {
	for i := 0; i < M; i++ {
		d := dst[i*N : i*N+N]
		for j := range d {
			d[j] = 0
		}
		ar := a[i*K : i*K+K]
		for k, av := range ar {
			if av == 0 {
				continue
			}
			Axpy(d, av, b[k*N:k*N+N])
		}
	}
}

// Axpy computes y += a·x (len(x) ≥ len(y); fused multiply-adds in the
// SIMD implementations).
func Axpy(y []float32, a float32, x []float32) {
	x = x[:len(y)]
	if s := cur.Load().simd; s != nil && len(y) > 0 {
		s.axpy(unsafe.Pointer(&y[0]), unsafe.Pointer(&x[0]), uintptr(len(y)), a)
		return
	}
	for i := range y {
		y[i] += a * x[i]
	}
}

// MaxRelDiff is the largest |a[i]−b[i]| / (1+|b[i]|): how far a GEMM
// candidate's output a is from the reference b (autotuning rejects a
// candidate beyond its tolerance). A NaN anywhere gives +Inf, never a
// pass.
func MaxRelDiff(a, b []float32) float64 {
	m := 0.0
	for i := range a {
		d := math.Abs(float64(a[i])-float64(b[i])) / (1 + math.Abs(float64(b[i])))
		if math.IsNaN(d) {
			return math.Inf(1)
		}
		m = math.Max(m, d)
	}
	return m
}
