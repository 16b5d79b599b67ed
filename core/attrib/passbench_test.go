package attrib

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/model"
	"github.com/glmflash/glmflash/model/randckpt"
	_ "github.com/glmflash/glmflash/passes/all" // the built-in passes
	"github.com/stretchr/testify/require"
)

// The pass micro-benchmark on the CPU: every phase of every pass has the
// off and on medians and a paired interval; device counters are absent
// (n/a), not zero; a pass that fires nowhere says so.
func TestPassBenchOnCPU(t *testing.T) {
	ck := tinyCheckpoint(t, 1)
	pb := &PassBench{Model: ck.Config(), Weights: ck, Info: ck, Passes: []config.PassConfig{{Name: "dsa-pooled-metadata"}, {Name: "host-length-reuse"}},
		Prompt: 16, Steps: 2, Rounds: 3, Warmup: 1, Batches: []int{1, 3}}
	res, err := pb.Run(context.Background())
	require.NoError(t, err)
	require.Len(t, res, 2)
	for _, r := range res {
		require.True(t, r.Fired, r.Pass)
		require.Equal(t, "baseline", r.Against)
		require.Len(t, r.Rows, 3)
		require.Equal(t, []string{"prefill 16", "decode b1", "decode b3"}, []string{r.Rows[0].Phase, r.Rows[1].Phase, r.Rows[2].Phase})
		for _, row := range r.Rows {
			require.Positive(t, row.Off.WallMs)
			require.Positive(t, row.On.WallMs)
			require.Equal(t, 3, row.Speedup.Rounds)
			require.Equal(t, MethodT, row.Speedup.Method)
			require.Nil(t, row.Off.Kernels, "no device counters on the CPU")
			require.Nil(t, row.DeviceSpeedup)
		}
	}
	var b strings.Builder
	require.NoError(t, WritePassBench(&b, res))
	require.Contains(t, b.String(), "host-length-reuse (off: no passes; 3 paired rounds)")
	require.Contains(t, b.String(), "n/a → n/a")

	// against all: the reference is every pass; a pass nobody asked for
	// that fires nowhere is reported as such
	pb.Against, pb.Passes, pb.Rounds = "all", []config.PassConfig{{Name: "host-length-reuse"}}, 1
	res, err = pb.Run(context.Background())
	require.NoError(t, err)
	require.Equal(t, "all", res[0].Against)
	require.Equal(t, VerdictTooFew, res[0].Rows[0].Speedup.Verdict)
	pb.Against = "some"
	_, err = pb.Run(context.Background())
	require.ErrorContains(t, err, "against: baseline or all")
}

// tinyCheckpoint writes a random `tiny` checkpoint (generator seed seed)
// and opens it for the test.
func tinyCheckpoint(t *testing.T, seed int64) *model.Checkpoint {
	t.Helper()
	cfg, err := randckpt.Preset("tiny")
	require.NoError(t, err)
	dir := filepath.Join(t.TempDir(), "ck")
	require.NoError(t, randckpt.Write(dir, cfg, randckpt.Options{Seed: seed}))
	ck, err := model.Open(dir)
	require.NoError(t, err)
	t.Cleanup(func() { ck.Close() })
	return ck
}
