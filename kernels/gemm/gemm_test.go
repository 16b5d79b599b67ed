package gemm

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

func randSlice(r *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(r.NormFloat64())
	}
	return s
}

func maxRelDiff(a, b []float32) float64 {
	m := 0.0
	for i := range a {
		d := math.Abs(float64(a[i]-b[i])) / (1 + math.Abs(float64(b[i])))
		m = math.Max(m, d)
	}
	return m
}

func TestMatMulTMatchesNaive(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	shapes := [][3]int{{1, 1, 1}, {1, 7, 5}, {3, 13, 9}, {4, 16, 4}, {5, 33, 17}, {9, 64, 130}, {70, 31, 23}, {130, 64, 256}}
	params := []Params{{}, {ColGrain: 1, RowBlock: 1}, {ColGrain: 5, RowBlock: 3}, {ColGrain: 64, RowBlock: 256}}
	for _, s := range shapes {
		T, K, N := s[0], s[1], s[2]
		x, w := randSlice(r, T*K), randSlice(r, N*K)
		want := make([]float32, T*N)
		MatMulTNaive(want, x, T, K, w, N)
		for _, p := range params {
			got := make([]float32, T*N)
			MatMulTWith(p, got, x, T, K, w, N)
			require.Less(t, maxRelDiff(got, want), 1e-5, "shape %v params %+v", s, p)
		}
	}
}

func TestMatMulAndAxpy(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	M, K, N := 5, 7, 3
	a, b := randSlice(r, M*K), randSlice(r, K*N)
	got := make([]float32, M*N)
	MatMul(got, a, M, K, b, N)
	for i := 0; i < M; i++ {
		for j := 0; j < N; j++ {
			var s float64
			for k := 0; k < K; k++ {
				s += float64(a[i*K+k]) * float64(b[k*N+j])
			}
			require.InDelta(t, s, got[i*N+j], 1e-4)
		}
	}
}

func BenchmarkMatMulT(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, s := range [][3]int{{1, 1024, 1024}, {8, 1024, 1024}, {512, 1024, 1024}} {
		T, K, N := s[0], s[1], s[2]
		x, w, d := randSlice(r, T*K), randSlice(r, N*K), make([]float32, T*N)
		b.Run(fmtShape(s), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				MatMulT(d, x, T, K, w, N)
			}
			b.ReportMetric(float64(2*T*K*N)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}

func fmtShape(s [3]int) string {
	return "T" + itoa(s[0]) + "_K" + itoa(s[1]) + "_N" + itoa(s[2])
}

func itoa(v int) string {
	if v == 0 {
		return "0"
	}
	var b []byte
	for v > 0 {
		b = append([]byte{byte('0' + v%10)}, b...)
		v /= 10
	}
	return string(b)
}
