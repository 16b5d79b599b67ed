package main

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/glmflash/glmflash/model/randckpt"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"
)

// probe exercises one flag: it runs args and either wants an error naming
// the problem (want) or checks what the command did (check).
type probe struct {
	args  []string
	want  string
	check func(t *testing.T, dir, out string, err error)
}

// Every documented flag works on every command that lists it, or is
// refused: each (command, flag) pair has a probe below that shows the flag
// is read (a bad value is an error naming it, a good one has its effect, a
// flag that does not apply is refused). A new flag without a probe fails
// this test.
func TestEveryFlagIsHonouredOrRefused(t *testing.T) {
	m := fixture + "/checkpoint"
	ref := fixture + "/reference.safetensors"
	badPass := func(dir string) string {
		p := filepath.Join(dir, "bad.yaml")
		require.NoError(t, os.WriteFile(p, []byte("passes:\n  - name: no-such-pass\n"), 0o644))
		return p
	}
	gen := []string{"generate", "--model", m, "--prompt-ids", "1,2,3", "--max-tokens", "2"}
	bench := []string{"bench", "--model", m, "--prompt", "4", "--decode-steps", "1", "--reps", "1", "--warmup", "0", "--batch", "1"}
	explain := []string{"passes", "explain", "--model", m}
	pbench := []string{"passes", "bench", "--model", m, "--prompt", "4", "--steps", "1", "--rounds", "1", "--warmup", "0", "--batch", "1", "--pass", "host-length-reuse"}
	graph := []string{"graph", "--model", m}
	args := func(base []string, more ...string) []string { return append(append([]string(nil), base...), more...) }
	probes := map[string]func(dir string) probe{
		"glmflash --log-level": func(string) probe {
			return probe{args: []string{"--log-level", "loud", "passes", "list"}, want: "--log-level"}
		},
		"glmflash --log-format": func(string) probe {
			return probe{args: []string{"--log-format", "xml", "passes", "list"}, want: "--log-format"}
		},
		"glmflash --version": func(string) probe {
			return probe{args: []string{"--version"}, check: func(t *testing.T, d, out string, err error) {
				require.NoError(t, err)
				require.Contains(t, out, "glmflash version ")
				require.Contains(t, out, " go1.")
			}}
		},

		"eval --check-tensors": func(d string) probe {
			return probe{args: []string{"eval", "--model", poisoned(t, d), "--reference", ref, "--check-tensors"}, want: "tensor model.language_model.layers.2.mlp.up_proj.weight: 1 non-finite values"}
		},
		"generate --check-tensors": func(d string) probe {
			return probe{args: []string{"generate", "--model", poisoned(t, d), "--prompt-ids", "1", "--check-tensors"}, want: "tensor model.language_model.layers.2.mlp.up_proj.weight: 1 non-finite values"}
		},
		"bench --check-tensors": func(d string) probe {
			return probe{args: []string{"bench", "--model", poisoned(t, d), "--check-tensors"}, want: "tensor model.language_model.layers.2.mlp.up_proj.weight: 1 non-finite values"}
		},
		"eval --config": func(d string) probe {
			return probe{args: []string{"eval", "--model", m, "--reference", ref, "--config", badPass(d)}, want: `unknown pass "no-such-pass"`}
		},
		"eval --dump-graph": func(string) probe {
			return probe{args: []string{"eval", "--model", m, "--reference", ref, "--dump-graph", "pretty"}, want: "--dump-graph"}
		},
		"eval --model": func(d string) probe {
			return probe{args: []string{"eval", "--model", d + "/none", "--reference", ref}, want: d + "/none"}
		},
		"eval --reference": func(d string) probe {
			return probe{args: []string{"eval", "--model", m, "--reference", d + "/none.safetensors"}, want: "none"}
		},
		"eval --versus": func(string) probe {
			return probe{args: []string{"eval", "--model", m, "--versus", "fp16"}, want: "--versus must be fp32 or bf16"}
		},
		"eval --prompt-len": func(string) probe {
			return probe{args: []string{"eval", "--model", m, "--versus", "bf16", "--prompt-len", "0"}, want: "--prompt-len must be ≥ 1"}
		},
		"eval --prompts": func(string) probe {
			return probe{args: []string{"eval", "--model", m, "--versus", "bf16", "--prompts", "17"}, want: "--prompts in [1, 16]"}
		},
		"eval --steps": func(string) probe {
			return probe{args: []string{"eval", "--model", m, "--versus", "bf16", "--steps", "-1"}, want: "--steps ≥ 0"}
		},
		"eval --tol": func(string) probe {
			return probe{args: []string{"eval", "--model", m, "--reference", ref, "--tol", "0"}, want: "--tol"}
		},

		"generate --cache-dir": func(string) probe {
			return probe{args: args(gen, "--cache-dir", "x"), want: "--cache-dir applies to --preset only"}
		},
		"generate --config": func(d string) probe {
			return probe{args: args(gen, "--config", badPass(d)), want: `unknown pass "no-such-pass"`}
		},
		"generate --dump-graph": func(string) probe { return probe{args: args(gen, "--dump-graph", "pretty"), want: "--dump-graph"} },
		"generate --fp8":        func(string) probe { return probe{args: args(gen, "--fp8"), want: "--fp8 applies to --preset only"} },
		"generate --ignore-eos": func(d string) probe {
			// a copy of the fixture whose generation_config.json makes the
			// first greedy token (1,2,3 → see TestGenerateStopsAtEOS) an EOS
			ck := eosCheckpoint(t, d)
			return probe{args: []string{"generate", "--model", ck, "--prompt-ids", "1,2,3", "--max-tokens", "4", "--ignore-eos"}, check: func(t *testing.T, d, out string, err error) {
				require.NoError(t, err)
				require.Contains(t, out, "finish   length")
			}}
		},
		"generate --max-tokens": func(string) probe { return probe{args: args(gen, "--max-tokens", "0"), want: "--max-tokens"} },
		"generate --min-p":      func(string) probe { return probe{args: args(gen, "--min-p", "1.5"), want: "min_p"} },
		"generate --model": func(d string) probe {
			return probe{args: []string{"generate", "--model", d + "/none", "--prompt-ids", "1"}, want: d + "/none"}
		},
		"generate --preset": func(string) probe {
			return probe{args: []string{"generate", "--preset", "huge", "--prompt-ids", "1"}, want: `unknown preset "huge"`}
		},
		"generate --prompt-ids": func(string) probe {
			return probe{args: []string{"generate", "--model", m, "--prompt-ids", "1,x"}, want: "--prompt-ids"}
		},
		"generate --prompt": func(d string) probe {
			// the text checkpoint's tokenizer is bytes only: one token a byte
			return probe{args: []string{"generate", "--model", textCheckpoint(t, d), "--prompt", "Hello", "--max-tokens", "1"}, check: func(t *testing.T, d, out string, err error) {
				require.NoError(t, err)
				require.Contains(t, out, "prompt   5 tokens")
			}}
		},
		"generate --chat": func(d string) probe {
			return probe{args: []string{"generate", "--model", textCheckpoint(t, d), "--chat", "hi", "--max-tokens", "1"}, check: func(t *testing.T, d, out string, err error) {
				require.NoError(t, err)
				require.Contains(t, out, fmt.Sprintf("prompt   %d tokens", len("user: hi\nassistant:")), "rendered with the template")
			}}
		},
		"generate --system": func(d string) probe {
			ck := textCheckpoint(t, d)
			return probe{args: []string{"generate", "--model", ck, "--chat", "hi", "--system", "Be brief.", "--max-tokens", "1"}, check: func(t *testing.T, d, out string, err error) {
				require.NoError(t, err)
				require.Contains(t, out, fmt.Sprintf("prompt   %d tokens", len("system: Be brief.\nuser: hi\nassistant:")))
				_, err = runCLI(t, "generate", "--model", ck, "--prompt", "hi", "--system", "Be brief.")
				require.ErrorContains(t, err, "--system applies to --chat only")
			}}
		},
		"generate --sample-seed": func(string) probe { return probe{args: args(gen, "--sample-seed", "x"), want: "sample-seed"} },
		"generate --seed": func(string) probe {
			return probe{args: args(gen, "--seed", "2"), want: "--seed applies to --preset only"}
		},
		"generate --stop-ids":    func(string) probe { return probe{args: args(gen, "--stop-ids", "1,y"), want: "--stop-ids"} },
		"generate --temperature": func(string) probe { return probe{args: args(gen, "--temperature", "-1"), want: "temperature"} },
		"generate --top-k":       func(string) probe { return probe{args: args(gen, "--top-k", "-1"), want: "top_k"} },
		"generate --top-p":       func(string) probe { return probe{args: args(gen, "--top-p", "0"), want: "top_p"} },

		"bench --batch": func(string) probe { return probe{args: args(bench, "--batch", "0"), want: "--batch"} },
		"bench --cache-dir": func(string) probe {
			return probe{args: args(bench, "--cache-dir", "x"), want: "--cache-dir applies to --preset only"}
		},
		"bench --config": func(d string) probe {
			return probe{args: args(bench, "--config", badPass(d)), want: `unknown pass "no-such-pass"`}
		},
		"bench --cpuprofile": func(d string) probe {
			return probe{args: args(bench, "--cpuprofile", d+"/no/such/dir/cpu.out"), want: "cpu.out"}
		},
		"bench --memprofile": func(d string) probe {
			return probe{args: args(bench, "--memprofile", d+"/no/such/dir/mem.out"), want: "mem.out"}
		},
		"bench --sample-mask": func(string) probe {
			return probe{args: args(bench, "--sample-mask"), check: func(t *testing.T, d, out string, err error) {
				require.NoError(t, err)
				require.Contains(t, out, "decode batch 1 mask+edits")
				require.Contains(t, out, "logits processing (an allow mask")
			}}
		},
		"bench --decode-steps": func(string) probe { return probe{args: args(bench, "--decode-steps", "0"), want: "--decode-steps"} },
		"bench --dump-graph":   func(string) probe { return probe{args: args(bench, "--dump-graph", "pretty"), want: "--dump-graph"} },
		"bench --fp8":          func(string) probe { return probe{args: args(bench, "--fp8"), want: "--fp8 applies to --preset only"} },
		"bench --json": func(d string) probe {
			return probe{args: args(bench, "--json", d+"/b.json"), check: func(t *testing.T, d, out string, err error) {
				require.NoError(t, err)
				b, err := os.ReadFile(d + "/b.json")
				require.NoError(t, err)
				require.Contains(t, string(b), `"peak_rss_mib"`)
			}}
		},
		"bench --model": func(d string) probe { return probe{args: []string{"bench", "--model", d + "/none"}, want: d + "/none"} },
		"bench --bandwidth-gbs": func(d string) probe {
			return probe{args: args(bench, "--bandwidth-gbs", "1000", "--json", d+"/b.json"), check: func(t *testing.T, d, out string, err error) {
				require.NoError(t, err)
				require.Contains(t, out, "÷ 1000 GB/s")
				b, err := os.ReadFile(d + "/b.json")
				require.NoError(t, err)
				require.Contains(t, string(b), `"bandwidth_gbs": 1000`)
			}}
		},
		"bench --limits": func(d string) probe {
			lim := writeLimits(t, 100, 200, 7)
			return probe{args: args(bench, "--limits", lim), check: func(t *testing.T, d, out string, err error) {
				require.NoError(t, err)
				require.Contains(t, out, "limits   from "+lim)
				require.Contains(t, out, "÷ 7 GB/s")
				_, err = runCLI(t, args(bench, "--limits", d+"/none.json")...)
				require.ErrorContains(t, err, "--limits: open "+d+"/none.json")
			}}
		},
		"bench --gemm-report": func(string) probe {
			return probe{args: args(bench, "--gemm-report"), want: "--gemm-report: the cpu backend does not measure its GEMMs"}
		},
		"bench --peak-tflops": func(string) probe {
			return probe{args: args(bench, "--peak-tflops", "0"), want: "--peak-tflops > 0"}
		},
		"bench --preset": func(string) probe {
			return probe{args: []string{"bench", "--preset", "huge"}, want: `unknown preset "huge"`}
		},
		"bench --prompt": func(string) probe {
			return probe{args: args(bench, "--prompt", "1000000000"), want: "--prompt (1000000000) and --decode-context + --decode-steps (33) must fit max_position_embeddings (4096)"}
		},
		"bench --decode-context": func(string) probe {
			return probe{args: args(bench, "--decode-context", "5000"), want: "--decode-context + --decode-steps (5001) must fit max_position_embeddings (4096)"}
		},
		"bench --reps": func(string) probe {
			return probe{args: args(bench, "--reps", "100000"), want: "--reps + --warmup must be at most 1000"}
		},
		"bench --seed": func(string) probe {
			return probe{args: args(bench, "--seed", "3"), want: "--seed applies to --preset only"}
		},
		"bench --warmup": func(string) probe { return probe{args: args(bench, "--warmup", "-1"), want: "--warmup"} },
		"bench --mixed-chunk": func(string) probe {
			return probe{args: args(bench, "--mixed-chunk", "-1"), want: "--mixed-chunk must be ≥ 0"}
		},
		"bench --spec-accept": func(string) probe {
			return probe{args: args(bench, "--spec-accept", "1.5"), want: "--spec-accept values must be in [0, 1]"}
		},
		"bench --spec-accept-len": func(string) probe {
			return probe{args: args(bench, "--spec-accept-len", "7"), want: "--spec-accept-len values must be in [1, 6] (num_steps + 1 at 5 drafts per verify step), got 7"}
		},
		"bench --spec-drafter": func(string) probe {
			return probe{args: args(bench, "--spec-drafter", "configured"), check: func(t *testing.T, _, _ string, err error) {
				require.ErrorContains(t, err, "--spec-drafter configured needs a drafter: give --speculative")
				_, err = runCLI(t, args(bench, "--spec-drafter", "mtp")...)
				require.ErrorContains(t, err, `--spec-drafter must be configured, simulated or scripted, got "mtp"`)
			}}
		},
		"bench --draft-model": func(d string) probe {
			return probe{args: args(bench, "--speculative", "dflash", "--draft-model", d+"/none"), want: d + "/none"}
		},
		"bench --speculative": func(string) probe {
			return probe{args: args(bench, "--speculative", "mtp:3"), want: "--speculative mtp 3-1-4: the checkpoint has no MTP layer"}
		},

		"init-random --force": func(d string) probe {
			require.NoError(t, os.WriteFile(d+"/keep", []byte("x"), 0o644))
			return probe{args: []string{"init-random", "--out", d, "--force"}, check: func(t *testing.T, d, out string, err error) {
				require.NoError(t, err)
				require.FileExists(t, d+"/config.json")
			}}
		},
		"init-random --fp8": func(d string) probe {
			return probe{args: []string{"init-random", "--out", d + "/ck", "--fp8"}, check: func(t *testing.T, d, out string, err error) {
				require.NoError(t, err)
				b, _ := os.ReadFile(d + "/ck/config.json")
				require.Contains(t, string(b), "quantization_config")
			}}
		},
		"init-random --drafter-only": func(d string) probe {
			return probe{args: []string{"init-random", "--preset", "tiny", "--out", d, "--drafter-only"}, want: "--drafter-only needs a -dflash preset"}
		},
		"init-random --out": func(string) probe { return probe{args: []string{"init-random"}, want: "--out is required"} },
		"init-random --set": func(d string) probe {
			return probe{args: []string{"init-random", "--out", d + "/s", "--set", "no_such_field=1"}, want: "--set no_such_field: not a text_config field"}
		},
		"init-random --preset": func(d string) probe {
			return probe{args: []string{"init-random", "--out", d + "/ck", "--preset", "huge"}, want: `unknown preset "huge"`}
		},
		"init-random --seed": func(d string) probe {
			return probe{args: []string{"init-random", "--out", d + "/s2", "--seed", "2"}, check: func(t *testing.T, d, out string, err error) {
				require.NoError(t, err)
				_, err = runCLI(t, "init-random", "--out", d+"/s1", "--seed", "1")
				require.NoError(t, err)
				a, _ := os.ReadFile(d + "/s1/model.safetensors")
				b, _ := os.ReadFile(d + "/s2/model.safetensors")
				require.NotEqual(t, a, b, "another seed, other weights")
			}}
		},
		"init-random --shard-mib": func(d string) probe {
			return probe{args: []string{"init-random", "--out", d + "/ck", "--shard-mib", "-1"}, want: "--shard-mib"}
		},

		"graph --cache-dir": func(string) probe {
			return probe{args: args(graph, "--cache-dir", "x"), want: "--cache-dir applies to --preset only"}
		},
		"graph --dflash": func(d string) probe {
			cfg, err := randckpt.Preset("tiny")
			require.NoError(t, err)
			dc, err := randckpt.DFlashPreset("tiny-dflash", cfg)
			require.NoError(t, err)
			require.NoError(t, randckpt.WriteDFlash(d+"/dflash", dc, randckpt.Options{Seed: 1}))
			return probe{args: args(graph, "--dflash", d+"/dflash"), check: func(t *testing.T, d, out string, err error) {
				require.NoError(t, err)
				require.Contains(t, out, "dflash_attn")
				require.Contains(t, out, "f32[C,128]")
				_, err = runCLI(t, args(graph, "--dflash", d+"/dflash", "--mtp")...)
				require.ErrorContains(t, err, "--mtp and --capture-hidden do not apply")
			}}
		},
		"graph --capture-hidden": func(string) probe {
			return probe{args: args(graph, "--capture-hidden", "--format", "text"), check: func(t *testing.T, d, out string, err error) {
				require.NoError(t, err)
				require.Contains(t, out, "hidden")
			}}
		},
		"graph --format": func(string) probe { return probe{args: args(graph, "--format", "pretty"), want: "--format"} },
		"graph --fp8":    func(string) probe { return probe{args: args(graph, "--fp8"), want: "--fp8 applies to --preset only"} },
		"graph --logits": func(string) probe { return probe{args: args(graph, "--logits", "some"), want: "--logits"} },
		"graph --mode":   func(string) probe { return probe{args: args(graph, "--mode", "sideways"), want: "--mode"} },
		"graph --model":  func(d string) probe { return probe{args: []string{"graph", "--model", d + "/none"}, want: d + "/none"} },
		"graph --mtp": func(d string) probe {
			return probe{args: []string{"graph", "--preset", "tiny-mtp", "--cache-dir", d, "--mtp", "--mode", "decode"}, check: func(t *testing.T, d, out string, err error) {
				require.NoError(t, err)
				require.Contains(t, out, "graph glm5_next_mtp")
				require.Contains(t, out, "layers.8.eh_proj.weight")
				require.NotContains(t, out, "mhc_pre")
			}}
		},
		"graph --preset": func(string) probe {
			return probe{args: []string{"graph", "--preset", "huge"}, want: `unknown preset "huge"`}
		},
		"graph --seed": func(string) probe {
			return probe{args: args(graph, "--seed", "2"), want: "--seed applies to --preset only"}
		},

		"passes list --config": func(d string) probe {
			return probe{args: []string{"passes", "list", "--config", d + "/none.yaml"}, want: "none.yaml"}
		},

		"passes explain --cache-dir": func(string) probe {
			return probe{args: args(explain, "--cache-dir", "x"), want: "--cache-dir applies to --preset only"}
		},
		"passes explain --dflash": func(d string) probe {
			cfg, err := randckpt.Preset("tiny")
			require.NoError(t, err)
			dc, err := randckpt.DFlashPreset("tiny-dflash", cfg)
			require.NoError(t, err)
			require.NoError(t, randckpt.WriteDFlash(d+"/dflash", dc, randckpt.Options{Seed: 1}))
			return probe{args: args(explain, "--dflash", d+"/dflash"), check: func(t *testing.T, d, out string, err error) {
				require.NoError(t, err)
				require.Contains(t, out, "pass report for dflash:extend/spans")
				require.Contains(t, out, "draft graph: ")
				_, err = runCLI(t, args(explain, "--dflash", d+"/dflash", "--mtp")...)
				require.ErrorContains(t, err, "--dflash and --mtp name two draft graphs")
				_, err = runCLI(t, args(explain, "--dflash", d+"/none")...)
				require.ErrorContains(t, err, "--dflash: ")
			}}
		},
		"passes explain --config": func(d string) probe {
			return probe{args: args(explain, "--config", badPass(d)), want: `unknown pass "no-such-pass"`}
		},
		"passes explain --dump":   func(string) probe { return probe{args: args(explain, "--dump", "during"), want: "--dump"} },
		"passes explain --format": func(string) probe { return probe{args: args(explain, "--format", "xml"), want: "--format"} },
		"passes explain --fp8":    func(string) probe { return probe{args: args(explain, "--fp8"), want: "--fp8 applies to --preset only"} },
		"passes explain --logits": func(string) probe { return probe{args: args(explain, "--logits", "some"), want: "--logits"} },
		"passes explain --mode":   func(string) probe { return probe{args: args(explain, "--mode", "sideways"), want: "sideways"} },
		"passes explain --model": func(d string) probe {
			return probe{args: []string{"passes", "explain", "--model", d + "/none"}, want: d + "/none"}
		},
		"passes explain --index-share": func(string) probe {
			return probe{args: args(explain, "--index-share", "2"), want: "--index-share applies to the MTP graph (--mtp)"}
		},
		"passes explain --mtp": func(d string) probe {
			return probe{args: []string{"passes", "explain", "--preset", "tiny-mtp", "--cache-dir", d, "--mtp", "--mode", "verify", "--index-share", "4"}, check: func(t *testing.T, d, out string, err error) {
				require.NoError(t, err)
				require.Contains(t, out, "pass report for mtp:verify/last")
				require.Contains(t, out, "host-length-reuse: draft graph: ")
				require.Contains(t, out, "host-length-reuse: readers_rewired = 1")
			}}
		},
		"passes explain --preset": func(string) probe {
			return probe{args: []string{"passes", "explain", "--preset", "huge"}, want: `unknown preset "huge"`}
		},
		"passes explain --seed": func(string) probe {
			return probe{args: args(explain, "--seed", "2"), want: "--seed applies to --preset only"}
		},

		"passes bench --against": func(string) probe {
			return probe{args: args(pbench, "--against", "some"), want: "--against must be baseline or all"}
		},
		"passes bench --batch": func(string) probe { return probe{args: args(pbench, "--batch", "0"), want: "--batch"} },
		"passes bench --cache-dir": func(string) probe {
			return probe{args: args(pbench, "--cache-dir", "x"), want: "--cache-dir applies to --preset only"}
		},
		"passes bench --config": func(d string) probe {
			return probe{args: args(pbench, "--config", d+"/none.yaml"), want: "none.yaml"}
		},
		"passes bench --device": func(string) probe {
			return probe{args: args(pbench, "--device", "tpu"), want: `--device: unknown device "tpu"`}
		},
		"passes bench --fp8": func(string) probe { return probe{args: args(pbench, "--fp8"), want: "--fp8 applies to --preset only"} },
		"passes bench --json": func(d string) probe {
			return probe{args: args(pbench, "--json", d+"/pb.json"), check: func(t *testing.T, d, out string, err error) {
				require.NoError(t, err)
				b, err := os.ReadFile(d + "/pb.json")
				require.NoError(t, err)
				require.Contains(t, string(b), `"speedup"`)
			}}
		},
		"passes bench --model": func(d string) probe {
			return probe{args: []string{"passes", "bench", "--model", d + "/none"}, want: d + "/none"}
		},
		"passes bench --pass": func(string) probe {
			return probe{args: args(pbench, "--pass", "warp-drive"), want: "--pass warp-drive: no such pass"}
		},
		"passes bench --precision": func(string) probe {
			return probe{args: args(pbench, "--precision", "fp16"), want: `precision (flag --precision): must be fp32 or bf16, got "fp16"`}
		},
		"passes bench --preset": func(string) probe {
			return probe{args: []string{"passes", "bench", "--preset", "huge"}, want: `unknown preset "huge"`}
		},
		"passes bench --prompt": func(string) probe {
			return probe{args: args(pbench, "--prompt", "1000000000"), want: "--prompt (1000000000) and 32 + --steps (33) must fit max_position_embeddings (4096)"}
		},
		"passes bench --rounds": func(string) probe { return probe{args: args(pbench, "--rounds", "0"), want: "--rounds must be ≥ 1"} },
		"passes bench --seed": func(string) probe {
			return probe{args: args(pbench, "--seed", "2"), want: "--seed applies to --preset only"}
		},
		"passes bench --steps":  func(string) probe { return probe{args: args(pbench, "--steps", "0"), want: "--steps"} },
		"passes bench --warmup": func(string) probe { return probe{args: args(pbench, "--warmup", "-1"), want: "--warmup"} },

		"serve --config": func(d string) probe {
			return probe{args: []string{"serve", "--config", d + "/none.yaml"}, want: "none.yaml"}
		},
		"serve --host": func(d string) probe {
			// 192.0.2.1 (TEST-NET-1) is no address of this machine
			return probe{args: []string{"serve", "--config", serveConfig(t, d), "--host", "192.0.2.1"}, want: "listen tcp 192.0.2.1:0"}
		},
		"serve --port": func(d string) probe {
			return probe{args: []string{"serve", "--config", serveConfig(t, d), "--port", "70000"}, want: "--port must be in [0, 65535]"}
		},
		"serve --http-port": func(d string) probe {
			return probe{args: []string{"serve", "--config", serveConfig(t, d), "--http-port", "-1"}, want: "--http-port must be in [0, 65535]"}
		},
		"serve --metrics-port": func(d string) probe {
			return probe{args: []string{"serve", "--config", serveConfig(t, d), "--metrics-port", "65536"}, want: "--metrics-port must be in [0, 65535]"}
		},
		"serve --model": func(d string) probe {
			return probe{args: []string{"serve", "--config", serveConfig(t, d), "--model", d + "/none"}, want: d + "/none"}
		},
		"serve --draft-model": func(d string) probe {
			return probe{args: []string{"serve", "--config", serveConfig(t, d), "--speculative", "dflash", "--draft-model", d + "/none"}, want: "speculative.draft_model (flag --draft-model)"}
		},
		"serve --speculative": func(d string) probe {
			return probe{args: []string{"serve", "--config", serveConfig(t, d), "--speculative", "mtp:3"}, want: "speculative.method (flag --speculative): mtp needs the checkpoint's MTP layer"}
		},
		"serve --preset": func(d string) probe {
			return probe{args: []string{"serve", "--config", serveConfig(t, d), "--preset", "huge"}, want: `unknown preset "huge"`}
		},
		"graph --config": func(d string) probe {
			return probe{args: args(graph, "--config", d+"/none.yaml"), want: "none.yaml"}
		},
		"attribute --config": func(d string) probe {
			p := filepath.Join(d, "c.yaml")
			require.NoError(t, os.WriteFile(p, []byte("runtime: {slots: -1}\n"), 0o644))
			return probe{args: []string{"attribute", "--study", d + "/none.yaml", "--config", p}, want: "runtime.slots (" + p + "): must be ≥ 0"}
		},

		"attribute --study": func(d string) probe {
			return probe{args: []string{"attribute", "--study", d + "/none.yaml"}, want: "none.yaml"}
		},
		"attribute --out":   attributeOutProbe,
		"attribute --quiet": attributeQuietProbe,
		"attribute --device": func(d string) probe {
			return probe{args: []string{"attribute", "--study", d + "/none.yaml", "--device", "tpu"}, want: `--device: unknown device "tpu"`}
		},
		"eval --device": func(string) probe {
			return probe{args: []string{"eval", "--model", m, "--reference", ref, "--device", "tpu"}, want: `--device: unknown device "tpu"`}
		},
		"generate --device": func(string) probe {
			return probe{args: args(gen, "--device", "tpu"), want: `--device: unknown device "tpu"`}
		},
		"bench --device": func(string) probe {
			return probe{args: args(bench, "--device", "tpu"), want: `--device: unknown device "tpu"`}
		},
		"passes explain --device": func(string) probe {
			return probe{args: args(explain, "--device", "tpu"), want: `--device: unknown device "tpu"`}
		},
		"eval --precision": func(string) probe {
			return probe{args: []string{"eval", "--model", m, "--reference", ref, "--precision", "fp16"}, want: `precision (flag --precision): must be fp32 or bf16, got "fp16"`}
		},
		"generate --tp": func(string) probe {
			return probe{args: args(gen, "--tp", "3"), want: "parallel.tp_size 3 does not divide the model's linear_attn_config.num_heads (KDA heads), 4"}
		},
		"eval --tp": func(string) probe {
			return probe{args: []string{"eval", "--model", m, "--reference", ref, "--tp", "-1"}, want: "parallel.tp_size (flag --tp): must be in [1, 1024], got -1"}
		},
		"bench --tp": func(string) probe {
			return probe{args: args(bench, "--tp", "2"), check: func(t *testing.T, d, out string, err error) {
				require.NoError(t, err)
				require.Contains(t, out, "all-reduces")
			}}
		},
		"generate --precision": func(string) probe {
			return probe{args: args(gen, "--precision", "fp16"), want: `precision (flag --precision): must be fp32 or bf16, got "fp16"`}
		},
		"bench --profile-ops": func(string) probe {
			return probe{args: args(bench, "--profile-ops"), want: "--profile-ops: the cpu backend does not time its ops"}
		},
		"bench --precision": func(string) probe {
			return probe{args: args(bench, "--precision", "bf16"), check: func(t *testing.T, d, out string, err error) {
				require.NoError(t, err)
				require.Contains(t, out, "(precision bf16)")
			}}
		},
		"serve --precision": func(d string) probe {
			return probe{args: []string{"serve", "--config", serveConfig(t, d), "--precision", "fp16"}, want: `precision (flag --precision): must be fp32 or bf16, got "fp16"`}
		},
		"serve --device": func(d string) probe {
			return probe{args: []string{"serve", "--config", serveConfig(t, d), "--device", "tpu"}, want: `--device: unknown device "tpu"`}
		},

		"plugin new --dir": func(d string) probe {
			return probe{args: []string{"plugin", "new", "flag-probe", "--dir", d, "--glmflash-src", "../.."}, check: func(t *testing.T, d, out string, err error) {
				require.NoError(t, err)
				require.FileExists(t, filepath.Join(d, "flag-probe", "main.go"))
			}}
		},
		"plugin new --glmflash-src": func(d string) probe {
			return probe{args: []string{"plugin", "new", "flag-probe", "--dir", d, "--glmflash-src", d}, want: "--glmflash-src"}
		},

		// Positional arguments: serve's DIR and plugin new's NAME are read;
		// every other command refuses a stray one.
		"serve ARGS": func(d string) probe {
			return probe{args: []string{"serve", "--config", serveConfig(t, d), d + "/none"}, want: d + "/none"}
		},
		"plugin new ARGS": func(d string) probe {
			return probe{args: []string{"plugin", "new", "--dir", d}, want: "accepts 1 arg(s), received 0"}
		},
	}
	// --load-format and --set (model.load_format, model.set) wherever a
	// model is loaded: a bad format is refused naming the key, --set over a
	// checkpoint directory (no dummy) too; serve has --seed of its own
	for name, base := range map[string][]string{"generate": gen, "bench": bench, "graph": graph, "passes explain": explain, "passes bench": pbench, "serve": {"serve"}} {
		probes[name+" --load-format"] = func(d string) probe {
			a := args(base, "--load-format", "pickle")
			if name == "serve" {
				a = args(a, "--config", serveConfig(t, d))
			}
			return probe{args: a, want: `model.load_format (flag --load-format): "pickle" is not auto, safetensors or dummy`}
		}
		probes[name+" --set"] = func(d string) probe {
			a := args(base, "--set", "num_hidden_layers=2")
			if name == "serve" {
				a = args(a, "--config", serveConfig(t, d))
			}
			return probe{args: a, want: "model.set (flag --set): scales a preset"}
		}
	}
	probes["serve --seed"] = func(d string) probe {
		return probe{args: []string{"serve", "--config", serveConfig(t, d), "--seed", "3"}, want: "--seed applies to --preset only"}
	}
	probes["serve --fp8"] = func(d string) probe {
		return probe{args: []string{"serve", "--config", serveConfig(t, d), "--fp8"}, want: "--fp8 applies to --preset only"}
	}
	for k, v := range benchServeProbes(t) { // bench serve's, in benchserve_test.go
		probes[k] = v
	}
	for _, c := range []string{"attribute", "bench", "eval", "generate", "graph", "init-random", "passes list", "passes explain", "passes bench"} {
		probes[c+" ARGS"] = func(string) probe {
			return probe{args: append(strings.Fields(c), "stray"), want: `unknown command "stray"`}
		}
	}
	seen := map[string]bool{}
	var walk func(c *cobra.Command)
	var pairs []string
	walk = func(c *cobra.Command) {
		path := strings.TrimPrefix(c.CommandPath(), "glmflash ")
		c.InitDefaultVersionFlag() // as Execute does: --version where there is a version
		c.LocalFlags().VisitAll(func(f *pflag.Flag) {
			if f.Name != "help" {
				pairs = append(pairs, path+" --"+f.Name)
			}
		})
		if c.Runnable() {
			pairs = append(pairs, path+" ARGS")
		}
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(newRoot())
	sort.Strings(pairs)
	for _, key := range pairs {
		seen[key] = true
		mk, ok := probes[key]
		if !ok {
			t.Errorf("%s has no probe: add one to show it is honoured or refused", key)
			continue
		}
		t.Run(key, func(t *testing.T) {
			d := t.TempDir()
			p := mk(d)
			out, err := runCLI(t, p.args...)
			if p.check != nil {
				p.check(t, d, out, err)
				return
			}
			require.Error(t, err, "%v must be refused", p.args)
			require.Contains(t, err.Error(), p.want)
		})
	}
	for key := range probes {
		require.True(t, seen[key], "probe %s names no flag", key)
	}
}

// serveConfig writes a serve configuration of the fixture whose listeners
// take free ports (metrics off), for probes that may get as far as serving.
func serveConfig(t *testing.T, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "serve.yaml")
	abs, err := filepath.Abs(fixture + "/checkpoint")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(p, []byte("model: {dir: "+abs+"}\nserver: {grpc_addr: \"127.0.0.1:0\", http_addr: \"127.0.0.1:0\", metrics_addr: \"\", drain_timeout: 1s}\n"), 0o644))
	return p
}

// textCheckpoint copies the fixture into dir/text with a bytes-only
// tokenizer (its 256 ids) and a chat template without special tokens.
func textCheckpoint(t *testing.T, dir string) string {
	t.Helper()
	ck := filepath.Join(dir, "text")
	require.NoError(t, os.MkdirAll(ck, 0o755))
	for _, f := range []string{"config.json", "model.safetensors"} {
		b, err := os.ReadFile(filepath.Join(fixture, "checkpoint", f))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(ck, f), b, 0o644))
	}
	require.NoError(t, randckpt.WriteTokenizer(ck, 256))
	tmpl := `{"chat_template": "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:"}`
	require.NoError(t, os.WriteFile(filepath.Join(ck, "tokenizer_config.json"), []byte(tmpl), 0o644))
	return ck
}

// eosCheckpoint copies the fixture into dir/ck with a generation_config.json
// whose eos_token_id is the first token greedy generation gives for 1,2,3.
func eosCheckpoint(t *testing.T, dir string) string {
	t.Helper()
	out, err := runCLI(t, "generate", "--model", fixture+"/checkpoint", "--prompt-ids", "1,2,3", "--max-tokens", "1")
	require.NoError(t, err)
	first := strings.TrimSpace(strings.TrimPrefix(strings.Split(out, "\n")[1], "output"))
	ck := filepath.Join(dir, "ck")
	require.NoError(t, os.MkdirAll(ck, 0o755))
	for _, f := range []string{"config.json", "model.safetensors"} {
		b, err := os.ReadFile(filepath.Join(fixture, "checkpoint", f))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(ck, f), b, 0o644))
	}
	require.NoError(t, os.WriteFile(filepath.Join(ck, "generation_config.json"), []byte(`{"eos_token_id": [`+first+`]}`), 0o644))
	return ck
}

// The model's EOS (here from generation_config.json) stops generation by
// default, with finish "stop".
func TestGenerateStopsAtEOS(t *testing.T) {
	ck := eosCheckpoint(t, t.TempDir())
	out, err := runCLI(t, "generate", "--model", ck, "--prompt-ids", "1,2,3", "--max-tokens", "4")
	require.NoError(t, err)
	require.Contains(t, out, "finish   stop")
	require.Regexp(t, `output   \d+\n`, out, "one token: the EOS")
}

// poisoned copies the fixture into dir/poisoned with one NaN weight.
func poisoned(t *testing.T, dir string) string {
	t.Helper()
	ck := filepath.Join(dir, "poisoned")
	require.NoError(t, os.MkdirAll(ck, 0o755))
	for _, f := range []string{"config.json", "model.safetensors"} {
		b, err := os.ReadFile(filepath.Join(fixture, "checkpoint", f))
		require.NoError(t, err)
		if f == "model.safetensors" {
			n := binary.LittleEndian.Uint64(b)
			var hdr map[string]struct {
				Offsets []int64 `json:"data_offsets"`
			}
			require.NoError(t, json.Unmarshal(b[8:8+n], &hdr))
			off := 8 + int64(n) + hdr["model.language_model.layers.2.mlp.up_proj.weight"].Offsets[0]
			binary.LittleEndian.PutUint16(b[off:], 0x7fc0) // BF16 NaN
		}
		require.NoError(t, os.WriteFile(filepath.Join(ck, f), b, 0o644))
	}
	return ck
}

// A NaN weight: --check-tensors refuses the checkpoint at load; without
// it, the non-finite logits it causes end generation with an error (never
// a silent token 0).
func TestNonFiniteWeights(t *testing.T) {
	ck := poisoned(t, t.TempDir())
	_, err := runCLI(t, "generate", "--model", ck, "--prompt-ids", "1,2,3", "--check-tensors")
	require.ErrorContains(t, err, "tensor model.language_model.layers.2.mlp.up_proj.weight: 1 non-finite values")
	_, err = runCLI(t, "generate", "--model", ck, "--prompt-ids", "1,2,3")
	require.ErrorContains(t, err, "non-finite logits")
}

// A checkpoint whose chat template fails its probe still loads (before, the
// whole checkpoint was refused): text prompts work, --chat is refused with
// the template's error.
func TestBrokenChatTemplateLoads(t *testing.T) {
	ck := textCheckpoint(t, t.TempDir())
	require.NoError(t, os.WriteFile(filepath.Join(ck, "tokenizer_config.json"), []byte(`{"chat_template": "{{ raise_exception('this template is broken') }}"}`), 0o644))
	_, err := runCLI(t, "generate", "--model", ck, "--prompt", "Hello", "--max-tokens", "2")
	require.NoError(t, err)
	_, err = runCLI(t, "generate", "--model", ck, "--chat", "hi", "--max-tokens", "2")
	require.ErrorContains(t, err, "no chat template")
	require.ErrorContains(t, err, "this template is broken")
}
