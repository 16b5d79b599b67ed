// Tensor-core GEMV for few rows (≤ 8: decode and MoE tiles of ≤ 8 rows)
// in precision bf16 (GemmArgs.a_round = 1: activations rounded to bf16,
// float sums), on fp8 e4m3 weights with 128×128 block scales or bf16
// weights: glmf_gemv's job (the same arguments and epilogues: groups, MoE
// tiles, dual gate/up with the clamped SwiGLU, down scaled and scattered,
// split or batched outputs) with the per-element work moved onto
// mma.m16n8k16 (mma_bf16_16816): the weight is the A operand (16 output
// columns × 16 k), the ≤ 8 activation rows are B (n = 8; rows past the
// count are zero), the sums fp32.
//
// The order of k inside an mma does not matter, so it is permuted for A
// and B alike: in a chunk of 64 k, lane (g = lane/4, t = lane%4) reads the
// 16 contiguous k at 16t of weight rows g and g+8 of its column tile (one
// 16-byte load each for fp8, two for bf16), and mma s (0..3) of the chunk
// takes its k 16t+4s+0..3 of them; the lane's B fragment is activation row
// g at the same k (16 contiguous floats, four 16-byte loads, read once a
// chunk for all the warp's column tiles). fp8 codes become bf16 exactly: a
// word's codes 0 and 2 form one bf16x2 register, 1 and 3 the other (their
// sign, exponent and mantissa moved to bf16 places, +120 on the exponent:
// exact for normal codes); a lane's 32 codes of a chunk with a
// zero-exponent code (zero, subnormals) or a NaN code (0x7f/0xff) among
// them take a slower exact path. The
// block scale is applied once a chunk: each chunk's four mmas sum into a
// fresh fragment p, then acc = fmaf(scale, p, acc).
//
// A block has WARPS warps (GM_WARPS; GM_WARPS_K in the *_t1k kernels, for
// grids too small to fill the SMs) splitting K: warp w takes the runs of CH
// consecutive chunks r = w, w + WARPS, ...; the warps' sums are added in
// ascending warp order through shared memory. So an output's bits depend
// on K, its column's weights and its own row only: not on the other rows
// of the batch or tile (batch invariance), nor on the grid. Needs K a
// multiple of 64 and 16-byte aligned weights and activation rows
// (kc.GemvMMALaunch checks; glmf_gemv takes the rest).
//
// Kernels glmf_gemv_mma_{f8,b16}_{t1,t2,dual,t1k}: T column tiles of 16 a
// warp (t1, t2: 16 or 32 columns a block), dual: 16 columns of W and W2
// (MoE gate/up); t1k: t1 with GM_WARPS_K warps. Each lane keeps 8 weight loads (128 bytes) in flight an
// iteration: CH = 8 / (2·T·matrices·loads a row-chunk).
#define GM_WARPS 8
#define GM_WARPS_K 16

// Codes 0 and 2 (even) or 1 and 3 (odd) of the fp8 word u as a bf16x2
// (the lower-numbered code in the low half), exact for normal codes.
DEVFN unsigned gm_even(unsigned u) { return (((u << 4) & 0x07f007f0u) + 0x3c003c00u) | ((u << 8) & 0x80008000u); }
DEVFN unsigned gm_odd(unsigned u) { return (((u >> 4) & 0x07f007f0u) + 0x3c003c00u) | (u & 0x80008000u); }

// The bf16 bits of fp8 code c (any code), exactly.
DEVFN unsigned gm_bf16_of(unsigned c) {
  unsigned s = (c & 0x80u) << 8;
  if ((c & 0x7fu) == 0x7fu) return 0x7fc0u;
  if ((c & 0x78u) == 0) return s | (__float_as_uint((float)(c & 7u) * 0x1p-9f) >> 16);
  return s | (((c & 0x7fu) << 4) + 0x3c00u);
}

// The A fragments of mmas s = 0..3 of a chunk from a lane's 16 codes of
// rows g (lo) and g+8 (hi): a[s] = {even(lo.s), even(hi.s), odd(lo.s),
// odd(hi.s)}. A zero exponent (zero, subnormals) or a NaN code among the
// 32 sends all to the exact code-by-code path: with t a byte's low 7 bits,
// t + 0x78 has bit 7 clear iff the exponent is 0, t + 1 has it set iff t
// is 0x7f (no carry leaves a byte).
DEVFN void gm_fp8_frags(const uint4& lo, const uint4& hi, unsigned av[4][4]) {
  unsigned w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
  unsigned sp = 0;
  #pragma unroll
  for (int i = 0; i < 8; i++) {
    unsigned t = w[i] & 0x7f7f7f7fu;
    sp |= ~(t + 0x78787878u) | (t + 0x01010101u);
  }
  if (sp & 0x80808080u) {
    #pragma unroll
    for (int i = 0; i < 8; i++) {
      unsigned u = w[i];
      av[i & 3][(i >> 2)] = gm_bf16_of(u & 0xffu) | (gm_bf16_of((u >> 16) & 0xffu) << 16);
      av[i & 3][2 + (i >> 2)] = gm_bf16_of((u >> 8) & 0xffu) | (gm_bf16_of(u >> 24) << 16);
    }
  } else {
    #pragma unroll
    for (int i = 0; i < 8; i++) {
      av[i & 3][(i >> 2)] = gm_even(w[i]);
      av[i & 3][2 + (i >> 2)] = gm_odd(w[i]);
    }
  }
}

// bf16x2 of (lo, hi), each rounded to nearest even (a NaN stays a NaN).
DEVFN unsigned gm_pack(float lo, float hi) {
#if defined(GLMF_EMU) || __CUDA_ARCH__ < 800
  unsigned l = isnan(lo) ? 0x7fc00000u : __float_as_uint(bf16_round(lo));
  unsigned h = isnan(hi) ? 0x7fc00000u : __float_as_uint(bf16_round(hi));
  return (h & 0xffff0000u) | (l >> 16);
#else
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#endif
}

DEVFN unsigned gm_word(const uint4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

template <int WT, int T, bool DUAL, int WARPS>
DEVFN void gemv_mma_body(const GemmArgs& a) {
  const int WSZ = WT == WT_FP8 ? 1 : 2;
  const int NM = DUAL ? 2 : 1;  // weight matrices
  const int NL = WSZ;           // 16-byte loads a row and chunk
  const int CH = 8 / (2 * T * NM * NL);
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, t4 = lane & 3;
  i64 rows, p0, e;
  if (!gemv_rows(a, rows, p0, e)) return;
  i64 g = blockIdx.z, K = a.K, N = a.N;
  i64 c0 = (i64)blockIdx.x * 16 * T;
  i64 wg = a.tiles ? e : g;
  // this lane's weight rows: matrix mt, tile tt, half h (row gid + 8h),
  // from k 16·t4 of each chunk (a column past N reads column N-1: unused)
  const char* wr[NM][T][2];
  const float* wsr[NM][T];
  #pragma unroll
  for (int mt = 0; mt < NM; mt++) {
    const char* Wm = (const char*)(mt ? a.W2 : a.W) + wg * a.w_goff * WSZ;
    #pragma unroll
    for (int tt = 0; tt < T; tt++) {
      #pragma unroll
      for (int h = 0; h < 2; h++) {
        i64 c = c0 + 16 * tt + gid + 8 * h;
        if (c >= N) c = N - 1;
        wr[mt][tt][h] = Wm + (c * K + 16 * t4) * WSZ;
      }
      // fp8: a tile's 16 columns share a block row of scales
      wsr[mt][tt] = WT == WT_FP8 ? (mt ? a.ws2 : a.ws) + wg * a.ws_goff + ((c0 + 16 * tt) >> 7) * a.ws_ld : 0;
    }
  }
  const float* A = a.A + g * a.a_goff;
  i64 nc = K / 64;
  __shared__ float red[WARPS][NM * T * 4][32];
  for (i64 r0 = 0; r0 < rows; r0 += 8) {
    i64 n = rows - r0 < 8 ? rows - r0 : 8;
    // this lane's activation row (gid), from k 16·t4 of each chunk
    const float* xr = 0;
    if (gid < n) {
      i64 row;
      if (a.tiles) {
        int rp = a.perm[p0 + r0 + gid];
        row = a.a_div > 0 ? (i64)(rp / a.a_div) : p0 + r0 + gid;
      } else {
        row = r0 + gid;
      }
      xr = A + row * a.lda + 16 * t4;
    }
    float acc[NM][T][4];
    #pragma unroll
    for (int mt = 0; mt < NM; mt++)
      #pragma unroll
      for (int tt = 0; tt < T; tt++)
        #pragma unroll
        for (int i = 0; i < 4; i++) acc[mt][tt][i] = 0.f;
    for (i64 q0 = (i64)warp * CH; q0 < nc; q0 += WARPS * CH) {
      uint4 raw[CH][NM][T][2][NL];
      #pragma unroll
      for (int j = 0; j < CH; j++) {
        i64 q = q0 + j;
        if (q >= nc) break;
        #pragma unroll
        for (int mt = 0; mt < NM; mt++)
          #pragma unroll
          for (int tt = 0; tt < T; tt++)
            #pragma unroll
            for (int h = 0; h < 2; h++)
              #pragma unroll
              for (int l = 0; l < NL; l++) raw[j][mt][tt][h][l] = gv_ldw(wr[mt][tt][h] + (64 * q + 8 * l) * WSZ);
      }
      #pragma unroll
      for (int j = 0; j < CH; j++) {
        i64 q = q0 + j;
        if (q >= nc) break;
        // B: activation row gid at k 64q + 16t4 + 4s + 0..3 for mma s
        unsigned b[4][2];
        #pragma unroll
        for (int s = 0; s < 4; s++) {
          float x0 = 0, x1 = 0, x2 = 0, x3 = 0;
          if (xr) {
            uint4 v = gv_lda(xr + 64 * q + 4 * s);
            x0 = __uint_as_float(v.x), x1 = __uint_as_float(v.y), x2 = __uint_as_float(v.z), x3 = __uint_as_float(v.w);
          }
          if (WT == WT_FP8) {  // k order of gm_even / gm_odd: 0, 2 | 1, 3
            b[s][0] = gm_pack(x0, x2);
            b[s][1] = gm_pack(x1, x3);
          } else {
            b[s][0] = gm_pack(x0, x1);
            b[s][1] = gm_pack(x2, x3);
          }
        }
        #pragma unroll
        for (int mt = 0; mt < NM; mt++)
          #pragma unroll
          for (int tt = 0; tt < T; tt++) {
            if (WT == WT_FP8) {
              float p[4] = {0.f, 0.f, 0.f, 0.f};
              unsigned av[4][4];
              gm_fp8_frags(raw[j][mt][tt][0][0], raw[j][mt][tt][1][0], av);
              #pragma unroll
              for (int s = 0; s < 4; s++) mma_bf16_16816(p, av[s], b[s], p);
              float sc = wsr[mt][tt][(64 * q) >> 7];
              #pragma unroll
              for (int i = 0; i < 4; i++) acc[mt][tt][i] = fmaf(sc, p[i], acc[mt][tt][i]);
            } else {
              #pragma unroll
              for (int s = 0; s < 4; s++) {
                // words 2s, 2s+1 of the lane's 16 k (two 16-byte loads)
                unsigned av[4];
                av[0] = gm_word(raw[j][mt][tt][0][s >> 1], (2 * s) & 3);
                av[1] = gm_word(raw[j][mt][tt][1][s >> 1], (2 * s) & 3);
                av[2] = gm_word(raw[j][mt][tt][0][s >> 1], (2 * s + 1) & 3);
                av[3] = gm_word(raw[j][mt][tt][1][s >> 1], (2 * s + 1) & 3);
                mma_bf16_16816(acc[mt][tt], av, b[s], acc[mt][tt]);
              }
            }
          }
      }
    }
    // the warps' sums, in ascending warp order
    #pragma unroll
    for (int mt = 0; mt < NM; mt++)
      #pragma unroll
      for (int tt = 0; tt < T; tt++)
        #pragma unroll
        for (int i = 0; i < 4; i++) red[warp][(mt * T + tt) * 4 + i][lane] = acc[mt][tt][i];
    __syncthreads();
    for (int f = threadIdx.x; f < T * 4 * 32; f += WARPS * 32) {
      int ln = f & 31, v = f >> 5, tt = v >> 2, i = v & 3;
      int m = 2 * (ln & 3) + (i & 1);
      i64 c = c0 + 16 * tt + (ln >> 2) + 8 * (i >> 1);
      if (m >= n || c >= N) continue;
      float s0 = red[0][v][ln];
      for (int w = 1; w < WARPS; w++) s0 += red[w][v][ln];
      i64 p = p0 + r0 + m;
      if (DUAL) {
        float s1 = red[0][T * 4 + v][ln];
        for (int w = 1; w < WARPS; w++) s1 += red[w][T * 4 + v][ln];
        a.out[0][p * N + c] = swiglu_clamped(s0, s1, a.limit);
      } else if (a.scatter) {
        int sl = a.perm[p];
        a.scatter[(i64)sl * N + c] = a.row_scale[sl] * s0;
      } else if (a.tiles) {
        a.out[0][p * N + c] = s0;
      } else {
        float* o = out_ptr(a, g, r0 + m, c);
        if (o) *o = s0;
      }
    }
    __syncthreads();
  }
}

#ifdef GLMF_EMU
#define GM_KERNEL(name, warps, minb) KERNEL(name, GemmArgs)
#else
#define GM_KERNEL(name, warps, minb) KERNEL_BOUNDS(name, GemmArgs, (warps) * 32, minb)
#endif
GM_KERNEL(glmf_gemv_mma_f8_t1, GM_WARPS, 2) { gemv_mma_body<WT_FP8, 1, false, GM_WARPS>(a); }
GM_KERNEL(glmf_gemv_mma_f8_t2, GM_WARPS, 2) { gemv_mma_body<WT_FP8, 2, false, GM_WARPS>(a); }
GM_KERNEL(glmf_gemv_mma_f8_dual, GM_WARPS, 2) { gemv_mma_body<WT_FP8, 1, true, GM_WARPS>(a); }
GM_KERNEL(glmf_gemv_mma_f8_t1k, GM_WARPS_K, 1) { gemv_mma_body<WT_FP8, 1, false, GM_WARPS_K>(a); }
GM_KERNEL(glmf_gemv_mma_b16_t1, GM_WARPS, 2) { gemv_mma_body<WT_BF16, 1, false, GM_WARPS>(a); }
GM_KERNEL(glmf_gemv_mma_b16_t2, GM_WARPS, 2) { gemv_mma_body<WT_BF16, 2, false, GM_WARPS>(a); }
GM_KERNEL(glmf_gemv_mma_b16_dual, GM_WARPS, 2) { gemv_mma_body<WT_BF16, 1, true, GM_WARPS>(a); }
GM_KERNEL(glmf_gemv_mma_b16_t1k, GM_WARPS_K, 1) { gemv_mma_body<WT_BF16, 1, false, GM_WARPS_K>(a); }

// glmf_test_mma: mma_bf16_16816 (d) and mma_bf16_16816_shfl (d2) of one
// warp's fragments a [32][4], b [32][2], c [32][4] (tests the layout).
struct MMATestArgs { const unsigned* a; const unsigned* b; const float* c; float* d; float* d2; };
KERNEL(glmf_test_mma, MMATestArgs) {
  int l = threadIdx.x & 31;
  unsigned av[4], bv[2];
  float cv[4], d[4], d2[4];
  for (int i = 0; i < 4; i++) av[i] = a.a[4 * l + i], cv[i] = a.c[4 * l + i];
  for (int i = 0; i < 2; i++) bv[i] = a.b[2 * l + i];
  mma_bf16_16816(d, av, bv, cv);
  mma_bf16_16816_shfl(d2, av, bv, cv);
  for (int i = 0; i < 4; i++) a.d[4 * l + i] = d[i], a.d2[4 * l + i] = d2[i];
}
