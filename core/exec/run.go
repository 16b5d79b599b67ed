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
	bi, tokens, err := p.prepare(b, store)
	if err != nil {
		return nil, err
	}
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

func (p *Program) prepare(b *Batch, store *cache.Store) (*batchInfo, []int32, error) {
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
		if p.maxPos > 0 && seq.Len+len(s.Tokens) > p.maxPos {
			return nil, nil, fmt.Errorf("exec: batch sequence %d: %d cached + %d new tokens exceed the context limit %d", i, seq.Len, len(s.Tokens), p.maxPos)
		}
		bi.seqs = append(bi.seqs, seqRun{slot: s.Slot, seq: seq, pos0: seq.Len, n: len(s.Tokens), row0: len(tokens)})
		tokens = append(tokens, s.Tokens...)
	}
	bi.T = len(tokens)
	return bi, tokens, nil
}
