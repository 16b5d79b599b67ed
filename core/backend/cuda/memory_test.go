package cuda_test

import (
	"os"
	"strings"
	"testing"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/model"
	"github.com/stretchr/testify/require"
)

// Info reports device memory by category: the weights by dtype, the
// stores' caches and the programs' workspace, which sum to at most
// everything allocated; a store's and a program's bytes come and go with
// them.
func TestInfoMemoryCategories(t *testing.T) {
	if be, err := backend.Open("cuda", backend.Options{}); err != nil {
		if os.Getenv("GLMFLASH_REQUIRE_GPU") != "" {
			t.Fatalf("GLMFLASH_REQUIRE_GPU is set and the CUDA backend cannot open: %v", err)
		}
		t.Skipf("CUDA backend unavailable (%v): `make test-gpu` or `make test-emu` runs this", err)
	} else {
		be.Close()
	}
	ck, err := model.Open("../../../testdata/glm5next-tiny-a/checkpoint")
	require.NoError(t, err)
	defer ck.Close()
	e, err := engine.New(ck.Config(), ck, engine.Options{Slots: 2, Device: "cuda"})
	require.NoError(t, err)
	defer func() { require.NoError(t, e.Close()) }()
	slot, err := e.Store().Alloc()
	require.NoError(t, err)
	_, err = e.Run(engine.Key{Mode: graph.Prefill, Logits: graph.LastLogits}, &backend.Batch{Seqs: []backend.Seq{{Slot: slot, Tokens: []int32{5, 6, 7, 8}}}})
	require.NoError(t, err)
	mem := e.Backend().Info().Memory
	t.Logf("device memory: %v", mem)
	var sum int64
	weights := 0
	for k, v := range mem {
		require.GreaterOrEqual(t, v, int64(0), k)
		if k == "total_allocated" {
			continue
		}
		if strings.HasPrefix(k, "weights_") {
			weights++
		}
		sum += v
	}
	require.Positive(t, weights, "weights by dtype")
	require.Positive(t, mem["caches"], "the store's device buffers")
	require.Positive(t, mem["workspace"], "the prefill program's arena")
	require.LessOrEqual(t, sum, mem["total_allocated"])

	// a second store adds its buffers to caches; closing it takes them back
	st, err := e.Backend().NewStore(ck.Config(), ck.Config().TrunkLayers(), backend.StoreOptions{Slots: 1, MaxPositions: 64})
	require.NoError(t, err)
	more := e.Backend().Info().Memory
	require.Greater(t, more["caches"], mem["caches"])
	require.Equal(t, more["caches"]-mem["caches"], more["total_allocated"]-mem["total_allocated"], "the new store's bytes are caches")
	require.NoError(t, st.(interface{ Close() error }).Close())
	require.Equal(t, mem["caches"], e.Backend().Info().Memory["caches"])
}
