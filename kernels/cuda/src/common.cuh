// Common definitions for glmflash's CUDA kernels.
//
// Conventions (kernels/cuda/README.md has more):
//  - every kernel takes exactly one argument, a struct passed by value whose
//    fields are all 8 bytes wide (pointers, long long, double), so that the
//    Go mirror in kernels/cuda has the same layout with no padding rules;
//  - activations are fp32; weights are bf16 or fp32, chosen per weight by a
//    `*_bf16` flag, read through ldw(); GEMM weights may also be fp8 e4m3
//    with block scales (GemmArgs.w_type, ldwt());
//  - where the CPU kernels evaluate exp/log/sqrt in double, these do too, so
//    both backends round the same way;
//  - reductions use fixed trees (no float atomics), so results do not
//    depend on scheduling.
//
// With GLMF_EMU defined the sources compile as plain C++ against emu.h, a
// CPU emulation of the CUDA execution model used to test the backend on
// machines without a GPU; nothing here may depend on which one is used.
#pragma once

#ifdef GLMF_EMU
#include "../emu/emu.h"
#define KERNEL(name, T)                                                        \
  static void name##_impl(const T a);                                          \
  static emu::Reg name##_reg(#name, [](void** p) { name##_impl(*(const T*)p[0]); }, sizeof(T)); \
  static void name##_impl(const T a)
#define DYN_SMEM(type, name) type* name = (type*)emu::dyn_smem()
#define DEVFN static inline
#define KERNEL_BOUNDS(name, T, threads, blocks) KERNEL(name, T)
#define PDL_ENTER()
#else
// Programmatic dependent launch (Device.PDL): a kernel may start before
// the one before it in the stream has finished, so every kernel first
// waits for it (griddepcontrol.wait: its grid done, its writes visible;
// a no-op without PDL), then lets the next kernel launch
// (griddepcontrol.launch_dependents), which waits the same way. Every
// kernel must begin with PDL_ENTER(): KERNEL and KERNEL_BOUNDS do it (their
// body is a function the entry calls); TestEveryKernelEntersPDL checks the
// others.
#if __CUDA_ARCH__ >= 900
#define PDL_ENTER()                                 \
  asm volatile("griddepcontrol.wait;" ::: "memory"); \
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#else
#define PDL_ENTER()
#endif
#define KERNEL(name, T)                                                     \
  static __device__ __forceinline__ void name##_body(const T& a);           \
  extern "C" __global__ void name(const T a) { PDL_ENTER(); name##_body(a); } \
  static __device__ __forceinline__ void name##_body(const T& a)
// KERNEL with __launch_bounds__: at most threads per block, registers for
// at least blocks resident per SM.
#define KERNEL_BOUNDS(name, T, threads, blocks)                              \
  static __device__ __forceinline__ void name##_body(const T& a);           \
  extern "C" __global__ void __launch_bounds__(threads, blocks) name(const T a) { \
    PDL_ENTER();                                                             \
    name##_body(a);                                                          \
  }                                                                          \
  static __device__ __forceinline__ void name##_body(const T& a)
#define DYN_SMEM(type, name)                                                   \
  extern __shared__ __align__(16) unsigned char glmf_dyn_smem[];               \
  type* name = (type*)glmf_dyn_smem
#define DEVFN static __device__ __forceinline__
#endif

typedef long long i64;
typedef unsigned long long u64;
typedef unsigned short u16;
typedef unsigned char u8;

// bf16 bits → float.
DEVFN float bf16f(unsigned short b) { return __uint_as_float(((unsigned)b) << 16); }

// bf16_round rounds a float to the nearest bfloat16 (ties to even), as a
// float; NaN stays NaN.
DEVFN float bf16_round(float x) {
  unsigned u = __float_as_uint(x);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return x;
  u += 0x7fffu + ((u >> 16) & 1u);
  return __uint_as_float(u & 0xffff0000u);
}

// ldw reads element i of a weight stored as bf16 (isbf16 != 0) or fp32.
DEVFN float ldw(const void* w, i64 i, i64 isbf16) {
  return isbf16 ? bf16f(((const unsigned short*)w)[i]) : ((const float*)w)[i];
}

// fp8f decodes a float8 e4m3fn code exactly (the CPU's
// safetensors.F8E4M3ToFloat32): the code's exponent and mantissa bits placed
// in a float's, rescaled by 2^(127−7); subnormal codes become subnormal
// floats first, which the product makes exact again (no flush to zero:
// nvcc's default). 0x7f/0xff are NaN in e4m3fn.
DEVFN float fp8f(unsigned c) {
  if ((c & 0x7fu) == 0x7fu) return __uint_as_float(0x7fc00000u);
  return __uint_as_float(((c & 0x80u) << 24) | ((c & 0x7fu) << 20)) * 0x1p120f;
}

// fp8x2f: the values of the two fp8 e4m3 codes in the low 16 bits of c2
// (low byte → lo), exactly as fp8f: on sm_89+ one cvt.rn.f16x2.e4m3x2
// (every e4m3 value is an fp16 value, NaN codes NaN) and two exact
// widenings.
DEVFN void fp8x2f(unsigned c2, float& lo, float& hi) {
#if defined(GLMF_EMU) || __CUDA_ARCH__ < 890
  lo = fp8f(c2 & 0xffu);
  hi = fp8f((c2 >> 8) & 0xffu);
#else
  unsigned h2;
  unsigned short c = (unsigned short)c2;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(c));
  asm("cvt.f32.f16 %0, %1;" : "=f"(lo) : "h"((unsigned short)(h2 & 0xffffu)));
  asm("cvt.f32.f16 %0, %1;" : "=f"(hi) : "h"((unsigned short)(h2 >> 16)));
#endif
}

// Weight storage of GEMM weights (GemmArgs.w_type): fp32, bf16, or fp8
// e4m3 with one fp32 scale per 128×128 block.
#define WT_F32 0
#define WT_BF16 1
#define WT_FP8 2

// wt_size is the bytes of one element of storage t.
DEVFN i64 wt_size(i64 t) { return t == WT_FP8 ? 1 : t == WT_BF16 ? 2 : 4; }

// ldwt reads W[n][k] (row length K) of a weight stored as t; fp8 weights
// are dequantized with their block scale ws[(n/128)·ws_ld + k/128], in fp32
// as the CPU does.
DEVFN float ldwt(const void* W, i64 t, const float* ws, i64 ws_ld, i64 n, i64 K, i64 k) {
  if (t == WT_FP8) return fp8f(((const unsigned char*)W)[n * K + k]) * ws[(n >> 7) * ws_ld + (k >> 7)];
  return ldw(W, n * K + k, t);
}

// The CPU's float32(1/(1+exp(-x))) with exp in double.
DEVFN float sigmoidf_d(float x) { return (float)(1.0 / (1.0 + exp((double)(-x)))); }
DEVFN float siluf_d(float x) { return x * sigmoidf_d(x); }

// The clamped SwiGLU of one element: silu(min(g, limit)) · clamp(u, ±limit)
// (limit ≤ 0 or infinite: no clamp).
DEVFN float swiglu_clamped(float g, float u, double limit) {
  float lim = (float)limit;
  if (limit > 0 && !isinf(limit)) {
    if (g > lim) g = lim;
    if (u > lim) u = lim; else if (u < -lim) u = -lim;
  }
  return siluf_d(g) * u;
}

// Order-preserving map of a float to uint32 (larger float → larger key).
DEVFN unsigned ordf(float f) {
  unsigned u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Composite key that sorts by value descending, then index ascending, as
// the CPU's stable sorts do: ascending keys = the CPU's order.
DEVFN u64 desc_key(float v, unsigned i) { return ((u64)(~ordf(v)) << 32) | (u64)i; }

// block_reduce combines one value per thread over the block with op
// (blockDim.x a power of two ≤ 1024) in a fixed tree: deterministic. Every
// thread gets the result. Step s combines value t with value t + s (t < s),
// s = blockDim/2 … 1: through shared memory while s ≥ 32, then within warp
// 0 by shuffles, the same pairs in the same order (so the same bits as
// the all-shared-memory tree) with five fewer block barriers.
template <class T, class Op>
DEVFN T block_reduce(T v, Op op) {
  __shared__ T red[1024];
  int t = threadIdx.x, n = blockDim.x;
  red[t] = v;
  __syncthreads();
  int s = n / 2;
  for (; s >= 32; s >>= 1) {
    if (t < s) red[t] = op(red[t], red[t + s]);
    __syncthreads();
  }
  if (n >= 32) {
    if (t < 32) {
      T x = red[t];
      for (; s > 0; s >>= 1) {
        T y = __shfl_sync(0xffffffffu, x, (t + s) & 31);
        if (t < s) x = op(x, y);
      }
      if (t == 0) red[0] = x;
    }
    __syncthreads();
  } else {
    for (; s > 0; s >>= 1) {
      if (t < s) red[t] = op(red[t], red[t + s]);
      __syncthreads();
    }
  }
  T r = red[0];
  __syncthreads();
  return r;
}

// Block-wide sum (float, double), max (float) and minimum (u64).
DEVFN float block_sum(float v) { return block_reduce(v, [](float x, float y) { return x + y; }); }
DEVFN double block_sum_d(double v) { return block_reduce(v, [](double x, double y) { return x + y; }); }
DEVFN float block_max(float v) { return block_reduce(v, [](float x, float y) { return fmaxf(x, y); }); }
DEVFN u64 block_min_u64(u64 v) { return block_reduce(v, [](u64 x, u64 y) { return y < x ? y : x; }); }

// Sum over a warp (all 32 lanes active), fixed butterfly.
DEVFN float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

DEVFN double warp_sum_d(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Exclusive prefix sum of one int per thread over the block (power-of-two
// blockDim ≤ 1024); *total receives the sum.
DEVFN int block_exscan(int v, int* total) {
  __shared__ int scan_s[1024];
  int t = threadIdx.x;
  scan_s[t] = v;
  __syncthreads();
  for (int o = 1; o < (int)blockDim.x; o <<= 1) {
    int add = t >= o ? scan_s[t - o] : 0;
    __syncthreads();
    scan_s[t] += add;
    __syncthreads();
  }
  int incl = scan_s[t];
  *total = scan_s[blockDim.x - 1];
  __syncthreads();
  return incl - v;
}

// rmsnorm_row: y = w ⊙ x / sqrt(mean(x²)+eps) for one row, by the whole
// block (the CPU's order of float32 operations, with the square root in
// double). x and y may alias.
// rms_inv: 1/sqrt(mean(x²)+eps) of a row of n, by the whole block (the
// CPU's float32 sum order per thread, a fixed tree across threads, the
// square root in double).
// A thread's values are loaded ROW_BATCH at a time, so that their loads
// are in flight together (a row of a decode step is one block: latency,
// not bandwidth, bounds it); the sums keep each thread's ascending order.
#define ROW_BATCH 8

DEVFN float rms_inv(const float* x, i64 n, float eps) {
  float s = 0;
  i64 st = blockDim.x;
  for (i64 i0 = threadIdx.x; i0 < n; i0 += ROW_BATCH * st) {
    float v[ROW_BATCH];
#pragma unroll
    for (int q = 0; q < ROW_BATCH; q++) v[q] = i0 + q * st < n ? x[i0 + q * st] : 0.f;
#pragma unroll
    for (int q = 0; q < ROW_BATCH; q++)
      if (i0 + q * st < n) s += v[q] * v[q];
  }
  s = block_sum(s);
  return (float)(1.0 / sqrt((double)(s / (float)n + eps)));
}

// ldw_n loads N weights w[i0 + q·st] (q < N; zeros at or past n) as
// floats: every load issued before any conversion (a conversion next to its
// load would wait for it, one load at a time).
template <int N>
DEVFN void ldw_n(const void* w, i64 bf16, i64 i0, i64 st, i64 n, float* out) {
  if (bf16) {
    unsigned short r[N];
#pragma unroll
    for (int q = 0; q < N; q++) r[q] = i0 + q * st < n ? ((const unsigned short*)w)[i0 + q * st] : (unsigned short)0;
#pragma unroll
    for (int q = 0; q < N; q++) out[q] = bf16f(r[q]);
  } else {
#pragma unroll
    for (int q = 0; q < N; q++) out[q] = i0 + q * st < n ? ((const float*)w)[i0 + q * st] : 0.f;
  }
}

DEVFN void rmsnorm_row(float* y, const float* x, i64 D, const void* w, i64 w_bf16, float eps) {
  float r = rms_inv(x, D, eps);
  i64 st = blockDim.x;
  for (i64 i0 = threadIdx.x; i0 < D; i0 += ROW_BATCH * st) {
    float v[ROW_BATCH], wv[ROW_BATCH];  // every load before any store (y may be x)
#pragma unroll
    for (int q = 0; q < ROW_BATCH; q++) v[q] = i0 + q * st < D ? x[i0 + q * st] : 0.f;
    ldw_n<ROW_BATCH>(w, w_bf16, i0, st, D, wv);
#pragma unroll
    for (int q = 0; q < ROW_BATCH; q++)
      if (i0 + q * st < D) y[i0 + q * st] = wv[q] * (v[q] * r);
  }
  __syncthreads();
}

// radix_select finds, among the elements e(i) reports (key, weight > 0),
// the smallest key K whose cumulative weight in key order reaches target
// (≥ 1); when the total is below target it returns the largest key. ~0 when
// no element. Block-wide; 8 passes of 8-bit digits.
template <class Elem>
DEVFN u64 radix_select(i64 n, u64 target, Elem e) {
  __shared__ u64 hist[256];
  __shared__ u64 prefix_s, tgt_s;
  u64 prefix = 0, mask = 0;
  if (threadIdx.x == 0) tgt_s = target;
  for (int shift = 56; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
    __syncthreads();
    for (i64 i = threadIdx.x; i < n; i += blockDim.x) {
      u64 key, w;
      if (!e(i, &key, &w) || w == 0) continue;
      if ((key & mask) != prefix) continue;
      atomicAdd(&hist[(key >> shift) & 255], w);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      u64 t = tgt_s;
      int pick = -1, last = -1;
      for (int b = 0; b < 256; b++) {
        if (hist[b] == 0) continue;
        last = b;
        if (t <= hist[b]) { pick = b; break; }
        t -= hist[b];
      }
      if (pick < 0 && last >= 0) { pick = last; t = hist[last]; }
      if (pick < 0) { prefix_s = ~0ull; tgt_s = 0; }
      else { prefix_s = prefix | ((u64)pick << shift); tgt_s = t; }
    }
    __syncthreads();
    prefix = prefix_s;
    if (prefix == ~0ull) return prefix;
    mask |= (u64)255 << shift;
    __syncthreads();
  }
  return prefix;
}

// The per-step batch metadata every kernel that needs sequence structure
// reads (uploaded once per step by the backend).
struct BatchMeta {
  const int* seq_slot;  // [S] cache slot of each sequence
  const int* seq_pos0;  // [S] tokens cached before this step
  const int* seq_n;     // [S] new tokens
  const int* seq_row0;  // [S] first row
  const int* row_seq;   // [T] sequence of each row
  const int* row_pos;   // [T] absolute position of each row
  const int* last_row;  // [S] last row of each sequence
  i64 S, T;
};

// mma_bf16_16816: d = a·b + c, one warp-wide mma.m16n8k16 with bf16 inputs
// and fp32 accumulators (every lane of the warp calls it with its own
// fragments, in the PTX ISA's layout "Matrix Fragments for mma.m16n8k16"
// of .bf16: lane l, g = l/4, t = l%4, each register's low half first):
//   a[0] = A[g][2t..2t+1]     a[1] = A[g+8][2t..2t+1]
//   a[2] = A[g][2t+8..2t+9]   a[3] = A[g+8][2t+8..2t+9]
//   b[0] = B[2t..2t+1][g]     b[1] = B[2t+8..2t+9][g]
//   c[0..1] = C[g][2t..2t+1]  c[2..3] = C[g+8][2t..2t+1]   (d likewise)
// The tensor cores on sm_80+; mma_bf16_16816_shfl (a lane gathers its
// operands by shuffles, sums in ascending k) where they are missing (the
// portable compute_75 PTX, never launched there by the backend) and, with
// a per-warp scratch instead of shuffles, on the emulator.
DEVFN float mma_bf16_lo(unsigned r) { return __uint_as_float(r << 16); }
DEVFN float mma_bf16_hi(unsigned r) { return __uint_as_float(r & 0xffff0000u); }
DEVFN float mma_bf16_half(unsigned r, int hi) { return hi ? mma_bf16_hi(r) : mma_bf16_lo(r); }

DEVFN void mma_bf16_16816_shfl(float d[4], const unsigned a[4], const unsigned b[2], const float c[4]) {
  int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  float s[4] = {c[0], c[1], c[2], c[3]};
  // A[row][k] lives in lane (row%8)·4 + (k%8)/2, register (row ≥ 8) + 2(k ≥ 8);
  // B[k][n] in lane n·4 + (k%8)/2, register (k ≥ 8)
  for (int kb = 0; kb < 2; kb++)
    for (int tt = 0; tt < 4; tt++) {
      unsigned a0 = __shfl_sync(0xffffffffu, a[2 * kb], g * 4 + tt);
      unsigned a1 = __shfl_sync(0xffffffffu, a[2 * kb + 1], g * 4 + tt);
      unsigned b0 = __shfl_sync(0xffffffffu, b[kb], (2 * t) * 4 + tt);
      unsigned b1 = __shfl_sync(0xffffffffu, b[kb], (2 * t + 1) * 4 + tt);
      for (int h = 0; h < 2; h++) {  // k = 8kb + 2tt + h
        float x0 = mma_bf16_half(a0, h), x1 = mma_bf16_half(a1, h);
        float y0 = mma_bf16_half(b0, h), y1 = mma_bf16_half(b1, h);
        s[0] += x0 * y0;
        s[1] += x0 * y1;
        s[2] += x1 * y0;
        s[3] += x1 * y1;
      }
    }
  for (int i = 0; i < 4; i++) d[i] = s[i];
}

#ifdef GLMF_EMU
// The emulator: lanes publish their fragments in a per-warp scratch, then
// each computes its four outputs, summing in ascending k.
DEVFN void mma_bf16_16816(float d[4], const unsigned a[4], const unsigned b[2], const float c[4]) {
  static unsigned sa[32][32][4], sb[32][32][2];
  const emu_dim3& ti = threadIdx;
  int lin = ti.x + ti.y * blockDim.x + ti.z * blockDim.x * blockDim.y;
  int w = lin / 32, lane = lin % 32, g = lane >> 2, t = lane & 3;
  for (int i = 0; i < 4; i++) sa[w][lane][i] = a[i];
  for (int i = 0; i < 2; i++) sb[w][lane][i] = b[i];
  emu::warp_barrier();
  float s[4] = {c[0], c[1], c[2], c[3]};
  for (int i = 0; i < 4; i++) {
    int row = g + 8 * (i >> 1), n = 2 * t + (i & 1);
    for (int k = 0; k < 16; k++) {
      float x = mma_bf16_half(sa[w][(row % 8) * 4 + (k % 8) / 2][(row >= 8) + 2 * (k >= 8)], k & 1);
      float y = mma_bf16_half(sb[w][n * 4 + (k % 8) / 2][k >= 8], k & 1);
      s[i] += x * y;
    }
  }
  emu::warp_barrier();
  for (int i = 0; i < 4; i++) d[i] = s[i];
}
#else
DEVFN void mma_bf16_16816(float d[4], const unsigned a[4], const unsigned b[2], const float c[4]) {
#if __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
#else
  mma_bf16_16816_shfl(d, a, b, c);
#endif
}
#endif
