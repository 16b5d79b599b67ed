// Dense ops: embedding, norms, elementwise activations, stream mean, row
// selection, sequence lengths.
#include "common.cuh"

// embed: out[t][s][d] = W[ids[t]][d] for s < H.
struct EmbedArgs {
  const int* ids; const void* w; i64 w_bf16;
  float* out; i64 T, H, D;
};
KERNEL(glmf_embed, EmbedArgs) {
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= a.T * a.D) return;
  i64 t = i / a.D, d = i % a.D;
  float v = ldw(a.w, (i64)a.ids[t] * a.D + d, a.w_bf16);
  for (i64 s = 0; s < a.H; s++) a.out[(t * a.H + s) * a.D + d] = v;
}

struct NormArgs {
  const float* x; const void* w; i64 w_bf16; const void* b; i64 b_bf16;
  float* y; i64 rows, D; double eps;
};
// One block per row.
KERNEL(glmf_rmsnorm, NormArgs) {
  i64 r = blockIdx.x;
  if (r >= a.rows) return;
  rmsnorm_row(a.y + r * a.D, a.x + r * a.D, a.D, a.w, a.w_bf16, (float)a.eps);
}

KERNEL(glmf_layernorm, NormArgs) {
  i64 r = blockIdx.x;
  if (r >= a.rows) return;
  const float* x = a.x + r * a.D;
  float* y = a.y + r * a.D;
  float s = 0;
  for (i64 i = threadIdx.x; i < a.D; i += blockDim.x) s += x[i];
  float mean = block_sum(s) / (float)a.D;
  float v = 0;
  for (i64 i = threadIdx.x; i < a.D; i += blockDim.x) {
    float d = x[i] - mean;
    v += d * d;
  }
  v = block_sum(v);
  float rs = (float)(1.0 / sqrt((double)(v / (float)a.D + (float)a.eps)));
  for (i64 i = threadIdx.x; i < a.D; i += blockDim.x)
    y[i] = (x[i] - mean) * rs * ldw(a.w, i, a.w_bf16) + ldw(a.b, i, a.b_bf16);
}

// gated_rmsnorm: per (token, head) row of Dh: y = o/rms(o) ⊙ w ⊙ sigmoid(g),
// one weight vector [Dh] shared by all heads. One block per row.
struct GatedNormArgs {
  const float* o; const float* g; const void* w; i64 w_bf16;
  float* y; i64 rows, Dh; double eps;
};
KERNEL(glmf_gated_rmsnorm, GatedNormArgs) {
  i64 r = blockIdx.x;
  if (r >= a.rows) return;
  const float* o = a.o + r * a.Dh;
  const float* g = a.g + r * a.Dh;
  float inv = rms_inv(o, a.Dh, (float)a.eps);
  for (i64 i = threadIdx.x; i < a.Dh; i += blockDim.x)
    a.y[r * a.Dh + i] = ldw(a.w, i, a.w_bf16) * (o[i] * inv) * sigmoidf_d(g[i]);
}

// Elementwise ops over n elements: op 0 sigmoid(x), 1 x+y,
// 2 swiglu: silu(min(x,limit))·clamp(y,±limit) (limit ≤ 0: no clamp).
struct EltArgs {
  const float* x; const float* y; float* out; i64 n, op; double limit;
};
KERNEL(glmf_elementwise, EltArgs) {
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= a.n) return;
  switch (a.op) {
  case 0: a.out[i] = sigmoidf_d(a.x[i]); break;
  case 1: a.out[i] = a.x[i] + a.y[i]; break;
  case 2: a.out[i] = swiglu_clamped(a.x[i], a.y[i], a.limit); break;
  }
}

// stream_mean: y[t][d] = (Σ_h X[t][h][d]) · (1/H).
struct StreamMeanArgs { const float* x; float* y; i64 T, H, D; };
KERNEL(glmf_stream_mean, StreamMeanArgs) {
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= a.T * a.D) return;
  i64 t = i / a.D, d = i % a.D;
  float s = 0;
  for (i64 h = 0; h < a.H; h++) s += a.x[(t * a.H + h) * a.D + d];
  a.y[i] = s * (1.0f / (float)a.H);
}

// rows_gather: y[i] = x[rows[i]] for R rows of width D.
struct GatherArgs { const float* x; const int* rows; float* y; i64 R, D; };
KERNEL(glmf_gather_rows, GatherArgs) {
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= a.R * a.D) return;
  i64 r = i / a.D, d = i % a.D;
  a.y[i] = a.x[(i64)a.rows[r] * a.D + d];
}

// seq_lengths: the device copy of every sequence's token count (poison adds
// 1+i, so tests can prove a graph never reads it).
struct SeqLenArgs { BatchMeta m; int* out; i64 poison; };
KERNEL(glmf_seq_lengths, SeqLenArgs) {
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= a.m.S) return;
  a.out[i] = a.m.seq_n[i] + (a.poison ? (int)(1 + i) : 0);
}

// split_cols: scatter the columns of x [R][N] into outputs: columns
// [off_j, off_j+w_j) go to out_j [R][w_j] (at most 8 outputs).
struct SplitArgs {
  const float* x; i64 R, N, nout;
  float* out[8]; i64 w[8];
};
KERNEL(glmf_split_cols, SplitArgs) {
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= a.R * a.N) return;
  i64 r = i / a.N, c = i % a.N, off = 0;
  for (i64 j = 0; j < a.nout; j++) {
    if (c < off + a.w[j]) {
      a.out[j][r * a.w[j] + (c - off)] = a.x[i];
      return;
    }
    off += a.w[j];
  }
}

// to_bf16: out[i] = bf16(x[i]) (round to nearest even): GEMM inputs of the
// bf16 precision mode.
struct ToBF16Args { const float* x; u16* out; i64 n; };
KERNEL(glmf_to_bf16, ToBF16Args) {
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= a.n) return;
  a.out[i] = (u16)(__float_as_uint(bf16_round(a.x[i])) >> 16);
}
