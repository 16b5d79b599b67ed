package randckpt

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/glmflash/glmflash/model"
	"github.com/glmflash/glmflash/model/safetensors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const fixtureDir = "../../testdata/glm5next-tiny-a/checkpoint"

func TestPresets(t *testing.T) {
	assert.Equal(t, []string{"bench", "bench-dflash", "bench-mtp", "gpu", "gpu-dflash", "gpu-mtp", "small", "small-dflash", "small-mtp", "tiny", "tiny-dflash", "tiny-mtp"}, PresetNames())
	for _, n := range PresetNames() {
		c, err := Preset(n)
		require.NoError(t, err, n)
		require.NoError(t, c.Validate(), n)
		assert.Equal(t, 8, c.NumHiddenLayers, n)
		if base, ok := strings.CutSuffix(n, MTPSuffix); ok {
			assert.Equal(t, 1, c.NumNextNPredictLayers, n)
			b, err := Preset(base)
			require.NoError(t, err)
			b.NumNextNPredictLayers, b.Source = 1, c.Source
			assert.Equal(t, b, c, "%s is %s plus one MTP layer", n, base)
		} else if base, ok := strings.CutSuffix(n, DFlashSuffix); ok {
			b, err := Preset(base)
			require.NoError(t, err)
			b.Source = c.Source
			assert.Equal(t, b, c, "%s's trunk is %s", n, base)
		} else {
			assert.Zero(t, c.NumNextNPredictLayers, n)
		}
		for i := 0; i < 8; i++ {
			assert.Equal(t, i%4 == 3, c.IsDSA(i), "%s layer %d", n, i)
			assert.Equal(t, i >= 3, c.IsMoE(i), "%s layer %d", n, i)
			assert.True(t, c.HasOwnIndexer(i) == c.IsDSA(i), "%s layer %d", n, i)
		}
		assert.Equal(t, 4, c.HCMult)
		assert.Equal(t, 4, c.IndexKPool)
	}
	_, err := Preset("huge")
	assert.ErrorContains(t, err, `unknown preset "huge"`)
	_, err = Preset("huge-mtp")
	assert.ErrorContains(t, err, `unknown preset "huge-mtp"`)

	// tiny is the fixture's text config.
	b, err := os.ReadFile(filepath.Join(fixtureDir, "config.json"))
	require.NoError(t, err)
	want, err := model.ParseConfig(b, "x")
	require.NoError(t, err)
	got, err := Preset("tiny")
	require.NoError(t, err)
	want.Source, got.Source = "", ""
	assert.Equal(t, want, got)

	s, err := Preset("small")
	require.NoError(t, err)
	assert.Equal(t, []int{256, 4096, 512, 16, 2, 128, 1}, []int{s.HiddenSize, s.VocabSize, s.IntermediateSize, s.NRoutedExperts, s.NumExpertsPerTok, s.MoEIntermediateSize, s.NSharedExperts})
	assert.Equal(t, []int{4, 64, 4, 64, 64, 128, 64}, []int{s.LinearNumHeads, s.LinearHeadDim, s.NumAttentionHeads, s.QKNopeHeadDim, s.VHeadDim, s.QLoraRank, s.KVLoraRank})
	assert.Equal(t, []int{8, 32, 64}, []int{s.IndexNHeads, s.IndexHeadDim, s.IndexTopK})

	bn, err := Preset("bench")
	require.NoError(t, err)
	assert.Equal(t, []int{1024, 32000, 2816, 32, 4, 512, 1, 65536}, []int{bn.HiddenSize, bn.VocabSize, bn.IntermediateSize, bn.NRoutedExperts, bn.NumExpertsPerTok, bn.MoEIntermediateSize, bn.NSharedExperts, bn.MaxPositionEmbeddings})
	assert.Equal(t, []int{8, 128, 8, 128, 128, 512, 256}, []int{bn.LinearNumHeads, bn.LinearHeadDim, bn.NumAttentionHeads, bn.QKNopeHeadDim, bn.VHeadDim, bn.QLoraRank, bn.KVLoraRank})
	assert.Equal(t, []int{8, 64, 256}, []int{bn.IndexNHeads, bn.IndexHeadDim, bn.IndexTopK})
	var params int64
	for _, s := range bn.WeightCatalog(false) {
		n := int64(1)
		for _, d := range s.Shape {
			n *= int64(d)
		}
		params += n
	}
	assert.InDelta(t, 3.5e8, float64(params), 1e8, "bench is a few hundred million parameters")

	// gpu: the released per-layer sizes (architecture.md §1.1) over 8 layers,
	// about 41 GB in the FP8 layout
	g, err := Preset("gpu")
	require.NoError(t, err)
	assert.Equal(t, []int{4096, 154880, 12288, 288, 8, 2048, 1, 154820}, []int{g.HiddenSize, g.VocabSize, g.IntermediateSize, g.NRoutedExperts, g.NumExpertsPerTok, g.MoEIntermediateSize, g.NSharedExperts, *g.PadTokenID})
	assert.Equal(t, []int{64, 128, 64, 256, 256, 1536, 512}, []int{g.LinearNumHeads, g.LinearHeadDim, g.NumAttentionHeads, g.QKNopeHeadDim, g.VHeadDim, g.QLoraRank, g.KVLoraRank})
	assert.Equal(t, []int{32, 128, 2048, 4}, []int{g.IndexNHeads, g.IndexHeadDim, g.IndexTopK, g.IndexKPool})
	assert.Equal(t, 202752, g.MaxPositionEmbeddings, "the released context: summarization's 8000 + 1000 tokens and 128k prompts fit")
	var fp8Bytes int64
	for _, s := range g.WeightCatalog(true) {
		n := int64(s.DType.Size())
		for _, d := range s.Shape {
			n *= int64(d)
		}
		fp8Bytes += n
	}
	assert.InDelta(t, 41e9, float64(fp8Bytes), 2e9, "gpu in FP8 is about 41 GB")
}

func writeTiny(t *testing.T, opts Options) (string, *model.Config) {
	t.Helper()
	cfg, err := Preset("tiny")
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, Write(dir, cfg, opts))
	return dir, cfg
}

func TestTinyRoundTrip(t *testing.T) {
	dir, cfg := writeTiny(t, Options{Seed: 7})
	ck, err := model.Open(dir)
	require.NoError(t, err)
	defer ck.Close()
	require.NoError(t, ck.Validate())

	got := ck.Config()
	assert.Nil(t, got.Quant)
	want := cfg.Clone()
	want.Source = got.Source
	assert.Equal(t, want, got)
	var top map[string]any
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &top))
	assert.Equal(t, "glm5_next", top["model_type"])
	assert.Equal(t, []any{"Glm5NextForConditionalGeneration"}, top["architectures"])
	tc := top["text_config"].(map[string]any)
	assert.Equal(t, "glm5_next_text", tc["model_type"])
	for _, k := range []string{"layer_types", "mlp_layer_types", "indexer_types", "index_kpool", "hc_mult", "swiglu_limit"} {
		assert.Contains(t, tc, k)
	}

	// Exactly the catalog, with the catalog's dtypes; same names and shapes as the HF fixture.
	cat := cfg.WeightCatalog(false)
	var names []string
	for _, s := range cat {
		names = append(names, s.Name)
		info, ok := ck.Info(s.Name)
		require.True(t, ok)
		assert.Equal(t, s.DType, info.DType, s.Name)
		assert.Equal(t, s.Shape, info.Shape, s.Name)
	}
	slices.Sort(names)
	assert.Equal(t, names, ck.Names())
	fx, err := safetensors.Open(filepath.Join(fixtureDir, "model.safetensors"))
	require.NoError(t, err)
	defer fx.Close()
	var fxNames []string
	for _, n := range fx.Names() {
		if !strings.HasPrefix(n, "model.visual.") {
			fxNames = append(fxNames, n)
			fi, _ := fx.Info(n)
			ri, _ := ck.Info(n)
			assert.Equal(t, fi.Shape, ri.Shape, n)
		}
	}
	assert.Equal(t, fxNames, ck.Names())
}

func stats(v []float32) (mean, std float64) {
	for _, x := range v {
		mean += float64(x)
	}
	mean /= float64(len(v))
	for _, x := range v {
		std += (float64(x) - mean) * (float64(x) - mean)
	}
	return mean, math.Sqrt(std / float64(len(v)))
}

func TestInitialisation(t *testing.T) {
	dir, _ := writeTiny(t, Options{Seed: 3})
	ck, err := model.Open(dir)
	require.NoError(t, err)
	defer ck.Close()
	get := func(name string) []float32 {
		v, err := ck.Float32(name)
		require.NoError(t, err)
		return v
	}
	p := "model.language_model.layers.0."
	cases := []struct {
		name      string
		mean, std float64
	}{
		{model.EmbedName, 0, 1},
		{p + "self_attn.q_proj.weight", 0, 1.0 / 8},
		{p + "self_attn.f_b_proj.weight", 0, 1.0 / 4},
		{p + "mlp.down_proj.weight", 0, 1 / math.Sqrt(160)},
		{p + "hc_attn_fn", 0, 1.0 / 16},
		{p + "self_attn.q_conv1d.weight", 0, 0.5},
		{p + "self_attn.dt_bias", 0, 1},
		{model.LMHeadName, 0, 1.0 / 8},
		{model.FinalNormName, 1, 0.1},
		{"model.language_model.layers.3.mlp.experts.2.down_proj.weight", 0, 1 / math.Sqrt(32)},
		{"model.language_model.layers.3.self_attn.indexer.index_kpool_compress_ape", 0, 0.5},
	}
	for _, c := range cases {
		m, s := stats(get(c.name))
		assert.InDelta(t, c.mean, m, 0.15*max(c.std, 0.1)+0.05, c.name)
		assert.InDelta(t, c.std, s, 0.25*c.std, c.name)
	}
	for _, v := range get(p + "hc_ffn_scale") {
		assert.True(t, v >= 0.5 && v <= 1.5, v)
	}
	_, s := stats(get("model.language_model.layers.3.mlp.gate.e_score_correction_bias"))
	assert.Less(t, s, 0.15)
	// Every stored value is bf16-representable, F32 tensors included.
	for _, n := range ck.Names() {
		for _, v := range get(n) {
			require.Zero(t, math.Float32bits(v)&0xFFFF, n)
		}
	}
}

func TestFP8TinyParity(t *testing.T) {
	dir, cfg := writeTiny(t, Options{Seed: 11, FP8: true})
	ck, err := model.Open(dir)
	require.NoError(t, err)
	defer ck.Close()
	require.NoError(t, ck.Validate())
	q := ck.Config().Quant
	require.NotNil(t, q)
	assert.Equal(t, model.QuantConfig{Method: "fp8", Fmt: "e4m3", ActivationScheme: "dynamic", WeightBlockSize: [2]int{128, 128}}, *q)
	var top map[string]any
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &top))
	require.Contains(t, top, "quantization_config")
	assert.Equal(t, []any{128.0, 128.0}, top["quantization_config"].(map[string]any)["weight_block_size"])

	nFP8 := 0
	for _, s := range cfg.WeightCatalog(false) {
		dt, ok := ck.DType(s.Name)
		require.True(t, ok)
		if !s.FP8Eligible {
			assert.NotEqual(t, safetensors.F8E4M3, dt, s.Name)
			continue
		}
		nFP8++
		assert.Equal(t, safetensors.F8E4M3, dt, s.Name)
		sinfo, ok := ck.Info(s.Name + "_scale_inv")
		require.True(t, ok, s.Name)
		assert.Equal(t, safetensors.F32, sinfo.DType)
		assert.Equal(t, cfg.ScaleShape(s.Shape[0], s.Shape[1]), sinfo.Shape)
		sc, err := ck.Float32(s.Name + "_scale_inv")
		require.NoError(t, err)
		for _, v := range sc {
			frac, _ := math.Frexp(float64(v))
			assert.Equal(t, 0.5, frac, "scale %v of %s is a power of two", v, s.Name)
		}
	}
	assert.Equal(t, 152, nFP8)

	twin := t.TempDir()
	require.NoError(t, WriteDequantizedBF16(dir, twin))
	ck2, err := model.Open(twin)
	require.NoError(t, err)
	defer ck2.Close()
	require.NoError(t, ck2.Validate())
	assert.Nil(t, ck2.Config().Quant)
	for _, n := range ck2.Names() {
		assert.False(t, strings.HasSuffix(n, "_scale_inv"), n)
		dt, _ := ck2.DType(n)
		assert.NotEqual(t, safetensors.F8E4M3, dt, n)
	}
	// The FP8 checkpoint and its dequantized twin give the same float32 bits.
	for _, s := range cfg.WeightCatalog(false) {
		a, err := ck.Float32(s.Name, s.Shape...)
		require.NoError(t, err)
		b, err := ck2.Float32(s.Name, s.Shape...)
		require.NoError(t, err)
		for i := range a {
			require.Equal(t, math.Float32bits(a[i]), math.Float32bits(b[i]), "%s[%d]", s.Name, i)
		}
	}
	// FP8 values approximate the unquantized weights of the same seed.
	plain, _ := writeTiny(t, Options{Seed: 11})
	ck3, err := model.Open(plain)
	require.NoError(t, err)
	defer ck3.Close()
	name := "model.language_model.layers.3.self_attn.q_b_proj.weight"
	a, err := ck.Float32(name)
	require.NoError(t, err)
	ref, err := ck3.Float32(name)
	require.NoError(t, err)
	sc, err := ck.Float32(name + "_scale_inv")
	require.NoError(t, err)
	for i := range a {
		assert.InDelta(t, ref[i], a[i], 0.07*math.Abs(float64(ref[i]))+float64(sc[0])/512, "%s[%d]", name, i)
	}
	// Same non-FP8 tensors in both.
	x, _ := ck.Float32(model.EmbedName)
	y, _ := ck3.Float32(model.EmbedName)
	assert.Equal(t, y, x)

	require.ErrorContains(t, WriteDequantizedBF16(dir, dir), "must differ")
	require.Error(t, WriteDequantizedBF16(t.TempDir(), t.TempDir()))
}

func fileBytes(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	return b
}

func TestShardedWrite(t *testing.T) {
	cfg, err := Preset("tiny")
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, Write(dir, cfg, Options{Seed: 5, FP8: true, ShardBytes: 200 << 10}))
	shards, err := filepath.Glob(filepath.Join(dir, "model-*-of-*.safetensors"))
	require.NoError(t, err)
	require.Greater(t, len(shards), 2)
	assert.NoFileExists(t, filepath.Join(dir, "model.safetensors"))
	var idx struct {
		Metadata  map[string]any    `json:"metadata"`
		WeightMap map[string]string `json:"weight_map"`
	}
	require.NoError(t, json.Unmarshal(fileBytes(t, filepath.Join(dir, "model.safetensors.index.json")), &idx))
	assert.Len(t, idx.WeightMap, len(cfg.WeightCatalog(true)))
	for _, s := range cfg.WeightCatalog(false) {
		if s.FP8Eligible {
			assert.Equal(t, idx.WeightMap[s.Name], idx.WeightMap[s.Name+"_scale_inv"], "scale in the weight's shard")
		}
	}
	for _, p := range shards {
		st, err := os.Stat(p)
		require.NoError(t, err)
		assert.LessOrEqual(t, st.Size(), int64(200<<10)+64<<10, p) // data ≤ limit, plus header
	}
	ck, err := model.Open(dir)
	require.NoError(t, err)
	defer ck.Close()
	require.NoError(t, ck.Validate())

	single := t.TempDir()
	require.NoError(t, Write(single, cfg, Options{Seed: 5, FP8: true}))
	ck2, err := model.Open(single)
	require.NoError(t, err)
	defer ck2.Close()
	assert.Equal(t, ck2.Names(), ck.Names())
	for _, n := range ck.Names() {
		a, _, err := ck.Raw(n)
		require.NoError(t, err)
		b, _, err := ck2.Raw(n)
		require.NoError(t, err)
		require.Equal(t, b, a, n)
	}

	// Rewriting the directory unsharded removes the old shards and index.
	require.NoError(t, Write(dir, cfg, Options{Seed: 5}))
	left, _ := filepath.Glob(filepath.Join(dir, "model-*"))
	assert.Empty(t, left)
	assert.NoFileExists(t, filepath.Join(dir, "model.safetensors.index.json"))
	ck3, err := model.Open(dir)
	require.NoError(t, err)
	require.NoError(t, ck3.Validate())
	require.NoError(t, ck3.Close())
}

func TestDeterminism(t *testing.T) {
	a, _ := writeTiny(t, Options{Seed: 42, FP8: true})
	b, _ := writeTiny(t, Options{Seed: 42, FP8: true})
	prev := runtime.GOMAXPROCS(1)
	c, _ := writeTiny(t, Options{Seed: 42, FP8: true})
	runtime.GOMAXPROCS(prev)
	d, _ := writeTiny(t, Options{Seed: 43, FP8: true})
	fa := fileBytes(t, filepath.Join(a, "model.safetensors"))
	assert.True(t, bytes.Equal(fa, fileBytes(t, filepath.Join(b, "model.safetensors"))), "same seed, same bytes")
	assert.True(t, bytes.Equal(fa, fileBytes(t, filepath.Join(c, "model.safetensors"))), "independent of GOMAXPROCS")
	assert.False(t, bytes.Equal(fa, fileBytes(t, filepath.Join(d, "model.safetensors"))), "another seed differs")
	assert.Equal(t, fileBytes(t, filepath.Join(a, "config.json")), fileBytes(t, filepath.Join(d, "config.json")))
}

func TestLargeTensorChunks(t *testing.T) {
	// A tensor spanning several PCG chunks, generated in parallel and serially.
	g := &generator{seed: 9, block: [2]int{128, 128}}
	n := 3*chunkElems + 17
	a := make([]float32, n)
	g.fill("x.weight", []int{n / 17, 17}, a)
	prev := runtime.GOMAXPROCS(1)
	b := make([]float32, n)
	g.fill("x.weight", []int{n / 17, 17}, b)
	runtime.GOMAXPROCS(prev)
	assert.Equal(t, a, b)
	assert.NotEqual(t, a[:100], a[chunkElems:chunkElems+100], "chunks draw different streams")
}

func TestWriteErrors(t *testing.T) {
	assert.ErrorContains(t, Write(t.TempDir(), nil, Options{}), "nil config")
	cfg, err := Preset("tiny")
	require.NoError(t, err)
	cfg.IndexKPool = 3
	err = Write(t.TempDir(), cfg, Options{})
	assert.ErrorContains(t, err, "index_topk (16) must be a multiple of index_kpool (3)")
	cfg.IndexKPool = 4
	f := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(f, nil, 0o644))
	assert.Error(t, Write(filepath.Join(f, "sub"), cfg, Options{}))
}

func TestPow2ScaleAndQuantize(t *testing.T) {
	assert.Equal(t, float32(1), pow2Scale(448))
	assert.Equal(t, float32(2), pow2Scale(449))
	assert.Equal(t, float32(0.5), pow2Scale(224))
	assert.Equal(t, float32(1), pow2Scale(224.5))
	assert.Equal(t, float32(1), pow2Scale(0))
	assert.Equal(t, float32(math.Ldexp(1, -8)), pow2Scale(1.75))
	for _, a := range []float32{1e-3, 0.02, 0.37, 1, 3.3, 1e4} {
		p := pow2Scale(a)
		assert.LessOrEqual(t, a/p, float32(448))
		assert.Greater(t, a/(p/2), float32(448))
	}
	// Partial blocks: [130, 3] with 128×2 blocks.
	vals := make([]float32, 130*3)
	for i := range vals {
		vals[i] = float32(i%7-3) * float32(i+1) / 100
	}
	codes, sb := quantize(vals, 130, 3, [2]int{128, 2})
	sc := make([]float32, 4)
	require.NoError(t, safetensors.ToFloat32(safetensors.F32, sb, sc))
	for r := 0; r < 130; r++ {
		for c := 0; c < 3; c++ {
			s := sc[(r/128)*2+c/2]
			deq := safetensors.F8E4M3ToFloat32(codes[r*3+c]) * s
			v := vals[r*3+c]
			assert.InDelta(t, v, deq, 0.0625*math.Abs(float64(v))+float64(s)/512)
			assert.Equal(t, deq, safetensors.BF16ToFloat32(safetensors.Float32ToBF16(deq)), "bf16-representable")
		}
	}
}

// The -mtp presets write the MTP layer beside the very same trunk: same
// tensor bytes for a seed, in the BF16 and the FP8 layouts; the MTP layer is
// initialised like the trunk's DSA and MoE layers.
func TestMTPPresetCheckpoint(t *testing.T) {
	for _, fp8 := range []bool{false, true} {
		base, _ := writeTiny(t, Options{Seed: 7, FP8: fp8})
		cfg, err := Preset("tiny-mtp")
		require.NoError(t, err)
		dir := t.TempDir()
		require.NoError(t, Write(dir, cfg, Options{Seed: 7, FP8: fp8}))
		ck, err := model.Open(dir)
		require.NoError(t, err)
		defer ck.Close()
		require.NoError(t, ck.Validate())
		require.NoError(t, ck.ValidateMTP())
		assert.Equal(t, 1, ck.Config().NumNextNPredictLayers)
		ckb, err := model.Open(base)
		require.NoError(t, err)
		defer ckb.Close()
		require.Error(t, ckb.ValidateMTP())
		for _, n := range ckb.Names() {
			a, _, err := ckb.Raw(n)
			require.NoError(t, err)
			b, _, err := ck.Raw(n)
			require.NoError(t, err)
			require.Equal(t, a, b, "trunk tensor %s", n)
		}
		mtp := cfg.MTPWeightCatalog(fp8)
		assert.Len(t, ck.Names(), len(ckb.Names())+len(mtp))
		nFP8 := 0
		for _, s := range mtp {
			info, ok := ck.Info(s.Name)
			require.True(t, ok, s.Name)
			assert.Equal(t, s.DType, info.DType, s.Name)
			assert.Equal(t, s.Shape, info.Shape, s.Name)
			if s.DType == safetensors.F8E4M3 {
				nFP8++
			}
		}
		if fp8 {
			assert.Equal(t, 4+3*8+3, nFP8)
		} else {
			assert.Zero(t, nFP8)
		}
		p := model.LayerPrefix(8) + "."
		for _, c := range []struct {
			name      string
			mean, std float64
		}{
			{p + "eh_proj.weight", 0, 1 / math.Sqrt(128)},
			{p + "enorm.weight", 1, 0.1},
			{p + "shared_head.norm.weight", 1, 0.1},
			{p + "self_attn.indexer.index_kpool_compress_ape", 0, 0.5},
		} {
			v, err := ck.Float32(c.name)
			require.NoError(t, err)
			m, s := stats(v)
			assert.InDelta(t, c.mean, m, 0.15*max(c.std, 0.1)+0.05, c.name)
			assert.InDelta(t, c.std, s, 0.25*c.std, c.name)
		}
	}
}

// PresetWith sets text_config fields of a preset (a scaled variant) and
// refuses unknown fields, non-JSON values and invalid results.
func TestPresetWith(t *testing.T) {
	c, err := PresetWith("gpu", map[string]json.RawMessage{"n_routed_experts": json.RawMessage("16"), "num_hidden_layers": json.RawMessage("4")})
	require.NoError(t, err)
	assert.Equal(t, 16, c.NRoutedExperts)
	assert.Equal(t, 4, c.NumHiddenLayers)
	assert.Equal(t, 4096, c.HiddenSize, "the rest stays the preset's")
	_, err = PresetWith("gpu", map[string]json.RawMessage{"nope": json.RawMessage("1")})
	assert.ErrorContains(t, err, "--set nope: not a text_config field")
	_, err = PresetWith("gpu", map[string]json.RawMessage{"hidden_size": json.RawMessage("x")})
	assert.ErrorContains(t, err, "--set hidden_size: the value is not JSON")
	_, err = PresetWith("gpu", map[string]json.RawMessage{"num_experts_per_tok": json.RawMessage("400")})
	assert.Error(t, err, "more experts per token than experts does not validate")
}
