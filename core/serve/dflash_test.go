package serve

import (
	"context"
	"slices"
	"testing"

	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/model"
	"github.com/glmflash/glmflash/model/randckpt"
	pb "github.com/glmflash/glmflash/proto/glmflash/v1"
	"github.com/stretchr/testify/require"
)

// Serving with speculative.method dflash: the server opens
// speculative.draft_model, compiles the draft and the capturing verify
// programs before serving, and greedy requests get a plain server's
// tokens with every Finish reporting its verify steps; GetModelInfo names
// the drafter. A drafter that does not fit the model is refused at load
// naming speculative.draft_model.
func TestServeDFlash(t *testing.T) {
	ck, err := model.Open(mtpFixture)
	require.NoError(t, err)
	cfg := ck.Config()
	ck.Close()
	d, err := randckpt.DFlashPreset("tiny-dflash", cfg)
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, randckpt.WriteDFlash(dir, d, randckpt.Options{Seed: 2}))
	var reqs []*pb.GenerateRequest
	for i := range 3 {
		reqs = append(reqs, &pb.GenerateRequest{PromptIds: prompt(5+6*i, i+1), MaxTokens: ptr(uint32(10 + 2*i)), Sampling: greedy(), IgnoreEos: true})
	}
	plain := generateAll(t, start(t, specSetup(config.Speculative{Method: "off"}, nil)).client, reqs)
	h := start(t, specSetup(config.Speculative{Method: "dflash", DraftModel: dir}, nil))
	got := generateAll(t, h.client, reqs)
	for i, r := range got {
		require.Equal(t, plain[i].tokens, r.tokens, "request %d", i)
		require.NotNil(t, r.finish.Speculative, "request %d", i)
		require.Positive(t, r.finish.Speculative.VerifySteps)
	}
	info, err := h.client.GetModelInfo(context.Background(), &pb.GetModelInfoRequest{})
	require.NoError(t, err)
	require.Contains(t, info.GetEngine().GetSpeculative(), "dflash ")
	require.False(t, info.GetEngine().GetSpeculativeIndexShare(), "index sharing is the MTP drafter's")
	var keys []string
	for k := range h.srv.Engine().Programs() {
		keys = append(keys, k.String())
	}
	for _, k := range []string{"dflash:extend/spans", "verify/spans+target"} {
		require.True(t, slices.Contains(keys, k), "program %s compiled before serving (have %v)", k, keys)
	}

	other := *d
	other.HiddenSize = 48
	bad := t.TempDir()
	require.NoError(t, randckpt.WriteDFlash(bad, &other, randckpt.Options{Seed: 2}))
	c := config.Default()
	c.Model.Dir, c.Model.Preset = mtpFixture, ""
	c.Runtime.Slots = 2
	c.Speculative = config.Speculative{Method: "dflash", DraftModel: bad}
	srv, err := New(c, Options{Load: mtpLoader})
	require.NoError(t, err)
	err = srv.load(context.Background())
	require.ErrorContains(t, err, "speculative.draft_model")
	require.ErrorContains(t, err, "hidden_size 48 is not the target's 64")
}
