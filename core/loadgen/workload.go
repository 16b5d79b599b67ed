// Package loadgen is an OpenAI-compatible load generator (glmflash bench
// serve), in the spirit of sglang.bench_serving and vllm bench serve: it
// sends a workload of streaming completion or chat requests to any server
// that speaks the OpenAI HTTP API, at a bounded concurrency and/or a
// Poisson request rate, measures each request from its SSE stream (time to
// first token, time per output token, inter-token latencies, end-to-end
// latency), and summarizes them (means, percentiles, throughput, goodput
// against SLOs, errors by kind, the server's own Prometheus counters before
// and after). It depends on nothing of the engine.
package loadgen

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// Message is one chat message of a request (role and text content).
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// Request is one request of a workload: a prompt as token ids (completions
// only), as text, or as chat messages (chat only), and the number of tokens
// to generate.
type Request struct {
	// PromptIDs is the prompt as token ids (sent as such to /v1/completions).
	PromptIDs []int32 `json:"prompt_ids,omitempty"`
	// PromptText is the prompt as text (a completion's prompt, or a chat's
	// one user message).
	PromptText string `json:"prompt,omitempty"`
	// Messages are a chat request's messages.
	Messages []Message `json:"messages,omitempty"`
	// PromptLen is the prompt's length in tokens where it is known before
	// the request (token ids, or the ids a text was decoded from); 0 when
	// only the server's usage will tell.
	PromptLen int `json:"prompt_len,omitempty"`
	// OutputLen is max_tokens.
	OutputLen int `json:"output_len"`
}

// Random describes SGLang's "random" dataset: prompts of random token ids
// whose lengths are drawn uniformly from [max(1, ⌊InputLen·RangeRatio⌋),
// InputLen] (and likewise the output lengths); RangeRatio 1 gives fixed
// lengths.
type Random struct {
	InputLen, OutputLen int
	RangeRatio          float64
	// Vocab bounds the ids: each is drawn uniformly from [0, Vocab).
	Vocab int
}

// Check names the first setting out of range.
func (r Random) Check() error {
	switch {
	case r.InputLen < 1:
		return &FieldError{Field: "input-len", Msg: fmt.Sprintf("must be ≥ 1, got %d", r.InputLen)}
	case r.OutputLen < 1:
		return &FieldError{Field: "output-len", Msg: fmt.Sprintf("must be ≥ 1, got %d", r.OutputLen)}
	case !(r.RangeRatio > 0 && r.RangeRatio <= 1):
		return &FieldError{Field: "range-ratio", Msg: fmt.Sprintf("must be in (0, 1], got %v", r.RangeRatio)}
	case r.Vocab < 1:
		return &FieldError{Field: "vocab-size", Msg: fmt.Sprintf("must be ≥ 1, got %d", r.Vocab)}
	}
	return nil
}

// Generate draws n requests from seed (the same seed gives the same
// prompts and lengths).
func (r Random) Generate(n int, seed uint64) ([]Request, error) {
	if err := r.Check(); err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(seed, 0x6c6f616467656e)) // "loadgen": the prompts' stream
	length := func(l int) int {
		lo := max(1, int(math.Floor(float64(l)*r.RangeRatio)))
		if lo >= l {
			return l
		}
		return lo + rng.IntN(l-lo+1)
	}
	out := make([]Request, n)
	for i := range out {
		in, o := length(r.InputLen), length(r.OutputLen)
		ids := make([]int32, in)
		for j := range ids {
			ids[j] = int32(rng.IntN(r.Vocab))
		}
		out[i] = Request{PromptIDs: ids, PromptLen: in, OutputLen: o}
	}
	return out, nil
}

// Arrivals gives each of n requests its send time after the start: a
// Poisson process of rate requests per second (exponential gaps, drawn from
// seed), or every request at once when rate is +Inf.
func Arrivals(n int, rate float64, seed uint64) []time.Duration {
	out := make([]time.Duration, n)
	if math.IsInf(rate, 1) {
		return out
	}
	rng := rand.New(rand.NewPCG(seed, 0x617272697661)) // "arriva": a stream of its own, so the rate never changes the prompts
	t := 0.0
	for i := range out {
		out[i] = time.Duration(t * float64(time.Second))
		t += rng.ExpFloat64() / rate
	}
	return out
}

// FieldError is a setting out of range; Field is its option's name as
// glmflash bench serve spells the flag (without the dashes).
type FieldError struct {
	Field, Msg string
}

func (e *FieldError) Error() string { return "--" + e.Field + ": " + e.Msg }
