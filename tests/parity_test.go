package tests

import (
	"path/filepath"
	"testing"

	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/eval"
	"github.com/glmflash/glmflash/kernels/mla"
	"github.com/glmflash/glmflash/model"
	"github.com/stretchr/testify/require"
)

// fixtures are the transformers reference variants shipped in testdata.
var fixtures = []string{"glm5next-tiny-a", "glm5next-tiny-b", "glm5next-tiny-c"}

func fixtureDir(name string) string { return filepath.Join("..", "testdata", name) }

func openFixture(t testing.TB, name string) (*model.Checkpoint, *eval.Reference) {
	t.Helper()
	ck, err := model.Open(filepath.Join(fixtureDir(name), "checkpoint"))
	require.NoError(t, err)
	t.Cleanup(func() { ck.Close() })
	ref, err := eval.Load(filepath.Join(fixtureDir(name), "reference.safetensors"))
	require.NoError(t, err)
	return ck, ref
}

// TestTransformersParity is the engine's correctness oracle: every case of
// every fixture within 1e-4 max |Δlogit| with identical greedy tokens.
//
// The MLA kernel's cost rule picks the absorbed path for decode and the
// expand path for prefill; the -mla-expand and -mla-absorb variants force
// one path for every call so that each is checked on every case.
func TestTransformersParity(t *testing.T) {
	for _, path := range []mla.Path{mla.PathAuto, mla.PathExpand, mla.PathAbsorb} {
		for _, name := range fixtures {
			sub := name
			if path != mla.PathAuto {
				sub += "-mla-" + path.String()
			}
			t.Run(sub, func(t *testing.T) {
				mla.Force = path
				defer func() { mla.Force = mla.PathAuto }()
				ck, ref := openFixture(t, name)
				e, err := engine.New(ck.Config(), ck, engine.Options{Slots: 2})
				require.NoError(t, err)
				res, err := eval.RunAll(e, ref)
				require.NoError(t, err)
				require.Len(t, res, len(ref.Cases))
				for _, r := range res {
					t.Logf("%s %-10s rows=%3d max|Δ|=%.2e greedy=%v hidden=%v", sub, r.Name, r.Rows, r.MaxAbsDiff, r.GreedyMatch, fmtDiffs(r.HiddenMaxDiff))
					require.Less(t, r.MaxAbsDiff, 1e-4, "%s %s", sub, r.Name)
					require.True(t, r.GreedyMatch, "%s %s: %d greedy mismatches", sub, r.Name, r.Mismatches)
				}
			})
		}
	}
}

func fmtDiffs(d []float64) []string {
	var s []string
	for _, v := range d {
		s = append(s, func() string { return formatE(v) }())
	}
	return s
}

func formatE(v float64) string { return fmtFloat(v) }
