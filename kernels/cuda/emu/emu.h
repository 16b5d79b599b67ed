// emu.h: the CUDA execution model on the CPU, for glmflash's kernel sources
// compiled with -DGLMF_EMU (see emu.cpp). Each block runs its threads as
// fibers on one OS thread; __syncthreads and warp shuffles are barriers
// among them; __shared__ variables are statics (blocks run one at a time).
// It exists to test the CUDA backend's logic where no GPU is present; it
// is not fast and it is not the evidence for anything GPU.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct double2 {
  double x, y;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }

struct emu_dim3 {
  unsigned x, y, z;
};

namespace emu {
struct Fiber;
extern Fiber* cur;
extern emu_dim3 block_idx, block_dim, grid_dim;
const emu_dim3& thread_idx();
void sync();
void warp_exchange(const void* in, void* out, int size, int src_lane);
void warp_barrier();
void* dyn_smem();
typedef void (*Trampoline)(void**);
struct Reg {
  Reg(const char* name, Trampoline t, unsigned long args_size);
};
}  // namespace emu

#define __global__
#define __device__
#define __host__
#define __forceinline__
#define __restrict__
#define __shared__ static
#define __align__(n)
#define threadIdx (emu::thread_idx())
#define blockIdx (emu::block_idx)
#define blockDim (emu::block_dim)
#define gridDim (emu::grid_dim)

inline void __syncthreads() { emu::sync(); }
// The whole warp must call it (the kernels pass the full mask).
inline void __syncwarp(unsigned = 0xffffffffu) { emu::warp_barrier(); }

inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Rounded single operations, never contracted into fused ones (the
// emulator is compiled with -ffp-contract=fast): volatile keeps each
// rounding.
inline float __fmul_rn(float a, float b) {
  volatile float r = a * b;
  return r;
}
inline float __fadd_rn(float a, float b) {
  volatile float r = a + b;
  return r;
}

// Fibers switch only at barriers, so read-modify-write is atomic here.
inline int atomicAdd(int* p, int v) {
  int o = *p;
  *p = o + v;
  return o;
}
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  unsigned long long o = *p;
  *p = o + v;
  return o;
}

template <class T>
inline T __shfl_xor_sync(unsigned, T v, int lane_mask) {
  T out;
  emu::warp_exchange(&v, &out, sizeof(T), -lane_mask - 1);
  return out;
}
template <class T>
inline T __shfl_sync(unsigned, T v, int src_lane) {
  T out;
  emu::warp_exchange(&v, &out, sizeof(T), src_lane);
  return out;
}

using std::isinf;
using std::isnan;


// bfloat16 storage type (cuda_bf16.h): its bits only.
struct __nv_bfloat16 {
  unsigned short x;
};

// A minimal nvcuda::wmma for moe_mma.cu: m16n16k16 bf16 fragments with fp32
// accumulators. A fragment holds its whole 16×16 matrix (a: [m][k], b:
// [k][n], accumulator: [m][n]) in every lane; loads and fills are done by
// every lane, mma_sync and store_matrix_sync by lane 0 only (the results
// are the same in every lane, so the others would repeat its work; a kernel
// must therefore read an accumulator only through store_matrix_sync, after
// a __syncwarp). Sums are in float, in ascending k.
namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };
template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "emu wmma: m16n16k16 only");
  float v[16][16];
  enum { num_elements = 256 };
};
template <class L>
struct emu_is_row {
  static const bool v = false;
};
template <>
struct emu_is_row<row_major> {
  static const bool v = true;
};
inline bool emu_lane0() {
  const emu_dim3& t = emu::thread_idx();
  return (t.x + t.y * emu::block_dim.x + t.z * emu::block_dim.x * emu::block_dim.y) % 32 == 0;
}
inline float emu_bf16(const __nv_bfloat16& b) {
  unsigned u = (unsigned)b.x << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
template <class L>
inline void load_matrix_sync(fragment<matrix_a, 16, 16, 16, __nv_bfloat16, L>& f, const __nv_bfloat16* p, unsigned ldm) {
  for (int m = 0; m < 16; m++)
    for (int k = 0; k < 16; k++)
      f.v[m][k] = emu_bf16(emu_is_row<L>::v ? p[m * ldm + k] : p[k * ldm + m]);
}
template <class L>
inline void load_matrix_sync(fragment<matrix_b, 16, 16, 16, __nv_bfloat16, L>& f, const __nv_bfloat16* p, unsigned ldm) {
  for (int k = 0; k < 16; k++)
    for (int n = 0; n < 16; n++)
      f.v[k][n] = emu_bf16(emu_is_row<L>::v ? p[k * ldm + n] : p[n * ldm + k]);
}
inline void fill_fragment(fragment<accumulator, 16, 16, 16, float>& f, float x) {
  for (int m = 0; m < 16; m++)
    for (int n = 0; n < 16; n++) f.v[m][n] = x;
}
template <class LA, class LB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float>& d, const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LA>& a,
                     const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LB>& b, const fragment<accumulator, 16, 16, 16, float>& c) {
  if (!emu_lane0()) return;
  for (int m = 0; m < 16; m++)
    for (int n = 0; n < 16; n++) {
      float s = c.v[m][n];
      for (int k = 0; k < 16; k++) s += a.v[m][k] * b.v[k][n];
      d.v[m][n] = s;
    }
}
inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f, unsigned ldm, layout_t l) {
  if (!emu_lane0()) return;
  for (int m = 0; m < 16; m++)
    for (int n = 0; n < 16; n++) (l == mem_row_major ? p[m * ldm + n] : p[n * ldm + m]) = f.v[m][n];
}
}  // namespace wmma
}  // namespace nvcuda

struct alignas(16) float4 {
  float x, y, z, w;
};
