package randckpt

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/glmflash/glmflash/model/safetensors"
	"github.com/stretchr/testify/require"
)

// quantizeRef is quantize as first written (one block at a time, the amax
// in float64): the checkpoints written before it was made faster hold its
// bytes.
func quantizeRef(vals []float32, n, k int, bs [2]int) (codes, scaleBytes []byte) {
	sn, sk := (n+bs[0]-1)/bs[0], (k+bs[1]-1)/bs[1]
	codes = make([]byte, n*k)
	scales := make([]float32, sn*sk)
	for br := range sn {
		r0, r1 := br*bs[0], min((br+1)*bs[0], n)
		for bc := 0; bc < sk; bc++ {
			c0, c1 := bc*bs[1], min((bc+1)*bs[1], k)
			var amax float32
			for r := r0; r < r1; r++ {
				for _, v := range vals[r*k+c0 : r*k+c1] {
					amax = max(amax, float32(math.Abs(float64(v))))
				}
			}
			p := pow2Scale(amax)
			scales[br*sk+bc] = p
			inv := 1 / p
			for r := r0; r < r1; r++ {
				for c := c0; c < c1; c++ {
					codes[r*k+c] = safetensors.Float32ToF8E4M3(vals[r*k+c] * inv)
				}
			}
		}
	}
	scaleBytes = make([]byte, len(scales)*4)
	_ = safetensors.FromFloat32(safetensors.F32, scales, scaleBytes)
	return codes, scaleBytes
}

// quantize gives the bytes of the reference on whole and partial blocks,
// blocks of zeros and of negative zeros, tiny, huge and mixed-sign values.
func TestQuantizeMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, c := range []struct {
		n, k int
		bs   [2]int
	}{{256, 384, [2]int{128, 128}}, {300, 200, [2]int{128, 128}}, {7, 5, [2]int{128, 128}}, {130, 260, [2]int{64, 32}}} {
		vals := make([]float32, c.n*c.k)
		for i := range vals {
			switch i % 7 {
			case 0:
				vals[i] = float32(r.NormFloat64() * 1e-6)
			case 1:
				vals[i] = float32(r.NormFloat64() * 1e4)
			default:
				vals[i] = float32(r.NormFloat64())
			}
		}
		for i := 0; i < min(c.k, c.bs[1]); i++ { // the first block row's first block: zeros, some negative
			for rr := 0; rr < min(c.n, c.bs[0]); rr++ {
				vals[rr*c.k+i] = float32(math.Copysign(0, float64(rr%2*2-1)))
			}
		}
		wantC, wantS := quantizeRef(vals, c.n, c.k, c.bs)
		gotC, gotS := quantize(vals, c.n, c.k, c.bs)
		require.Equal(t, wantS, gotS, "%dx%d scales", c.n, c.k)
		require.Equal(t, wantC, gotC, "%dx%d codes", c.n, c.k)
	}
}
