package cuda_test

import (
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/glmflash/glmflash/core/sample"
	kc "github.com/glmflash/glmflash/kernels/cuda"
	"github.com/stretchr/testify/require"
)

// The device sampler picks what core/sample.Pick picks for the same draw,
// and reports the same log-probabilities and alternatives.
func TestSampleMatchesCPU(t *testing.T) {
	d := openDevice(t)
	r := rand.New(rand.NewPCG(21, 22))
	V := 1000
	params := []sample.Params{
		sample.Greedy(),
		{Temperature: 1, TopP: 1},
		{Temperature: 0.7, TopP: 0.9},
		{Temperature: 1.3, TopK: 40, TopP: 1},
		{Temperature: 0.5, TopK: 100, TopP: 0.8, MinP: 0.05},
		{Temperature: 2, TopP: 1, MinP: 0.2},
	}
	var logits []float32
	var specs []kc.SampleSpec
	type want struct {
		tok int32
		lp  float32
		top []sample.TokenLogprob
	}
	var wants []want
	for i := 0; i < 120; i++ {
		row := randn(r, V, 2)
		if i%10 == 3 { // ties: repeated values must order by index
			for j := 0; j < V; j += 3 {
				row[j] = row[0]
			}
		}
		p := params[i%len(params)]
		u := r.Float64()
		ntop := i % 6
		tok := int32(sample.Pick(row, p, u))
		lp, top := sample.Logprobs(row, tok, ntop)
		wants = append(wants, want{tok, lp, top})
		logits = append(logits, row...)
		specs = append(specs, kc.SampleSpec{Temperature: p.Temperature, TopP: p.TopP, MinP: p.MinP, U: u, TopK: int64(p.TopK), NTop: int64(ntop)})
	}
	// a row with a NaN is reported, not sampled
	bad := randn(r, V, 1)
	bad[17], bad[500] = float32(math.NaN()), float32(math.Inf(1))
	logits = append(logits, bad...)
	specs = append(specs, kc.SampleSpec{Temperature: 1, TopP: 1})
	rows := len(specs)
	L, S := upload(t, d, logits), upload(t, d, specs)
	O := poisoned[kc.SampleOut](t, d, rows)
	M := poisoned[uint64](t, d, rows*V)
	a := kc.SampleArgs{Logits: L.p, Vocab: int64(V), Rows: int64(rows), Specs: S.p, Out: O.p, Mass: M.p}
	launch(t, d, "glmf_sample", kc.Dim3{X: uint32(rows)}, kc.Dim3{X: 256}, 0, &a)
	outs := download[kc.SampleOut](t, O)
	for i, w := range wants {
		o := outs[i]
		require.Zero(t, o.Nonfinite, "row %d", i)
		require.Equal(t, w.tok, int32(o.Token), "row %d (%+v)", i, specs[i])
		require.InDelta(t, w.lp, float32(o.TokLogit-o.Lse), 1e-5, "row %d", i)
		require.EqualValues(t, len(w.top), o.NTop, "row %d", i)
		for j, tl := range w.top {
			require.Equal(t, tl.ID, int32(o.TopId[j]), "row %d alt %d", i, j)
			require.InDelta(t, tl.Logprob, float32(o.TopLogit[j]-o.Lse), 1e-5)
		}
	}
	last := outs[rows-1]
	require.EqualValues(t, 2, last.Nonfinite)
	require.EqualValues(t, 17, last.FirstBad)
	require.True(t, math.IsNaN(last.BadValue))
	_ = unsafe.Sizeof(last)
}
