package eval

import (
	"fmt"
	"math"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/ir"
)

// Result is one case's agreement with the reference.
type Result struct {
	Name        string
	Kind        string
	Rows        int     // logit rows compared
	MaxAbsDiff  float64 // max |Δlogit| over every compared row
	GreedyMatch bool    // every argmax (prefill/extend rows, decode tokens) agrees
	Mismatches  int     // rows or steps whose argmax differs
	// HiddenMaxDiff is the max |Δ| of the captured streams after each layer
	// (prefill cases that carry hidden states).
	HiddenMaxDiff []float64
}

// Pass reports whether the case is within tol with identical greedy tokens.
func (r Result) Pass(tol float64) bool { return r.MaxAbsDiff <= tol && r.GreedyMatch }

// Argmax returns the index of the largest value (lowest index on ties).
func Argmax(x []float32) int {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return best
}

func compare(got, want []float32, V int, r *Result) {
	rows := len(want) / V
	for i := 0; i < rows; i++ {
		g, w := got[i*V:(i+1)*V], want[i*V:(i+1)*V]
		for j := range w {
			r.MaxAbsDiff = math.Max(r.MaxAbsDiff, math.Abs(float64(g[j]-w[j])))
		}
		if Argmax(g) != Argmax(w) {
			r.Mismatches++
		}
	}
	r.Rows += rows
}

// RunCase runs one case on a fresh cache slot of e.
func RunCase(e *engine.Engine, c *Case, V int) (Result, error) {
	res := Result{Name: c.Name, Kind: c.Kind}
	slot, err := e.Store().Alloc()
	if err != nil {
		return res, err
	}
	defer e.Store().Free(slot)
	run := func(key engine.Key, toks []int32) (*backend.Result, error) {
		return e.Run(key, &backend.Batch{Seqs: []backend.Seq{{Slot: slot, Tokens: toks}}})
	}
	check := func(out *backend.Result) error {
		if out.Vocab != V {
			return fmt.Errorf("model vocab %d != reference vocab %d", out.Vocab, V)
		}
		return nil
	}
	switch c.Kind {
	case "prefill":
		out, err := run(engine.Key{Mode: graph.Prefill, Logits: graph.AllLogits, CaptureHidden: len(c.Hidden) > 0}, c.Tokens)
		if err != nil {
			return res, err
		}
		if err := check(out); err != nil {
			return res, err
		}
		compare(out.Logits, c.Logits, V, &res)
		for l := 0; l < len(c.Hidden); l++ {
			res.HiddenMaxDiff = append(res.HiddenMaxDiff, maxAbs(out.Hidden[ir.HiddenOutput(l)], c.Hidden[l]))
		}
	case "decode":
		out, err := run(engine.Key{Mode: graph.Prefill, Logits: graph.LastLogits}, c.Tokens)
		if err != nil {
			return res, err
		}
		if err := check(out); err != nil {
			return res, err
		}
		compare(out.Logits, c.StepLogits[:V], V, &res)
		last := out.Logits
		for s, want := range c.Greedy {
			tok := int32(Argmax(last))
			if tok != want {
				res.Mismatches++
				tok = want // stay on the reference trajectory so later rows stay comparable
			}
			out, err = run(engine.Key{Mode: graph.Decode, Logits: graph.LastLogits}, []int32{tok})
			if err != nil {
				return res, err
			}
			compare(out.Logits, c.StepLogits[(s+1)*V:(s+2)*V], V, &res)
			last = out.Logits
		}
	case "extend":
		out, err := run(engine.Key{Mode: graph.Prefill, Logits: graph.AllLogits}, c.Tokens[:c.Split])
		if err != nil {
			return res, err
		}
		if err := check(out); err != nil {
			return res, err
		}
		compare(out.Logits, c.LogitsFirst, V, &res)
		out, err = run(engine.Key{Mode: graph.Extend, Logits: graph.AllLogits}, c.Tokens[c.Split:])
		if err != nil {
			return res, err
		}
		compare(out.Logits, c.LogitsSecond, V, &res)
	default:
		return res, fmt.Errorf("unknown case kind %q", c.Kind)
	}
	res.GreedyMatch = res.Mismatches == 0
	return res, nil
}

// RunAll runs every case of ref.
func RunAll(e *engine.Engine, ref *Reference) ([]Result, error) {
	var out []Result
	for i := range ref.Cases {
		r, err := RunCase(e, &ref.Cases[i], ref.Vocab)
		if err != nil {
			return out, fmt.Errorf("case %s: %w", ref.Cases[i].Name, err)
		}
		out = append(out, r)
	}
	return out, nil
}

// EngineReference records engine e's own outputs as a reference: per prompt
// a prefill case (every row's logits) and a decode case (the last prompt
// row and steps greedy steps along e's own argmax). Running another engine
// on it (RunAll) compares the two, e.g. precision bf16 against fp32 on a
// model without a transformers reference.
func EngineReference(e *engine.Engine, prompts [][]int32, steps int) (*Reference, error) {
	ref := &Reference{Path: "engine", Vocab: 0}
	for i, toks := range prompts {
		slot, err := e.Store().Alloc()
		if err != nil {
			return nil, err
		}
		run := func(mode graph.Mode, logits graph.Logits, t []int32) ([]float32, error) {
			res, err := e.Run(engine.Key{Mode: mode, Logits: logits}, &backend.Batch{Seqs: []backend.Seq{{Slot: slot, Tokens: t}}})
			if err != nil {
				return nil, err
			}
			ref.Vocab = res.Vocab
			return append([]float32(nil), res.Logits...), nil
		}
		pre, err := run(graph.Prefill, graph.AllLogits, toks)
		e.Store().Free(slot)
		if err != nil {
			return nil, err
		}
		ref.Cases = append(ref.Cases, Case{Name: fmt.Sprintf("prefill-%d", i), Kind: "prefill", Tokens: toks, Logits: pre})
		if slot, err = e.Store().Alloc(); err != nil {
			return nil, err
		}
		c := Case{Name: fmt.Sprintf("decode-%d", i), Kind: "decode", Tokens: toks}
		last, err := run(graph.Prefill, graph.LastLogits, toks)
		for s := 0; err == nil && s < steps; s++ {
			c.StepLogits = append(c.StepLogits, last...)
			tok := int32(Argmax(last))
			c.Greedy = append(c.Greedy, tok)
			last, err = run(graph.Decode, graph.LastLogits, []int32{tok})
		}
		e.Store().Free(slot)
		if err != nil {
			return nil, err
		}
		c.StepLogits = append(c.StepLogits, last...)
		ref.Cases = append(ref.Cases, c)
	}
	return ref, nil
}
