package cpu_test

import (
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/cache"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/sample"
	"github.com/glmflash/glmflash/model"
	"github.com/stretchr/testify/require"
)

// allocEngine opens an engine on the tiny fixture and prefills n sequences
// of 9 + i tokens each; it returns the engine and a decode batch over them
// whose token slices the caller may rewrite between steps.
func allocEngine(t testing.TB, n int) (*engine.Engine, *backend.Batch) {
	t.Helper()
	ck, err := model.Open(filepath.Join("..", "..", "..", "testdata", "glm5next-tiny-a", "checkpoint"))
	require.NoError(t, err)
	t.Cleanup(func() { ck.Close() })
	e, err := engine.New(ck.Config(), ck, engine.Options{Slots: n})
	require.NoError(t, err)
	t.Cleanup(func() { e.Close() })
	V := ck.Config().VocabSize
	pre := &backend.Batch{}
	dec := &backend.Batch{}
	for i := range n {
		s, err := e.Store().Alloc()
		require.NoError(t, err)
		toks := make([]int32, 9+i)
		for j := range toks {
			toks[j] = int32((j*31 + i*7 + 1) % V)
		}
		pre.Seqs = append(pre.Seqs, backend.Seq{Slot: s, Tokens: toks})
		dec.Seqs = append(dec.Seqs, backend.Seq{Slot: s, Tokens: []int32{int32(5 + i)}})
		dec.Into = &backend.Result{}
	}
	_, err = e.Run(engine.Key{Mode: graph.Prefill, Logits: graph.LastLogits}, pre)
	require.NoError(t, err)
	return e, dec
}

// site is what a calling site allocated.
type site struct{ objects, bytes int64 }

// allocSites runs f with every allocation profiled and returns what was
// allocated per calling site, keyed by the innermost frame of this module.
func allocSites(f func()) map[string]site {
	old := runtime.MemProfileRate
	runtime.MemProfileRate = 1
	defer func() { runtime.MemProfileRate = old }()
	snap := func() map[[32]uintptr]site {
		runtime.GC()
		runtime.GC() // the profile is published a cycle late
		var recs []runtime.MemProfileRecord
		n, _ := runtime.MemProfile(nil, true)
		for {
			recs = make([]runtime.MemProfileRecord, n+64)
			var ok bool
			if n, ok = runtime.MemProfile(recs, true); ok {
				recs = recs[:n]
				break
			}
		}
		m := map[[32]uintptr]site{}
		for _, r := range recs {
			s := m[r.Stack0]
			s.objects += r.AllocObjects
			s.bytes += r.AllocBytes
			m[r.Stack0] = s
		}
		return m
	}
	before := snap()
	f()
	after := snap()
	sites := map[string]site{}
	for stk, n := range after {
		if d := n.objects - before[stk].objects; d > 0 {
			s := sites[allocSite(stk[:])]
			s.objects += d
			s.bytes += n.bytes - before[stk].bytes
			sites[allocSite(stk[:])] = s
		}
	}
	return sites
}

// allocSite names the innermost frame of this module in a stack.
func allocSite(stk []uintptr) string {
	frames := runtime.CallersFrames(stk)
	for {
		fr, more := frames.Next()
		if strings.Contains(fr.Function, "glmflash/glmflash/") {
			return fmt.Sprintf("%s (%s:%d)", fr.Function, filepath.Base(fr.File), fr.Line)
		}
		if !more {
			return "runtime"
		}
	}
}

// cacheGrowth reports whether a site is a sequence cache growing with the
// context (a page's buffers made the first time its id is taken, a page
// table growing by append: geometrically, once per doubling).
func cacheGrowth(name string) bool {
	for _, s := range []string{"cache.(*Store).pageLocked", "cache.(*Store).takeLocked", "allocSites"} {
		if strings.Contains(name, s) {
			return true
		}
	}
	return false
}

// reserveCaches gives every held sequence the pages of n more tokens, so
// that a measurement over n steps does not depend on where new pages fall.
func reserveCaches(t testing.TB, e *engine.Engine, slots []int, n int) {
	t.Helper()
	st, ok := e.Store().(*cache.Store)
	require.True(t, ok)
	var tokens []int
	for _, slot := range slots {
		l, err := st.Len(slot)
		require.NoError(t, err)
		tokens = append(tokens, l+n)
	}
	require.NoError(t, st.Reserve(slots, tokens))
}

// In the steady state a decode step (batch 1 and batch 8, and batch 8
// with greedy samples only, as glmflash bench runs it) allocates nothing: activations come from the program's arena, scratch from
// workspaces and pools kept across runs, the prepared batch and the result
// (Batch.Into) are reused, and parallel regions run from bodies made once.
// The only allocations left are the sequence caches' geometric growth
// (cacheGrowth: a few per doubling of the context), which reserveCaches
// takes out of the measurement; the count with them is logged.
// A prefill of a repeated shape allocates at most prefillBound objects
// (the result it returns, and cache growth).
func TestSteadyStateAllocations(t *testing.T) {
	const steps, prefillBound = 20, 32
	for _, c := range []struct {
		n      int
		sample bool
	}{{1, false}, {8, false}, {8, true}} {
		n := c.n
		e, dec := allocEngine(t, n)
		if c.sample { // greedy picks only, as glmflash bench decodes
			dec.Sample, dec.SamplesOnly = make([]backend.SampleSpec, n), true
			for i := range dec.Sample {
				dec.Sample[i].Params = sample.Greedy()
			}
		}
		key := engine.Key{Mode: graph.Decode, Logits: graph.LastLogits}
		step := func() {
			if _, err := e.Run(key, dec); err != nil {
				panic(err)
			}
		}
		for range 3 {
			step()
		}
		var slots []int
		for _, s := range dec.Seqs {
			slots = append(slots, s.Slot)
		}
		var ms0, ms1 runtime.MemStats
		runtime.ReadMemStats(&ms0)
		for range 4 * steps {
			step()
		}
		runtime.ReadMemStats(&ms1)
		t.Logf("batch %d: %d allocations in %d decode steps with the caches and context-sized scratch growing (doubling)", n, ms1.Mallocs-ms0.Mallocs, 4*steps)
		reserveCaches(t, e, slots, steps+2)
		got := testing.AllocsPerRun(steps, step)
		t.Logf("batch %d (greedy samples only: %v): %v allocations per decode step (testing.AllocsPerRun over %d steps, cache room reserved)", n, c.sample, got, steps)
		if raceEnabled {
			continue // sync.Pool drops items at random under the race detector
		}
		if got != 0 {
			// name the sites (the profile's garbage collections empty the
			// sync.Pools, whose refills are listed too)
			for name, s := range allocSites(func() {
				for range steps {
					step()
				}
			}) {
				if !cacheGrowth(name) {
					t.Logf("%s: %d objects, %d bytes in %d steps", name, s.objects, s.bytes, steps)
				}
			}
		}
		require.Zero(t, got, "decode batch %d", n)
	}
	e, _ := allocEngine(t, 1)
	toks := make([]int32, 19)
	for j := range toks {
		toks[j] = int32(j*13%200 + 1)
	}
	key := engine.Key{Mode: graph.Prefill, Logits: graph.LastLogits}
	prefill := func() {
		s, err := e.Store().Alloc()
		if err == nil {
			_, err = e.Run(key, &backend.Batch{Seqs: []backend.Seq{{Slot: s, Tokens: toks}}})
		}
		if err == nil {
			err = e.Store().Free(s)
		}
		if err != nil {
			panic(err)
		}
	}
	require.NoError(t, e.Store().Free(0))
	for range 3 {
		prefill()
	}
	got := testing.AllocsPerRun(5, prefill)
	t.Logf("prefill of 19 tokens: %v allocations (testing.AllocsPerRun)", got)
	if raceEnabled {
		return
	}
	require.LessOrEqual(t, got, float64(prefillBound))
}

func BenchmarkDecodeStep(b *testing.B) {
	for _, n := range []int{1, 8} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			e, dec := allocEngine(b, n)
			key := engine.Key{Mode: graph.Decode, Logits: graph.LastLogits}
			for range 3 {
				if _, err := e.Run(key, dec); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if _, err := e.Run(key, dec); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// A long context prefilled in chunks, as bench and a server run long
// prompts, allocates no more per chunk than a short prefill once the shapes
// have been seen: 3 chunks of 160 tokens (GEMMs of 160 rows, more strips
// than the kernels' stack arrays; MLA over a growing context by either
// path; the indexer's selections) into a slot freed and taken again, so the
// caches keep their room. Garbage here grows the heap to the collector's
// goal, twice the live heap, over a long run: the peak RSS of glmflash
// bench --decode-context (452 allocations per context before the strip
// lists were pooled, 440 of them strip lists; 12 now).
func TestChunkedPrefillAllocations(t *testing.T) {
	const chunk, chunks, perChunkBound = 160, 3, 32
	e, _ := allocEngine(t, 1)
	require.NoError(t, e.Store().Free(0))
	V := 256
	toks := make([]int32, chunk*chunks)
	for j := range toks {
		toks[j] = int32((j*29+3)%(V-1) + 1)
	}
	key := engine.Key{Mode: graph.Prefill, Logits: graph.LastLogits}
	res := &backend.Result{}
	fill := func() {
		s, err := e.Store().Alloc()
		for c := 0; c < chunks && err == nil; c++ {
			_, err = e.Run(key, &backend.Batch{Seqs: []backend.Seq{{Slot: s, Tokens: toks[c*chunk : (c+1)*chunk]}}, Into: res})
		}
		if err == nil {
			err = e.Store().Free(s)
		}
		if err != nil {
			panic(err)
		}
	}
	for range 3 {
		fill()
	}
	got := testing.AllocsPerRun(5, fill)
	t.Logf("a context of %d tokens in %d chunks: %v allocations (testing.AllocsPerRun)", chunk*chunks, chunks, got)
	if raceEnabled {
		return
	}
	if got > chunks*perChunkBound {
		for name, s := range allocSites(fill) {
			t.Logf("%s: %d objects, %d bytes", name, s.objects, s.bytes)
		}
	}
	require.LessOrEqual(t, got, float64(chunks*perChunkBound))
}
