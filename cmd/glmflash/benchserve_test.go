package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// fakeOpenAI is a minimal OpenAI server: one model, streams of two tokens,
// and what it was sent.
type fakeOpenAI struct {
	*httptest.Server
	mu      sync.Mutex
	bodies  []map[string]any
	headers []http.Header
}

func newFakeOpenAI(t *testing.T) *fakeOpenAI {
	f := &fakeOpenAI{}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"data":[{"id":"fake","max_model_len":100,"vocab_size":50}]}`)
	})
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) {
		var b map[string]any
		_ = json.NewDecoder(r.Body).Decode(&b)
		f.mu.Lock()
		f.bodies, f.headers = append(f.bodies, b), append(f.headers, r.Header.Clone())
		f.mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[{\"text\":\"b\",\"finish_reason\":\"length\"}]}\n\n")
		fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n")
	})
	f.Server = httptest.NewServer(mux)
	t.Cleanup(f.Close)
	return f
}

func (f *fakeOpenAI) last() (map[string]any, http.Header) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.bodies[len(f.bodies)-1], f.headers[len(f.headers)-1]
}

// benchServeProbes are the probes of TestEveryFlagIsHonouredOrRefused for
// bench serve's flags.
func benchServeProbes(t *testing.T) map[string]func(dir string) probe {
	bs := func(more ...string) []string {
		return append([]string{"bench", "serve", "--base-url", "http://127.0.0.1:1"}, more...)
	}
	fake := func(check func(t *testing.T, body map[string]any, h http.Header), more ...string) func(string) probe {
		return func(string) probe {
			f := newFakeOpenAI(t)
			args := append([]string{"bench", "serve", "--base-url", f.URL, "--num-prompts", "1", "--warmup-requests", "0", "--input-len", "3", "--output-len", "2"}, more...)
			return probe{args: args, check: func(t *testing.T, d, out string, err error) {
				require.NoError(t, err)
				require.Contains(t, out, "Requests (completed / failed / cancelled):  1 / 0 / 0 of 1")
				b, h := f.last()
				check(t, b, h)
			}}
		}
	}
	return map[string]func(string) probe{
		"bench serve ARGS": func(string) probe { return probe{args: bs("stray"), want: `unknown command "stray"`} },
		"bench serve --base-url": func(string) probe {
			return probe{args: []string{"bench", "serve", "--base-url", "http://h/v1"}, want: "drop the /v1"}
		},
		"bench serve --endpoint": func(string) probe {
			return probe{args: bs("--endpoint", "embeddings"), want: "--endpoint must be completions or chat"}
		},
		"bench serve --num-prompts": func(string) probe {
			return probe{args: bs("--num-prompts", "0"), want: "--num-prompts must be in [1, 1048576], got 0"}
		},
		"bench serve --input-len":  func(string) probe { return probe{args: bs("--input-len", "0"), want: "--input-len must be in [1, "} },
		"bench serve --output-len": func(string) probe { return probe{args: bs("--output-len", "0"), want: "--output-len must be in [1, "} },
		"bench serve --range-ratio": func(string) probe {
			return probe{args: bs("--range-ratio", "1.5"), want: "--range-ratio must be in (0, 1]"}
		},
		"bench serve --vocab-size": func(string) probe { return probe{args: bs("--vocab-size", "0"), want: "--vocab-size must be in [1, "} },
		"bench serve --dataset": func(d string) probe {
			p := filepath.Join(d, "d.jsonl")
			require.NoError(t, os.WriteFile(p, []byte("{\"prompt\": \"a\"}\n{\"prompt\": 3}\n"), 0o644))
			return probe{args: bs("--dataset", p), want: p + ":2: prompt: want a string or a list of token ids, got JSON number"}
		},
		"bench serve --prompt-format": func(string) probe {
			return probe{args: bs("--prompt-format", "words"), want: "--prompt-format must be ids or text"}
		},
		"bench serve --concurrency": func(string) probe {
			return probe{args: bs("--concurrency", "-1"), want: "--concurrency must be in [0, "}
		},
		"bench serve --request-rate": func(string) probe {
			return probe{args: bs("--request-rate", "0"), want: "--request-rate must be a rate > 0"}
		},
		"bench serve --warmup-requests": func(string) probe {
			return probe{args: bs("--warmup-requests", "-1"), want: "--warmup-requests must be in [0, 1024]"}
		},
		"bench serve --temperature": func(string) probe { return probe{args: bs("--temperature", "-1"), want: "--temperature must be ≥ 0"} },
		"bench serve --extra-body": func(string) probe {
			return probe{args: bs("--extra-body", "[1]"), want: "--extra-body must be a JSON object"}
		},
		"bench serve --seed":       func(string) probe { return probe{args: bs("--seed", "-1"), want: `"--seed"`} },
		"bench serve --timeout":    func(string) probe { return probe{args: bs("--timeout", "-1s"), want: "--timeout must be ≥ 0"} },
		"bench serve --max-errors": func(string) probe { return probe{args: bs("--max-errors", "-1"), want: "--max-errors must be ≥ 0"} },
		"bench serve --slo":        func(string) probe { return probe{args: bs("--slo", "ttft=3"), want: `--slo: unknown key "ttft"`} },
		"bench serve --metrics-url": func(string) probe {
			return probe{args: bs("--metrics-url", "ftp://h/metrics"), want: "--metrics-url must be an http:// or https:// URL"}
		},
		"bench serve --metrics-filter": func(string) probe {
			return probe{args: bs("--metrics-filter", "("), want: "--metrics-filter: error parsing regexp"}
		},
		"bench serve --output": func(d string) probe {
			return probe{args: bs("--output", d+"/no/such/dir/r.json"), want: "--output: open " + d + "/no/such/dir/r.json"}
		},
		"bench serve --output-requests": func(string) probe {
			return probe{args: bs("--output-requests"), want: "--output-requests adds to the JSON of --output, which is not given"}
		},
		"bench serve --serve": func(string) probe {
			return probe{args: bs("--serve"), want: "--base-url and --serve are mutually exclusive"}
		},
		"bench serve --config": func(d string) probe {
			return probe{args: bs("--config", d+"/c.yaml"), want: "--config applies to --serve"}
		},
		"bench serve --preset": func(string) probe { return probe{args: bs("--preset", "tiny"), want: "--preset applies to --serve"} },
		"bench serve --serve-log": func(d string) probe {
			return probe{args: bs("--serve-log", d+"/s.log"), want: "--serve-log applies to --serve"}
		},
		"bench serve --device": func(string) probe {
			return probe{args: []string{"bench", "serve", "--serve", "--device", "tpu"}, want: `--device: unknown device "tpu"`}
		},
		"bench serve --set": func(string) probe {
			return probe{args: []string{"bench", "serve", "--serve", "--set", "runtime.slots=2"}, want: `--serve: --set "runtime.slots=2": want FIELD=VALUE (a text_config field, a JSON value)`}
		},
		"bench serve --serve-set": func(string) probe {
			return probe{args: []string{"bench", "serve", "--serve", "--serve-set", "runtime.slotz=2"}, want: `--serve: config: unknown key "runtime.slotz" in flag --serve-set runtime.slotz`}
		},
		"bench serve --load-format": func(string) probe {
			return probe{args: []string{"bench", "serve", "--serve", "--load-format", "pickle"}, want: `model.load_format (flag --load-format): "pickle" is not auto, safetensors or dummy`}
		},
		"bench serve --serve-timeout": func(string) probe {
			return probe{args: []string{"bench", "serve", "--serve", "--serve-timeout", "0s"}, want: "--serve-timeout must be > 0"}
		},
		"bench serve --model": fake(func(t *testing.T, b map[string]any, h http.Header) {
			require.Equal(t, "other", b["model"])
		}, "--model", "other", "--vocab-size", "50"), // GET /v1/models does not list it: its vocabulary is not known
		"bench serve --api-key": fake(func(t *testing.T, b map[string]any, h http.Header) {
			require.Equal(t, "Bearer sk-probe", h.Get("Authorization"))
			require.Equal(t, "fake", b["model"], "the first model of GET /v1/models")
		}, "--api-key", "sk-probe"),
		"bench serve --ignore-eos": fake(func(t *testing.T, b map[string]any, h http.Header) {
			require.NotContains(t, b, "ignore_eos")
		}, "--ignore-eos=false"),
	}
}

// Refused combinations name both sides.
func TestBenchServeRefusesCombinations(t *testing.T) {
	for want, args := range map[string][]string{
		"--input-len applies to random prompts; with --dataset the file gives the prompts": {"--dataset", "x.jsonl", "--input-len", "5"},
		"--prompt-format applies to random prompts":                                        {"--dataset", "x.jsonl", "--prompt-format", "text"},
		"--prompt-format ids: /v1/chat/completions takes text":                             {"--endpoint", "chat", "--prompt-format", "ids"},
		"--metrics-url: with --serve the metrics are the started server's":                 {"--serve", "--metrics-url", "http://h/metrics"},
		`--base-url: parse "127.0.0.1:8000"`:                                               {"--base-url", "127.0.0.1:8000"},
		"--base-url must be an http:// or https:// URL":                                    {"--base-url", "localhost:8000"},
		"--base-url has no host":                                                           {"--base-url", "http:///x"},
		`--serve-set "runtime.slots": want KEY=VALUE`:                                      {"--serve", "--serve-set", "runtime.slots"},
		"--serve: server.http_addr is empty":                                               {"--serve", "--serve-set", "server.http_addr="},
		"--serve: server.auth.api_keys_file is set":                                        {"--serve", "--serve-set", "server.auth.api_keys_file=/k"},
		"--serve-set device: use --device":                                                 {"--serve", "--serve-set", "device=cpu"},
		"--serve-set model.set.num_hidden_layers: use --set":                               {"--serve", "--serve-set", "model.set.num_hidden_layers=2"},
	} {
		t.Setenv("OPENAI_API_KEY", "")
		_, err := runCLI(t, append([]string{"bench", "serve"}, args...)...)
		require.ErrorContains(t, err, want, args)
	}
	f := newFakeOpenAI(t)
	p := filepath.Join(t.TempDir(), "d.jsonl")
	require.NoError(t, os.WriteFile(p, []byte("{\"prompt\": [1,2]}\n{\"prompt\": [1,2,3], \"output_len\": 99}\n"), 0o644))
	_, err := runCLI(t, "bench", "serve", "--base-url", f.URL, "--dataset", p, "--num-prompts", "3")
	require.ErrorContains(t, err, "--num-prompts 3 exceeds the 2 prompts of "+p)
	_, err = runCLI(t, "bench", "serve", "--base-url", f.URL, "--dataset", p, "--output-len", "10")
	require.ErrorContains(t, err, "--dataset: prompt 2 has 3 token ids + output_len 99, more than the server's max_model_len 100")
	_, err = runCLI(t, "bench", "serve", "--base-url", f.URL, "--input-len", "90", "--output-len", "11")
	require.ErrorContains(t, err, "--input-len 90 + --output-len 11 exceed the server's max_model_len 100")
}
