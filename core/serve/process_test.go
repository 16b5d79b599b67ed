package serve

import (
	"context"
	"encoding/json"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/glmflash/glmflash/core/sample"
	"github.com/glmflash/glmflash/core/text"
	"github.com/glmflash/glmflash/model/randckpt"
	"github.com/glmflash/glmflash/model/tokenizer"
	pb "github.com/glmflash/glmflash/proto/glmflash/v1"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The logits-processing fields of SamplingParams reach the runtime's
// request as they were sent (absent: off), min_tokens beside them.
func TestGenerateRequestCarriesProcessing(t *testing.T) {
	lim := limits{vocab: 256, context: 4096, defaultMaxTokens: 16}
	r, err := generateRequest(context.Background(), &pb.GenerateRequest{PromptIds: prompt(3, 1), MaxTokens: ptr(uint32(9)), Sampling: &pb.SamplingParams{
		RepetitionPenalty: ptr(1.25), PresencePenalty: -0.5, FrequencyPenalty: 1.5, LogitBias: map[int32]float32{7: 2.5, 255: -100}, MinTokens: 9,
	}}, lim)
	require.NoError(t, err)
	require.Equal(t, sample.Processing{RepetitionPenalty: 1.25, PresencePenalty: -0.5, FrequencyPenalty: 1.5, LogitBias: map[int32]float64{7: 2.5, 255: -100}}, r.Processing)
	require.Equal(t, 9, r.MinTokens)

	for _, sp := range []*pb.SamplingParams{nil, {}} {
		r, err = generateRequest(context.Background(), &pb.GenerateRequest{PromptIds: prompt(3, 1), Sampling: sp}, lim)
		require.NoError(t, err)
		require.False(t, r.Processing.Active(), "absent: off")
		require.Zero(t, r.MinTokens)
	}
}

// Each field out of range is INVALID_ARGUMENT naming it.
func TestGenerateRefusesBadProcessing(t *testing.T) {
	h := start(t, setup{})
	many := map[int32]float32{}
	for i := range int32(sample.MaxLogitBias + 1) {
		many[i] = 1
	}
	for _, c := range []struct {
		sp   *pb.SamplingParams
		want string
	}{
		{&pb.SamplingParams{RepetitionPenalty: ptr(0.0)}, "sampling.repetition_penalty: must be in (0, 100]"},
		{&pb.SamplingParams{RepetitionPenalty: ptr(100.5)}, "sampling.repetition_penalty:"},
		{&pb.SamplingParams{RepetitionPenalty: ptr(math.NaN())}, "sampling.repetition_penalty:"},
		{&pb.SamplingParams{PresencePenalty: -2.5}, "sampling.presence_penalty: must be in [-2, 2]"},
		{&pb.SamplingParams{FrequencyPenalty: math.Inf(1)}, "sampling.frequency_penalty:"},
		{&pb.SamplingParams{LogitBias: map[int32]float32{256: 1}}, "sampling.logit_bias: token id 256 is outside the vocabulary [0, 256)"},
		{&pb.SamplingParams{LogitBias: map[int32]float32{-3: 1, 300: 1}}, "sampling.logit_bias: token id -3"},
		{&pb.SamplingParams{LogitBias: map[int32]float32{4: 1, 9: -100.5}}, "sampling.logit_bias[9]: must be in [-100, 100]"},
		{&pb.SamplingParams{LogitBias: map[int32]float32{4: float32(math.NaN())}}, "sampling.logit_bias[4]:"},
		{&pb.SamplingParams{LogitBias: many}, "sampling.logit_bias: at most 300 entries, got 301"},
		{&pb.SamplingParams{MinTokens: 5}, "sampling.min_tokens: must be at most max_tokens (4), got 5"},
	} {
		_, err := generate(context.Background(), h.client, &pb.GenerateRequest{PromptIds: prompt(3, 1), MaxTokens: ptr(uint32(4)), Sampling: c.sp})
		require.Error(t, err, c.want)
		st, _ := status.FromError(err)
		require.Equal(t, codes.InvalidArgument, st.Code(), "%v", err)
		require.True(t, strings.HasPrefix(st.Message(), c.want), "%q, want %q", st.Message(), c.want)
	}
	// Without max_tokens, min_tokens is held to the default.
	_, err := generate(context.Background(), h.client, &pb.GenerateRequest{PromptIds: prompt(3, 1), Sampling: &pb.SamplingParams{MinTokens: 17}})
	require.ErrorContains(t, err, "sampling.min_tokens: must be at most max_tokens (16)")
}

// Through the gRPC API: logit_bias forces a token, min_tokens holds the
// EOS off (and stop strings: they are matched after min_tokens only), the
// repetition penalty keeps greedy output from repeating.
func TestGenerateProcessing(t *testing.T) {
	const eos = 200
	h := start(t, setup{opts: func(o *Options) {
		withText(t)(o)
		load := o.Load
		o.Load = func(ctx context.Context) (*LoadedModel, error) {
			lm, err := load(ctx)
			if err != nil {
				return nil, err
			}
			c := lm.Config.Clone()
			c.EOSTokenIDs = []int{eos}
			lm.Config = c
			return lm, nil
		}
	}})
	ctx := context.Background()
	sampled := func(bias map[int32]float32, minTok uint32) *pb.SamplingParams {
		return &pb.SamplingParams{Temperature: ptr(1.0), Seed: ptr(uint64(5)), LogitBias: bias, MinTokens: minTok}
	}
	r, err := generate(ctx, h.client, &pb.GenerateRequest{PromptIds: prompt(5, 2), MaxTokens: ptr(uint32(6)), Sampling: sampled(map[int32]float32{'A': 100}, 0)})
	require.NoError(t, err)
	require.Equal(t, slices.Repeat([]int32{'A'}, 6), r.tokens)
	require.Equal(t, "AAAAAA", r.text)

	r, err = generate(ctx, h.client, &pb.GenerateRequest{PromptIds: prompt(5, 2), MaxTokens: ptr(uint32(10)), Sampling: sampled(map[int32]float32{eos: 100}, 0)})
	require.NoError(t, err)
	require.Equal(t, []int32{eos}, r.tokens)
	r, err = generate(ctx, h.client, &pb.GenerateRequest{PromptIds: prompt(5, 2), MaxTokens: ptr(uint32(10)), Sampling: sampled(map[int32]float32{eos: 100}, 4)})
	require.NoError(t, err)
	require.Len(t, r.tokens, 5)
	require.NotContains(t, r.tokens[:4], int32(eos))
	require.Equal(t, pb.FinishReason_FINISH_REASON_STOP, r.finish.Reason)
	require.Equal(t, uint32(5), r.finish.Usage.CompletionTokens)

	// A stop string every token completes: at once without min_tokens,
	// after the min_tokens-th token with it.
	stop := func(minTok uint32) *result {
		r, err := generate(ctx, h.client, &pb.GenerateRequest{PromptIds: prompt(5, 2), MaxTokens: ptr(uint32(10)), Stop: []string{"A"}, Sampling: sampled(map[int32]float32{'A': 100}, minTok)})
		require.NoError(t, err)
		return r
	}
	r = stop(0)
	require.Equal(t, "", r.text)
	require.Equal(t, "A", r.finish.Stop)
	r = stop(3)
	require.Equal(t, "AAA", r.text)
	require.Equal(t, "A", r.finish.Stop)
	require.Equal(t, pb.FinishReason_FINISH_REASON_STOP, r.finish.Reason)
	require.Equal(t, uint32(4), r.finish.Usage.CompletionTokens)

	greedy := &pb.SamplingParams{Temperature: ptr(0.0), RepetitionPenalty: ptr(100.0)}
	r, err = generate(ctx, h.client, &pb.GenerateRequest{PromptIds: prompt(5, 3), MaxTokens: ptr(uint32(30)), Sampling: greedy, IgnoreEos: true})
	require.NoError(t, err)
	all := append(slices.Clone(prompt(5, 3)), r.tokens...)
	slices.Sort(all)
	require.Len(t, slices.Compact(all), 35, "no token repeats, the prompt's included: %v", r.tokens)
}

// skip_special_tokens (default true) leaves special tokens' text out;
// false writes it.
func TestGenerateSkipSpecialTokens(t *testing.T) {
	const special = 250
	tj, _, err := randckpt.TokenizerFiles(256)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(tj, &m))
	vocab := m["model"].(map[string]any)["vocab"].(map[string]any)
	for k, v := range vocab {
		if v.(float64) == special {
			delete(vocab, k)
		}
	}
	vocab["<|sp|>"] = special // the byte's id becomes a special token's
	m["added_tokens"] = []any{map[string]any{"id": special, "content": "<|sp|>", "special": true, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false}}
	tj, err = json.Marshal(m)
	require.NoError(t, err)
	tk, err := tokenizer.Parse(tj)
	require.NoError(t, err)
	require.True(t, tk.IsSpecial(special))
	h := start(t, setup{opts: func(o *Options) {
		load := o.Load
		o.Load = func(ctx context.Context) (*LoadedModel, error) {
			lm, err := load(ctx)
			if err == nil {
				lm.Text = &text.Model{Tok: tk}
			}
			return lm, err
		}
	}})
	gen := func(skip *bool) *result {
		r, err := generate(context.Background(), h.client, &pb.GenerateRequest{
			PromptIds: prompt(4, 1), MaxTokens: ptr(uint32(4)), SkipSpecialTokens: skip,
			Sampling: &pb.SamplingParams{Temperature: ptr(0.0), LogitBias: map[int32]float32{special: 100}},
		})
		require.NoError(t, err)
		require.Equal(t, []int32{special, special, special, special}, r.tokens)
		return r
	}
	require.Equal(t, "", gen(nil).text, "absent: skipped")
	require.Equal(t, "", gen(ptr(true)).text)
	require.Equal(t, "<|sp|><|sp|><|sp|><|sp|>", gen(ptr(false)).text)
}
