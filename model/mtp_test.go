package model

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/glmflash/glmflash/model/safetensors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func mtpConfig(t *testing.T) *Config {
	t.Helper()
	c := fixtureConfig(t).Clone()
	c.NumNextNPredictLayers = 1
	require.NoError(t, c.Validate())
	return c
}

// The MTP layer is layer num_hidden_layers: a DSA + MoE layer with its own
// indexer, outside the per-layer lists.
func TestMTPLayerKinds(t *testing.T) {
	c := fixtureConfig(t)
	assert.False(t, c.HasMTP())
	assert.Empty(t, c.MTPLayers())
	assert.Empty(t, c.MTPWeightCatalog(true))
	assert.False(t, c.IsDSA(8) || c.IsMoE(8) || c.IsMTP(8))

	c = mtpConfig(t)
	assert.True(t, c.HasMTP())
	assert.Equal(t, 8, c.MTPLayer(0))
	assert.Equal(t, []int{8}, c.MTPLayers())
	assert.Equal(t, []int{0, 1, 2, 3, 4, 5, 6, 7}, c.TrunkLayers())
	assert.True(t, c.IsMTP(8) && c.IsDSA(8) && c.IsMoE(8) && c.HasOwnIndexer(8))
	assert.False(t, c.IsKDA(8))
	assert.Equal(t, 8, c.IndexerSource(8))
	assert.False(t, c.IsMTP(7) || c.IsMTP(9) || c.IsMTP(-1))
	assert.True(t, c.IsDSA(7) && !c.IsDSA(9) && !c.IsMoE(9))
	// the trunk catalog does not change
	assert.Equal(t, fixtureConfig(t).WeightCatalog(true), c.WeightCatalog(true))
}

// The MTP catalog is the released layer-45 list (architecture §2.1) at
// layer num_hidden_layers: the trunk's DSA and MoE tensors of a layer with
// its own indexer, plus enorm, hnorm, eh_proj and shared_head.norm, and no
// mHC, embedding or lm_head.
func TestMTPWeightCatalog(t *testing.T) {
	c := mtpConfig(t)
	D := c.HiddenSize
	byName := func(specs []WeightSpec) map[string]WeightSpec {
		m := map[string]WeightSpec{}
		for _, s := range specs {
			m[s.Name] = s
		}
		return m
	}
	mtp := byName(c.MTPWeightCatalog(false))
	want := map[string]WeightSpec{}
	for _, s := range c.WeightCatalog(false) { // layer 7: DSA with a full indexer, MoE
		if rest, ok := strings.CutPrefix(s.Name, LayerPrefix(7)+"."); ok && !strings.HasPrefix(rest, "hc_") {
			s.Name = LayerPrefix(8) + "." + rest
			want[s.Name] = s
		}
	}
	require.Contains(t, want, LayerPrefix(8)+".self_attn.indexer.wk.weight")
	for _, n := range []string{"enorm.weight", "hnorm.weight", "shared_head.norm.weight"} {
		want[LayerPrefix(8)+"."+n] = WeightSpec{Name: LayerPrefix(8) + "." + n, Shape: []int{D}, DType: safetensors.BF16}
	}
	want[LayerPrefix(8)+".eh_proj.weight"] = WeightSpec{Name: LayerPrefix(8) + ".eh_proj.weight", Shape: []int{D, 2 * D}, DType: safetensors.BF16}
	assert.Equal(t, want, mtp)

	// FP8: the same module kinds as the trunk's FP8 layout.
	var fp8 []string
	for _, s := range c.MTPWeightCatalog(true) {
		if s.DType == safetensors.F8E4M3 {
			fp8 = append(fp8, strings.TrimPrefix(s.Name, LayerPrefix(8)+"."))
		}
	}
	assert.Len(t, fp8, 4+3*c.NRoutedExperts+3)
	for _, n := range []string{"self_attn.q_a_proj.weight", "self_attn.q_b_proj.weight", "self_attn.kv_a_proj_with_mqa.weight",
		"self_attn.o_proj.weight", "mlp.experts.5.down_proj.weight", "mlp.shared_experts.up_proj.weight"} {
		assert.Contains(t, fp8, n)
	}
	assert.NotContains(t, fp8, "eh_proj.weight")
	assert.NotContains(t, fp8, "self_attn.kv_b_proj.weight")

	// Two MTP layers: layers 8 and 9.
	c.NumNextNPredictLayers = 2
	require.NoError(t, c.Validate())
	assert.Len(t, c.MTPWeightCatalog(false), 2*len(mtp))
	assert.True(t, c.IsMTP(9))
}

func TestMTPConfigValidation(t *testing.T) {
	c := fixtureConfig(t).Clone()
	c.NumNextNPredictLayers = MaxLayers
	assert.ErrorContains(t, c.Validate(), "num_hidden_layers + num_nextn_predict_layers (4104) must be at most 4096")
	// the MTP layer is MoE: the expert sizes must be valid even with dense trunk layers only
	c = fixtureConfig(t).Clone()
	for i := range c.MLPLayerTypes {
		c.MLPLayerTypes[i] = MLPDense
	}
	c.MoEIntermediateSize = 0
	require.NoError(t, c.Validate())
	c.NumNextNPredictLayers = 1
	assert.ErrorContains(t, c.Validate(), "moe_intermediate_size (0) must be positive")
}

// A checkpoint whose config declares the MTP layer validates its trunk
// without layer 8's tensors; ValidateMTP needs them all.
func TestValidateMTP(t *testing.T) {
	ck, err := Open(fixtureDir)
	require.NoError(t, err)
	assert.ErrorContains(t, ck.ValidateMTP(), "declares no MTP layer (num_nextn_predict_layers is 0)")
	ck.Close()

	var cfg map[string]any
	require.NoError(t, json.Unmarshal(fixtureConfigJSON(t), &cfg))
	cfg["text_config"].(map[string]any)["num_nextn_predict_layers"] = 1
	cfgJSON, err := json.Marshal(cfg)
	require.NoError(t, err)
	trunk := fixtureTensors(t)
	dir := writeCheckpoint(t, cfgJSON, trunk)
	ck, err = Open(dir)
	require.NoError(t, err)
	require.NoError(t, ck.Validate())
	err = ck.ValidateMTP()
	assert.ErrorContains(t, err, "MTP layer 8: tensor model.language_model.layers.8.enorm.weight: missing from checkpoint")
	ck.Close()

	c := mtpConfig(t)
	var mtp []safetensors.WriteTensor
	for _, s := range c.MTPWeightCatalog(false) {
		n := 1
		for _, d := range s.Shape {
			n *= d
		}
		shape := slices.Clone(s.Shape)
		if s.Name == LayerPrefix(8)+".eh_proj.weight" {
			shape = []int{c.HiddenSize, c.HiddenSize} // wrong: the concatenation is 2·hidden wide
			n /= 2
		}
		mtp = append(mtp, safetensors.WriteTensor{Name: s.Name, DType: s.DType, Shape: shape, Data: make([]byte, n*s.DType.Size())})
	}
	dir = writeCheckpoint(t, cfgJSON, append(slices.Clone(trunk), mtp...))
	ck, err = Open(dir)
	require.NoError(t, err)
	assert.ErrorContains(t, ck.ValidateMTP(), "tensor model.language_model.layers.8.eh_proj.weight: shape [64 64], want [64 128]")
	ck.Close()

	for i := range mtp {
		if mtp[i].Name == LayerPrefix(8)+".eh_proj.weight" {
			mtp[i].Shape, mtp[i].Data = []int{64, 128}, make([]byte, 64*128*2)
		}
	}
	dir = writeCheckpoint(t, cfgJSON, append(slices.Clone(trunk), mtp...))
	ck, err = Open(dir)
	require.NoError(t, err)
	defer ck.Close()
	require.NoError(t, ck.ValidateMTP())
	require.NoError(t, ck.Validate())
}
