package serve

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/core/sample"
	pb "github.com/glmflash/glmflash/proto/glmflash/v1"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// choicesResult is a finished stream of n choices, told apart by the
// choice of each Token and Finish.
type choicesResult struct {
	tokens  [][]int32
	finish  []*pb.Finish
	request string
}

func generateChoices(ctx context.Context, c pb.GLMFlashClient, req *pb.GenerateRequest) (*choicesResult, error) {
	n := max(int(req.GetN()), 1)
	st, err := c.Generate(ctx, req)
	if err != nil {
		return nil, err
	}
	r := &choicesResult{tokens: make([][]int32, n), finish: make([]*pb.Finish, n)}
	for {
		m, err := st.Recv()
		if err == io.EOF {
			for i, f := range r.finish {
				if f == nil {
					return r, errors.New("the stream ended without choice " + string(rune('0'+i)) + "'s finish")
				}
			}
			return r, nil
		}
		if err != nil {
			return r, err
		}
		switch k := m.Kind.(type) {
		case *pb.GenerateResponse_Token:
			i := k.Token.Choice
			if int(i) >= n || r.finish[i] != nil {
				return r, errors.New("a token of no choice, or after its choice's finish")
			}
			if int(k.Token.Index) != len(r.tokens[i]) {
				return r, errors.New("token index out of order")
			}
			r.tokens[i] = append(r.tokens[i], k.Token.Id)
		case *pb.GenerateResponse_Finish:
			i := k.Finish.Choice
			if int(i) >= n || r.finish[i] != nil {
				return r, errors.New("a finish of no choice, or twice")
			}
			r.finish[i] = k.Finish
			r.request = k.Finish.RequestId
		}
	}
}

// gRPC n: the stream interleaves the choices, each Token and Finish naming
// its choice; greedy choices equal the n = 1 stream, sampled choice i the
// n = 1 stream with seed + i (Finish.seed says so); the usage of each
// finish is its choice's. n beyond max_running or max_choices is
// INVALID_ARGUMENT naming n; aborting the request id ends every choice.
func TestGenerateChoices(t *testing.T) {
	h := start(t, setup{rt: config.Runtime{Slots: 4, MaxChoices: 3}})
	ctx := context.Background()
	p := prompt(11, 3)
	one, err := generate(ctx, h.client, &pb.GenerateRequest{PromptIds: p, MaxTokens: ptr(uint32(6)), Sampling: greedy(), IgnoreEos: true})
	require.NoError(t, err)
	r, err := generateChoices(ctx, h.client, &pb.GenerateRequest{RequestId: "g", PromptIds: p, MaxTokens: ptr(uint32(6)), Sampling: greedy(), IgnoreEos: true, N: 3})
	require.NoError(t, err)
	for i := range 3 {
		require.Equal(t, one.tokens, r.tokens[i], "greedy choice %d", i)
		require.Equal(t, uint32(len(p)), r.finish[i].Usage.PromptTokens)
		require.Equal(t, uint32(6), r.finish[i].Usage.CompletionTokens)
		require.Equal(t, pb.FinishReason_FINISH_REASON_LENGTH, r.finish[i].Reason)
	}
	require.Equal(t, "g", r.request)

	sp := &pb.SamplingParams{Temperature: ptr(1.0), TopP: ptr(0.9), Seed: ptr(uint64(21))}
	r, err = generateChoices(ctx, h.client, &pb.GenerateRequest{PromptIds: p, MaxTokens: ptr(uint32(8)), Sampling: sp, IgnoreEos: true, N: 2})
	require.NoError(t, err)
	for i := range 2 {
		want := alone(t, p, 8, sample.Params{Temperature: 1, TopP: 0.9, Seed: 21 + uint64(i)}, nil)
		require.Equal(t, want, r.tokens[i], "sampled choice %d follows seed %d", i, 21+i)
		require.Equal(t, uint64(21+i), r.finish[i].Seed)
	}

	for n, msg := range map[uint32]string{4: "runtime.max_choices", 1 << 20: "must be at most"} {
		_, err = generateChoices(ctx, h.client, &pb.GenerateRequest{PromptIds: p, Sampling: greedy(), N: n})
		require.Equal(t, codes.InvalidArgument, status.Code(err), "n = %d", n)
		require.Contains(t, status.Convert(err).Message(), "n: ")
		require.Contains(t, status.Convert(err).Message(), msg)
	}

	// Abort by the request id ends every choice.
	st, err := h.client.Generate(ctx, &pb.GenerateRequest{RequestId: "long", PromptIds: p, MaxTokens: ptr(uint32(3000)), Sampling: greedy(), IgnoreEos: true, N: 2})
	require.NoError(t, err)
	_, err = st.Recv()
	require.NoError(t, err)
	_, err = h.client.Abort(ctx, &pb.AbortRequest{RequestId: "long"})
	require.NoError(t, err)
	aborted := 0
	for {
		m, err := st.Recv()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		if f := m.GetFinish(); f != nil {
			require.Equal(t, pb.FinishReason_FINISH_REASON_ABORT, f.Reason)
			aborted++
		}
	}
	require.Equal(t, 2, aborted)
	require.Eventually(t, func() bool { return h.srv.Engine().Store().InUse() == 0 }, 10*time.Second, time.Millisecond)
}
