package randckpt

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/glmflash/glmflash/model/chat"
	"github.com/glmflash/glmflash/model/tokenizer"
	"github.com/stretchr/testify/require"
)

// Every preset gets a valid byte-level BPE tokenizer with exactly its
// vocabulary, which round-trips text; presets with room get the GLM-style
// special tokens and a chat template.
func TestPresetTokenizers(t *testing.T) {
	seen := map[int]bool{}
	for _, name := range PresetNames() {
		cfg, err := Preset(name)
		require.NoError(t, err)
		if seen[cfg.VocabSize] { // an -mtp preset has its base's vocabulary
			continue
		}
		seen[cfg.VocabSize] = true
		dir := t.TempDir()
		require.NoError(t, WriteTokenizer(dir, cfg.VocabSize))
		tk, err := tokenizer.Load(dir)
		require.NoError(t, err, name)
		require.Equal(t, cfg.VocabSize, tk.VocabSize(), name)
		text := "Hello, world! 你好 😀 func main() { return 42 }\n"
		ids := tk.Encode(text, tokenizer.Options{})
		require.Equal(t, text, tk.Decode(ids, false), name)
		for _, id := range ids {
			require.Less(t, int(id), cfg.VocabSize)
		}
		tm, err := chat.Load(dir)
		if cfg.VocabSize < 256+len(presetAdded) {
			require.ErrorIs(t, err, chat.ErrNoTemplate, name)
			require.Equal(t, len(text), len(ids), "%s: bytes only", name)
			continue
		}
		require.NoError(t, err, name)
		require.Less(t, len(ids), len(text), "%s: merges apply", name)
		p, err := tm.Render(context.Background(), []chat.Message{{Role: "user", Content: "Hi"}}, true)
		require.NoError(t, err)
		require.Equal(t, "[gMASK]<sop><|user|>\nHi<|assistant|>", p)
		pids := tk.Encode(p, tokenizer.Options{})
		gm, _ := tk.TokenID("[gMASK]")
		require.Equal(t, gm, pids[0])
		require.True(t, tk.IsSpecial(gm))
		for _, tag := range []string{"<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "<tool_response>", "</tool_response>"} {
			id, ok := tk.TokenID(tag)
			require.True(t, ok, tag)
			require.False(t, tk.IsSpecial(id), "%s is an ordinary added token", tag)
			require.Equal(t, []int32{id}, tk.Encode(tag, tokenizer.Options{}), "%s is one token", tag)
			require.Equal(t, tag, tk.Decode([]int32{id}, true), "%s survives skip_special_tokens", tag)
		}
		for _, role := range []string{"<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"} {
			id, ok := tk.TokenID(role)
			require.True(t, ok, role)
			require.True(t, tk.IsSpecial(id), "%s stays special", role)
		}
	}
}

func TestWriteIncludesTokenizer(t *testing.T) {
	cfg, err := Preset("tiny")
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, Write(dir, cfg, Options{Seed: 1}))
	for _, f := range []string{"tokenizer.json", "tokenizer_config.json"} {
		_, err := os.Stat(filepath.Join(dir, f))
		require.NoError(t, err, f)
	}
}
