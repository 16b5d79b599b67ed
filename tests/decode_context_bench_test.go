package tests

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/kernels/mla"
)

// BenchmarkDecodeContext measures batch-1 decode steps of the bench preset
// after a prefill of 32, 1024 and 8192 tokens, with the MLA kernel's expand
// path forced and with its cost rule (absorbed at decode), in paired,
// interleaved rounds of 16 steps (the order alternates between rounds, so
// drift and other load hit both arms). It reports each arm's median ms per
// step and the median of the rounds' auto/expand ratios.
// GLMFLASH_DECODE_ROUNDS sets the rounds (default 9).
//
//	go test ./tests -run '^$' -bench BenchmarkDecodeContext -benchtime 1x -timeout 60m
func BenchmarkDecodeContext(b *testing.B) {
	ck := benchCheckpoint(b)
	cfg := ck.Config()
	rounds := 9
	if v, err := strconv.Atoi(os.Getenv("GLMFLASH_DECODE_ROUNDS")); err == nil && v > 0 {
		rounds = v
	}
	const steps = 16
	e, err := engine.New(cfg, ck, engine.Options{Slots: 2})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { mla.Force = mla.PathAuto }()
	for _, ctx := range []int{32, 1024, 8192} {
		b.Run(fmt.Sprintf("ctx=%d", ctx), func(b *testing.B) {
			s, _ := e.Store().Alloc()
			defer e.Store().Free(s)
			if _, err := e.Run(engine.Key{Mode: graph.Prefill, Logits: graph.LastLogits}, &backend.Batch{Seqs: []backend.Seq{{Slot: s, Tokens: seqTokens(ctx, 1, cfg.VocabSize)}}}); err != nil {
				b.Fatal(err)
			}
			key := engine.Key{Mode: graph.Decode, Logits: graph.LastLogits}
			tok := 0
			run := func(p mla.Path) float64 {
				mla.Force = p
				t0 := time.Now()
				for i := 0; i < steps; i++ {
					tok++
					if _, err := e.Run(key, &backend.Batch{Seqs: []backend.Seq{{Slot: s, Tokens: []int32{int32(tok % cfg.VocabSize)}}}}); err != nil {
						b.Fatal(err)
					}
				}
				return float64(time.Since(t0).Microseconds()) / 1e3 / steps
			}
			run(mla.PathAuto) // warm-up
			var ex, au, ratio []float64
			for r := 0; r < rounds; r++ {
				var x, a float64
				if r%2 == 0 {
					x, a = run(mla.PathExpand), run(mla.PathAuto)
				} else {
					a, x = run(mla.PathAuto), run(mla.PathExpand)
				}
				ex, au, ratio = append(ex, x), append(au, a), append(ratio, a/x)
			}
			b.ReportMetric(median(ex), "expand-ms/step")
			b.ReportMetric(median(au), "auto-ms/step")
			b.ReportMetric(median(ratio), "auto/expand")
		})
	}
}

func median(x []float64) float64 {
	s := slices.Clone(x)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
