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
	"github.com/glmflash/glmflash/model"
)

// GraphHook may rewrite a freshly built graph before it is compiled (the
// pass pipeline plugs in here). It must leave a graph that verifies.
type GraphHook func(g *ir.Graph, key Key) error

// Options configure an engine.
type Options struct {
	Slots int // sequence slots in the cache store (default 8)
	Hook  GraphHook
	Exec  exec.Options
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
}

// New creates an engine over cfg and a weight source.
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
	return &Engine{cfg: cfg, weights: exec.NewWeightCache(w), store: st, opts: opts, progs: map[Key]*exec.Program{}}, nil
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

// Run executes one batch with the program for key.
func (e *Engine) Run(key Key, b *exec.Batch) (*exec.Result, error) {
	p, err := e.Program(key)
	if err != nil {
		return nil, err
	}
	return p.Run(b, e.store)
}
