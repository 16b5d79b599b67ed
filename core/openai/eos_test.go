package openai_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/model/randckpt"
	"github.com/glmflash/glmflash/model/tokenizer"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/require"
)

// eosCopy copies the fixture into a temporary directory with a
// generation_config.json whose eos_token_id is id.
func eosCopy(t *testing.T, id int) string {
	t.Helper()
	dir := t.TempDir()
	for _, f := range []string{"config.json", "model.safetensors"} {
		b, err := os.ReadFile(filepath.Join(fixture, f))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, f), b, 0o644))
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "generation_config.json"), []byte(`{"eos_token_id": `+strconv.Itoa(id)+`}`), 0o644))
	return dir
}

// The model's EOS ends a chat with finish_reason "stop", streamed or not,
// and its text is never emitted; vLLM's ignore_eos goes on to max_tokens.
func TestEOSIsStop(t *testing.T) {
	ctx := context.Background()
	p := chatParams("Hello there", 16)
	p.Logprobs = openai.Bool(true)
	res, err := start(t, nil, nil).cli.Chat.Completions.New(ctx, p)
	require.NoError(t, err)
	// The bytes-only tokenizer: a token's id is its byte.
	var ids []int
	for _, c := range res.Choices[0].Logprobs.Content {
		require.Len(t, c.Bytes, 1)
		ids = append(ids, int(c.Bytes[0]))
	}
	require.Len(t, ids, 16)
	k := 2
	for k < len(ids) && indexOfInt(ids, ids[k]) != k {
		k++ // an id whose first occurrence is at k
	}
	require.Less(t, k, len(ids), "greedy output repeats its first tokens only")
	full := res.Choices[0].Message.Content

	s := start(t, func(c *config.Config) { c.Model.Dir = eosCopy(t, ids[k]) }, nil)
	res, err = s.cli.Chat.Completions.New(ctx, chatParams("Hello there", 16))
	require.NoError(t, err)
	require.Equal(t, "stop", res.Choices[0].FinishReason)
	require.Equal(t, int64(k+1), res.Usage.CompletionTokens, "the EOS is counted")
	tj, _, err := randckpt.TokenizerFiles(256)
	require.NoError(t, err)
	tk, err := tokenizer.Parse(tj)
	require.NoError(t, err)
	before := make([]int32, k)
	for i := range before {
		before[i] = int32(ids[i])
	}
	require.Equal(t, tk.Decode(before, true), res.Choices[0].Message.Content, "the EOS's text is not emitted")

	st := s.cli.Chat.Completions.NewStreaming(ctx, chatParams("Hello there", 16))
	var sb strings.Builder
	reason := ""
	for st.Next() {
		if c := st.Current(); len(c.Choices) > 0 {
			sb.WriteString(c.Choices[0].Delta.Content)
			if c.Choices[0].FinishReason != "" {
				reason = c.Choices[0].FinishReason
			}
		}
	}
	require.NoError(t, st.Err())
	require.Equal(t, "stop", reason)
	require.Equal(t, res.Choices[0].Message.Content, sb.String())

	res, err = s.cli.Chat.Completions.New(ctx, chatParams("Hello there", 16), option.WithJSONSet("ignore_eos", true))
	require.NoError(t, err)
	require.Equal(t, "length", res.Choices[0].FinishReason)
	require.Equal(t, int64(16), res.Usage.CompletionTokens)
	require.Equal(t, full, res.Choices[0].Message.Content)
}

func indexOfInt(s []int, v int) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}
