package cpu

import (
	"fmt"
	"math"
	"sync"

	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/kernels/act"
	"github.com/glmflash/glmflash/kernels/conv"
	"github.com/glmflash/glmflash/kernels/kda"
	"github.com/glmflash/glmflash/kernels/norm"
	"github.com/glmflash/glmflash/kernels/parallel"
)

// KDA ops: short conv, forget gate, delta-rule attention, gated norm.
func init() {
	bind(ir.OpKDAConv, bindKDAConv)
	bind(ir.OpKDAGate, bindKDAGate)
	bind(ir.OpKDAAttn, bindKDAAttn)
	bind(ir.OpGatedRMSNorm, bindGatedRMSNorm)
}

func bindKDAConv(p *Program, n *ir.Node) (func(rc *runCtx) error, error) {
	in, outs := n.Inputs, n.Outputs
	W := p.constant(in[4])
	P := in[1].Shape[1]
	K := in[4].Shape[2]
	layer := n.Layer
	cr := &convRun{W: W, P: P, K: K, layer: layer}
	cr.fn = cr.seq // made once: a run allocates no closure
	return func(rc *runCtx) error {
		q, k, v := rc.in(in[1]), rc.in(in[2]), rc.in(in[3])
		seqs, err := rc.spans(in[0])
		if err != nil {
			return err
		}
		if err := haveKDA(seqs, layer); err != nil {
			return err
		}
		oq, ok, ov := rc.out(outs[0]), rc.out(outs[1]), rc.out(outs[2])
		rc.p.convScr = growScratch(rc.p.convScr, len(seqs))
		cr.q, cr.k, cr.v, cr.oq, cr.ok, cr.ov, cr.seqs, cr.scr = q, k, v, oq, ok, ov, seqs, rc.p.convScr
		parallel.Each(len(seqs), cr.fn)
		cr.q, cr.k, cr.v, cr.oq, cr.ok, cr.ov, cr.seqs, cr.scr = nil, nil, nil, nil, nil, nil, nil, nil
		return nil
	}, nil
}

// convRun is one kda_conv node's run: its constants, the current run's
// operands and the per-sequence body (one method value made at bind time).
type convRun struct {
	W                   []float32
	P, K, layer         int
	q, k, v, oq, ok, ov []float32
	seqs                []seqRun
	scr                 [][]float32
	fn                  func(si int)
}

// seq runs sequence si.
func (cr *convRun) seq(si int) {
	W, P, K, layer, seqs, scr := cr.W, cr.P, cr.K, cr.layer, cr.seqs, cr.scr
	q, k, v, oq, ok, ov := cr.q, cr.k, cr.v, cr.oq, cr.ok, cr.ov
	s := seqs[si]
	C := 3 * P
	if s.seq.Rollback == nil {
		// q, k and v in place: each is the span's rows [n][P], its weights
		// and window are channels [i·P, (i+1)·P) of W ([C][K]) and the
		// state ([C][K−1]); every channel is computed as in the gathered
		// [n][C] form, so the results are the same bits
		st, S := s.seq.Conv[layer], K-1
		lo, hi := s.row0*P, (s.row0+s.n)*P
		for i, pr := range [3][2][]float32{{oq, q}, {ok, k}, {ov, v}} {
			dst, src := pr[0][lo:hi], pr[1][lo:hi]
			w, win := W[i*P*K:(i+1)*P*K], st[i*P*S:(i+1)*P*S]
			if len(seqs) == 1 { // the only region: split channels across cores
				conv.CausalSiLU(dst, src, s.n, P, w, K, win)
			} else {
				conv.CausalSiLUSerial(dst, src, s.n, P, w, K, win)
			}
		}
		return
	}
	buf := takeScratch(&scr[si], 2*s.n*C)
	u, y := buf[:s.n*C], buf[s.n*C:]
	for j := 0; j < s.n; j++ {
		r := s.row0 + j
		copy(u[j*C:j*C+P], q[r*P:(r+1)*P])
		copy(u[j*C+P:j*C+2*P], k[r*P:(r+1)*P])
		copy(u[j*C+2*P:j*C+3*P], v[r*P:(r+1)*P])
	}
	var prev []float32
	rb := s.seq.Rollback
	if rb != nil {
		prev = append([]float32(nil), s.seq.Conv[layer]...)
	}
	if len(seqs) == 1 { // the only region: split channels across cores
		conv.CausalSiLU(y, u, s.n, C, W, K, s.seq.Conv[layer])
	} else {
		conv.CausalSiLUSerial(y, u, s.n, C, W, K, s.seq.Conv[layer])
	}
	if rb != nil { // the window after every position, for a rollback
		S := K - 1
		win := make([]float32, C*S)
		for j := 0; j < s.n; j++ {
			for c := 0; c < C; c++ {
				for x := 0; x < S; x++ {
					// position j−S+1+x of the span: from u, or the window before it
					if t := j - S + 1 + x; t >= 0 {
						win[c*S+x] = u[t*C+c]
					} else {
						win[c*S+x] = prev[c*S+S+t]
					}
				}
			}
			rb.RecordKDAConv(layer, s.pos0+j, win)
		}
	}
	for j := 0; j < s.n; j++ {
		r := s.row0 + j
		copy(oq[r*P:(r+1)*P], y[j*C:j*C+P])
		copy(ok[r*P:(r+1)*P], y[j*C+P:j*C+2*P])
		copy(ov[r*P:(r+1)*P], y[j*C+2*P:j*C+3*P])
	}
}

func bindKDAGate(p *Program, n *ir.Node) (func(rc *runCtx) error, error) {
	in, outs := n.Inputs, n.Outputs
	A, dt := p.constant(in[1]), p.constant(in[2])
	H := ir.AttrHeads.Get(n)
	P := in[0].Shape[1]
	var lb *float64
	if v, ok := ir.AttrLowerBound.Lookup(n); ok {
		lb = &v
	}
	return func(rc *runCtx) error {
		act.KDAGate(rc.out(outs[0]), rc.in(in[0]), rc.batch.T, H, P/H, A, dt, lb)
		return nil
	}, nil
}

func bindKDAAttn(p *Program, n *ir.Node) (func(rc *runCtx) error, error) {
	in, outs := n.Inputs, n.Outputs
	H, Dh := ir.AttrHeads.Get(n), ir.AttrHeadDim.Get(n)
	P := H * Dh
	algo := ir.AttrAlgo.Get(n)
	layer := n.Layer
	qscale := float32(1 / math.Sqrt(float64(Dh)))
	ar := &attnRun{H: H, Dh: Dh, P: P, algo: algo, layer: layer, qscale: qscale}
	ar.fn = ar.task // made once: a run allocates no closure
	return func(rc *runCtx) error {
		q, k, v, g, beta := rc.in(in[1]), rc.in(in[2]), rc.in(in[3]), rc.in(in[4]), rc.in(in[5])
		seqs, err := rc.spans(in[0])
		if err != nil {
			return err
		}
		if err := haveKDA(seqs, layer); err != nil {
			return err
		}
		o := rc.out(outs[0])
		ar.q, ar.k, ar.v, ar.g, ar.beta, ar.o, ar.seqs, ar.scr = q, k, v, g, beta, o, seqs, &rc.p.kdaTasks
		parallel.Each(len(seqs)*H, ar.fn)
		ar.q, ar.k, ar.v, ar.g, ar.beta, ar.o, ar.seqs, ar.scr = nil, nil, nil, nil, nil, nil, nil, nil
		return nil
	}, nil
}

// attnRun is one kda_attn node's run: its constants, the current run's
// operands and the (sequence, head) body (one method value made at bind
// time).
type attnRun struct {
	H, Dh, P, layer     int
	algo                string
	qscale              float32
	q, k, v, g, beta, o []float32
	seqs                []seqRun
	scr                 *kdaScratch
	fn                  func(task int)
}

// task runs (sequence, head) task.
func (ar *attnRun) task(task int) {
	H, Dh, P, layer, algo, qscale, seqs, scr := ar.H, ar.Dh, ar.P, ar.layer, ar.algo, ar.qscale, ar.seqs, ar.scr
	q, k, v, g, beta, o := ar.q, ar.k, ar.v, ar.g, ar.beta, ar.o
	s, h := seqs[task/H], task%H
	T := s.n
	sc := scr.get()
	defer scr.put(sc)
	buf := takeScratch(&sc.buf, 5*T*Dh+T)
	gather := func(src []float32) []float32 {
		dst := buf[: T*Dh : T*Dh]
		buf = buf[T*Dh:]
		for j := 0; j < T; j++ {
			r := s.row0 + j
			copy(dst[j*Dh:(j+1)*Dh], src[r*P+h*Dh:r*P+(h+1)*Dh])
		}
		return dst
	}
	qh, kh, vh, gh := gather(q), gather(k), gather(v), gather(g)
	oh, bh := buf[:T*Dh], buf[T*Dh:T*Dh+T]
	for j := 0; j < T; j++ {
		bh[j] = beta[(s.row0+j)*H+h]
	}
	kda.L2Normalize(qh, T, Dh, 1e-6, qscale)
	kda.L2Normalize(kh, T, Dh, 1e-6, 1)
	S := s.seq.State[layer][h*Dh*Dh : (h+1)*Dh*Dh]
	if rb := s.seq.Rollback; rb != nil {
		// a checkpointed span (a verify span): token by token, keeping
		// the state after every position so that Truncate can restore it
		n := len(s.seq.State[layer])
		for j := 0; j < T; j++ {
			sc.ws.Recurrent(oh[j*Dh:(j+1)*Dh], qh[j*Dh:(j+1)*Dh], kh[j*Dh:(j+1)*Dh], vh[j*Dh:(j+1)*Dh], gh[j*Dh:(j+1)*Dh], bh[j:j+1], 1, Dh, Dh, S)
			rb.RecordKDAState(layer, s.pos0+j, h*Dh*Dh, S, n)
		}
	} else if algo == ir.KDARecurrent || (algo == ir.KDAAuto && T == 1) {
		sc.ws.Recurrent(oh, qh, kh, vh, gh, bh, T, Dh, Dh, S)
	} else {
		sc.ws.Chunked(oh, qh, kh, vh, gh, bh, T, Dh, Dh, S)
	}
	for j := 0; j < T; j++ {
		r := s.row0 + j
		copy(o[r*P+h*Dh:r*P+(h+1)*Dh], oh[j*Dh:(j+1)*Dh])
	}
}

func bindGatedRMSNorm(p *Program, n *ir.Node) (func(rc *runCtx) error, error) {
	in, outs := n.Inputs, n.Outputs
	W := p.constant(in[2])
	H := ir.AttrHeads.Get(n)
	P := in[0].Shape[1]
	eps := float32(ir.AttrEps.Get(n))
	var dst, o, gate []float32 // the run's buffers (see bindMHCPre)
	body := func(lo, hi int) {
		norm.GatedRMSNorm(dst[lo*P:hi*P], o[lo*P:hi*P], gate[lo*P:hi*P], hi-lo, H, P/H, W, eps)
	}
	return func(rc *runCtx) error {
		dst, o, gate = rc.out(outs[0]), rc.in(in[0]), rc.in(in[1])
		parallel.For(rc.batch.T, 16, body)
		return nil
	}, nil
}

// haveKDA checks that every sequence's cache holds layer's KDA state.
func haveKDA(seqs []seqRun, layer int) error {
	for _, s := range seqs {
		if _, _, err := s.seq.KDA(layer); err != nil {
			return fmt.Errorf("slot %d: %w", s.slot, err)
		}
	}
	return nil
}

// kdaTask is the scratch of one (sequence, head) task of kda_attn: the
// gathered q, k, v, g, β and output rows, and the kernel's workspace.
type kdaTask struct {
	buf []float32
	ws  kda.Workspace
}

// kdaScratch is a program's kdaTasks: a task takes one and gives it back
// when done, so there are as many as tasks ever ran at once (the workers),
// not one per (sequence, head) — a prefill of one sequence has a task per
// head, each with [T] rows of scratch.
type kdaScratch struct {
	mu   sync.Mutex
	free []*kdaTask
}

func (s *kdaScratch) get() *kdaTask {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := len(s.free); n > 0 {
		t := s.free[n-1]
		s.free = s.free[:n-1]
		return t
	}
	return new(kdaTask)
}

func (s *kdaScratch) put(t *kdaTask) {
	s.mu.Lock()
	s.free = append(s.free, t)
	s.mu.Unlock()
}

// growScratch returns s with at least n per-task buffers.
func growScratch(s [][]float32, n int) [][]float32 {
	if len(s) < n {
		s = append(s, make([][]float32, n-len(s))...)
	}
	return s
}

// takeScratch returns n floats of *b, growing it when it is shorter
// (contents undefined).
func takeScratch(b *[]float32, n int) []float32 {
	if cap(*b) < n {
		*b = make([]float32, n)
	}
	return (*b)[:n]
}
