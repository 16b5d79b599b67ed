package tests

import (
	"fmt"
	"testing"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/cache"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/sched"
	"github.com/glmflash/glmflash/core/speculative"
	"github.com/glmflash/glmflash/core/speculative/spectest"
	"github.com/stretchr/testify/require"
)

// onePage is a page size that holds every sequence of these tests whole:
// the caches as they were before paging (contiguous per sequence).
const onePage = 1024

// Paging changes no number: with pages of index_kpool tokens (one pool per
// page, every context crossing many pages) a prefill and greedy decode
// give the logits and the states (latents, pooled keys, pending rows, KDA
// states) of one page per sequence bit for bit; rollback (Truncate across
// page boundaries) and Copy (forks into pages of their own) match the
// plain run on the small pages too.
func TestPagedCachesMatchOnePage(t *testing.T) {
	for _, name := range fixtures {
		t.Run(name, func(t *testing.T) {
			ck, _ := openFixture(t, name)
			cfg := ck.Config()
			P := cfg.IndexKPool
			V := cfg.VocabSize
			prompt := seqTokens(29, 5, V)
			flat := newEngine(t, ck, engine.Options{Slots: 2, PageTokens: onePage})
			want := spectest.PlainRun(t, flat, prompt, 24)
			e := newEngine(t, ck, engine.Options{Slots: 3, PageTokens: P, Rollback: 4})
			got := spectest.PlainRun(t, e, prompt, 24)
			require.Equal(t, want.Tokens, got.Tokens)
			for c, w := range want.Logits {
				require.Equal(t, w, got.Logits[c], "logits at %d tokens, pages of %d", c, P)
				spectest.RequireStateEqual(t, want.States[c], got.States[c], fmt.Sprintf("%d tokens, pages of %d", c, P))
			}
			spectest.RollbackRun(t, e, got, 3, map[int]bool{1: true, 4: true, 9: true, 16: true})
			spectest.ForkRun(t, e, got, 3)
			ps := e.Store().(backend.PagedStore).PageStats()
			require.Zero(t, ps.Used, "every page is back in the pool")
			require.Equal(t, P, ps.PageTokens)
		})
	}
}

// The scheduler's mixed batches (chunked prefill beside decode tokens and
// verify spans) on small pages give every request the tokens of one page
// per sequence.
func TestPagedServeGreedyIdentity(t *testing.T) {
	ck, _ := openFixture(t, fixtures[0])
	V := ck.Config().VocabSize
	reqs := specRequests(V)
	cfg := sched.Config{PrefillChunk: 16, MaxBatchTokens: 64}
	want := spectest.Serve(t, newEngine(t, ck, engine.Options{Slots: 4, PageTokens: onePage}), cfg, nil, reqs)
	P := ck.Config().IndexKPool
	got := spectest.Serve(t, newEngine(t, ck, engine.Options{Slots: 4, PageTokens: P}), cfg, nil, reqs)
	spectest.RequireSameTokens(t, want, got, fmt.Sprintf("pages of %d", P))
	e := newEngine(t, ck, engine.Options{Slots: 4, PageTokens: 2 * P, Rollback: 4})
	d, err := speculative.NewScripted("oracle", 3, speculative.Oracle(spectest.Truth(want, reqs), speculative.WrongRate(0.6, 7), V))
	require.NoError(t, err)
	spec := spectest.Serve(t, e, cfg, d, reqs)
	spectest.RequireSameTokens(t, want, spec, fmt.Sprintf("speculative, pages of %d", 2*P))
}

// A run that needs more pages than are free fails with backend.ErrNoPages
// before it changes anything (the lengths, the states and the pool of
// every sequence of the batch, the ones that would fit too); once pages
// are freed the same batch runs.
func TestRunOutOfPagesChangesNothing(t *testing.T) {
	ck, _ := openFixture(t, fixtures[0])
	cfg := ck.Config()
	P, V := cfg.IndexKPool, cfg.VocabSize
	e := newEngine(t, ck, engine.Options{Slots: 3, PageTokens: P, Pages: 5})
	st := e.Store()
	sr := st.(backend.StateReader)
	ps := st.(backend.PagedStore)
	pre := engine.Key{Mode: graph.Prefill, Logits: graph.LastLogits}
	a, _ := st.Alloc()
	b, _ := st.Alloc()
	c, _ := st.Alloc()
	_, err := e.Run(pre, &backend.Batch{Seqs: []backend.Seq{{Slot: a, Tokens: seqTokens(3*P-1, 1, V)}}})
	require.NoError(t, err)
	require.Equal(t, 3, ps.PageStats().Used)
	before := ps.PageStats()
	stA, err := sr.ReadState(a)
	require.NoError(t, err)
	// b fits (1 page), c does not (2 more): neither runs
	batch := &backend.Batch{Seqs: []backend.Seq{{Slot: b, Tokens: seqTokens(P, 2, V)}, {Slot: c, Tokens: seqTokens(P+1, 3, V)}}}
	_, err = e.Run(pre, batch)
	require.ErrorIs(t, err, backend.ErrNoPages)
	require.ErrorContains(t, err, "needs 3 more pages")
	require.Equal(t, before, ps.PageStats())
	for _, s := range []int{b, c} {
		n, err := st.Len(s)
		require.NoError(t, err)
		require.Zero(t, n)
	}
	gotA, err := sr.ReadState(a)
	require.NoError(t, err)
	spectest.RequireStateEqual(t, stA, gotA, "the held sequence")
	// a decode step of a that needs no new page still runs
	dec := engine.Key{Mode: graph.Decode, Logits: graph.LastLogits}
	_, err = e.Run(dec, &backend.Batch{Seqs: []backend.Seq{{Slot: a, Tokens: []int32{7}}}})
	require.NoError(t, err)
	require.Equal(t, 3, ps.PageStats().Used)
	// Copy needs pages too
	require.ErrorIs(t, st.Copy(a, b), backend.ErrNoPages)
	require.NoError(t, st.Free(a))
	_, err = e.Run(pre, batch)
	require.NoError(t, err)
	require.Equal(t, 3, ps.PageStats().Used)
}

// The CPU store holds fp32 or fp8 latents: kv dtype bf16 (and anything
// unknown) is refused, auto and fp32 are the same store, fp8 holds fp8.
func TestCPUStoreKVDType(t *testing.T) {
	ck, _ := openFixture(t, fixtures[0])
	be, err := backend.Open("cpu", backend.Options{})
	require.NoError(t, err)
	defer be.Close()
	cfg := ck.Config()
	_, err = be.NewStore(cfg, cfg.TrunkLayers(), backend.StoreOptions{Slots: 1, KVDType: backend.KVBF16})
	require.ErrorContains(t, err, "cpu: kv dtype bf16 is not implemented on the cpu backend")
	_, err = be.NewStore(cfg, cfg.TrunkLayers(), backend.StoreOptions{Slots: 1, KVDType: "fp16"})
	require.ErrorIs(t, err, backend.ErrKVDType)
	for _, d := range []backend.KVDType{"", backend.KVAuto, backend.KVFP32, backend.KVFP8} {
		st, err := be.NewStore(cfg, cfg.TrunkLayers(), backend.StoreOptions{Slots: 1, KVDType: d})
		require.NoError(t, err, "kv dtype %q", d)
		want := cache.KVF32
		if d == backend.KVFP8 {
			want = cache.KVFP8
		}
		require.Equal(t, want, st.(*cache.Store).KV(), "kv dtype %q", d)
	}
}
