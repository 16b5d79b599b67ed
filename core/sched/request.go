package sched

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/glmflash/glmflash/core/sample"
	"github.com/glmflash/glmflash/core/speculative"
)

// MaxTopLogprobs bounds Request.TopLogprobs.
const MaxTopLogprobs = 20

// MaxStopIDs bounds Request.StopIDs (each token is checked against them).
const MaxStopIDs = 1024

// Errors Submit and Abort return. Servers map them to status codes:
// ErrQueueFull → RESOURCE_EXHAUSTED, ErrDraining and ErrClosed →
// UNAVAILABLE, ErrNotFound → NOT_FOUND, ErrDuplicateID → ALREADY_EXISTS,
// *InvalidError → INVALID_ARGUMENT.
var (
	ErrQueueFull   = errors.New("runtime: the wait queue is full")
	ErrDraining    = errors.New("runtime: draining, not accepting requests")
	ErrClosed      = errors.New("runtime: closed")
	ErrNotFound    = errors.New("runtime: no such request in flight")
	ErrDuplicateID = errors.New("runtime: a request with this id is in flight")
)

// InvalidError is a request the runtime refuses; Field names the bad field
// (in the API's spelling, e.g. "max_tokens" or "sampling.top_p").
type InvalidError struct {
	Field string
	Msg   string
}

func (e *InvalidError) Error() string { return e.Field + ": " + e.Msg }

func invalid(field, format string, args ...any) error {
	return &InvalidError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// Request is one generation (or scoring) job.
type Request struct {
	// ID identifies the request for Abort and in logs; it must be unique
	// among requests in flight. The runtime makes one when empty.
	ID string
	// Prompt token ids (not empty, each in the vocabulary).
	Prompt []int32
	// Sampling chooses tokens; Temperature 0 is greedy. Seed makes sampled
	// tokens reproducible regardless of batching.
	Sampling sample.Params
	// StopIDs end generation after one of them is produced.
	StopIDs []int32
	// IgnoreEOS keeps generating past the model's end-of-sequence ids
	// (config.json and generation_config.json eos_token_id), which
	// otherwise end the request with FinishStop (benchmarks set it).
	IgnoreEOS bool
	// MaxTokens to generate (≥ 1; len(Prompt)+MaxTokens ≤ the context limit).
	MaxTokens int
	// TopLogprobs alternatives to report with each token (0..MaxTopLogprobs).
	TopLogprobs int
	// Owner names the caller that submitted the request (an API key's id;
	// "" when the server has no keys): only it may AbortBy the request,
	// besides an admin.
	Owner string

	// Processing are the logits processors (penalties, logit_bias), applied
	// before each pick on the backend that samples: the scheduler keeps
	// each request's edits (backend.SampleSpec.Edits) up to date token by
	// token. A processed request (Processing active or MinTokens > 0)
	// decodes plainly: it never speculates.
	Processing sample.Processing
	// MinTokens bans the end-of-sequence ids and StopIDs until this many
	// tokens were generated (0 ≤ MinTokens ≤ MaxTokens; the ids EndIDs
	// gives: with IgnoreEOS, the stop ids only).
	MinTokens int
	// Constraint, when set, restricts every generated token (structured
	// output, forced tool calls); the request then decodes plainly (no
	// speculation).
	Constraint Constraint

	// NoSpeculation decodes plainly even when the runtime speculates.
	NoSpeculation bool

	// Stops, when set, makes the watcher of each choice's output (stop
	// strings: core/text's StopWatch). The scheduler feeds it every
	// generated token from its loop; when it reports a match the request
	// ends there with FinishStop, counting the tokens up to that one, so
	// the final, the log and the metrics say stop however far the
	// submitter lags behind (it still trims the text itself).
	Stops func() StopWatcher

	// N is the number of choices (0 or 1: one). With N > 1 (SubmitGroup)
	// the prompt is prefilled once and forked into N slots (Store.Copy),
	// choice i sampling with seed Sampling.Seed+i, each with its own
	// outbox; the choices decode plainly (no speculation).
	N int

	// Score runs the prompt only and returns logits in Final.Logits
	// instead of generating; AllPositions selects every row, else the last.
	Score        bool
	AllPositions bool
}

// StopWatcher sees a request's generated tokens in order and reports the
// one that completed a stop string. It is called from the scheduler's loop
// only, never concurrently.
type StopWatcher interface {
	Feed(id int32) bool
}

// Constraint restricts a request's generated tokens (sample.Constraint:
// a grammar compiled over the vocabulary, structured output, tool calls).
// The scheduler calls it from its loop only, one request's at a time,
// never concurrently. A request of N > 1 choices needs one that can start
// afresh (sample.Restarter): each choice follows its own.
type Constraint = sample.Constraint

// Token is one generated token.
type Token struct {
	ID      int32
	Logprob float32 // log-softmax of the logits (processed: Processing, MinTokens' bans)
	Top     []TokenLogprob
	Index   int // position among generated tokens
}

// TokenLogprob is one alternative of a token.
type TokenLogprob = sample.TokenLogprob

// FinishReason says why a request ended.
type FinishReason int

// Finish reasons.
const (
	FinishStop      FinishReason = iota + 1 // a stop id or the model's EOS was produced
	FinishLength                            // max tokens (or the context limit)
	FinishAbort                             // Abort, drain or close
	FinishCancelled                         // the submitter's context ended (cancel or deadline)
	FinishError                             // the engine failed
	FinishScored                            // a Score request completed
)

func (f FinishReason) String() string {
	switch f {
	case FinishStop:
		return "stop"
	case FinishLength:
		return "length"
	case FinishAbort:
		return "abort"
	case FinishCancelled:
		return "cancelled"
	case FinishError:
		return "error"
	case FinishScored:
		return "scored"
	}
	return "unknown"
}

// Final is the outcome of a request.
type Final struct {
	ID               string
	Reason           FinishReason
	Message          string // detail for Abort, Cancelled, Error
	PromptTokens     int
	CompletionTokens int
	Queue            time.Duration // arrival → admission (zero if never admitted)
	TTFT             time.Duration // arrival → first token (zero if none)
	Total            time.Duration // arrival → end
	Seed             uint64
	// Score requests: Rows×Vocab logits.
	Logits      []float32
	Rows, Vocab int
	// Spec counts the request's speculative decoding (zero without it).
	Spec speculative.Stats
	// SimulatedAcceptance is the per-draft rate its verify steps' acceptance
	// was simulated at (Options.SimulateAcceptance; 0: the target's own
	// acceptance, or no verify step): its tokens are not the model's.
	SimulatedAcceptance float64
}

// request is a Request in flight.
type request struct {
	Request
	sampler *sample.Sampler
	proc    *procs // logits processing (nil: none)

	// Scheduler state (guarded by Scheduler.mu).
	slot      int // -1 until admitted
	fed       int // prompt tokens already run
	cached    int // tokens the slot's cache holds (the host-side length)
	next      int32
	generated int
	killed    bool // finalized from outside; the scheduler frees the slot
	arrived   time.Time
	admitted  time.Time
	firstTok  time.Time
	lastTok   time.Time
	stopWatch func() bool
	stops     StopWatcher // Request.Stops' watcher (nil: none)
	logits    []float32   // score rows collected so far
	rows      int
	drafting  bool              // the drafter drafts for it (speculative decoding)
	stats     speculative.Stats // its speculation so far
	simKey    uint64            // speculative.SimulationKey (simulated acceptance), set when simKeyed
	simKeyed  bool
	// An n > 1 request (group.go): its choices have grp set and their
	// index; its carrier, which runs the shared prefill, has carrier set.
	grp     *group
	choice  int
	carrier bool

	// stopCounted: a Stop's final counts counted completion tokens, not
	// every generated one (guarded by Scheduler.mu).
	stopCounted bool
	counted     int

	// Preemption (pages.go; guarded by Scheduler.mu): out holds every
	// generated token's id; a request preempted after generating resumes
	// by recomputing seq (its prompt and every generated token but the
	// last) with resuming set, and then decodes out's last token, as
	// though it had never left. preempted counts its preemptions.
	out       []int32
	seq       []int32
	resuming  bool
	preempted int

	// Outbox (guarded by mu): tokens not yet received and the final.
	mu      sync.Mutex
	pending []Token
	final   *Final
	notify  chan struct{} // capacity 1: something new in the outbox
}

func (r *request) prefilling() bool { return r.fed < len(r.feed()) }

// feed is the sequence r prefills: its prompt, or while it resumes from a
// preemption its prompt and the tokens it had generated (but the last).
func (r *request) feed() []int32 {
	if r.seq != nil {
		return r.seq
	}
	return r.Prompt
}

func (r *request) emit(t Token) {
	r.mu.Lock()
	r.pending = append(r.pending, t)
	r.mu.Unlock()
	signal(r.notify)
}

// setFinal stores the final once; it reports whether this call did.
func (r *request) setFinal(f *Final) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.final != nil {
		return false
	}
	r.final = f
	signal(r.notify)
	return true
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// Handle is the submitter's view of a request.
type Handle struct{ r *request }

// ID is the request's id (the submitted one or the one the runtime made).
func (h *Handle) ID() string { return h.r.ID }

// Recv waits for output: the tokens produced since the last call (at least
// one), or, once every token was received, the final outcome. It returns
// ctx's error if ctx ends first. After the final, Recv keeps returning it.
func (h *Handle) Recv(ctx context.Context) ([]Token, *Final, error) {
	r := h.r
	for {
		r.mu.Lock()
		if len(r.pending) > 0 {
			toks := r.pending
			r.pending = nil
			r.mu.Unlock()
			return toks, nil, nil
		}
		if f := r.final; f != nil {
			r.mu.Unlock()
			return nil, f, nil
		}
		r.mu.Unlock()
		select {
		case <-r.notify:
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
	}
}

// Wait receives until the final, returning every token and the final.
func (h *Handle) Wait(ctx context.Context) ([]Token, *Final, error) {
	var all []Token
	for {
		toks, f, err := h.Recv(ctx)
		if err != nil {
			return all, nil, err
		}
		all = append(all, toks...)
		if f != nil {
			return all, f, nil
		}
	}
}
