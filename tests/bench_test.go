package tests

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/model"
	"github.com/glmflash/glmflash/model/randckpt"
	"github.com/glmflash/glmflash/passes/autotune"
)

// benchCheckpoint returns the `bench` preset checkpoint, written once into
// $GLMFLASH_MODEL__CACHE_DIR (the model.cache_dir key's variable; default
// .cache/glmflash at the repository root).
func benchCheckpoint(b *testing.B) *model.Checkpoint {
	b.Helper()
	root := os.Getenv("GLMFLASH_MODEL__CACHE_DIR")
	if root == "" {
		root = filepath.Join("..", ".cache", "glmflash")
	}
	dir := filepath.Join(root, "bench-seed1")
	if _, err := os.Stat(filepath.Join(dir, "config.json")); err != nil {
		cfg, err := randckpt.Preset("bench")
		if err != nil {
			b.Fatal(err)
		}
		if err := randckpt.Write(dir, cfg, randckpt.Options{Seed: 1}); err != nil {
			b.Fatal(err)
		}
	}
	ck, err := model.Open(dir)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ck.Close() })
	return ck
}

// BenchmarkPasses measures, on the bench preset, a 512-token prefill and a
// decode step (batch 1, 64 cached tokens) with no pass, each pass alone, and
// all passes. Ratios of the on/off times are what a pass buys on this CPU.
//
//	go test ./tests -run '^$' -bench BenchmarkPasses -benchtime 3x -timeout 60m
func BenchmarkPasses(b *testing.B) {
	ck := benchCheckpoint(b)
	cfg := ck.Config()
	tdir := filepath.Join("..", "configs", "tuning")
	arms := []struct {
		name string
		reqs []pass.Request
	}{{name: "off"}}
	all := config.Default().Requests()
	for i, r := range all {
		if r.Name == autotune.Name {
			all[i].Options = map[string]any{"tune_at_start": true, "table_dir": tdir, "buckets": []int{1, 512}}
		}
		arms = append(arms, struct {
			name string
			reqs []pass.Request
		}{r.Name, []pass.Request{all[i]}})
	}
	arms = append(arms, struct {
		name string
		reqs []pass.Request
	}{"all", all})
	prompt := seqTokens(512, 1, cfg.VocabSize)
	for _, arm := range arms {
		pl, err := pass.NewPipeline(arm.reqs, true)
		if err != nil {
			b.Fatal(err)
		}
		e, err := engine.New(cfg, ck, engine.Options{Slots: 2, Passes: pl, PassEnv: &pass.Env{Model: cfg, Weights: ck, TP: pass.Topology{Size: 1, Known: true}, HostLengths: true}})
		if err != nil {
			b.Fatal(err)
		}
		b.Run(arm.name+"/prefill512", func(b *testing.B) {
			key := engine.Key{Mode: graph.Prefill, Logits: graph.LastLogits}
			if _, err := e.Program(key); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				s, _ := e.Store().Alloc()
				if _, err := e.Run(key, &backend.Batch{Seqs: []backend.Seq{{Slot: s, Tokens: prompt}}}); err != nil {
					b.Fatal(err)
				}
				e.Store().Free(s)
			}
			b.ReportMetric(float64(512*b.N)/b.Elapsed().Seconds(), "tokens/s")
		})
		b.Run(arm.name+"/decode", func(b *testing.B) {
			s, _ := e.Store().Alloc()
			defer e.Store().Free(s)
			if _, err := e.Run(engine.Key{Mode: graph.Prefill, Logits: graph.LastLogits}, &backend.Batch{Seqs: []backend.Seq{{Slot: s, Tokens: prompt[:64]}}}); err != nil {
				b.Fatal(err)
			}
			key := engine.Key{Mode: graph.Decode, Logits: graph.LastLogits}
			if _, err := e.Program(key); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := e.Run(key, &backend.Batch{Seqs: []backend.Seq{{Slot: s, Tokens: []int32{int32(i % cfg.VocabSize)}}}}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}
