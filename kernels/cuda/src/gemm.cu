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

// GEMV for few rows (≤ 8: decode, and MoE tiles of ≤ 8 rows), built to
// stream the weights at the memory roofline. A block of GV_WARPS warps
// computes GV_SLOTS weight rows ("slots": GV_SLOTS columns, or in dual mode
// GV_SLOTS/2 columns of W and the same of W2) for all the rows; its warps
// split K: lane l of warp w takes the chunks q = w·32 + l + i·GV_WARPS·32
// of PER consecutive k (one 16-byte load of a weight row: 8 bf16, 16 fp8,
// 4 fp32), streamed past L1, for every slot, and the rows' activations of
// that chunk in 16-byte loads through L1, so one activation load feeds
// every slot. Each lane sums its chunks in ascending k; the 32 lanes' sums
// are added by a fixed butterfly (xor 16, 8, 4, 2, 1; done as a
// reduce-scatter over the slots: the same sums), the warps' in ascending
// warp order through shared memory. So an output's bits depend on K and
// its own row and column only: not on the other rows (batch invariance),
// the row count's template, or whether the 16-byte or the scalar path
// (K not a multiple of PER, unaligned pointers: the same chunks, element
// by element) read it. Sums are in double in fp32 precision (the products
// are exact; only the order differs from the other kernels' ascending k)
// and in fp32 with bf16-rounded activations in bf16 precision. The
// epilogues are the tiled kernel's: split or batched outputs, or a MoE
// tile's (dual gate/up with the clamped SwiGLU, or down scaled and
// scattered). grid = (ceil(N/columns), tiles or 1, groups), GV_WARPS·32
// threads; columns = GV_SLOTS (/2 in dual mode), GV_SLOTS = 8 in bf16
// precision (float sums), 4 in fp32 precision (double sums) — see
// kc.GemvLaunch.
#define GV_WARPS 4
#define GV_ROWS 8

// 16 bytes of a weight row, read once: not kept in L1 (the activations
// are), with a 256-byte L2 prefetch (a warp reads 512 contiguous bytes).
DEVFN uint4 gv_ldw(const char* p) {
#if defined(GLMF_EMU) || __CUDA_ARCH__ < 800
  return *(const uint4*)p;
#else
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
#endif
}

// 16 bytes of activations (read-only for the kernel), through L1.
DEVFN uint4 gv_lda(const float* p) {
#ifdef GLMF_EMU
  return *(const uint4*)p;
#else
  uint4 r;
  asm("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
#endif
}

// bf16_round of two floats (one cvt.rn.bf16x2 on the GPU: the same
// nearest-even rounding; a NaN stays a NaN).
DEVFN void gv_round2(float& x, float& y) {
#if defined(GLMF_EMU) || __CUDA_ARCH__ < 800
  x = bf16_round(x);
  y = bf16_round(y);
#else
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(y), "f"(x));  // y → high half
  x = __uint_as_float(r << 16);
  y = __uint_as_float(r & 0xffff0000u);
#endif
}

// The four fp8 codes of word u dequantized with scale s: fp8f(code)·s,
// bit for bit. Code j's sign, exponent and mantissa are moved to a float's
// (an arithmetic shift puts the sign at bit 31 and the 7 other bits at
// 20–26), which is the value × 2^-120 exactly (subnormal codes too); one
// product with sf = s·2^120 (exact when s < 2^7) rounds as fp8f(code)·s
// does, else two products. NaN codes (0x7f, 0xff) are found per word.
DEVFN void gv_fp8x4(unsigned u, float s, float sf, bool fold, float* w) {
  #pragma unroll
  for (int j = 0; j < 4; j++) {
    float f = __uint_as_float((unsigned)((int)(u << (24 - 8 * j)) >> 4) & 0x87f00000u);
    w[j] = fold ? f * sf : (f * 0x1p120f) * s;
  }
  if (((u & 0x7f7f7f7fu) + 0x01010101u) & 0x80808080u) {
    #pragma unroll
    for (int j = 0; j < 4; j++)
      if (((u >> (8 * j)) & 0x7fu) == 0x7fu) w[j] = __uint_as_float(0x7fc00000u);
  }
}

// acc + x·w: a fused multiply-add in float sums, always (so that no
// compiler's contraction choices make one row-count's template round
// differently from another's); in double sums the product is exact.
DEVFN float gv_fma(float x, float w, float acc) { return fmaf(x, w, acc); }
DEVFN double gv_fma(float x, float w, double acc) { return acc + (double)x * (double)w; }

// gemv_rows: the rows of a GEMV block (glmf_gemv_*, glmf_gemv_mma_*):
// a MoE tile's (a.tiles: tile blockIdx.y's expert e, first slot row p0
// and row count) or all a.M rows (p0 = e = 0); false for a tile past the
// plan's count (nothing to do).
DEVFN bool gemv_rows(const GemmArgs& a, i64& rows, i64& p0, i64& e) {
  p0 = 0, e = 0, rows = a.M;
  if (!a.tiles) return true;
  if ((i64)blockIdx.y >= (i64)a.tiles[0]) return false;
  const int* tl = a.tiles + 1 + 3 * blockIdx.y;
  e = tl[0], p0 = tl[1], rows = tl[2];
  return true;
}

// gv_lanes_sum: a warp's butterfly over its lanes' S sums as a
// reduce-scatter; lane l then holds slot (l >> (5 - log2 S)) in acc[0].
template <typename ACC, int S>
DEVFN void gv_lanes_sum(ACC* acc, int lane) {
  int n = S;
  #pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    if (n > 1) {
      bool up = (lane & off) != 0;
      #pragma unroll
      for (int i = 0; i < n / 2; i++) {
        ACC keep = up ? acc[n / 2 + i] : acc[i];
        ACC send = up ? acc[i] : acc[n / 2 + i];
        acc[i] = keep + __shfl_xor_sync(0xffffffffu, send, off);
      }
      n /= 2;
    } else {
      acc[0] += __shfl_xor_sync(0xffffffffu, acc[0], off);
    }
  }
}

// gv_store writes a one-row GEMV's output column c of row row (MoE tiles:
// slot row p0; else row 0): SwiGLU of (v, u) in dual mode, else v scaled
// into routing slot s's row of the scatter, or v (gemv_body's epilogue,
// for glmf_gemv_f1_fp8p).
DEVFN void gv_store(const GemmArgs& a, i64 g, i64 row, int s, i64 c, float v, float u) {
  if (a.W2) {
    a.out[0][row * a.N + c] = swiglu_clamped(v, u, a.limit);
  } else if (a.scatter) {
    a.scatter[(i64)s * a.N + c] = a.row_scale[s] * v;
  } else if (a.tiles) {
    a.out[0][row * a.N + c] = v;
  } else {
    float* o = out_ptr(a, g, row, c);
    if (o) *o = v;
  }
}

// gemv_body: the block's pass over rows [r0, r0+rows) (MoE tiles: slot
// rows p0…, expert e) for its S = GV_SLOTS slots.
template <typename ACC, int WT, int R>
DEVFN void gemv_body(const GemmArgs& a, i64 rows, i64 p0, i64 e, i64 r0, i64 cg) {
  const int S = sizeof(ACC) == 4 ? 8 : 4;  // GV_SLOTS
  const int WSZ = WT == WT_FP8 ? 1 : WT == WT_BF16 ? 2 : 4;
  const int PER = 16 / WSZ;                // k a chunk
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  bool dual = a.W2 != 0;
  int ncol = dual ? S / 2 : S;
  i64 c0 = cg * ncol, g = blockIdx.z, K = a.K;
  const float* A = a.A + g * a.a_goff;
  const float* Ar[R];
  int rp[R];
  #pragma unroll
  for (int m = 0; m < R; m++) {
    rp[m] = 0;
    Ar[m] = A;
    if (m >= rows) continue;
    if (a.tiles) {
      rp[m] = a.perm[p0 + m];
      Ar[m] = A + (a.a_div > 0 ? (i64)(rp[m] / a.a_div) : p0 + m) * a.lda;
    } else {
      Ar[m] = A + (r0 + m) * a.lda;
    }
  }
  i64 wg = a.tiles ? e : g;
  const char* W = (const char*)a.W + wg * a.w_goff * WSZ;
  const char* W2 = dual ? (const char*)a.W2 + wg * a.w_goff * WSZ : 0;
  // slot j's weight row (a column past N reads column N-1; not written)
  const char* wr[S];
  #pragma unroll
  for (int j = 0; j < S; j++) {
    i64 c = c0 + (dual ? j / 2 : j);
    if (c >= a.N) c = a.N - 1;
    wr[j] = (dual && (j & 1) ? W2 : W) + c * K * WSZ;
  }
  // fp8: every column of the block is in block row c0/128 (ncol | 128)
  const float* ws = WT == WT_FP8 ? a.ws + wg * a.ws_goff + (c0 >> 7) * a.ws_ld : 0;
  const float* ws2 = WT == WT_FP8 && dual ? a.ws2 + wg * a.ws_goff + (c0 >> 7) * a.ws_ld : ws;
  bool vec = K % PER == 0 && ((u64)W & 15) == 0 && (!dual || ((u64)W2 & 15) == 0);
  #pragma unroll
  for (int m = 0; m < R; m++) vec = vec && ((u64)Ar[m] & 15) == 0;
  ACC acc[R][S];
  #pragma unroll
  for (int m = 0; m < R; m++)
    #pragma unroll
    for (int j = 0; j < S; j++) acc[m][j] = 0;
  for (i64 q = warp * 32 + lane; q * PER < K; q += GV_WARPS * 32) {
    i64 k0 = q * PER;
    uint4 raw[S];
    if (vec) {
      #pragma unroll
      for (int j = 0; j < S; j++) raw[j] = gv_ldw(wr[j] + k0 * WSZ);
    } else {
      #pragma unroll
      for (int j = 0; j < S; j++) {
        unsigned u[4] = {0, 0, 0, 0};
        for (int i = 0; i < PER; i++) {
          if (k0 + i >= K) break;
          unsigned v = WT == WT_FP8 ? (unsigned)((const u8*)wr[j])[k0 + i]
                     : WT == WT_BF16 ? (unsigned)((const u16*)wr[j])[k0 + i]
                                     : ((const unsigned*)wr[j])[k0 + i];
          u[i * WSZ / 4] |= v << (8 * ((i * WSZ) & 3));
        }
        raw[j] = make_uint4(u[0], u[1], u[2], u[3]);
      }
    }
    // float sums on fp8 weights: each column's 16 products of the chunk
    // (one 128-k scale block) summed unscaled, the codes' values by the
    // hardware conversion (fp8x2f), then scaled once
    const bool FP8F = WT == WT_FP8 && sizeof(ACC) == 4;
    float pc[R][S];
    if (FP8F) {
      #pragma unroll
      for (int m = 0; m < R; m++)
        #pragma unroll
        for (int j = 0; j < S; j++) pc[m][j] = 0;
    }
    float s1 = 1, s2 = 1, sf1 = 1, sf2 = 1;
    bool f1 = true, f2 = true;
    if (WT == WT_FP8) {
      s1 = ws[k0 >> 7];
      s2 = dual ? ws2[k0 >> 7] : s1;
      sf1 = s1 * 0x1p120f, sf2 = s2 * 0x1p120f;
      f1 = s1 < 0x1p7f, f2 = s2 < 0x1p7f;
    }
    #pragma unroll
    for (int h = 0; h < PER / 4; h++) {
      float x[R][4];
      #pragma unroll
      for (int m = 0; m < R; m++) {
        if (vec) {
          uint4 v = gv_lda(Ar[m] + k0 + 4 * h);
          x[m][0] = __uint_as_float(v.x), x[m][1] = __uint_as_float(v.y);
          x[m][2] = __uint_as_float(v.z), x[m][3] = __uint_as_float(v.w);
        } else {
          #pragma unroll
          for (int i = 0; i < 4; i++) x[m][i] = k0 + 4 * h + i < K ? Ar[m][k0 + 4 * h + i] : 0.f;
        }
        if (sizeof(ACC) == 4) {  // bf16 precision
          gv_round2(x[m][0], x[m][1]);
          gv_round2(x[m][2], x[m][3]);
        }
      }
      #pragma unroll
      for (int j = 0; j < S; j++) {
        float w[4];
        unsigned u[4] = {raw[j].x, raw[j].y, raw[j].z, raw[j].w};
        if (FP8F) {
          fp8x2f(u[h], w[0], w[1]);
          fp8x2f(u[h] >> 16, w[2], w[3]);
          #pragma unroll
          for (int m = 0; m < R; m++)
            #pragma unroll
            for (int i = 0; i < 4; i++) pc[m][j] = fmaf(x[m][i], w[i], pc[m][j]);
          continue;
        } else if (WT == WT_FP8) {
          bool second = dual && (j & 1);
          gv_fp8x4(u[h], second ? s2 : s1, second ? sf2 : sf1, second ? f2 : f1, w);
        } else if (WT == WT_BF16) {
          w[0] = __uint_as_float(u[2 * h] << 16), w[1] = __uint_as_float(u[2 * h] & 0xffff0000u);
          w[2] = __uint_as_float(u[2 * h + 1] << 16), w[3] = __uint_as_float(u[2 * h + 1] & 0xffff0000u);
        } else {
          #pragma unroll
          for (int i = 0; i < 4; i++) w[i] = __uint_as_float(u[i]);
        }
        #pragma unroll
        for (int m = 0; m < R; m++)
          #pragma unroll
          for (int i = 0; i < 4; i++) acc[m][j] = gv_fma(x[m][i], w[i], acc[m][j]);
      }
    }
    if (FP8F) {
      #pragma unroll
      for (int j = 0; j < S; j++) {
        float sc = dual && (j & 1) ? s2 : s1;
        #pragma unroll
        for (int m = 0; m < R; m++) acc[m][j] = gv_fma(pc[m][j], sc, acc[m][j]);
      }
    }
  }
  // lanes: the butterfly as a reduce-scatter; lane l then holds slot
  // (l >> (5 - log2 S)) of each row's sum
  __shared__ ACC red[GV_WARPS][R][S];
  #pragma unroll
  for (int m = 0; m < R; m++) {
    gv_lanes_sum<ACC, S>(acc[m], lane);
    const int sh = S == 8 ? 2 : 3;  // 32/S lanes hold each slot
    if ((lane & ((1 << sh) - 1)) == 0) red[warp][m][lane >> sh] = acc[m][0];
  }
  __syncthreads();
  // warps, in order; then the epilogue, a thread per (row, column)
  __shared__ float tot[R][S];
  int t = threadIdx.x;
  if (t < R * S) {
    int m = t / S, j = t % S;
    ACC v = red[0][m][j];
    #pragma unroll
    for (int w = 1; w < GV_WARPS; w++) v += red[w][m][j];
    tot[m][j] = (float)v;
  }
  __syncthreads();
  if (t < R * ncol) {
    int m = t / ncol;
    i64 c = c0 + t % ncol;
    if (m < rows && c < a.N) {
      // (gv_store's writes, inline: calling it here raises glmf_gemv_f1's
      // spills at its 128-register bound)
      if (dual) {  // (MoE tiles: slot rows p0…; else rows r0…, stride N)
        int j = 2 * (t % ncol);
        a.out[0][(a.tiles ? p0 + m : r0 + m) * a.N + c] = swiglu_clamped(tot[m][j], tot[m][j + 1], a.limit);
      } else {
        float v = tot[m][t % ncol];
        if (a.scatter) {
          int s = rp[0];
          #pragma unroll
          for (int i = 1; i < R; i++)
            if (i == m) s = rp[i];
          a.scatter[(i64)s * a.N + c] = a.row_scale[s] * v;
        } else if (a.tiles) {
          a.out[0][(p0 + m) * a.N + c] = v;
        } else {
          float* o = out_ptr(a, g, r0 + m, c);
          if (o) *o = v;
        }
      }
    }
  }
}

// One glmf_gemv kernel: sums in ACC, R rows at a time (more rows, as a
// MoE tile may have, take several passes over the weight). A kernel per
// (precision, R) keeps the registers, so the occupancy, of the few-row
// kernels low; fp32 weights run on the 8-row kernels only.
// FP8 (glmf_gemv_f1_fp8): the fp8 weights' code alone, so that the
// kernel's registers are that path's.
template <typename ACC, int R, bool FP8 = false>
DEVFN void gemv_kernel(const GemmArgs& a) {
  i64 rows, p0, e;
  if (!gemv_rows(a, rows, p0, e)) return;
  for (i64 r0 = 0; r0 < rows; r0 += R) {
    i64 n = rows - r0 < R ? rows - r0 : R;
    i64 p = a.tiles ? p0 + r0 : 0;
    if (FP8 || a.w_type == WT_FP8)
      gemv_body<ACC, WT_FP8, R>(a, n, p, e, r0, blockIdx.x);
    else if (a.w_type == WT_BF16)
      gemv_body<ACC, WT_BF16, R>(a, n, p, e, r0, blockIdx.x);
    else if (R == GV_ROWS)
      gemv_body<ACC, WT_F32, GV_ROWS>(a, n, p, e, r0, blockIdx.x);
  }
}

// glmf_gemv_{f,d}{1,2,4,8}: float sums (bf16 precision, a.a_round) or
// double sums (fp32 precision), up to 1, 2, 4 or 8 rows a pass. The
// launch bounds cap the registers so that 4 (1–2 rows), 3 (4 rows) or 2
// (8 rows) blocks of 128 threads share an SM: enough weight loads in
// flight (each thread has one 16-byte load a slot outstanding).
#ifdef GLMF_EMU
#define GV_KERNEL(name, minb) KERNEL(name, GemmArgs)
#else
#define GV_KERNEL(name, minb) KERNEL_BOUNDS(name, GemmArgs, GV_WARPS * 32, minb)
#endif
GV_KERNEL(glmf_gemv_f1, 4) { gemv_kernel<float, 1>(a); }
// glmf_gemv_f1_fp8: glmf_gemv_f1 for fp8 weights alone (one row a pass,
// float sums), the same bits, with its own register budget (80): 6 blocks
// an SM where glmf_gemv_f1 (128) fits 4. It pays on grids of many blocks
// (MoE expert tiles), not on those of one or two waves
// (kc.GemvSIMTLaunch).
GV_KERNEL(glmf_gemv_f1_fp8, 6) { gemv_kernel<float, 1, true>(a); }
GV_KERNEL(glmf_gemv_f2, 4) { gemv_kernel<float, 2>(a); }
// glmf_gemv_f1_fp8p: glmf_gemv_f1_fp8 with persistent blocks, the same
// bits. Block x takes the column groups x, x + gridDim.x, ... (a group:
// the GemvCols columns glmf_gemv_f1's block x takes) of its tile, and each
// thread issues the weight loads of its next chunk (or of the next group's
// first) before it computes the current one, so that a block's reduction
// and epilogue run while its next loads are in flight: the one-wave blocks
// of glmf_gemv_f1_fp8 each loaded their chunks (one at K = 2048) and then
// waited, reduced and exited, so an SM's loads came in bursts. Every
// column's arithmetic is gemv_body's (the same chunks a thread, the same
// order, the same butterfly and warp tree); rows past one a tile, unaligned
// weights or K not a multiple of 16 take gemv_body group by group.
KERNEL_BOUNDS(glmf_gemv_f1_fp8p, GemmArgs, GV_WARPS * 32, 4) {
  const int S = 8, PER = 16;
  i64 rows, p0, e;
  if (!gemv_rows(a, rows, p0, e)) return;
  bool dual = a.W2 != 0;
  int ncol = dual ? S / 2 : S;
  i64 ngroups = (a.N + ncol - 1) / ncol, K = a.K, g = blockIdx.z;
  i64 wg = a.tiles ? e : g;
  const char* W = (const char*)a.W + wg * a.w_goff;
  const char* W2 = dual ? (const char*)a.W2 + wg * a.w_goff : 0;
  int rp0 = 0;
  const float* Ar = a.A + g * a.a_goff;
  if (rows >= 1) {
    if (a.tiles) {
      rp0 = a.perm[p0];
      Ar += (a.a_div > 0 ? (i64)(rp0 / a.a_div) : p0) * a.lda;
    }
  }
  bool vec = rows == 1 && K % PER == 0 && ((u64)W & 15) == 0 && (!dual || ((u64)W2 & 15) == 0) && ((u64)Ar & 15) == 0;
  if (!vec) {
    for (i64 cg = blockIdx.x; cg < ngroups; cg += gridDim.x)
      for (i64 r0 = 0; r0 < rows; r0++) gemv_body<float, WT_FP8, 1>(a, 1, a.tiles ? p0 + r0 : 0, e, r0, cg);
    return;
  }
  const float* wsb = a.ws + wg * a.ws_goff;
  const float* ws2b = dual ? a.ws2 + wg * a.ws_goff : wsb;
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, t = threadIdx.x;
  // this thread's chunks: q = t + i·GV_WARPS·32 (gemv_body's q loop), nq of
  // them; its loads run one chunk ahead through the block's groups
  i64 Q = K / PER;
  int nq = Q > t ? (int)((Q - 1 - t) / (GV_WARPS * 32) + 1) : 0;
  auto load = [&](i64 cg, int i, uint4* raw, float& s1, float& s2) {
    i64 c0 = cg * ncol, k0 = ((i64)t + (i64)i * GV_WARPS * 32) * PER;
#pragma unroll
    for (int j = 0; j < S; j++) {
      i64 c = c0 + (dual ? j / 2 : j);
      if (c >= a.N) c = a.N - 1;
      raw[j] = gv_ldw((dual && (j & 1) ? W2 : W) + c * K + k0);
    }
    s1 = wsb[(c0 >> 7) * a.ws_ld + (k0 >> 7)];
    s2 = dual ? ws2b[(c0 >> 7) * a.ws_ld + (k0 >> 7)] : s1;
  };
  uint4 nraw[S];
  float ns1 = 1, ns2 = 1;
  i64 cg = blockIdx.x;
  if (cg >= ngroups) return;
  if (nq > 0) load(cg, 0, nraw, ns1, ns2);
  __shared__ float red[GV_WARPS][S];
  __shared__ float tot[S];
  for (; cg < ngroups; cg += gridDim.x) {
    float acc[S];
#pragma unroll
    for (int j = 0; j < S; j++) acc[j] = 0;
    for (int i = 0; i < nq; i++) {
      uint4 raw[S];
#pragma unroll
      for (int j = 0; j < S; j++) raw[j] = nraw[j];
      float s1 = ns1, s2 = ns2;
      // the next chunk's loads: this group's next, else the next group's first
      if (i + 1 < nq) load(cg, i + 1, nraw, ns1, ns2);
      else if (cg + gridDim.x < ngroups) load(cg + gridDim.x, 0, nraw, ns1, ns2);
      i64 k0 = ((i64)t + (i64)i * GV_WARPS * 32) * PER;
      float pc[S];
#pragma unroll
      for (int j = 0; j < S; j++) pc[j] = 0;
#pragma unroll
      for (int h = 0; h < PER / 4; h++) {
        float x[4];
        uint4 v = gv_lda(Ar + k0 + 4 * h);
        x[0] = __uint_as_float(v.x), x[1] = __uint_as_float(v.y);
        x[2] = __uint_as_float(v.z), x[3] = __uint_as_float(v.w);
        gv_round2(x[0], x[1]);
        gv_round2(x[2], x[3]);
#pragma unroll
        for (int j = 0; j < S; j++) {
          float w[4];
          unsigned u[4] = {raw[j].x, raw[j].y, raw[j].z, raw[j].w};
          fp8x2f(u[h], w[0], w[1]);
          fp8x2f(u[h] >> 16, w[2], w[3]);
#pragma unroll
          for (int q = 0; q < 4; q++) pc[j] = fmaf(x[q], w[q], pc[j]);
        }
      }
#pragma unroll
      for (int j = 0; j < S; j++) acc[j] = gv_fma(pc[j], dual && (j & 1) ? s2 : s1, acc[j]);
    }
    // gemv_body's reduce-scatter over the lanes, then the warps in order
    gv_lanes_sum<float, S>(acc, lane);
    if ((lane & 3) == 0) red[warp][lane >> 2] = acc[0];
    __syncthreads();
    if (t < S) {
      float v = red[0][t];
#pragma unroll
      for (int w = 1; w < GV_WARPS; w++) v += red[w][t];
      tot[t] = v;
    }
    __syncthreads();
    if (t < ncol) {
      i64 c = cg * ncol + t;
      if (c < a.N) gv_store(a, g, a.tiles ? p0 : 0, rp0, c, dual ? tot[2 * t] : tot[t], dual ? tot[2 * t + 1] : 0.f);
    }
  }
}

GV_KERNEL(glmf_gemv_f4, 3) { gemv_kernel<float, 4>(a); }
GV_KERNEL(glmf_gemv_f8, 2) { gemv_kernel<float, 8>(a); }
GV_KERNEL(glmf_gemv_d1, 4) { gemv_kernel<double, 1>(a); }
GV_KERNEL(glmf_gemv_d2, 3) { gemv_kernel<double, 2>(a); }
GV_KERNEL(glmf_gemv_d4, 2) { gemv_kernel<double, 4>(a); }
GV_KERNEL(glmf_gemv_d8, 2) { gemv_kernel<double, 8>(a); }

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

// glmf_fp8_to_bf16_v16: glmf_fp8_to_bf16 (the same bits) where K is a
// multiple of 16 and W and out are 16-byte aligned: a thread per 16 codes
// of a row (one scale), one 16-byte load and two 16-byte stores, one
// division per 16 codes instead of one per code.
KERNEL(glmf_fp8_to_bf16_v16, FP8ToBF16Args) {
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x, kc = a.K >> 4;
  if (i >= a.N * kc) return;
  i64 n = i / kc, k0 = (i - n * kc) << 4;
  float s = a.ws[(n >> 7) * a.ws_ld + (k0 >> 7)];
  uint4 u = *(const uint4*)(a.W + n * a.K + k0);
  unsigned w[4] = {u.x, u.y, u.z, u.w}, o[8];
#pragma unroll
  for (int j = 0; j < 16; j += 2) {
    unsigned lo = __float_as_uint(bf16_round(fp8f((w[j >> 2] >> (8 * (j & 3))) & 0xffu) * s)) >> 16;
    unsigned hi = __float_as_uint(bf16_round(fp8f((w[j >> 2] >> (8 * ((j + 1) & 3))) & 0xffu) * s)) >> 16;
    o[j >> 1] = lo | (hi << 16);
  }
  uint4* out = (uint4*)(a.out + n * a.K + k0);
  out[0] = make_uint4(o[0], o[1], o[2], o[3]);
  out[1] = make_uint4(o[4], o[5], o[6], o[7]);
}
