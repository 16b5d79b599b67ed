package serve

import (
	"context"
	"testing"

	pb "github.com/glmflash/glmflash/proto/glmflash/v1"
	"google.golang.org/protobuf/proto"
)

// Whatever bytes arrive as a GenerateRequest, checking them never panics,
// and whatever passes fits the model and the limits.
func FuzzGenerateRequest(f *testing.F) {
	seed := func(r *pb.GenerateRequest) {
		b, err := proto.Marshal(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	seed(&pb.GenerateRequest{PromptIds: []int32{1, 2, 3}, MaxTokens: ptr(uint32(4))})
	seed(&pb.GenerateRequest{PromptIds: []int32{-1}, Sampling: &pb.SamplingParams{Temperature: ptr(-1.0), TopP: ptr(2.0), TopK: -3, MinP: 1}})
	seed(&pb.GenerateRequest{RequestId: "x y", PromptIds: []int32{9}, StopIds: []int32{300}, TopLogprobs: 99})
	seed(&pb.GenerateRequest{PromptIds: []int32{5}, MaxTokens: ptr(uint32(3)), Sampling: &pb.SamplingParams{
		RepetitionPenalty: ptr(1.5), PresencePenalty: 1, FrequencyPenalty: -1, LogitBias: map[int32]float32{1: 100, 255: -3, 256: 1}, MinTokens: 3,
	}})
	lim := limits{vocab: 256, context: 64, defaultMaxTokens: 16}
	f.Fuzz(func(t *testing.T, b []byte) {
		var req pb.GenerateRequest
		if proto.Unmarshal(b, &req) != nil {
			return
		}
		r, err := generateRequest(context.Background(), &req, lim)
		if err != nil {
			return
		}
		if len(r.Prompt) == 0 || r.MaxTokens < 1 || len(r.Prompt)+r.MaxTokens > lim.context {
			t.Fatalf("accepted a request outside the limits: %d prompt, %d max", len(r.Prompt), r.MaxTokens)
		}
		for _, id := range append(append([]int32{}, r.Prompt...), r.StopIDs...) {
			if id < 0 || int(id) >= lim.vocab {
				t.Fatalf("accepted token id %d", id)
			}
		}
		if err := r.Sampling.Validate(); err != nil {
			t.Fatalf("accepted bad sampling: %v", err)
		}
		if err := r.Processing.Validate(lim.vocab); err != nil || r.MinTokens < 0 || r.MinTokens > r.MaxTokens {
			t.Fatalf("accepted bad logits processing (%v) or min_tokens %d (max_tokens %d)", err, r.MinTokens, r.MaxTokens)
		}
	})
}
