// mHC (manifold-constrained hyper-connections): pre (mixing logits,
// Sinkhorn-projected combiner, stream collapse), post (expand), and the
// fused post + next pre (+ RMSNorm). The fused kernel runs the same device
// functions as the unfused kernels, so both paths give identical bits.
#include "common.cuh"

// Largest stream count the kernels hold in shared memory (the backend
// refuses larger hc_mult).
#define MHC_MAX_H 16
#define MHC_MAX_MIX ((2 + MHC_MAX_H) * MHC_MAX_H)
// Mixing rows a block sums at once (hc_mult 4 has (2+4)·4 = 24), rows
// reduced at once (MHC_ROWS is a multiple), and the most threads a block
// has.
#define MHC_ROWS 24
#define MHC_RED 8
#define MHC_MAX_THREADS 256

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

// mhc_pre_row: one token's pre over its streams x [H·D], by the block
// (at most 256 threads): h [D], post [H], comb [H·H].
DEVFN void mhc_pre_row(const MHCParams& p, const float* x, float* h, float* post, float* comb) {
  __shared__ float m_s[MHC_MAX_MIX];
  __shared__ float pre_s[MHC_MAX_H];
  __shared__ float post_s[MHC_MAX_H];
  __shared__ float comb_s[MHC_MAX_H * MHC_MAX_H];
  i64 H = p.H, D = p.D, HD = H * D, mix = (2 + H) * H;
  float r = rms_inv(x, HD, (float)p.norm_eps);
  // The mixing logits m = fn·x: each thread sums its k (k ≡ tid mod the
  // block) for MHC_ROWS rows at once, so MHC_ROWS independent weight loads
  // are in flight per k (a row per warp kept every load on one serial
  // chain: about 70 µs per token on an H200); the block then adds the
  // threads' partial sums per row. Products are exact in double (float ×
  // bf16), sums in double, rounded once.
  __shared__ double part_s[MHC_RED][MHC_MAX_THREADS];
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
  for (i64 i0 = 0; i0 < mix; i0 += MHC_ROWS) {
    i64 nr = mix - i0 < MHC_ROWS ? mix - i0 : MHC_ROWS;
    double acc[MHC_ROWS];  // registers: every index below is a constant after unrolling
#pragma unroll
    for (int j = 0; j < MHC_ROWS; j++) acc[j] = 0;
    if (nr == MHC_ROWS) {
      for (i64 k = threadIdx.x; k < HD; k += blockDim.x) {
        double xv = (double)x[k];
#pragma unroll
        for (int j = 0; j < MHC_ROWS; j++) acc[j] += xv * (double)ldw(p.fn, (i0 + j) * HD + k, p.fn_bf16);
      }
    } else {
      for (i64 k = threadIdx.x; k < HD; k += blockDim.x) {
        double xv = (double)x[k];
#pragma unroll
        for (int j = 0; j < MHC_ROWS; j++)
          if (j < nr) acc[j] += xv * (double)ldw(p.fn, (i0 + j) * HD + k, p.fn_bf16);
      }
    }
    // the threads' partial sums, MHC_RED rows at a time through shared
    // memory, a warp per row
#pragma unroll
    for (int g = 0; g < MHC_ROWS; g += MHC_RED) {
#pragma unroll
      for (int j = 0; j < MHC_RED; j++) part_s[j][threadIdx.x] = acc[g + j];
      __syncthreads();
      for (int j = warp; j < MHC_RED; j += nw) {
        double d = 0;
        for (int l = lane; l < (int)blockDim.x; l += 32) d += part_s[j][l];
        d = warp_sum_d(d);
        if (lane == 0 && g + j < nr) m_s[i0 + g + j] = (float)d * r;
      }
      __syncthreads();
    }
  }
  mhc_mapping(p, m_s, pre_s, post_s, comb_s);  // ends with a barrier
  for (i64 i = threadIdx.x; i < H; i += blockDim.x) post[i] = post_s[i];
  for (i64 i = threadIdx.x; i < H * H; i += blockDim.x) comb[i] = comb_s[i];
  for (i64 d = threadIdx.x; d < D; d += blockDim.x) {
    float v = 0;
    for (i64 i = 0; i < H; i++) v += pre_s[i] * x[i * D + d];
    h[d] = v;
  }
  __syncthreads();
}

// mhc_post_elem: one element of the expanded streams:
// out[j][d] = post[j]·o[d] + Σ_i comb[i][j]·R[i][d].
DEVFN float mhc_post_elem(i64 H, i64 D, i64 j, i64 d, const float* o, const float* R, const float* post, const float* comb) {
  float v = post[j] * o[d];
  for (i64 i = 0; i < H; i++) v += comb[i * H + j] * R[i * D + d];
  return v;
}

struct MHCPreArgs {
  MHCParams p; const float* x; float* h; float* post; float* comb; i64 T;
};
// One block (256 threads) per token.
KERNEL(glmf_mhc_pre, MHCPreArgs) {
  i64 t = blockIdx.x;
  if (t >= a.T) return;
  i64 H = a.p.H, D = a.p.D;
  mhc_pre_row(a.p, a.x + t * H * D, a.h + t * D, a.post + t * H, a.comb + t * H * H);
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

struct MHCPostPreArgs {
  MHCParams p;
  const float* o; const float* R; const float* post; const float* comb;  // this site
  float* out; float* h; float* post2; float* comb2;                       // next site
  const void* norm_w; i64 norm_bf16; double norm_eps;                     // optional
  i64 T;
};
// One block (256 threads) per token: post, then the next pre on the streams
// just written, then the optional RMSNorm of h.
KERNEL(glmf_mhc_post_pre, MHCPostPreArgs) {
  i64 t = blockIdx.x;
  if (t >= a.T) return;
  i64 H = a.p.H, D = a.p.D, HD = H * D;
  float* out = a.out + t * HD;
  for (i64 i = threadIdx.x; i < HD; i += blockDim.x)
    out[i] = mhc_post_elem(H, D, i / D, i % D, a.o + t * D, a.R + t * HD, a.post + t * H, a.comb + t * H * H);
  __syncthreads();
  float* h = a.h + t * D;
  mhc_pre_row(a.p, out, h, a.post2 + t * H, a.comb2 + t * H * H);
  if (a.norm_w) rmsnorm_row(h, h, D, a.norm_w, a.norm_bf16, (float)a.norm_eps);
}
