package model

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/glmflash/glmflash/internal/regular"
)

// GenerationConfigFile is the checkpoint's optional generation defaults.
const GenerationConfigFile = "generation_config.json"

// GenerationConfig holds what glmflash reads from generation_config.json:
// the end-of-sequence ids (an integer or a list, as in config.json).
type GenerationConfig struct {
	EOSTokenIDs []int
}

// ParseGenerationConfig parses a generation_config.json; unknown keys are
// ignored, a malformed eos_token_id is an error naming it.
func ParseGenerationConfig(data []byte, source string) (*GenerationConfig, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var top map[string]any
	if err := dec.Decode(&top); err != nil {
		return nil, fmt.Errorf("%s: invalid JSON: %w", source, err)
	}
	if top == nil {
		return nil, fmt.Errorf("%s: not a JSON object", source)
	}
	if dec.More() {
		return nil, fmt.Errorf("%s: invalid JSON: trailing data after the object", source)
	}
	p := &parser{m: top, src: source}
	g := &GenerationConfig{}
	if v, ok := p.get("eos_token_id"); ok {
		if _, isList := v.([]any); isList {
			g.EOSTokenIDs, _ = p.intList("eos_token_id", v)
		} else if i := p.optInt("eos_token_id"); i != nil {
			g.EOSTokenIDs = []int{*i}
		}
	}
	if err := errors.Join(p.errs...); err != nil {
		return nil, err
	}
	return g, nil
}

// mergeGenerationConfig adds the end-of-sequence ids of dir's
// generation_config.json (when there is one) to those of cfg, a validated
// config.json: generation stops at any id either file names, as
// transformers and vLLM do. An id outside cfg's vocabulary is an error of
// generation_config.json (it used to be reported as config.json's).
func mergeGenerationConfig(dir string, cfg *Config) error {
	path := filepath.Join(dir, GenerationConfigFile)
	data, err := regular.ReadFile(path, regular.ConfigLimit)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("checkpoint %s: %w", dir, err)
	}
	g, err := ParseGenerationConfig(data, path)
	if err != nil {
		return err
	}
	var errs []error
	for i, id := range g.EOSTokenIDs {
		if id < 0 || id >= cfg.VocabSize {
			errs = append(errs, fmt.Errorf("%s: eos_token_id[%d] (%d) must be a token id in [0, vocab_size %d of %s)", path, i, id, cfg.VocabSize, ConfigFile))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for _, id := range g.EOSTokenIDs {
		if !slices.Contains(cfg.EOSTokenIDs, id) {
			cfg.EOSTokenIDs = append(cfg.EOSTokenIDs, id)
		}
	}
	return nil
}
