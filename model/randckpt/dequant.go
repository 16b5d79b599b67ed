package randckpt

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/glmflash/glmflash/internal/regular"
	"github.com/glmflash/glmflash/model"
	"github.com/glmflash/glmflash/model/safetensors"
)

// WriteDequantizedBF16 reads the checkpoint in srcDir and writes to dstDir
// the same weights with every F8E4M3 tensor dequantized (code × block scale)
// and stored as BF16; their "_scale_inv" companions are dropped and all other
// tensors are copied unchanged. config.json is copied without its
// quantization_config. For checkpoints written by Write with FP8 the
// conversion is exact (power-of-two scales); for others each dequantized
// value is rounded to the nearest bfloat16. The output is one model.safetensors.
func WriteDequantizedBF16(srcDir, dstDir string) error {
	absSrc, err1 := filepath.Abs(srcDir)
	absDst, err2 := filepath.Abs(dstDir)
	if err1 != nil || err2 != nil || absSrc == absDst {
		return fmt.Errorf("randckpt: destination %s must differ from source %s", dstDir, srcDir)
	}
	ck, err := model.Open(srcDir)
	if err != nil {
		return err
	}
	defer ck.Close()

	cfgJSON, err := regular.ReadFile(filepath.Join(srcDir, model.ConfigFile), regular.ConfigLimit)
	if err != nil {
		return fmt.Errorf("randckpt: %w", err)
	}
	cfgJSON, err = stripQuantization(cfgJSON)
	if err != nil {
		return fmt.Errorf("randckpt: %s: %w", filepath.Join(srcDir, model.ConfigFile), err)
	}

	var specs []safetensors.WriteTensor
	for _, name := range ck.Names() {
		info, _ := ck.Info(name)
		if strings.HasSuffix(name, model.ScaleSuffix) {
			if dt, ok := ck.DType(strings.TrimSuffix(name, model.ScaleSuffix)); ok && dt == safetensors.F8E4M3 {
				continue
			}
		}
		dt := info.DType
		if dt == safetensors.F8E4M3 {
			dt = safetensors.BF16
		}
		specs = append(specs, safetensors.WriteTensor{Name: name, DType: dt, Shape: info.Shape})
	}
	if err := os.MkdirAll(dstDir, 0o755); err != nil {
		return fmt.Errorf("randckpt: %w", err)
	}
	if err := removeWeights(dstDir); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dstDir, model.ConfigFile), cfgJSON, 0o644); err != nil {
		return fmt.Errorf("randckpt: %w", err)
	}
	w, err := safetensors.NewWriter(filepath.Join(dstDir, model.SingleFile), specs, map[string]string{"format": "pt"})
	if err != nil {
		return fmt.Errorf("randckpt: %w", err)
	}
	for _, s := range specs {
		var data []byte
		if dt, _ := ck.DType(s.Name); dt == safetensors.F8E4M3 {
			vals, err := ck.Float32(s.Name)
			if err != nil {
				w.Abort()
				return err
			}
			data = make([]byte, len(vals)*2)
			_ = safetensors.FromFloat32(safetensors.BF16, vals, data) // lengths match
		} else {
			data, _, err = ck.Raw(s.Name)
			if err != nil {
				w.Abort()
				return err
			}
		}
		if err := w.WriteTensor(s.Name, data); err != nil {
			w.Abort()
			return fmt.Errorf("randckpt: %w", err)
		}
	}
	if err := w.Close(); err != nil {
		return fmt.Errorf("randckpt: %w", err)
	}
	return nil
}

// stripQuantization removes quantization_config from a config.json (top
// level and text_config), keeping every other field as written.
func stripQuantization(b []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var top map[string]any
	if err := dec.Decode(&top); err != nil {
		return nil, err
	}
	delete(top, "quantization_config")
	if tc, ok := top["text_config"].(map[string]any); ok {
		delete(tc, "quantization_config")
	}
	out, err := json.MarshalIndent(top, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}
