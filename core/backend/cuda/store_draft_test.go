package cuda_test

import (
	"os"
	"testing"

	"github.com/glmflash/glmflash/core/backend"
	cudabe "github.com/glmflash/glmflash/core/backend/cuda"
	"github.com/stretchr/testify/require"
)

// The device draft store (backend.DraftStorer): its options are checked by
// name, its slots behave as the CPU's cache.DraftStore's (allocation until
// full, lengths, frees), and its K/V caches are counted in caches from
// NewDraftStore to Close: 2 · layers · slots · positions · width floats.
func TestDraftStoreSlots(t *testing.T) {
	be, err := cudabe.Open(backend.Options{})
	if err != nil {
		if os.Getenv("GLMFLASH_REQUIRE_GPU") != "" {
			t.Fatalf("GLMFLASH_REQUIRE_GPU is set and the CUDA backend cannot open: %v", err)
		}
		t.Skipf("CUDA backend unavailable (%v): `make test-gpu` or `make test-emu` runs this", err)
	}
	defer be.Close()
	var _ backend.DraftStorer = be
	for _, c := range []struct {
		layers, width int
		o             backend.StoreOptions
		want          string
	}{
		{2, 64, backend.StoreOptions{Slots: 0, MaxPositions: 8}, "at least one draft slot"},
		{2, 64, backend.StoreOptions{Slots: 1}, "positive context limit"},
		{0, 64, backend.StoreOptions{Slots: 1, MaxPositions: 8}, "at least one draft layer"},
		{2, 0, backend.StoreOptions{Slots: 1, MaxPositions: 8}, "K/V width"},
		{2, 64, backend.StoreOptions{Slots: 1, MaxPositions: 8, Rollback: -1}, "rollback depth"},
	} {
		_, err := be.NewDraftStore(c.layers, c.width, c.o)
		require.ErrorContains(t, err, c.want)
	}
	before := be.Info().Memory["caches"]
	st, err := be.NewDraftStore(3, 40, backend.StoreOptions{Slots: 2, MaxPositions: 17})
	require.NoError(t, err)
	require.Equal(t, int64(4*2*3*2*17*40), be.Info().Memory["caches"]-before)
	require.Equal(t, 2, st.Capacity())
	for want := 0; want < 2; want++ {
		sl, err := st.Alloc()
		require.NoError(t, err)
		require.Equal(t, want, sl)
		n, err := st.Len(sl)
		require.NoError(t, err)
		require.Zero(t, n)
	}
	_, err = st.Alloc()
	require.ErrorContains(t, err, "all 2 draft slots are in use")
	require.Equal(t, 2, st.InUse())
	require.NoError(t, st.Free(1))
	require.ErrorContains(t, st.Free(1), "draft slot 1 is not allocated")
	_, err = st.Len(1)
	require.ErrorContains(t, err, "not allocated")
	require.ErrorContains(t, st.Copy(0, 1), "not allocated")
	require.ErrorContains(t, st.Copy(0, 0), "onto itself")
	require.ErrorContains(t, st.Checkpoint(5), "not allocated")
	require.NoError(t, st.(interface{ Close() error }).Close())
	require.Equal(t, before, be.Info().Memory["caches"])
}
