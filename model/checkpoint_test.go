package model

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/glmflash/glmflash/model/safetensors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fixtureTensors returns every tensor of the fixture checkpoint (bytes copied).
func fixtureTensors(t *testing.T) []safetensors.WriteTensor {
	t.Helper()
	f, err := safetensors.Open(filepath.Join(fixtureDir, SingleFile))
	require.NoError(t, err)
	defer f.Close()
	var out []safetensors.WriteTensor
	for _, n := range f.Names() {
		info, _ := f.Info(n)
		raw, err := f.Bytes(n)
		require.NoError(t, err)
		out = append(out, safetensors.WriteTensor{Name: n, DType: info.DType, Shape: info.Shape, Data: slices.Clone(raw)})
	}
	return out
}

// writeCheckpoint writes config.json (the fixture's, or cfgJSON) and the given
// tensors as model.safetensors into a fresh directory.
func writeCheckpoint(t *testing.T, cfgJSON []byte, tensors []safetensors.WriteTensor) string {
	t.Helper()
	dir := t.TempDir()
	if cfgJSON == nil {
		cfgJSON = fixtureConfigJSON(t)
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, ConfigFile), cfgJSON, 0o644))
	require.NoError(t, safetensors.Write(filepath.Join(dir, SingleFile), tensors, map[string]string{"format": "pt"}))
	return dir
}

func TestOpenFixtureCheckpoint(t *testing.T) {
	ck, err := Open(fixtureDir)
	require.NoError(t, err)
	defer ck.Close()
	require.NoError(t, ck.Validate())
	c := ck.Config()
	assert.Equal(t, 8, c.NumHiddenLayers)
	assert.True(t, c.IsDSA(3))
	assert.True(t, c.IsDSA(7))
	assert.Equal(t, fixtureDir, ck.Dir())

	names := ck.Names()
	assert.IsIncreasing(t, names)
	assert.True(t, ck.Has("model.visual.blocks.0.attn.qkv.weight"))
	assert.False(t, ck.Has("nope"))
	dt, ok := ck.DType("model.language_model.layers.0.hc_attn_fn")
	require.True(t, ok)
	assert.Equal(t, safetensors.BF16, dt)
	dt, ok = ck.DType("model.language_model.layers.3.mlp.gate.e_score_correction_bias")
	require.True(t, ok)
	assert.Equal(t, safetensors.F32, dt)
	_, ok = ck.DType("nope")
	assert.False(t, ok)

	name := "model.language_model.layers.3.self_attn.q_a_proj.weight"
	info, ok := ck.Info(name)
	require.True(t, ok)
	assert.Equal(t, []int{48, 64}, info.Shape)
	w, err := ck.Float32(name, 48, 64)
	require.NoError(t, err)
	raw, _, err := ck.Raw(name)
	require.NoError(t, err)
	for i := range w {
		require.Equal(t, safetensors.BF16ToFloat32(binary.LittleEndian.Uint16(raw[2*i:])), w[i])
	}
	w2, err := ck.Float32(name)
	require.NoError(t, err)
	assert.Equal(t, w, w2)
	w2[0] = 1234
	w3, _ := ck.Float32(name)
	assert.NotEqual(t, float32(1234), w3[0], "fresh slice each call")

	_, err = ck.Float32(name, 48, 65)
	assert.EqualError(t, err, "tensor model.language_model.layers.3.self_attn.q_a_proj.weight: shape [48 64], want [48 65]")
	_, err = ck.Float32("model.language_model.layers.9.mlp.gate.weight")
	assert.EqualError(t, err, "tensor model.language_model.layers.9.mlp.gate.weight: not found in checkpoint "+fixtureDir)
	_, _, err = ck.Raw("nope")
	assert.ErrorContains(t, err, "tensor nope")

	emb, err := ck.Float32(EmbedName, 256, 64)
	require.NoError(t, err)
	assert.Len(t, emb, 256*64)
	require.NoError(t, ck.Close())
}

func TestWeightCatalogMatchesFixture(t *testing.T) {
	c := fixtureConfig(t)
	f, err := safetensors.Open(filepath.Join(fixtureDir, SingleFile))
	require.NoError(t, err)
	defer f.Close()
	cat := c.WeightCatalog(false)
	seen := map[string]bool{}
	for _, s := range cat {
		require.False(t, seen[s.Name], "duplicate %s", s.Name)
		seen[s.Name] = true
		info, ok := f.Info(s.Name)
		require.True(t, ok, s.Name)
		assert.Equal(t, s.Shape, info.Shape, s.Name)
		if !strings.Contains(s.Name, ".hc_") && !strings.Contains(s.Name, "compress_ape") {
			assert.Equal(t, s.DType, info.DType, s.Name) // the fixture stores these two as BF16
		} else {
			assert.Equal(t, safetensors.F32, s.DType)
		}
	}
	// Every non-vision tensor of the fixture is in the catalog.
	for _, n := range f.Names() {
		if !strings.HasPrefix(n, "model.visual.") {
			assert.True(t, seen[n], "catalog lacks %s", n)
		}
	}
	// FP8 layout of the same config.
	fp8 := c.WeightCatalog(true)
	nFP8, nScale := 0, 0
	byName := map[string]WeightSpec{}
	for _, s := range fp8 {
		byName[s.Name] = s
		if s.DType == safetensors.F8E4M3 {
			nFP8++
			assert.True(t, s.FP8Eligible)
		}
		if strings.HasSuffix(s.Name, "_scale_inv") {
			nScale++
			assert.Equal(t, safetensors.F32, s.DType)
		}
	}
	// 2 DSA layers × 4 + 3 dense × 3 + 5 MoE layers × (8 experts × 3 + 3 shared).
	assert.Equal(t, 2*4+3*3+5*(8*3+3), nFP8)
	assert.Equal(t, nFP8, nScale)
	assert.Equal(t, len(cat)+nFP8, len(fp8))
	s := byName["model.language_model.layers.3.self_attn.q_a_proj.weight_scale_inv"]
	assert.Equal(t, []int{1, 1}, s.Shape)
	assert.Equal(t, safetensors.BF16, byName["model.language_model.layers.3.self_attn.kv_b_proj.weight"].DType)
	assert.False(t, byName["model.language_model.layers.3.self_attn.kv_b_proj.weight"].FP8Eligible)
	assert.Equal(t, safetensors.BF16, byName["model.language_model.layers.0.self_attn.q_proj.weight"].DType)
	for _, s := range cat {
		if s.FP8Eligible {
			assert.Equal(t, safetensors.F8E4M3, byName[s.Name].DType, s.Name)
		}
	}

	// modules_to_not_convert, tied embeddings, shared indexer, no compression.
	d := c.Clone()
	d.Quant = &QuantConfig{Method: "fp8", Fmt: "e4m3", WeightBlockSize: [2]int{32, 16}, ModulesToNotConvert: []string{"shared_experts", "layers.3.self_attn.o_proj"}}
	d.TieWordEmbeddings = true
	d.IndexerTypes[7] = IndexerShared
	d.IndexKPoolCompress = false
	byName = map[string]WeightSpec{}
	for _, s := range d.WeightCatalog(true) {
		byName[s.Name] = s
	}
	assert.Equal(t, safetensors.BF16, byName["model.language_model.layers.4.mlp.shared_experts.up_proj.weight"].DType)
	assert.False(t, byName["model.language_model.layers.4.mlp.shared_experts.up_proj.weight"].FP8Eligible)
	assert.Equal(t, safetensors.BF16, byName["model.language_model.layers.3.self_attn.o_proj.weight"].DType)
	assert.Equal(t, safetensors.F8E4M3, byName["model.language_model.layers.7.self_attn.o_proj.weight"].DType)
	assert.Equal(t, []int{2, 4}, byName["model.language_model.layers.7.self_attn.o_proj.weight_scale_inv"].Shape, "[64,64] in 32×16 blocks")
	assert.NotContains(t, byName, LMHeadName)
	assert.NotContains(t, byName, "model.language_model.layers.7.self_attn.indexer.wk.weight")
	assert.Contains(t, byName, "model.language_model.layers.3.self_attn.indexer.wk.weight")
	assert.NotContains(t, byName, "model.language_model.layers.3.self_attn.indexer.index_kpool_compress_gate")
}

func TestCheckpointMalformed(t *testing.T) {
	base := fixtureTensors(t)
	without := func(name string) []safetensors.WriteTensor {
		var out []safetensors.WriteTensor
		for _, x := range base {
			if x.Name != name {
				out = append(out, x)
			}
		}
		return out
	}
	replace := func(name string, nt safetensors.WriteTensor) []safetensors.WriteTensor {
		out := without(name)
		return append(out, nt)
	}

	t.Run("missing tensor", func(t *testing.T) {
		name := "model.language_model.layers.5.self_attn.b_proj.weight"
		dir := writeCheckpoint(t, nil, without(name))
		ck, err := Open(dir)
		require.NoError(t, err)
		defer ck.Close()
		err = ck.Validate()
		require.Error(t, err)
		assert.Contains(t, err.Error(), "tensor "+name+": missing from checkpoint "+dir)
		_, err = ck.Float32(name)
		assert.ErrorContains(t, err, name)
		assert.ErrorContains(t, err, dir)
	})
	t.Run("wrong shape", func(t *testing.T) {
		name := "model.language_model.layers.3.self_attn.q_a_proj.weight"
		dir := writeCheckpoint(t, nil, replace(name, safetensors.WriteTensor{Name: name, DType: safetensors.BF16, Shape: []int{48, 65}, Data: make([]byte, 48*65*2)}))
		ck, err := Open(dir)
		require.NoError(t, err)
		defer ck.Close()
		assert.EqualError(t, ck.Validate(), "tensor "+name+": shape [48 65], want [48 64]")
	})
	t.Run("non-float dtype", func(t *testing.T) {
		name := "model.language_model.norm.weight"
		dir := writeCheckpoint(t, nil, replace(name, safetensors.WriteTensor{Name: name, DType: safetensors.I16, Shape: []int{64}, Data: make([]byte, 128)}))
		ck, err := Open(dir)
		require.NoError(t, err)
		defer ck.Close()
		assert.ErrorContains(t, ck.Validate(), "tensor "+name+": dtype I16, want a float type")
		_, err = ck.Float32(name)
		assert.ErrorContains(t, err, "tensor "+name+": dtype I16 is not a float type")
	})
	t.Run("many problems are capped", func(t *testing.T) {
		var only []safetensors.WriteTensor
		for _, x := range base {
			if strings.Contains(x.Name, "visual") {
				only = append(only, x)
			}
		}
		dir := writeCheckpoint(t, nil, only)
		ck, err := Open(dir)
		require.NoError(t, err)
		defer ck.Close()
		err = ck.Validate()
		assert.ErrorContains(t, err, "more problems")
		assert.Equal(t, 21, strings.Count(err.Error(), "\n")+1)
	})
	t.Run("unknown dtype", func(t *testing.T) {
		dir := writeCheckpoint(t, nil, base)
		p := filepath.Join(dir, SingleFile)
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		n := binary.LittleEndian.Uint64(b)
		h := strings.Replace(string(b[8:8+n]), `"dtype":"F32"`, `"dtype":"Q32"`, 1)
		require.Equal(t, int(n), len(h))
		copy(b[8:], h)
		require.NoError(t, os.WriteFile(p, b, 0o644))
		_, err = Open(dir)
		require.Error(t, err)
		assert.Contains(t, err.Error(), p)
		assert.Contains(t, err.Error(), `unknown dtype "Q32"`)
	})
	t.Run("truncated safetensors", func(t *testing.T) {
		dir := writeCheckpoint(t, nil, base)
		p := filepath.Join(dir, SingleFile)
		st, err := os.Stat(p)
		require.NoError(t, err)
		require.NoError(t, os.Truncate(p, st.Size()-100))
		_, err = Open(dir)
		require.Error(t, err)
		assert.Contains(t, err.Error(), p)
		assert.Contains(t, err.Error(), "truncated")
	})
	t.Run("bad header json", func(t *testing.T) {
		dir := writeCheckpoint(t, nil, base)
		p := filepath.Join(dir, SingleFile)
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		b[8] = '['
		require.NoError(t, os.WriteFile(p, b, 0o644))
		_, err = Open(dir)
		require.Error(t, err)
		assert.Contains(t, err.Error(), p)
		assert.Contains(t, err.Error(), "JSON")
	})
	t.Run("inconsistent config", func(t *testing.T) {
		for _, tc := range []struct{ key, val, want string }{
			{"index_kpool", "3", "index_topk (16) must be a multiple of index_kpool (3)"},
			{"num_key_value_heads", "2", "num_attention_heads (4) must equal num_key_value_heads (2)"},
			{"layer_types", `["linear_attention"]`, "layer_types has 1 entries, want num_hidden_layers (8)"},
		} {
			var top map[string]any
			require.NoError(t, json.Unmarshal(fixtureConfigJSON(t), &top))
			var v any
			require.NoError(t, json.Unmarshal([]byte(tc.val), &v))
			top["text_config"].(map[string]any)[tc.key] = v
			b, err := json.Marshal(top)
			require.NoError(t, err)
			dir := writeCheckpoint(t, b, base[:1])
			_, err = Open(dir)
			require.Error(t, err)
			assert.Contains(t, err.Error(), filepath.Join(dir, ConfigFile)+": "+tc.want)
		}
	})
	t.Run("missing config", func(t *testing.T) {
		dir := t.TempDir()
		_, err := Open(dir)
		assert.ErrorContains(t, err, "config.json")
		assert.ErrorContains(t, err, dir)
	})
	t.Run("no safetensors", func(t *testing.T) {
		dir := t.TempDir()
		require.NoError(t, os.WriteFile(filepath.Join(dir, ConfigFile), fixtureConfigJSON(t), 0o644))
		_, err := Open(dir)
		assert.ErrorContains(t, err, "no model.safetensors.index.json, model.safetensors or *.safetensors files")
	})
}

// writeSharded writes the fixture tensors into n shards plus an index.
func writeSharded(t *testing.T, tensors []safetensors.WriteTensor, n int) (string, map[string]string) {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, ConfigFile), fixtureConfigJSON(t), 0o644))
	wm := map[string]string{}
	for s := 0; s < n; s++ {
		var part []safetensors.WriteTensor
		for i, x := range tensors {
			if i%n == s {
				part = append(part, x)
			}
		}
		name := fmt.Sprintf("model-%05d-of-%05d.safetensors", s+1, n)
		require.NoError(t, safetensors.Write(filepath.Join(dir, name), part, nil))
		for _, x := range part {
			wm[x.Name] = name
		}
	}
	writeIndex(t, dir, wm)
	return dir, wm
}

func writeIndex(t *testing.T, dir string, wm map[string]string) {
	t.Helper()
	b, err := json.Marshal(map[string]any{"metadata": map[string]any{"total_size": 1}, "weight_map": wm})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, IndexFile), b, 0o644))
}

func TestShardedCheckpoint(t *testing.T) {
	base := fixtureTensors(t)
	dir, wm := writeSharded(t, base, 3)
	ck, err := Open(dir)
	require.NoError(t, err)
	require.NoError(t, ck.Validate())
	assert.Len(t, ck.Names(), len(base))
	ref, err := Open(fixtureDir)
	require.NoError(t, err)
	for _, n := range []string{EmbedName, "model.language_model.layers.7.mlp.experts.5.down_proj.weight", "model.language_model.layers.0.self_attn.A_log"} {
		a, err := ck.Float32(n)
		require.NoError(t, err)
		b, err := ref.Float32(n)
		require.NoError(t, err)
		assert.Equal(t, b, a, n)
	}
	require.NoError(t, ck.Close())
	require.NoError(t, ref.Close())

	// Index pointing to a missing shard.
	orig := wm[EmbedName]
	wm[EmbedName] = "model-00009-of-00009.safetensors"
	writeIndex(t, dir, wm)
	_, err = Open(dir)
	require.Error(t, err)
	assert.Contains(t, err.Error(), IndexFile)
	assert.Contains(t, err.Error(), "tensor "+EmbedName+" maps to shard model-00009-of-00009.safetensors, which is missing")

	// Index pointing to a shard that lacks the tensor.
	for _, other := range []string{"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors"} {
		if other != orig {
			wm[EmbedName] = other
			break
		}
	}
	writeIndex(t, dir, wm)
	_, err = Open(dir)
	assert.ErrorContains(t, err, "which does not hold it")

	// Escaping paths and malformed index files.
	wm[EmbedName] = "../x.safetensors"
	writeIndex(t, dir, wm)
	_, err = Open(dir)
	assert.ErrorContains(t, err, "invalid shard name")
	require.NoError(t, os.WriteFile(filepath.Join(dir, IndexFile), []byte(`{"weight_map":`), 0o644))
	_, err = Open(dir)
	assert.ErrorContains(t, err, "invalid index")
	require.NoError(t, os.WriteFile(filepath.Join(dir, IndexFile), []byte(`{}`), 0o644))
	_, err = Open(dir)
	assert.ErrorContains(t, err, "weight_map is missing or empty")

	// Without the index, all *.safetensors files are read.
	require.NoError(t, os.Remove(filepath.Join(dir, IndexFile)))
	ck, err = Open(dir)
	require.NoError(t, err)
	require.NoError(t, ck.Validate())
	require.NoError(t, ck.Close())
	// A tensor in two files is an error.
	require.NoError(t, safetensors.Write(filepath.Join(dir, "extra.safetensors"), base[:1], nil))
	_, err = Open(dir)
	assert.ErrorContains(t, err, "tensor "+base[0].Name+" is in both")
}

// fp8Checkpoint writes the fixture with q_b_proj of layer 3 replaced by an
// FP8 weight [n,k] with the given scale tensor.
func fp8Tensors(t *testing.T, codes []byte, shape []int, scale safetensors.WriteTensor) []safetensors.WriteTensor {
	t.Helper()
	var out []safetensors.WriteTensor
	name := "model.language_model.layers.3.self_attn.q_b_proj.weight"
	for _, x := range fixtureTensors(t) {
		if x.Name != name {
			out = append(out, x)
		}
	}
	out = append(out, safetensors.WriteTensor{Name: name, DType: safetensors.F8E4M3, Shape: shape, Data: codes})
	if scale.Name != "" {
		out = append(out, scale)
	}
	return out
}

func TestFP8Dequantization(t *testing.T) {
	// A config with 8×8 blocks so that the fixture's [64,48] q_b_proj has
	// several blocks; also use a non-multiple block (48 = 8·6, 64 = 8·8) and a
	// 32×20 config for partial edge blocks.
	name := "model.language_model.layers.3.self_attn.q_b_proj.weight"
	for _, bs := range [][2]int{{8, 8}, {32, 20}, {128, 128}} {
		var top map[string]any
		require.NoError(t, json.Unmarshal(fixtureConfigJSON(t), &top))
		top["quantization_config"] = map[string]any{"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": []int{bs[0], bs[1]}}
		cfgJSON, err := json.Marshal(top)
		require.NoError(t, err)
		n, k := 64, 48
		sn, sk := (n+bs[0]-1)/bs[0], (k+bs[1]-1)/bs[1]
		codes := make([]byte, n*k)
		for i := range codes {
			codes[i] = byte(i*37) & 0x7F
			if codes[i] == 0x7F {
				codes[i] = 0x7E
			}
		}
		for _, sdt := range []safetensors.DType{safetensors.F32, safetensors.BF16} {
			scale := make([]float32, sn*sk)
			for i := range scale {
				scale[i] = float32(math.Ldexp(1, i%5-2)) * 1.5
			}
			sraw := make([]byte, len(scale)*sdt.Size())
			require.NoError(t, safetensors.FromFloat32(sdt, scale, sraw))
			st := safetensors.WriteTensor{Name: name + "_scale_inv", DType: sdt, Shape: []int{sn, sk}, Data: sraw}
			dir := writeCheckpoint(t, cfgJSON, fp8Tensors(t, codes, []int{n, k}, st))
			ck, err := Open(dir)
			require.NoError(t, err)
			require.NoError(t, ck.Validate(), "bs %v", bs)
			w, err := ck.Float32(name, n, k)
			require.NoError(t, err)
			for r := 0; r < n; r++ {
				for c := 0; c < k; c++ {
					want := safetensors.F8E4M3ToFloat32(codes[r*k+c]) * scale[(r/bs[0])*sk+c/bs[1]]
					require.Equal(t, want, w[r*k+c], "bs %v r %d c %d", bs, r, c)
				}
			}
			require.NoError(t, ck.Close())
		}
	}

	// Missing and malformed scales.
	codes := make([]byte, 64*48)
	dir := writeCheckpoint(t, nil, fp8Tensors(t, codes, []int{64, 48}, safetensors.WriteTensor{}))
	ck, err := Open(dir)
	require.NoError(t, err)
	err = ck.Validate()
	assert.ErrorContains(t, err, "tensor "+name+": F8_E4M3 weight has no block scale "+name+"_scale_inv in checkpoint "+dir)
	_, err = ck.Float32(name)
	assert.ErrorContains(t, err, "no block scale")
	ck.Close()

	dir = writeCheckpoint(t, nil, fp8Tensors(t, codes, []int{64, 48}, safetensors.WriteTensor{Name: name + "_scale_inv", DType: safetensors.F32, Shape: []int{2, 1}, Data: make([]byte, 8)}))
	ck, err = Open(dir)
	require.NoError(t, err)
	assert.ErrorContains(t, ck.Validate(), "tensor "+name+"_scale_inv: shape [2 1], want [1 1]")
	ck.Close()

	dir = writeCheckpoint(t, nil, fp8Tensors(t, codes, []int{64, 48}, safetensors.WriteTensor{Name: name + "_scale_inv", DType: safetensors.I32, Shape: []int{1, 1}, Data: make([]byte, 4)}))
	ck, err = Open(dir)
	require.NoError(t, err)
	assert.ErrorContains(t, ck.Validate(), "tensor "+name+"_scale_inv: dtype I32, want F32 or BF16")
	ck.Close()

	// A 3-D FP8 tensor cannot be dequantized.
	conv := "model.language_model.layers.0.self_attn.q_conv1d.weight"
	var ts []safetensors.WriteTensor
	for _, x := range fixtureTensors(t) {
		if x.Name == conv {
			x = safetensors.WriteTensor{Name: conv, DType: safetensors.F8E4M3, Shape: x.Shape, Data: make([]byte, 64*4)}
		}
		ts = append(ts, x)
	}
	dir = writeCheckpoint(t, nil, ts)
	ck, err = Open(dir)
	require.NoError(t, err)
	assert.ErrorContains(t, ck.Validate(), "tensor "+conv+": F8_E4M3 weight has shape [64 1 4], want 2 dimensions")
	ck.Close()
}

func TestIsMTPName(t *testing.T) {
	c := fixtureConfig(t)
	assert.True(t, c.IsMTPName("model.language_model.layers.8.eh_proj.weight"))
	assert.False(t, c.IsMTPName("model.language_model.layers.7.mlp.gate.weight"))
	assert.False(t, c.IsMTPName("lm_head.weight"))
	assert.True(t, c.IsMTPName("model.language_model.layers.99999999999999999999.x"))
}

func TestLargeTensorParallelPaths(t *testing.T) {
	// Exercise the chunked conversion and row-parallel dequantization paths.
	n, k := 1100, 1000
	vals := make([]float32, n*k)
	for i := range vals {
		vals[i] = float32(i%1000) / 64
	}
	raw := make([]byte, len(vals)*2)
	require.NoError(t, safetensors.FromFloat32(safetensors.BF16, vals, raw))
	out := make([]float32, len(vals))
	require.NoError(t, parallelConvert(safetensors.BF16, raw, out))
	for i := range vals {
		require.Equal(t, safetensors.BF16ToFloat32(safetensors.Float32ToBF16(vals[i])), out[i])
	}
	assert.Error(t, parallelConvert(safetensors.BF16, raw[:len(raw)-2], out))

	c := fixtureConfig(t)
	ck := &Checkpoint{dir: "mem", cfg: c, tensors: map[string]tensorLoc{}}
	codes := make([]byte, n*k)
	for i := range codes {
		codes[i] = byte(i) & 0x7E
	}
	sc := c.ScaleShape(n, k)
	scale := make([]float32, sc[0]*sc[1])
	for i := range scale {
		scale[i] = float32(i + 1)
	}
	sraw := make([]byte, len(scale)*4)
	require.NoError(t, safetensors.FromFloat32(safetensors.F32, scale, sraw))
	p := filepath.Join(t.TempDir(), "s.safetensors")
	require.NoError(t, safetensors.Write(p, []safetensors.WriteTensor{
		{Name: "w", DType: safetensors.F8E4M3, Shape: []int{n, k}, Data: codes},
		{Name: "w_scale_inv", DType: safetensors.F32, Shape: sc, Data: sraw},
	}, nil))
	f, err := safetensors.Open(p)
	require.NoError(t, err)
	defer f.Close()
	for _, nm := range []string{"w", "w_scale_inv"} {
		info, _ := f.Info(nm)
		ck.tensors[nm] = tensorLoc{file: f, info: info}
	}
	w, err := ck.Float32("w", n, k)
	require.NoError(t, err)
	for r := 0; r < n; r += 97 {
		for col := 0; col < k; col += 13 {
			want := safetensors.F8E4M3ToFloat32(codes[r*k+col]) * scale[(r/128)*sc[1]+col/128]
			require.Equal(t, want, w[r*k+col])
		}
	}
}
