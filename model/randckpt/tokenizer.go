package randckpt

import (
	"bufio"
	"bytes"
	"compress/gzip"
	_ "embed"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/glmflash/glmflash/model/tokenizer"
)

// basebpe.txt.gz holds the first 32,000 merges of Qwen3's byte-level BPE
// (written by tools/basebpe); presets cut it at their vocabulary size.
//
//go:embed basebpe.txt.gz
var baseBPE []byte

// tokenizer_config.json is the presets' chat template (GLM-4 style).
//
//go:embed tokenizer_config.json
var presetTokenizerConfig []byte

// presetAdded are the added tokens of a preset tokenizer, GLM style: the
// role markers and GLM's other special tokens, then the tags of thinking,
// tool calls and tool results as ordinary (special: false) added tokens,
// as GLM-4.5's tokenizer has them: one token each, and text that
// skip_special_tokens keeps (the parsers read it).
var presetAdded = []string{
	"<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>",
	"<|system|>", "<|user|>", "<|assistant|>", "<|observation|>",
	"<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>",
	"<arg_value>", "</arg_value>", "<tool_response>", "</tool_response>",
}

const presetNonSpecial = 10

// qwenSplit is the pre-tokenizer regex of Qwen2/3 (and GLM-4).
const qwenSplit = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`

// TokenizerFiles returns a valid byte-level BPE tokenizer.json with exactly
// vocab ids, and its tokenizer_config.json: the 256 bytes, then a real
// vocabulary (Qwen3's) cut by merge rank (past its 32,000 merges: synthetic
// merges of its tokens with a letter), then the GLM-style added tokens
// and the chat template when there is room for them (vocab ≥ 256 + 20).
func TokenizerFiles(vocab int) (tokJSON, cfgJSON []byte, err error) {
	if vocab < 256 {
		return nil, nil, fmt.Errorf("randckpt: a byte-level tokenizer needs a vocabulary of at least 256, got %d", vocab)
	}
	added := presetAdded
	if vocab < 256+len(added) {
		added = nil
	}
	nMerges := vocab - 256 - len(added)
	ids := map[string]int{}
	for b := 0; b < 256; b++ {
		ids[tokenizer.ByteLevelEncode([]byte{byte(b)})] = b
	}
	var merges [][2]string
	zr, err := gzip.NewReader(bytes.NewReader(baseBPE))
	if err != nil {
		return nil, nil, err
	}
	sc := bufio.NewScanner(zr)
	for len(merges) < nMerges && sc.Scan() {
		a, b, _ := strings.Cut(sc.Text(), " ")
		_, oka := ids[a]
		_, okb := ids[b]
		if _, dup := ids[a+b]; !oka || !okb || dup {
			continue // a cut part: this merge cannot exist in the smaller vocabulary
		}
		ids[a+b] = len(ids)
		merges = append(merges, [2]string{a, b})
	}
	if err := sc.Err(); err != nil {
		return nil, nil, err
	}
	// Past the base vocabulary (the released 154,880 ids): synthetic merges
	// of every base token with a letter, in id order, ranked after the real
	// ones, so the vocabulary is a valid BPE of the size asked for.
	if len(merges) < nMerges {
		base := make([]string, len(ids))
		for tok, id := range ids {
			base[id] = tok
		}
		var letters []string
		for c := 'a'; c <= 'z'; c++ {
			letters = append(letters, string(c), strings.ToUpper(string(c)))
		}
		for _, a := range base[256:] {
			for _, b := range letters {
				if len(merges) == nMerges {
					break
				}
				if _, dup := ids[a+b]; dup {
					continue
				}
				ids[a+b] = len(ids)
				merges = append(merges, [2]string{a, b})
			}
		}
	}
	if len(merges) < nMerges {
		return nil, nil, fmt.Errorf("randckpt: the base vocabulary has %d usable merges, %d wanted (vocab_size %d)", len(merges), nMerges, vocab)
	}
	type addedJSON struct {
		ID         int    `json:"id"`
		Content    string `json:"content"`
		SingleWord bool   `json:"single_word"`
		LStrip     bool   `json:"lstrip"`
		RStrip     bool   `json:"rstrip"`
		Normalized bool   `json:"normalized"`
		Special    bool   `json:"special"`
	}
	var at []addedJSON
	for i, s := range added {
		at = append(at, addedJSON{ID: len(ids) + i, Content: s, Special: i < len(added)-presetNonSpecial})
	}
	byteLevel := map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}
	tj := map[string]any{
		"version": "1.0", "truncation": nil, "padding": nil, "added_tokens": at,
		"normalizer": map[string]any{"type": "NFC"},
		"pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": qwenSplit}, "behavior": "Isolated", "invert": false},
			byteLevel,
		}},
		"post_processor": byteLevel,
		"decoder":        byteLevel,
		"model": map[string]any{
			"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": "", "end_of_word_suffix": "",
			"fuse_unk": false, "byte_fallback": false, "ignore_merges": false, "vocab": ids, "merges": merges,
		},
	}
	if tokJSON, err = json.Marshal(tj); err != nil {
		return nil, nil, err
	}
	var cfg map[string]any
	if err := json.Unmarshal(presetTokenizerConfig, &cfg); err != nil {
		return nil, nil, err
	}
	delete(cfg, "note")
	if added == nil { // no special tokens: no chat template either
		delete(cfg, "chat_template")
		cfg["eos_token"], cfg["pad_token"] = nil, nil
	}
	cfgJSON, err = json.MarshalIndent(cfg, "", "  ")
	return tokJSON, cfgJSON, err
}

// WriteTokenizer writes tokenizer.json and tokenizer_config.json for a
// vocabulary of vocab ids into dir.
func WriteTokenizer(dir string, vocab int) error {
	tj, tc, err := TokenizerFiles(vocab)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), tj, 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), tc, 0o644)
}
