package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/sample"
	"github.com/glmflash/glmflash/core/sched"
	"github.com/glmflash/glmflash/core/speculative"
)

// specMeter times a scheduler's decode phase from its own goroutine: it
// begins when the last request gets its first token (the prefill phase
// ends) and ends when the last request finishes; it counts the trunk
// passes in between.
type specMeter struct {
	sched.NopMetrics
	mu          sync.Mutex
	n, firsts   int
	from, until time.Time
	passes      int
}

func (m *specMeter) FirstToken(time.Duration) {
	m.mu.Lock()
	if m.firsts++; m.firsts == m.n {
		m.from = time.Now()
	}
	m.mu.Unlock()
}

func (m *specMeter) Step(int, int, time.Duration) {
	m.mu.Lock()
	if !m.from.IsZero() {
		m.passes++ // Step is reported after the pass, before its tokens: passes after the last first token
	}
	m.mu.Unlock()
}

func (m *specMeter) Finished(*sched.Final) {
	m.mu.Lock()
	m.until = time.Now()
	m.mu.Unlock()
}

// specRun is one measured generation through the scheduler: B requests of
// a 32-token prompt decode steps tokens each (after their first token).
type specRun struct {
	tokens [][]int32 // every request's generated tokens
	decode int       // tokens generated after the first (the decode phase)
	secs   float64   // the decode phase
	passes int       // trunk passes in the decode phase
	st     speculative.Stats
}

// runSched generates through a scheduler on e with drafter d (nil: plain)
// and simulated acceptance sim (0: off; sched.Options.SimulateAcceptance).
func runSched(e *engine.Engine, d speculative.Drafter, sim float64, prompts [][]int32, steps int) (*specRun, error) {
	m := &specMeter{n: len(prompts)}
	rt, err := sched.New(e, sched.Config{MaxQueue: len(prompts)}, sched.Options{Drafter: d, Metrics: m, SimulateAcceptance: sim})
	if err != nil {
		return nil, err
	}
	defer rt.Close()
	ctx := context.Background()
	var hs []*sched.Handle
	for _, p := range prompts {
		h, err := rt.Submit(ctx, sched.Request{Prompt: p, MaxTokens: steps + 1, Sampling: sample.Greedy(), IgnoreEOS: true})
		if err != nil {
			return nil, err
		}
		hs = append(hs, h)
	}
	run := &specRun{tokens: make([][]int32, len(hs))}
	for i, h := range hs {
		toks, f, err := h.Wait(ctx)
		if err != nil {
			return nil, err
		}
		if f.Reason != sched.FinishLength {
			return nil, fmt.Errorf("request %d ended with %s: %s", i, f.Reason, f.Message)
		}
		for _, t := range toks {
			run.tokens[i] = append(run.tokens[i], t.ID)
		}
		run.decode += len(toks) - 1
		run.st = run.st.Add(f.Spec)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	run.secs, run.passes = m.until.Sub(m.from).Seconds(), m.passes
	if run.secs <= 0 {
		return nil, fmt.Errorf("the decode phase took no measurable time")
	}
	return run, nil
}
