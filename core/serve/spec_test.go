package serve

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/speculative"
	"github.com/glmflash/glmflash/model"
	pb "github.com/glmflash/glmflash/proto/glmflash/v1"
	"github.com/stretchr/testify/require"
)

const mtpFixture = "../../testdata/glm5next-tiny-mtp/checkpoint"

func mtpLoader(context.Context) (*LoadedModel, error) {
	ck, err := model.Open(mtpFixture)
	if err != nil {
		return nil, err
	}
	return &LoadedModel{Config: ck.Config(), Weights: ck, Source: mtpFixture, Close: ck.Close}, nil
}

// specSetup serves the MTP fixture with speculative decoding as sp says
// (method off: plainly), through drafter when it is set.
func specSetup(sp config.Speculative, drafter func(*engine.Engine, config.Speculative) (speculative.Drafter, error)) setup {
	return setup{
		rt:   config.Runtime{Slots: 4, PrefillChunk: 8, MaxBatchTokens: 64},
		opts: func(o *Options) { o.Load, o.Drafter = mtpLoader, drafter },
		cfg:  func(c *config.Config) { c.Speculative = sp },
	}
}

// generateAll runs reqs at once and returns their results in order.
func generateAll(t *testing.T, c pb.GLMFlashClient, reqs []*pb.GenerateRequest) []*result {
	t.Helper()
	out := make([]*result, len(reqs))
	var wg sync.WaitGroup
	for i, r := range reqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := generate(context.Background(), c, r)
			if err != nil {
				t.Error(err)
				return
			}
			out[i] = res
		}()
	}
	wg.Wait()
	require.False(t, t.Failed())
	return out
}

// Serving with speculative decoding: greedy requests get exactly the tokens
// of a plain server, with the MTP drafter (speculative: mtp 5-1-6) and with
// a scripted drafter that proposes the truth with wrong tokens at a fixed
// rate; every Finish message reports its request's drafts and accepted
// drafts (none for a request that opts out), the metrics count the same
// (glmflash_spec_draft_tokens_total, glmflash_spec_accepted_tokens_total,
// the acceptance-length histogram), GetModelInfo names the setting, and
// the HTTP API reports the drafts in usage.completion_tokens_details.
func TestServeSpeculative(t *testing.T) {
	var reqs []*pb.GenerateRequest
	for i := range 5 {
		reqs = append(reqs, &pb.GenerateRequest{PromptIds: prompt(4+7*i, i+1), MaxTokens: ptr(uint32(12 + 3*i)), Sampling: greedy(), IgnoreEos: true,
			DisableSpeculation: i == 2})
	}
	plainSrv := start(t, specSetup(config.Speculative{Method: "off"}, nil))
	plain := generateAll(t, plainSrv.client, reqs)
	for _, r := range plain {
		require.Nil(t, r.finish.Speculative)
	}
	truth := map[string][]int32{}
	for i, r := range reqs {
		truth[fmt.Sprint(r.PromptIds)] = plain[i].tokens
	}
	oracle := func(_ *engine.Engine, sp config.Speculative) (speculative.Drafter, error) {
		return speculative.NewScripted("oracle", sp.Steps(), speculative.Oracle(func(p []int32) []int32 { return truth[fmt.Sprint(p)] }, speculative.WrongRate(0.7, 1), 256))
	}
	for name, su := range map[string]setup{
		"mtp":    specSetup(config.Speculative{Method: "mtp", Preset: "5-1-6"}, nil),
		"oracle": specSetup(config.Speculative{Method: "mtp", NumSteps: 3}, oracle),
	} {
		t.Run(name, func(t *testing.T) {
			h := start(t, su)
			got := generateAll(t, h.client, reqs)
			var drafted, accepted, steps uint32
			for i, r := range got {
				require.Equal(t, plain[i].tokens, r.tokens, "request %d", i)
				s := r.finish.Speculative
				if reqs[i].DisableSpeculation {
					require.Nil(t, s, "request %d opted out", i)
					continue
				}
				require.NotNil(t, s, "request %d", i)
				require.Positive(t, s.VerifySteps)
				require.LessOrEqual(t, s.AcceptedTokens, s.DraftTokens)
				require.InDelta(t, float64(s.AcceptedTokens+s.VerifySteps)/float64(s.VerifySteps), s.AcceptanceLength, 1e-9)
				drafted, accepted, steps = drafted+s.DraftTokens, accepted+s.AcceptedTokens, steps+s.VerifySteps
			}
			if name == "oracle" {
				require.Positive(t, accepted)
				require.Less(t, accepted, drafted)
			}
			require.Equal(t, float64(drafted), scrape(t, h.srv, "glmflash_spec_draft_tokens_total"))
			require.Equal(t, float64(accepted), scrape(t, h.srv, "glmflash_spec_accepted_tokens_total"))
			require.Equal(t, float64(steps), scrape(t, h.srv, "glmflash_spec_verify_steps_total"))
			require.Equal(t, float64(steps), scrape(t, h.srv, "glmflash_spec_acceptance_length_count"))
			require.Equal(t, float64(accepted+steps), scrape(t, h.srv, "glmflash_spec_acceptance_length_sum"))
			info, err := h.client.GetModelInfo(context.Background(), &pb.GetModelInfoRequest{})
			require.NoError(t, err)
			want := map[string]string{"mtp": "mtp 5-1-6", "oracle": "mtp 3-1-4"}[name]
			require.Equal(t, want, info.GetEngine().GetSpeculative())
			require.True(t, info.GetEngine().GetSpeculativeIndexShare(), "the fixture's config keeps index_share_for_mtp_iteration's default")
			if name == "mtp" { // the MTP programs were compiled before serving
				progs := h.srv.Engine().Programs()
				for _, k := range []string{"mtp:extend/last+share4", "mtp:verify/last+share4", "mtp:decode/last+share4", "verify/spans+final"} {
					found := false
					for key := range progs {
						found = found || key.String() == k
					}
					require.True(t, found, "program %s", k)
				}
			}
			// the HTTP API
			ids, _ := json.Marshal(reqs[0].PromptIds)
			resp, body := call(t, http.DefaultClient, "POST", "http://"+h.srv.HTTPAddr()+"/v1/completions", "", `{"prompt":`+string(ids)+`,"max_tokens":12,"temperature":0}`)
			require.Equal(t, 200, resp.StatusCode, body)
			var out struct {
				Usage struct {
					CompletionTokens int `json:"completion_tokens"`
					Details          *struct {
						Accepted int `json:"accepted_prediction_tokens"`
						Rejected int `json:"rejected_prediction_tokens"`
					} `json:"completion_tokens_details"`
				} `json:"usage"`
			}
			require.NoError(t, json.Unmarshal([]byte(body), &out))
			require.NotNil(t, out.Usage.Details, body)
			require.GreaterOrEqual(t, out.Usage.Details.Accepted+out.Usage.Details.Rejected, 1)
		})
	}
}

// Speculation on a checkpoint without an MTP layer is refused at load,
// naming the key.
func TestServeSpeculativeNeedsMTP(t *testing.T) {
	cfg := config.Default()
	cfg.Model.Dir, cfg.Model.Preset = fixture, ""
	cfg.Server.GRPCAddr, cfg.Server.MetricsAddr, cfg.Server.HTTPAddr = "127.0.0.1:0", "", ""
	cfg.Speculative = config.Speculative{Method: "mtp", Preset: "1-1-2"}
	srv, err := New(cfg, Options{Load: fixtureLoader(nil)})
	require.NoError(t, err)
	require.NoError(t, srv.Listen())
	err = srv.Serve(context.Background())
	require.Error(t, err)
	require.True(t, strings.Contains(err.Error(), "speculative.method") && strings.Contains(err.Error(), "num_nextn_predict_layers is 0"), err.Error())
}
