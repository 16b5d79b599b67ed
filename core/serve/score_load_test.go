package serve

import (
	"context"
	"math"
	"sync"
	"testing"

	"github.com/glmflash/glmflash/core/config"
	pb "github.com/glmflash/glmflash/proto/glmflash/v1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A Score request's logits are bitwise the same alone and batched with
// other requests' prompts and decode tokens (issue 37: the prompt was cut
// where the step's token budget ran out, and chunk boundaries change the
// arithmetic: 7 of 15 rounds differed, by up to 8e-6).
func TestScoreBitwiseUnderLoad(t *testing.T) {
	h := start(t, setup{rt: config.Runtime{Slots: 8, MaxBatchTokens: 16, PrefillChunk: 8}})
	toks := prompt(37, 3)
	ctx := context.Background()
	alone, err := h.client.Score(ctx, &pb.ScoreRequest{TokenIds: toks, AllPositions: true})
	require.NoError(t, err)
	for round := 0; round < 8; round++ {
		var wg sync.WaitGroup
		for i := 0; i < 3; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := generate(ctx, h.client, &pb.GenerateRequest{PromptIds: prompt(5+3*i+round, 20+i), MaxTokens: ptr(uint32(12)), Sampling: greedy()})
				assert.NoError(t, err)
			}()
		}
		got, err := h.client.Score(ctx, &pb.ScoreRequest{TokenIds: toks, AllPositions: true})
		require.NoError(t, err)
		wg.Wait()
		require.Len(t, got.Logits, len(alone.Logits))
		differ, worst := 0, 0.0
		for i, v := range got.Logits {
			if math.Float32bits(v) != math.Float32bits(alone.Logits[i]) {
				differ++
				worst = max(worst, math.Abs(float64(v-alone.Logits[i])))
			}
		}
		require.Zero(t, differ, "round %d: %d logits differ from the request scored alone (worst %g)", round, differ, worst)
	}
}
