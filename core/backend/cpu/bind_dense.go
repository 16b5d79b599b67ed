package cpu

import (
	"fmt"

	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/kernels/act"
	"github.com/glmflash/glmflash/kernels/gemm"
	"github.com/glmflash/glmflash/kernels/norm"
)

// Dense ops: embedding, norms, GEMMs, elementwise ops and row selection.
func init() {
	bind(ir.OpEmbed, bindEmbed)
	bind(ir.OpRMSNorm, bindRMSNorm)
	bind(ir.OpLayerNorm, bindLayerNorm)
	bindGEMM(ir.OpLinear, bindLinear)
	bindGEMM(ir.OpLinearSplit, bindLinearSplit)
	bind(ir.OpLinearBatched, bindLinearBatched)
	bind(ir.OpSigmoid, bindSigmoid)
	bind(ir.OpAdd, bindAdd)
	bind(ir.OpSwiGLU, bindSwiGLU)
	bind(ir.OpSwiGLUPacked, bindSwiGLUPacked)
	bind(ir.OpStreamMean, bindStreamMean)
	bind(ir.OpLastRows, bindLastRows)
	bind(ir.OpSpanRows, bindSpanRows)
}

// bindSpanRows gathers each sequence's last rows (its span's Rows of them).
func bindSpanRows(p *Program, n *ir.Node) (func(rc *runCtx) error, error) {
	in, outs := n.Inputs, n.Outputs
	D := in[1].Shape[1]
	return func(rc *runCtx) error {
		x := rc.in(in[1])
		y := rc.out(outs[0])
		o := 0
		for _, s := range rc.batch.seqs {
			for j := s.n - s.rows; j < s.n; j++ {
				r := s.row0 + j
				copy(y[o*D:(o+1)*D], x[r*D:(r+1)*D])
				o++
			}
		}
		return nil
	}, nil
}

// bindEmbed binds the embedding lookup. The table is bound like a GEMM
// weight (bf16 in place when the checkpoint stores it so): a row is widened
// to float32 as it is copied, which is exact.
func bindEmbed(p *Program, n *ir.Node) (func(rc *runCtx) error, error) {
	in, outs := n.Inputs, n.Outputs
	Wb, W, err := p.gemmWeight(in[1])
	if err != nil {
		return nil, fmt.Errorf("embedding: %w", err)
	}
	H, D := 1, outs[0].Shape[1]  // plain rows [T,D]
	if len(outs[0].Shape) == 3 { // streams [T,H,D]
		H, D = outs[0].Shape[1], outs[0].Shape[2]
	}
	// A vocabulary shard (tensor parallelism) holds rows [v0, v0+V) and
	// embeds every other token as zeros (an all_reduce sums the shards).
	v0, V := int32(ir.AttrVocabStart.Get(n)), int32(in[1].Shape[0])
	return func(rc *runCtx) error {
		ids := rc.i[in[0]]
		x := rc.out(outs[0])
		for t, id := range ids {
			first := x[t*H*D : t*H*D+D]
			id -= v0
			if id < 0 || id >= V {
				clear(first)
			} else if Wb != nil {
				gemm.BF16ToFloat32s(first, Wb[int(id)*D:int(id)*D+D])
			} else {
				copy(first, W[int(id)*D:int(id)*D+D])
			}
			for s := 1; s < H; s++ {
				copy(x[(t*H+s)*D:(t*H+s+1)*D], first)
			}
		}
		return nil
	}, nil
}

func bindRMSNorm(p *Program, n *ir.Node) (func(rc *runCtx) error, error) {
	in, outs := n.Inputs, n.Outputs
	W := p.constant(in[1])
	D := in[0].Shape[1]
	eps := float32(ir.AttrEps.Get(n))
	return func(rc *runCtx) error {
		x := rc.in(in[0])
		y := rc.out(outs[0])
		norm.RMSNorm(y, x, rc.rows(in[0]), D, W, eps)
		return nil
	}, nil
}

func bindLayerNorm(p *Program, n *ir.Node) (func(rc *runCtx) error, error) {
	in, outs := n.Inputs, n.Outputs
	W, B := p.constant(in[1]), p.constant(in[2])
	D := in[0].Shape[1]
	eps := float32(ir.AttrEps.Get(n))
	return func(rc *runCtx) error {
		y := rc.out(outs[0])
		norm.LayerNorm(y, rc.in(in[0]), rc.rows(in[0]), D, W, B, eps)
		return nil
	}, nil
}

// bindLinear binds y = x·Wᵀ. An FP8 weight is used as stored (its
// matrices in the checkpoint's mapping; the tuned parameters do not apply
// to its products), a bf16 one with the bf16 kernels, else float32.
func bindLinear(p *Program, n *ir.Node, prm func(R int) gemm.Params) (func(rc *runCtx) error, error) {
	in, outs := n.Inputs, n.Outputs
	b, err := p.linearWeight(in[1])
	if err != nil {
		return nil, fmt.Errorf("linear: %w", err)
	}
	Wb, W := b.bf, b.f
	K, N := in[0].Shape[1], outs[0].Shape[1]
	if f8 := b.fp8; f8 != nil {
		mm := p.fp8MatMul()
		return func(rc *runCtx) error {
			R := rc.rows(in[0])
			mm(rc.out(outs[0]), rc.in(in[0]), R, K, f8, N)
			return nil
		}, nil
	}
	if Wb != nil {
		mm := p.bf16MatMul()
		return func(rc *runCtx) error {
			y := rc.out(outs[0])
			R := rc.rows(in[0])
			mm(prm(R), y, rc.in(in[0]), R, K, Wb, N)
			return nil
		}, nil
	}
	return func(rc *runCtx) error {
		y := rc.out(outs[0])
		R := rc.rows(in[0])
		gemm.MatMulTWith(prm(R), y, rc.in(in[0]), R, K, W, N)
		return nil
	}, nil
}

func bindLinearSplit(p *Program, n *ir.Node, prm func(R int) gemm.Params) (func(rc *runCtx) error, error) {
	in, outs := n.Inputs, n.Outputs
	b, err := p.linearWeight(in[1]) // the fused weight of bf16-exact parts is bf16-exact
	if err != nil {
		return nil, fmt.Errorf("linear_split: %w", err)
	}
	Wb, W, f8 := b.bf, b.f, b.fp8
	K, N := in[0].Shape[1], in[1].Shape[0]
	splits := ir.AttrSplits.Get(n)
	mm := p.bf16MatMul()
	mm8 := p.fp8MatMul()
	return func(rc *runCtx) error {
		R := rc.rows(in[0])
		tmp := rc.p.scratch(R * N)
		if f8 != nil {
			mm8(tmp, rc.in(in[0]), R, K, f8, N)
		} else if Wb != nil {
			mm(prm(R), tmp, rc.in(in[0]), R, K, Wb, N)
		} else {
			gemm.MatMulTWith(prm(R), tmp, rc.in(in[0]), R, K, W, N)
		}
		off := 0
		for i, s := range splits {
			y := rc.out(outs[i])
			for r := 0; r < R; r++ {
				copy(y[r*s:(r+1)*s], tmp[r*N+off:r*N+off+s])
			}
			off += s
		}
		return nil
	}, nil
}

func bindLinearBatched(p *Program, n *ir.Node) (func(rc *runCtx) error, error) {
	in, outs := n.Inputs, n.Outputs
	Wb, W, err := p.gemmWeight(in[1])
	if err != nil {
		return nil, fmt.Errorf("linear_batched: %w", err)
	}
	G, N, K := in[1].Shape[0], in[1].Shape[1], in[1].Shape[2]
	bmm := gemm.BatchedMatMulTBF16
	if p.bf16Act() {
		bmm = gemm.BatchedMatMulTBF16Act
	}
	ys := make([][]float32, G) // reused by every run (runs are serialized)
	return func(rc *runCtx) error {
		R := rc.rows(in[0])
		x := rc.in(in[0])
		for g := range ys {
			ys[g] = rc.out(outs[g])
		}
		if Wb != nil {
			bmm(ys, x, R, K, Wb, N)
		} else {
			gemm.BatchedMatMulT(ys, x, R, K, W, N)
		}
		return nil
	}, nil
}

// gemmParams returns how to pick a GEMM node's kernel parameters for a
// batch of R rows: tuned per-bucket attributes (the smallest bucket ≥ R,
// else the largest) or the defaults.
func gemmParams(n *ir.Node) func(R int) gemm.Params {
	bs, cg, rb := ir.AttrTuneBuckets.Get(n), ir.AttrTuneColGrain.Get(n), ir.AttrTuneRowBlock.Get(n)
	if len(bs) == 0 || len(cg) != len(bs) || len(rb) != len(bs) {
		return func(int) gemm.Params { return gemm.Default() }
	}
	return func(R int) gemm.Params {
		i := ir.TuneBucket(bs, R)
		return gemm.Params{ColGrain: cg[i], RowBlock: rb[i]}
	}
}

func bindSigmoid(p *Program, n *ir.Node) (func(rc *runCtx) error, error) {
	in, outs := n.Inputs, n.Outputs
	return func(rc *runCtx) error {
		act.SigmoidInPlace(rc.out(outs[0]), rc.in(in[0]))
		return nil
	}, nil
}

func bindAdd(p *Program, n *ir.Node) (func(rc *runCtx) error, error) {
	in, outs := n.Inputs, n.Outputs
	return func(rc *runCtx) error {
		x, y := rc.in(in[0]), rc.in(in[1])
		o := rc.out(outs[0])
		for i := range o {
			o[i] = x[i] + y[i]
		}
		return nil
	}, nil
}

func bindSwiGLU(p *Program, n *ir.Node) (func(rc *runCtx) error, error) {
	in, outs := n.Inputs, n.Outputs
	limit := float32(ir.AttrLimit.Get(n))
	return func(rc *runCtx) error {
		act.SwiGLU(rc.out(outs[0]), rc.in(in[0]), rc.in(in[1]), limit)
		return nil
	}, nil
}

func bindSwiGLUPacked(p *Program, n *ir.Node) (func(rc *runCtx) error, error) {
	in, outs := n.Inputs, n.Outputs
	I := outs[0].Shape[1]
	limit := float32(ir.AttrLimit.Get(n))
	return func(rc *runCtx) error {
		act.SwiGLUPacked(rc.out(outs[0]), rc.in(in[0]), rc.rows(in[0]), I, limit)
		return nil
	}, nil
}

func bindStreamMean(p *Program, n *ir.Node) (func(rc *runCtx) error, error) {
	in, outs := n.Inputs, n.Outputs
	H, D := in[0].Shape[1], in[0].Shape[2]
	return func(rc *runCtx) error {
		X := rc.in(in[0])
		y := rc.out(outs[0])
		inv := 1 / float32(H)
		for t := 0; t < rc.batch.T; t++ {
			yr := y[t*D : t*D+D]
			for d := range yr {
				var s float32
				for h := 0; h < H; h++ {
					s += X[(t*H+h)*D+d]
				}
				yr[d] = s * inv
			}
		}
		return nil
	}, nil
}

func bindLastRows(p *Program, n *ir.Node) (func(rc *runCtx) error, error) {
	in, outs := n.Inputs, n.Outputs
	D := in[1].Shape[1]
	return func(rc *runCtx) error {
		x := rc.in(in[1])
		y := rc.out(outs[0])
		for i, s := range rc.batch.seqs {
			r := s.row0 + s.n - 1
			copy(y[i*D:(i+1)*D], x[r*D:(r+1)*D])
		}
		return nil
	}, nil
}
