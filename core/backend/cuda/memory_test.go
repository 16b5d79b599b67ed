package cuda

import (
	"testing"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/model/randckpt"
	"github.com/stretchr/testify/require"
)

// StoreCost is what NewStore allocates: Fixed + slots × SlotBytes + pages ×
// PageBytes of cache memory, for trunk and MTP stores, with and without a
// rollback depth, in fp32 and bf16 latents; and FreeMemory falls by what a
// store takes.
func TestStoreCostIsWhatNewStoreAllocates(t *testing.T) {
	for _, prec := range []backend.Precision{backend.FP32, backend.BF16} {
		b := openGPU(t, backend.Options{Precision: prec})
		cfg, err := randckpt.Preset("tiny-mtp")
		require.NoError(t, err)
		for _, layers := range [][]int{cfg.TrunkLayers(), cfg.MTPLayers()} {
			for _, rb := range []int{0, 3} {
				o := backend.StoreOptions{Slots: 3, Pages: 7, PageTokens: 8, MaxPositions: 50, Rollback: rb}
				c, err := b.StoreCost(cfg, layers, o)
				require.NoError(t, err)
				free0, total, err := b.FreeMemory()
				require.NoError(t, err)
				require.Positive(t, total)
				before := b.Info().Memory["caches"]
				st, err := b.NewStore(cfg, layers, o)
				require.NoError(t, err)
				got := b.Info().Memory["caches"] - before
				require.Equal(t, c.FixedBytes+3*c.SlotBytes+7*c.PageBytes, got, "precision %s, layers %v, rollback %d", prec, layers, rb)
				free1, _, err := b.FreeMemory()
				require.NoError(t, err)
				if b.dev.Emulated {
					require.Equal(t, free0-got, free1, "the emulator counts every allocation")
				}
				require.NoError(t, st.(*Store).Close())
			}
		}
	}
}
