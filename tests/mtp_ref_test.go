package tests

import (
	"math"
	"sort"
	"strconv"
	"testing"

	"github.com/glmflash/glmflash/model"
	"github.com/stretchr/testify/require"
)

// f64MTP is an independent float64 implementation of the MTP layer
// (architecture §7, with §3.6 MoE, §3.8 DSA/MLA and §6 k-pool indexer),
// one position at a time, written from the document and not from the
// engine's kernels. It keeps its own per-position cache (latents, indexer
// keys and gates) and records the smallest gap at every top-k boundary it
// crosses (indexer pools, experts, greedy picks) so a test can tell a real
// disagreement from a near-tie that fp32 may break the other way.
type f64MTP struct {
	cfg *model.Config
	ck  *model.Checkpoint
	t   testing.TB
	l   int
	w   map[string][]float64
	// per position: c_kv latents, indexer keys (after k_norm) and gates
	ckv, ik, ig [][]float64
	// MinGap is the smallest top-k boundary gap seen.
	MinGap float64
}

func newF64MTP(t testing.TB, ck *model.Checkpoint) *f64MTP {
	return &f64MTP{cfg: ck.Config(), ck: ck, t: t, l: ck.Config().MTPLayer(0), w: map[string][]float64{}, MinGap: math.Inf(1)}
}

// weight returns a checkpoint tensor (dequantized) as float64.
func (m *f64MTP) weight(name string) []float64 {
	if w, ok := m.w[name]; ok {
		return w
	}
	v, err := m.ck.Float32(name)
	require.NoError(m.t, err)
	w := make([]float64, len(v))
	for i, x := range v {
		w[i] = float64(x)
	}
	m.w[name] = w
	return w
}

func (m *f64MTP) lw(rest string) []float64 { return m.weight(model.LayerPrefix(m.l) + "." + rest) }

// matvec returns W·x for W [len(W)/len(x)][len(x)].
func matvec(W, x []float64) []float64 {
	K := len(x)
	y := make([]float64, len(W)/K)
	for r := range y {
		s := 0.0
		for c, xv := range x {
			s += W[r*K+c] * xv
		}
		y[r] = s
	}
	return y
}

func rmsnorm64(x, w []float64, eps float64) []float64 {
	ss := 0.0
	for _, v := range x {
		ss += v * v
	}
	r := 1 / math.Sqrt(ss/float64(len(x))+eps)
	y := make([]float64, len(x))
	for i, v := range x {
		y[i] = v * r * w[i]
	}
	return y
}

func layernorm64(x, w, b []float64, eps float64) []float64 {
	mu := 0.0
	for _, v := range x {
		mu += v
	}
	mu /= float64(len(x))
	va := 0.0
	for _, v := range x {
		va += (v - mu) * (v - mu)
	}
	r := 1 / math.Sqrt(va/float64(len(x))+eps)
	y := make([]float64, len(x))
	for i, v := range x {
		y[i] = (v-mu)*r*w[i] + b[i]
	}
	return y
}

func sigmoid64(x float64) float64 { return 1 / (1 + math.Exp(-x)) }

// topk returns the indices of the k largest scores (stable: lower index
// first on ties) and notes the gap at the boundary.
func (m *f64MTP) topk(scores []float64, k int) []int {
	idx := make([]int, len(scores))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return scores[idx[a]] > scores[idx[b]] })
	if k < len(idx) && !math.IsInf(scores[idx[k]], -1) {
		m.MinGap = math.Min(m.MinGap, scores[idx[k-1]]-scores[idx[k]])
	}
	return idx[:k]
}

// Argmax returns the greedy pick of a logits row and notes its margin.
func (m *f64MTP) Argmax(row []float64) int32 {
	return int32(m.topk(row, 1)[0])
}

// Step runs the MTP layer at the next position for token tok and hidden
// row h (architecture §7) and returns the logits and hm.
func (m *f64MTP) Step(tok int32, h []float64) (logits, hm []float64) {
	c := m.cfg
	D, eps := c.HiddenSize, c.RMSNormEps
	emb := m.weight(model.EmbedName)[int(tok)*D : (int(tok)+1)*D]
	cat := append(rmsnorm64(emb, m.lw("enorm.weight"), eps), rmsnorm64(h, m.lw("hnorm.weight"), eps)...) // embedding first
	z := matvec(m.lw("eh_proj.weight"), cat)
	a := m.attention(rmsnorm64(z, m.lw("input_layernorm.weight"), eps))
	for i := range z {
		z[i] += a[i]
	}
	f := m.moe(rmsnorm64(z, m.lw("post_attention_layernorm.weight"), eps))
	for i := range z {
		z[i] += f[i]
	}
	hm = rmsnorm64(z, m.lw("shared_head.norm.weight"), eps)
	return matvec(m.weight(model.LMHeadName), hm), hm
}

// attention is NoPE MLA over the positions the k-pool indexer selects
// (§3.8, §6), expanded (naive) form.
func (m *f64MTP) attention(x []float64) []float64 {
	c := m.cfg
	eps := c.RMSNormEps
	H, dq, dv, R := c.NumAttentionHeads, c.QKHeadDim(), c.VHeadDim, c.KVLoraRank
	Hi, Di, kp := c.IndexNHeads, c.IndexHeadDim, c.IndexKPool
	qres := rmsnorm64(matvec(m.lw("self_attn.q_a_proj.weight"), x), m.lw("self_attn.q_a_layernorm.weight"), eps)
	Q := matvec(m.lw("self_attn.q_b_proj.weight"), qres)
	m.ckv = append(m.ckv, rmsnorm64(matvec(m.lw("self_attn.kv_a_proj_with_mqa.weight"), x), m.lw("self_attn.kv_a_layernorm.weight"), eps))
	// indexer
	qi := matvec(m.lw("self_attn.indexer.wq_b.weight"), qres)
	m.ik = append(m.ik, layernorm64(matvec(m.lw("self_attn.indexer.wk.weight"), x), m.lw("self_attn.indexer.k_norm.weight"), m.lw("self_attn.indexer.k_norm.bias"), 1e-6))
	m.ig = append(m.ig, matvec(m.lw("self_attn.indexer.index_kpool_compress_gate"), x))
	hw := matvec(m.lw("self_attn.indexer.weights_proj.weight"), x)
	ape := m.lw("self_attn.indexer.index_kpool_compress_ape")
	t := len(m.ckv) - 1
	npools := (t + 1) / kp
	scores := make([]float64, npools)
	for p := 0; p < npools; p++ {
		key := make([]float64, Di)
		for ch := 0; ch < Di; ch++ {
			mx := math.Inf(-1)
			lg := make([]float64, kp)
			for j := 0; j < kp; j++ {
				lg[j] = m.ig[kp*p+j][ch] + ape[j*Di+ch]
				mx = math.Max(mx, lg[j])
			}
			sum := 0.0
			for j := range lg {
				lg[j] = math.Exp(lg[j] - mx)
				sum += lg[j]
			}
			for j := range lg {
				key[ch] += lg[j] / sum * m.ik[kp*p+j][ch]
			}
		}
		for h := 0; h < Hi; h++ {
			dot := 0.0
			for ch := 0; ch < Di; ch++ {
				dot += qi[h*Di+ch] * key[ch]
			}
			scores[p] += hw[h] / math.Sqrt(float64(Hi)) * math.Max(dot/math.Sqrt(float64(Di)), 0)
		}
	}
	var pos []int
	if npools > 0 {
		for _, p := range m.topk(scores, min(c.IndexTopK/kp, npools)) {
			for j := 0; j < kp; j++ {
				pos = append(pos, kp*p+j)
			}
		}
	}
	for j := kp * npools; j <= t; j++ {
		pos = append(pos, j) // the tail, the query included
	}
	kvb := m.lw("self_attn.kv_b_proj.weight") // [H·(dq+dv)][R]
	o := make([]float64, H*dv)
	for h := 0; h < H; h++ {
		lg := make([]float64, len(pos))
		mx := math.Inf(-1)
		for i, j := range pos {
			for d := 0; d < dq; d++ {
				k := 0.0
				row := kvb[(h*(dq+dv)+d)*R : (h*(dq+dv)+d+1)*R]
				for r, cv := range m.ckv[j] {
					k += row[r] * cv
				}
				lg[i] += Q[h*dq+d] * k
			}
			lg[i] /= math.Sqrt(float64(dq))
			mx = math.Max(mx, lg[i])
		}
		sum := 0.0
		for i := range lg {
			lg[i] = math.Exp(lg[i] - mx)
			sum += lg[i]
		}
		for i, j := range pos {
			for d := 0; d < dv; d++ {
				v := 0.0
				row := kvb[(h*(dq+dv)+dq+d)*R : (h*(dq+dv)+dq+d+1)*R]
				for r, cv := range m.ckv[j] {
					v += row[r] * cv
				}
				o[h*dv+d] += lg[i] / sum * v
			}
		}
	}
	return matvec(m.lw("self_attn.o_proj.weight"), o)
}

// swiglu64 is the clamped SwiGLU MLP (§3.5) with the given projections.
func (m *f64MTP) swiglu64(x []float64, gate, up, down []float64) []float64 {
	g, u := matvec(gate, x), matvec(up, x)
	for i := range g {
		if lim := m.cfg.SwiGLULimit; lim != nil {
			g[i] = math.Min(g[i], *lim)
			u[i] = math.Max(math.Min(u[i], *lim), -*lim)
		}
		g[i] = g[i] * sigmoid64(g[i]) * u[i]
	}
	return matvec(down, g)
}

// moe is the sigmoid-routed MoE with group-limited selection and shared
// experts (§3.6).
func (m *f64MTP) moe(x []float64) []float64 {
	c := m.cfg
	E, K := c.NRoutedExperts, c.NumExpertsPerTok
	logits := matvec(m.lw("mlp.gate.weight"), x)
	bias := m.lw("mlp.gate.e_score_correction_bias")
	s, choice := make([]float64, E), make([]float64, E)
	for e := range s {
		s[e] = sigmoid64(logits[e])
		choice[e] = s[e] + bias[e]
	}
	if G := c.NGroup; G > 1 {
		per := E / G
		gs := make([]float64, G)
		for g := range gs {
			grp := append([]float64(nil), choice[g*per:(g+1)*per]...)
			sort.Sort(sort.Reverse(sort.Float64Slice(grp)))
			gs[g] = grp[0] + grp[1]
		}
		keep := map[int]bool{}
		for _, g := range m.topk(gs, c.TopKGroup) {
			keep[g] = true
		}
		for e := range choice {
			if !keep[e/per] {
				choice[e] = math.Inf(-1)
			}
		}
	}
	sel := m.topk(choice, K)
	w := make([]float64, K)
	sum := 0.0
	for k, e := range sel {
		w[k] = s[e]
		sum += w[k]
	}
	out := make([]float64, c.HiddenSize)
	for k, e := range sel {
		if c.NormTopKProb {
			w[k] /= sum + 1e-20
		}
		w[k] *= c.RoutedScalingFactor
		p := "mlp.experts." + strconv.Itoa(e) + "."
		y := m.swiglu64(x, m.lw(p+"gate_proj.weight"), m.lw(p+"up_proj.weight"), m.lw(p+"down_proj.weight"))
		for i := range out {
			out[i] += w[k] * y[i]
		}
	}
	if c.NSharedExperts > 0 {
		y := m.swiglu64(x, m.lw("mlp.shared_experts.gate_proj.weight"), m.lw("mlp.shared_experts.up_proj.weight"), m.lw("mlp.shared_experts.down_proj.weight"))
		for i := range out {
			out[i] += y[i]
		}
	}
	return out
}

func to64(x []float32) []float64 {
	y := make([]float64, len(x))
	for i, v := range x {
		y[i] = float64(v)
	}
	return y
}

func to32(x []float64) []float32 {
	y := make([]float32, len(x))
	for i, v := range x {
		y[i] = float32(v)
	}
	return y
}
