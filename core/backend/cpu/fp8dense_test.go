package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/plan"
	"github.com/glmflash/glmflash/kernels/gemm"
	"github.com/glmflash/glmflash/model/randckpt"
	"github.com/glmflash/glmflash/model/safetensors"
	"github.com/stretchr/testify/require"
)

// fp8Source is a checkpoint of FP8 matrices ([rows][cols] codes, 128×128
// block scales) that hands them out as stored (plan.RawWeights) and as
// float32 (code × scale, as model.Checkpoint computes it).
type fp8Source map[string]fp8Tensor

type fp8Tensor struct {
	w          *gemm.FP8
	rows, cols int
}

func (s fp8Source) Float32(name string, shape ...int) ([]float32, error) {
	t, ok := s[name]
	if !ok {
		return nil, fmt.Errorf("no tensor %s", name)
	}
	return t.w.Dequant(t.rows, t.cols), nil
}

func (s fp8Source) Raw(name string) ([]byte, safetensors.TensorInfo, error) {
	t, ok := s[name]
	if !ok {
		return nil, safetensors.TensorInfo{}, fmt.Errorf("no tensor %s", name)
	}
	return t.w.Codes, safetensors.TensorInfo{Name: name, DType: safetensors.F8E4M3, Shape: []int{t.rows, t.cols}}, nil
}

func (s fp8Source) FP8Scales(name string) ([]float32, [2]int, error) {
	w := s[name].w
	return w.Scales, [2]int{w.BlockRows, w.BlockCols}, nil
}

func randFP8Matrix(r *rand.Rand, N, K int, pow2 bool) fp8Tensor {
	const b = 128
	w := &gemm.FP8{Codes: make([]byte, N*K), BlockRows: b, BlockCols: b, ScaleCols: (K + b - 1) / b}
	for i := range w.Codes {
		if c := byte(r.IntN(256)); c&0x7f != 0x7f {
			w.Codes[i] = c
		}
	}
	w.Scales = make([]float32, (N+b-1)/b*w.ScaleCols)
	for i := range w.Scales {
		w.Scales[i] = float32(math.Ldexp(1, -6-r.IntN(4)))
		if !pow2 {
			w.Scales[i] *= 1 + r.Float32()
		}
	}
	return fp8Tensor{w, N, K}
}

// A dense FP8 weight of linear and linear_split (one stored matrix with N
// past the scale block, and a concat_rows of two: 256 + 77 rows) is bound
// as FP8 (weights_fp8 and its scales; no bf16 copy) and its products
// equal those of the bf16 copy it used to be bound as: bit for bit in
// fp32 at decode (T=1), fused-kernel (T=3) and prefill (T=20) heights; in
// bf16 bit for bit at prefill height (the same VDPBF16PS kernels on bf16
// tiles, where the CPU has them) and within rounding at decode heights.
// Not bf16-exact weights (non-power-of-two scales) give the float32
// path's bits in both precisions, as before.
func TestDenseFP8LinearKeptFP8(t *testing.T) {
	const K, N1, Na, Nb = 320, 300, 256, 77
	cfg, err := randckpt.Preset("tiny")
	require.NoError(t, err)
	for _, pow2 := range []bool{true, false} {
		r := rand.New(rand.NewPCG(31, 32))
		src := fp8Source{"w1": randFP8Matrix(r, N1, K, pow2), "wa": randFP8Matrix(r, Na, K, pow2), "wb": randFP8Matrix(r, Nb, K, pow2)}
		g := ir.New("fp8dense")
		g.AddInput(ir.InputTokens, ir.I32, ir.DimT)
		h := g.AddInput(ir.InputHidden, ir.F32, ir.DimT, K)
		w1 := g.AddWeight("w1", N1, K)
		cat := g.Op1(ir.OpConcatRows, 0, nil, g.AddWeight("wa", Na, K), g.AddWeight("wb", Nb, K))
		y := g.Op1(ir.OpLinear, 0, nil, h, w1)
		ab := g.Op(ir.OpLinearSplit, 0, ir.Attrs{"splits": []int{Na, Nb}}, h, cat)
		g.Outputs[ir.OutputLogits] = y
		g.Outputs["a"], g.Outputs["b"] = ab[0], ab[1]
		pl, err := plan.Compile(g, src, plan.Options{Lazy: true})
		require.NoError(t, err)

		for _, prec := range []backend.Precision{"fp32", "bf16"} {
			be := New(backend.Options{Precision: prec})
			prog, err := be.Compile(pl)
			require.NoError(t, err)
			mem := be.Info().Memory
			require.Zero(t, mem[MemBF16], "pow2=%v %s: bf16 copies %v", pow2, prec, mem)
			require.Zero(t, mem[MemFP32], "pow2=%v %s: float32 copies %v", pow2, prec, mem)
			require.Equal(t, int64((N1+Na+Nb)*K), mem[MemFP8], "%v", mem)
			require.Equal(t, int64(4*(3+2+1)*3), mem[MemFP8Scales], "%v", mem)
			// the float32 path (FP32Weights), and the bf16 copies the
			// weights were bound as before (bf16-exact ones)
			ref := New(backend.Options{Precision: prec, FP32Weights: true})
			refProg, err := ref.Compile(pl)
			require.NoError(t, err)
			old := New(backend.Options{Precision: prec})
			bw1, err := old.w.gemm(pl, w1, false)
			require.NoError(t, err)
			bcat, err := old.w.gemm(pl, cat, false)
			require.NoError(t, err)
			require.Equal(t, pow2, bw1.bf != nil && bcat.bf != nil, "bf16 copies exactly when bf16-exact")

			st, err := be.NewStore(cfg, []int{0}, backend.StoreOptions{Slots: 1})
			require.NoError(t, err)
			refSt, err := ref.NewStore(cfg, []int{0}, backend.StoreOptions{Slots: 1})
			require.NoError(t, err)
			for _, T := range []int{1, 3, 20} {
				x := make([]float32, T*K)
				for i := range x {
					x[i] = float32(r.NormFloat64())
				}
				b := &backend.Batch{Seqs: []backend.Seq{{Slot: 0, Tokens: make([]int32, T), Hidden: x}}}
				_, err := st.Alloc()
				require.NoError(t, err)
				_, err = refSt.Alloc()
				require.NoError(t, err)
				res, err := prog.Run(b, st)
				require.NoError(t, err)
				want, err := refProg.Run(b, refSt)
				require.NoError(t, err)
				require.NoError(t, st.Free(0))
				require.NoError(t, refSt.Free(0))
				got := append(append(append([]float32(nil), res.Logits...), res.Hidden["a"]...), res.Hidden["b"]...)
				what := fmt.Sprintf("pow2=%v %s T=%d", pow2, prec, T)
				if !pow2 || prec == "fp32" {
					exp := append(append(append([]float32(nil), want.Logits...), want.Hidden["a"]...), want.Hidden["b"]...)
					requireBits(t, exp, got, what+": the float32 path")
				}
				if !pow2 {
					continue
				}
				// the bf16 copies' products, as bindLinear and
				// bindLinearSplit ran them
				mm := gemm.MatMulTBF16With
				if prec == "bf16" {
					mm = gemm.MatMulTBF16ActWith
				}
				y1 := make([]float32, T*N1)
				mm(gemm.Default(), y1, x, T, K, bw1.bf, N1)
				yc := make([]float32, T*(Na+Nb))
				mm(gemm.Default(), yc, x, T, K, bcat.bf, Na+Nb)
				exp := y1
				for _, c := range [][2]int{{0, Na}, {Na, Na + Nb}} {
					for t := range T {
						exp = append(exp, yc[t*(Na+Nb)+c[0]:t*(Na+Nb)+c[1]]...)
					}
				}
				if prec == "fp32" || (T > 8 && gemm.BF16Dot()) {
					requireBits(t, exp, got, what+": the bf16 copies")
				} else {
					require.Less(t, gemm.MaxRelDiff(got, exp), 1e-4, what)
				}
			}
		}
	}
}

func requireBits(t *testing.T, want, got []float32, what string) {
	t.Helper()
	require.Equal(t, len(want), len(got), what)
	for i := range want {
		if math.Float32bits(want[i]) != math.Float32bits(got[i]) {
			require.Failf(t, "bits differ", "%s: output %d: want %v, got %v", what, i, want[i], got[i])
		}
	}
}
