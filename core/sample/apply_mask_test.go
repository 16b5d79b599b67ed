package sample

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// Apply's mask (walked by its clear bits) bans exactly the finite logits
// whose bit is clear, bit by bit as AllowWords lays them out, with a
// partial last word whose spare bits are ignored; full and empty words
// and non-finite raw values included.
func TestApplyMaskMatchesBitByBit(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, V := range []int{1, 31, 32, 33, 1000} {
		for k := 0; k < 20; k++ {
			row := make([]float32, V)
			for i := range row {
				row[i] = float32(r.NormFloat64())
			}
			row[r.IntN(V)] = float32(math.NaN())
			row[r.IntN(V)] = float32(math.Inf(-1))
			allow := make([]uint32, AllowWords(V))
			for w := range allow {
				switch k % 4 {
				case 0:
					allow[w] = r.Uint32()
				case 1:
					allow[w] = ^uint32(0)
				case 2:
					allow[w] = 0
				default:
					allow[w] = 1 << uint(r.IntN(32))
				}
			}
			want := append([]float32(nil), row...)
			for i := range want {
				if allow[i/32]&(1<<uint(i%32)) == 0 && isFinite(want[i]) {
					want[i] = Banned
				}
			}
			Apply(row, nil, allow)
			for i := range want {
				require.Equal(t, math.Float32bits(want[i]), math.Float32bits(row[i]), "V %d case %d token %d", V, k, i)
			}
		}
	}
}

// expNeg is math.Exp bit for bit, around the underflow and beyond it.
func TestExpNegIsExp(t *testing.T) {
	for _, x := range []float64{0, -1, -700, -744.4, -745, -745.1, -745.2, -745.9, -746, -746.1, -1e4, -math.MaxFloat32, math.Inf(-1), 3, math.NaN()} {
		want, got := math.Exp(x), expNeg(x)
		require.Equal(t, math.Float64bits(want), math.Float64bits(got), "exp(%v)", x)
	}
	for x := -745.5; x >= -746.5; x -= 1e-3 {
		require.Equal(t, math.Exp(x), expNeg(x), "exp(%v)", x)
	}
}
