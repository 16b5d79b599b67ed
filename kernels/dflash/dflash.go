// Package dflash holds the kernels of the DFlash block drafter's attention
// (z-lab's Qwen3DFlashAttention, the op dflash_attn): Qwen3's per-head
// RMSNorm of q and k, RoPE in the rotate_half (NeoX) form, and a block's
// non-causal attention over a sequence's cached context keys and its own
// block keys, with grouped K/V heads. Everything is fp32.
package dflash

import (
	"math"

	"github.com/glmflash/glmflash/kernels/gemm"
	"github.com/glmflash/glmflash/kernels/parallel"
)

// Config is one draft layer's attention geometry.
type Config struct {
	Heads, KVHeads, HeadDim int
	Eps                     float64 // the q/k RMSNorm's epsilon
	Theta                   float64 // RoPE's base
}

// NormRope normalizes every head of rows [rows][heads·hd] in place
// (Qwen3RMSNorm over hd with weight w, eps, in fp32) and rotates it by
// RoPE at position pos0+r for row r: for i < hd/2, with
// f = pos·θ^(−2i/hd), x_i' = x_i·cos f − x_{i+hd/2}·sin f and
// x_{i+hd/2}' = x_{i+hd/2}·cos f + x_i·sin f.
func (c *Config) NormRope(x []float32, rows, heads int, w []float32, pos0 int) {
	hd := c.HeadDim
	inv := c.invFreq()
	parallel.For(rows, 8, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			cos, sin := rotation(inv, pos0+r)
			for h := 0; h < heads; h++ {
				c.normRopeHead(x[(r*heads+h)*hd:(r*heads+h+1)*hd], w, cos, sin)
			}
		}
	})
}

// invFreq is θ^(−2i/hd) for i < hd/2, computed as transformers does
// (1/θ^(2i/hd) in float64, then float32).
func (c *Config) invFreq() []float64 {
	half := c.HeadDim / 2
	inv := make([]float64, half)
	for i := range inv {
		inv[i] = float64(float32(1 / math.Pow(c.Theta, float64(2*i)/float64(c.HeadDim))))
	}
	return inv
}

// rotation returns cos and sin of pos·inv_freq (rounded to fp32).
func rotation(inv []float64, pos int) (cos, sin []float32) {
	cos, sin = make([]float32, len(inv)), make([]float32, len(inv))
	for i, f := range inv {
		a := float64(float32(float64(pos) * f))
		cos[i], sin[i] = float32(math.Cos(a)), float32(math.Sin(a))
	}
	return cos, sin
}

func (c *Config) normRopeHead(x, w, cos, sin []float32) {
	var ss float64
	for _, v := range x {
		ss += float64(v) * float64(v)
	}
	r := float32(1 / math.Sqrt(ss/float64(len(x))+c.Eps))
	for i := range x {
		x[i] = x[i] * r * w[i]
	}
	half := len(x) / 2
	for i := 0; i < half; i++ {
		a, b := x[i], x[i+half]
		x[i] = a*cos[i] - b*sin[i]
		x[i+half] = b*cos[i] + a*sin[i]
	}
}

// Attend computes one sequence's block attention: o and q are [B][Hq·hd],
// the keys and values [N][Hkv·hd] (every cached context row, then the B
// block rows: N = L+c+B); every query attends to all N keys (non-causal),
// query head h to K/V head h/(Hq/Hkv), scale hd^−½, softmax in fp32.
func (c *Config) Attend(o, q []float32, B int, k, v []float32, N int) {
	Hq, Hkv, hd := c.Heads, c.KVHeads, c.HeadDim
	group := Hq / Hkv
	scale := float32(1 / math.Sqrt(float64(hd)))
	parallel.For(B*Hq, 1, func(lo, hi int) {
		s := make([]float32, N)
		acc := make([]float32, hd)
		for t := lo; t < hi; t++ {
			b, h := t/Hq, t%Hq
			kh := h / group
			qh := q[(b*Hq+h)*hd : (b*Hq+h+1)*hd]
			m := float32(math.Inf(-1))
			for j := 0; j < N; j++ {
				s[j] = gemm.Dot(qh, k[(j*Hkv+kh)*hd:(j*Hkv+kh+1)*hd]) * scale
				m = max(m, s[j])
			}
			var sum float32
			for j := range s {
				s[j] = float32(math.Exp(float64(s[j] - m)))
				sum += s[j]
			}
			clear(acc)
			for j := 0; j < N; j++ {
				gemm.Axpy(acc, s[j]/sum, v[(j*Hkv+kh)*hd:(j*Hkv+kh+1)*hd])
			}
			copy(o[(b*Hq+h)*hd:(b*Hq+h+1)*hd], acc)
		}
	})
}
