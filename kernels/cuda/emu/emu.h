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
