package openai_test

import (
	"context"
	"testing"
	"time"

	"github.com/glmflash/glmflash/core/config"
	"github.com/openai/openai-go/v3"
	"github.com/stretchr/testify/require"
)

func withSlots(n int) func(*config.Config) {
	return func(c *config.Config) { c.Runtime.Slots = n }
}

// n on chat, whole responses: greedy n = 4 gives four choices (index 0…3)
// each equal to the n = 1 response; usage counts the prompt once and the
// completions summed.
func TestChoicesGreedy(t *testing.T) {
	s := start(t, withSlots(4), nil)
	ctx := context.Background()
	one, err := s.cli.Chat.Completions.New(ctx, chatParams("Hello there", 12))
	require.NoError(t, err)
	p := chatParams("Hello there", 12)
	p.N, p.Logprobs = openai.Int(4), openai.Bool(true)
	res, err := s.cli.Chat.Completions.New(ctx, p)
	require.NoError(t, err)
	require.Len(t, res.Choices, 4)
	for i, c := range res.Choices {
		require.Equal(t, int64(i), c.Index)
		require.Len(t, c.Logprobs.Content, int(one.Usage.CompletionTokens), "choice %d: its own logprobs", i)
		require.Equal(t, one.Choices[0].Message.Content, c.Message.Content, "choice %d", i)
		require.Equal(t, one.Choices[0].FinishReason, c.FinishReason)
	}
	require.Equal(t, one.Usage.PromptTokens, res.Usage.PromptTokens, "the prompt once")
	require.Equal(t, 4*one.Usage.CompletionTokens, res.Usage.CompletionTokens, "the completions summed")
	require.Equal(t, res.Usage.PromptTokens+res.Usage.CompletionTokens, res.Usage.TotalTokens)
}

// n on completions, sampled: choice i is the n = 1 completion with seed +
// i (whole and streamed); streamed chunks carry their choice's index, each
// choice ends with its finish_reason, and usage comes once at the end.
func TestChoicesSampledFollowSeeds(t *testing.T) {
	s := start(t, withSlots(3), nil)
	ctx := context.Background()
	params := func(seed, n int64) openai.CompletionNewParams {
		return openai.CompletionNewParams{
			Model: "tiny", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon a time")},
			MaxTokens: openai.Int(10), Temperature: openai.Float(1), Seed: openai.Int(seed), N: openai.Int(n),
		}
	}
	var want []string
	for i := range int64(3) {
		r, err := s.cli.Completions.New(ctx, params(50+i, 1))
		require.NoError(t, err)
		want = append(want, r.Choices[0].Text)
	}
	require.False(t, want[0] == want[1] && want[1] == want[2], "different seeds, different texts")
	res, err := s.cli.Completions.New(ctx, params(50, 3))
	require.NoError(t, err)
	require.Len(t, res.Choices, 3)
	for i, c := range res.Choices {
		require.Equal(t, int64(i), c.Index)
		require.Equal(t, want[i], c.Text, "choice %d follows seed %d", i, 50+i)
	}

	sp := params(50, 3)
	sp.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	st := s.cli.Completions.NewStreaming(ctx, sp)
	got := make([]string, 3)
	finished := make([]string, 3)
	var usage openai.CompletionUsage
	for st.Next() {
		ch := st.Current()
		if len(ch.Choices) == 0 {
			usage = ch.Usage
			continue
		}
		require.Len(t, ch.Choices, 1, "one choice per chunk")
		c := ch.Choices[0]
		require.Less(t, c.Index, int64(3))
		require.Empty(t, finished[c.Index], "choice %d: a chunk after its finish", c.Index)
		got[c.Index] += c.Text
		if c.FinishReason != "" {
			finished[c.Index] = string(c.FinishReason)
		}
	}
	require.NoError(t, st.Err())
	require.Equal(t, want, got)
	require.Equal(t, []string{"length", "length", "length"}, finished)
	require.Equal(t, res.Usage.PromptTokens, usage.PromptTokens)
	require.Equal(t, int64(30), usage.CompletionTokens)
}

// Streamed chat with n: every choice gets its role chunk, its content and
// its finish, by index, equal to the whole response's choices.
func TestChoicesStreamingChat(t *testing.T) {
	s := start(t, withSlots(2), nil)
	ctx := context.Background()
	p := chatParams("Stream two", 9)
	p.N, p.Temperature, p.Seed = openai.Int(2), openai.Float(0.8), openai.Int(9)
	whole, err := s.cli.Chat.Completions.New(ctx, p)
	require.NoError(t, err)
	st := s.cli.Chat.Completions.NewStreaming(ctx, p)
	role := make([]bool, 2)
	content := make([]string, 2)
	finish := make([]string, 2)
	for st.Next() {
		for _, c := range st.Current().Choices {
			if c.Delta.Role != "" {
				require.Empty(t, content[c.Index], "the role comes first")
				role[c.Index] = true
			}
			content[c.Index] += c.Delta.Content
			if c.FinishReason != "" {
				finish[c.Index] = c.FinishReason
			}
		}
	}
	require.NoError(t, st.Err())
	require.Equal(t, []bool{true, true}, role)
	for i, c := range whole.Choices {
		require.Equal(t, c.Message.Content, content[i], "choice %d", i)
		require.Equal(t, c.FinishReason, finish[i])
	}
}

// A client that leaves a streamed n = 2 request frees both slots (and the
// runtime forgets the request).
func TestChoicesCancelFreesTheSlots(t *testing.T) {
	s := start(t, withSlots(2), nil)
	ctx, cancel := context.WithCancel(context.Background())
	p := chatParams("long", 3000)
	p.N = openai.Int(2)
	st := s.cli.Chat.Completions.NewStreaming(ctx, p)
	for range 4 {
		require.True(t, st.Next())
	}
	rt := s.srv.Runtime()
	require.Equal(t, 2, s.srv.Engine().Store().InUse())
	cancel()
	st.Close()
	require.Eventually(t, func() bool { w, r := rt.InFlight(); return w+r == 0 }, 30*time.Second, time.Millisecond)
	require.Eventually(t, func() bool { return s.srv.Engine().Store().InUse() == 0 }, 30*time.Second, time.Millisecond)
	require.Empty(t, rt.Matching(func(string, string) bool { return true }))
}
