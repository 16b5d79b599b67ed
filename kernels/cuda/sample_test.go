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
	var wants []sampleWant
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
		wants = append(wants, sampleWant{tok, lp, top})
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
	// the row in one block, and split into chunks by glmf_sample_part (one
	// chunk; chunks of 2048 as the backend launches them would be one here,
	// so smaller ones, with ties and bad values across their boundaries)
	for _, tc := range []struct {
		name           string
		threads, chunk int64
	}{{"one-block", 0, 0}, {"chunks-of-1000", 128, 1000}, {"chunks-of-128", 16, 128}, {"chunks-of-96", 32, 96}} {
		t.Run(tc.name, func(t *testing.T) {
			O := poisoned[kc.SampleOut](t, d, rows)
			M := poisoned[uint64](t, d, rows*V)
			a := kc.SampleArgs{Logits: L.p, Vocab: int64(V), Rows: int64(rows), Specs: S.p, Out: O.p, Mass: M.p}
			if tc.chunk > 0 {
				nc := (int64(V) + tc.chunk - 1) / tc.chunk
				P := poisoned[kc.SamplePart](t, d, rows*int(nc))
				pa := kc.SamplePartArgs{Logits: L.p, Vocab: int64(V), Rows: int64(rows), Chunk: tc.chunk, Nchunks: nc, Specs: S.p, Parts: P.p}
				launch(t, d, kc.KernelSamplePart, kc.Dim3{X: uint32(nc), Y: uint32(rows)}, kc.Dim3{X: uint32(tc.threads)}, 0, &pa)
				a.Parts, a.Nchunks = P.p, nc
			}
			launch(t, d, kc.KernelSample, kc.Dim3{X: uint32(rows)}, kc.Dim3{X: 256}, 0, &a)
			checkSamples(t, download[kc.SampleOut](t, O), wants, specs)
		})
	}
}

type sampleWant struct {
	tok int32
	lp  float32
	top []sample.TokenLogprob
}

func checkSamples(t *testing.T, outs []kc.SampleOut, wants []sampleWant, specs []kc.SampleSpec) {
	rows := len(outs)
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
