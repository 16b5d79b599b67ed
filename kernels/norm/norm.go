// Package norm holds the normalizations of the model: weighted and
// unweighted RMSNorm, LayerNorm with bias, and KDA's gated per-head RMSNorm.
// All compute in float32 over rows of length D, but for the row reductions
// (sums of squares, mean and variance), which are summed in float64.
package norm

import (
	"math"
	"sync"

	"github.com/glmflash/glmflash/kernels/act"
)

// RMSNorm writes dst[t] = w ⊙ x[t] / sqrt(mean(x[t]²) + eps) for T rows of
// width D. dst may alias x.
func RMSNorm(dst, x []float32, T, D int, w []float32, eps float32) {
	for t := 0; t < T; t++ {
		xr := x[t*D : t*D+D]
		dr := dst[t*D : t*D+D]
		r := invRMS(xr, eps)
		for i, v := range xr {
			dr[i] = w[i] * (v * r)
		}
	}
}

// invRMS sums the squares in float64 (a row's rounding errors would
// otherwise grow with D and scale every output of the row alike).
func invRMS(x []float32, eps float32) float32 {
	var s float64
	for _, v := range x {
		s += float64(v) * float64(v)
	}
	return float32(1 / math.Sqrt(s/float64(len(x))+float64(eps)))
}

// InvRMS returns 1/sqrt(mean(x²)+eps).
func InvRMS(x []float32, eps float32) float32 { return invRMS(x, eps) }

// LayerNorm writes dst[t] = (x[t]−mean)/sqrt(var+eps) ⊙ w + b (biased
// variance, like torch.nn.LayerNorm). dst may alias x.
func LayerNorm(dst, x []float32, T, D int, w, b []float32, eps float32) {
	for t := 0; t < T; t++ {
		xr := x[t*D : t*D+D]
		dr := dst[t*D : t*D+D]
		var m64 float64
		for _, v := range xr {
			m64 += float64(v)
		}
		m64 /= float64(D)
		var vs float64
		for _, v := range xr {
			d := float64(v) - m64
			vs += d * d
		}
		mean := float32(m64)
		r := float32(1 / math.Sqrt(vs/float64(D)+float64(eps)))
		for i, v := range xr {
			dr[i] = (v-mean)*r*w[i] + b[i]
		}
	}
}

// GatedRMSNorm is KDA's output norm: for every token and each of H heads of
// width Dh, y = o/sqrt(mean(o²)+eps) ⊙ w ⊙ sigmoid(gate), with one weight
// vector w [Dh] shared by all heads. dst may alias o.
func GatedRMSNorm(dst, o, gate []float32, T, H, Dh int, w []float32, eps float32) {
	// the gate's sigmoid (act's float32 SIMD kernel) a row at a time, in a
	// pooled buffer (the kernel's operands live on the heap)
	sb := sigPool.Get().(*[]float32)
	if cap(*sb) < Dh {
		*sb = make([]float32, Dh)
	}
	sg := (*sb)[:Dh]
	for r := 0; r < T*H; r++ {
		or := o[r*Dh : r*Dh+Dh]
		gr := gate[r*Dh : r*Dh+Dh]
		dr := dst[r*Dh : r*Dh+Dh]
		inv := invRMS(or, eps)
		act.SigmoidSerial(sg, gr)
		for i, s := range sg {
			dr[i] = w[i] * (or[i] * inv) * s
		}
	}
	sigPool.Put(sb)
}

var sigPool = sync.Pool{New: func() any { return new([]float32) }}
