package engine

import (
	"errors"
	"fmt"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/collective"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/core/plan"
	"github.com/glmflash/glmflash/model"
)

// tpRanks are a tensor-parallel engine's rank engines and the group their
// collectives meet in. Rank r's engine compiles rank r's shard of every
// graph on its own backend (backend.Options.Comm is its rank of group)
// and keeps its own store; the group leader (the Engine New returned)
// fans each program run and store call out to all of them, one goroutine
// per rank, and answers with rank 0's result (the logits are all-gathered,
// so every rank holds the same).
type tpRanks struct {
	group *collective.Group
	ranks []*Engine
}

// newTP makes the rank engines of opts.TP ranks and their leader.
func newTP(cfg *model.Config, w plan.Weights, opts Options) (*Engine, error) {
	n := opts.TP
	switch {
	case opts.BackendInstance != nil:
		return nil, fmt.Errorf("engine: parallel.tp_size %d opens one backend per rank; an open backend instance cannot be shared", n)
	case opts.Device != "" && opts.Device != "cpu":
		return nil, fmt.Errorf("engine: parallel.tp_size %d is implemented on the cpu backend only (device %s has no communicator yet: docs/tensor-parallel.md)", n, opts.Device)
	case opts.DFlash != nil:
		return nil, fmt.Errorf("engine: parallel.tp_size %d with a DFlash drafter (speculative.method dflash) is not implemented", n)
	case opts.Planned:
		return nil, fmt.Errorf("engine: parallel.tp_size %d with the memory planner (serve sizes its stores by runtime.memory_fraction) is not implemented", n)
	case opts.Parity != nil:
		return nil, fmt.Errorf("engine: parallel.tp_size %d with the plugin passes' parity gate is not implemented (plugin passes are refused under tensor parallelism; plugins.allow_parity_mismatch skips the gate)", n)
	}
	if err := graph.CheckTP(cfg, n); err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	g, err := collective.NewGroup(n)
	if err != nil {
		return nil, fmt.Errorf("engine: parallel.tp_size: %w", err)
	}
	t := &tpRanks{group: g}
	for r := range n {
		ro := opts
		ro.TP = 0
		ro.Backend.Comm = g.Rank(r)
		e, err := newEngine(cfg, w, ro, graph.Shard{Size: n, Rank: r})
		if err != nil {
			for _, done := range t.ranks {
				_ = done.Close()
			}
			return nil, fmt.Errorf("engine: tensor-parallel rank %d: %w", r, err)
		}
		t.ranks = append(t.ranks, e)
	}
	lead := &Engine{cfg: cfg, be: t.ranks[0].be, weights: t.ranks[0].weights, trunkSrc: w, opts: opts, tp: t,
		progs: map[Key]backend.Program{}, reports: map[Key]*pass.Report{}}
	lead.opts.Slots = t.ranks[0].opts.Slots
	lead.opts.MaxPositions = t.ranks[0].opts.MaxPositions
	st, err := t.stores(func(r *Engine) (backend.Store, error) { return r.store, nil })
	if err != nil {
		return nil, err
	}
	lead.store = st
	return lead, nil
}

// TP is the engine's tensor-parallel size (1: one device).
func (e *Engine) TP() int {
	if e.tp == nil {
		return 1
	}
	return len(e.tp.ranks)
}

// Collectives returns rank 0's collective counters (all-reduces,
// all-gathers, bytes, time inside them) and whether the engine is
// tensor-parallel at all. Every rank issues the same collectives.
func (e *Engine) Collectives() (collective.Stats, bool) {
	if e.tp == nil {
		return collective.Stats{}, false
	}
	return e.tp.group.Rank(0).Stats(), true
}

// stores fans a store out over the ranks (each rank's from get).
func (t *tpRanks) stores(get func(r *Engine) (backend.Store, error)) (*tpStore, error) {
	s := &tpStore{}
	for i, r := range t.ranks {
		st, err := get(r)
		if err != nil {
			return nil, fmt.Errorf("engine: tensor-parallel rank %d: %w", i, err)
		}
		s.ranks = append(s.ranks, st)
	}
	return s, nil
}

// tpProgram compiles (or finds) every rank's program of key and wraps
// them (e.mu held).
func (e *Engine) tpProgram(key Key) (backend.Program, error) {
	p := &tpProgram{group: e.tp.group}
	for i, r := range e.tp.ranks {
		rp, err := r.Program(key)
		if err != nil {
			return nil, fmt.Errorf("tensor-parallel rank %d: %w", i, err)
		}
		p.ranks = append(p.ranks, rp)
	}
	if rep := e.tp.ranks[0].Report(key); rep != nil {
		e.reports[key] = rep
	}
	e.progs[key] = p
	return p, nil
}

// tpProgram runs one program per rank, concurrently, on the ranks' stores
// (a tpStore).
type tpProgram struct {
	group *collective.Group
	ranks []backend.Program
}

// Plan is rank 0's plan (every rank's graph has the same inputs and
// outputs).
func (p *tpProgram) Plan() *plan.Plan { return p.ranks[0].Plan() }

// Stats are rank 0's counters.
func (p *tpProgram) Stats() backend.Stats { return p.ranks[0].Stats() }

// Run runs b on every rank with its store; the result is rank 0's.
func (p *tpProgram) Run(b *backend.Batch, st backend.Store) (*backend.Result, error) {
	ts, err := p.store(st)
	if err != nil {
		return nil, err
	}
	res := make([]*backend.Result, len(p.ranks))
	err = p.group.Run(func(r int) error {
		var err error
		res[r], err = p.ranks[r].Run(b, ts.ranks[r])
		return err
	})
	return res[0], err
}

// Execute runs a batch prepared on the tpStore: each rank gets a copy of
// it naming its own program and store.
func (p *tpProgram) Execute(pr *backend.Prepared) (*backend.Result, error) {
	ts, err := p.store(pr.Store)
	if err != nil {
		return nil, err
	}
	res := make([]*backend.Result, len(p.ranks))
	err = p.group.Run(func(r int) error {
		rp := *pr
		rp.Prog, rp.Store = p.ranks[r], ts.ranks[r]
		var err error
		res[r], err = p.ranks[r].Execute(&rp)
		return err
	})
	return res[0], err
}

func (p *tpProgram) store(st backend.Store) (*tpStore, error) {
	ts, ok := st.(*tpStore)
	if !ok || len(ts.ranks) != len(p.ranks) {
		return nil, fmt.Errorf("engine: a tensor-parallel program runs on its engine's stores (one per rank), got %T", st)
	}
	return ts, nil
}

// tpStore is the ranks' stores as one: every call goes to each rank's
// store in rank order (their slots stay in step: they see the same calls);
// queries answer with rank 0's.
type tpStore struct{ ranks []backend.Store }

func (s *tpStore) each(f func(st backend.Store) error) error {
	var errs []error
	for r, st := range s.ranks {
		if err := f(st); err != nil {
			errs = append(errs, fmt.Errorf("tensor-parallel rank %d: %w", r, err))
		}
	}
	return errors.Join(errs...)
}

// Alloc allocates one slot on every rank (the same slot: the stores have
// seen the same calls).
func (s *tpStore) Alloc() (int, error) {
	slot := -1
	for r, st := range s.ranks {
		got, err := st.Alloc()
		if err == nil && r > 0 && got != slot {
			err = fmt.Errorf("allocated slot %d where rank 0 allocated %d", got, slot)
			_ = st.Free(got)
		}
		if err != nil {
			for _, done := range s.ranks[:r] {
				_ = done.Free(slot)
			}
			return 0, fmt.Errorf("tensor-parallel rank %d: %w", r, err)
		}
		slot = got
	}
	return slot, nil
}

func (s *tpStore) Free(slot int) error {
	return s.each(func(st backend.Store) error { return st.Free(slot) })
}

func (s *tpStore) Len(slot int) (int, error) { return s.ranks[0].Len(slot) }
func (s *tpStore) Capacity() int             { return s.ranks[0].Capacity() }
func (s *tpStore) InUse() int                { return s.ranks[0].InUse() }

func (s *tpStore) Checkpoint(slot int) error {
	return s.each(func(st backend.Store) error { return st.Checkpoint(slot) })
}

func (s *tpStore) Truncate(slot, n int) error {
	return s.each(func(st backend.Store) error { return st.Truncate(slot, n) })
}

func (s *tpStore) Copy(src, dst int) error {
	return s.each(func(st backend.Store) error { return st.Copy(src, dst) })
}
