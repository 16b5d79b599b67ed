package serve

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/openai"
	"github.com/glmflash/glmflash/core/speculative"
	"github.com/glmflash/glmflash/internal/syncbuf"
	pb "github.com/glmflash/glmflash/proto/glmflash/v1"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// A server with speculative.simulate_acceptance says so in every output: the
// Finish message's speculative statistics, GetModelInfo's engine
// speculative setting, the glmflash_spec_simulated_acceptance gauge, the
// HTTP response's header and usage, and the request-finished log line. The
// drafts (a token the model never picks here) are accepted at about the
// rate, so the outputs differ from the plain server's. Without the setting
// nothing says "simulated" and the gauge is 0.
func TestServeSimulatedAcceptance(t *testing.T) {
	const rate = 0.75
	constant := func(_ *engine.Engine, sp config.Speculative) (speculative.Drafter, error) {
		return speculative.NewScripted("const", sp.Steps(), func(_ speculative.History, max int) ([]int32, []speculative.Dist) {
			d := make([]int32, max)
			for i := range d {
				d[i] = 5
			}
			return d, nil
		})
	}
	var reqs []*pb.GenerateRequest
	for i := range 3 {
		reqs = append(reqs, &pb.GenerateRequest{PromptIds: prompt(5+3*i, i+1), MaxTokens: ptr(uint32(40)), Sampling: greedy(), IgnoreEos: true})
	}
	for _, sim := range []float64{0, rate} {
		logs := &syncbuf.Buffer{}
		su := specSetup(config.Speculative{Method: "mtp", NumSteps: 3, SimulateAcceptance: sim}, constant)
		su.opts = func(o *Options) { o.Load, o.Drafter, o.Log = mtpLoader, constant, zerolog.New(logs) }
		h := start(t, su)
		got := generateAll(t, h.client, reqs)
		var accepted, drafted uint32
		for i, r := range got {
			s := r.finish.Speculative
			require.NotNil(t, s, "request %d", i)
			require.Equal(t, sim, s.SimulatedAcceptance, "request %d", i)
			accepted, drafted = accepted+s.AcceptedTokens, drafted+s.DraftTokens
		}
		info, err := h.client.GetModelInfo(context.Background(), &pb.GetModelInfoRequest{})
		require.NoError(t, err)
		require.Equal(t, sim, scrape(t, h.srv, "glmflash_spec_simulated_acceptance"))
		ids, _ := json.Marshal(reqs[0].PromptIds)
		resp, body := call(t, http.DefaultClient, "POST", "http://"+h.srv.HTTPAddr()+"/v1/completions", "", `{"prompt":`+string(ids)+`,"max_tokens":12,"temperature":0}`)
		require.Equal(t, 200, resp.StatusCode, body)
		var out struct {
			Usage struct {
				Details map[string]any `json:"completion_tokens_details"`
			} `json:"usage"`
		}
		require.NoError(t, json.Unmarshal([]byte(body), &out))
		require.NotNil(t, out.Usage.Details, body)
		if sim == 0 {
			require.Equal(t, "mtp 3-1-4", info.GetEngine().GetSpeculative())
			require.Empty(t, resp.Header.Get(openai.SimulatedAcceptanceHeader))
			require.NotContains(t, out.Usage.Details, "simulated_acceptance")
			require.NotContains(t, logs.String(), "simulated")
			require.Zero(t, accepted, "the model never picks the drafted token here")
			continue
		}
		require.Equal(t, fmt.Sprintf("mtp 3-1-4, simulated acceptance %g", rate), info.GetEngine().GetSpeculative())
		require.Equal(t, "0.75", resp.Header.Get(openai.SimulatedAcceptanceHeader))
		require.Equal(t, rate, out.Usage.Details["simulated_acceptance"], body)
		require.Equal(t, len(reqs)+1, strings.Count(logs.String(), `"spec_simulated_acceptance":0.75`), logs.String())
		require.Contains(t, logs.String(), "speculative acceptance is SIMULATED")
		require.Greater(t, float64(accepted)/float64(drafted), 0.3, "drafts the model never picks, accepted by the chain")
	}
}
