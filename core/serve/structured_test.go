package serve

import (
	"context"
	"encoding/json"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/glmflash/glmflash/proto/glmflash/v1"
)

// GenerateRequest's structured_output oneof constrains the output: random
// weights, sampled, and every output is what was asked, finishing with
// stop.
func TestGenerateStructuredOutput(t *testing.T) {
	h := start(t, setup{opts: withText(t)})
	ctx := context.Background()
	one := 1.0
	date := regexp.MustCompile(`^[0-9]{4}-[0-9]{2}-[0-9]{2}$`)
	for seed := range uint64(8) {
		sp := &pb.SamplingParams{Temperature: &one, Seed: &seed}
		for _, c := range []struct {
			so    func(*pb.GenerateRequest)
			check func(string) bool
		}{
			{func(r *pb.GenerateRequest) {
				r.StructuredOutput = &pb.GenerateRequest_JsonSchema{JsonSchema: `{"type":"object","properties":{"n":{"type":"integer"},"s":{"enum":["a","b"]}},"required":["n","s"]}`}
			}, func(o string) bool {
				var m struct {
					N *int    `json:"n"`
					S *string `json:"s"`
				}
				return json.Unmarshal([]byte(o), &m) == nil && m.N != nil && m.S != nil && (*m.S == "a" || *m.S == "b")
			}},
			{func(r *pb.GenerateRequest) { r.StructuredOutput = &pb.GenerateRequest_JsonObject{JsonObject: true} }, func(o string) bool {
				var m map[string]any
				return json.Unmarshal([]byte(o), &m) == nil
			}},
			{func(r *pb.GenerateRequest) {
				r.StructuredOutput = &pb.GenerateRequest_Regex{Regex: `[0-9]{4}-[0-9]{2}-[0-9]{2}`}
			}, date.MatchString},
			{func(r *pb.GenerateRequest) {
				r.StructuredOutput = &pb.GenerateRequest_Choice{Choice: &pb.Choice{Choices: []string{"left", "right"}}}
			}, func(o string) bool { return o == "left" || o == "right" }},
		} {
			req := &pb.GenerateRequest{Prompt: "go", MaxTokens: ptr(uint32(60)), Sampling: sp}
			c.so(req)
			res, err := generate(ctx, h.client, req)
			require.NoError(t, err)
			require.True(t, c.check(res.text), "%v: %q", req.StructuredOutput, res.text)
			require.Equal(t, pb.FinishReason_FINISH_REASON_STOP, res.finish.Reason, "%q", res.text)
		}
	}
	for _, c := range []struct {
		req  *pb.GenerateRequest
		want string
	}{
		{&pb.GenerateRequest{Prompt: "go", StructuredOutput: &pb.GenerateRequest_JsonSchema{JsonSchema: `{"type":"number","minimum":0}`}}, `json_schema: schema.minimum: the keyword "minimum" is not supported`},
		{&pb.GenerateRequest{Prompt: "go", StructuredOutput: &pb.GenerateRequest_Regex{Regex: `(`}}, "regex: invalid regular expression"},
		{&pb.GenerateRequest{Prompt: "go", StructuredOutput: &pb.GenerateRequest_Choice{Choice: &pb.Choice{}}}, "choice.choices: give at least one string"},
		{&pb.GenerateRequest{Prompt: "go", MaxTokens: ptr(uint32(3)), StructuredOutput: &pb.GenerateRequest_Choice{Choice: &pb.Choice{Choices: []string{"left", "right"}}}}, "max_tokens: the choice output needs at least 4 tokens"},
	} {
		_, err := generate(ctx, h.client, c.req)
		require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
		require.Contains(t, status.Convert(err).Message(), c.want)
	}
}

// Without a tokenizer structured output is refused, naming the field.
func TestGenerateStructuredOutputNeedsATokenizer(t *testing.T) {
	h := start(t, setup{})
	_, err := generate(context.Background(), h.client, &pb.GenerateRequest{PromptIds: []int32{1, 2}, StructuredOutput: &pb.GenerateRequest_JsonObject{JsonObject: true}})
	require.Equal(t, codes.InvalidArgument, status.Code(err))
	require.Contains(t, status.Convert(err).Message(), "json_object: structured output is not available: the model has no tokenizer")
}
