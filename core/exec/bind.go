package exec

import (
	"fmt"
	"math"

	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/kernels/act"
	"github.com/glmflash/glmflash/kernels/conv"
	"github.com/glmflash/glmflash/kernels/gemm"
	"github.com/glmflash/glmflash/kernels/indexer"
	"github.com/glmflash/glmflash/kernels/kda"
	"github.com/glmflash/glmflash/kernels/mhc"
	"github.com/glmflash/glmflash/kernels/mla"
	"github.com/glmflash/glmflash/kernels/moe"
	"github.com/glmflash/glmflash/kernels/norm"
	"github.com/glmflash/glmflash/kernels/parallel"
)

// bind returns the kernel closure for one node.
func (p *Program) bind(n *ir.Node) (func(rc *runCtx) error, error) {
	in, outs, a := n.Inputs, n.Outputs, n.Attrs
	switch n.Op {
	case "embed":
		W := p.consts[in[1]]
		H, D := outs[0].Shape[1], outs[0].Shape[2]
		return func(rc *runCtx) error {
			ids := rc.i[in[0]]
			x := rc.out(outs[0])
			for t, id := range ids {
				row := W[int(id)*D : int(id)*D+D]
				for s := 0; s < H; s++ {
					copy(x[(t*H+s)*D:(t*H+s+1)*D], row)
				}
			}
			return nil
		}, nil

	case "mhc_pre":
		H, D := in[0].Shape[1], in[0].Shape[2]
		prm := &mhc.Params{H: H, D: D, Fn: p.consts[in[1]], Base: p.consts[in[2]], Scale: p.consts[in[3]],
			NormEps: float32(a.Float("eps", 1e-5)), HCEps: float32(a.Float("hc_eps", 1e-6)), Iterations: a.Int("iters", 20)}
		if prm.Fn == nil || prm.Base == nil || prm.Scale == nil {
			return nil, fmt.Errorf("mHC parameters must be weights")
		}
		return func(rc *runCtx) error {
			X := rc.in(in[0])
			T := rc.batch.T
			h, post, comb := rc.out(outs[0]), rc.out(outs[1]), rc.out(outs[2])
			parallel.For(T, 8, func(lo, hi int) {
				mhc.Pre(prm, h[lo*D:hi*D], post[lo*H:hi*H], comb[lo*H*H:hi*H*H], X[lo*H*D:hi*H*D], hi-lo)
			})
			return nil
		}, nil

	case "mhc_post":
		H, D := in[1].Shape[1], in[1].Shape[2]
		return func(rc *runCtx) error {
			o, R, post, comb := rc.in(in[0]), rc.in(in[1]), rc.in(in[2]), rc.in(in[3])
			x := rc.out(outs[0])
			T := rc.batch.T
			parallel.For(T, 16, func(lo, hi int) {
				mhc.Post(x[lo*H*D:hi*H*D], o[lo*D:hi*D], R[lo*H*D:hi*H*D], post[lo*H:hi*H], comb[lo*H*H:hi*H*H], hi-lo, H, D)
			})
			return nil
		}, nil

	case "rmsnorm":
		W := p.consts[in[1]]
		D := in[0].Shape[1]
		eps := float32(a.Float("eps", 1e-5))
		return func(rc *runCtx) error {
			x := rc.in(in[0])
			y := rc.out(outs[0])
			norm.RMSNorm(y, x, rc.rows(in[0]), D, W, eps)
			return nil
		}, nil

	case "layernorm":
		W, B := p.consts[in[1]], p.consts[in[2]]
		D := in[0].Shape[1]
		eps := float32(a.Float("eps", 1e-6))
		return func(rc *runCtx) error {
			y := rc.out(outs[0])
			norm.LayerNorm(y, rc.in(in[0]), rc.rows(in[0]), D, W, B, eps)
			return nil
		}, nil

	case "linear":
		W := p.consts[in[1]]
		if W == nil {
			return nil, fmt.Errorf("linear weight %s is not a constant", in[1].Name)
		}
		K, N := in[0].Shape[1], outs[0].Shape[1]
		prm := p.gemmParams(n)
		if Wb := p.bf16(in[1]); Wb != nil {
			return func(rc *runCtx) error {
				y := rc.out(outs[0])
				R := rc.rows(in[0])
				gemm.MatMulTBF16With(prm(R), y, rc.in(in[0]), R, K, Wb, N)
				return nil
			}, nil
		}
		return func(rc *runCtx) error {
			y := rc.out(outs[0])
			R := rc.rows(in[0])
			gemm.MatMulTWith(prm(R), y, rc.in(in[0]), R, K, W, N)
			return nil
		}, nil

	case "linear_split":
		W := p.consts[in[1]]
		K, N := in[0].Shape[1], in[1].Shape[0]
		prm := p.gemmParams(n)
		splits := a.Ints("splits")
		Wb := p.bf16(in[1]) // the fused weight of bf16-exact parts is bf16-exact
		return func(rc *runCtx) error {
			R := rc.rows(in[0])
			tmp := rc.p.alloc(R * N)
			if Wb != nil {
				gemm.MatMulTBF16With(prm(R), tmp, rc.in(in[0]), R, K, Wb, N)
			} else {
				gemm.MatMulTWith(prm(R), tmp, rc.in(in[0]), R, K, W, N)
			}
			off := 0
			for i, s := range splits {
				y := rc.out(outs[i])
				for r := 0; r < R; r++ {
					copy(y[r*s:(r+1)*s], tmp[r*N+off:r*N+off+s])
				}
				off += s
			}
			rc.p.release(tmp)
			return nil
		}, nil

	case "sigmoid":
		return func(rc *runCtx) error {
			act.SigmoidInPlace(rc.out(outs[0]), rc.in(in[0]))
			return nil
		}, nil

	case "add":
		return func(rc *runCtx) error {
			x, y := rc.in(in[0]), rc.in(in[1])
			o := rc.out(outs[0])
			for i := range o {
				o[i] = x[i] + y[i]
			}
			return nil
		}, nil

	case "swiglu":
		limit := float32(a.Float("limit", 0))
		return func(rc *runCtx) error {
			act.SwiGLU(rc.out(outs[0]), rc.in(in[0]), rc.in(in[1]), limit)
			return nil
		}, nil

	case "kda_conv":
		return p.bindKDAConv(n)
	case "kda_gate":
		A, dt := p.consts[in[1]], p.consts[in[2]]
		H := a.Int("heads", 0)
		P := in[0].Shape[1]
		var lb *float64
		if a.Has("lower_bound") {
			v := a.Float("lower_bound", 0)
			lb = &v
		}
		return func(rc *runCtx) error {
			act.KDAGate(rc.out(outs[0]), rc.in(in[0]), rc.batch.T, H, P/H, A, dt, lb)
			return nil
		}, nil
	case "kda_attn":
		return p.bindKDAAttn(n)
	case "gated_rmsnorm":
		W := p.consts[in[2]]
		H := a.Int("heads", 0)
		P := in[0].Shape[1]
		eps := float32(a.Float("eps", 1e-5))
		return func(rc *runCtx) error {
			norm.GatedRMSNorm(rc.out(outs[0]), rc.in(in[0]), rc.in(in[1]), rc.batch.T, H, P/H, W, eps)
			return nil
		}, nil

	case "seq_lengths":
		return func(rc *runCtx) error {
			l := rc.outI(outs[0])
			for i, s := range rc.batch.seqs {
				l[i] = int32(s.n)
				if rc.p.opts.PoisonDeviceLengths {
					l[i] = int32(s.n + 1 + i)
				}
			}
			return nil
		}, nil

	case "dsa_meta":
		kp, topk := a.Int("kpool", 0), a.Int("topk", 0)
		return func(rc *runCtx) error {
			seqs, err := rc.spans(in[0])
			if err != nil {
				return err
			}
			m := &dsaMeta{seqs: seqs, kpool: kp, topk: topk, visible: make([]int, rc.batch.T)}
			for _, s := range seqs {
				for j := 0; j < s.n; j++ {
					m.visible[s.row0+j] = (s.pos0 + j + 1) / kp
				}
				m.keyLen = append(m.keyLen, s.pos0+s.n)
				m.closed = append(m.closed, (s.pos0+s.n)/kp-s.pos0/kp)
			}
			rc.host[outs[0]] = m
			return nil
		}, nil

	case "linear_batched":
		W := p.consts[in[1]]
		if W == nil {
			return nil, fmt.Errorf("linear_batched weight %s is not a constant", in[1].Name)
		}
		G, N, K := in[1].Shape[0], in[1].Shape[1], in[1].Shape[2]
		Wb := p.bf16(in[1])
		return func(rc *runCtx) error {
			R := rc.rows(in[0])
			x := rc.in(in[0])
			ys := make([][]float32, G)
			for g := range ys {
				ys[g] = rc.out(outs[g])
			}
			if Wb != nil {
				gemm.BatchedMatMulTBF16(ys, x, R, K, Wb, N)
			} else {
				gemm.BatchedMatMulT(ys, x, R, K, W, N)
			}
			return nil
		}, nil

	case "mhc_post_pre":
		return p.bindMHCPostPre(n)

	case "dsa_topk":
		return p.bindDSATopK(n)
	case "mla_attn":
		return p.bindMLA(n)

	case "moe_route":
		r := &moe.Router{Experts: in[0].Shape[1], TopK: a.Int("topk", 0), Groups: a.Int("groups", 1), TopKGroup: a.Int("topk_group", 1),
			Normalize: a.Bool("normalize"), Scaling: float32(a.Float("scaling", 1)), Bias: p.consts[in[1]]}
		return func(rc *runCtx) error {
			T := rc.rows(in[0])
			idx, w := rc.outI(outs[0]), rc.out(outs[1])
			r.Route(idx, w, rc.in(in[0]), T)
			return nil
		}, nil

	case "moe_experts":
		g, u, d := p.consts[in[3]], p.consts[in[4]], p.consts[in[5]]
		E, I, D := in[3].Shape[0], in[3].Shape[1], in[3].Shape[2]
		ex := &moe.Experts{N: E, D: D, I: I, Limit: float32(a.Float("limit", 0))}
		gb, ub, db := p.bf16(in[3]), p.bf16(in[4]), p.bf16(in[5])
		for e := 0; e < E; e++ {
			if gb != nil && ub != nil && db != nil {
				ex.GateB = append(ex.GateB, gb[e*I*D:(e+1)*I*D])
				ex.UpB = append(ex.UpB, ub[e*I*D:(e+1)*I*D])
				ex.DownB = append(ex.DownB, db[e*D*I:(e+1)*D*I])
				continue
			}
			ex.Gate = append(ex.Gate, g[e*I*D:(e+1)*I*D])
			ex.Up = append(ex.Up, u[e*I*D:(e+1)*I*D])
			ex.Down = append(ex.Down, d[e*D*I:(e+1)*D*I])
		}
		K := in[1].Shape[1]
		return func(rc *runCtx) error {
			T := rc.rows(in[0])
			ex.Forward(rc.out(outs[0]), rc.in(in[0]), rc.i[in[1]], rc.in(in[2]), T, K)
			return nil
		}, nil

	case "moe_append_expert":
		return p.bindMoEAppendExpert(n)

	case "stream_mean":
		H, D := in[0].Shape[1], in[0].Shape[2]
		return func(rc *runCtx) error {
			X := rc.in(in[0])
			y := rc.out(outs[0])
			inv := 1 / float32(H)
			for t := 0; t < rc.batch.T; t++ {
				yr := y[t*D : t*D+D]
				for d := range yr {
					var s float32
					for h := 0; h < H; h++ {
						s += X[(t*H+h)*D+d]
					}
					yr[d] = s * inv
				}
			}
			return nil
		}, nil

	case "last_rows":
		D := in[1].Shape[1]
		return func(rc *runCtx) error {
			x := rc.in(in[1])
			y := rc.out(outs[0])
			for i, s := range rc.batch.seqs {
				r := s.row0 + s.n - 1
				copy(y[i*D:(i+1)*D], x[r*D:(r+1)*D])
			}
			return nil
		}, nil
	}
	return nil, fmt.Errorf("no kernel bound to op %q", n.Op)
}

// gemmParams returns how to pick a GEMM node's kernel parameters for a
// batch of R rows: an explicit override, tuned per-bucket attributes (the
// smallest bucket ≥ R, else the largest), or the defaults.
func (p *Program) gemmParams(n *ir.Node) func(R int) gemm.Params {
	if prm, ok := p.opts.GEMM[n.Outputs[0].Name]; ok {
		return func(int) gemm.Params { return prm }
	}
	bs, cg, rb := n.Attrs.Ints("tune_buckets"), n.Attrs.Ints("tune_col_grain"), n.Attrs.Ints("tune_row_block")
	if len(bs) == 0 || len(cg) != len(bs) || len(rb) != len(bs) {
		return func(int) gemm.Params { return gemm.Default() }
	}
	return func(R int) gemm.Params {
		i := len(bs) - 1
		for j, b := range bs {
			if R <= b {
				i = j
				break
			}
		}
		return gemm.Params{ColGrain: cg[i], RowBlock: rb[i]}
	}
}

func (p *Program) bindKDAConv(n *ir.Node) (func(rc *runCtx) error, error) {
	in, outs := n.Inputs, n.Outputs
	W := p.consts[in[4]]
	P := in[1].Shape[1]
	K := in[4].Shape[2]
	layer := n.Layer
	return func(rc *runCtx) error {
		q, k, v := rc.in(in[1]), rc.in(in[2]), rc.in(in[3])
		seqs, err := rc.spans(in[0])
		if err != nil {
			return err
		}
		oq, ok, ov := rc.out(outs[0]), rc.out(outs[1]), rc.out(outs[2])
		parallel.Each(len(seqs), func(si int) {
			s := seqs[si]
			C := 3 * P
			u := make([]float32, s.n*C)
			for j := 0; j < s.n; j++ {
				r := s.row0 + j
				copy(u[j*C:j*C+P], q[r*P:(r+1)*P])
				copy(u[j*C+P:j*C+2*P], k[r*P:(r+1)*P])
				copy(u[j*C+2*P:j*C+3*P], v[r*P:(r+1)*P])
			}
			y := make([]float32, s.n*C)
			conv.CausalSiLU(y, u, s.n, C, W, K, s.seq.Conv[layer])
			for j := 0; j < s.n; j++ {
				r := s.row0 + j
				copy(oq[r*P:(r+1)*P], y[j*C:j*C+P])
				copy(ok[r*P:(r+1)*P], y[j*C+P:j*C+2*P])
				copy(ov[r*P:(r+1)*P], y[j*C+2*P:j*C+3*P])
			}
		})
		return nil
	}, nil
}

func (p *Program) bindKDAAttn(n *ir.Node) (func(rc *runCtx) error, error) {
	in, outs, a := n.Inputs, n.Outputs, n.Attrs
	H, Dh := a.Int("heads", 0), a.Int("head_dim", 0)
	P := H * Dh
	algo := a.String("algo", "auto")
	layer := n.Layer
	qscale := float32(1 / math.Sqrt(float64(Dh)))
	return func(rc *runCtx) error {
		q, k, v, g, beta := rc.in(in[1]), rc.in(in[2]), rc.in(in[3]), rc.in(in[4]), rc.in(in[5])
		seqs, err := rc.spans(in[0])
		if err != nil {
			return err
		}
		o := rc.out(outs[0])
		parallel.Each(len(seqs)*H, func(task int) {
			s, h := seqs[task/H], task%H
			T := s.n
			gather := func(src []float32) []float32 {
				dst := make([]float32, T*Dh)
				for j := 0; j < T; j++ {
					r := s.row0 + j
					copy(dst[j*Dh:(j+1)*Dh], src[r*P+h*Dh:r*P+(h+1)*Dh])
				}
				return dst
			}
			qh, kh, vh, gh := gather(q), gather(k), gather(v), gather(g)
			bh := make([]float32, T)
			for j := 0; j < T; j++ {
				bh[j] = beta[(s.row0+j)*H+h]
			}
			kda.L2Normalize(qh, T, Dh, 1e-6, qscale)
			kda.L2Normalize(kh, T, Dh, 1e-6, 1)
			S := s.seq.State[layer][h*Dh*Dh : (h+1)*Dh*Dh]
			oh := make([]float32, T*Dh)
			if algo == "recurrent" || (algo == "auto" && T == 1) {
				kda.Recurrent(oh, qh, kh, vh, gh, bh, T, Dh, Dh, S)
			} else {
				kda.Chunked(oh, qh, kh, vh, gh, bh, T, Dh, Dh, S)
			}
			for j := 0; j < T; j++ {
				r := s.row0 + j
				copy(o[r*P+h*Dh:r*P+(h+1)*Dh], oh[j*Dh:(j+1)*Dh])
			}
		})
		return nil
	}, nil
}

func (p *Program) bindDSATopK(n *ir.Node) (func(rc *runCtx) error, error) {
	in, outs, a := n.Inputs, n.Outputs, n.Attrs
	cfg := &indexer.Config{Heads: a.Int("heads", 0), Dim: a.Int("dim", 0), KPool: a.Int("kpool", 0), TopK: a.Int("topk", 0), SelectTail: a.Bool("tail"), APE: p.consts[in[5]]}
	if cfg.APE == nil {
		return nil, fmt.Errorf("compress ape must be a weight")
	}
	layer := n.Layer
	Hi, Di := cfg.Heads, cfg.Dim
	W := cfg.Width()
	wscale := float32(1 / math.Sqrt(float64(Hi)))
	return func(rc *runCtx) error {
		meta, ok := rc.host[in[0]].(*dsaMeta)
		if !ok || meta.kpool != cfg.KPool {
			return fmt.Errorf("metadata input does not match kpool %d", cfg.KPool)
		}
		q, k, g, w := rc.in(in[1]), rc.in(in[2]), rc.in(in[3]), rc.in(in[4])
		sel := rc.outI(outs[0])
		for _, s := range meta.seqs {
			st := s.seq.Index[layer]
			if st == nil {
				return fmt.Errorf("slot %d has no indexer state for layer %d", s.slot, layer)
			}
			r0, r1 := s.row0, s.row0+s.n
			vis := meta.visible[r0:r1]
			cfg.Append(st, s.pos0, k[r0*Di:r1*Di], g[r0*Di:r1*Di], s.n, nil) // visibility comes from the metadata
			ws := make([]float32, s.n*Hi)
			for i := range ws {
				ws[i] = w[r0*Hi+i] * wscale
			}
			cfg.Select(sel[r0*W:r1*W], st, s.pos0, q[r0*Hi*Di:r1*Hi*Di], ws, s.n, vis)
		}
		return nil
	}, nil
}

func (p *Program) bindMLA(n *ir.Node) (func(rc *runCtx) error, error) {
	in, outs, a := n.Inputs, n.Outputs, n.Attrs
	c := &mla.Config{Heads: a.Int("heads", 0), QKDim: a.Int("qk_dim", 0), VDim: a.Int("v_dim", 0), Rank: a.Int("rank", 0),
		Scale: float32(a.Float("scale", 0)), KVBW: p.consts[in[3]], Params: gemm.Default()}
	if c.KVBW == nil {
		return nil, fmt.Errorf("kv_b weight must be a weight")
	}
	layer := n.Layer
	H, dq, dv, R := c.Heads, c.QKDim, c.VDim, c.Rank
	width := in[4].Shape[1]
	return func(rc *runCtx) error {
		meta, ok := rc.host[in[0]].(*dsaMeta)
		if !ok {
			return fmt.Errorf("metadata input is not DSA metadata")
		}
		q, ckv := rc.in(in[1]), rc.in(in[2])
		sel := rc.i[in[4]]
		o := rc.out(outs[0])
		for _, s := range meta.seqs {
			r0, r1 := s.row0, s.row0+s.n
			cache := append(s.seq.CKV[layer], ckv[r0*R:r1*R]...)
			s.seq.CKV[layer] = cache
			c.Attend(o[r0*H*dv:r1*H*dv], q[r0*H*dq:r1*H*dq], cache, sel[r0*width:r1*width], s.n, width)
		}
		return nil
	}, nil
}

func (p *Program) bindMHCPostPre(n *ir.Node) (func(rc *runCtx) error, error) {
	in, outs, a := n.Inputs, n.Outputs, n.Attrs
	H, D := in[1].Shape[1], in[1].Shape[2]
	prm := &mhc.Params{H: H, D: D, Fn: p.consts[in[4]], Base: p.consts[in[5]], Scale: p.consts[in[6]],
		NormEps: float32(a.Float("eps", 1e-5)), HCEps: float32(a.Float("hc_eps", 1e-6)), Iterations: a.Int("iters", 20)}
	if prm.Fn == nil || prm.Base == nil || prm.Scale == nil {
		return nil, fmt.Errorf("mHC parameters must be weights")
	}
	var normW []float32
	if len(in) == 8 {
		normW = p.consts[in[7]]
	}
	normEps := float32(a.Float("norm_eps", 1e-5))
	maxTokens := a.Int("max_tokens", 0)
	return func(rc *runCtx) error {
		o, R, post, comb := rc.in(in[0]), rc.in(in[1]), rc.in(in[2]), rc.in(in[3])
		T := rc.batch.T
		X, h, post2, comb2 := rc.out(outs[0]), rc.out(outs[1]), rc.out(outs[2]), rc.out(outs[3])
		fused := maxTokens == 0 || T <= maxTokens
		if fused {
			rc.p.fusedMHC.Add(1)
		}
		parallel.For(T, 8, func(lo, hi int) {
			args := mhc.PostPreArgs{Out: X[lo*H*D : hi*H*D], H2: h[lo*D : hi*D], Post2: post2[lo*H : hi*H], Comb2: comb2[lo*H*H : hi*H*H],
				O: o[lo*D : hi*D], R: R[lo*H*D : hi*H*D], Post: post[lo*H : hi*H], Comb: comb[lo*H*H : hi*H*H], NormW: normW, NormEps: normEps}
			if fused {
				mhc.PostPre(prm, &args, hi-lo)
			} else {
				mhc.PostPreUnfused(prm, &args, hi-lo)
			}
		})
		return nil
	}, nil
}

// bf16 returns a bfloat16 copy of a constant weight when every value is
// exactly representable in bfloat16 (true of BF16 checkpoints and of FP8
// weights with power-of-two block scales): GEMMs then read half the bytes
// and compute the same products. It returns nil otherwise, or when the
// executor option FP32Weights is set. Copies are shared by programs of one
// WeightCache.
func (p *Program) bf16(v *ir.Value) []uint16 {
	if p.opts.FP32Weights {
		return nil
	}
	if b, ok := p.bf16s[v]; ok {
		return b
	}
	w := p.consts[v]
	var b []uint16
	if v.Producer == nil && p.cache != nil && v.Ref != "" {
		b = p.cache.bf16(v.Ref, v.Stack, w)
	} else {
		b = toBF16Exact(w)
	}
	p.bf16s[v] = b
	return b
}

// toBF16Exact converts w if every value is bf16-representable, else nil.
func toBF16Exact(w []float32) []uint16 {
	for _, x := range w {
		if math.Float32bits(x)&0xFFFF != 0 {
			return nil
		}
	}
	b := make([]uint16, len(w))
	for i, x := range w {
		b[i] = uint16(math.Float32bits(x) >> 16)
	}
	return b
}
