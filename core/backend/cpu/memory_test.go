package cpu_test

import (
	"errors"
	"testing"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/backend/cpu"
	"github.com/glmflash/glmflash/model"
	"github.com/stretchr/testify/require"
)

// FreeMemory is /proc/meminfo's MemAvailable and MemTotal; a report
// without them, or with a malformed size, is an error naming the line.
func TestFreeMemoryReadsMeminfo(t *testing.T) {
	old := cpu.Meminfo
	t.Cleanup(func() { cpu.Meminfo = old })
	b := cpu.New(backend.Options{})
	for text, want := range map[string]string{
		"MemTotal:       16318084 kB\nMemFree:  1 kB\nMemAvailable:   12345678 kB\n": "",
		"MemTotal: 10 kB\n":                    "no MemAvailable line",
		"MemTotal: 10 kB\nMemAvailable: -5 kB": `MemAvailable: "-5" is not a size in kB`,
		"MemTotal: 10 MB\nMemAvailable: 5 kB":  `MemTotal: "10 MB" is not a size in kB`,
	} {
		cpu.Meminfo = func() ([]byte, error) { return []byte(text), nil }
		free, total, err := b.FreeMemory()
		if want != "" {
			require.ErrorContains(t, err, want)
			continue
		}
		require.NoError(t, err)
		require.Equal(t, int64(12345678)<<10, free)
		require.Equal(t, int64(16318084)<<10, total)
	}
	cpu.Meminfo = func() ([]byte, error) { return nil, errors.New("no procfs") }
	_, _, err := b.FreeMemory()
	require.ErrorContains(t, err, "no procfs")
	cpu.Meminfo = old
	free, total, err := b.FreeMemory() // this machine's
	require.NoError(t, err)
	require.Positive(t, free)
	require.LessOrEqual(t, free, total)
}

// A store's cost per page is its pages' fp32 rows (and their table
// entries), per slot its state, rollback record and page table row.
func TestStoreCostOnTheCPU(t *testing.T) {
	ck, err := model.Open("../../../testdata/glm5next-tiny-a/checkpoint")
	require.NoError(t, err)
	t.Cleanup(func() { ck.Close() })
	cfg := ck.Config()
	b := cpu.New(backend.Options{})
	c0, err := b.StoreCost(cfg, cfg.TrunkLayers(), backend.StoreOptions{PageTokens: 16, MaxPositions: 160})
	require.NoError(t, err)
	st, err := b.NewStore(cfg, cfg.TrunkLayers(), backend.StoreOptions{Slots: 1, PageTokens: 16, MaxPositions: 160})
	require.NoError(t, err)
	ps := st.(backend.PagedStore).PageStats()
	require.Equal(t, ps.PageBytes+28, c0.PageBytes)
	require.Equal(t, ps.StateSlotBytes+4*10, c0.SlotBytes)
	c3, err := b.StoreCost(cfg, cfg.TrunkLayers(), backend.StoreOptions{PageTokens: 16, MaxPositions: 160, Rollback: 3})
	require.NoError(t, err)
	require.Greater(t, c3.SlotBytes, c0.SlotBytes)
	require.Equal(t, c0.PageBytes, c3.PageBytes)

	// fp8 KV: the page's fp8 rows, as the store holds them
	o8 := backend.StoreOptions{Slots: 1, PageTokens: 16, MaxPositions: 160, KVDType: backend.KVFP8}
	c8, err := b.StoreCost(cfg, cfg.TrunkLayers(), o8)
	require.NoError(t, err)
	st8, err := b.NewStore(cfg, cfg.TrunkLayers(), o8)
	require.NoError(t, err)
	require.Equal(t, st8.(backend.PagedStore).PageStats().PageBytes+28, c8.PageBytes)
	require.Less(t, c8.PageBytes, c0.PageBytes)
}
