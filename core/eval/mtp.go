package eval

import (
	"encoding/json"
	"fmt"
	"math"
	"path/filepath"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/internal/regular"
	"github.com/glmflash/glmflash/model/safetensors"
)

// MTPFormat is the "format" of an MTP reference's JSON (written by
// tools/mtp_reference.py).
const MTPFormat = "glmflash-mtp-reference/1"

// MTPCase is one MTP reference case (architecture §7): a prompt through
// the trunk, the MTP layer over the prompt shifted by one token (position i
// reads token i+1 and the trunk's hidden row i) from an empty MTP cache,
// then chained draft steps.
type MTPCase struct {
	Name   string
	Tokens []int32 // the prompt, n tokens
	// TrunkLogits [n][V] and TrunkHidden [n][D]: the trunk's logits and
	// final hidden (after the stream mean and the final norm).
	TrunkLogits, TrunkHidden []float32
	// MTPTokens [n] is Tokens[1:] and the trunk's greedy next token.
	MTPTokens []int32
	// Split: the reference also ran the MTP prefill as two calls, [0,Split)
	// and [Split,n), with the same results (the engine runs it so).
	Split int
	// MTPLogits [n][V] and MTPHidden [n][D] (after shared_head.norm) of the
	// MTP layer over (MTPTokens, TrunkHidden).
	MTPLogits, MTPHidden []float32
	// Draft step k (at MTP position n+k) reads token DraftTokens[k], the
	// argmax of the previous logits row (MTPLogits' last, then
	// DraftLogits[k−1]), and the previous hidden row (MTPHidden's last, then
	// DraftHidden[k−1]).
	DraftTokens              []int32
	DraftLogits, DraftHidden []float32
}

// MTPReference is a loaded MTP reference file.
type MTPReference struct {
	Path          string
	Vocab, Hidden int
	Cases         []MTPCase
}

type mtpJSON struct {
	Format string `json:"format"`
	Cases  []struct {
		Name string `json:"name"`
	} `json:"cases"`
}

// LoadMTP reads an MTP reference: FILE.safetensors and the FILE.json
// beside it (format MTPFormat, the case list).
func LoadMTP(path string) (*MTPReference, error) {
	jpath := path[:len(path)-len(filepath.Ext(path))] + ".json"
	jb, err := regular.ReadFile(jpath, regular.ConfigLimit)
	if err != nil {
		return nil, fmt.Errorf("MTP reference: %w", err)
	}
	var rj mtpJSON
	if err := json.Unmarshal(jb, &rj); err != nil {
		return nil, fmt.Errorf("MTP reference %s: %w", jpath, err)
	}
	if rj.Format != MTPFormat {
		return nil, fmt.Errorf("MTP reference %s: format %q, want %q", jpath, rj.Format, MTPFormat)
	}
	f, err := safetensors.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ref := &MTPReference{Path: path}
	ints := func(name string) ([]int32, error) { return readInts(f, "MTP reference "+path, name) }
	// floats reads a [rows, width] tensor; width is the vocabulary or the
	// hidden size, fixed by the first tensor of each kind.
	floats := func(name string, rows int, width *int) ([]float32, error) {
		info, ok := f.Info(name)
		if !ok {
			return nil, fmt.Errorf("MTP reference %s: missing tensor %s", path, name)
		}
		if len(info.Shape) != 2 || info.Shape[0] != rows || info.Shape[1] < 1 || (*width != 0 && info.Shape[1] != *width) {
			return nil, fmt.Errorf("MTP reference %s: tensor %s has shape %v, want [%d, %d]", path, name, info.Shape, rows, *width)
		}
		*width = info.Shape[1]
		return f.Float32(name)
	}
	for _, jc := range rj.Cases {
		c := MTPCase{Name: jc.Name}
		p := jc.Name + "."
		if c.Tokens, err = ints(p + "input_ids"); err != nil {
			return nil, err
		}
		n := len(c.Tokens)
		if n < 2 {
			return nil, fmt.Errorf("MTP reference %s: case %s has %d prompt tokens, want at least 2", path, c.Name, n)
		}
		if c.MTPTokens, err = ints(p + "mtp_input_ids"); err != nil {
			return nil, err
		}
		if len(c.MTPTokens) != n {
			return nil, fmt.Errorf("MTP reference %s: %smtp_input_ids has %d tokens, want %d", path, p, len(c.MTPTokens), n)
		}
		for i := 0; i+1 < n; i++ {
			if c.MTPTokens[i] != c.Tokens[i+1] {
				return nil, fmt.Errorf("MTP reference %s: %smtp_input_ids[%d] is %d, want input_ids[%d] = %d", path, p, i, c.MTPTokens[i], i+1, c.Tokens[i+1])
			}
		}
		sp, err := ints(p + "split")
		if err != nil {
			return nil, err
		}
		if len(sp) != 1 || sp[0] <= 0 || int(sp[0]) >= n {
			return nil, fmt.Errorf("MTP reference %s: %ssplit is %v, want one value in (0, %d)", path, p, sp, n)
		}
		c.Split = int(sp[0])
		if c.DraftTokens, err = ints(p + "draft_tokens"); err != nil {
			return nil, err
		}
		K := len(c.DraftTokens)
		for _, x := range []struct {
			dst   *[]float32
			name  string
			rows  int
			width *int
		}{
			{&c.TrunkLogits, "trunk_logits", n, &ref.Vocab}, {&c.TrunkHidden, "trunk_hidden", n, &ref.Hidden},
			{&c.MTPLogits, "mtp_logits", n, &ref.Vocab}, {&c.MTPHidden, "mtp_hidden", n, &ref.Hidden},
			{&c.DraftLogits, "draft_logits", K, &ref.Vocab}, {&c.DraftHidden, "draft_hidden", K, &ref.Hidden},
		} {
			if *x.dst, err = floats(p+x.name, x.rows, x.width); err != nil {
				return nil, err
			}
		}
		ref.Cases = append(ref.Cases, c)
	}
	if len(ref.Cases) == 0 {
		return nil, fmt.Errorf("MTP reference %s: no cases", jpath)
	}
	return ref, nil
}

// MTPResult is one MTP case's agreement with the reference: max |Δ| per
// part, and greedy tokens that differ.
type MTPResult struct {
	Name string
	// Trunk: logits and final hidden of the prompt.
	TrunkLogits, TrunkHidden float64
	// MTP: the prefill (two calls) on the reference's trunk hidden.
	MTPLogits, MTPHidden float64
	// Draft: the draft steps on the reference's tokens and hidden rows.
	DraftLogits, DraftHidden float64
	// Chain: the engine on its own from the prompt: its trunk hidden, its
	// greedy tokens and its MTP hidden rows (logits and hidden of the MTP
	// prefill and every draft step).
	ChainLogits, ChainHidden float64
	// Mismatches counts greedy tokens that differ: the trunk's next token,
	// the argmax of every MTP and draft row, the chain's tokens.
	Mismatches int
}

// MaxDiff is the largest of the result's differences.
func (r MTPResult) MaxDiff() float64 {
	return max(r.TrunkLogits, r.TrunkHidden, r.MTPLogits, r.MTPHidden, r.DraftLogits, r.DraftHidden, r.ChainLogits, r.ChainHidden)
}

// Pass reports whether every difference is within tol with identical
// greedy tokens.
func (r MTPResult) Pass(tol float64) bool { return r.MaxDiff() <= tol && r.Mismatches == 0 }

// maxAbs is the largest |got−want| (+Inf when the lengths differ).
func maxAbs(got, want []float32) float64 {
	if len(got) != len(want) {
		return math.Inf(1)
	}
	d := 0.0
	for i := range want {
		d = math.Max(d, math.Abs(float64(got[i]-want[i])))
	}
	return d
}

// argmaxMismatches counts rows whose argmax differs.
func argmaxMismatches(got, want []float32, V int) int {
	n := 0
	for r := 0; r+1 <= len(want)/V && (r+1)*V <= len(got); r++ {
		if Argmax(got[r*V:(r+1)*V]) != Argmax(want[r*V:(r+1)*V]) {
			n++
		}
	}
	return n
}

// mtpRunner runs one case's batches on fresh slots of e's stores.
type mtpRunner struct {
	e          *engine.Engine
	trunk, mtp backend.Store
	slots      [][2]int // allocated (trunk or MTP) slots, freed by close
}

func (m *mtpRunner) alloc(st backend.Store) (int, error) {
	s, err := st.Alloc()
	if err == nil {
		which := 0
		if st == m.mtp {
			which = 1
		}
		m.slots = append(m.slots, [2]int{which, s})
	}
	return s, err
}

func (m *mtpRunner) close() {
	for _, s := range m.slots {
		st := m.trunk
		if s[0] == 1 {
			st = m.mtp
		}
		st.Free(s[1])
	}
}

func (m *mtpRunner) run(key engine.Key, slot int, toks []int32, hidden []float32) (logits, fh []float32, err error) {
	out, err := m.e.Run(key, &backend.Batch{Seqs: []backend.Seq{{Slot: slot, Tokens: toks, Hidden: hidden}}})
	if err != nil {
		return nil, nil, err
	}
	fh, ok := out.Hidden[ir.OutputFinalHidden]
	if !ok {
		return nil, nil, fmt.Errorf("program %s returned no %s", key, ir.OutputFinalHidden)
	}
	return out.Logits, fh, nil
}

// RunMTPCase runs one MTP case on fresh slots of e (trunk and MTP stores).
func RunMTPCase(e *engine.Engine, c *MTPCase, V, D int) (MTPResult, error) {
	res := MTPResult{Name: c.Name}
	mst, err := e.MTPStore()
	if err != nil {
		return res, err
	}
	if e.Config().VocabSize != V || e.Config().HiddenSize != D {
		return res, fmt.Errorf("model vocab %d, hidden %d != reference vocab %d, hidden %d", e.Config().VocabSize, e.Config().HiddenSize, V, D)
	}
	m := &mtpRunner{e: e, trunk: e.Store(), mtp: mst}
	defer m.close()
	n, K := len(c.Tokens), len(c.DraftTokens)
	trunkKey := engine.Key{Mode: graph.Prefill, Logits: graph.AllLogits, FinalHidden: true}
	prefill := engine.Key{Mode: graph.Prefill, Logits: graph.AllLogits, MTP: true}
	extend := engine.Key{Mode: graph.Extend, Logits: graph.AllLogits, MTP: true}
	step := engine.Key{Mode: graph.Decode, Logits: graph.LastLogits, MTP: true}
	row := func(x []float32, r, w int) []float32 { return x[r*w : (r+1)*w] }

	// 1. the trunk
	ts, err := m.alloc(m.trunk)
	if err != nil {
		return res, err
	}
	tl, th, err := m.run(trunkKey, ts, c.Tokens, nil)
	if err != nil {
		return res, err
	}
	res.TrunkLogits, res.TrunkHidden = maxAbs(tl, c.TrunkLogits), maxAbs(th, c.TrunkHidden)
	if int32(Argmax(row(tl, n-1, V))) != c.MTPTokens[n-1] {
		res.Mismatches++
	}

	// 2. the MTP prefill on the reference's trunk hidden, in two calls
	ms, err := m.alloc(m.mtp)
	if err != nil {
		return res, err
	}
	l1, h1, err := m.run(prefill, ms, c.MTPTokens[:c.Split], c.TrunkHidden[:c.Split*D])
	if err != nil {
		return res, err
	}
	l2, h2, err := m.run(extend, ms, c.MTPTokens[c.Split:], c.TrunkHidden[c.Split*D:])
	if err != nil {
		return res, err
	}
	ml, mh := append(l1, l2...), append(h1, h2...)
	res.MTPLogits, res.MTPHidden = maxAbs(ml, c.MTPLogits), maxAbs(mh, c.MTPHidden)
	res.Mismatches += argmaxMismatches(ml, c.MTPLogits, V)

	// 3. draft steps on the reference's tokens and hidden rows
	prevL, prevH := row(ml, n-1, V), row(c.MTPHidden, n-1, D)
	for k := 0; k < K; k++ {
		if int32(Argmax(prevL)) != c.DraftTokens[k] {
			res.Mismatches++
		}
		l, h, err := m.run(step, ms, c.DraftTokens[k:k+1], prevH)
		if err != nil {
			return res, err
		}
		res.DraftLogits = math.Max(res.DraftLogits, maxAbs(l, row(c.DraftLogits, k, V)))
		res.DraftHidden = math.Max(res.DraftHidden, maxAbs(h, row(c.DraftHidden, k, D)))
		prevL, prevH = l, row(c.DraftHidden, k, D)
	}

	// 4. the engine's own chain from the prompt
	ts2, err := m.alloc(m.trunk)
	if err != nil {
		return res, err
	}
	tl, th, err = m.run(engine.Key{Mode: graph.Prefill, Logits: graph.LastLogits, FinalHidden: true}, ts2, c.Tokens, nil)
	if err != nil {
		return res, err
	}
	toks := append(append([]int32(nil), c.Tokens[1:]...), int32(Argmax(tl)))
	if toks[n-1] != c.MTPTokens[n-1] {
		res.Mismatches++
	}
	ms2, err := m.alloc(m.mtp)
	if err != nil {
		return res, err
	}
	ml, mh, err = m.run(prefill, ms2, toks, th)
	if err != nil {
		return res, err
	}
	res.ChainLogits, res.ChainHidden = maxAbs(ml, c.MTPLogits), maxAbs(mh, c.MTPHidden)
	prevL, prevH = row(ml, n-1, V), row(mh, n-1, D)
	for k := 0; k < K; k++ {
		tok := int32(Argmax(prevL))
		if tok != c.DraftTokens[k] {
			res.Mismatches++
		}
		l, h, err := m.run(step, ms2, []int32{tok}, prevH)
		if err != nil {
			return res, err
		}
		res.ChainLogits = math.Max(res.ChainLogits, maxAbs(l, row(c.DraftLogits, k, V)))
		res.ChainHidden = math.Max(res.ChainHidden, maxAbs(h, row(c.DraftHidden, k, D)))
		res.Mismatches += argmaxMismatches(l, row(c.DraftLogits, k, V), V)
		prevL, prevH = l, h
	}
	return res, nil
}

// RunMTP runs every case of ref.
func RunMTP(e *engine.Engine, ref *MTPReference) ([]MTPResult, error) {
	var out []MTPResult
	for i := range ref.Cases {
		r, err := RunMTPCase(e, &ref.Cases[i], ref.Vocab, ref.Hidden)
		if err != nil {
			return out, fmt.Errorf("case %s: %w", ref.Cases[i].Name, err)
		}
		out = append(out, r)
	}
	return out, nil
}

// IsMTPReference reports whether the JSON file at path is an MTP reference
// (its "format" is MTPFormat); false when it cannot be read or parsed.
func IsMTPReference(path string) bool {
	jb, err := regular.ReadFile(path, regular.ConfigLimit)
	if err != nil {
		return false
	}
	var j struct {
		Format string `json:"format"`
	}
	return json.Unmarshal(jb, &j) == nil && j.Format == MTPFormat
}
