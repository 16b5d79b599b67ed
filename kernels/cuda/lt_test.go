package cuda_test

import (
	"math/rand/v2"
	"testing"

	kc "github.com/glmflash/glmflash/kernels/cuda"
	"github.com/glmflash/glmflash/kernels/gemm"
	"github.com/stretchr/testify/require"
)

// cuBLASLt: the heuristic offers more than one algorithm for a GEMM, every
// one it offers passes AlgoCheck and computes the product (fp32 and bf16
// inputs, a leading dimension wider than K), an algorithm survives its
// hex form, and a cuBLASLt matmul counts as one launch.
func TestLtAlgorithmsComputeTheProduct(t *testing.T) {
	d := openDevice(t)
	r := rand.New(rand.NewPCG(41, 42))
	for _, bf := range []bool{false, true} {
		M, N, K, lda := 13, 45, 29, 33
		x := randn(r, M*lda, 1)
		w := randn(r, N*K, 0.3)
		xs := make([]float32, M*K) // the K columns A's rows hold
		for i := 0; i < M; i++ {
			copy(xs[i*K:(i+1)*K], x[i*lda:i*lda+K])
		}
		var X, W buf
		if bf {
			xb, xr := toBF16(x)
			wb, wr := toBF16(w)
			for i := 0; i < M; i++ {
				copy(xs[i*K:(i+1)*K], xr[i*lda:i*lda+K])
			}
			w = wr
			X, W = upload(t, d, xb), upload(t, d, wb)
		} else {
			X, W = upload(t, d, x), upload(t, d, w)
		}
		want := make([]float32, M*N)
		gemm.MatMulT(want, xs, M, K, w, N)
		spec := kc.LtSpec{M: M, N: N, K: K, Lda: lda, Ldw: K, Ldc: N, BF16: bf}
		var algos []kc.LtAlgo
		require.NoError(t, d.Do(func() error {
			var err error
			algos, err = d.LtAlgos(spec, 8)
			return err
		}))
		if d.Emulated {
			require.GreaterOrEqual(t, len(algos), 2, "the emulated heuristic offers a choice (bf16 %v)", bf)
		}
		require.NotEmpty(t, algos, "bf16 %v", bf)
		t.Logf("bf16 %v: the heuristic offers %d algorithms", bf, len(algos))
		for _, a := range algos {
			C := poisoned[float32](t, d, M*N)
			var name string
			l0 := d.Launches()
			require.NoError(t, d.Do(func() error {
				if err := d.LtCheck(spec, a); err != nil {
					return err
				}
				name = d.LtName(a)
				return d.LtMatmul(spec, a, X.p, W.p, C.p)
			}))
			require.EqualValues(t, 1, d.Launches()-l0)
			require.Less(t, maxRelErr(t, download[float32](t, C), want), 1e-5, "%s (bf16 %v)", name, bf)
			back, err := kc.ParseLtAlgo(a.String())
			require.NoError(t, err)
			require.Equal(t, a.Data, back.Data)
			t.Logf("bf16 %v: %s ok", bf, name)
		}
	}
	_, err := kc.ParseLtAlgo("00ff")
	require.ErrorContains(t, err, "64 bytes")
}
