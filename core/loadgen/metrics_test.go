package loadgen

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// NumPy's linear percentiles: np.percentile([1,2,3,4], [50,90,99]) is
// [2.5, 3.7, 3.97]; one value is every percentile.
func TestPercentileIsNumPysLinear(t *testing.T) {
	xs := []float64{1, 2, 3, 4}
	require.InDelta(t, 2.5, Percentile(xs, 50), 1e-12)
	require.InDelta(t, 3.7, Percentile(xs, 90), 1e-12)
	require.InDelta(t, 3.97, Percentile(xs, 99), 1e-12)
	require.Equal(t, 1.0, Percentile(xs, 0))
	require.Equal(t, 4.0, Percentile(xs, 100))
	require.Equal(t, 7.0, Percentile([]float64{7}, 99))
	require.True(t, math.IsNaN(Percentile(nil, 50)))
	d := Summarize([]time.Duration{4 * ms_, 1 * ms_, 3 * ms_, 2 * ms_})
	require.Equal(t, Dist{N: 4, Mean: 2.5, Std: r9(math.Sqrt(1.25)), Min: 1, P50: 2.5, P90: 3.7, P99: 3.97, Max: 4}, roundDist(d))
}

func roundDist(d Dist) Dist {
	r := func(x float64) float64 { return math.Round(x*1e9) / 1e9 }
	return Dist{N: d.N, Mean: r(d.Mean), Std: r(d.Std), Min: r(d.Min), P50: r(d.P50), P90: r(d.P90), P99: r(d.P99), Max: r(d.Max)}
}

// The figures of a run, worked by hand: three completed requests, one
// failed, one cancelled, over 2 s.
func TestComputeByHand(t *testing.T) {
	recs := []Record{
		// TTFT 100, output events at 100, 120, 150, 200 → ITLs 20, 30, 50;
		// E2E 210, 5 tokens (the last event held two) → TPOT (210−100)/4 = 27.5
		{Index: 0, Scheduled: 0, Sent: 0, TTFT: 100 * ms_, E2E: 210 * ms_, Chunks: []time.Duration{100 * ms_, 120 * ms_, 150 * ms_, 200 * ms_},
			PromptTokens: 10, OutputTokens: 5, UsageReported: true, RequestedLen: 5, FinishReason: "length"},
		// TTFT 300, one token: no TPOT, no ITL; waited 50 ms for a slot
		{Index: 1, Scheduled: 100 * ms_, Sent: 150 * ms_, TTFT: 300 * ms_, E2E: 300 * ms_, Chunks: []time.Duration{300 * ms_},
			PromptTokens: 20, OutputTokens: 1, UsageReported: true, RequestedLen: 1, FinishReason: "length"},
		// TTFT 50, events at 50, 90 → ITL 40; 3 tokens without usage? no:
		// usage says 3 though only 2 events came; E2E 130 → TPOT 40
		{Index: 2, Scheduled: 200 * ms_, Sent: 200 * ms_, TTFT: 50 * ms_, E2E: 130 * ms_, Chunks: []time.Duration{50 * ms_, 90 * ms_},
			PromptTokens: 30, OutputTokens: 3, UsageReported: true, RequestedLen: 4, FinishReason: "stop"},
		{Index: 3, ErrKind: "http_500", ErrMsg: "boom", PromptTokens: 40, RequestedLen: 4},
		{Index: 4, Cancelled: true, RequestedLen: 4},
	}
	m := Compute(recs, 2*time.Second, SLO{TTFT: 150 * ms_, TPOT: 30 * ms_}, true)
	require.Equal(t, 3, m.Completed)
	require.Equal(t, 1, m.Failed)
	require.Equal(t, 1, m.Cancelled)
	require.Equal(t, 60, m.InputTokens)
	require.Equal(t, 9, m.OutputTokens)
	require.Equal(t, 7, m.OutputChunks)
	require.InDelta(t, 9.0/7, m.TokensPerChunk, 1e-12)
	require.InDelta(t, 1.5, m.RequestThroughput, 1e-12)
	require.InDelta(t, 30, m.InputThroughput, 1e-12)
	require.InDelta(t, 4.5, m.OutputThroughput, 1e-12)
	require.InDelta(t, 34.5, m.TotalThroughput, 1e-12)
	require.InDelta(t, (0.210+0.300+0.130)/2, m.Concurrency, 1e-12)
	require.Equal(t, 1, m.LengthMismatch, "request 2 asked for 4 and got 3")
	require.Equal(t, map[string]int{"length": 2, "stop": 1}, m.FinishReasons)

	require.Equal(t, Dist{N: 3, Mean: 150, Std: r9(math.Sqrt((50*50 + 150*150 + 100*100) / 3.0)), Min: 50, P50: 100, P90: 260, P99: 296, Max: 300}, roundDist(m.TTFT))
	// TPOTs 27.5 and 40
	require.Equal(t, Dist{N: 2, Mean: 33.75, Std: 6.25, Min: 27.5, P50: 33.75, P90: 38.75, P99: 39.875, Max: 40}, roundDist(m.TPOT))
	// ITLs 20, 30, 50, 40 → sorted 20 30 40 50
	require.Equal(t, Dist{N: 4, Mean: 35, Std: r9(math.Sqrt(125)), Min: 20, P50: 35, P90: 47, P99: 49.7, Max: 50}, roundDist(m.ITL))
	require.Equal(t, 3, m.E2E.N)
	require.InDelta(t, 210, m.E2E.P50, 1e-9)
	// client waits 0, 50, 0
	require.InDelta(t, 50.0/3, m.ClientWait.Mean, 1e-9)

	// goodput: request 0 TTFT 100 ≤ 150 and TPOT 27.5 ≤ 30: good; request 1
	// TTFT 300 > 150; request 2 TPOT 40 > 30; the failed one is not good
	require.NotNil(t, m.Goodput)
	require.Equal(t, 1, m.Goodput.Good)
	require.InDelta(t, 0.25, m.Goodput.Fraction, 1e-12)
	require.InDelta(t, 0.5, m.Goodput.Rate, 1e-12)
	// a one-token request meets any TPOT bound (it has none)
	m = Compute(recs, 2*time.Second, SLO{TPOT: 30 * ms_}, false)
	require.Equal(t, 2, m.Goodput.Good, "requests 0 and 1")
	require.Equal(t, 0, m.LengthMismatch, "without ignore_eos lengths are not forced")
	m = Compute(recs, 2*time.Second, SLO{E2E: 200 * ms_}, false)
	require.Equal(t, 1, m.Goodput.Good, "request 2 (130 ms)")
	require.Nil(t, Compute(recs, time.Second, SLO{}, false).Goodput)
}

func r9(x float64) float64 { return math.Round(x*1e9) / 1e9 }

func TestParseSLO(t *testing.T) {
	s, err := ParseSLO("ttft_ms=500, tpot_ms=12.5,e2e_ms=10000")
	require.NoError(t, err)
	require.Equal(t, SLO{TTFT: 500 * ms_, TPOT: 12500 * time.Microsecond, E2E: 10 * time.Second}, s)
	for in, want := range map[string]string{
		"":                       "--slo: empty",
		"ttft=5":                 `--slo: unknown key "ttft"`,
		"ttft_ms":                `--slo: "ttft_ms": want KEY=MS`,
		"ttft_ms=0":              "--slo: ttft_ms: want milliseconds > 0",
		"tpot_ms=-1":             "--slo: tpot_ms: want milliseconds > 0",
		"e2e_ms=NaN":             "--slo: e2e_ms: want milliseconds > 0",
		"e2e_ms=inf":             "--slo: e2e_ms: want milliseconds > 0",
		"ttft_ms=1,ttft_ms=2":    "--slo: ttft_ms given twice",
		"ttft_ms=1,tpot_ms=abc":  `--slo: tpot_ms: want milliseconds > 0 (at most 1e9), got "abc"`,
		"ttft_ms=1,,tpot_ms=abc": `--slo: "": want KEY=MS`,
	} {
		_, err := ParseSLO(in)
		require.ErrorContains(t, err, want, in)
	}
}

// The random workload: lengths in SGLang's range, ids in the vocabulary,
// the same seed the same prompts; arrivals at the given mean rate.
func TestRandomWorkloadAndArrivals(t *testing.T) {
	r := Random{InputLen: 100, OutputLen: 10, RangeRatio: 0.5, Vocab: 50}
	a, err := r.Generate(400, 7)
	require.NoError(t, err)
	b, _ := r.Generate(400, 7)
	require.Equal(t, a, b)
	c, _ := r.Generate(400, 8)
	require.NotEqual(t, a, c)
	seenIn := map[int]bool{}
	for _, q := range a {
		require.GreaterOrEqual(t, len(q.PromptIDs), 50)
		require.LessOrEqual(t, len(q.PromptIDs), 100)
		require.Equal(t, len(q.PromptIDs), q.PromptLen)
		require.GreaterOrEqual(t, q.OutputLen, 5)
		require.LessOrEqual(t, q.OutputLen, 10)
		seenIn[q.PromptLen] = true
		for _, id := range q.PromptIDs {
			require.True(t, id >= 0 && id < 50)
		}
	}
	require.True(t, seenIn[50] && seenIn[100], "both ends of the range are drawn")
	fixed, _ := Random{InputLen: 8, OutputLen: 3, RangeRatio: 1, Vocab: 5}.Generate(5, 1)
	for _, q := range fixed {
		require.Len(t, q.PromptIDs, 8)
		require.Equal(t, 3, q.OutputLen)
	}
	_, err = Random{InputLen: 8, OutputLen: 3, RangeRatio: 0, Vocab: 5}.Generate(1, 1)
	require.ErrorContains(t, err, "--range-ratio: must be in (0, 1], got 0")
	_, err = Random{InputLen: 0, OutputLen: 3, RangeRatio: 1, Vocab: 5}.Generate(1, 1)
	require.ErrorContains(t, err, "--input-len: must be ≥ 1")

	require.Equal(t, make([]time.Duration, 3), Arrivals(3, math.Inf(1), 1))
	arr := Arrivals(20000, 50, 3)
	require.Equal(t, arr, Arrivals(20000, 50, 3))
	require.Zero(t, arr[0])
	mean := arr[len(arr)-1].Seconds() / float64(len(arr)-1)
	require.InDelta(t, 1.0/50, mean, 0.001, "exponential gaps of mean 1/rate")
}
