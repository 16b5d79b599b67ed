package backend

import (
	"fmt"
	"sync"

	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/sample"
)

// Seq is one sequence of a batch: its cache slot and its new tokens.
type Seq struct {
	Slot   int
	Tokens []int32
	// Hidden holds one row of hidden state per token ([len(Tokens)][D],
	// row-major) for programs whose graph has the ir.InputHidden input (the
	// MTP layer's h); it must be empty for the others.
	Hidden []float32
	// Context holds the sequence's new context rows ([c][W], row-major,
	// c ≥ 0) for programs whose graph has the ir.InputContext input (a
	// DFlash draft graph: the target's captured hidden rows of the
	// positions committed since the sequence's last draft, W its input's
	// width); it must be empty for the others. Such a program advances the
	// sequence's (draft) store by c positions, not by its tokens: its
	// tokens are the block [pending token, MASK × (B−1)], never cached.
	Context []float32
	// LogitRows is how many of the sequence's last rows get logits in a
	// program with span logits (graph.SpanLogits; 0 means 1): a verify
	// span's last accepted token and every draft, a scored prompt's every
	// token. Programs of other selections take 0 or 1 only.
	LogitRows int
}

// Batch is a ragged batch: sequences of any lengths, run in one pass.
type Batch struct {
	Seqs []Seq
	// Sample, when set, asks the backend to pick a token from every logits
	// row (one spec per row, in row order); the picks come back in
	// Result.Samples. A device backend samples on the device.
	Sample []SampleSpec
	// SamplesOnly says the caller reads only Result.Samples: a device
	// backend then leaves the logits on the device (Result.Logits is nil).
	SamplesOnly bool
	// Into, when set, lets the backend write the result into *Into,
	// reusing its Logits, Hidden and Samples storage, and return Into (the
	// CPU backend does; others may return a new Result): a caller that
	// reads each step's result before the next step runs allocates nothing
	// for it. The previous contents are overwritten.
	Into *Result
}

// SampleSpec is how to pick one row's token.
type SampleSpec struct {
	Params sample.Params
	// U is the uniform draw in [0, 1) the pick uses when Params samples
	// (sample.Sampler.Draw); the scheduler draws it, so results do not
	// depend on where sampling runs or what else is batched.
	U float64
	// TopLogprobs is how many most likely alternatives to report.
	TopLogprobs int
	// Edits (sorted by token, unique) and Allow (nil: every token; else
	// sample.AllowWords(vocab) words) process the row's logits before the
	// pick, as sample.Apply does: penalties, logit_bias and bans, then a
	// constraint's mask. The reported log-probabilities are those of the
	// processed row. A device backend applies them on the device.
	Edits []sample.Edit
	Allow []uint32
}

// Processed reports whether the spec changes its row's logits.
func (s *SampleSpec) Processed() bool { return len(s.Edits) > 0 || s.Allow != nil }

// Sample is one row's pick.
type Sample struct {
	Token   int32
	Logprob float32
	Top     []sample.TokenLogprob
	// Err is set (and nothing else) when the row holds non-finite logits.
	Err error
}

// Result holds a run's outputs.
type Result struct {
	// Logits is [Rows][Vocab]: one row per token (AllLogits graphs) or one
	// per sequence (LastLogits graphs), in batch order. Nil when the batch
	// was SamplesOnly on a device backend.
	Logits []float32
	Rows   int
	Vocab  int
	// Hidden holds every graph output but the logits, by output name: the
	// captured residual streams "hidden.L" ([T][H][D], CaptureHidden) and
	// ir.OutputFinalHidden ([T][D], one row per token in batch order).
	Hidden map[string][]float32
	// Samples holds one pick per Batch.Sample entry.
	Samples []Sample
}

// Row returns logits row i.
func (r *Result) Row(i int) []float32 { return r.Logits[i*r.Vocab : (i+1)*r.Vocab] }

// Span is one sequence's place in a prepared batch.
type Span struct {
	Slot int
	Pos0 int // tokens already cached (position of the first new token)
	N    int // new tokens
	Row0 int // first row in the batch's token dimension
	// Rows is the number of the sequence's last rows that get logits in a
	// span-logits program (1 unless the batch asked more).
	Rows int
	// C is the sequence's new context rows and CRow0 its first row in the
	// batch's context dimension (ir.DimC; programs with ir.InputContext).
	C, CRow0 int
}

// Prepared is a validated batch: spans, tokens and sampling specs. It is
// built from the scheduler's positions (Prepare) or the store's (Run), so
// it can be prepared while another batch of the same sequences executes.
type Prepared struct {
	Prog   Program
	Store  Store
	Spans  []Span
	Tokens []int32
	T      int
	// Hidden is the batch's hidden input rows ([T][HiddenWidth]), nil for
	// programs without the ir.InputHidden input.
	Hidden      []float32
	HiddenWidth int
	// Context is the batch's context rows ([TC][ContextWidth], TC the sum
	// of the spans' C), nil for programs without the ir.InputContext input.
	Context      []float32
	ContextWidth int
	TC           int
	Sample       []SampleSpec
	// SamplesOnly mirrors Batch.SamplesOnly.
	SamplesOnly bool
}

// Rows is the number of logits rows the program produces for this batch.
func (pr *Prepared) Rows() int {
	switch pr.Prog.Plan().Logits.Shape[0] {
	case ir.DimS:
		return len(pr.Spans)
	case ir.DimR:
		return pr.SpanRows()
	}
	return pr.T
}

// SpanRows is the number of rows a span-logits selection (ir.DimR) keeps:
// the sum of the spans' Rows.
func (pr *Prepared) SpanRows() int {
	n := 0
	for _, s := range pr.Spans {
		n += s.Rows
	}
	return n
}

// SpanRowIndex lists, in order, the batch rows a span-logits selection
// keeps: each span's last Rows rows.
func (pr *Prepared) SpanRowIndex() []int32 {
	idx := make([]int32, 0, pr.SpanRows())
	for _, s := range pr.Spans {
		for j := s.N - s.Rows; j < s.N; j++ {
			idx = append(idx, int32(s.Row0+j))
		}
	}
	return idx
}

// SetTokens replaces sequence i's tokens (same count): decode tokens are
// known only after the previous step, after the batch was prepared.
func (pr *Prepared) SetTokens(i int, toks []int32) error {
	if i < 0 || i >= len(pr.Spans) {
		return fmt.Errorf("backend: no sequence %d in the prepared batch", i)
	}
	s := pr.Spans[i]
	if len(toks) != s.N {
		return fmt.Errorf("backend: sequence %d was prepared with %d tokens, got %d", i, s.N, len(toks))
	}
	vocab := pr.Prog.Plan().Vocab
	for j, t := range toks {
		if t < 0 || int(t) >= vocab {
			return fmt.Errorf("backend: sequence %d token %d: id %d out of range [0, %d)", i, j, t, vocab)
		}
	}
	copy(pr.Tokens[s.Row0:s.Row0+s.N], toks)
	return nil
}

// SetHidden replaces sequence i's hidden input rows (same count): the MTP
// layer's next h is known only after the previous step, after the batch
// was prepared.
func (pr *Prepared) SetHidden(i int, rows []float32) error {
	if i < 0 || i >= len(pr.Spans) {
		return fmt.Errorf("backend: no sequence %d in the prepared batch", i)
	}
	if pr.HiddenWidth == 0 {
		return fmt.Errorf("backend: the program takes no %s input", ir.InputHidden)
	}
	s, D := pr.Spans[i], pr.HiddenWidth
	if len(rows) != s.N*D {
		return fmt.Errorf("backend: sequence %d was prepared with %d hidden rows of %d, got %d values", i, s.N, D, len(rows))
	}
	copy(pr.Hidden[s.Row0*D:(s.Row0+s.N)*D], rows)
	return nil
}

// SetSample replaces the sampling specs (one per logits row).
func (pr *Prepared) SetSample(specs []SampleSpec, samplesOnly bool) error {
	if specs != nil && len(specs) != pr.Rows() {
		return fmt.Errorf("backend: %d sampling specs for %d logits rows", len(specs), pr.Rows())
	}
	pr.Sample, pr.SamplesOnly = specs, samplesOnly && specs != nil
	return nil
}

// Prepare validates a batch for prog: token ids, slots (allocated, not
// repeated), lengths within the context limit and sampling specs. pos, when
// given, are the sequences' cached lengths as the scheduler counts them;
// otherwise the store's are used. Execution checks pos against the store
// and fails loudly if they disagree.
func Prepare(prog Program, b *Batch, st Store, pos []int) (*Prepared, error) {
	pr := &Prepared{}
	if err := PrepareInto(pr, prog, b, st, pos); err != nil {
		return nil, err
	}
	return pr, nil
}

// PrepareInto is Prepare into pr, reusing its slices' storage (a backend
// that runs one batch at a time prepares every batch into one Prepared and
// allocates nothing in the steady state). pr is overwritten, also on error.
func PrepareInto(pr *Prepared, prog Program, b *Batch, st Store, pos []int) error {
	*pr = Prepared{Prog: prog, Store: st, Spans: pr.Spans[:0], Tokens: pr.Tokens[:0], Hidden: pr.Hidden[:0], Context: pr.Context[:0]}
	err := prepareInto(pr, prog, b, st, pos)
	if len(pr.Hidden) == 0 {
		pr.Hidden = nil // as Prepare leaves it
	}
	if pr.ContextWidth == 0 {
		pr.Context = nil
	}
	return err
}

func prepareInto(pr *Prepared, prog Program, b *Batch, st Store, pos []int) (err error) {
	p := prog.Plan()
	if b == nil || len(b.Seqs) == 0 {
		return fmt.Errorf("backend: empty batch")
	}
	if st == nil {
		return fmt.Errorf("backend: no cache store")
	}
	if pos != nil && len(pos) != len(b.Seqs) {
		return fmt.Errorf("backend: %d positions for %d sequences", len(pos), len(b.Seqs))
	}
	if in := p.Graph.Input(ir.InputHidden); in != nil {
		pr.HiddenWidth = in.Shape[1]
	}
	if in := p.Graph.Input(ir.InputContext); in != nil {
		pr.ContextWidth = in.Shape[1]
	}
	seen := map[int]bool{}
	for i, s := range b.Seqs {
		if len(s.Tokens) == 0 {
			return fmt.Errorf("backend: batch sequence %d (slot %d) has no tokens", i, s.Slot)
		}
		if seen[s.Slot] {
			return fmt.Errorf("backend: slot %d appears twice in the batch", s.Slot)
		}
		seen[s.Slot] = true
		cached, err := st.Len(s.Slot)
		if err != nil {
			return fmt.Errorf("backend: batch sequence %d: %w", i, err)
		}
		if pos != nil {
			cached = pos[i]
		}
		for j, t := range s.Tokens {
			if t < 0 || int(t) >= p.Vocab {
				return fmt.Errorf("backend: batch sequence %d token %d: id %d out of range [0, %d)", i, j, t, p.Vocab)
			}
		}
		c := 0
		switch W := pr.ContextWidth; {
		case W == 0 && len(s.Context) > 0:
			return fmt.Errorf("backend: batch sequence %d has context rows, but the program takes no %s input", i, ir.InputContext)
		case W > 0 && len(s.Context)%W != 0:
			return fmt.Errorf("backend: batch sequence %d: %d context values are not whole rows of %d", i, len(s.Context), W)
		case W > 0:
			c = len(s.Context) / W
		}
		if p.MaxPositions > 0 && cached+c+len(s.Tokens) > p.MaxPositions {
			return fmt.Errorf("backend: batch sequence %d: %d cached + %d new tokens exceed the context limit %d", i, cached, c+len(s.Tokens), p.MaxPositions)
		}
		rows := max(s.LogitRows, 1)
		switch {
		case s.LogitRows < 0 || s.LogitRows > len(s.Tokens):
			return fmt.Errorf("backend: batch sequence %d: %d logits rows for %d tokens", i, s.LogitRows, len(s.Tokens))
		case rows > 1 && p.Logits.Shape[0] != ir.DimR:
			return fmt.Errorf("backend: batch sequence %d asks %d logits rows, but the program does not select rows per sequence (span logits)", i, rows)
		}
		switch D := pr.HiddenWidth; {
		case D == 0 && len(s.Hidden) > 0:
			return fmt.Errorf("backend: batch sequence %d has hidden rows, but the program takes no %s input", i, ir.InputHidden)
		case D > 0 && len(s.Hidden) != len(s.Tokens)*D:
			return fmt.Errorf("backend: batch sequence %d: %d tokens need %d×%d hidden values, got %d", i, len(s.Tokens), len(s.Tokens), D, len(s.Hidden))
		}
		pr.Spans = append(pr.Spans, Span{Slot: s.Slot, Pos0: cached, N: len(s.Tokens), Row0: len(pr.Tokens), Rows: rows, C: c, CRow0: pr.TC})
		pr.Tokens = append(pr.Tokens, s.Tokens...)
		pr.Hidden = append(pr.Hidden, s.Hidden...)
		pr.Context = append(pr.Context, s.Context...)
		pr.TC += c
	}
	pr.T = len(pr.Tokens)
	if err := pr.SetSample(b.Sample, b.SamplesOnly); err != nil {
		return err
	}
	for i, s := range pr.Sample {
		if err := s.Params.Validate(); err != nil {
			return fmt.Errorf("backend: sampling spec %d: %w", i, err)
		}
		if !(s.U >= 0 && s.U < 1) {
			return fmt.Errorf("backend: sampling spec %d: draw %v is outside [0, 1)", i, s.U)
		}
		if s.TopLogprobs < 0 || s.TopLogprobs > MaxTopLogprobs {
			return fmt.Errorf("backend: sampling spec %d: top_logprobs %d outside [0, %d]", i, s.TopLogprobs, MaxTopLogprobs)
		}
		if err := s.CheckProcessing(p.Vocab); err != nil {
			return fmt.Errorf("backend: sampling spec %d: %w", i, err)
		}
	}
	return nil
}

// MaxTopLogprobs bounds the alternatives a sample reports.
const MaxTopLogprobs = 32

// CheckPositions verifies that every prepared position equals the store's
// length (the host-length hint is right).
func (pr *Prepared) CheckPositions() error {
	for i, s := range pr.Spans {
		n, err := pr.Store.Len(s.Slot)
		if err != nil {
			return fmt.Errorf("backend: batch sequence %d: %w", i, err)
		}
		if n != s.Pos0 {
			return fmt.Errorf("backend: host length hint for batch sequence %d (slot %d) is %d, the cache holds %d tokens", i, s.Slot, s.Pos0, n)
		}
	}
	return nil
}

// SampleHost picks every spec's token from host logits (the CPU backend's
// sampler, and the reference for device samplers).
func SampleHost(logits []float32, vocab int, specs []SampleSpec) []Sample {
	return SampleHostInto(nil, logits, vocab, specs)
}

// rowPool holds the row copies SampleHostInto processes.
var rowPool = sync.Pool{New: func() any { return new([]float32) }}

// SampleHostInto is SampleHost appending to out[:0] (reusing its storage).
func SampleHostInto(out []Sample, logits []float32, vocab int, specs []SampleSpec) []Sample {
	if cap(out) < len(specs) {
		out = make([]Sample, len(specs))
	}
	out = out[:len(specs)]
	var scratch *[]float32 // a processed row's copy, pooled
	for i, s := range specs {
		row := logits[i*vocab : (i+1)*vocab]
		if err := sample.CheckFinite(row); err != nil {
			out[i] = Sample{Err: err}
			continue
		}
		if s.Processed() { // on a copy: the result's logits stay raw
			if scratch == nil {
				scratch = rowPool.Get().(*[]float32)
				defer rowPool.Put(scratch)
			}
			row = append((*scratch)[:0], row...)
			*scratch = row
			sample.Apply(row, s.Edits, s.Allow)
		}
		tok := int32(sample.Pick(row, s.Params, s.U))
		lp, top := sample.Logprobs(row, tok, s.TopLogprobs)
		out[i] = Sample{Token: tok, Logprob: lp, Top: top}
	}
	return out
}
