// mHC (manifold-constrained hyper-connections): pre (mixing logits,
// Sinkhorn-projected combiner, stream collapse), post (expand), and the
// fused post + next pre (+ RMSNorm).
//
// The pre runs as two kernels that spread a token over the GPU:
//  1. glmf_mhc_pre (or glmf_mhc_post_pre, which first computes the streams
//     by the post and writes them): a split-K projection. Block (c, g) takes
//     chunk c of the flattened streams (MHC_CK values: d in
//     [c·dc, c·dc+dc) of all H streams, dc = MHC_CK/H) for MHC_TT tokens
//     and writes, per token, the chunk's partial mixing dots and its sum of
//     squares (doubles) to a scratch buffer part [T][nch][mix+1].
//  2. glmf_mhc_mix: two blocks per token add the chunks' partials (warp w
//     the chunks ≡ w mod 8, then a fixed tree) and scale them by the RMS;
//     one runs the pre gates, collapses the streams into h and applies the
//     optional RMSNorm of h, the other, beside it, runs the post gates and
//     the Sinkhorn projection.
// The chunking does not depend on T, and every partial sums in a fixed
// order, so a token's bits do not depend on the batch; the fused and
// unfused paths run the same device functions and give identical bits.
#include "common.cuh"

// Largest stream count the kernels hold in shared memory (the backend
// refuses larger hc_mult).
#define MHC_MAX_H 16
#define MHC_MAX_MIX ((2 + MHC_MAX_H) * MHC_MAX_H)
// Split-K geometry of the projection (MHC_THREADS threads a block): a
// chunk holds MHC_CK flattened stream values, a block MHC_TT tokens. Lane
// l of warp w holds token l / MHC_SLW's values of slice w·MHC_SLW + l %
// MHC_SLW (MHC_KT values) in registers; the weights of MHC_RG mixing rows
// at a time sit in shared memory as doubles (slices padded to MHC_WS), and
// a warp's load of two of them is a broadcast of MHC_SLW addresses.
#define MHC_CK 256
#define MHC_KT 8
#define MHC_SLW 4
#define MHC_TT 8
#define MHC_RG 12
#define MHC_WS 10
#define MHC_WROW (MHC_CK / MHC_KT * MHC_WS)
#define MHC_THREADS 256
// Mixing rows a block of the few-token variant (mhc_proj_tok) sums.
#define MHC_RS 8
#if MHC_THREADS != 256 || MHC_CK != MHC_THREADS || MHC_CK / MHC_KT != MHC_THREADS / 32 * MHC_SLW || MHC_TT * MHC_SLW != 32
#error "mhc_proj and glmf_mhc_mix assume 8 warps, a thread per chunk value when staging, and a warp per slice group of every tile token"
#endif
// h values a thread of glmf_mhc_mix holds at once (D up to 16·256 = 4096
// stays in registers for the RMSNorm).
#define MHC_HD 16
// Streams glmf_mhc_mix prefetches into registers (hc_mult ≤ 4).
#define MHC_PF_H 4
// Chunks' partial sums a lane of glmf_mhc_mix loads at once.
#define MHC_MIX_BATCH 8

struct MHCParams {
  const void* fn; i64 fn_bf16;        // [(2+H)·H][H·D]
  const void* base; i64 base_bf16;    // [(2+H)·H]
  const void* scale; i64 scale_bf16;  // [3]
  i64 H, D, iters;
  double norm_eps, hc_eps;
};

// sigmoid_dd is 1/(1+e^−x) in double.
DEVFN double sigmoid_dd(double x) { return 1.0 / (1.0 + exp(-x)); }

// mhc_eps is hc_eps as the CPU kernel holds it: rounded to float, then
// widened.
DEVFN double mhc_eps(const MHCParams& p) { return (double)(float)p.hc_eps; }

// mhc_mapping turns the RMS-scaled mixing logits m (with the scales sc[3]
// and the bases bs[mix], as floats) into pre, post and the
// Sinkhorn-projected comb (row i = source stream, column j = destination),
// exactly as kernels/mhc.Mapping: the sigmoids, the softmax and every
// Sinkhorn pass in double (cw, H·H doubles of shared memory), each value
// rounded to float once at the end. Called by the whole block: thread i < H
// owns stream i's pre and post, row i in the softmax and the row passes,
// and column i in the column passes, each computed in the serial order of
// the CPU kernel (so the bits are the one-thread result's).
DEVFN void mhc_mapping(const MHCParams& p, const float* sc, const float* bs, const float* m, float* pre, float* post, double* cw, float* comb) {
  i64 H = p.H, i = threadIdx.x;
  double eps = mhc_eps(p);
  if (i < H) {
    float s0 = sc[0], s1 = sc[1], s2 = sc[2];
    pre[i] = (float)(sigmoid_dd((double)(s0 * m[i] + bs[i])) + eps);
    post[i] = (float)(2 * sigmoid_dd((double)(s1 * m[H + i] + bs[H + i])));
    double* row = cw + i * H;
    double mx = -INFINITY;
    for (i64 j = 0; j < H; j++) {
      row[j] = (double)(s2 * m[2 * H + i * H + j] + bs[2 * H + i * H + j]);
      if (row[j] > mx) mx = row[j];
    }
    double s = 0;
    for (i64 j = 0; j < H; j++) {
      row[j] = exp(row[j] - mx);
      s += row[j];
    }
    for (i64 j = 0; j < H; j++) row[j] = row[j] / s + eps;
  }
  __syncthreads();
  i64 iters = p.iters < 1 ? 1 : p.iters;  // the first column pass always runs
  for (i64 it = 0; it < iters; it++) {
    if (it > 0) {
      if (i < H) {
        double s = 0;
        for (i64 j = 0; j < H; j++) s += cw[i * H + j];
        for (i64 j = 0; j < H; j++) cw[i * H + j] /= s + eps;
      }
      __syncthreads();
    }
    if (i < H) {
      i64 j = i;
      double s = 0;
      for (i64 r = 0; r < H; r++) s += cw[r * H + j];
      for (i64 r = 0; r < H; r++) cw[r * H + j] /= s + eps;
    }
    __syncthreads();
  }
  for (i64 k = i; k < H * H; k += blockDim.x) comb[k] = (float)cw[k];
  __syncthreads();
}

// mhc_comb_warp: the post gates and the Sinkhorn-projected comb of
// mhc_mapping by one warp where H·H ≤ 32 (H = p.H fixed at compile time:
// 1 to 5; the model's hc_mult is 4), with no block barriers and no shared
// memory, written straight to post[H] and comb[H·H] in global memory. Lane
// l = i·H + j holds comb[i][j] throughout, in double: its exponential, the
// softmax's quotient and every Sinkhorn pass. Every value is computed in
// the CPU's order with IEEE quotients, so the bits are mhc_mapping's. The
// whole warp calls it.
template <int H>
DEVFN void mhc_comb_warp(const MHCParams& p, const float* sc, const float* bs, const float* m, float* post, float* comb) {
  int l = threadIdx.x % 32;
  bool own = l < H * H;
  int i = own ? l / H : 0;
  double eps = mhc_eps(p);
  if (l < H) post[l] = (float)(2 * sigmoid_dd((double)(sc[1] * m[H + l] + bs[H + l])));
  float s2 = sc[2];
  double c = own ? (double)(s2 * m[2 * H + l] + bs[2 * H + l]) : 0.0;
  double mx = -INFINITY;
#pragma unroll
  for (int jj = 0; jj < H; jj++) {
    double v = __shfl_sync(0xffffffffu, c, i * H + jj);
    if (v > mx) mx = v;
  }
  c = exp(c - mx);
  double s = 0;
#pragma unroll
  for (int jj = 0; jj < H; jj++) s += __shfl_sync(0xffffffffu, c, i * H + jj);
  c = c / s + eps;
  // the Sinkhorn passes, lane l holding comb[i][j]: a row's (column's) sum
  // is gathered by shuffles in ascending index, as the CPU adds it, and
  // every lane divides its own value (IEEE quotients). The passes' chain is
  // a few shuffles, adds and one division, where one lane holding the
  // matrix ran every quotient of a pass in turn (20 iterations of 2 passes:
  // about 20,000 cycles, the whole of glmf_mhc_mix at decode).
  int j = own ? l % H : 0;
  i64 iters = p.iters < 1 ? 1 : p.iters;  // the first column pass always runs
  for (i64 it = 0; it < iters; it++) {
    if (it > 0) {
      double rs = 0;
#pragma unroll
      for (int jj = 0; jj < H; jj++) rs += __shfl_sync(0xffffffffu, c, i * H + jj);
      c = c / (rs + eps);
    }
    double cs = 0;
#pragma unroll
    for (int r = 0; r < H; r++) cs += __shfl_sync(0xffffffffu, c, r * H + j);
    c = c / (cs + eps);
  }
  if (own) comb[l] = (float)c;
}

// mhc_post_elem: one element of the expanded streams:
// out[j][d] = post[j]·o[d] + Σ_i comb[i][j]·R[i][d].
DEVFN float mhc_post_elem(i64 H, i64 D, i64 j, i64 d, const float* o, const float* R, const float* post, const float* comb) {
  float v = post[j] * o[d];
  for (i64 i = 0; i < H; i++) v += comb[i * H + j] * R[i * D + d];
  return v;
}


struct MHCPostArgs {
  const float* o; const float* R; const float* post; const float* comb; float* out; i64 T, H, D;
};
KERNEL(glmf_mhc_post, MHCPostArgs) {
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  i64 HD = a.H * a.D;
  if (i >= a.T * HD) return;
  i64 t = i / HD, j = (i % HD) / a.D, d = i % a.D;
  a.out[i] = mhc_post_elem(a.H, a.D, j, d, a.o + t * a.D, a.R + t * HD, a.post + t * a.H, a.comb + t * a.H * a.H);
}

// mhc_dc: the d values of a chunk (a chunk covers them in all H streams).
DEVFN i64 mhc_dc(i64 H) { return MHC_CK / H; }

// mhc_proj: stage 1 of the pre over chunk blockIdx.x and tokens
// MHC_TT·blockIdx.y...: the tokens' stream values of the chunk come from
// xval(t, j, d) (stream j, t < T), which may also write
// them (the fused post). part[t][c][i] (i < mix) = Σ_k x[k]·fn[i][k] over
// the chunk, part[t][c][mix] = Σ_k x[k]², in double: products of a float
// and a bf16/fp32 weight are exact; each thread sums its slice of MHC_KT
// values in ascending k, the MHC_SLW slices of a warp add in a butterfly,
// the warps' sums in a fixed tree.
template <class XVal, class XStore>
DEVFN void mhc_proj(const MHCParams& p, double* part, i64 T, XVal xval, XStore xstore) {
  __shared__ __align__(16) double w_s[MHC_RG * MHC_WROW];
  __shared__ double red_s[MHC_THREADS / 32][MHC_TT][MHC_RG + 1];
  i64 H = p.H, D = p.D, HD = H * D, mix = (2 + H) * H, PW = mix + 1;
  i64 dc = mhc_dc(H), nch = (D + dc - 1) / dc, c = blockIdx.x, t0 = (i64)blockIdx.y * MHC_TT;
  int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  // staging: thread tid loads the chunk's value kk = tid (stream j, d) of
  // every weight row of a group; values past the chunk or D are zeros
  int dci = (int)dc;
  i64 js = tid / dci, ds = c * dc + tid % dci;
  bool kin = js < H && ds < D;
  int so = (tid / MHC_KT) * MHC_WS + tid % MHC_KT;  // its place in a row of w_s
  float wr[MHC_RG];
  ldw_n<MHC_RG>(p.fn, p.fn_bf16, js * D + ds, HD, kin ? mix * HD : 0, wr);
  // this thread's values (zeros past the chunk, D or T: they add exact
  // zeros) and their sum of squares
  int tt = lane / MHC_SLW, sl = warp * MHC_SLW + lane % MHC_SLW;
  i64 t = t0 + tt;
  // every value's loads first, then its stores (xstore: the fused post's
  // streams), so that no load waits behind a store it might alias
  double xv[MHC_KT];
  float xf[MHC_KT];
  double q = 0;
#pragma unroll
  for (int e = 0; e < MHC_KT; e++) {
    int kk = sl * MHC_KT + e, j = kk / dci;
    i64 d = c * dc + kk % dci;
    xf[e] = t < T && j < H && d < D ? xval(t, j, d) : 0.f;
  }
#pragma unroll
  for (int e = 0; e < MHC_KT; e++) {
    int kk = sl * MHC_KT + e, j = kk / dci;
    i64 d = c * dc + kk % dci;
    if (t < T && j < H && d < D) xstore(t, j, d, xf[e]);
    xv[e] = xf[e];
    q += xv[e] * xv[e];
  }
  q += __shfl_xor_sync(0xffffffffu, q, 1);
  q += __shfl_xor_sync(0xffffffffu, q, 2);
  for (i64 g0 = 0; g0 < mix; g0 += MHC_RG) {
    __syncthreads();  // the last group's reads of w_s and red_s done
#pragma unroll
    for (int r = 0; r < MHC_RG; r++) w_s[r * MHC_WROW + so] = (double)wr[r];
    __syncthreads();
    // the next group's weights load while this one computes
    i64 g1 = g0 + MHC_RG;
    if (g1 < mix) {
      ldw_n<MHC_RG>(p.fn, p.fn_bf16, g1 * HD + js * D + ds, HD, kin ? mix * HD : 0, wr);
    }
    double acc[MHC_RG];
#pragma unroll
    for (int r = 0; r < MHC_RG; r++) acc[r] = 0;
    const double* wb = w_s + sl * MHC_WS;
#pragma unroll
    for (int e = 0; e < MHC_KT; e += 2) {
#pragma unroll
      for (int r = 0; r < MHC_RG; r++) {
        double2 w2 = *(const double2*)(wb + r * MHC_WROW + e);
        acc[r] += xv[e] * w2.x;
        acc[r] += xv[e + 1] * w2.y;
      }
    }
#pragma unroll
    for (int r = 0; r < MHC_RG; r++) {
      double a = acc[r];
      a += __shfl_xor_sync(0xffffffffu, a, 1);
      a += __shfl_xor_sync(0xffffffffu, a, 2);
      if (lane % MHC_SLW == 0) red_s[warp][tt][r] = a;
    }
    if (g0 == 0 && lane % MHC_SLW == 0) red_s[warp][tt][MHC_RG] = q;
    __syncthreads();
    // the 8 warps' sums, (token u, row r) by thread u·(MHC_RG+1) + r; r =
    // MHC_RG: the sum of squares, in the first group
    if (tid < MHC_TT * (MHC_RG + 1)) {
      int u = tid / (MHC_RG + 1), r = tid % (MHC_RG + 1);
      double(*R)[MHC_TT][MHC_RG + 1] = red_s;
      double v = ((R[0][u][r] + R[1][u][r]) + (R[2][u][r] + R[3][u][r])) + ((R[4][u][r] + R[5][u][r]) + (R[6][u][r] + R[7][u][r]));
      i64 tu = t0 + u, i = r < MHC_RG ? g0 + r : mix;
      if (tu < T && (r < MHC_RG ? g0 + r < mix : g0 == 0)) part[(tu * nch + c) * PW + i] = v;
    }
  }
}

// mhc_proj_tok: mhc_proj for few tokens (T < MHC_TT, decode), where a
// block of MHC_TT token slots would leave most lanes idle. Block (g, rg,
// t) takes token t and MHC_TT chunks g·MHC_TT…: lane group tt = lane /
// MHC_SLW holds chunk g·MHC_TT + tt where mhc_proj holds a token, and
// mixing rows [rg·MHC_RS, rg·MHC_RS + MHC_RS) (row group 0 also the sum of
// squares and xstore). Each lane reads its weights straight from memory (no
// token shares them). Every partial is mhc_proj's (same slices, same
// ascending k, same butterfly, same warp tree), so the bits do not depend on
// which variant ran: a token's result is the same in any batch.
template <class XVal, class XStore, class XSlice>
DEVFN void mhc_proj_tok(const MHCParams& p, double* part, XVal xval, XStore xstore, XSlice xslice) {
  __shared__ double red_s[MHC_THREADS / 32][MHC_TT][MHC_RS + 1];
  i64 H = p.H, D = p.D, HD = H * D, mix = (2 + H) * H, PW = mix + 1;
  i64 dc = mhc_dc(H), nch = (D + dc - 1) / dc;
  int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, rg = blockIdx.y;
  i64 t = blockIdx.z;
  int tt = lane / MHC_SLW, sl = warp * MHC_SLW + lane % MHC_SLW, dci = (int)dc;
  i64 c = (i64)blockIdx.x * MHC_TT + tt;
  // the slice: MHC_KT consecutive d of one stream j0 when dc is a multiple
  // of MHC_KT; then (whole, aligned) it loads as vectors
  int kk0 = sl * MHC_KT, j0 = kk0 / dci;
  i64 d0 = c * dc + kk0 % dci;
  const float* fnf = (const float*)p.fn;
  const u16* fnb = (const u16*)p.fn;
  i64 w0 = (i64)j0 * D + d0;  // the slice's offset in a weight row
  bool fast = dci % MHC_KT == 0 && c < nch && j0 < H && d0 + MHC_KT <= D && HD % 8 == 0 &&
              (p.fn_bf16 ? ((u64)(fnb + w0) & 15) == 0 : ((u64)(fnf + w0) & 15) == 0);
  // bf16 weights: their loads first, in flight with the slice's (kept as
  // the raw 16 bytes until the slice is in: floats would spill)
  const bool wfast = fast;
  uint4 wraw[MHC_RS];
  if (wfast && p.fn_bf16) {
#pragma unroll
    for (int r = 0; r < MHC_RS; r++) {
      i64 i = (i64)rg * MHC_RS + r;
      wraw[r] = i < mix ? *(const uint4*)(fnb + i * HD + w0) : make_uint4(0, 0, 0, 0);
    }
  }
  float xf[MHC_KT];
  bool in[MHC_KT];
  i64 off[MHC_KT];
  if (fast) fast = xslice(t, (i64)j0, d0, xf);
#pragma unroll
  for (int e = 0; e < MHC_KT; e++) {
    int kk = kk0 + e, j = kk / dci;
    i64 d = c * dc + kk % dci;
    in[e] = c < nch && j < H && d < D;
    off[e] = (i64)j * D + d;
    if (!fast) xf[e] = in[e] ? xval(t, (i64)j, d) : 0.f;
  }
  float wv[MHC_RS][MHC_KT];  // (as floats: exact; doubles would spill)
  if (wfast && p.fn_bf16) {
#pragma unroll
    for (int r = 0; r < MHC_RS; r++) {
      uint4 u = wraw[r];
      unsigned q[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
      for (int e = 0; e < MHC_KT; e += 2) {
        wv[r][e] = __uint_as_float(q[e / 2] << 16);
        wv[r][e + 1] = __uint_as_float(q[e / 2] & 0xffff0000u);
      }
    }
  } else if (wfast) {
#pragma unroll
    for (int r = 0; r < MHC_RS; r++) {
      i64 i = (i64)rg * MHC_RS + r;
      float4 u = {0, 0, 0, 0}, v = {0, 0, 0, 0};
      if (i < mix) u = *(const float4*)(fnf + i * HD + w0), v = *(const float4*)(fnf + i * HD + w0 + 4);
      wv[r][0] = u.x, wv[r][1] = u.y, wv[r][2] = u.z, wv[r][3] = u.w;
      wv[r][4] = v.x, wv[r][5] = v.y, wv[r][6] = v.z, wv[r][7] = v.w;
    }
  } else {
#pragma unroll
    for (int r = 0; r < MHC_RS; r++) {
      i64 i = (i64)rg * MHC_RS + r;
#pragma unroll
      for (int e = 0; e < MHC_KT; e++) wv[r][e] = in[e] && i < mix ? ldw(p.fn, i * HD + off[e], p.fn_bf16) : 0.f;
    }
  }
  double xv[MHC_KT];
  double q = 0;
#pragma unroll
  for (int e = 0; e < MHC_KT; e++) {
    if (rg == 0 && in[e]) xstore(t, off[e] / D, off[e] % D, xf[e]);
    xv[e] = xf[e];
    q += xv[e] * xv[e];
  }
  q += __shfl_xor_sync(0xffffffffu, q, 1);
  q += __shfl_xor_sync(0xffffffffu, q, 2);
#pragma unroll
  for (int r = 0; r < MHC_RS; r++) {
    double a = 0;
#pragma unroll
    for (int e = 0; e < MHC_KT; e++) a += xv[e] * (double)wv[r][e];
    a += __shfl_xor_sync(0xffffffffu, a, 1);
    a += __shfl_xor_sync(0xffffffffu, a, 2);
    if (lane % MHC_SLW == 0) red_s[warp][tt][r] = a;
  }
  if (lane % MHC_SLW == 0) red_s[warp][tt][MHC_RS] = q;
  __syncthreads();
  if (tid < MHC_TT * (MHC_RS + 1)) {
    int u = tid / (MHC_RS + 1), r = tid % (MHC_RS + 1);
    double(*R)[MHC_TT][MHC_RS + 1] = red_s;
    double v = ((R[0][u][r] + R[1][u][r]) + (R[2][u][r] + R[3][u][r])) + ((R[4][u][r] + R[5][u][r]) + (R[6][u][r] + R[7][u][r]));
    i64 cu = (i64)blockIdx.x * MHC_TT + u, i = r < MHC_RS ? (i64)rg * MHC_RS + r : mix;
    if (cu < nch && (r < MHC_RS ? i < mix : rg == 0)) part[(t * nch + cu) * PW + i] = v;
  }
}

// ld8 loads 8 floats at p as two vectors when p is 16-byte aligned.
DEVFN bool ld8(const float* p, float* v) {
  if ((u64)p & 15) return false;
  float4 a = *(const float4*)p, b = *(const float4*)(p + 4);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  return true;
}

struct MHCPreArgs {
  MHCParams p; const float* x; double* part; i64 T;
};
// Stage 1 of the pre on given streams x [T][H·D]: grid (nch, ⌈T/MHC_TT⌉),
// MHC_THREADS threads.
KERNEL_BOUNDS(glmf_mhc_pre, MHCPreArgs, MHC_THREADS, 2) {
  i64 HD = a.p.H * a.p.D;
  const float* x = a.x;
  i64 D = a.p.D;
  mhc_proj(a.p, a.part, a.T, [&](i64 t, i64 j, i64 d) { return x[t * HD + j * D + d]; }, [](i64, i64, i64, float) {});
}

// glmf_mhc_pre for T < MHC_TT tokens: grid (⌈nch/MHC_TT⌉, ⌈mix/MHC_RS⌉, T).
KERNEL_BOUNDS(glmf_mhc_pre_tok, MHCPreArgs, MHC_THREADS, 2) {
  i64 HD = a.p.H * a.p.D;
  const float* x = a.x;
  i64 D = a.p.D;
  mhc_proj_tok(
      a.p, a.part, [&](i64 t, i64 j, i64 d) { return x[t * HD + j * D + d]; }, [](i64, i64, i64, float) {},
      [&](i64 t, i64 j, i64 d0, float* v) { return ld8(x + t * HD + j * D + d0, v); });
}

struct MHCPostPreArgs {
  MHCParams p;
  const float* o; const float* R; const float* post; const float* comb;  // this site
  float* out; double* part;                                               // next site's streams, stage-1 sums
  i64 T;
};
// The post of this site (out = the new streams) and stage 1 of the next
// site's pre on them: grid (nch, ⌈T/MHC_TT⌉), MHC_THREADS threads.
KERNEL_BOUNDS(glmf_mhc_post_pre, MHCPostPreArgs, MHC_THREADS, 2) {
  i64 H = a.p.H, D = a.p.D, HD = H * D;
  mhc_proj(
      a.p, a.part, a.T,
      [&](i64 t, i64 j, i64 d) { return mhc_post_elem(H, D, j, d, a.o + t * D, a.R + t * HD, a.post + t * H, a.comb + t * H * H); },
      [&](i64 t, i64 j, i64 d, float v) { a.out[t * HD + j * D + d] = v; });
}

// glmf_mhc_post_pre for T < MHC_TT tokens: grid (⌈nch/MHC_TT⌉,
// ⌈mix/MHC_RS⌉, T); row group 0 writes the streams.
KERNEL_BOUNDS(glmf_mhc_post_pre_tok, MHCPostPreArgs, MHC_THREADS, 2) {
  i64 H = a.p.H, D = a.p.D, HD = H * D;
  mhc_proj_tok(
      a.p, a.part,
      [&](i64 t, i64 j, i64 d) { return mhc_post_elem(H, D, j, d, a.o + t * D, a.R + t * HD, a.post + t * H, a.comb + t * H * H); },
      [&](i64 t, i64 j, i64 d, float v) { a.out[t * HD + j * D + d] = v; },
      [&](i64 t, i64 j, i64 d0, float* v) {
        // mhc_post_elem over 8 consecutive d, its loads as vectors (for
        // H ≤ MHC_PF_H every one in flight at once)
        float ov[8], rv[8];
        const float* Rt = a.R + t * HD + d0;
        const float* cm = a.comb + t * H * H;
        if ((((u64)(a.o + t * D + d0) | (u64)Rt) & 15) || (D & 3)) return false;
        if (H <= MHC_PF_H) {
          float rs[MHC_PF_H][8], cs[MHC_PF_H];
#pragma unroll
          for (int i = 0; i < MHC_PF_H; i++)
            if (i < H) ld8(Rt + i * D, rs[i]), cs[i] = cm[i * H + j];
          ld8(a.o + t * D + d0, ov);
          float pj = a.post[t * H + j];
#pragma unroll
          for (int e = 0; e < 8; e++) v[e] = pj * ov[e];
#pragma unroll
          for (int i = 0; i < MHC_PF_H; i++)
            if (i < H) {
#pragma unroll
              for (int e = 0; e < 8; e++) v[e] += cs[i] * rs[i][e];
            }
          return true;
        }
        ld8(a.o + t * D + d0, ov);
        float pj = a.post[t * H + j];
#pragma unroll
        for (int e = 0; e < 8; e++) v[e] = pj * ov[e];
        for (i64 i = 0; i < H; i++) {
          ld8(Rt + i * D, rv);
          float ci = cm[i * H + j];
#pragma unroll
          for (int e = 0; e < 8; e++) v[e] += ci * rv[e];
        }
        return true;
      });
}

struct MHCMixArgs {
  MHCParams p; const float* x; const double* part;  // streams [T][H·D], stage-1 sums
  float* h; float* post; float* comb;               // outputs
  const void* norm_w; i64 norm_bf16; double norm_eps;  // optional RMSNorm of h
  i64 T;
};
// Stage 2 of the pre: grid (T, 2), MHC_THREADS threads. Block (t, 0)
// collapses token t's streams into h by the pre gates (then the optional
// RMSNorm); block (t, 1) computes its post gates and the Sinkhorn-projected
// comb. The two run side by side, so the Sinkhorn's serial iterations do
// not delay h (the sub-layer waits for both; the comb is needed only by
// the post). h's block holds a token's streams in registers from its
// start (their loads arrive while the partial sums are added): about 160
// registers a thread, so one block an SM.
KERNEL_BOUNDS(glmf_mhc_mix, MHCMixArgs, MHC_THREADS, 1) {
  __shared__ double dot_s[MHC_MAX_MIX + 1];
  __shared__ float m_s[MHC_MAX_MIX];
  __shared__ float pre_s[MHC_MAX_H];
  __shared__ float post_s[MHC_MAX_H];
  __shared__ float comb_s[MHC_MAX_H * MHC_MAX_H];
  __shared__ double combw_s[MHC_MAX_H * MHC_MAX_H];  // mhc_mapping's double Sinkhorn
  i64 t = blockIdx.x;
  if (t >= a.T) return;
  const MHCParams& p = a.p;
  bool gates = blockIdx.y == 1;  // this block: post and comb, not h
  i64 H = p.H, D = p.D, HD = H * D, mix = (2 + H) * H, PW = mix + 1;
  i64 dc = mhc_dc(H), nch = (D + dc - 1) / dc;
  const double* P = a.part + t * nch * PW;
  int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const float* x = a.x + t * HD;
  float* h = a.h + t * D;
  bool regs = D <= MHC_HD * MHC_THREADS;  // every h value stays in a register
  bool pf = !gates && regs && H <= MHC_PF_H;
  // h's block: the streams (H ≤ MHC_PF_H, D ≤ MHC_HD·MHC_THREADS) into
  // registers now, every load in flight at once; they arrive while the
  // partial sums are added
  float xr[MHC_PF_H][MHC_HD];
  if (pf && H == MHC_PF_H && D == MHC_HD * MHC_THREADS) {  // the model's shape: no bounds
#pragma unroll
    for (int i = 0; i < MHC_PF_H; i++)
#pragma unroll
      for (int q = 0; q < MHC_HD; q++) xr[i][q] = x[i * (MHC_HD * MHC_THREADS) + tid + q * MHC_THREADS];
  } else if (pf) {
#pragma unroll
    for (int i = 0; i < MHC_PF_H; i++)
#pragma unroll
      for (int q = 0; q < MHC_HD; q++) {
        int d = tid + q * MHC_THREADS;
        xr[i][q] = i < H && d < D ? x[i * D + d] : 0.f;
      }
  }
  // the mapping's parameters (as floats), also loaded now into registers
  // and stored to shared memory once the partial sums' loads are issued
  // (the sums' barriers publish them)
  __shared__ float sc_s[3];
  __shared__ float bs_s[MHC_MAX_MIX];
  float bsv = tid < mix ? ldw(p.base, tid, p.base_bf16) : 0.f, scv = tid < 3 ? ldw(p.scale, tid, p.scale_bf16) : 0.f;
  for (i64 i = tid + MHC_THREADS; i < mix; i += MHC_THREADS) bs_s[i] = ldw(p.base, i, p.base_bf16);  // hc_mult > 15
  // the rows this block needs: h's block the pre's H rows and the sum of
  // squares (row mix), the gates' block every row (k = row)
  i64 nr = gates ? PW : H + 1;
  // the chunks' partial sums: warp w adds chunks w, w+8, ... (lane = row),
  // then the 8 warps' sums in a fixed tree
  __shared__ double red_s[MHC_THREADS / 32][32];
  for (i64 k0 = 0; k0 < nr; k0 += 32) {
    i64 k = k0 + lane, i = gates || k < H ? k : mix;
    double acc = 0;
    if (k < nr) {
      // MHC_MIX_BATCH chunks' loads in flight at once, added in order
      const int W = MHC_THREADS / 32;
      for (i64 c0 = warp; c0 < nch; c0 += MHC_MIX_BATCH * W) {
        double v[MHC_MIX_BATCH];
#pragma unroll
        for (int b = 0; b < MHC_MIX_BATCH; b++) v[b] = c0 + b * W < nch ? P[(c0 + b * W) * PW + i] : 0.0;
#pragma unroll
        for (int b = 0; b < MHC_MIX_BATCH; b++)
          if (c0 + b * W < nch) acc += v[b];
      }
    }
    red_s[warp][lane] = acc;
    if (k0 == 0) {
      if (tid < mix) bs_s[tid] = bsv;
      if (tid < 3) sc_s[tid] = scv;
    }
    __syncthreads();
    if (warp == 0 && k < nr) {
      double (*q)[32] = red_s;
      dot_s[i] = ((q[0][lane] + q[1][lane]) + (q[2][lane] + q[3][lane])) + ((q[4][lane] + q[5][lane]) + (q[6][lane] + q[7][lane]));
    }
    __syncthreads();
  }
  // the CPU's mean of squares and square root, in double
  float r = (float)(1.0 / sqrt(dot_s[mix] / (double)HD + (double)(float)p.norm_eps));
  if (gates) {
    for (i64 i = tid; i < mix; i += MHC_THREADS) m_s[i] = (float)dot_s[i] * r;
    __syncthreads();
    float* post = a.post + t * H;
    float* comb = a.comb + t * H * H;
    if (H * H <= 32) {
      if (warp == 0) switch (H) {
          case 1: mhc_comb_warp<1>(p, sc_s, bs_s, m_s, post, comb); break;
          case 2: mhc_comb_warp<2>(p, sc_s, bs_s, m_s, post, comb); break;
          case 3: mhc_comb_warp<3>(p, sc_s, bs_s, m_s, post, comb); break;
          case 4: mhc_comb_warp<4>(p, sc_s, bs_s, m_s, post, comb); break;
          default: mhc_comb_warp<5>(p, sc_s, bs_s, m_s, post, comb); break;
        }
      return;
    }
    mhc_mapping(p, sc_s, bs_s, m_s, pre_s, post_s, combw_s, comb_s);  // ends with a barrier
    for (i64 i = tid; i < H; i += MHC_THREADS) post[i] = post_s[i];
    for (i64 i = tid; i < H * H; i += MHC_THREADS) comb[i] = comb_s[i];
    return;
  }
  // the pre gates (mhc_mapping's expression)
  if (tid < H) pre_s[tid] = (float)(sigmoid_dd((double)(sc_s[0] * ((float)dot_s[tid] * r) + bs_s[tid])) + mhc_eps(p));
  __syncthreads();
  // h = Σ_i pre[i]·x[i] (ascending i, as the CPU), MHC_HD values of d
  // per thread at a time so that their loads are in flight together; the
  // optional RMSNorm is rmsnorm_row's arithmetic (per-thread squares in
  // ascending d, block_sum's tree) on the values in registers.
  float ss = 0;
  float hv[MHC_HD];
  for (i64 d0 = 0; d0 < D; d0 += MHC_HD * MHC_THREADS) {
#pragma unroll
    for (int q = 0; q < MHC_HD; q++) hv[q] = 0;
    if (pf) {
#pragma unroll
      for (int i = 0; i < MHC_PF_H; i++) {
        if (i >= H) break;
        float pw = pre_s[i];
#pragma unroll
        for (int q = 0; q < MHC_HD; q++) hv[q] += pw * xr[i][q];
      }
    } else {
#pragma unroll 4
      for (i64 i = 0; i < H; i++) {
        float pw = pre_s[i];
        const float* xi = x + i * D + d0 + tid;
#pragma unroll
        for (int q = 0; q < MHC_HD; q++)
          if (d0 + tid + q * MHC_THREADS < D) hv[q] += pw * xi[q * MHC_THREADS];
      }
    }
#pragma unroll
    for (int q = 0; q < MHC_HD; q++) {
      i64 d = d0 + tid + q * MHC_THREADS;
      if (d < D) {
        if (!a.norm_w || !regs) h[d] = hv[q];
        ss += hv[q] * hv[q];
      }
    }
  }
  if (!a.norm_w) return;
  if (!regs) {
    __syncthreads();
    rmsnorm_row(h, h, D, a.norm_w, a.norm_bf16, (float)a.norm_eps);
    return;
  }
  // the norm's weights load during the block sum (and all before any store
  // to h, which the compiler cannot tell from them)
  float nw[MHC_HD];
  ldw_n<MHC_HD>(a.norm_w, a.norm_bf16, tid, MHC_THREADS, D, nw);
  ss = block_sum(ss);
  float rn = (float)(1.0 / sqrt((double)(ss / (float)D + (float)a.norm_eps)));
#pragma unroll
  for (int q = 0; q < MHC_HD; q++) {
    i64 d = tid + q * MHC_THREADS;
    if (d < D) h[d] = nw[q] * (hv[q] * rn);
  }
}
