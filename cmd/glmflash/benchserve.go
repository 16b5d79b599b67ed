package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/glmflash/glmflash/core/loadgen"
	"github.com/glmflash/glmflash/internal/regular"
	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"
)

// Bounds of bench serve's flags.
const (
	maxServePrompts = loadgen.MaxDatasetPrompts
	maxServeWarmup  = 1024
	maxInputLen     = 1 << 24
	// detokenizeConns bounds the /detokenize calls in flight while text
	// prompts are made.
	detokenizeConns = 8
)

// benchServeFlags are the flags of glmflash bench serve.
type benchServeFlags struct {
	baseURL, endpoint, model, apiKey           string
	numPrompts, inputLen, outputLen, vocabSize int
	rangeRatio, temperature                    float64
	dataset, promptFormat, requestRate         string
	concurrency, warmup, maxErrors             int
	ignoreEOS, outputRequests                  bool
	extraBody, slo, metricsURL, metricsFilter  string
	output                                     string
	seed                                       uint64
	timeout                                    time.Duration
	serve                                      serveSpec
	cmd                                        *cobra.Command
	// set while running
	servedModel, servedDescription string
	outFile                        *os.File
	parsedRate                     float64
	parsedSLO                      loadgen.SLO
	parsedExtra                    map[string]json.RawMessage
}

func newBenchServeCmd() *cobra.Command {
	f := &benchServeFlags{}
	cmd := &cobra.Command{
		Use:   "serve [--base-url URL | --serve [--config FILE] [--preset NAME] [--set FIELD=VALUE] [--serve-set KEY=VALUE]]",
		Args:  cobra.NoArgs,
		Short: "Measure a served workload over the OpenAI HTTP API (TTFT, TPOT, ITL, latency, throughput, goodput) against any OpenAI-compatible server",
		Long: `Send a workload of streaming /v1/completions (or /v1/chat/completions) requests to an
OpenAI-compatible server (glmflash, vLLM, SGLang, …) at a bounded --concurrency and/or a Poisson
--request-rate, and report time to first token, time per output token, inter-token latency and
end-to-end latency (mean, std, p50, p90, p99), request and token throughput, goodput against
--slo, errors by kind, and the server's Prometheus counters before and after (docs/bench-serve.md).

The workload is random token ids (--input-len, --output-len, --range-ratio: SGLang's random
dataset; sent as ids to /v1/completions, or as the text the server's /detokenize makes of them)
or a JSONL file of prompts (--dataset). --serve starts glmflash serve itself (with serve's
--config, --preset, --device, --load-format and --set, and --serve-set KEY=VALUE for any other
configuration key) on a loopback port, waits for /health, runs, and stops it.`,
		RunE: func(cmd *cobra.Command, args []string) error { return f.run(cmd) },
	}
	f.cmd = cmd
	fl := cmd.Flags()
	fl.StringVar(&f.baseURL, "base-url", "http://127.0.0.1:8000", "the server's root URL (without /v1)")
	fl.StringVar(&f.endpoint, "endpoint", "completions", "completions (/v1/completions) or chat (/v1/chat/completions)")
	fl.StringVar(&f.model, "model", "", "the model name sent in every request (default: the first model of GET /v1/models)")
	fl.StringVar(&f.apiKey, "api-key", "", "API key sent as a bearer token (default: $OPENAI_API_KEY)")
	fl.IntVar(&f.numPrompts, "num-prompts", 100, "measured requests (default with --dataset: every prompt of the file)")
	fl.IntVar(&f.inputLen, "input-len", 1024, "random prompts: tokens per prompt (the maximum with --range-ratio < 1)")
	fl.IntVar(&f.outputLen, "output-len", 128, "tokens to generate per request (max_tokens; the maximum with --range-ratio < 1; with --dataset, for lines without output_len)")
	fl.Float64Var(&f.rangeRatio, "range-ratio", 1, "random prompts: lengths drawn uniformly from [max(1, ⌊len·ratio⌋), len] (SGLang's --random-range-ratio; 1: fixed lengths)")
	fl.IntVar(&f.vocabSize, "vocab-size", 0, "random prompts: token ids drawn from [0, N) (default: the vocab_size of GET /v1/models, which glmflash gives)")
	fl.StringVar(&f.dataset, "dataset", "", `a JSONL file of prompts: one {"prompt": "text" | [ids], "output_len": N} or {"messages": [...], "output_len": N} per line`)
	fl.StringVar(&f.promptFormat, "prompt-format", "", "random prompts: ids (token ids; completions only) or text (the server's POST /detokenize of the ids) (default: ids for completions, text for chat)")
	fl.IntVar(&f.concurrency, "concurrency", 0, "requests in flight at most (0: no bound)")
	fl.StringVar(&f.requestRate, "request-rate", "inf", "Poisson arrival rate in requests/s, or inf (every request at once, held back by --concurrency only)")
	fl.IntVar(&f.warmup, "warmup-requests", 1, "requests sent (and waited for) before the measured ones, not measured; any failure among them stops the run")
	fl.BoolVar(&f.ignoreEOS, "ignore-eos", true, "send ignore_eos: every request generates exactly its output length")
	fl.Float64Var(&f.temperature, "temperature", 0, "sampling temperature (0: greedy)")
	fl.StringVar(&f.extraBody, "extra-body", "", `a JSON object of more keys for every request's body, e.g. '{"top_k": 1}' (it may not set the benchmark's own keys)`)
	fl.Uint64Var(&f.seed, "seed", 1, "seed of the random prompts, their lengths and the arrival times")
	fl.DurationVar(&f.timeout, "timeout", 0, "bound of each request, e.g. 10m (0: none); a request past it fails as timeout")
	fl.IntVar(&f.maxErrors, "max-errors", 0, "stop the run after this many failed requests (0: never); the run then exits with an error")
	fl.StringVar(&f.slo, "slo", "", "goodput's service-level objective: ttft_ms=MS,tpot_ms=MS,e2e_ms=MS (any of them)")
	fl.StringVar(&f.metricsURL, "metrics-url", "", "the server's Prometheus metrics, read before and after the run (default: --base-url + /metrics; off: not read)")
	fl.StringVar(&f.metricsFilter, "metrics-filter", loadgen.DefaultMetricsFilter, "regular expression of the metric names reported")
	fl.StringVar(&f.output, "output", "", "also write the report as JSON to this file (docs/bench-serve.md gives its schema)")
	fl.BoolVar(&f.outputRequests, "output-requests", false, "add every request's record (times, tokens, ITLs) to the JSON")
	f.serve.register(cmd)
	return cmd
}

// set reports whether the user gave a flag.
func (f *benchServeFlags) set(name string) bool { return f.cmd.Flags().Changed(name) }

// check refuses flags out of range and combinations that make no sense,
// before anything is started or sent.
func (f *benchServeFlags) check() error {
	if err := f.serve.check(f); err != nil {
		return err
	}
	if !f.serve.on {
		if err := checkBaseURL(f.baseURL); err != nil {
			return err
		}
	}
	if f.endpoint != string(loadgen.Completions) && f.endpoint != string(loadgen.Chat) {
		return fmt.Errorf("--endpoint must be completions or chat, got %q", f.endpoint)
	}
	if f.numPrompts < 1 || f.numPrompts > maxServePrompts {
		return fmt.Errorf("--num-prompts must be in [1, %d], got %d", maxServePrompts, f.numPrompts)
	}
	if f.outputLen < 1 || f.outputLen > loadgen.MaxOutputLen {
		return fmt.Errorf("--output-len must be in [1, %d], got %d", loadgen.MaxOutputLen, f.outputLen)
	}
	if f.dataset != "" {
		for _, n := range []string{"input-len", "range-ratio", "vocab-size", "prompt-format"} {
			if f.set(n) {
				return fmt.Errorf("--%s applies to random prompts; with --dataset the file gives the prompts", n)
			}
		}
	} else {
		if f.inputLen < 1 || f.inputLen > maxInputLen {
			return fmt.Errorf("--input-len must be in [1, %d], got %d", maxInputLen, f.inputLen)
		}
		if !(f.rangeRatio > 0 && f.rangeRatio <= 1) {
			return fmt.Errorf("--range-ratio must be in (0, 1] (1: fixed lengths), got %v", f.rangeRatio)
		}
		if f.set("vocab-size") && (f.vocabSize < 1 || f.vocabSize > math.MaxInt32) {
			return fmt.Errorf("--vocab-size must be in [1, %d], got %d", math.MaxInt32, f.vocabSize)
		}
		switch f.promptFormat {
		case "":
			f.promptFormat = "ids"
			if f.endpoint == string(loadgen.Chat) {
				f.promptFormat = "text"
			}
		case "ids":
			if f.endpoint == string(loadgen.Chat) {
				return fmt.Errorf("--prompt-format ids: /v1/chat/completions takes text (use --prompt-format text, or --endpoint completions)")
			}
		case "text":
		default:
			return fmt.Errorf("--prompt-format must be ids or text, got %q", f.promptFormat)
		}
	}
	if f.concurrency < 0 || f.concurrency > loadgen.MaxConcurrency {
		return fmt.Errorf("--concurrency must be in [0, %d] (0: no bound), got %d", loadgen.MaxConcurrency, f.concurrency)
	}
	rate, err := parseRate(f.requestRate)
	if err != nil {
		return err
	}
	f.parsedRate = rate
	if f.warmup < 0 || f.warmup > maxServeWarmup {
		return fmt.Errorf("--warmup-requests must be in [0, %d], got %d", maxServeWarmup, f.warmup)
	}
	if !(f.temperature >= 0) || math.IsInf(f.temperature, 0) {
		return fmt.Errorf("--temperature must be ≥ 0, got %v", f.temperature)
	}
	if f.extraBody != "" {
		if err := json.Unmarshal([]byte(f.extraBody), &f.parsedExtra); err != nil || f.parsedExtra == nil {
			return fmt.Errorf("--extra-body must be a JSON object, got %q", f.extraBody)
		}
	}
	if f.timeout < 0 {
		return fmt.Errorf("--timeout must be ≥ 0 (0: none), got %s", f.timeout)
	}
	if f.maxErrors < 0 {
		return fmt.Errorf("--max-errors must be ≥ 0 (0: never stop), got %d", f.maxErrors)
	}
	if f.set("slo") {
		if f.parsedSLO, err = loadgen.ParseSLO(f.slo); err != nil {
			return err
		}
	}
	switch {
	case f.metricsURL == "off":
	case f.set("metrics-url") && f.serve.on:
		return fmt.Errorf("--metrics-url: with --serve the metrics are the started server's (only off is taken)")
	case f.set("metrics-url"):
		if err := checkHTTPURL("--metrics-url", f.metricsURL); err != nil {
			return err
		}
	}
	if _, err := regexp.Compile(f.metricsFilter); err != nil {
		return fmt.Errorf("--metrics-filter: %w", err)
	}
	if f.outputRequests && f.output == "" {
		return fmt.Errorf("--output-requests adds to the JSON of --output, which is not given")
	}
	return nil
}

// parseRate reads --request-rate: inf or a rate > 0.
func parseRate(s string) (float64, error) {
	if strings.EqualFold(s, "inf") {
		return math.Inf(1), nil
	}
	r, err := strconv.ParseFloat(s, 64)
	if err != nil || !(r > 0) || math.IsInf(r, 0) {
		return 0, fmt.Errorf("--request-rate must be a rate > 0 (requests/s) or inf, got %q", s)
	}
	return r, nil
}

// checkBaseURL refuses what is not a server's root URL.
func checkBaseURL(s string) error {
	if err := checkHTTPURL("--base-url", s); err != nil {
		return err
	}
	u, _ := url.Parse(s)
	if p := strings.TrimRight(u.Path, "/"); p != "" {
		hint := ""
		if strings.HasSuffix(p, "/v1") {
			hint = " (drop the /v1: the endpoints' paths are added)"
		}
		return fmt.Errorf("--base-url must be the server's root, got path %q%s", u.Path, hint)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("--base-url must be the server's root, without a query or fragment: %q", s)
	}
	return nil
}

func checkHTTPURL(flag, s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("%s: %w", flag, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("%s must be an http:// or https:// URL, got %q", flag, s)
	}
	if u.Host == "" {
		return fmt.Errorf("%s has no host: %q", flag, s)
	}
	return nil
}

// run is bench serve: flags → (a started server) → workload → loadgen.Run
// → the report.
func (f *benchServeFlags) run(cmd *cobra.Command) (err error) {
	if err := f.check(); err != nil {
		return err
	}
	if !f.set("api-key") {
		f.apiKey = os.Getenv("OPENAI_API_KEY")
	}
	if f.output != "" { // created now: a bad path fails before any request
		of, err := os.Create(f.output)
		if err != nil {
			return fmt.Errorf("--output: %w", err)
		}
		defer of.Close()
		f.outFile = of
	}
	var dataset []loadgen.Request
	if f.dataset != "" { // read before any server starts: a bad line fails at once
		var err error
		if dataset, err = readDataset(f.dataset, f.outputLen); err != nil {
			return fmt.Errorf("--dataset: %w", err)
		}
		if !f.set("num-prompts") {
			f.numPrompts = len(dataset)
		}
		if f.numPrompts > len(dataset) {
			return fmt.Errorf("--num-prompts %d exceeds the %d prompts of %s", f.numPrompts, len(dataset), f.dataset)
		}
		if f.warmup > len(dataset) {
			return fmt.Errorf("--warmup-requests %d exceeds the %d prompts of %s", f.warmup, len(dataset), f.dataset)
		}
	}
	exitOnSignal = false // the run stops, reports what it has, and stops a started server
	ctx, stop := withSignals(cmd.Context())
	defer stop()
	base := f.baseURL
	if f.serve.on {
		srv, err := f.serve.start(ctx)
		if err != nil {
			return err
		}
		defer func() { // a server that failed (or would not stop) fails the command
			if serr := srv.stop(); serr != nil {
				if err == nil {
					err = fmt.Errorf("--serve: %w", serr)
				} else {
					log.Error().Err(serr).Msg("--serve: the started server did not stop cleanly")
				}
			}
		}()
		base, f.servedModel, f.servedDescription = srv.baseURL, srv.model, srv.description
	}
	client := loadgen.NewClient(base, f.apiKey, max(f.concurrency, f.warmup, detokenizeConns))
	defer client.CloseIdle()
	info, err := client.Model(ctx, f.model)
	switch {
	case err != nil && f.model == "" && f.servedModel != "":
		f.model = f.servedModel
	case err != nil && f.model == "":
		return fmt.Errorf("--model is not given and the server does not say it: %w", err)
	case err != nil:
		log.Warn().Err(err).Msg("GET /v1/models failed; going on with --model")
	case f.model == "":
		f.model = info.ID
	}
	reqs, warm, err := f.workload(ctx, client, info, dataset)
	if err != nil {
		return err
	}
	metrics := ""
	switch {
	case f.metricsURL == "off":
	case f.metricsURL != "":
		metrics = f.metricsURL
	default:
		metrics = strings.TrimRight(base, "/") + "/metrics"
	}
	spec := loadgen.Spec{
		Client: client, Endpoint: loadgen.Endpoint(f.endpoint), Model: f.model, Requests: reqs, Warmup: warm,
		Concurrency: f.concurrency, RequestRate: f.parsedRate, Seed: f.seed, IgnoreEOS: f.ignoreEOS, Temperature: f.temperature,
		ExtraBody: f.parsedExtra, Timeout: f.timeout, MaxErrors: f.maxErrors, SLO: f.parsedSLO,
		MetricsURL: metrics, MetricsFilter: f.metricsFilter, Log: log,
	}
	bar := f.progress(len(reqs))
	spec.Progress = bar.update
	started := time.Now()
	res, err := loadgen.Run(ctx, spec)
	bar.finish()
	if err != nil {
		return err
	}
	setup := loadgen.Setup{BaseURL: base, Endpoint: f.endpoint, Model: f.model, Dataset: "random", PromptFormat: f.promptFormat,
		NumPrompts: len(reqs), Warmup: len(warm), Concurrency: f.concurrency, RequestRate: loadgen.RateJSON(f.parsedRate),
		Seed: f.seed, IgnoreEOS: f.ignoreEOS, Temperature: f.temperature, TimeoutS: f.timeout.Seconds(), MaxErrors: f.maxErrors,
		Served: f.servedDescription}
	if f.dataset != "" {
		setup.Dataset, setup.PromptFormat = f.dataset, "dataset"
	} else {
		setup.InputLen, setup.OutputLen, setup.RangeRatio, setup.VocabSize = f.inputLen, f.outputLen, f.rangeRatio, f.vocabSize
	}
	rep := loadgen.NewReport("glmflash bench serve "+version(), started, setup, res, f.outputRequests)
	if err := rep.WriteText(os.Stdout); err != nil {
		return err
	}
	if f.outFile != nil {
		b, err := rep.JSON()
		if err != nil {
			return err
		}
		if _, err := f.outFile.Write(append(b, '\n')); err != nil {
			return fmt.Errorf("--output: %w", err)
		}
		if err := f.outFile.Close(); err != nil {
			return fmt.Errorf("--output: %w", err)
		}
	}
	switch {
	case res.Aborted != "":
		return fmt.Errorf("the run stopped early (%s): %d of %d requests completed", res.Aborted, res.Completed, len(reqs))
	case res.Completed == 0:
		return fmt.Errorf("no request completed (%d failed)", res.Failed)
	}
	return nil
}

// readDataset reads a JSONL file (a regular file only).
func readDataset(path string, outputLen int) ([]loadgen.Request, error) {
	fh, _, err := regular.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	return loadgen.ParseJSONL(fh, path, outputLen)
}

// workload makes the measured and warm-up requests: the dataset's, or
// random ids (as text through /detokenize with --prompt-format text),
// checked against the server's context length where it says it.
func (f *benchServeFlags) workload(ctx context.Context, c *loadgen.Client, info loadgen.ModelInfo, dataset []loadgen.Request) (reqs, warm []loadgen.Request, err error) {
	if dataset != nil {
		reqs, warm = dataset[:f.numPrompts], dataset[:f.warmup]
		if lim := info.MaxModelLen; lim > 0 {
			for i, r := range dataset[:max(f.numPrompts, f.warmup)] {
				if r.PromptLen > 0 && r.PromptLen+r.OutputLen > lim {
					return nil, nil, fmt.Errorf("--dataset: prompt %d has %d token ids + output_len %d, more than the server's max_model_len %d", i+1, r.PromptLen, r.OutputLen, lim)
				}
			}
		}
		return reqs, warm, nil
	}
	if !f.set("vocab-size") {
		if info.VocabSize < 1 {
			return nil, nil, fmt.Errorf("--vocab-size is needed: GET /v1/models does not give vocab_size (glmflash does; give the model's vocabulary size for vLLM or SGLang)")
		}
		f.vocabSize = info.VocabSize
	}
	if lim := info.MaxModelLen; lim > 0 && f.inputLen+f.outputLen > lim {
		return nil, nil, fmt.Errorf("--input-len %d + --output-len %d exceed the server's max_model_len %d", f.inputLen, f.outputLen, lim)
	}
	all, err := loadgen.Random{InputLen: f.inputLen, OutputLen: f.outputLen, RangeRatio: f.rangeRatio, Vocab: f.vocabSize}.Generate(f.warmup+f.numPrompts, f.seed)
	if err != nil {
		return nil, nil, err
	}
	if f.promptFormat == "text" {
		if err := detokenizeAll(ctx, c, f.model, all); err != nil {
			return nil, nil, fmt.Errorf("--prompt-format text: %w", err)
		}
	}
	return all[f.warmup:], all[:f.warmup], nil
}

// detokenizeAll turns every request's ids into the server's text of them.
func detokenizeAll(ctx context.Context, c *loadgen.Client, model string, reqs []loadgen.Request) error {
	sem := make(chan struct{}, detokenizeConns)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for i := range reqs {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			s, err := c.Detokenize(ctx, model, reqs[i].PromptIDs)
			if err == nil && s == "" {
				err = errors.New("POST /detokenize gave an empty text")
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if first == nil {
					first = fmt.Errorf("prompt %d: %w", i, err)
				}
				return
			}
			reqs[i].PromptText, reqs[i].PromptIDs = s, nil
		}()
	}
	wg.Wait()
	return first
}

// progressBar shows the run's progress: a bar on a terminal, else a log
// line at every tenth.
type progressBar struct {
	mu    sync.Mutex
	bar   *progressbar.ProgressBar
	total int
	last  int
}

func (f *benchServeFlags) progress(total int) *progressBar {
	p := &progressBar{total: total}
	if term.IsTerminal(int(os.Stderr.Fd())) {
		p.bar = progressbar.NewOptions(total, progressbar.OptionSetWriter(os.Stderr), progressbar.OptionShowCount(),
			progressbar.OptionSetElapsedTime(true), progressbar.OptionSetPredictTime(true), progressbar.OptionSetWidth(30),
			progressbar.OptionSetDescription("requests"))
	}
	return p
}

func (p *progressBar) update(done, total int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.bar != nil {
		_ = p.bar.Set(done)
		return
	}
	if tenth := done * 10 / total; tenth > p.last || done == total {
		p.last = tenth
		log.Info().Int("done", done).Int("of", total).Msg("requests")
	}
}

func (p *progressBar) finish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.bar != nil {
		_ = p.bar.Finish()
		fmt.Fprintln(os.Stderr)
	}
}
