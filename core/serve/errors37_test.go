package serve

import (
	"context"
	"strings"
	"testing"

	pb "github.com/glmflash/glmflash/proto/glmflash/v1"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// withBigTokenizer serves the fixture (vocabulary 256) with a tokenizer of
// 2,000 ids: its merges make ids the model does not have.
func withBigTokenizer(t *testing.T) func(*Options) { return withTokenizer(t, 2000) }

// A text prompt the tokenizer turns into an id outside the model's
// vocabulary is an error of the field the client sent (prompt, messages),
// not of prompt_ids (issue 37).
func TestTextPromptOutsideVocabularyNamesItsField(t *testing.T) {
	h := start(t, setup{opts: withBigTokenizer(t)})
	ctx := context.Background()
	_, err := generate(ctx, h.client, &pb.GenerateRequest{Prompt: "the theory of the thing"})
	require.Equal(t, codes.InvalidArgument, status.Code(err))
	require.ErrorContains(t, err, "prompt: the tokenizer gave token id")
	require.ErrorContains(t, err, "outside the model's vocabulary [0, 256)")
	require.NotContains(t, err.Error(), "prompt_ids")

	_, err = generate(ctx, h.client, &pb.GenerateRequest{Messages: []*pb.ChatMessage{{Role: "user", Content: "the theory of the thing"}}})
	require.Equal(t, codes.InvalidArgument, status.Code(err))
	require.ErrorContains(t, err, "messages: the tokenizer gave token id")
	require.NotContains(t, err.Error(), "prompt_ids")
}

// Abort checks the id as Generate does: an id Generate would refuse is
// INVALID_ARGUMENT naming request_id, not NOT_FOUND (issue 37).
func TestAbortValidatesTheID(t *testing.T) {
	h := start(t, setup{})
	ctx := context.Background()
	for _, id := range []string{strings.Repeat("x", maxRequestID+1), "has space", "tab\there", "é"} {
		_, err := h.client.Abort(ctx, &pb.AbortRequest{RequestId: id})
		require.Equal(t, codes.InvalidArgument, status.Code(err), "%q", id)
		require.ErrorContains(t, err, "request_id:")
	}
	_, err := h.client.Abort(ctx, &pb.AbortRequest{RequestId: "no-such-request"})
	require.Equal(t, codes.NotFound, status.Code(err))
}

// The developer role is accepted over gRPC as over HTTP, and rendered as
// system (issue 37: HTTP took it, gRPC refused it).
func TestDeveloperRoleOverGRPC(t *testing.T) {
	h := start(t, setup{opts: withText(t)})
	ctx := context.Background()
	n := uint32(1)
	res, err := generate(ctx, h.client, &pb.GenerateRequest{Messages: []*pb.ChatMessage{{Role: "developer", Content: "be brief"}, {Role: "user", Content: "hi"}}, MaxTokens: &n, Sampling: greedy()})
	require.NoError(t, err)
	require.Equal(t, uint32(len("system: be brief\nuser: hi\nassistant:")), res.finish.Usage.PromptTokens)
	_, err = generate(ctx, h.client, &pb.GenerateRequest{Messages: []*pb.ChatMessage{{Role: "wizard", Content: "x"}}})
	require.Equal(t, codes.InvalidArgument, status.Code(err))
	require.ErrorContains(t, err, `messages[0].role: unknown role "wizard" (have system, developer, user, assistant, tool)`)
}
