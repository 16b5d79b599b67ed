// Package eval checks the engine against reference outputs recorded by
// Hugging Face transformers (the fixture format of
// testdata/glm5next-tiny-*/reference.{json,safetensors}): prefill logits,
// greedy decoding with a cache, and multi-token continuation.
package eval

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"path/filepath"

	"github.com/glmflash/glmflash/internal/regular"
	"github.com/glmflash/glmflash/model/safetensors"
)

// Case is one reference case.
type Case struct {
	Name   string
	Kind   string // prefill, decode, extend
	Tokens []int32
	// prefill
	Logits []float32 // [len(Tokens)][V]
	Hidden map[int][]float32
	// decode
	Greedy     []int32
	StepLogits []float32 // [steps+1][V]
	// extend
	Split        int
	LogitsFirst  []float32
	LogitsSecond []float32
}

// Reference is a loaded reference file.
type Reference struct {
	Path  string
	Vocab int
	Cases []Case
}

type refJSON struct {
	Cases []struct {
		Name string `json:"name"`
		Kind string `json:"kind"`
	} `json:"cases"`
}

// Load reads FILE.safetensors and the FILE.json beside it (the case list).
func Load(path string) (*Reference, error) {
	jpath := path[:len(path)-len(filepath.Ext(path))] + ".json"
	jb, err := regular.ReadFile(jpath, regular.ConfigLimit)
	if err != nil {
		return nil, fmt.Errorf("reference: %w", err)
	}
	var rj refJSON
	if err := json.Unmarshal(jb, &rj); err != nil {
		return nil, fmt.Errorf("reference %s: %w", jpath, err)
	}
	f, err := safetensors.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ref := &Reference{Path: path}
	ints := func(name string) ([]int32, error) { return readInts(f, "reference "+path, name) }
	floats := func(name string, rows int) ([]float32, error) {
		info, ok := f.Info(name)
		if !ok {
			return nil, fmt.Errorf("reference %s: missing tensor %s", path, name)
		}
		if len(info.Shape) != 2 || info.Shape[0] != rows {
			return nil, fmt.Errorf("reference %s: tensor %s has shape %v, want [%d, V]", path, name, info.Shape, rows)
		}
		if ref.Vocab == 0 {
			ref.Vocab = info.Shape[1]
		} else if info.Shape[1] != ref.Vocab {
			return nil, fmt.Errorf("reference %s: tensor %s has %d columns, others %d", path, name, info.Shape[1], ref.Vocab)
		}
		return f.Float32(name)
	}
	for _, c := range rj.Cases {
		cs := Case{Name: c.Name, Kind: c.Kind, Hidden: map[int][]float32{}}
		if cs.Tokens, err = ints(c.Name + ".input_ids"); err != nil {
			return nil, err
		}
		switch c.Kind {
		case "prefill":
			if cs.Logits, err = floats(c.Name+".logits", len(cs.Tokens)); err != nil {
				return nil, err
			}
			for l := 0; ; l++ {
				name := fmt.Sprintf("%s.hidden.%d", c.Name, l)
				if _, ok := f.Info(name); !ok {
					break
				}
				if cs.Hidden[l], err = f.Float32(name); err != nil {
					return nil, err
				}
			}
		case "decode":
			if cs.Greedy, err = ints(c.Name + ".greedy_tokens"); err != nil {
				return nil, err
			}
			if cs.StepLogits, err = floats(c.Name+".step_logits", len(cs.Greedy)+1); err != nil {
				return nil, err
			}
		case "extend":
			sp, err := ints(c.Name + ".split")
			if err != nil {
				return nil, err
			}
			if len(sp) != 1 || sp[0] <= 0 || int(sp[0]) >= len(cs.Tokens) {
				return nil, fmt.Errorf("reference %s: %s.split is %v, want one value in (0, %d)", path, c.Name, sp, len(cs.Tokens))
			}
			cs.Split = int(sp[0])
			if cs.LogitsFirst, err = floats(c.Name+".logits_first", cs.Split); err != nil {
				return nil, err
			}
			if cs.LogitsSecond, err = floats(c.Name+".logits_second", len(cs.Tokens)-cs.Split); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("reference %s: case %s has unknown kind %q", jpath, c.Name, c.Kind)
		}
		ref.Cases = append(ref.Cases, cs)
	}
	if len(ref.Cases) == 0 {
		return nil, fmt.Errorf("reference %s: no cases", jpath)
	}
	return ref, nil
}

// readInts reads an integer tensor (I64 or I32) of a reference file as
// int32, refusing values out of int32's range; what names the file in
// errors.
func readInts(f *safetensors.File, what, name string) ([]int32, error) {
	info, ok := f.Info(name)
	if !ok {
		return nil, fmt.Errorf("%s: missing tensor %s", what, name)
	}
	raw, err := f.Bytes(name)
	if err != nil {
		return nil, err
	}
	out := make([]int32, info.NumElements())
	switch info.DType {
	case safetensors.I64:
		for i := range out {
			v := int64(binary.LittleEndian.Uint64(raw[8*i:]))
			if v < math.MinInt32 || v > math.MaxInt32 {
				return nil, fmt.Errorf("%s: %s[%d] = %d is out of range", what, name, i, v)
			}
			out[i] = int32(v)
		}
	case safetensors.I32:
		for i := range out {
			out[i] = int32(binary.LittleEndian.Uint32(raw[4*i:]))
		}
	default:
		return nil, fmt.Errorf("%s: tensor %s is %s, want an integer type", what, name, info.DType)
	}
	return out, nil
}
