// Command basebpe writes model/randckpt/basebpe.txt.gz, the vocabulary the
// random presets' tokenizers are cut from: the first merges (by rank) of
// Qwen3's byte-level BPE (model/tokenizer/testdata/qwen3), enough for the
// largest preset, one "left right" merge per line in the byte-level
// alphabet.
//
//	go run ./tools/basebpe
package main

import (
	"compress/gzip"
	"encoding/json"
	"fmt"
	"os"
	"strings"
)

const (
	src   = "model/tokenizer/testdata/qwen3/tokenizer.json.gz"
	dst   = "model/randckpt/basebpe.txt.gz"
	count = 32000 // merges kept (the largest preset's vocabulary, bytes and specials aside, is smaller)
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "basebpe:", err)
		os.Exit(1)
	}
}

func run() error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return err
	}
	var tj struct {
		Model struct {
			Merges [][2]string `json:"merges"`
		} `json:"model"`
	}
	if err := json.NewDecoder(zr).Decode(&tj); err != nil {
		return err
	}
	var sb strings.Builder
	for _, m := range tj.Model.Merges[:count] {
		if strings.ContainsAny(m[0]+m[1], " \n") {
			return fmt.Errorf("merge %q has a space or newline", m)
		}
		sb.WriteString(m[0] + " " + m[1] + "\n")
	}
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	zw, _ := gzip.NewWriterLevel(out, gzip.BestCompression)
	if _, err := zw.Write([]byte(sb.String())); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	return out.Close()
}
