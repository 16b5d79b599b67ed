// Package act holds elementwise activations: sigmoid, SiLU, the clamped
// SwiGLU of GLM's MLPs and experts, and KDA's forget gate.
package act

import "math"

// Sigmoid returns 1/(1+e^−x).
func Sigmoid(x float32) float32 { return float32(1 / (1 + math.Exp(float64(-x)))) }

// SiLU returns x·sigmoid(x).
func SiLU(x float32) float32 { return x * Sigmoid(x) }

// SigmoidInPlace applies Sigmoid to every element of dst (reading src).
func SigmoidInPlace(dst, src []float32) {
	for i, v := range src {
		dst[i] = Sigmoid(v)
	}
}

// SwiGLU writes dst[i] = silu(min(g[i], limit)) · clamp(u[i], −limit, limit).
// A non-positive or infinite limit disables the clamp.
func SwiGLU(dst, g, u []float32, limit float32) {
	clamp := limit > 0 && !math.IsInf(float64(limit), 0)
	u = u[:len(g)]
	dst = dst[:len(g)]
	for i, gv := range g {
		uv := u[i]
		if clamp {
			if gv > limit {
				gv = limit
			}
			if uv > limit {
				uv = limit
			} else if uv < -limit {
				uv = -limit
			}
		}
		dst[i] = SiLU(gv) * uv
	}
}

// KDAGate computes the KDA forget gate (log-decay) for T tokens of H heads ×
// Dh channels from z = f_b(f_a(x)):
//
//	with a lower bound lb:  g = lb · sigmoid(exp(A_log[h]) · (z + dt_bias))
//	without (lb == nil):    g = −exp(A_log[h]) · softplus(z + dt_bias)
func KDAGate(dst, z []float32, T, H, Dh int, aLog, dtBias []float32, lb *float64) {
	P := H * Dh
	for t := 0; t < T; t++ {
		for h := 0; h < H; h++ {
			rate := math.Exp(float64(aLog[h]))
			for d := 0; d < Dh; d++ {
				i := t*P + h*Dh + d
				v := float64(z[i] + dtBias[h*Dh+d])
				if lb != nil {
					dst[i] = float32(*lb * (1 / (1 + math.Exp(-rate*v))))
				} else {
					sp := v
					if v <= 20 {
						sp = math.Log1p(math.Exp(v))
					}
					dst[i] = float32(-rate * sp)
				}
			}
		}
	}
}
