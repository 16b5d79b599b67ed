package gemm

import (
	"sync"

	"github.com/glmflash/glmflash/kernels/parallel"
)

// BatchedMatMulT runs G independent GEMMs in one parallel region: x is
// [T][G·K] (group g reads columns [g·K, (g+1)·K)), w is [G][N][K], and
// ys[g] ([T][N]) = x_g · w_gᵀ. This is the batched low-rank GEMM of KDA's
// forget/output gates (f_b and g_b stacked).
func BatchedMatMulT(ys [][]float32, x []float32, T, K int, w []float32, N int) {
	b := batchPool.Get().(*batchOp)
	b.kind, b.wf = opF32, w
	b.run(ys, x, T, K, N)
}

// BatchedMatMulTBF16 is BatchedMatMulT for bfloat16 weights (w is
// [G][N][K] bf16); the products are those of the widened weights.
func BatchedMatMulTBF16(ys [][]float32, x []float32, T, K int, w []uint16, N int) {
	b := batchPool.Get().(*batchOp)
	b.kind, b.wb = opBF16, w
	b.run(ys, x, T, K, N)
}

// BatchedMatMulTBF16Act is BatchedMatMulTBF16 with the activations
// rounded to bfloat16 (MatMulTBF16Act).
func BatchedMatMulTBF16Act(ys [][]float32, x []float32, T, K int, w []uint16, N int) {
	b := batchPool.Get().(*batchOp)
	b.kind, b.wb = opBB, w
	b.run(ys, x, T, K, N)
}

// batchOp is one batched product in flight (pooled, with its parallel body
// made once, so that a call allocates nothing).
type batchOp struct {
	kind         int
	wf           []float32
	wb           []uint16
	ys           [][]float32
	xg           []float32
	T, K, N, per int
	fn           func(lo, hi int)
}

var batchPool = sync.Pool{New: func() any {
	b := new(batchOp)
	b.fn = b.tasks
	return b
}}

const batchGrain = 32

// run runs the G groups' column chunks in one parallel region, then
// returns b to the pool.
func (b *batchOp) run(ys [][]float32, x []float32, T, K, N int) {
	defer func() {
		b.wf, b.wb, b.ys, b.xg = nil, nil, nil, nil
		batchPool.Put(b)
	}()
	G := len(ys)
	if T == 0 || N == 0 || G == 0 {
		return
	}
	// gather each group's input block contiguously once (in a pooled
	// buffer, like the packing buffers: no allocation in the steady state)
	xb := getBuf(G * T * K)
	defer bufPool.Put(xb)
	xg := *xb
	for g := 0; g < G; g++ {
		blk := xg[g*T*K : (g+1)*T*K]
		for t := 0; t < T; t++ {
			copy(blk[t*K:(t+1)*K], x[t*G*K+g*K:t*G*K+(g+1)*K])
		}
	}
	b.ys, b.xg, b.T, b.K, b.N = ys, xg, T, K, N
	b.per = (N + batchGrain - 1) / batchGrain
	parallel.For(G*b.per, 1, b.fn)
}

// tasks computes tasks [lo, hi): task i is group i/per's column chunk
// i%per.
func (b *batchOp) tasks(lo, hi int) {
	T, K, N := b.T, b.K, b.N
	tb := getBuf(T * batchGrain)
	defer bufPool.Put(tb)
	for task := lo; task < hi; task++ {
		g, c := task/b.per, task%b.per
		n0, n1 := c*batchGrain, min((c+1)*batchGrain, N)
		cols := n1 - n0
		tmp := (*tb)[:T*cols]
		xg := b.xg[g*T*K : (g+1)*T*K]
		switch b.kind {
		case opF32:
			MatMulTSerial(tmp, xg, T, K, b.wf[(g*N+n0)*K:(g*N+n1)*K], cols)
		case opBF16:
			MatMulTBF16Serial(tmp, xg, T, K, b.wb[(g*N+n0)*K:(g*N+n1)*K], cols)
		default:
			MatMulTBF16ActSerial(tmp, xg, T, K, b.wb[(g*N+n0)*K:(g*N+n1)*K], cols)
		}
		y := b.ys[g]
		for t := 0; t < T; t++ {
			copy(y[t*N+n0:t*N+n1], tmp[t*cols:(t+1)*cols])
		}
	}
}
