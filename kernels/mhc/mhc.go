// Package mhc implements Manifold-Constrained Hyper-Connections: the "pre"
// step (mixing logits, Sinkhorn-projected stream combiner, stream collapse)
// and the "post" step (expand a sub-layer output back into H streams).
package mhc

import (
	"math"
	"sync"

	"github.com/glmflash/glmflash/kernels/gemm"
)

// Params are one mHC site's learned tensors and constants.
type Params struct {
	H          int       // residual streams (hc_mult)
	D          int       // hidden size
	Fn         []float32 // [(2+H)·H][H·D]
	Base       []float32 // [(2+H)·H]
	Scale      []float32 // [3]
	NormEps    float32   // unweighted RMSNorm eps (rms_norm_eps)
	HCEps      float32   // hc_eps
	Iterations int       // hc_sinkhorn_iters
}

// Pre computes, for each of T tokens with streams X ([T][H][D]):
// h ([T][D]) = Σ_i pre[i]·X[i], post ([T][H]) and comb ([T][H][H], row i =
// source stream, column j = destination stream, Sinkhorn-normalized).
func Pre(p *Params, h, post, comb, X []float32, T int) {
	H, D := p.H, p.D
	mix := (2 + H) * H
	// scratch on the stack for the usual stream counts (H ≤ 6) and one
	// token; blocks of up to preRows tokens take their mixing logits from
	// one product with Fn (MatMulT sums each output in Dot's order, so a
	// token's logits do not depend on the tokens beside it) into a pooled
	// buffer (the product keeps its operands, so they live on the heap)
	var mb [48]float32
	var pb [6]float32
	var m, pre []float32
	if mix <= len(mb) { // then H ≤ 6
		m, pre = mb[:mix], pb[:H]
	} else {
		m, pre = make([]float32, mix), make([]float32, H)
	}
	var blk *[]float32
	for t0 := 0; t0 < T; t0 += preRows {
		n := min(T-t0, preRows)
		xs := X[t0*H*D : (t0+n)*H*D]
		var ms []float32
		if n == 1 {
			for i := 0; i < mix; i++ {
				m[i] = gemm.Dot(xs, p.Fn[i*H*D:(i+1)*H*D])
			}
			ms = m
		} else {
			if blk == nil {
				blk = blockPool.Get().(*[]float32)
				if cap(*blk) < preRows*mix {
					*blk = make([]float32, preRows*mix)
				}
			}
			bm := (*blk)[:n*mix]
			gemm.MatMulTSerial(bm, xs, n, H*D, p.Fn, mix)
			ms = bm
		}
		for u := 0; u < n; u++ {
			t := t0 + u
			x := xs[u*H*D : (u+1)*H*D]
			var ss float64 // the squares summed in float64, as kernels/norm's
			for _, v := range x {
				ss += float64(v) * float64(v)
			}
			r := float32(1 / math.Sqrt(ss/float64(H*D)+float64(p.NormEps)))
			mt := ms[u*mix : (u+1)*mix]
			for i := range mt {
				mt[i] *= r
			}
			Mapping(p, mt, pre, post[t*H:(t+1)*H], comb[t*H*H:(t+1)*H*H])
			ht := h[t*D : t*D+D]
			clear(ht)
			for i := 0; i < H; i++ {
				gemm.Axpy(ht, pre[i], x[i*D:i*D+D])
			}
		}
	}
	if blk != nil {
		blockPool.Put(blk)
	}
}

// blockPool holds Pre's buffers of mixing logits for blocks of tokens.
var blockPool = sync.Pool{New: func() any { return new([]float32) }}

// preRows is the number of tokens whose mixing logits Pre computes in one
// product (and PostPre's block of tokens).
const preRows = 16

// Mapping turns the mixing logits m ([(2+H)·H], already RMS-scaled) into
// pre, post and the Sinkhorn-projected comb.
//
// The sigmoids and the Sinkhorn iterations run in float64 and round once.
// In float32 the 2·Iterations normalizations (each row and column sum and
// quotient rounded) leave comb a few ulp off, and comb mixes the residual
// streams of every layer: that rounding, compounded over the layers, was
// the largest source of the fixtures' max |Δlogit| and of its spread
// between the GEMM implementations (docs/precision.md).
func Mapping(p *Params, m, pre, post, comb []float32) {
	H := p.H
	eps := float64(p.HCEps)
	for i := 0; i < H; i++ {
		pre[i] = float32(sig64(float64(p.Scale[0]*m[i]+p.Base[i])) + eps)
		post[i] = float32(2 * sig64(float64(p.Scale[1]*m[H+i]+p.Base[H+i])))
	}
	var cb [64]float64 // H ≤ 8 on the stack
	var c []float64
	if H*H <= len(cb) {
		c = cb[:H*H]
	} else {
		c = make([]float64, H*H)
	}
	for i := 0; i < H; i++ {
		row := c[i*H : i*H+H]
		mx := math.Inf(-1)
		for j := range row {
			row[j] = float64(p.Scale[2]*m[2*H+i*H+j] + p.Base[2*H+i*H+j])
			if row[j] > mx { // (not math.Max: a NaN is skipped here, as in the CUDA kernel)
				mx = row[j]
			}
		}
		var s float64
		for j := range row {
			row[j] = math.Exp(row[j] - mx)
			s += row[j]
		}
		for j := range row {
			row[j] = row[j]/s + eps
		}
	}
	colNorm64(c, H, eps)
	for it := 1; it < p.Iterations; it++ {
		for i := 0; i < H; i++ {
			row := c[i*H : i*H+H]
			var s float64
			for _, v := range row {
				s += v
			}
			for j := range row {
				row[j] /= s + eps
			}
		}
		colNorm64(c, H, eps)
	}
	for i := range c {
		comb[i] = float32(c[i])
	}
}

func sig64(x float64) float64 { return 1 / (1 + math.Exp(-x)) }

// colNorm64 divides each column of the H×H matrix c by its sum (+ eps).
func colNorm64(c []float64, H int, eps float64) {
	for j := 0; j < H; j++ {
		var s float64
		for i := 0; i < H; i++ {
			s += c[i*H+j]
		}
		for i := 0; i < H; i++ {
			c[i*H+j] /= s + eps
		}
	}
}

// Post expands a sub-layer output o ([T][D]) into new streams:
// out[j] = post[j]·o + Σ_i comb[i][j]·R[i], with R the streams the matching
// Pre read. out ([T][H][D]) must not alias R.
func Post(out, o, R, post, comb []float32, T, H, D int) {
	for t := 0; t < T; t++ {
		ot := o[t*D : t*D+D]
		for j := 0; j < H; j++ {
			dst := out[(t*H+j)*D : (t*H+j+1)*D]
			clear(dst)
			gemm.Axpy(dst, post[t*H+j], ot) // 0 + pj·v: pj·v exactly rounded
			for i := 0; i < H; i++ {
				gemm.Axpy(dst, comb[t*H*H+i*H+j], R[(t*H+i)*D:(t*H+i+1)*D])
			}
		}
	}
}

// PostPreArgs are the buffers of a fused post+pre step over T tokens.
type PostPreArgs struct {
	Out, H2, Post2, Comb2 []float32 // outputs: new streams, next sub-layer input, next post, next comb
	O, R, Post, Comb      []float32 // inputs: sub-layer output, old streams, this site's post/comb
	NormW                 []float32 // optional RMSNorm weight applied to H2 (nil: none)
	NormEps               float32
}

// PostPre expands a sub-layer output into new streams and, in the same
// sweep over each block of preRows tokens, runs the next site's pre (mixing, Sinkhorn,
// collapse) and the optional RMSNorm on the streams it just wrote. Every
// value is computed with the same operations in the same order as
// Post followed by Pre (and norm), so results are bit-identical.
func PostPre(p *Params, a *PostPreArgs, T int) {
	H, D := p.H, p.D
	for t0 := 0; t0 < T; t0 += preRows {
		t1 := min(t0+preRows, T)
		Post(a.Out[t0*H*D:t1*H*D], a.O[t0*D:t1*D], a.R[t0*H*D:t1*H*D], a.Post[t0*H:t1*H], a.Comb[t0*H*H:t1*H*H], t1-t0, H, D)
		Pre(p, a.H2[t0*D:t1*D], a.Post2[t0*H:t1*H], a.Comb2[t0*H*H:t1*H*H], a.Out[t0*H*D:t1*H*D], t1-t0)
		if a.NormW != nil {
			for t := t0; t < t1; t++ {
				normRow(a.H2[t*D:(t+1)*D], a.NormW, a.NormEps)
			}
		}
	}
}

// PostPreUnfused is the declined path: the whole post over all T tokens,
// then the whole pre, then the norm (what the unfused graph does).
func PostPreUnfused(p *Params, a *PostPreArgs, T int) {
	H, D := p.H, p.D
	Post(a.Out, a.O, a.R, a.Post, a.Comb, T, H, D)
	Pre(p, a.H2, a.Post2, a.Comb2, a.Out, T)
	if a.NormW != nil {
		for t := 0; t < T; t++ {
			normRow(a.H2[t*D:(t+1)*D], a.NormW, a.NormEps)
		}
	}
}

// normRow is the weighted RMSNorm of kernels/norm for one row (same order
// of operations).
func normRow(x, w []float32, eps float32) {
	var s float64
	for _, v := range x {
		s += float64(v) * float64(v)
	}
	r := float32(1 / math.Sqrt(s/float64(len(x))+float64(eps)))
	for i, v := range x {
		x[i] = w[i] * (v * r)
	}
}
