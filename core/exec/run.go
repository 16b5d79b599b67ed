package exec

import (
	"fmt"

	"github.com/glmflash/glmflash/core/build"
	"github.com/glmflash/glmflash/core/cache"
	"github.com/glmflash/glmflash/core/ir"
)

// seqRun is one sequence's place in a running batch.
type seqRun struct {
	slot int
	seq  *cache.Seq
	pos0 int // tokens already cached (position of the first new token)
	n    int // new tokens
	row0 int // first row in the batch's token dimension
}

// batchInfo is the host-side metadata value of a run (graph input "batch").
type batchInfo struct {
	seqs []seqRun
	T    int
}

// dsaMeta is what a dsa_meta node computes for one DSA geometry: the
// sequences' spans and, per token, the pools it can see.
type dsaMeta struct {
	seqs  []seqRun
	kpool int
	topk  int
	// visible[row] = complete pools visible to that token.
	visible []int
	// keyLen[i] = keys of sequence i after this batch; closed[i] = pools
	// this batch completes for sequence i (the write plan).
	keyLen, closed []int
}

// spans returns the batch's sequence spans from a lengths source: the host
// metadata directly, or the executor's lengths tensor (a "device read").
// Either way the lengths are checked against the token count, so a wrong
// hint fails loudly instead of corrupting state.
func (rc *runCtx) spans(v *ir.Value) ([]seqRun, error) {
	if v.DType == ir.Host {
		bi, ok := rc.host[v].(*batchInfo)
		if !ok {
			return nil, fmt.Errorf("lengths source %s is not batch metadata", v.Name)
		}
		total := 0
		for _, s := range bi.seqs {
			total += s.n
		}
		if total != rc.batch.T {
			return nil, fmt.Errorf("host lengths sum to %d but the batch has %d tokens", total, rc.batch.T)
		}
		return bi.seqs, nil
	}
	lens, ok := rc.i[v]
	if !ok {
		return nil, fmt.Errorf("lengths tensor %s was not computed", v.Name)
	}
	rc.p.deviceReads.Add(1)
	if len(lens) != len(rc.batch.seqs) {
		return nil, fmt.Errorf("device lengths have %d entries for %d sequences", len(lens), len(rc.batch.seqs))
	}
	out := make([]seqRun, len(lens))
	row := 0
	for i, n := range lens {
		s := rc.batch.seqs[i]
		if int(n) != s.n {
			return nil, fmt.Errorf("device length of sequence %d is %d, host says %d", i, n, s.n)
		}
		s.row0 = row
		out[i] = s
		row += int(n)
	}
	return out, nil
}

type runCtx struct {
	p     *Program
	batch *batchInfo
	f     map[*ir.Value][]float32
	i     map[*ir.Value][]int32
	host  map[*ir.Value]any
}

func (rc *runCtx) rows(v *ir.Value) int {
	switch v.Shape[0] {
	case ir.DimT:
		return rc.batch.T
	case ir.DimS:
		return len(rc.batch.seqs)
	}
	return v.Shape[0]
}

func (rc *runCtx) size(v *ir.Value) int {
	n := rc.rows(v)
	for _, d := range v.Shape[1:] {
		n *= d
	}
	return n
}

// in returns a float input (activation or constant).
func (rc *runCtx) in(v *ir.Value) []float32 {
	if c, ok := rc.p.consts[v]; ok {
		return c
	}
	return rc.f[v]
}

// out allocates a float output buffer.
func (rc *runCtx) out(v *ir.Value) []float32 {
	b := rc.p.alloc(rc.size(v))
	rc.f[v] = b
	return b
}

func (rc *runCtx) outI(v *ir.Value) []int32 {
	b := make([]int32, rc.size(v))
	rc.i[v] = b
	return b
}

// Run executes the program on a batch. It validates the batch first (token
// ids, slots, lengths) and returns an error without touching any state if
// the batch is invalid. On success every sequence's cache has advanced by
// its number of new tokens.
func (p *Program) Run(b *Batch, store *cache.Store) (*Result, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	bi, tokens, err := p.prepare(b, store, nil)
	if err != nil {
		return nil, err
	}
	return p.execute(bi, tokens)
}

// Prepared is a batch whose host-side work (validation, batch metadata) is
// done, ready for Execute. Its positions come from the scheduler, so it can
// be prepared while another batch of the same sequences is executing.
type Prepared struct {
	p      *Program
	bi     *batchInfo
	tokens []int32
}

// HostLengths reports whether the program reads only host-side lengths
// (no seq_lengths node: the host-length-reuse pass fired everywhere), the
// condition for preparing a batch ahead of execution.
func (p *Program) HostLengths() bool { return p.hostLengths }

// Prepare does the host-side work of a batch with the scheduler's positions
// (pos[i] = tokens already cached for sequence i), without reading the
// cache's lengths: it may run while another batch executes. It is refused
// for programs that read executor-produced lengths. Execute checks the
// positions against the cache and fails loudly if they disagree.
func (p *Program) Prepare(b *Batch, store *cache.Store, pos []int) (*Prepared, error) {
	if !p.HostLengths() {
		return nil, fmt.Errorf("exec: Prepare needs host lengths (enable host-length-reuse); this program reads executor lengths")
	}
	if b == nil || len(pos) != len(b.Seqs) {
		return nil, fmt.Errorf("exec: Prepare needs one position per sequence")
	}
	bi, tokens, err := p.prepare(b, store, pos)
	if err != nil {
		return nil, err
	}
	return &Prepared{p: p, bi: bi, tokens: tokens}, nil
}

// SetTokens replaces sequence i's tokens (same count): decode tokens are
// known only after the previous step, after the batch was prepared.
func (pr *Prepared) SetTokens(i int, toks []int32) error {
	if i < 0 || i >= len(pr.bi.seqs) {
		return fmt.Errorf("exec: no sequence %d in the prepared batch", i)
	}
	s := pr.bi.seqs[i]
	if len(toks) != s.n {
		return fmt.Errorf("exec: sequence %d was prepared with %d tokens, got %d", i, s.n, len(toks))
	}
	for j, t := range toks {
		if t < 0 || int(t) >= pr.p.vocab {
			return fmt.Errorf("exec: sequence %d token %d: id %d out of range [0, %d)", i, j, t, pr.p.vocab)
		}
	}
	copy(pr.tokens[s.row0:s.row0+s.n], toks)
	return nil
}

// Execute runs a prepared batch after checking that every sequence's cache
// length equals the position it was prepared with.
func (p *Program) Execute(pr *Prepared) (*Result, error) {
	if pr == nil || pr.p != p {
		return nil, fmt.Errorf("exec: batch was prepared for another program")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, s := range pr.bi.seqs {
		if s.seq.Len != s.pos0 {
			return nil, fmt.Errorf("exec: host length hint for batch sequence %d (slot %d) is %d, the cache holds %d tokens", i, s.slot, s.pos0, s.seq.Len)
		}
	}
	return p.execute(pr.bi, pr.tokens)
}

func (p *Program) execute(bi *batchInfo, tokens []int32) (*Result, error) {
	rc := &runCtx{p: p, batch: bi, f: map[*ir.Value][]float32{}, i: map[*ir.Value][]int32{}, host: map[*ir.Value]any{}}
	for _, in := range p.g.Inputs {
		switch in.Name {
		case build.InputTokens:
			rc.i[in] = tokens
		case build.InputBatch:
			rc.host[in] = bi
		default:
			return nil, fmt.Errorf("exec: graph input %q is not provided by the executor", in.Name)
		}
	}
	for si, st := range p.steps {
		if err := st.run(rc); err != nil {
			return nil, fmt.Errorf("exec: %s (layer %d): %w", st.node.Op, st.node.Layer, err)
		}
		for _, in := range st.node.Inputs {
			if p.lastUse[in] == si {
				if buf, ok := rc.f[in]; ok {
					p.release(buf)
					delete(rc.f, in)
				}
			}
		}
		for _, o := range st.node.Outputs {
			if _, used := p.lastUse[o]; !used {
				if buf, ok := rc.f[o]; ok {
					p.release(buf)
					delete(rc.f, o)
				}
			}
		}
	}
	for _, s := range bi.seqs {
		s.seq.Len += s.n
	}
	lv := p.g.Outputs[build.OutputLogit]
	res := &Result{Vocab: p.vocab, Rows: rc.rows(lv)}
	res.Logits = append([]float32(nil), rc.f[lv]...)
	for v, name := range p.hiddenOf {
		if res.Hidden == nil {
			res.Hidden = map[string][]float32{}
		}
		res.Hidden[name] = append([]float32(nil), rc.f[v]...)
	}
	for _, buf := range rc.f {
		p.release(buf)
	}
	return res, nil
}

// prepare validates a batch and builds its metadata; pos, when given, are
// the sequences' cached lengths (else read from the cache).
func (p *Program) prepare(b *Batch, store *cache.Store, pos []int) (*batchInfo, []int32, error) {
	if b == nil || len(b.Seqs) == 0 {
		return nil, nil, fmt.Errorf("exec: empty batch")
	}
	if store == nil {
		return nil, nil, fmt.Errorf("exec: no cache store")
	}
	bi := &batchInfo{}
	var tokens []int32
	seen := map[int]bool{}
	for i, s := range b.Seqs {
		if len(s.Tokens) == 0 {
			return nil, nil, fmt.Errorf("exec: batch sequence %d (slot %d) has no tokens", i, s.Slot)
		}
		if seen[s.Slot] {
			return nil, nil, fmt.Errorf("exec: slot %d appears twice in the batch", s.Slot)
		}
		seen[s.Slot] = true
		seq, err := store.Seq(s.Slot)
		if err != nil {
			return nil, nil, fmt.Errorf("exec: batch sequence %d: %w", i, err)
		}
		for j, t := range s.Tokens {
			if t < 0 || int(t) >= p.vocab {
				return nil, nil, fmt.Errorf("exec: batch sequence %d token %d: id %d out of range [0, %d)", i, j, t, p.vocab)
			}
		}
		cached := 0
		if pos != nil {
			cached = pos[i]
		} else {
			cached = seq.Len
		}
		if p.maxPos > 0 && cached+len(s.Tokens) > p.maxPos {
			return nil, nil, fmt.Errorf("exec: batch sequence %d: %d cached + %d new tokens exceed the context limit %d", i, cached, len(s.Tokens), p.maxPos)
		}
		bi.seqs = append(bi.seqs, seqRun{slot: s.Slot, seq: seq, pos0: cached, n: len(s.Tokens), row0: len(tokens)})
		tokens = append(tokens, s.Tokens...)
	}
	bi.T = len(tokens)
	return bi, tokens, nil
}
