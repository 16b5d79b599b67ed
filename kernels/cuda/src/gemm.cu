// GEMMs y = x·Wᵀ with fp32 activations and bf16, fp32 or block-scaled fp8
// weights: a 64×64
// tiled kernel for many rows and a skinny kernel for few. This is the fp32
// parity mode: products and sums are formed in double and rounded once, so
// the result is the exactly rounded dot product whatever the GPU's FMA
// contraction would do to an fp32 sum (measured: fp32 FMA sums alone put a
// fixture case 1.04e-4 from transformers; double accumulation 7.4e-5). Both
// kernels sum every output in ascending k, so a row's result is the same
// whichever kernel and batch computed it. Both write split outputs (linear_split: column ranges to
// separate tensors) and batched groups (linear_batched: grid.z selects a
// group's input columns, weight slice and output). The tiled kernel also
// runs MoE expert GEMMs over a tile list (rows gathered through a
// permutation, gate and up fused with the clamped SwiGLU, down scaled by the
// routing weight and scattered to its slot).
#include "common.cuh"

struct GemmArgs {
  const float* A; i64 lda;      // A rows; row r at A + r*lda (+ g*a_goff)
  i64 a_goff;                   // column offset of group g's input
  const void* W; i64 w_type;    // W [N][K] (+ g*w_goff elements), stored as WT_F32/BF16/FP8
  i64 w_goff;
  const float* ws; i64 ws_ld;   // fp8: block scales [ceil(N/128)][ws_ld] (+ g*ws_goff)
  i64 ws_goff;
  const float* ws2;             // fp8: W2's block scales (same layout)
  const void* W2;               // second weight (MoE up); dual mode when set
  i64 M, N, K;
  i64 nout;                     // outputs: split by column, or per group
  float* out[8]; i64 ow[8];     // output j: pointer, width (its row stride)
  i64 batched;                  // 1: output = out[g] (width N), else split
  // MoE tile mode (tiles != 0): tiles[0] = count, then (expert, p0, rows)
  const int* tiles;
  const int* perm;              // perm[p] = routing slot (token*K + k)
  i64 a_div;                    // >0: A row = perm[p]/a_div; 0: A row = p
  const float* row_scale;       // down: scale by row_scale[perm[p]]
  float* scatter;               // down: write row perm[p] of scatter
  double limit;                 // SwiGLU clamp (dual mode)
  i64 a_round;                  // 1: round A to bf16 as it is read (bf16 precision)
};

DEVFN float* out_ptr(const GemmArgs& a, i64 g, i64 r, i64 c) {
  if (a.batched) return a.out[g] + r * a.N + c;
  i64 off = 0;
  for (i64 j = 0; j < a.nout; j++) {
    if (c < off + a.ow[j]) return a.out[j] + r * a.ow[j] + (c - off);
    off += a.ow[j];
  }
  return 0;
}

#define BM 64
#define BN 64
#define BK 16

// 256 threads; thread (tx, ty) computes rows ty*4..+3 and columns tx*4..+3
// of a 64×64 output tile.
KERNEL(glmf_gemm_tiled, GemmArgs) {
  __shared__ float As[BK][BM + 4];
  __shared__ float Ws[BK][BN + 4];
  __shared__ float W2s[BK][BN + 4];
  __shared__ int rowA[BM];
  __shared__ int rowP[BM];
  int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  i64 g = blockIdx.z;
  i64 n0 = (i64)blockIdx.x * BN;
  i64 rows, e = 0;
  i64 p0 = 0;
  const float* A = a.A + g * a.a_goff;
  if (a.tiles) {
    if ((i64)blockIdx.y >= (i64)a.tiles[0]) return;
    const int* tl = a.tiles + 1 + 3 * blockIdx.y;
    e = tl[0];
    p0 = tl[1];
    rows = tl[2];
  } else {
    p0 = (i64)blockIdx.y * BM;
    rows = a.M - p0;
    if (rows > BM) rows = BM;
    if (rows <= 0) return;
  }
  if (tid < BM) {
    i64 p = p0 + tid;
    int ra = 0, rp = 0;
    if (tid < rows) {
      if (a.tiles) {
        rp = a.perm[p];
        ra = a.a_div > 0 ? (int)(rp / a.a_div) : (int)p;
      } else {
        ra = (int)p;
        rp = (int)p;
      }
    }
    rowA[tid] = ra;
    rowP[tid] = rp;
  }
  i64 wg = a.tiles ? e : g;
  const char* Wb = (const char*)a.W;
  const char* W2b = (const char*)a.W2;
  i64 wsz = wt_size(a.w_type);
  const void* W = Wb + wg * a.w_goff * wsz;
  const void* W2 = a.W2 ? (const void*)(W2b + wg * a.w_goff * wsz) : 0;
  const float* ws = a.ws ? a.ws + wg * a.ws_goff : 0;
  const float* ws2 = a.ws2 ? a.ws2 + wg * a.ws_goff : 0;
  __syncthreads();
  double acc[4][4], acc2[4][4];
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 4; j++) acc[i][j] = 0, acc2[i][j] = 0;
  for (i64 k0 = 0; k0 < a.K; k0 += BK) {
    // load A: 64 rows × 16 k, 4 per thread
    for (int l = 0; l < 4; l++) {
      int idx = tid + l * 256;
      int r = idx / BK, kk = idx % BK;
      float v = 0;
      if (r < rows && k0 + kk < a.K) v = A[(i64)rowA[r] * a.lda + k0 + kk];
      As[kk][r] = a.a_round ? bf16_round(v) : v;
    }
    for (int l = 0; l < 4; l++) {
      int idx = tid + l * 256;
      int c = idx / BK, kk = idx % BK;
      float v = 0, v2 = 0;
      if (n0 + c < a.N && k0 + kk < a.K) {
        v = ldwt(W, a.w_type, ws, a.ws_ld, n0 + c, a.K, k0 + kk);
        if (W2) v2 = ldwt(W2, a.w_type, ws2, a.ws_ld, n0 + c, a.K, k0 + kk);
      }
      Ws[kk][c] = v;
      W2s[kk][c] = v2;
    }
    __syncthreads();
    for (int kk = 0; kk < BK; kk++) {
      float av[4], wv[4], w2v[4];
      for (int i = 0; i < 4; i++) av[i] = As[kk][ty * 4 + i];
      for (int j = 0; j < 4; j++) wv[j] = Ws[kk][tx * 4 + j];
      if (W2) {
        for (int j = 0; j < 4; j++) w2v[j] = W2s[kk][tx * 4 + j];
        for (int i = 0; i < 4; i++)
          for (int j = 0; j < 4; j++) acc2[i][j] += (double)av[i] * (double)w2v[j];
      }
      for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) acc[i][j] += (double)av[i] * (double)wv[j];
    }
    __syncthreads();
  }
  for (int i = 0; i < 4; i++) {
    int r = ty * 4 + i;
    if (r >= rows) continue;
    for (int j = 0; j < 4; j++) {
      i64 c = n0 + tx * 4 + j;
      if (c >= a.N) continue;
      float v = (float)acc[i][j];
      if (W2) {  // MoE gate/up: clamped SwiGLU, written in permuted order
        a.out[0][(p0 + r) * a.N + c] = swiglu_clamped(v, (float)acc2[i][j], a.limit);
      } else if (a.scatter) {  // MoE down: weighted, to the routing slot
        int s = rowP[r];
        a.scatter[(i64)s * a.N + c] = a.row_scale[s] * v;
      } else if (a.tiles) {
        a.out[0][(p0 + r) * a.N + c] = v;
      } else {
        float* o = out_ptr(a, g, p0 + r, c);
        if (o) *o = v;
      }
    }
  }
}

// Column GEMM for M ≤ 2 rows (decode at batch 1–2): one thread per output
// column for every row, streaming its weight row from memory 8 elements at
// a time (16-byte loads when the row is aligned) while the one or two
// activation rows are read through the cache, shared by all threads. Each
// output is summed in ascending k, in double, exactly as the tiled kernel
// does, so a row's result does not depend on how many rows the batch has or
// which kernel ran it (batch invariance). With more rows a thread's serial
// work grows and too few threads run: the skinny kernel below takes those.
// grid = (ceil(N/COL_THREADS), 1, groups).
#define COL_THREADS 64
KERNEL(glmf_gemm_col, GemmArgs) {
  i64 g = blockIdx.z;
  i64 c = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= a.N) return;
  const float* A = a.A + g * a.a_goff;
  i64 wsz = wt_size(a.w_type);
  const char* W = (const char*)a.W + g * a.w_goff * wsz;
  const float* ws = a.ws ? a.ws + g * a.ws_goff : 0;
  double acc[2] = {0, 0};
  i64 M = a.M, K = a.K;
  i64 k = 0;
  if (a.w_type == WT_BF16 && K % 8 == 0 && ((u64)(W + c * K * 2) & 15) == 0) {
    const uint4* wr = (const uint4*)(W + c * K * 2);
    for (; k < K; k += 8) {
      uint4 q = wr[k / 8];
      float w[8];
      unsigned u[4] = {q.x, q.y, q.z, q.w};
      for (int j = 0; j < 4; j++) {
        w[2 * j] = bf16f((u16)u[j]);
        w[2 * j + 1] = bf16f((u16)(u[j] >> 16));
      }
      for (int m = 0; m < 2; m++) {
        if (m >= M) break;
        const float* ar = A + m * a.lda + k;
        for (int j = 0; j < 8; j++) {
          float x = ar[j];
          if (a.a_round) x = bf16_round(x);
          acc[m] += (double)x * (double)w[j];
        }
      }
    }
  }
  for (; k < K; k++) {
    float w = ldwt(W, a.w_type, ws, a.ws_ld, c, K, k);
    for (int m = 0; m < 2; m++) {
      if (m >= M) break;
      float x = A[m * a.lda + k];
      if (a.a_round) x = bf16_round(x);
      acc[m] += (double)x * (double)w;
    }
  }
  for (int m = 0; m < 2; m++) {
    if (m >= M) break;
    float* o = out_ptr(a, g, m, c);
    if (o) *o = (float)acc[m];
  }
}

// Skinny GEMM for 3–8 rows (decode at batch 3–8): a block (256 threads)
// computes 32 columns × 8 rows, one output per thread, staging 64 k of the
// weight columns and the rows in shared memory (coalesced loads, the next
// tile's in flight while this one is summed). Each output is
// summed in ascending k, in double, like the other two kernels (batch
// invariance). grid = (ceil(N/32), 1, groups), 256 threads.
#define SK_BN 32
#define SK_BK 64
KERNEL(glmf_gemm_skinny, GemmArgs) {
  __shared__ float Ws[SK_BN][SK_BK + 1];
  __shared__ float As[8][SK_BK];
  int tid = threadIdx.x, c = tid % SK_BN, m = tid / SK_BN;
  i64 g = blockIdx.z;
  i64 n0 = (i64)blockIdx.x * SK_BN;
  const float* A = a.A + g * a.a_goff;
  i64 wsz = wt_size(a.w_type);
  const void* W = (const char*)a.W + g * a.w_goff * wsz;
  const float* ws = a.ws ? a.ws + g * a.ws_goff : 0;
  // each thread stages SK_W weights and SK_A activations of a tile; the
  // next tile's are loaded into registers while this one is summed
  const int SK_W = SK_BN * SK_BK / 256, SK_A = 8 * SK_BK / 256;
  float wn[SK_W], an[SK_A];
  auto load = [&](i64 k0) {
    for (int i = 0; i < SK_W; i++) {
      int l = tid + i * 256, cc = l / SK_BK, kk = l % SK_BK;
      wn[i] = (n0 + cc < a.N && k0 + kk < a.K) ? ldwt(W, a.w_type, ws, a.ws_ld, n0 + cc, a.K, k0 + kk) : 0;
    }
    for (int i = 0; i < SK_A; i++) {
      int l = tid + i * 256, mm = l / SK_BK, kk = l % SK_BK;
      float v = (mm < a.M && k0 + kk < a.K) ? A[mm * a.lda + k0 + kk] : 0;
      an[i] = a.a_round ? bf16_round(v) : v;
    }
  };
  double acc = 0;
  load(0);
  for (i64 k0 = 0; k0 < a.K; k0 += SK_BK) {
    for (int i = 0; i < SK_W; i++) {
      int l = tid + i * 256;
      Ws[l / SK_BK][l % SK_BK] = wn[i];
    }
    for (int i = 0; i < SK_A; i++) {
      int l = tid + i * 256;
      As[l / SK_BK][l % SK_BK] = an[i];
    }
    __syncthreads();
    if (k0 + SK_BK < a.K) load(k0 + SK_BK);
    i64 kn = a.K - k0 < SK_BK ? a.K - k0 : SK_BK;
    for (int kk = 0; kk < kn; kk++) acc += (double)As[m][kk] * (double)Ws[c][kk];
    __syncthreads();
  }
  if (m < a.M && n0 + c < a.N) {
    float* o = out_ptr(a, g, m, n0 + c);
    if (o) *o = (float)acc;
  }
}

// GEMV for few rows (≤ 8: decode, and MoE tiles of ≤ 8 rows): one warp per
// output column, its 32 lanes streaming the weight row in 16-byte loads
// (8 bf16 or 16 fp8 weights, one block scale per fp8 load) and reading the
// rows' activations through the cache; each lane sums its share of k and a
// butterfly of shuffles adds the 32 partial sums. Sums are in double in
// fp32 precision (the products are exact; only the order differs from the
// other kernels' ascending k, so results may differ from theirs in the
// last bit where a double sum lands on a float rounding boundary) and in
// fp32 with bf16-rounded activations in bf16 precision. The epilogues are
// the tiled kernel's: split or batched outputs, or a MoE tile's (dual
// gate/up with the clamped SwiGLU, or down scaled and scattered).
// grid = (ceil(N/GV_WARPS), tiles or 1, groups), GV_WARPS·32 threads.
#define GV_WARPS 8
#define GV_ROWS 8
template <typename ACC>
DEVFN void gemv_body(const GemmArgs& a) {
  int lane = threadIdx.x & 31;
  i64 c = (i64)blockIdx.x * GV_WARPS + (threadIdx.x >> 5);
  if (c >= a.N) return;  // the whole warp: lanes share the column
  i64 g = blockIdx.z, rows, p0 = 0, e = 0;
  if (a.tiles) {
    if ((i64)blockIdx.y >= (i64)a.tiles[0]) return;
    const int* tl = a.tiles + 1 + 3 * blockIdx.y;
    e = tl[0];
    p0 = tl[1];
    rows = tl[2];
  } else {
    rows = a.M;
  }
  if (rows > GV_ROWS) rows = GV_ROWS;
  const float* A = a.A + g * a.a_goff;
  const float* Ar[GV_ROWS];
  int rp[GV_ROWS];
  #pragma unroll
  for (int m = 0; m < GV_ROWS; m++) {
    rp[m] = 0;
    Ar[m] = A;
    if (m >= rows) continue;
    if (a.tiles) {
      rp[m] = a.perm[p0 + m];
      Ar[m] = A + (a.a_div > 0 ? (i64)(rp[m] / a.a_div) : p0 + m) * a.lda;
    } else {
      Ar[m] = A + m * a.lda;
    }
  }
  i64 wg = a.tiles ? e : g, K = a.K, t = a.w_type;
  i64 wsz = wt_size(t);
  const char* W = (const char*)a.W + (wg * a.w_goff + c * K) * wsz;
  const char* W2 = a.W2 ? (const char*)a.W2 + (wg * a.w_goff + c * K) * wsz : 0;
  const float* ws = a.ws ? a.ws + wg * a.ws_goff + (c >> 7) * a.ws_ld : 0;
  const float* ws2 = a.ws2 ? a.ws2 + wg * a.ws_goff + (c >> 7) * a.ws_ld : 0;
  bool round = a.a_round != 0;
  ACC acc[GV_ROWS], acc2[GV_ROWS];
  #pragma unroll
  for (int m = 0; m < GV_ROWS; m++) acc[m] = 0, acc2[m] = 0;
  // per = weights a lane takes from one 16-byte load
  i64 per = t == WT_FP8 ? 16 : t == WT_BF16 ? 8 : 4;
  bool vec = K % per == 0 && ((u64)W & 15) == 0 && (!W2 || ((u64)W2 & 15) == 0);
  i64 k0 = 0;
  if (vec) {
    for (k0 = lane * per; k0 < K; k0 += 32 * per) {
      float w[16], w2[16];
      uint4 q = *(const uint4*)(W + k0 * wsz);
      uint4 q2 = W2 ? *(const uint4*)(W2 + k0 * wsz) : q;
      unsigned u[4] = {q.x, q.y, q.z, q.w}, u2[4] = {q2.x, q2.y, q2.z, q2.w};
      if (t == WT_FP8) {
        float s = ws[k0 >> 7];
        #pragma unroll
        for (int j = 0; j < 16; j++) w[j] = fp8f((u[j / 4] >> (8 * (j % 4))) & 0xffu) * s;
        if (W2) {
          float s2 = ws2[k0 >> 7];
          #pragma unroll
          for (int j = 0; j < 16; j++) w2[j] = fp8f((u2[j / 4] >> (8 * (j % 4))) & 0xffu) * s2;
        }
      } else if (t == WT_BF16) {
        #pragma unroll
        for (int j = 0; j < 8; j++) w[j] = bf16f((u16)(u[j / 2] >> (16 * (j % 2))));
        if (W2)
          #pragma unroll
          for (int j = 0; j < 8; j++) w2[j] = bf16f((u16)(u2[j / 2] >> (16 * (j % 2))));
      } else {
        #pragma unroll
        for (int j = 0; j < 4; j++) w[j] = __uint_as_float(u[j]), w2[j] = __uint_as_float(u2[j]);
      }
      #pragma unroll
      for (int m = 0; m < GV_ROWS; m++) {
        if (m >= rows) break;
        const float* x = Ar[m] + k0;
        #pragma unroll
        for (int j = 0; j < 16; j++) {
          if (j >= per) break;
          float xv = round ? bf16_round(x[j]) : x[j];
          acc[m] += (ACC)xv * (ACC)w[j];
          if (W2) acc2[m] += (ACC)xv * (ACC)w2[j];
        }
      }
    }
  } else {
    const float* wsb = a.ws ? a.ws + wg * a.ws_goff : 0;
    const float* wsb2 = a.ws2 ? a.ws2 + wg * a.ws_goff : 0;
    const char* Wg = (const char*)a.W + wg * a.w_goff * wsz;
    const char* W2g = a.W2 ? (const char*)a.W2 + wg * a.w_goff * wsz : 0;
    for (i64 k = lane; k < K; k += 32) {
      float w = ldwt(Wg, t, wsb, a.ws_ld, c, K, k);
      float w2 = W2g ? ldwt(W2g, t, wsb2, a.ws_ld, c, K, k) : 0;
      #pragma unroll
      for (int m = 0; m < GV_ROWS; m++) {
        if (m >= rows) break;
        float xv = round ? bf16_round(Ar[m][k]) : Ar[m][k];
        acc[m] += (ACC)xv * (ACC)w;
        if (W2g) acc2[m] += (ACC)xv * (ACC)w2;
      }
    }
  }
  #pragma unroll
  for (int m = 0; m < GV_ROWS; m++) {
    if (m >= rows) break;
    for (int off = 16; off > 0; off >>= 1) {
      acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], off);
      if (W2) acc2[m] += __shfl_xor_sync(0xffffffffu, acc2[m], off);
    }
  }
  if (lane != 0) return;
  #pragma unroll
  for (int m = 0; m < GV_ROWS; m++) {
    if (m >= rows) break;
    float v = (float)acc[m];
    if (W2) {
      a.out[0][(p0 + m) * a.N + c] = swiglu_clamped(v, (float)acc2[m], a.limit);
    } else if (a.scatter) {
      int s = rp[m];
      a.scatter[(i64)s * a.N + c] = a.row_scale[s] * v;
    } else if (a.tiles) {
      a.out[0][(p0 + m) * a.N + c] = v;
    } else {
      float* o = out_ptr(a, g, m, c);
      if (o) *o = v;
    }
  }
}
KERNEL(glmf_gemv, GemmArgs) {
  if (a.a_round)
    gemv_body<float>(a);
  else
    gemv_body<double>(a);
}

// fp8_to_bf16: the bfloat16 (nearest even) of every dequantized weight of
// an fp8 matrix [N][K] (exact for power-of-two block scales), for the
// library GEMMs of precision bf16.
struct FP8ToBF16Args { const u8* W; const float* ws; i64 ws_ld; i64 N, K; u16* out; };
KERNEL(glmf_fp8_to_bf16, FP8ToBF16Args) {
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= a.N * a.K) return;
  i64 n = i / a.K, k = i % a.K;
  float v = fp8f(a.W[i]) * a.ws[(n >> 7) * a.ws_ld + (k >> 7)];
  a.out[i] = (u16)(__float_as_uint(bf16_round(v)) >> 16);
}
