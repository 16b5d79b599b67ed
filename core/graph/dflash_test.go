package graph

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/model"
	"github.com/glmflash/glmflash/model/randckpt"
	"github.com/stretchr/testify/require"
)

func tinyDrafter(t *testing.T, cfg *model.Config) *model.DFlashConfig {
	t.Helper()
	d, err := randckpt.DFlashPreset("tiny-dflash", cfg)
	require.NoError(t, err)
	return d
}

// The DFlash draft graph (golden IR): fc + hidden_norm over the context
// rows (dimension C), the block's embeddings through the trunk's table,
// per draft layer q/k/v of the block and k/v of the context into
// dflash_attn, o_proj, the SwiGLU MLP, the final norm and the trunk's
// lm_head on span rows; typed as a DFlash graph, with its tensors under
// DFlashPrefix but the embedding and head the trunk's.
func TestGoldenDFlashGraph(t *testing.T) {
	cfg := fixtureConfig(t, "glm5next-tiny-a")
	d := tinyDrafter(t, cfg)
	g, err := BuildDFlash(cfg, d, Options{})
	require.NoError(t, err)
	require.True(t, g.DFlash())
	_, mtp := g.MTPLayer()
	require.False(t, mtp)
	require.Equal(t, []int{ir.DimC, 2 * 64}, g.Input(ir.InputContext).Shape)
	require.Equal(t, []int{ir.DimR, cfg.VocabSize}, g.Outputs[ir.OutputLogits].Shape)
	attn := 0
	for _, n := range g.Nodes {
		if n.Op == ir.OpDFlashAttn {
			require.Equal(t, attn, n.Layer)
			attn++
		}
	}
	require.Equal(t, d.NumHiddenLayers, attn)
	refs := map[string]bool{}
	for _, w := range g.Weights {
		refs[w.Ref] = true
	}
	require.True(t, refs[model.EmbedName] && refs[model.LMHeadName] && refs[DFlashPrefix+"fc.weight"] && refs[DFlashPrefix+"layers.1.self_attn.k_norm.weight"])
	require.Len(t, refs, 2+len(d.WeightCatalog()))
	path := filepath.Join("testdata", "tiny-a.dflash.golden")
	if *update {
		require.NoError(t, os.WriteFile(path, []byte(g.StableText()), 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, string(want), g.StableText())

	_, err = BuildDFlash(cfg, d, Options{Logits: LastLogits})
	require.ErrorContains(t, err, "span logits")
	bad := *d
	bad.HiddenSize = 48
	_, err = BuildDFlash(cfg, &bad, Options{})
	require.ErrorContains(t, err, "hidden_size 48 is not the target's 64")
}

// With TargetLayers the trunk graph outputs, for every token, the mean of
// the residual streams after each target layer, concatenated in the given
// order; a layer outside the trunk is refused.
func TestTargetHiddenCapture(t *testing.T) {
	cfg := fixtureConfig(t, "glm5next-tiny-a")
	g, err := Build(cfg, Options{Mode: Verify, TargetLayers: []int{5, 1}})
	require.NoError(t, err)
	out := g.Outputs[ir.OutputTargetHidden]
	require.Equal(t, []int{ir.DimT, 2 * cfg.HiddenSize}, out.Shape)
	require.Equal(t, ir.OpConcatCols, out.Producer.Op)
	var layers []int
	for _, in := range out.Producer.Inputs {
		require.Equal(t, ir.OpStreamMean, in.Producer.Op)
		src := in.Producer.Inputs[0]
		require.Equal(t, ir.OpMHCPost, src.Producer.Op)
		require.Equal(t, "ffn", ir.AttrSite.Get(src.Producer), "the layer's output streams")
		layers = append(layers, src.Producer.Layer)
	}
	require.Equal(t, []int{5, 1}, layers)
	_, err = Build(cfg, Options{TargetLayers: []int{8}})
	require.ErrorContains(t, err, "target layer 8 (entry 0) is outside the trunk's decoder layers [0, 8)")
}
