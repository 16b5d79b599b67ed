package gpu

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/glmflash/glmflash/core/backend"
	cudabe "github.com/glmflash/glmflash/core/backend/cuda"
	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/core/speculative/spectest"
	"github.com/stretchr/testify/require"
)

// Paged device caches change no number: with pages of index_kpool tokens
// (one pool a page; a context crossing many pages, the page table's
// contents changing under the decode steps' captured graphs) the GPU's
// prefill and greedy decode give the logits and states of pages that hold
// each sequence whole (the contiguous caches as before) bit for bit;
// rollback and Copy on the small pages match the plain run; every page is
// back in the pool at the end.
func TestCUDAPagedCachesMatchOnePage(t *testing.T) {
	ck, _ := openFixture(t, fixtures[0])
	cfg := ck.Config()
	P, V := cfg.IndexKPool, cfg.VocabSize
	prompt := seqTokens(23, 5, V)
	want := spectest.PlainRun(t, cudaEngine(t, ck, engine.Options{Slots: 2, PageTokens: 1024}), prompt, 14)
	e := cudaEngine(t, ck, engine.Options{Slots: 3, PageTokens: P, Rollback: 4})
	got := spectest.PlainRun(t, e, prompt, 14)
	require.Equal(t, want.Tokens, got.Tokens)
	for c, w := range want.Logits {
		require.Equal(t, w, got.Logits[c], "logits at %d tokens, pages of %d", c, P)
		spectest.RequireStateEqual(t, want.States[c], got.States[c], fmt.Sprintf("%d tokens, pages of %d", c, P))
	}
	spectest.RollbackRun(t, e, got, 3, map[int]bool{1: true, 4: true, 9: true})
	spectest.ForkRun(t, e, got, 3)
	ps := e.Store().(backend.PagedStore).PageStats()
	require.Zero(t, ps.Used)
	require.Equal(t, P, ps.PageTokens)
}

// A GPU run that needs more pages than are free fails with
// backend.ErrNoPages and changes nothing; freeing pages lets it run.
func TestCUDARunOutOfPages(t *testing.T) {
	ck, _ := openFixture(t, fixtures[0])
	cfg := ck.Config()
	P, V := cfg.IndexKPool, cfg.VocabSize
	e := cudaEngine(t, ck, engine.Options{Slots: 3, PageTokens: P, Pages: 5})
	st := e.Store()
	sr, ps := st.(backend.StateReader), st.(backend.PagedStore)
	pre := engine.Key{Mode: graph.Prefill, Logits: graph.LastLogits}
	a, _ := st.Alloc()
	b, _ := st.Alloc()
	c, _ := st.Alloc()
	_, err := e.Run(pre, &backend.Batch{Seqs: []backend.Seq{{Slot: a, Tokens: seqTokens(3*P-1, 1, V)}}})
	require.NoError(t, err)
	before := ps.PageStats()
	require.Equal(t, 3, before.Used)
	stA, err := sr.ReadState(a)
	require.NoError(t, err)
	batch := &backend.Batch{Seqs: []backend.Seq{{Slot: b, Tokens: seqTokens(P, 2, V)}, {Slot: c, Tokens: seqTokens(P+1, 3, V)}}}
	_, err = e.Run(pre, batch)
	require.ErrorIs(t, err, backend.ErrNoPages)
	require.Equal(t, before, ps.PageStats())
	for _, s := range []int{b, c} {
		n, err := st.Len(s)
		require.NoError(t, err)
		require.Zero(t, n)
	}
	gotA, err := sr.ReadState(a)
	require.NoError(t, err)
	spectest.RequireStateEqual(t, stA, gotA, "the held sequence")
	require.ErrorIs(t, st.Copy(a, b), backend.ErrNoPages)
	require.NoError(t, st.Free(a))
	_, err = e.Run(pre, batch)
	require.NoError(t, err)
	require.Equal(t, 3, ps.PageStats().Used)
}

// Decode steps replayed from graphs captured once read the page table's
// current contents: on pages of index_kpool tokens, with new pages taken
// under the replays every few steps, the logits equal eager launches on
// pages that hold each sequence whole, bit for bit.
func TestCUDAPagedGraphs(t *testing.T) {
	cudaOptions(t, engine.Options{})
	ck, _ := openFixture(t, fixtures[0])
	P := ck.Config().IndexKPool
	do := func(graphMax, pageTokens int) ([][]float32, backend.DeviceStats) {
		pl, err := pass.NewPipeline([]pass.Request{{Name: "kda-projection-fusion"}, {Name: "dsa-pooled-metadata"}, {Name: "host-length-reuse"}}, true)
		require.NoError(t, err)
		e := cudaEngine(t, ck, engine.Options{Slots: 3, PageTokens: pageTokens, Passes: pl, PassEnv: config.Default().PassEnv(ck.Config(), ck),
			Backend: backend.Options{Device: cudabe.Options{GraphMaxTokens: graphMax}}})
		var slots []int
		for i := 0; i < 3; i++ {
			s, err := e.Store().Alloc()
			require.NoError(t, err)
			slots = append(slots, s)
		}
		key := engine.Key{Mode: graph.Mixed, Logits: graph.LastLogits}
		var logits [][]float32
		for step := 0; step < 10; step++ {
			b := &backend.Batch{}
			for i, s := range slots {
				n := 1
				if step == 0 {
					n = 5 + 14*i
				}
				b.Seqs = append(b.Seqs, backend.Seq{Slot: s, Tokens: seqTokens(n, step*7+i, 256)})
			}
			r, err := e.Run(key, b)
			require.NoError(t, err)
			logits = append(logits, r.Logits)
		}
		p, err := e.Program(key)
		require.NoError(t, err)
		return logits, backend.DeviceStatsOf(p)
	}
	eager, _ := do(-1, 1024)
	graphed, gs := do(80, P)
	for i := range eager {
		require.Equal(t, eager[i], graphed[i], "step %d", i)
	}
	require.EqualValues(t, 10, gs.GraphReplays, "every step replays (a capture is replayed once captured)")
	require.EqualValues(t, 2, gs.GraphCaptures, "two shapes: the 57-token prefill and the 3-token decode steps")
}

// bf16 latents (runtime.kv_dtype bf16; the default under precision bf16):
// the stored latents are the fp32 ones rounded to nearest even, the run is
// deterministic (its distance from fp32 latents is logged), a latent page
// costs half, and rollback and Copy on bf16 pages still match the plain
// run bit for bit.
func TestCUDABF16Latents(t *testing.T) {
	ck, _ := openFixture(t, fixtures[0])
	cfg := ck.Config()
	P, V := cfg.IndexKPool, cfg.VocabSize
	prompt := seqTokens(23, 5, V)
	f32 := cudaEngine(t, ck, engine.Options{Slots: 2, PageTokens: P})
	want := spectest.PlainRun(t, f32, prompt, 10)
	e := cudaEngine(t, ck, engine.Options{Slots: 3, PageTokens: P, Rollback: 4, KVDType: backend.KVBF16})
	got := spectest.PlainRun(t, e, prompt, 10)
	// the first DSA layer's latents are computed before any latent is
	// read: they are exactly the fp32 run's rounded to nearest even
	first := -1
	for _, l := range cfg.TrunkLayers() {
		if cfg.IsDSA(l) {
			first = l
			break
		}
	}
	c0 := len(prompt)
	wl, gl := want.States[c0].CKV[first].Flatten(), got.States[c0].CKV[first].Flatten()
	require.Len(t, gl, len(wl))
	rounded := 0
	for i, v := range wl {
		u := math.Float32bits(v)
		r := math.Float32frombits((u + 0x7fff + (u>>16)&1) & 0xffff0000)
		require.Equal(t, r, gl[i], "layer %d latent %d", first, i)
		if r != v {
			rounded++
		}
	}
	require.Positive(t, rounded)
	// the logits: the rows up to the first differing greedy token see the
	// same inputs; the fixtures' random weights amplify small changes
	// through the routers (as with precision bf16, TestCUDABF16AgainstFixtures):
	// the figures are logged, the attention's own error is bounded by the
	// kernels' test (kernels/cuda TestMLAKernelsMatchCPU)
	worst, worstAbs, same := 0.0, 0.0, 0
	for c := c0; c < c0+len(want.Tokens); c++ {
		w, g := want.Logits[c], got.Logits[c]
		var num, den float64
		for i := range w {
			require.False(t, math.IsNaN(float64(g[i])) || math.IsInf(float64(g[i]), 0), "position %d logit %d", c, i)
			d := float64(w[i] - g[i])
			num += d * d
			den += float64(w[i]) * float64(w[i])
		}
		worst, worstAbs = max(worst, math.Sqrt(num/den)), max(worstAbs, maxDiff(w, g))
		if want.Tokens[c-c0] != got.Tokens[c-c0] {
			break
		}
		same++
	}
	t.Logf("bf16 latents against fp32 latents, the %d rows up to the first differing greedy token: relative L2 error ≤ %.3g, max |Δlogit| %.3g (tokens all equal: %v)", same+1, worst, worstAbs, slices.Equal(want.Tokens, got.Tokens))
	again := spectest.PlainRun(t, e, prompt, 10)
	require.Equal(t, got.Logits, again.Logits, "bf16 latents are deterministic")
	fs, bs := f32.Store().(backend.PagedStore).PageStats(), e.Store().(backend.PagedStore).PageStats()
	lat := 0
	for _, l := range cfg.TrunkLayers() {
		if cfg.IsDSA(l) {
			lat += 2 * P * cfg.KVLoraRank // the bytes bf16 saves per page and layer
		}
	}
	require.Equal(t, fs.PageBytes-int64(lat), bs.PageBytes)
	spectest.RollbackRun(t, e, got, 3, map[int]bool{1: true, 4: true})
	spectest.ForkRun(t, e, got, 3)
	bf16 := cudaEngine(t, ck, engine.Options{Slots: 1, Backend: backend.Options{Precision: backend.BF16}}).Store().(interface{ KVDType() backend.KVDType })
	require.Equal(t, backend.KVBF16, bf16.KVDType(), "auto under precision bf16")
	require.Equal(t, backend.KVFP32, f32.Store().(interface{ KVDType() backend.KVDType }).KVDType(), "auto under precision fp32")
}
