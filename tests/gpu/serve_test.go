package gpu

import (
	"context"
	"io"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/serve"
	"github.com/glmflash/glmflash/model"
	pb "github.com/glmflash/glmflash/proto/glmflash/v1"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// serveCUDA starts `glmflash serve`'s server in process on the CUDA
// backend (the fixture, 4 slots) and returns a client.
func serveCUDA(t *testing.T) (*serve.Server, pb.GLMFlashClient) {
	t.Helper()
	cudaOptions(t, engine.Options{})
	dir := filepath.Join("..", "..", "testdata", fixtures[0], "checkpoint")
	cfg := config.Default()
	cfg.Model.Dir, cfg.Model.Preset = dir, ""
	cfg.Device = "cuda"
	cfg.Server.GRPCAddr, cfg.Server.MetricsAddr, cfg.Server.HTTPAddr = "127.0.0.1:0", "", ""
	cfg.Server.DrainTimeout = 10 * time.Second
	cfg.Runtime.Slots = 4
	srv, err := serve.New(cfg, serve.Options{
		Load: func(context.Context) (*serve.LoadedModel, error) {
			ck, err := model.Open(dir)
			if err != nil {
				return nil, err
			}
			return &serve.LoadedModel{Config: ck.Config(), Weights: ck, Source: dir, Close: ck.Close}, nil
		},
		Engine: func(o *engine.Options) { o.Device = "cuda" },
	})
	require.NoError(t, err)
	require.NoError(t, srv.Listen())
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	select {
	case <-srv.Ready():
	case err := <-done:
		t.Fatalf("server stopped: %v", err)
	}
	conn, err := grpc.NewClient(srv.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() {
		stop()
		require.NoError(t, <-done)
		conn.Close()
	})
	return srv, pb.NewGLMFlashClient(conn)
}

func ptr[T any](v T) *T { return &v }

func stream(ctx context.Context, c pb.GLMFlashClient, req *pb.GenerateRequest) ([]int32, *pb.Finish, error) {
	st, err := c.Generate(ctx, req)
	if err != nil {
		return nil, nil, err
	}
	var toks []int32
	for {
		m, err := st.Recv()
		if err == io.EOF {
			return toks, nil, nil
		}
		if err != nil {
			return toks, nil, err
		}
		if tk := m.GetToken(); tk != nil {
			toks = append(toks, tk.Id)
		}
		if f := m.GetFinish(); f != nil {
			return toks, f, nil
		}
	}
}

// `serve --device cuda` serves the gRPC API unchanged: concurrent greedy
// streams get the tokens of the same requests run alone on the GPU engine;
// cancelled streams free their slots (and the slot gauge follows); Score
// returns the engine's logits; the model info names the device.
func TestCUDAServe(t *testing.T) {
	srv, c := serveCUDA(t)
	eng := srv.Engine()
	require.Equal(t, "cuda", eng.Backend().Name())
	// the memory planner sized the caches from the device's free memory
	// (cuMemGetInfo), within runtime.slots and the CUDA defaults
	info, err := c.GetModelInfo(context.Background(), &pb.GetModelInfoRequest{})
	require.NoError(t, err)
	m := info.Engine.Memory
	require.Equal(t, 0.9, m.MemoryFraction)
	require.Positive(t, m.FreeBytes)
	require.LessOrEqual(t, m.PlannedBytes, m.BudgetBytes)
	require.LessOrEqual(t, float64(m.BudgetBytes), 0.9*float64(m.FreeBytes))
	require.Equal(t, "runtime.slots", m.Binding)
	require.Equal(t, uint32(4), m.StateSlots)
	require.Equal(t, uint32(2048), info.Engine.PrefillChunk, "the CUDA default")
	require.Equal(t, uint32(8192), info.Engine.MaxBatchTokens, "the CUDA default")
	st := eng.Store().(backend.PagedStore).PageStats()
	require.Equal(t, int(m.KvPages), st.Total)
	prompts := [][]int32{seqTokens(7, 1, 256), seqTokens(20, 2, 256), seqTokens(3, 3, 256)}
	// alone: the engine itself, one sequence at a time, greedy
	alone := make([][]int32, len(prompts))
	for i, p := range prompts {
		s, err := eng.Store().Alloc()
		require.NoError(t, err)
		toks := p
		for len(alone[i]) < 10 {
			mode := graph.Decode
			if len(alone[i]) == 0 {
				mode = graph.Prefill
			}
			r, err := eng.Run(engine.Key{Mode: mode, Logits: graph.LastLogits}, &backend.Batch{Seqs: []backend.Seq{{Slot: s, Tokens: toks}}})
			require.NoError(t, err)
			best := 0
			for v := range r.Logits {
				if r.Logits[v] > r.Logits[best] {
					best = v
				}
			}
			alone[i] = append(alone[i], int32(best))
			toks = []int32{int32(best)}
		}
		require.NoError(t, eng.Store().Free(s))
	}
	got := make([][]int32, len(prompts))
	var wg sync.WaitGroup
	for i, p := range prompts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			toks, f, err := stream(context.Background(), c, &pb.GenerateRequest{PromptIds: p, MaxTokens: ptr(uint32(10)), IgnoreEos: true,
				Sampling: &pb.SamplingParams{Temperature: ptr(0.0)}})
			if err == nil && f.GetReason() != pb.FinishReason_FINISH_REASON_LENGTH {
				t.Errorf("request %d finished with %v", i, f.GetReason())
			}
			got[i] = toks
		}()
	}
	wg.Wait()
	require.Equal(t, alone, got)

	// cancellation frees the slots
	var cancels []context.CancelFunc
	for i := 0; i < 3; i++ {
		ctx, cancel := context.WithCancel(context.Background())
		cancels = append(cancels, cancel)
		st, err := c.Generate(ctx, &pb.GenerateRequest{PromptIds: seqTokens(5, 10+i, 256), MaxTokens: ptr(uint32(3000)), IgnoreEos: true,
			Sampling: &pb.SamplingParams{Temperature: ptr(0.0)}})
		require.NoError(t, err)
		m, err := st.Recv()
		require.NoError(t, err)
		require.NotNil(t, m.GetToken())
	}
	require.GreaterOrEqual(t, eng.Store().InUse(), 3)
	for _, cancel := range cancels {
		cancel()
	}
	require.Eventually(t, func() bool { return eng.Store().InUse() == 0 }, 20*time.Second, 5*time.Millisecond)

	// Score: the engine's logits for every position
	toks := seqTokens(9, 4, 256)
	sc, err := c.Score(context.Background(), &pb.ScoreRequest{TokenIds: toks, AllPositions: true})
	require.NoError(t, err)
	s, err := eng.Store().Alloc()
	require.NoError(t, err)
	r, err := eng.Run(engine.Key{Mode: graph.Prefill, Logits: graph.AllLogits}, &backend.Batch{Seqs: []backend.Seq{{Slot: s, Tokens: toks}}})
	require.NoError(t, err)
	require.NoError(t, eng.Store().Free(s))
	require.Less(t, maxDiff(r.Logits, sc.GetLogits()), 1e-5)

	info, err = c.GetModelInfo(context.Background(), &pb.GetModelInfoRequest{})
	require.NoError(t, err)
	require.Contains(t, info.String(), "cuda")
}
