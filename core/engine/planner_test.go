package engine

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/backend/cpu"
	"github.com/glmflash/glmflash/model"
	"github.com/stretchr/testify/require"
)

// The planner never over-commits: whatever the memory, costs, caps and
// fraction, the planned bytes (fixed + slots × slot + pages × page +
// workspace) stay within fraction × free, one sequence at the context
// limit always fits, the slots stay within the caps, and the pages within
// what every slot at the context limit could use.
func TestPlanNeverOverCommits(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 5))
	plans := 0
	for range 5000 {
		free := r.Int64N(1 << 38)
		req := MemoryRequest{Fraction: 0.05 + 0.95*r.Float64(), ContextLimit: 1 + r.IntN(300000), MaxBatchTokens: 1 + r.IntN(16384),
			DefaultSlots: 1 + r.IntN(512)}
		if r.IntN(3) == 0 {
			req.Slots = 1 + r.IntN(1000)
		}
		if r.IntN(3) == 0 {
			req.MaxRunning = 1 + r.IntN(1000)
		}
		cost := backend.StoreCost{PageBytes: 1 + r.Int64N(1<<20), SlotBytes: 1 + r.Int64N(1<<28), FixedBytes: r.Int64N(1 << 20)}
		P := 4 * (1 + r.IntN(64))
		p, err := Plan(free, free, req, cost, P, r.Int64N(1<<20), r.Int64N(1<<20))
		if err != nil {
			require.ErrorIs(t, err, ErrMemory)
			continue
		}
		plans++
		require.LessOrEqual(t, p.Planned, p.Budget)
		require.LessOrEqual(t, float64(p.Planned), req.Fraction*float64(free))
		perSeq := (req.ContextLimit + P - 1) / P
		require.GreaterOrEqual(t, p.Pages, perSeq, "one sequence at the context limit fits")
		require.LessOrEqual(t, p.Pages, p.Slots*perSeq)
		require.GreaterOrEqual(t, p.Slots, 1)
		require.GreaterOrEqual(t, p.MaxBatchTokens, p.MaxRunning)
		require.LessOrEqual(t, p.MaxRunning, p.Slots)
		if req.Slots > 0 {
			require.LessOrEqual(t, p.Slots, req.Slots)
		}
		if req.MaxRunning > 0 {
			require.LessOrEqual(t, p.MaxRunning, req.MaxRunning)
		}
		if req.Slots == 0 && req.MaxRunning == 0 {
			require.LessOrEqual(t, p.Slots, req.DefaultSlots)
		}
	}
	require.Greater(t, plans, 1000, "most random requests fit")
}

// The report names what binds: a configured cap, the default bound, the
// state slots or the pages.
func TestPlanNamesTheBindingLimit(t *testing.T) {
	cost := backend.StoreCost{PageBytes: 1000, SlotBytes: 100_000}
	req := MemoryRequest{Fraction: 1, ContextLimit: 640, MaxBatchTokens: 64, DefaultSlots: 8} // 10 pages of 64 per sequence
	plan := func(free int64, mod func(*MemoryRequest)) *MemoryPlan {
		r := req
		if mod != nil {
			mod(&r)
		}
		p, err := Plan(free, 0, r, cost, 64, 0, 0)
		require.NoError(t, err)
		return p
	}
	p := plan(100<<20, nil)
	require.Equal(t, BindDefault, p.Binding)
	require.Equal(t, 8, p.Slots)
	require.Equal(t, 80, p.Pages, "no more pages than every slot at the context limit uses")
	p = plan(100<<20, func(r *MemoryRequest) { r.Slots = 20 })
	require.Equal(t, "runtime.slots", p.Binding)
	require.Equal(t, 20, p.Slots)
	p = plan(100<<20, func(r *MemoryRequest) { r.Slots, r.MaxRunning = 20, 5 })
	require.Equal(t, "runtime.max_running", p.Binding)
	require.Equal(t, 5, p.MaxRunning)
	// 1 MB: slots take at most half (5), the pages the rest (500 KB: 500
	// pages, more than the 50 of 5 sequences)
	p = plan(1_000_000, func(r *MemoryRequest) { r.Slots = 100 })
	require.Equal(t, BindStateSlots, p.Binding)
	require.Equal(t, 5, p.Slots)
	// pages dear: 5 sequences' slots fit, their pages at the context limit do not
	cost.PageBytes = 40_000
	p = plan(1_000_000, func(r *MemoryRequest) { r.Slots = 100 })
	require.Equal(t, BindPages, p.Binding)
	require.Less(t, p.ContextSeqs, p.Slots)
	require.LessOrEqual(t, p.Planned, p.Budget)
	// too little for one sequence: an error that names what to change
	_, err := Plan(100_000, 0, req, cost, 64, 0, 0)
	require.True(t, errors.Is(err, ErrMemory))
	require.ErrorContains(t, err, "runtime.context_limit 640")
	_, err = Plan(1<<30, 0, MemoryRequest{Fraction: 1.5, ContextLimit: 1, MaxBatchTokens: 1}, cost, 64, 0, 0)
	require.ErrorContains(t, err, "runtime.memory_fraction must be in (0, 1]")
}

// On the CPU the planner reads the host's available memory (through
// cpu.Meminfo) after the weights, and makes the store it planned.
func TestPlanMemoryOnTheCPU(t *testing.T) {
	old := cpu.Meminfo
	t.Cleanup(func() { cpu.Meminfo = old })
	cpu.Meminfo = func() ([]byte, error) {
		return []byte("MemTotal: 4000 kB\nMemFree: 10 kB\nMemAvailable: 20000 kB\n"), nil
	}
	ck, err := model.Open("../../testdata/glm5next-tiny-a/checkpoint")
	require.NoError(t, err)
	t.Cleanup(func() { ck.Close() })
	e, err := New(ck.Config(), ck, Options{Planned: true, PageTokens: 16})
	require.NoError(t, err)
	t.Cleanup(func() { e.Close() })
	require.Nil(t, e.Store())
	_, err = e.MTPStore()
	require.Error(t, err)
	p, err := e.PlanMemory(MemoryRequest{Fraction: 0.5, ContextLimit: 4096, MaxBatchTokens: 256, DefaultSlots: 8}, PlanStores{})
	require.NoError(t, err)
	require.Equal(t, int64(20000<<10), p.Free)
	require.LessOrEqual(t, p.Planned, int64(10000<<10))
	st := e.Store().(backend.PagedStore).PageStats()
	require.Equal(t, p.Slots, st.StateSlots)
	require.Equal(t, p.Pages, st.Total)
	require.Equal(t, 16, st.PageTokens)
	require.Same(t, p, e.MemoryPlan())
	_, err = e.PlanMemory(MemoryRequest{Fraction: 0.5, ContextLimit: 4096, MaxBatchTokens: 256, DefaultSlots: 8}, PlanStores{})
	require.ErrorContains(t, err, "once")
	t.Logf("20000 kB available: %d slots, %d pages of %d tokens, binding %s", p.Slots, p.Pages, p.PageTokens, p.Binding)
}
