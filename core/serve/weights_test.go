package serve

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/glmflash/glmflash/model"
	"github.com/glmflash/glmflash/model/safetensors"
	pb "github.com/glmflash/glmflash/proto/glmflash/v1"
)

// A guarded checkpoint truncated under a serving server (issue 37, class
// 4): the next request fails with the reason, the process lives, and
// health turns NOT_SERVING and stays so (a load balancer stops sending
// here), where it said SERVING before.
func TestRefusedWeightsTurnHealthNotServing(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"config.json", "model.safetensors"} {
		b, err := os.ReadFile(filepath.Join(fixture, f))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, f), b, 0o644))
	}
	h := start(t, setup{opts: func(o *Options) {
		o.Load = func(context.Context) (*LoadedModel, error) {
			ck, err := model.OpenWith(dir, model.OpenOptions{Weights: safetensors.Guarded})
			if err != nil {
				return nil, err
			}
			return &LoadedModel{Config: ck.Config(), Weights: ck, Source: dir, Close: ck.Close}, nil
		}
	}})
	hc := healthpb.NewHealthClient(h.conn)
	status := func() healthpb.HealthCheckResponse_ServingStatus {
		resp, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: ServiceName})
		require.NoError(t, err)
		return resp.Status
	}
	req := &pb.GenerateRequest{PromptIds: prompt(3, 1), MaxTokens: ptr(uint32(2))}
	r, err := generate(context.Background(), h.client, req)
	require.NoError(t, err)
	require.Equal(t, pb.FinishReason_FINISH_REASON_LENGTH, r.finish.Reason)
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, status())

	require.NoError(t, os.Truncate(filepath.Join(dir, "model.safetensors"), 0))
	r, err = generate(context.Background(), h.client, req)
	require.NoError(t, err)
	require.Equal(t, pb.FinishReason_FINISH_REASON_ERROR, r.finish.Reason)
	require.Contains(t, r.finish.Message, "model.safetensors")
	require.Equal(t, healthpb.HealthCheckResponse_NOT_SERVING, status())
	_, err = generate(context.Background(), h.client, req)
	require.NoError(t, err)
	require.Equal(t, healthpb.HealthCheckResponse_NOT_SERVING, status(), "and stays so")
}
