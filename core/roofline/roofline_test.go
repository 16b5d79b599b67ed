package roofline

import (
	"math"
	"testing"

	"github.com/glmflash/glmflash/model"
	"github.com/glmflash/glmflash/model/randckpt"
	"github.com/glmflash/glmflash/model/safetensors"
	"github.com/stretchr/testify/require"
)

func preset(t *testing.T, name string) *model.Config {
	t.Helper()
	c, err := randckpt.Preset(name)
	require.NoError(t, err)
	return c
}

// The tiny preset (the fixture's sizes: D 64, 8 layers, KDA at 0–2 and
// 4–6, DSA at 3 and 7 with full indexers, dense MLPs at 0–2, MoE of 8
// experts top-2 at 3–7), counted by hand from the architecture's shapes,
// bf16 weights (2 bytes) and F32 tensors (4 bytes).
func TestDecodeTinyByHand(t *testing.T) {
	const (
		// per layer: hc_{attn,ffn}_{fn [24,256], base [24], scale [3]} F32
		// and two norms [64] bf16
		common = 2*(24*256+24+3)*4 + 2*64*2 // 49624
		// KDA (P = 4·16 = 64): q,k,v [64,64], conv [64,1,4]×3 F32, f_a
		// [16,64], f_b [64,16], dt_bias [64] F32, A_log [4] F32, b [4,64],
		// g_a [16,64], g_b [64,16], o_norm [16], o [64,64]
		kda = 3*64*64*2 + 3*64*4*4 + 16*64*2 + 64*16*2 + 64*4 + 4*4 + 4*64*2 + 16*64*2 + 64*16*2 + 16*2 + 64*64*2 // 44848
		// MLA: q_a [48,64], q_a_ln [48], q_b [64,48], kv_a [32,64], kv_a_ln
		// [32], kv_b [128,32], o [64,64]; indexer: wq_b [256,48], wk
		// [16,64], k_norm weight and bias [16], weights_proj [16,64],
		// compress gate [16,64], ape [4,16] F32
		dsa = 48*64*2 + 48*2 + 64*48*2 + 32*64*2 + 32*2 + 128*32*2 + 64*64*2 +
			256*48*2 + 16*64*2 + 2*16*2 + 16*64*2 + 16*64*2 + 4*16*4 // 63968
		dense  = 3 * 160 * 64 * 2         // gate, up [160,64], down [64,160]
		moe    = 8*64*2 + 8*4 + 3*32*64*2 // router [8,64], bias [8] F32, shared expert
		expert = 3 * 32 * 64 * 2          // one routed expert: 12288
		final  = 64 * 2                   // final norm
		nonExp = 8*common + 6*kda + 2*dsa + 3*dense + 5*moe + final
	)
	require.Equal(t, 1045184, nonExp)
	cfg := preset(t, "tiny")
	for _, c := range []struct {
		B       int
		experts float64
	}{{1, 2}, {8, 8 * (1 - math.Pow(0.75, 8))}} {
		s, err := Decode(cfg, Held(false, false), c.B, 40)
		require.NoError(t, err)
		B := float64(c.B)
		require.Equal(t, float64(nonExp), s.Weights)
		require.Equal(t, 5, s.MoELayers)
		require.Equal(t, float64(expert), s.ExpertBytes)
		require.InDelta(t, c.experts, s.ExpertsPerLayer, 1e-12)
		require.InDelta(t, 5*c.experts*expert, s.Experts, 1e-6)
		require.Equal(t, B*64*2, s.Embedding)
		require.Equal(t, float64(256*64*2), s.LMHead)
		require.Equal(t, B*6*2*4*(4*16*16), s.KDAState, "6 KDA layers, state read and written")
		require.Equal(t, B*6*2*4*(3*64*3), s.Conv, "6 KDA layers, window read and written")
		require.Equal(t, B*2*4*16*32, s.Latents, "2 DSA layers, min(40, topk 16) rows of 32")
		require.Equal(t, B*2*4*10*16, s.IndexKeys, "2 indexers, ceil(40/4) pools of 16")
		require.InDelta(t, s.Weights+s.Experts+s.Embedding+s.LMHead+s.KDAState+s.Conv+s.Latents+s.IndexKeys, s.Total(), 1e-6)
		var sum float64
		for _, term := range s.Terms() {
			sum += term.Bytes
		}
		require.InDelta(t, s.Total(), sum, 1e-6)
	}
	// short contexts attend every row: min(context, topk)
	s, err := Decode(cfg, Held(false, false), 1, 5)
	require.NoError(t, err)
	require.Equal(t, float64(2*4*5*32), s.Latents)
	require.Equal(t, float64(2*4*2*16), s.IndexKeys, "ceil(5/4) = 2 pools")
}

// The bench preset (D 1024, KDA 8×128, MLA kv_lora 256, 32 experts top-4
// of width 512, vocabulary 32000) by hand, BF16 and in the FP8 layout
// held as FP8, and with fp32 weights.
func TestDecodeBenchByHand(t *testing.T) {
	const (
		common = 2*(24*4096+24+3)*4 + 2*1024*2
		kda    = 3*1024*1024*2 + 3*1024*4*4 + 128*1024*2 + 1024*128*2 + 1024*4 + 8*4 + 8*1024*2 + 128*1024*2 + 1024*128*2 + 128*2 + 1024*1024*2
		mla    = 512*1024*2 + 512*2 + 1024*512*2 + 256*1024*2 + 256*2 + 2048*256*2 + 1024*1024*2
		index  = 512*512*2 + 64*1024*2 + 2*64*2 + 8*1024*2 + 64*1024*2 + 4*64*4
		dense  = 3 * 2816 * 1024 * 2
		moe    = 32*1024*2 + 32*4 + 3*512*1024*2
		expert = 3 * 512 * 1024 * 2
		nonExp = 8*common + 6*kda + 2*(mla+index) + 3*dense + 5*moe + 1024*2
	)
	require.Equal(t, 144477696, nonExp)
	cfg := preset(t, "bench")
	s, err := Decode(cfg, Held(false, false), 1, 1000)
	require.NoError(t, err)
	require.Equal(t, float64(nonExp), s.Weights)
	require.Equal(t, float64(5*4*expert), s.Experts, "exactly k = 4 experts at B = 1")
	require.Equal(t, float64(1024*2), s.Embedding)
	require.Equal(t, float64(32000*1024*2), s.LMHead)
	require.Equal(t, float64(6*2*4*8*128*128), s.KDAState)
	require.Equal(t, float64(6*2*4*3*1024*3), s.Conv)
	require.Equal(t, float64(2*4*256*256), s.Latents, "min(1000, 256) rows")
	require.Equal(t, float64(2*4*250*64), s.IndexKeys, "1000/4 pools")
	s8, err := Decode(cfg, Held(false, false), 8, 1000)
	require.NoError(t, err)
	require.InDelta(t, 32*(1-math.Pow(28.0/32, 8)), s8.ExpertsPerLayer, 1e-12)
	require.InDelta(t, 21.0045147, s8.ExpertsPerLayer, 1e-6)
	require.Equal(t, s.Weights, s8.Weights, "weights once per step")
	require.Equal(t, 8*s.KDAState, s8.KDAState, "state per sequence")

	// fp32 weights: every weight at 4 bytes
	w32, err := Decode(cfg, Held(false, true), 1, 1000)
	require.NoError(t, err)
	require.Equal(t, float64(2*32000*1024*4), 2*w32.LMHead)
	require.Equal(t, float64(5*4*2*expert), w32.Experts)

	// the FP8 layout: q_a, q_b, kv_a, o, dense MLPs and every expert matrix
	// at 1 byte plus F32 scales per 128×128 block when held as FP8; bf16
	// with no scales when dequantized
	q := cfg.Clone()
	q.Quant = &model.QuantConfig{Method: "fp8", Fmt: "e4m3", WeightBlockSize: [2]int{128, 128}}
	sc := func(n, k int) int { return ((n + 127) / 128) * ((k + 127) / 128) * 4 }
	const (
		mlaQ   = 512 * 1024 // elements of the FP8 MLA matrices
		mlaQ2  = 1024 * 512
		mlaKV  = 256 * 1024
		mlaO   = 1024 * 1024
		denseQ = 3 * 2816 * 1024
		sharQ  = 3 * 512 * 1024
	)
	fp8 := nonExp - 2*(mlaQ+mlaQ2+mlaKV+mlaO)*2 - 3*denseQ*2 - 5*sharQ*2 + // their bf16 bytes out
		2*(mlaQ+mlaQ2+mlaKV+mlaO) + 3*denseQ + 5*sharQ + // 1 byte each
		2*(sc(512, 1024)+sc(1024, 512)+sc(256, 1024)+sc(1024, 1024)) + 3*(2*sc(2816, 1024)+sc(1024, 2816)) + 5*(2*sc(512, 1024)+sc(1024, 512))
	f8, err := Decode(q, Held(true, false), 1, 1000)
	require.NoError(t, err)
	require.Equal(t, float64(fp8), f8.Weights)
	require.Equal(t, float64(5*4*(3*512*1024+2*sc(512, 1024)+sc(1024, 512))), f8.Experts)
	deq, err := Decode(q, Held(false, false), 1, 1000)
	require.NoError(t, err)
	require.Equal(t, s.Weights, deq.Weights, "dequantized to bf16: the BF16 checkpoint's bytes")
	require.Equal(t, s.Experts, deq.Experts)
}

func TestHeldAndErrors(t *testing.T) {
	w := func(name string, dt safetensors.DType) model.WeightSpec {
		return model.WeightSpec{Name: name, DType: dt}
	}
	h := Held(true, false)
	require.Equal(t, 1.0, h(w("a.weight", safetensors.F8E4M3)))
	require.Equal(t, 4.0, h(w("a.weight"+model.ScaleSuffix, safetensors.F32)))
	require.Equal(t, 2.0, h(w("b.weight", safetensors.BF16)))
	require.Equal(t, 4.0, h(w("c", safetensors.F32)))
	require.Equal(t, 0.0, Held(false, false)(w("a.weight"+model.ScaleSuffix, safetensors.F32)))
	require.Equal(t, 0.0, Held(true, true)(w("a.weight"+model.ScaleSuffix, safetensors.F32)))
	require.Equal(t, 4.0, Held(true, true)(w("a.weight", safetensors.F8E4M3)))
	require.Equal(t, 3.0, ExpectedExperts(8, 3, 1))
	require.Equal(t, 8.0, ExpectedExperts(8, 8, 5))
	_, err := Decode(preset(t, "tiny"), Held(false, false), 0, 1)
	require.ErrorContains(t, err, "batch 0")
}
