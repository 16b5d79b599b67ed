package gpu

import (
	"context"
	"math"
	"slices"
	"sync"
	"testing"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	pb "github.com/glmflash/glmflash/proto/glmflash/v1"
	"github.com/stretchr/testify/require"
)

// processedArgmax is the greedy pick of a raw logits row processed by
// hand, in float64, as SamplingParams defines it (repetition penalty over
// prompt and output, frequency and presence over the output, logit bias,
// min_tokens' ban of the stop ids).
func processedArgmax(raw []float32, sp *pb.SamplingParams, stops, prompt, out []int32) int32 {
	counts := map[int32]int{}
	for _, t := range out {
		counts[t]++
	}
	best, bestV := int32(-1), math.Inf(-1)
	for i, l := range raw {
		t, v := int32(i), float64(l)
		if r := sp.GetRepetitionPenalty(); sp.RepetitionPenalty != nil && (slices.Contains(prompt, t) || counts[t] > 0) {
			if v > 0 {
				v /= r
			} else {
				v *= r
			}
		}
		v -= sp.GetFrequencyPenalty() * float64(counts[t])
		if counts[t] > 0 {
			v -= sp.GetPresencePenalty()
		}
		v += float64(sp.GetLogitBias()[t])
		if uint32(len(out)) < sp.GetMinTokens() && slices.Contains(stops, t) {
			continue
		}
		if v > bestV {
			best, bestV = t, v
		}
	}
	return best
}

// On the CUDA backend the logits processors of SamplingParams apply on
// the device inside the batched decode step: concurrent greedy streams
// with penalties, biases and min_tokens get the tokens of the GPU engine's
// own raw logits processed by hand, one sequence at a time.
func TestCUDAServeProcessing(t *testing.T) {
	srv, c := serveCUDA(t)
	eng := srv.Engine()
	type job struct {
		prompt []int32
		sp     *pb.SamplingParams
		stops  []int32
	}
	jobs := []job{
		{seqTokens(7, 1, 256), &pb.SamplingParams{Temperature: ptr(0.0), RepetitionPenalty: ptr(1.8)}, nil},
		{seqTokens(12, 2, 256), &pb.SamplingParams{Temperature: ptr(0.0), PresencePenalty: 1.5, FrequencyPenalty: 0.7, LogitBias: map[int32]float32{3: 2, 90: -5}}, nil},
		{seqTokens(5, 3, 256), &pb.SamplingParams{Temperature: ptr(0.0), LogitBias: map[int32]float32{42: 100}}, nil},
		{seqTokens(9, 4, 256), &pb.SamplingParams{Temperature: ptr(0.0), MinTokens: 6, LogitBias: map[int32]float32{17: 100}}, []int32{17}},
		{seqTokens(9, 5, 256), &pb.SamplingParams{Temperature: ptr(0.0)}, nil}, // unprocessed, beside them
	}
	const n = 12
	want := make([][]int32, len(jobs))
	for i, j := range jobs {
		s, err := eng.Store().Alloc()
		require.NoError(t, err)
		toks := j.prompt
		for len(want[i]) < n {
			mode := graph.Decode
			if len(want[i]) == 0 {
				mode = graph.Prefill
			}
			r, err := eng.Run(engine.Key{Mode: mode, Logits: graph.LastLogits}, &backend.Batch{Seqs: []backend.Seq{{Slot: s, Tokens: toks}}})
			require.NoError(t, err)
			tok := processedArgmax(r.Logits, j.sp, j.stops, j.prompt, want[i])
			want[i] = append(want[i], tok)
			if slices.Contains(j.stops, tok) {
				break
			}
			toks = []int32{tok}
		}
		require.NoError(t, eng.Store().Free(s))
	}
	require.Len(t, want[3], 7, "the stop id comes right after min_tokens")
	got := make([][]int32, len(jobs))
	var wg sync.WaitGroup
	for i, j := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			toks, _, err := stream(context.Background(), c, &pb.GenerateRequest{PromptIds: j.prompt, MaxTokens: ptr(uint32(n)), IgnoreEos: true, StopIds: j.stops, Sampling: j.sp})
			if err != nil {
				t.Error(err)
			}
			got[i] = toks
		}()
	}
	wg.Wait()
	require.Equal(t, want, got)
}
