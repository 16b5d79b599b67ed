// Tensor-core grouped GEMM for the MoE experts in precision bf16 (prefill
// and large decode batches): the tile list of moe_plan (tiles of up to
// MM_BM rows of one expert), A rows gathered through the permutation and
// rounded to bfloat16 as they are staged, weights bf16 as stored or fp8 e4m3
// dequantized with their 128×128 block scale in fp32 and rounded to the
// nearest-even bfloat16 (exactly glmf_fp8_to_bf16's value, the weight the
// library GEMMs of precision bf16 use), bf16 products summed in fp32 by
// nvcuda::wmma m16n16k16 (sm_80 and later; the sums' order is the tensor
// cores', not ascending k: precision bf16 only, never fp32 parity).
//
// One block of 256 threads (8 warps) computes a 128-row × 128-weight-row
// tile: K in steps of MM_BK staged in shared memory as bf16, two buffers
// (the next step's global loads are in flight in registers while this one
// is multiplied). Warp (wm, wn) owns rows 64·wm..+63 and tile columns
// 32·wn..+31 (4×2 accumulators of 16×16).
//   - single (W2 == 0; MoE down): tile column t is output column n0 + t
//     (n0 = 128·blockIdx.x); the epilogue scales by row_scale[perm[p]] and
//     scatters to the routing slot's row of `scatter`, as glmf_gemm_tiled.
//   - dual (W2 != 0; MoE gate+up): the 128 tile columns are 64 output
//     columns of gate and of up interleaved by 16 (gate n0..n0+15, up
//     n0..n0+15, gate n0+16..), so a warp holds the gate and up sums of the
//     same 16 columns and the epilogue applies the clamped SwiGLU into
//     out[0] (row p of the permuted order), as glmf_gemm_tiled.
// The epilogue goes through shared memory (wmma's register layout is
// opaque): each warp stores a 16×16 accumulator and its lanes write 8
// outputs each. Row, column and K tails are zero-filled.
// a_round = 2 says that A holds bf16 bits (rows of lda elements: the
// activations rounded once, by glmf_to_bf16 or the gate+up epilogue,
// instead of by every block that reads them: half the bytes) and that the
// dual epilogue writes its output as bf16 bits (down reads them so); any
// other a_round: A is fp32, rounded to bf16 as it is staged.
// grid = (ceil(N/128) single or ceil(N/64) dual, max tiles), 256 threads.
#include "common.cuh"

#if !defined(GLMF_EMU)
#include <cuda_bf16.h>
#include <mma.h>
#endif

#define MM_BM 128
#define MM_BN 128
#define MM_BK 32
#define MM_LD (MM_BK + 8)  // bf16 elements per staged row (80 bytes: no bank conflicts on fragment loads)
#define MM_STAGE (2 * MM_BM * MM_LD)  // u16 of one buffer (A then W)

#if defined(GLMF_EMU) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800)
#define GLMF_MOE_MMA 1

// bf16 bits (nearest even) of a float.
DEVFN unsigned mm_bf16_bits(float x) { return __float_as_uint(bf16_round(x)) >> 16; }

// The bf16 (nearest even) of lo and hi packed (lo in the low half): one
// cvt.rn.bf16x2.f32 on the GPU, which rounds finite values and infinities
// exactly as bf16_round (NaN stays NaN).
DEVFN unsigned mm_pack_bf16x2(float lo, float hi) {
#ifdef GLMF_EMU
  return mm_bf16_bits(lo) | (mm_bf16_bits(hi) << 16);
#else
  unsigned d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
#endif
}

template <bool abf>  // A holds bf16 bits (a_round == 2)
DEVFN void moe_mma_body(const GemmArgs& a) {
  using namespace nvcuda;
  __shared__ __align__(128) u16 sm[2 * MM_STAGE];
  __shared__ int rowA[MM_BM];
  __shared__ int rowP[MM_BM];
  if ((i64)blockIdx.y >= (i64)a.tiles[0]) return;
  const int* tl = a.tiles + 1 + 3 * blockIdx.y;
  const i64 e = tl[0], p0 = tl[1];
  const int rows = tl[2];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const bool dual = a.W2 != 0;
  const i64 N = a.N, K = a.K;
  const i64 n0 = (i64)blockIdx.x * (dual ? MM_BN / 2 : MM_BN);
  if (tid < MM_BM) {
    int ra = 0, rp = 0;
    if (tid < rows) {
      rp = a.perm[p0 + tid];
      ra = a.a_div > 0 ? (int)(rp / a.a_div) : (int)(p0 + tid);
    }
    rowA[tid] = ra;
    rowP[tid] = rp;
  }
  __syncthreads();

  // This thread stages A row `sr` and weight tile row `sr`, k 16·sh..+15
  // of each step.
  const int sr = tid >> 1, sh = (tid & 1) * 16;
  const bool arow = sr < rows;
  const float* Ar = a.A + (i64)rowA[sr] * a.lda;
  const u16* Ar16 = (const u16*)a.A + (i64)rowA[sr] * a.lda;
  const bool avec = ((a.lda | K) & (abf ? 7 : 3)) == 0 && ((u64)a.A & 15) == 0;
  // its weight row: matrix (gate/up in dual mode) and column n
  i64 n;
  const void* Wm;
  const float* wsm;
  {
    int b = sr >> 4;
    bool second = dual && (b & 1);
    n = dual ? n0 + (b >> 1) * 16 + (sr & 15) : n0 + sr;
    i64 wsz = wt_size(a.w_type);
    Wm = (const char*)(second ? a.W2 : a.W) + e * a.w_goff * wsz;
    wsm = a.w_type == WT_FP8 ? (second ? a.ws2 : a.ws) + e * a.ws_goff : 0;
  }
  const bool wrow = n < N;
  const bool fp8 = a.w_type == WT_FP8;
  const unsigned char* W8 = (const unsigned char*)Wm + n * K;
  const u16* W16 = (const u16*)Wm + n * K;
  const bool wvec = fp8 ? (K & 15) == 0 && ((u64)Wm & 15) == 0 : (K & 7) == 0 && ((u64)Wm & 15) == 0;

  // registers of one step in flight: 16 A values (bf16 A: their bits,
  // packed in av[0..7]), 16 weights (fp8: 16 codes in wq[0..3] and their
  // scale; bf16: bits in wq[0..7])
  float av[16];
  unsigned wq[8];
  float wsc = 0;
  auto load = [&](i64 k0) {
    i64 k = k0 + sh;
    if (abf) {
      if (arow && avec && k + 16 <= K) {
        const uint4* p = (const uint4*)(Ar16 + k);
        uint4 q0 = p[0], q1 = p[1];
        av[0] = __uint_as_float(q0.x), av[1] = __uint_as_float(q0.y), av[2] = __uint_as_float(q0.z), av[3] = __uint_as_float(q0.w);
        av[4] = __uint_as_float(q1.x), av[5] = __uint_as_float(q1.y), av[6] = __uint_as_float(q1.z), av[7] = __uint_as_float(q1.w);
      } else {
        #pragma unroll
        for (int j = 0; j < 8; j++) {
          unsigned lo = arow && k + 2 * j < K ? Ar16[k + 2 * j] : 0u;
          unsigned hi = arow && k + 2 * j + 1 < K ? Ar16[k + 2 * j + 1] : 0u;
          av[j] = __uint_as_float(lo | (hi << 16));
        }
      }
    } else if (arow && avec && k + 16 <= K) {
      const float4* p = (const float4*)(Ar + k);
      #pragma unroll
      for (int j = 0; j < 4; j++) {
        float4 q = p[j];
        av[4 * j] = q.x, av[4 * j + 1] = q.y, av[4 * j + 2] = q.z, av[4 * j + 3] = q.w;
      }
    } else {
      #pragma unroll
      for (int j = 0; j < 16; j++) av[j] = arow && k + j < K ? Ar[k + j] : 0.f;
    }
    if (fp8) {
      wsc = wrow && k < K ? wsm[(n >> 7) * a.ws_ld + (k >> 7)] : 0.f;
      if (wrow && wvec && k + 16 <= K) {
        uint4 q = *(const uint4*)(W8 + k);
        wq[0] = q.x, wq[1] = q.y, wq[2] = q.z, wq[3] = q.w;
      } else {
        #pragma unroll
        for (int j = 0; j < 4; j++) {
          unsigned u = 0;
          #pragma unroll
          for (int b = 0; b < 4; b++) {
            i64 kk = k + 4 * j + b;
            if (wrow && kk < K) u |= (unsigned)W8[kk] << (8 * b);
          }
          wq[j] = u;
        }
      }
    } else {
      if (wrow && wvec && k + 16 <= K) {
        const uint4* p = (const uint4*)(W16 + k);
        uint4 q0 = p[0], q1 = p[1];
        wq[0] = q0.x, wq[1] = q0.y, wq[2] = q0.z, wq[3] = q0.w;
        wq[4] = q1.x, wq[5] = q1.y, wq[6] = q1.z, wq[7] = q1.w;
      } else {
        #pragma unroll
        for (int j = 0; j < 8; j++) {
          unsigned lo = wrow && k + 2 * j < K ? W16[k + 2 * j] : 0u;
          unsigned hi = wrow && k + 2 * j + 1 < K ? W16[k + 2 * j + 1] : 0u;
          wq[j] = lo | (hi << 16);
        }
      }
    }
  };
  // convert the registers to bf16 and store them in buffer `buf`
  auto stage = [&](int buf) {
    u16* As = sm + buf * MM_STAGE;
    u16* Ws = As + MM_BM * MM_LD;
    unsigned pa[8], pw[8];
    #pragma unroll
    for (int j = 0; j < 8; j++) pa[j] = abf ? __float_as_uint(av[j]) : mm_pack_bf16x2(av[2 * j], av[2 * j + 1]);
    if (fp8) {
      #pragma unroll
      for (int j = 0; j < 8; j++) {
        float lo, hi;
        fp8x2f(wq[j >> 1] >> (16 * (j & 1)), lo, hi);
        pw[j] = mm_pack_bf16x2(lo * wsc, hi * wsc);
      }
    } else {
      #pragma unroll
      for (int j = 0; j < 8; j++) pw[j] = wq[j];
    }
    uint4* da = (uint4*)(As + sr * MM_LD + sh);
    uint4* dw = (uint4*)(Ws + sr * MM_LD + sh);
    da[0] = make_uint4(pa[0], pa[1], pa[2], pa[3]);
    da[1] = make_uint4(pa[4], pa[5], pa[6], pa[7]);
    dw[0] = make_uint4(pw[0], pw[1], pw[2], pw[3]);
    dw[1] = make_uint4(pw[4], pw[5], pw[6], pw[7]);
  };

  const int wm = warp >> 2, wn = warp & 3;
  // row fragments of this warp that hold rows of the tile (warp-uniform)
  int fi = (rows - 64 * wm + 15) / 16;
  fi = fi < 0 ? 0 : fi > 4 ? 4 : fi;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[4][2];
  #pragma unroll
  for (int i = 0; i < 4; i++)
    #pragma unroll
    for (int j = 0; j < 2; j++) wmma::fill_fragment(acc[i][j], 0.f);

  const i64 nk = (K + MM_BK - 1) / MM_BK;
  load(0);
  stage(0);
  __syncthreads();
  for (i64 kt = 0; kt < nk; kt++) {
    int buf = (int)(kt & 1);
    if (kt + 1 < nk) load((kt + 1) * MM_BK);
    const u16* As = sm + buf * MM_STAGE;
    const u16* Ws = As + MM_BM * MM_LD;
    if (fi > 0) {
      #pragma unroll
      for (int ks = 0; ks < MM_BK; ks += 16) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> bf[2];
        #pragma unroll
        for (int j = 0; j < 2; j++)
          wmma::load_matrix_sync(bf[j], (const __nv_bfloat16*)(Ws + (32 * wn + 16 * j) * MM_LD + ks), MM_LD);
        #pragma unroll
        for (int i = 0; i < 4; i++) {
          if (i >= fi) break;
          wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> af;
          wmma::load_matrix_sync(af, (const __nv_bfloat16*)(As + (64 * wm + 16 * i) * MM_LD + ks), MM_LD);
          #pragma unroll
          for (int j = 0; j < 2; j++) wmma::mma_sync(acc[i][j], af, bf[j], acc[i][j]);
        }
      }
    }
    if (kt + 1 < nk) stage(buf ^ 1);
    __syncthreads();
  }

  // epilogue: per warp two 16×16 float scratch tiles in the staging memory
  float* scr = (float*)sm + warp * 512;
  const int er = (lane * 8) >> 4, ec = (lane * 8) & 15;  // this lane's row and first column in a 16×16 tile
  #pragma unroll
  for (int i = 0; i < 4; i++) {
    if (i >= fi) break;
    int r = 64 * wm + 16 * i + er;
    if (dual) {
      wmma::store_matrix_sync(scr, acc[i][0], 16, wmma::mem_row_major);
      wmma::store_matrix_sync(scr + 256, acc[i][1], 16, wmma::mem_row_major);
      __syncwarp();
      if (r < rows) {
        i64 c0 = n0 + 16 * wn + ec;
        float* o = a.out[0] + (p0 + r) * N;
        u16* o16 = (u16*)a.out[0] + (p0 + r) * N;
        #pragma unroll
        for (int q = 0; q < 8; q++) {
          if (c0 + q >= N) continue;
          float v = swiglu_clamped(scr[er * 16 + ec + q], scr[256 + er * 16 + ec + q], a.limit);
          if (abf)
            o16[c0 + q] = (u16)mm_bf16_bits(v);
          else
            o[c0 + q] = v;
        }
      }
      __syncwarp();
    } else {
      #pragma unroll
      for (int j = 0; j < 2; j++) {
        wmma::store_matrix_sync(scr, acc[i][j], 16, wmma::mem_row_major);
        __syncwarp();
        if (r < rows) {
          i64 c0 = n0 + 32 * wn + 16 * j + ec;
          int s = rowP[r];
          float rs = a.row_scale[s];
          float* o = a.scatter + (i64)s * N;
          #pragma unroll
          for (int q = 0; q < 8; q++)
            if (c0 + q < N) o[c0 + q] = rs * scr[er * 16 + ec + q];
        }
        __syncwarp();
      }
    }
  }
}
#endif

// The kernels (glmf_moe_mma_bf16: A in bf16, a_round = 2; separate
// kernels so that each gets its own registers): empty where bf16 tensor
// cores are missing (the portable compute_75 PTX); the backend launches
// them only on compute 9.0 and later, where the sm_90 PTX is loaded.
#ifdef GLMF_EMU
KERNEL(glmf_moe_mma, GemmArgs) { moe_mma_body<false>(a); }
KERNEL(glmf_moe_mma_bf16, GemmArgs) { moe_mma_body<true>(a); }
#else
KERNEL_BOUNDS(glmf_moe_mma, GemmArgs, 256, 2) {
#ifdef GLMF_MOE_MMA
  moe_mma_body<false>(a);
#endif
}
KERNEL_BOUNDS(glmf_moe_mma_bf16, GemmArgs, 256, 2) {
#ifdef GLMF_MOE_MMA
  moe_mma_body<true>(a);
#endif
}
#endif
