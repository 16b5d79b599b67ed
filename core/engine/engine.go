// Package engine ties a checkpoint to compiled programs and a cache store:
// it builds (and memoizes) one program per batch mode and logits selection,
// all sharing one copy of the weights.
package engine

import (
	"fmt"
	"sync"

	"github.com/glmflash/glmflash/core/build"
	"github.com/glmflash/glmflash/core/cache"
	"github.com/glmflash/glmflash/core/exec"
	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/model"
)

// GraphHook may rewrite a freshly built graph before it is compiled (the
// pass pipeline plugs in here). It must leave a graph that verifies.
type GraphHook func(g *ir.Graph, key Key) error

// Options configure an engine.
type Options struct {
	Slots int // sequence slots in the cache store (default 8)
	// Passes, when set, rewrites every program's graph before compilation;
	// PassEnv is the eligibility environment (its Program field is set per
	// program).
	Passes  *pass.Pipeline
	PassEnv *pass.Env
	// Hook runs after the passes (tests and tools use it).
	Hook GraphHook
	Exec exec.Options
}

// Key identifies one program.
type Key struct {
	Mode          build.Mode
	Logits        build.Logits
	CaptureHidden bool
}

// Engine runs a model.
type Engine struct {
	cfg     *model.Config
	weights *exec.WeightCache
	store   *cache.Store
	opts    Options
	mu      sync.Mutex
	progs   map[Key]*exec.Program
	reports map[Key]*pass.Report
}

// String names a program ("prefill/all").
func (k Key) String() string {
	s := string(k.Mode) + "/" + string(k.Logits)
	if k.CaptureHidden {
		s += "+hidden"
	}
	return s
}

// New creates an engine over cfg and a weight source. Engines given the
// same *exec.WeightCache share every loaded tensor (and its bf16 copy).
func New(cfg *model.Config, w exec.Weights, opts Options) (*Engine, error) {
	if opts.Slots == 0 {
		opts.Slots = 8
	}
	st, err := cache.NewStore(cfg, opts.Slots)
	if err != nil {
		return nil, err
	}
	if opts.Exec.MaxPositions == 0 {
		opts.Exec.MaxPositions = cfg.MaxPositionEmbeddings
	}
	wc, ok := w.(*exec.WeightCache)
	if !ok {
		wc = exec.NewWeightCache(w)
	}
	return &Engine{cfg: cfg, weights: wc, store: st, opts: opts, progs: map[Key]*exec.Program{}, reports: map[Key]*pass.Report{}}, nil
}

// Config returns the model configuration.
func (e *Engine) Config() *model.Config { return e.cfg }

// Store returns the sequence cache.
func (e *Engine) Store() *cache.Store { return e.store }

// WeightBytes is the memory held by loaded weights.
func (e *Engine) WeightBytes() int64 { return e.weights.Bytes() }

// Program returns the compiled program for key, building it on first use.
func (e *Engine) Program(key Key) (*exec.Program, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if p, ok := e.progs[key]; ok {
		return p, nil
	}
	g, err := build.Build(e.cfg, build.Options{Mode: key.Mode, Logits: key.Logits, CaptureHidden: key.CaptureHidden})
	if err != nil {
		return nil, err
	}
	if e.opts.Passes != nil {
		env := &pass.Env{HostLengths: true, TP: pass.Topology{Size: 1, Known: true}}
		if e.opts.PassEnv != nil {
			cp := *e.opts.PassEnv
			env = &cp
		}
		if env.Model == nil {
			env.Model = e.cfg
		}
		env.Program = key.String()
		rep, err := e.opts.Passes.Run(g, env)
		if err != nil {
			return nil, fmt.Errorf("engine: %w", err)
		}
		e.reports[key] = rep
	}
	if e.opts.Hook != nil {
		if err := e.opts.Hook(g, key); err != nil {
			return nil, fmt.Errorf("engine: graph hook: %w", err)
		}
	}
	p, err := exec.Compile(g, e.weights, e.opts.Exec)
	if err != nil {
		return nil, err
	}
	e.progs[key] = p
	return p, nil
}

// Report returns the pass report of the program for key (nil when no
// passes are configured or the program was not built yet).
func (e *Engine) Report(key Key) *pass.Report {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.reports[key]
}

// Reports returns every built program's pass report.
func (e *Engine) Reports() map[Key]*pass.Report {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := map[Key]*pass.Report{}
	for k, v := range e.reports {
		out[k] = v
	}
	return out
}

// Run executes one batch with the program for key.
func (e *Engine) Run(key Key, b *exec.Batch) (*exec.Result, error) {
	p, err := e.Program(key)
	if err != nil {
		return nil, err
	}
	return p.Run(b, e.store)
}

// Prepare does the host-side work of a batch for the program of key with
// the scheduler's positions (see exec.Program.Prepare); it may run while
// another batch executes.
func (e *Engine) Prepare(key Key, b *exec.Batch, pos []int) (*exec.Prepared, error) {
	p, err := e.Program(key)
	if err != nil {
		return nil, err
	}
	return p.Prepare(b, e.store, pos)
}

// Execute runs a prepared batch.
func (e *Engine) Execute(key Key, pr *exec.Prepared) (*exec.Result, error) {
	p, err := e.Program(key)
	if err != nil {
		return nil, err
	}
	return p.Execute(pr)
}

// HostLengths reports whether the program of key can prepare batches ahead
// (the host-length-reuse pass removed every executor length read).
func (e *Engine) HostLengths(key Key) bool {
	p, err := e.Program(key)
	return err == nil && p.HostLengths()
}
