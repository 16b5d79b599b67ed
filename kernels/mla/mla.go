// Package mla implements sparse NoPE multi-head latent attention over a
// cache of compressed c_kv latents: the selected positions are expanded to
// per-head keys and values through kv_b_proj, then each query attends only
// its selected positions.
package mla

import (
	"math"
	"sort"

	"github.com/glmflash/glmflash/kernels/gemm"
	"github.com/glmflash/glmflash/kernels/parallel"
)

// Config is the attention geometry.
type Config struct {
	Heads  int // num_attention_heads
	QKDim  int // qk_nope_head_dim (+ rope, which is 0 for this model)
	VDim   int // v_head_dim
	Rank   int // kv_lora_rank
	Scale  float32
	KVBW   []float32 // kv_b_proj [Heads·(QKDim+VDim)][Rank]
	Params gemm.Params
}

// Attend computes o ([T][Heads·VDim]) for T queries q ([T][Heads·QKDim]) of
// one sequence whose latents are ckv ([L][Rank], the whole cache including
// the new tokens). sel ([T][width]) lists each query's positions (−1 =
// unused). A query with no position gets a zero output.
func (c *Config) Attend(o, q, ckv []float32, sel []int32, T, width int) {
	H, dq, dv, R := c.Heads, c.QKDim, c.VDim, c.Rank
	// union of the selected positions
	seen := map[int32]int{}
	var pos []int
	for _, p := range sel[:T*width] {
		if p >= 0 {
			if _, ok := seen[p]; !ok {
				seen[p] = 0
				pos = append(pos, int(p))
			}
		}
	}
	sort.Ints(pos)
	for i, p := range pos {
		seen[int32(p)] = i
	}
	n := len(pos)
	lat := make([]float32, n*R)
	for i, p := range pos {
		copy(lat[i*R:(i+1)*R], ckv[p*R:(p+1)*R])
	}
	row := H * (dq + dv)
	kv := make([]float32, n*row)
	gemm.MatMulTWith(c.Params, kv, lat, n, R, c.KVBW, row)
	parallel.For(T*H, 2, func(lo, hi int) {
		var logits []float32
		for th := lo; th < hi; th++ {
			t, h := th/H, th%H
			qh := q[t*H*dq+h*dq : t*H*dq+(h+1)*dq]
			oh := o[t*H*dv+h*dv : t*H*dv+(h+1)*dv]
			for i := range oh {
				oh[i] = 0
			}
			srow := sel[t*width : (t+1)*width]
			logits = logits[:0]
			mx := float32(math.Inf(-1))
			for _, p := range srow {
				if p < 0 {
					continue
				}
				r := seen[p]
				k := kv[r*row+h*(dq+dv) : r*row+h*(dq+dv)+dq]
				l := gemm.Dot(qh, k) * c.Scale
				logits = append(logits, l)
				if l > mx {
					mx = l
				}
			}
			if len(logits) == 0 {
				continue
			}
			var s float32
			for i, l := range logits {
				e := float32(math.Exp(float64(l - mx)))
				logits[i] = e
				s += e
			}
			i := 0
			for _, p := range srow {
				if p < 0 {
					continue
				}
				r := seen[p]
				v := kv[r*row+h*(dq+dv)+dq : r*row+(h+1)*(dq+dv)]
				gemm.Axpy(oh, logits[i]/s, v)
				i++
			}
		}
	})
}
