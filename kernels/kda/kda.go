// Package kda implements the Kimi Delta Attention core of GLM-5.3-Flash's
// linear-attention layers for one (sequence, head): the recurrent form used
// for single-token decode and the chunked form used for prefill and
// multi-token continuation. Both read q, k, v, g ([T][D], row-major) and β
// ([T]) and update the fp32 state S ([Dk][Dv], decay on the key rows).
package kda

import (
	"math"

	"github.com/glmflash/glmflash/kernels/act"
	"github.com/glmflash/glmflash/kernels/gemm"
)

// ChunkSize is the chunk length of the chunked algorithm (as in FLA and
// transformers). Chunk boundaries do not change results.
const ChunkSize = 64

// L2Normalize scales each of the T rows of x ([T][D]) to x/sqrt(Σx²+eps) and
// then multiplies by scale (KDA uses eps 1e-6; q also gets scale D^−½).
func L2Normalize(x []float32, T, D int, eps, scale float32) {
	for t := 0; t < T; t++ {
		r := x[t*D : t*D+D]
		var s float64 // summed in float64, as norm's row reductions
		for _, v := range r {
			s += float64(v) * float64(v)
		}
		f := scale / float32(math.Sqrt(s+float64(eps)))
		for i := range r {
			r[i] *= f
		}
	}
}

// Workspace is the scratch memory of Recurrent and Chunked. Calls through
// one Workspace reuse its memory, growing it only when a call needs more,
// so a steady stream of calls allocates nothing. The zero value is ready to
// use; a Workspace serves one call at a time.
type Workspace struct{ buf []float32 }

// take returns n floats of scratch (contents undefined).
func (ws *Workspace) take(n int) []float32 {
	if cap(ws.buf) < n {
		ws.buf = make([]float32, n)
	}
	return ws.buf[:n]
}

// Recurrent runs Workspace.Recurrent with a fresh workspace (it allocates
// the scratch).
func Recurrent(o, q, k, v, g, beta []float32, T, Dk, Dv int, S []float32) {
	new(Workspace).Recurrent(o, q, k, v, g, beta, T, Dk, Dv, S)
}

// Chunked runs Workspace.Chunked with a fresh workspace (it allocates the
// scratch).
func Chunked(o, q, k, v, g, beta []float32, T, Dk, Dv int, S []float32) {
	new(Workspace).Chunked(o, q, k, v, g, beta, T, Dk, Dv, S)
}

// Recurrent runs the delta rule token by token (the definition of KDA):
//
//	S = diag(exp(g_t))·S;  δ = β_t·(v_t − Sᵀk_t);  S += k_t⊗δ;  o_t = Sᵀq_t
//
// q and k must already be L2-normalized (q also scaled). o is [T][Dv].
func (ws *Workspace) Recurrent(o, q, k, v, g, beta []float32, T, Dk, Dv int, S []float32) {
	pred := ws.take(Dv)
	for t := 0; t < T; t++ {
		qt, kt := q[t*Dk:t*Dk+Dk], k[t*Dk:t*Dk+Dk]
		vt, gt := v[t*Dv:t*Dv+Dv], g[t*Dk:t*Dk+Dk]
		for i := range pred {
			pred[i] = 0
		}
		for c := 0; c < Dk; c++ {
			row := S[c*Dv : c*Dv+Dv]
			e := float32(math.Exp(float64(gt[c])))
			for i := range row {
				row[i] *= e
			}
			gemm.Axpy(pred, kt[c], row)
		}
		b := beta[t]
		for i := range pred {
			pred[i] = b * (vt[i] - pred[i])
		}
		ot := o[t*Dv : t*Dv+Dv]
		for i := range ot {
			ot[i] = 0
		}
		for c := 0; c < Dk; c++ {
			row := S[c*Dv : c*Dv+Dv]
			gemm.Axpy(row, kt[c], pred)
			gemm.Axpy(ot, qt[c], row)
		}
	}
}

// Chunked computes the same outputs and final state as Recurrent with the
// chunked (WY / UT-transform) algorithm: within a chunk of n ≤ ChunkSize
// tokens, with G the inclusive prefix sum of g,
//
//	M_ij = β_i Σ_c k_i[c]k_j[c]e^{G_i[c]−G_j[c]} (j<i),  W = (I+M)⁻¹
//	U = W(β⊙V),  Kc = W(β⊙K⊙e^G),  Vn = U − Kc·S
//	O_i = (q_i⊙e^{G_i})·S + Σ_{j≤i} (Σ_c q_i[c]k_j[c]e^{G_i[c]−G_j[c]}) Vn_j
//	S ← diag(e^{G_n}) S + Σ_j (k_j⊙e^{G_n−G_j}) ⊗ Vn_j
//
// Only j ≤ i terms are ever formed, so no exponential overflows.
//
// When every g lies in [BlockedMinG, 0] (the safe gate's range (−5, 0)),
// the chunk is computed with matrix products (chunkedBlocked); otherwise by
// the scalar pairwise form (chunkedScalar). Both agree to fp32 rounding.
func (ws *Workspace) Chunked(o, q, k, v, g, beta []float32, T, Dk, Dv int, S []float32) {
	if blockedOK(g[:T*Dk]) {
		ws.chunkedBlocked(o, q, k, v, g, beta, T, Dk, Dv, S)
		return
	}
	ws.chunkedScalar(o, q, k, v, g, beta, T, Dk, Dv, S)
}

// BlockedMinG is the smallest log-decay the blocked chunked form accepts:
// within a sub-block of subBlock tokens the decay ratios it forms are then
// within e^{±(subBlock−1)·5.25} = e^{±78.75}, finite and normal in float32.
const BlockedMinG = -5.25

// subBlock is the number of tokens of one sub-block of the blocked form.
const subBlock = 16

// blockedOK reports whether every g is in [BlockedMinG, 0] (NaN is not).
func blockedOK(g []float32) bool {
	for _, x := range g {
		if !(x <= 0 && x >= BlockedMinG) {
			return false
		}
	}
	return true
}

// chunkedBlocked is Chunked as matrix products (gemm.MatMulTSerial) with
// vector exponentials, for g in [BlockedMinG, 0]. The decayed inner products
// of a sub-block I of rows (first row r) against all earlier and equal
// columns j are one product of (k_i, q_i)⊙e^{G_i−G_r} (factors ≤ 1) with
// k_j⊙e^{G_r−G_j} (≤ 1 for j < r, flushed to 0 below 1e-30; ≤ e^78.75 within
// the sub-block); W = (I+M)⁻¹ is formed by rows, then U = W(β⊙V),
// Kc = W(β⊙K⊙e^G), the output and the state update are products too. The
// state is kept transposed (Sᵀ, [Dv][Dk]) for the duration of the call.
func (ws *Workspace) chunkedBlocked(o, q, k, v, g, beta []float32, T, Dk, Dv int, S []float32) {
	C := min(ChunkSize, T)
	B := subBlock
	Dm := max(Dk, Dv)
	buf := ws.take(Dv*Dk*2 + 4*C*Dk + 2*B*Dk + 2*B*C + 3*C*C + 2*C*Dv + C*Dk + C*Dm + Dv*C + Dk*C + Dk*C + Dk*C)
	cut := func(n int) []float32 {
		b := buf[:n:n]
		buf = buf[n:]
		return b
	}
	St, tmpS := cut(Dv*Dk), cut(Dv*Dk)
	G, eG, ex, Bm := cut(C*Dk), cut(C*Dk), cut(C*Dk), cut(C*Dk)
	X, out := cut(2*B*Dk), cut(2*B*C)
	M, P, W := cut(C*C), cut(C*C), cut(C*C)
	U, VnT := cut(C*Dv), cut(Dv*C)
	Kc, tmp := cut(C*Dk), cut(C*Dm)
	RTv, RTk, KdT, qe := cut(Dv*C), cut(Dk*C), cut(Dk*C), cut(C*Dk)
	for c := 0; c < Dk; c++ {
		for x := 0; x < Dv; x++ {
			St[x*Dk+c] = S[c*Dv+x]
		}
	}
	for t0 := 0; t0 < T; t0 += ChunkSize {
		n := min(T-t0, ChunkSize)
		qc, kc := q[t0*Dk:(t0+n)*Dk], k[t0*Dk:(t0+n)*Dk]
		vc, gc := v[t0*Dv:(t0+n)*Dv], g[t0*Dk:(t0+n)*Dk]
		bc := beta[t0 : t0+n]
		copy(G[:Dk], gc[:Dk])
		for i := 1; i < n; i++ {
			gi, prev, cur := gc[i*Dk:i*Dk+Dk], G[(i-1)*Dk:i*Dk], G[i*Dk:i*Dk+Dk]
			for c := range cur {
				cur[c] = prev[c] + gi[c]
			}
		}
		act.ExpSerial(eG[:n*Dk], G[:n*Dk])
		// M (strictly lower, ×β_i) and P (lower with the diagonal, zero
		// above), both n×n, by sub-blocks of rows
		for r := 0; r < n; r += B {
			e := min(r+B, n)
			bI := e - r
			Gr := G[r*Dk : r*Dk+Dk]
			for i := r; i < e; i++ {
				d, Gi := ex[(i-r)*Dk:(i-r+1)*Dk], G[i*Dk:i*Dk+Dk]
				for c := range d {
					d[c] = Gi[c] - Gr[c]
				}
			}
			act.ExpSerial(ex[:bI*Dk], ex[:bI*Dk])
			for i := r; i < e; i++ {
				d := ex[(i-r)*Dk : (i-r+1)*Dk]
				ak, aq := X[(i-r)*Dk:(i-r+1)*Dk], X[(bI+i-r)*Dk:(bI+i-r+1)*Dk]
				ki, qi := kc[i*Dk:i*Dk+Dk], qc[i*Dk:i*Dk+Dk]
				for c := range d {
					ak[c] = ki[c] * d[c]
					aq[c] = qi[c] * d[c]
				}
			}
			for j := 0; j < e; j++ {
				d, Gj := ex[j*Dk:j*Dk+Dk], G[j*Dk:j*Dk+Dk]
				for c := range d {
					d[c] = Gr[c] - Gj[c]
				}
			}
			act.ExpSerial(ex[:e*Dk], ex[:e*Dk])
			for j := 0; j < e; j++ {
				d, bj, kj := ex[j*Dk:j*Dk+Dk], Bm[j*Dk:j*Dk+Dk], kc[j*Dk:j*Dk+Dk]
				for c := range d {
					f := d[c]
					if f < 1e-30 {
						f = 0
					}
					bj[c] = kj[c] * f
				}
			}
			gemm.MatMulTSerial(out[:2*bI*e], X[:2*bI*Dk], 2*bI, Dk, Bm[:e*Dk], e)
			for i := r; i < e; i++ {
				rk, rq := out[(i-r)*e:(i-r+1)*e], out[(bI+i-r)*e:(bI+i-r+1)*e]
				Mi, Pi := M[i*n:i*n+n], P[i*n:i*n+n]
				b := bc[i]
				for j := 0; j < i; j++ {
					Mi[j] = b * rk[j]
				}
				copy(Pi[:i+1], rq[:i+1])
				clear(Pi[i+1:])
			}
		}
		// W = (I+M)⁻¹ (unit lower triangular) by rows: W_i = e_i − Σ_{m<i} M_im W_m
		for i := 0; i < n; i++ {
			Wi, Mi := W[i*n:i*n+n], M[i*n:i*n+n]
			clear(Wi)
			Wi[i] = 1
			for m := 0; m < i; m++ {
				if a := Mi[m]; a != 0 {
					gemm.Axpy(Wi[:m+1], -a, W[m*n:m*n+m+1])
				}
			}
		}
		// U = W·(β⊙V), Kc = W·(β⊙K⊙e^G): the right-hand sides transposed
		for j := 0; j < n; j++ {
			b := bc[j]
			vj, kj, eGj := vc[j*Dv:j*Dv+Dv], kc[j*Dk:j*Dk+Dk], eG[j*Dk:j*Dk+Dk]
			for x, vx := range vj {
				RTv[x*n+j] = b * vx
			}
			for c, kx := range kj {
				RTk[c*n+j] = b * kx * eGj[c]
			}
		}
		gemm.MatMulTSerial(U[:n*Dv], W[:n*n], n, n, RTv[:Dv*n], Dv)
		gemm.MatMulTSerial(Kc[:n*Dk], W[:n*n], n, n, RTk[:Dk*n], Dk)
		// Vn = U − Kc·S (stored in U), and Vnᵀ
		gemm.MatMulTSerial(tmp[:n*Dv], Kc[:n*Dk], n, Dk, St, Dv)
		for x := 0; x < n*Dv; x++ {
			U[x] -= tmp[x]
		}
		for j := 0; j < n; j++ {
			for x, u := range U[j*Dv : j*Dv+Dv] {
				VnT[x*n+j] = u
			}
		}
		// O = (Q⊙e^G)·S + P·Vn
		for x := 0; x < n*Dk; x++ {
			qe[x] = qc[x] * eG[x]
		}
		oc := o[t0*Dv : (t0+n)*Dv]
		gemm.MatMulTSerial(oc, qe[:n*Dk], n, Dk, St, Dv)
		gemm.MatMulTSerial(tmp[:n*Dv], P[:n*n], n, n, VnT[:Dv*n], Dv)
		for x := range oc {
			oc[x] += tmp[x]
		}
		// S ← diag(e^{G_n}) S + Σ_j (k_j⊙e^{G_n−G_j}) ⊗ Vn_j, transposed:
		// Sᵀ ← Sᵀ·diag(e^{G_n}) + Vnᵀ·Kd
		Gn := G[(n-1)*Dk : n*Dk]
		for j := 0; j < n; j++ {
			d, Gj := ex[j*Dk:j*Dk+Dk], G[j*Dk:j*Dk+Dk]
			for c := range d {
				d[c] = Gn[c] - Gj[c]
			}
		}
		act.ExpSerial(ex[:n*Dk], ex[:n*Dk])
		for j := 0; j < n; j++ {
			d, kj := ex[j*Dk:j*Dk+Dk], kc[j*Dk:j*Dk+Dk]
			for c := range d {
				KdT[c*n+j] = kj[c] * d[c]
			}
		}
		gemm.MatMulTSerial(tmpS, VnT[:Dv*n], Dv, n, KdT[:Dk*n], Dk)
		dn := eG[(n-1)*Dk : n*Dk]
		for x := 0; x < Dv; x++ {
			row, tr := St[x*Dk:x*Dk+Dk], tmpS[x*Dk:x*Dk+Dk]
			for c := range row {
				row[c] = row[c]*dn[c] + tr[c]
			}
		}
	}
	for c := 0; c < Dk; c++ {
		for x := 0; x < Dv; x++ {
			S[c*Dv+x] = St[x*Dk+c]
		}
	}
}

// chunkedScalar is Chunked in its scalar pairwise form (any g).
func (ws *Workspace) chunkedScalar(o, q, k, v, g, beta []float32, T, Dk, Dv int, S []float32) {
	C := ChunkSize
	if T < C {
		C = T
	}
	// one scratch block: every element read below is written first in its
	// chunk (M and P only below and on the diagonal)
	buf := ws.take(5*C*Dk + 2*C*C + 2*C*Dv + Dk)
	cut := func(n int) []float32 {
		b := buf[:n:n]
		buf = buf[n:]
		return b
	}
	G, eG, M, P := cut(C*Dk), cut(C*Dk), cut(C*C), cut(C*C)
	U, Kc, tmp, qe := cut(C*Dv), cut(C*Dk), cut(C*Dv), cut(C*Dk)
	d, eg := cut(Dk), cut(C*Dk)
	for t0 := 0; t0 < T; t0 += ChunkSize {
		n := T - t0
		if n > ChunkSize {
			n = ChunkSize
		}
		qc, kc := q[t0*Dk:(t0+n)*Dk], k[t0*Dk:(t0+n)*Dk]
		vc, gc := v[t0*Dv:(t0+n)*Dv], g[t0*Dk:(t0+n)*Dk]
		bc := beta[t0 : t0+n]
		// prefix sums of the log-decay
		copy(G[:Dk], gc[:Dk])
		for i := 1; i < n; i++ {
			gi, prev, cur := gc[i*Dk:i*Dk+Dk], G[(i-1)*Dk:i*Dk], G[i*Dk:i*Dk+Dk]
			for c := range cur {
				cur[c] = prev[c] + gi[c]
			}
		}
		for i := 0; i < n*Dk; i++ {
			eG[i] = float32(math.Exp(float64(G[i])))
		}
		// pairwise decayed inner products (lower triangle only). The decay
		// e^{G_i−G_j} = Π_{m=j+1..i} e^{g_m} is built as a running product
		// while j walks down from i, so each pair costs multiplies, not
		// exponentials; values below 1e-30 are flushed to zero (they cannot
		// matter next to the j = i term, and denormals are slow).
		for x := 0; x < n*Dk; x++ {
			eg[x] = float32(math.Exp(float64(gc[x])))
		}
		for i := 0; i < n; i++ {
			ki, qi := kc[i*Dk:i*Dk+Dk], qc[i*Dk:i*Dk+Dk]
			for c := range d {
				d[c] = 1
			}
			for j := i - 1; j >= 0; j-- {
				egj := eg[(j+1)*Dk : (j+2)*Dk]
				kj := kc[j*Dk : j*Dk+Dk]
				var sm, sp float32
				for c := range d {
					dc := d[c] * egj[c]
					if dc < 1e-30 {
						dc = 0
					}
					d[c] = dc
					kd := kj[c] * dc
					sm += ki[c] * kd
					sp += qi[c] * kd
				}
				M[i*C+j] = bc[i] * sm
				P[i*C+j] = sp
			}
			P[i*C+i] = gemm.Dot(qi, ki)
		}
		// forward substitution: (I+M)·U = β⊙V and (I+M)·Kc = β⊙K⊙e^G
		for i := 0; i < n; i++ {
			ui, kci := U[i*Dv:i*Dv+Dv], Kc[i*Dk:i*Dk+Dk]
			vi, ki, eGi := vc[i*Dv:i*Dv+Dv], kc[i*Dk:i*Dk+Dk], eG[i*Dk:i*Dk+Dk]
			b := bc[i]
			for x := range ui {
				ui[x] = b * vi[x]
			}
			for c := range kci {
				kci[c] = b * ki[c] * eGi[c]
			}
			for j := 0; j < i; j++ {
				m := M[i*C+j]
				if m == 0 {
					continue
				}
				gemm.Axpy(ui, -m, U[j*Dv:j*Dv+Dv])
				gemm.Axpy(kci, -m, Kc[j*Dk:j*Dk+Dk])
			}
		}
		// Vn = U − Kc·S  (stored in U)
		gemm.MatMul(tmp[:n*Dv], Kc[:n*Dk], n, Dk, S, Dv)
		for x := 0; x < n*Dv; x++ {
			U[x] -= tmp[x]
		}
		// O = (Q⊙e^G)·S + P·Vn
		for x := 0; x < n*Dk; x++ {
			qe[x] = qc[x] * eG[x]
		}
		oc := o[t0*Dv : (t0+n)*Dv]
		gemm.MatMul(oc, qe[:n*Dk], n, Dk, S, Dv)
		for i := 0; i < n; i++ {
			oi := oc[i*Dv : i*Dv+Dv]
			for j := 0; j <= i; j++ {
				gemm.Axpy(oi, P[i*C+j], U[j*Dv:j*Dv+Dv])
			}
		}
		// state update
		Gn := G[(n-1)*Dk : n*Dk]
		for c := 0; c < Dk; c++ {
			row := S[c*Dv : c*Dv+Dv]
			dn := float32(math.Exp(float64(Gn[c])))
			for x := range row {
				row[x] *= dn
			}
			for j := 0; j < n; j++ {
				w := kc[j*Dk+c] * float32(math.Exp(float64(Gn[c]-G[j*Dk+c])))
				gemm.Axpy(row, w, U[j*Dv:j*Dv+Dv])
			}
		}
	}
}
