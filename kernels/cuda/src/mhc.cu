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
//  2. glmf_mhc_mix: a block per token adds the chunks' partials (warp w
//     the chunks ≡ w mod 8, then a fixed tree), scales by the RMS, runs the sigmoid gates and the Sinkhorn
//     projection, collapses the streams into h and applies the optional
//     RMSNorm of h.
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
#if MHC_THREADS != 256 || MHC_CK != MHC_THREADS || MHC_CK / MHC_KT != MHC_THREADS / 32 * MHC_SLW || MHC_TT * MHC_SLW != 32
#error "mhc_proj and glmf_mhc_mix assume 8 warps, a thread per chunk value when staging, and a warp per slice group of every tile token"
#endif
// h values a thread of glmf_mhc_mix holds at once (D up to 16·256 = 4096
// stays in registers for the RMSNorm).
#define MHC_HD 16
// Streams glmf_mhc_mix prefetches into registers (hc_mult ≤ 4).
#define MHC_PF_H 4

struct MHCParams {
  const void* fn; i64 fn_bf16;        // [(2+H)·H][H·D]
  const void* base; i64 base_bf16;    // [(2+H)·H]
  const void* scale; i64 scale_bf16;  // [3]
  i64 H, D, iters;
  double norm_eps, hc_eps;
};

// mhc_mapping turns the RMS-scaled mixing logits m into pre, post and the
// Sinkhorn-projected comb (row i = source stream, column j = destination),
// exactly as kernels/mhc.Mapping. Called by the whole block: thread i < H
// owns stream i's pre and post, row i in the softmax and the row passes,
// and column i in the column passes, each computed in the serial order of
// the CPU kernel (so the bits are the one-thread result's).
DEVFN void mhc_mapping(const MHCParams& p, const float* m, float* pre, float* post, float* comb) {
  i64 H = p.H, i = threadIdx.x;
  float eps = (float)p.hc_eps;
  if (i < H) {
    float s0 = ldw(p.scale, 0, p.scale_bf16), s1 = ldw(p.scale, 1, p.scale_bf16), s2 = ldw(p.scale, 2, p.scale_bf16);
    pre[i] = sigmoidf_d(s0 * m[i] + ldw(p.base, i, p.base_bf16)) + eps;
    post[i] = 2 * sigmoidf_d(s1 * m[H + i] + ldw(p.base, H + i, p.base_bf16));
    float* row = comb + i * H;
    float mx = -INFINITY;
    for (i64 j = 0; j < H; j++) {
      row[j] = s2 * m[2 * H + i * H + j] + ldw(p.base, 2 * H + i * H + j, p.base_bf16);
      if (row[j] > mx) mx = row[j];
    }
    float s = 0;
    for (i64 j = 0; j < H; j++) {
      row[j] = (float)exp((double)(row[j] - mx));
      s += row[j];
    }
    for (i64 j = 0; j < H; j++) row[j] = row[j] / s + eps;
  }
  __syncthreads();
  i64 iters = p.iters < 1 ? 1 : p.iters;  // the first column pass always runs
  for (i64 it = 0; it < iters; it++) {
    if (it > 0) {
      if (i < H) {
        float s = 0;
        for (i64 j = 0; j < H; j++) s += comb[i * H + j];
        for (i64 j = 0; j < H; j++) comb[i * H + j] /= s + eps;
      }
      __syncthreads();
    }
    if (i < H) {
      i64 j = i;
      float s = 0;
      for (i64 r = 0; r < H; r++) s += comb[r * H + j];
      for (i64 r = 0; r < H; r++) comb[r * H + j] /= s + eps;
    }
    __syncthreads();
  }
}

// mhc_mapping_warp: mhc_mapping by warp 0 alone where H·H ≤ 32, with no
// block barriers: lane l = i·H + j owns comb[i][j]; each pass reads the
// row's or column's values from one shared buffer, adds them in the CPU's
// order (so the bits are mhc_mapping's) and writes the other buffer, one
// __syncwarp per pass. The whole warp calls it; the caller synchronizes
// the block before reading pre, post and comb.
DEVFN void mhc_mapping_warp(const MHCParams& p, const float* m, float* pre, float* post, float* comb) {
  __shared__ float cb_s[2][MHC_MAX_H * MHC_MAX_H];
  int H = (int)p.H, l = threadIdx.x;
  bool own = l < H * H;
  int i = own ? l / H : 0, j = own ? l % H : 0;
  float eps = (float)p.hc_eps;
  if (l < H) {
    float s0 = ldw(p.scale, 0, p.scale_bf16), s1 = ldw(p.scale, 1, p.scale_bf16);
    pre[l] = sigmoidf_d(s0 * m[l] + ldw(p.base, l, p.base_bf16)) + eps;
    post[l] = 2 * sigmoidf_d(s1 * m[H + l] + ldw(p.base, H + l, p.base_bf16));
  }
  float s2 = ldw(p.scale, 2, p.scale_bf16);
  float c = 0;
  if (own) cb_s[0][l] = c = s2 * m[2 * H + l] + ldw(p.base, 2 * H + l, p.base_bf16);
  __syncwarp();
  float mx = -INFINITY;
  for (int jj = 0; jj < H; jj++) {
    float v = cb_s[0][i * H + jj];
    if (v > mx) mx = v;
  }
  c = (float)exp((double)(c - mx));
  if (own) cb_s[1][l] = c;
  __syncwarp();
  float s = 0;
  for (int jj = 0; jj < H; jj++) s += cb_s[1][i * H + jj];
  c = c / s + eps;
  int b = 0;  // the buffer c goes to
  if (own) cb_s[b][l] = c;
  __syncwarp();
  i64 iters = p.iters < 1 ? 1 : p.iters;  // the first column pass always runs
  for (i64 it = 0; it < iters; it++) {
    if (it > 0) {
      s = 0;
      for (int jj = 0; jj < H; jj++) s += cb_s[b][i * H + jj];
      c /= s + eps;
      b ^= 1;
      if (own) cb_s[b][l] = c;
      __syncwarp();
    }
    s = 0;
    for (int ii = 0; ii < H; ii++) s += cb_s[b][ii * H + j];
    c /= s + eps;
    b ^= 1;
    if (own) cb_s[b][l] = c;
    __syncwarp();
  }
  if (own) comb[l] = c;
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
template <class XVal>
DEVFN void mhc_proj(const MHCParams& p, double* part, i64 T, XVal xval) {
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
#pragma unroll
  for (int r = 0; r < MHC_RG; r++) wr[r] = kin && r < mix ? ldw(p.fn, r * HD + js * D + ds, p.fn_bf16) : 0.f;
  // this thread's values (zeros past the chunk, D or T: they add exact
  // zeros) and their sum of squares
  int tt = lane / MHC_SLW, sl = warp * MHC_SLW + lane % MHC_SLW;
  i64 t = t0 + tt;
  double xv[MHC_KT];
  double q = 0;
#pragma unroll
  for (int e = 0; e < MHC_KT; e++) {
    int kk = sl * MHC_KT + e, j = kk / dci;
    i64 d = c * dc + kk % dci;
    float v = t < T && j < H && d < D ? xval(t, j, d) : 0.f;
    xv[e] = v;
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
#pragma unroll
      for (int r = 0; r < MHC_RG; r++) wr[r] = kin && g1 + r < mix ? ldw(p.fn, (g1 + r) * HD + js * D + ds, p.fn_bf16) : 0.f;
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

struct MHCPreArgs {
  MHCParams p; const float* x; double* part; i64 T;
};
// Stage 1 of the pre on given streams x [T][H·D]: grid (nch, ⌈T/MHC_TT⌉),
// MHC_THREADS threads.
KERNEL_BOUNDS(glmf_mhc_pre, MHCPreArgs, MHC_THREADS, 2) {
  i64 HD = a.p.H * a.p.D;
  const float* x = a.x;
  i64 D = a.p.D;
  mhc_proj(a.p, a.part, a.T, [&](i64 t, i64 j, i64 d) { return x[t * HD + j * D + d]; });
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
  mhc_proj(a.p, a.part, a.T, [&](i64 t, i64 j, i64 d) {
    float v = mhc_post_elem(H, D, j, d, a.o + t * D, a.R + t * HD, a.post + t * H, a.comb + t * H * H);
    a.out[t * HD + j * D + d] = v;
    return v;
  });
}

struct MHCMixArgs {
  MHCParams p; const float* x; const double* part;  // streams [T][H·D], stage-1 sums
  float* h; float* post; float* comb;               // outputs
  const void* norm_w; i64 norm_bf16; double norm_eps;  // optional RMSNorm of h
  i64 T;
};
// Stage 2 of the pre: a block (MHC_THREADS threads) per token.
KERNEL_BOUNDS(glmf_mhc_mix, MHCMixArgs, MHC_THREADS, 2) {
  __shared__ double dot_s[MHC_MAX_MIX + 1];
  __shared__ float m_s[MHC_MAX_MIX];
  __shared__ float pre_s[MHC_MAX_H];
  __shared__ float post_s[MHC_MAX_H];
  __shared__ float comb_s[MHC_MAX_H * MHC_MAX_H];
  i64 t = blockIdx.x;
  if (t >= a.T) return;
  const MHCParams& p = a.p;
  i64 H = p.H, D = p.D, HD = H * D, mix = (2 + H) * H, PW = mix + 1;
  i64 dc = mhc_dc(H), nch = (D + dc - 1) / dc;
  const double* P = a.part + t * nch * PW;
  int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const float* x = a.x + t * HD;
  float* h = a.h + t * D;
  // the streams (H ≤ MHC_PF_H, D ≤ MHC_HD·MHC_THREADS) are loaded into
  // registers now, their latency hidden behind the sums and the mapping
  bool regs = D <= MHC_HD * MHC_THREADS;  // every h value stays in a register
  bool pf = regs && H <= MHC_PF_H;
  float xr[MHC_PF_H][MHC_HD];
  if (pf) {
#pragma unroll
    for (int i = 0; i < MHC_PF_H; i++)
#pragma unroll
      for (int q = 0; q < MHC_HD; q++) {
        i64 d = tid + q * MHC_THREADS;
        xr[i][q] = i < H && d < D ? x[i * D + d] : 0.f;
      }
  }
  // the chunks' partial sums: warp w adds chunks w, w+8, ... (lane = row),
  // then the 8 warps' sums in a fixed tree
  __shared__ double red_s[MHC_THREADS / 32][32];
  for (i64 i0 = 0; i0 < PW; i0 += 32) {
    i64 i = i0 + lane;
    double acc = 0;
    if (i < PW)
      for (i64 c = warp; c < nch; c += MHC_THREADS / 32) acc += P[c * PW + i];
    red_s[warp][lane] = acc;
    __syncthreads();
    if (warp == 0 && i < PW) {
      double (*q)[32] = red_s;
      dot_s[i] = ((q[0][lane] + q[1][lane]) + (q[2][lane] + q[3][lane])) + ((q[4][lane] + q[5][lane]) + (q[6][lane] + q[7][lane]));
    }
    __syncthreads();
  }
  // the CPU's float32 mean of squares, the square root in double
  float r = (float)(1.0 / sqrt((double)((float)dot_s[mix] / (float)HD + (float)p.norm_eps)));
  for (i64 i = threadIdx.x; i < mix; i += blockDim.x) m_s[i] = (float)dot_s[i] * r;
  __syncthreads();
  if (H * H <= 32) {
    if (threadIdx.x < 32) mhc_mapping_warp(p, m_s, pre_s, post_s, comb_s);
    __syncthreads();
  } else {
    mhc_mapping(p, m_s, pre_s, post_s, comb_s);  // ends with a barrier
  }
  for (i64 i = threadIdx.x; i < H; i += blockDim.x) a.post[t * H + i] = post_s[i];
  for (i64 i = threadIdx.x; i < H * H; i += blockDim.x) a.comb[t * H * H + i] = comb_s[i];
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
  ss = block_sum(ss);
  float rn = (float)(1.0 / sqrt((double)(ss / (float)D + (float)a.norm_eps)));
#pragma unroll
  for (int q = 0; q < MHC_HD; q++) {
    i64 d = tid + q * MHC_THREADS;
    if (d < D) h[d] = ldw(a.norm_w, d, a.norm_bf16) * (hv[q] * rn);
  }
}
