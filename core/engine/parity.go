package engine

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/core/plan"
)

// Parity is the load-time parity gate of passes whose graphs the engine
// cannot otherwise trust (plugin passes: a graph that validates may still
// compute something else). A program in which one of Passes fired is run
// on a built-in probe (two sequences of fixed tokens) beside the same
// program built without any pass, on stores of their own, and refused when
// a logit differs by more than Tolerance × max(1, the largest reference
// logit's magnitude).
type Parity struct {
	// Passes names the passes to check (the plugin passes).
	Passes []string
	// Tolerance is the relative bound (DefaultParityTolerance when 0).
	Tolerance float64
	// OptOut says how the operator turns the gate off, for the refusal's
	// message ("set plugins.allow_parity_mismatch: true").
	OptOut string
}

// DefaultParityTolerance is Parity.Tolerance's default: far above what a
// reordered sum changes in bf16, far below what a wrong graph does.
const DefaultParityTolerance = 0.01

// ParityFromConfig is the parity gate of ec's plugin passes (those listed
// in passes that are not built-in): nil when there is none or
// plugins.allow_parity_mismatch is on.
func ParityFromConfig(ec *config.Config) *Parity {
	if ec.Plugins.AllowParityMismatch {
		return nil
	}
	var names []string
	for _, p := range ec.Enabled() {
		if _, builtin := pass.Lookup(p.Name); !builtin {
			names = append(names, p.Name)
		}
	}
	if len(names) == 0 {
		return nil
	}
	return &Parity{Passes: names, Tolerance: ec.Plugins.ParityTolerance, OptOut: "set plugins.allow_parity_mismatch: true"}
}

// probe tokens: two sequences (their ids are taken modulo the vocabulary)
var (
	probeA = []int32{11, 7, 3, 19, 5, 23, 2}
	probeB = []int32{13, 17, 29, 31, 37}
)

// checkParity runs the parity gate for program key, whose graph with the
// passes compiled to got (report rep). It returns nil when no checked pass
// fired, or the program is an MTP or DFlash draft one (its batches need
// the trunk's hidden rows: not probed).
func (e *Engine) checkParity(key Key, got backend.Program, rep *pass.Report) error {
	pc := e.opts.Parity
	if pc == nil || rep == nil || key.MTP || key.DFlash {
		return nil
	}
	var fired []string
	for _, name := range rep.FiredPasses() {
		if slices.Contains(pc.Passes, name) {
			fired = append(fired, name)
		}
	}
	if len(fired) == 0 {
		return nil
	}
	tol := pc.Tolerance
	if tol <= 0 {
		tol = DefaultParityTolerance
	}
	var closers []io.Closer
	defer func() {
		for _, c := range closers {
			_ = c.Close()
		}
	}()
	compile := func(k Key) (backend.Program, error) {
		g, err := e.build(k)
		if err != nil {
			return nil, err
		}
		if e.opts.Hook != nil {
			if err := e.opts.Hook(g, k); err != nil {
				return nil, err
			}
		}
		lazy := false
		if lw, ok := e.be.(backend.LazyWeights); ok {
			lazy = lw.LazyWeights()
		}
		pl, err := plan.Compile(g, e.weights, plan.Options{MaxPositions: e.opts.MaxPositions, Lazy: lazy})
		if err != nil {
			return nil, err
		}
		p, err := e.be.Compile(pl)
		if c, ok := p.(io.Closer); ok && err == nil {
			closers = append(closers, c)
		}
		return p, err
	}
	ref, err := compile(key)
	if err != nil {
		return fmt.Errorf("parity probe of %s: the program without passes: %w", key, err)
	}
	var fill backend.Program // fills the caches before a decode or extend probe
	if key.Mode == graph.Decode || key.Mode == graph.Extend {
		if fill, err = compile(Key{Mode: graph.Prefill, Logits: graph.LastLogits}); err != nil {
			return fmt.Errorf("parity probe of %s: the prefill program: %w", key, err)
		}
	}
	V := int32(e.cfg.VocabSize)
	toks := func(t []int32) []int32 {
		out := make([]int32, len(t))
		for i, x := range t {
			out[i] = x % V
		}
		return out
	}
	// the probe fits the engine's context limit (a study sizes it for its
	// longest request): a sequence's first and next tokens together
	L := max(e.opts.MaxPositions, 2)
	fit := func(first, next []int32) ([]int32, []int32) {
		next = next[:min(len(next), L-1)]
		return first[:max(1, min(len(first), L-len(next)))], next
	}
	a0, a1 := fit(probeA, []int32{41})
	b0, b1 := fit(probeB, []int32{43, 47, 53})
	if key.Mode == graph.Decode {
		b0, b1 = fit(probeB, []int32{43})
	}
	// one store per side, the probe's size
	run := func(p backend.Program) ([][]float32, error) {
		st, err := e.be.NewStore(e.cfg, e.cfg.TrunkLayers(), backend.StoreOptions{Slots: 2, MaxPositions: min(L, 64)})
		if err != nil {
			return nil, err
		}
		if c, ok := st.(io.Closer); ok {
			defer c.Close()
		}
		a, err := st.Alloc()
		if err != nil {
			return nil, err
		}
		b, err := st.Alloc()
		if err != nil {
			return nil, err
		}
		first := &backend.Batch{Seqs: []backend.Seq{{Slot: a, Tokens: toks(a0)}, {Slot: b, Tokens: toks(b0)}}}
		next := &backend.Batch{Seqs: []backend.Seq{{Slot: a, Tokens: toks(a1)}, {Slot: b, Tokens: toks(b1)}}}
		var batches []*backend.Batch
		switch key.Mode {
		case graph.Prefill:
			batches = []*backend.Batch{first}
		case graph.Mixed:
			batches = []*backend.Batch{first, next}
		case graph.Decode, graph.Extend:
			if _, err := fill.Run(first, st); err != nil {
				return nil, err
			}
			batches = []*backend.Batch{next}
		default:
			return nil, fmt.Errorf("no probe for mode %s", key.Mode)
		}
		var out [][]float32
		for _, bt := range batches {
			res, err := p.Run(bt, st)
			if err != nil {
				return nil, err
			}
			out = append(out, append([]float32(nil), res.Logits...))
		}
		return out, nil
	}
	want, err := run(ref)
	if err != nil {
		return fmt.Errorf("parity probe of %s without passes: %w", key, err)
	}
	have, err := run(got)
	if err != nil {
		return fmt.Errorf("parity probe of %s with passes %s: %w", key, strings.Join(fired, ", "), err)
	}
	for i := range want {
		scale, worst, at := 1.0, 0.0, -1
		for _, x := range want[i] {
			scale = max(scale, math.Abs(float64(x)))
		}
		if len(have[i]) != len(want[i]) {
			return parityErr(pc, key, fired, fmt.Sprintf("batch %d: %d logits, %d without the passes", i+1, len(have[i]), len(want[i])))
		}
		for j := range want[i] {
			d := math.Abs(float64(have[i][j]) - float64(want[i][j]))
			if d != d || d > worst { // NaN counts as the worst
				worst, at = d, j
				if d != d {
					worst = math.Inf(1)
				}
			}
		}
		if worst > tol*scale {
			return parityErr(pc, key, fired, fmt.Sprintf("batch %d, logit %d: %g, %g without the passes (|Δ| %.3g > %g × %.3g)",
				i+1, at, have[i][at], want[i][at], worst, tol, scale))
		}
	}
	return nil
}

func parityErr(pc *Parity, key Key, fired []string, why string) error {
	optOut := pc.OptOut
	if optOut == "" {
		optOut = "turn the parity gate off"
	}
	return fmt.Errorf("engine: program %s: pass %s fails the parity probe against the graph without it: %s: refusing to serve it (%s to serve it anyway)",
		key, strings.Join(fired, ", "), why, optOut)
}
