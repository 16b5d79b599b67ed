package act

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSwiGLUClamps(t *testing.T) {
	g := []float32{-3, 0, 2, 50}
	u := []float32{20, -20, 0.5, 3}
	dst := make([]float32, 4)
	SwiGLU(dst, g, u, 10)
	require.InDelta(t, SiLU(-3)*10, dst[0], 1e-6)
	require.InDelta(t, 0, dst[1], 1e-6)
	require.InDelta(t, SiLU(2)*0.5, dst[2], 1e-6)
	require.InDelta(t, SiLU(10)*3, dst[3], 1e-5)
	SwiGLU(dst, g, u, 0)
	require.InDelta(t, SiLU(50)*3, dst[3], 1e-4)
}

func TestKDAGateBothForms(t *testing.T) {
	z := []float32{0.3, -1, 2, 0.1}
	aLog := []float32{0.5, -0.2}
	dt := []float32{0.1, 0.2, -0.3, 0.4}
	lb := -5.0
	dst := make([]float32, 4)
	KDAGate(dst, z, 1, 2, 2, aLog, dt, &lb)
	for i := range z {
		h := i / 2
		want := -5 / (1 + math.Exp(-math.Exp(float64(aLog[h]))*float64(z[i]+dt[i])))
		require.InDelta(t, want, dst[i], 1e-6)
		require.True(t, dst[i] < 0 && dst[i] > -5)
	}
	KDAGate(dst, z, 1, 2, 2, aLog, dt, nil)
	for i := range z {
		h := i / 2
		want := -math.Exp(float64(aLog[h])) * math.Log1p(math.Exp(float64(z[i]+dt[i])))
		require.InDelta(t, want, dst[i], 1e-6)
	}
}
