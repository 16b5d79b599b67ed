// emu.cpp: a CPU stand-in for the parts of the CUDA driver, cuBLAS and
// cuBLASLt that glmflash calls, built as one shared library
// (bin/libglmflash-cudaemu.so, `make cudaemu`). The CUDA backend loads it
// instead of libcuda/libcublas when GLMFLASH_CUDA_EMULATOR names it, so
// its tests run on machines without a GPU. Kernels come from the real
// sources (../src/all.cu) compiled as C++ against emu.h; the PTX handed to
// cuModuleLoadData is ignored.
#define GLMF_EMU 1
#include "emu.h"

#include <sys/mman.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace emu {

struct Fiber {
  void* sp;  // saved stack pointer while switched out
  emu_dim3 tid;
  int lin;
  bool done;
  char* stack;
};

// A minimal context switch (x86-64 System V): save the callee-saved
// registers on the current stack, store its pointer in *save, continue on
// the stack next. swapcontext would also save the signal mask with a
// system call on every switch, which made emulation ten times slower.
extern "C" void emu_switch(void** save, void* next);
asm(R"(
.text
.globl emu_switch
.type emu_switch,@function
emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size emu_switch, .-emu_switch
)");

Fiber* cur;
emu_dim3 block_idx, block_dim, grid_dim;
static void* sched_sp;
static std::vector<Fiber> fibers;
static int alive, arrived;
static unsigned gen;
static int warp_alive[32], warp_arrived[32];
static unsigned warp_gen[32];
static unsigned char xbuf[1024][8];
static std::vector<unsigned char> dsmem;
static Trampoline cur_fn;
static void** cur_params;
static const size_t kStack = 256 << 10;
static long long spins;

const emu_dim3& thread_idx() { return cur->tid; }
void* dyn_smem() { return dsmem.data(); }

static void yield() { emu_switch(&cur->sp, sched_sp); }

static void stuck() {
  fprintf(stderr, "cuda emulator: threads of a block wait at barriers that can never release (divergent __syncthreads or shuffle)\n");
  abort();
}

void sync() {
  unsigned g = gen;
  if (++arrived == alive) {
    arrived = 0;
    gen++;
    return;
  }
  while (gen == g) {
    if (++spins > 2000000000LL) stuck();
    yield();
  }
}

static void warp_sync() {
  int w = cur->lin / 32;
  unsigned g = warp_gen[w];
  if (++warp_arrived[w] == warp_alive[w]) {
    warp_arrived[w] = 0;
    warp_gen[w]++;
    return;
  }
  while (warp_gen[w] == g) {
    if (++spins > 2000000000LL) stuck();
    yield();
  }
}

void warp_barrier() { warp_sync(); }

// src_lane ≥ 0: read that lane; src_lane < 0: xor with (−src_lane − 1).
void warp_exchange(const void* in, void* out, int size, int src_lane) {
  memcpy(xbuf[cur->lin], in, size);
  warp_sync();
  int lane = cur->lin % 32;
  int src = src_lane >= 0 ? src_lane : (lane ^ (-src_lane - 1));
  memcpy(out, xbuf[(cur->lin / 32) * 32 + src], size);
  warp_sync();
}

static void entry() {
  cur_fn(cur_params);
  cur->done = true;
  emu_switch(&cur->sp, sched_sp);
  abort();  // a finished fiber is never resumed
}

// fresh_stack prepares a stack whose first switch "returns" into entry
// with the alignment of a function entry.
static void* fresh_stack(char* stack) {
  uintptr_t top = ((uintptr_t)(stack + kStack)) & ~(uintptr_t)15;
  void** sp = (void**)(top - 16);
  sp[0] = (void*)entry;  // the return address emu_switch's ret takes
  sp[1] = nullptr;
  sp -= 6;               // rbp rbx r12 r13 r14 r15, popped as zeros
  for (int i = 0; i < 6; i++) sp[i] = nullptr;
  return sp;
}

struct Kernel {
  Trampoline fn;
  unsigned long args_size;  // every kernel takes one struct of this size
};
static std::map<std::string, Kernel>& registry() {
  static std::map<std::string, Kernel> r;
  return r;
}
Reg::Reg(const char* name, Trampoline t, unsigned long args_size) { registry()[name] = Kernel{t, args_size}; }

static void run_block(int nthreads) {
  alive = nthreads;
  arrived = 0;
  for (int w = 0; w < 32; w++) warp_alive[w] = warp_arrived[w] = 0;
  for (int i = 0; i < nthreads; i++) {
    Fiber& f = fibers[i];
    f.lin = i;
    f.tid.x = i % block_dim.x;
    f.tid.y = (i / block_dim.x) % block_dim.y;
    f.tid.z = i / (block_dim.x * block_dim.y);
    f.done = false;
    warp_alive[i / 32]++;
    f.sp = fresh_stack(f.stack);
  }
  spins = 0;
  int left = nthreads;
  while (left > 0) {
    for (int i = 0; i < nthreads; i++) {
      Fiber& f = fibers[i];
      if (f.done) continue;
      cur = &f;
      emu_switch(&sched_sp, f.sp);
      if (f.done) {
        left--;
        alive--;
        int w = f.lin / 32;
        warp_alive[w]--;
        if (arrived > 0 && arrived >= alive) {
          arrived = 0;
          gen++;
        }
        if (warp_arrived[w] > 0 && warp_arrived[w] >= warp_alive[w]) {
          warp_arrived[w] = 0;
          warp_gen[w]++;
        }
      }
    }
  }
}

static std::mutex launch_mu;

int launch(Trampoline fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned smem, void** params) {
  std::lock_guard<std::mutex> lk(launch_mu);
  int n = bx * by * bz;
  if (n < 1 || n > 1024) return 1;
  if ((int)fibers.size() < n) {
    size_t old = fibers.size();
    fibers.resize(n);
    for (size_t i = old; i < fibers.size(); i++) {
      void* p = mmap(nullptr, kStack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) return 2;
      fibers[i].stack = (char*)p;
    }
  }
  dsmem.assign(smem + 16, 0xA5);  // dynamic shared memory starts as garbage
  block_dim = {bx, by, bz};
  grid_dim = {gx, gy, gz};
  cur_fn = fn;
  cur_params = params;
  for (unsigned z = 0; z < gz; z++)
    for (unsigned y = 0; y < gy; y++)
      for (unsigned x = 0; x < gx; x++) {
        block_idx = {x, y, z};
        run_block(n);
      }
  return 0;
}

const Kernel* find(const char* name) {
  auto it = registry().find(name);
  return it == registry().end() ? nullptr : &it->second;
}

}  // namespace emu

#include "../src/all.cu"

// ---- the driver API subset ---------------------------------------------------
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
struct CUfunc_st {
  emu::Trampoline fn;
  unsigned long args_size;
};
typedef CUfunc_st* CUfunction;

extern "C" {
static bool capturing;  // a stream capture is in progress (graphs below)
static std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
static unsigned long long allocated;
static std::map<unsigned long long, size_t> sizes;
static std::mutex mem_mu;

CUresult cuInit(unsigned) { return 0; }
CUresult cuDriverGetVersion(int* v) { *v = 13000; return 0; }
CUresult cuDeviceGetCount(int* n) { *n = 1; return 0; }
CUresult cuDeviceGet(CUdevice* d, int i) { if (i != 0) return 101; *d = 0; return 0; }
CUresult cuDeviceGetName(char* name, int len, CUdevice) { snprintf(name, len, "glmflash CUDA emulator (CPU)"); return 0; }
CUresult cuDeviceGetAttribute(int* v, int attr, CUdevice) {
  switch (attr) {
  case 75: *v = 9; break;   // compute capability major
  case 76: *v = 0; break;   // minor
  case 16: *v = 4; break;   // multiprocessors
  case 1: *v = 1024; break; // max threads per block
  default: *v = 0;
  }
  return 0;
}
CUresult cuDeviceTotalMem_v2(size_t* b, CUdevice) { *b = (size_t)8 << 30; return 0; }
CUresult cuDevicePrimaryCtxRetain(void** ctx, CUdevice) { *ctx = (void*)0x1; return 0; }
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice) { return 0; }
CUresult cuCtxSetCurrent(void*) { return 0; }
CUresult cuCtxSynchronize() { return 0; }
CUresult cuModuleLoadData(void** m, const void*) { *m = (void*)0x2; return 0; }
CUresult cuModuleLoadDataEx(void** m, const void*, unsigned, void*, void*) { *m = (void*)0x2; return 0; }
CUresult cuModuleUnload(void*) { return 0; }
CUresult cuModuleGetFunction(CUfunction* f, void*, const char* name) {
  const emu::Kernel* k = emu::find(name);
  if (!k) return 500;  // CUDA_ERROR_NOT_FOUND
  *f = new CUfunc_st{k->fn, k->args_size};
  return 0;
}
CUresult cuFuncSetAttribute(CUfunction, int, int) { return 0; }
CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t n) {
  void* m = nullptr;
  if (posix_memalign(&m, 256, n ? n : 1)) return 2;
  memset(m, 0xCD, n);  // device memory starts as garbage
  std::lock_guard<std::mutex> lk(mem_mu);
  allocated += n;
  sizes[(unsigned long long)m] = n;
  *p = (CUdeviceptr)m;
  return 0;
}
CUresult cuMemFree_v2(CUdeviceptr p) {
  std::lock_guard<std::mutex> lk(mem_mu);
  auto it = sizes.find(p);
  if (it == sizes.end()) return 1;
  allocated -= it->second;
  sizes.erase(it);
  free((void*)p);
  return 0;
}
CUresult cuMemGetInfo_v2(size_t* freeb, size_t* total) {
  *total = (size_t)8 << 30;
  *freeb = *total - allocated;
  return 0;
}
CUresult cuMemAllocHost_v2(void** p, size_t n) { *p = malloc(n ? n : 1); return *p ? 0 : 2; }
CUresult cuMemFreeHost(void* p) { free(p); return 0; }
CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void* s, size_t n) { memcpy((void*)d, s, n); return 0; }
CUresult cuMemcpyDtoH_v2(void* d, CUdeviceptr s, size_t n) { memcpy(d, (void*)s, n); return 0; }
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void* s, size_t n, void*) { if (capturing) return 900; memcpy((void*)d, s, n); return 0; }
CUresult cuMemcpyDtoHAsync_v2(void* d, CUdeviceptr s, size_t n, void*) { if (capturing) return 900; memcpy(d, (void*)s, n); return 0; }
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, void*) { if (capturing) return 900; memmove((void*)d, (void*)s, n); return 0; }
CUresult cuMemsetD32Async(CUdeviceptr d, unsigned v, size_t n, void*) {
  if (capturing) return 900;
  unsigned* p = (unsigned*)d;
  for (size_t i = 0; i < n; i++) p[i] = v;
  return 0;
}
CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, void*) { memset((void*)d, v, n); return 0; }
// Graphs: a capture records each launch with a copy of its argument
// struct; a replay launches the records in order. Anything else issued on
// a capturing stream is refused, as the driver refuses unsupported work.
struct Launch {
  CUfunction f;  // a kernel launch, or (f == nullptr) a library call:
  unsigned g[3], b[3], smem;
  std::vector<unsigned char> args;
  std::function<void()> call;
};
struct Graph {
  std::vector<Launch> launches;
};
static Graph* capture;

CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned smem, void*, void** params, void**) {
  if (gx == 0 || gy == 0 || gz == 0) return 1;  // CUDA_ERROR_INVALID_VALUE
  if (capturing) {
    Launch l{f, {gx, gy, gz}, {bx, by, bz}, smem, {}};
    l.args.assign((unsigned char*)params[0], (unsigned char*)params[0] + f->args_size);
    capture->launches.push_back(std::move(l));
    return 0;
  }
  return emu::launch(f->fn, gx, gy, gz, bx, by, bz, smem, params) ? 1 : 0;
}
CUresult cuStreamBeginCapture_v2(void*, int) {
  if (capturing) return 900;  // CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
  capturing = true;
  capture = new Graph();
  return 0;
}
CUresult cuStreamEndCapture(void*, void** g) {
  if (!capturing) return 901;
  capturing = false;
  *g = capture;
  capture = nullptr;
  return 0;
}
CUresult cuGraphInstantiateWithFlags(void** exec, void* g, unsigned long long) {
  *exec = new Graph(*(Graph*)g);
  return 0;
}
CUresult cuGraphLaunch(void* exec, void*) {
  for (auto& l : ((Graph*)exec)->launches) {
    if (!l.f) {
      l.call();
      continue;
    }
    void* p = l.args.data();
    if (emu::launch(l.f->fn, l.g[0], l.g[1], l.g[2], l.b[0], l.b[1], l.b[2], l.smem, &p)) return 1;
  }
  return 0;
}
CUresult cuGraphExecDestroy(void* exec) { delete (Graph*)exec; return 0; }
CUresult cuGraphDestroy(void* g) { delete (Graph*)g; return 0; }
CUresult cuStreamCreate(void** s, unsigned) { *s = (void*)0x3; return 0; }
CUresult cuStreamDestroy_v2(void*) { return 0; }
CUresult cuStreamSynchronize(void*) { return capturing ? 900 : 0; }
struct Ev { double ms; };
CUresult cuEventCreate(void** e, unsigned) { *e = new Ev{0}; return 0; }
CUresult cuEventDestroy_v2(void* e) { delete (Ev*)e; return 0; }
CUresult cuEventRecord(void* e, void*) {
  ((Ev*)e)->ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return 0;
}
CUresult cuEventSynchronize(void*) { return 0; }
// Every stream runs in order on the host, so a wait is already satisfied
// (and, inside a capture, the launches are recorded in issue order).
CUresult cuStreamWaitEvent(void*, void*, unsigned) { return 0; }
CUresult cuEventElapsedTime(float* ms, void* a, void* b) { *ms = (float)(((Ev*)b)->ms - ((Ev*)a)->ms); return 0; }
CUresult cuGetErrorString(CUresult, const char** s) { *s = "emulated CUDA error"; return 0; }
CUresult cuGetErrorName(CUresult, const char** s) { *s = "CUDA_ERROR_EMULATED"; return 0; }

// ---- cuBLAS / cuBLASLt subset -------------------------------------------------
int cublasCreate_v2(void** h) { *h = (void*)0x4; return 0; }
int cublasDestroy_v2(void*) { return 0; }
int cublasSetStream_v2(void*, void*) { return 0; }
int cublasSetMathMode(void*, int) { return 0; }
int cublasGetVersion_v2(void*, int* v) { *v = 130000; return 0; }
// Column-major C = op(A)·op(B); op 0 = N, 1 = T. The sums are formed in
// double: a stand-in for cuBLAS's blocked fp32 sums, which land closer to
// the exact product than one long contracted fp32 chain would.
int cublasSgemm_v2(void* h, int ta, int tb, int m, int n, int k, const float* alpha, const float* A, int lda,
                   const float* B, int ldb, const float* beta, float* C, int ldc) {
  if (capturing) {  // recorded with its scalars, run at replay
    float al = *alpha, be = *beta;
    Launch l{};
    l.call = [=] {
      cublasSgemm_v2(h, ta, tb, m, n, k, &al, A, lda, B, ldb, &be, C, ldc);
    };
    capture->launches.push_back(l);
    return 0;
  }
  for (int j = 0; j < n; j++)
    for (int i = 0; i < m; i++) {
      double s = 0;
      for (int l = 0; l < k; l++) {
        float a = ta ? A[l + (size_t)i * lda] : A[i + (size_t)l * lda];
        float b = tb ? B[j + (size_t)l * ldb] : B[l + (size_t)j * ldb];
        s += (double)a * (double)b;
      }
      float& c = C[i + (size_t)j * ldc];
      c = *alpha * (float)s + (*beta == 0 ? 0 : *beta * c);
    }
  return 0;
}
// cublasGemmEx for bf16 A and B, fp32 C and compute (the bf16 precision
// mode's only use); sums in double, like the Sgemm stand-in.
int cublasGemmEx(void* h, int ta, int tb, int m, int n, int k, const void* alpha, const void* A, int atype, int lda,
                 const void* B, int btype, int ldb, const void* beta, void* C, int ctype, int ldc, int compute, int algo) {
  if (atype != 14 || btype != 14 || ctype != 0) return 15;  // CUBLAS_STATUS_NOT_SUPPORTED
  if (capturing) {
    float al = *(const float*)alpha, be = *(const float*)beta;
    Launch l{};
    l.call = [=] {
      cublasGemmEx(h, ta, tb, m, n, k, &al, A, atype, lda, B, btype, ldb, &be, C, ctype, ldc, compute, algo);
    };
    capture->launches.push_back(l);
    return 0;
  }
  const unsigned short* a = (const unsigned short*)A;
  const unsigned short* b = (const unsigned short*)B;
  float* c = (float*)C;
  for (int j = 0; j < n; j++)
    for (int i = 0; i < m; i++) {
      double s = 0;
      for (int l = 0; l < k; l++) {
        float x = bf16f(ta ? a[l + (size_t)i * lda] : a[i + (size_t)l * lda]);
        float y = bf16f(tb ? b[j + (size_t)l * ldb] : b[l + (size_t)j * ldb]);
        s += (double)x * (double)y;
      }
      c[i + (size_t)j * ldc] = *(const float*)alpha * (float)s;
    }
  return 0;
}
int cublasLtCreate(void** h) { *h = (void*)0x5; return 0; }
int cublasLtDestroy(void*) { return 0; }
size_t cublasLtGetVersion() { return 130000; }

// cuBLASLt matmul: descriptors, a heuristic that offers three algorithms
// (four with GLMFLASH_CUDAEMU_LT_BAD_ALGO set, the fourth one wrong by 1%,
// for tests of the tuner's rejection), and the matmul itself. The
// algorithms differ as a GPU's do, in how they sum: 1 in double, 2 in
// float, 3 in double over two halves of k (split-k) added at the end.
struct LtDesc { int compute, scale, ta, tb; };
struct LtLayout { int type; unsigned long long rows, cols; long long ld; };
struct LtAlgo { unsigned long long data[8]; };
struct LtHeur { LtAlgo algo; size_t ws; int state; float waves; int reserved[4]; };
static const int lt_ids[4] = {1, 2, 3, 99};
static int lt_count() { return getenv("GLMFLASH_CUDAEMU_LT_BAD_ALGO") ? 4 : 3; }
static bool lt_valid(unsigned long long id) {
  for (int i = 0; i < lt_count(); i++)
    if ((unsigned long long)lt_ids[i] == id) return true;
  return false;
}
int cublasLtMatmulDescCreate(void** d, int compute, int scale) { *d = new LtDesc{compute, scale, 0, 0}; return 0; }
int cublasLtMatmulDescDestroy(void* d) { delete (LtDesc*)d; return 0; }
int cublasLtMatmulDescSetAttribute(void* d, int attr, const void* buf, size_t n) {
  LtDesc* x = (LtDesc*)d;
  if (n != 4) return 7;  // CUBLAS_STATUS_INVALID_VALUE
  int v = *(const int*)buf;
  switch (attr) {
  case 0: x->compute = v; break;
  case 1: x->scale = v; break;
  case 3: x->ta = v; break;
  case 4: x->tb = v; break;
  default: return 15;
  }
  return 0;
}
int cublasLtMatrixLayoutCreate(void** l, int type, unsigned long long rows, unsigned long long cols, long long ld) {
  if (type != 0 && type != 14) return 15;
  *l = new LtLayout{type, rows, cols, ld};
  return 0;
}
int cublasLtMatrixLayoutDestroy(void* l) { delete (LtLayout*)l; return 0; }
int cublasLtMatmulPreferenceCreate(void** p) { *p = new int(0); return 0; }
int cublasLtMatmulPreferenceDestroy(void* p) { delete (int*)p; return 0; }
int cublasLtMatmulPreferenceSetAttribute(void*, int, const void*, size_t) { return 0; }
int cublasLtMatmulAlgoGetHeuristic(void*, void*, void*, void*, void*, void*, void*, int requested, LtHeur* res, int* returned) {
  int n = requested < lt_count() ? requested : lt_count();
  for (int i = 0; i < n; i++) {
    memset(&res[i], 0, sizeof(LtHeur));
    res[i].algo.data[0] = lt_ids[i];
    res[i].waves = 1;
  }
  *returned = n;
  return 0;
}
int cublasLtMatmulAlgoCheck(void*, void*, void*, void*, void*, void*, const LtAlgo* algo, LtHeur* result) {
  if (!lt_valid(algo->data[0])) return 15;
  memset(result, 0, sizeof(LtHeur));
  result->algo = *algo;
  return 0;
}
int cublasLtMatmulAlgoConfigGetAttribute(const LtAlgo* algo, int attr, void* buf, size_t n, size_t* written) {
  if (n < 4) return 7;
  int v;
  switch (attr) {
  case 0: v = (int)algo->data[0]; break;
  case 1: v = 10 * (int)algo->data[0]; break;
  case 2: v = algo->data[0] == 3 ? 2 : 1; break;
  default: return 15;
  }
  *(int*)buf = v;
  *written = 4;
  return 0;
}
static double lt_elem(const void* p, int type, size_t i) {
  return type == 14 ? (double)bf16f(((const unsigned short*)p)[i]) : (double)((const float*)p)[i];
}
int cublasLtMatmul(void* h, void* desc, const void* alpha, const void* A, void* Adesc, const void* B, void* Bdesc, const void* beta,
                   const void* C, void* Cdesc, void* D, void* Ddesc, const LtAlgo* algo, void* ws, size_t wsSize, void* stream) {
  if (!lt_valid(algo->data[0])) return 15;
  if (capturing) {  // recorded with its scalars and algorithm, run at replay
    float al = *(const float*)alpha, be = *(const float*)beta;
    LtAlgo ag = *algo;
    Launch l{};
    l.call = [=] {
      cublasLtMatmul(h, desc, &al, A, Adesc, B, Bdesc, &be, C, Cdesc, D, Ddesc, &ag, ws, wsSize, stream);
    };
    capture->launches.push_back(l);
    return 0;
  }
  const LtDesc* dd = (const LtDesc*)desc;
  const LtLayout *la = (const LtLayout*)Adesc, *lb = (const LtLayout*)Bdesc, *lc = (const LtLayout*)Cdesc, *ld = (const LtLayout*)Ddesc;
  long long m = dd->ta ? la->cols : la->rows, k = dd->ta ? la->rows : la->cols, n = dd->tb ? lb->rows : lb->cols;
  if ((dd->tb ? lb->cols : lb->rows) != (unsigned long long)k || lc->rows != (unsigned long long)m || lc->cols != (unsigned long long)n) return 7;
  if (lc->type != 0 || ld->type != 0) return 15;
  float al = *(const float*)alpha, be = *(const float*)beta;
  unsigned long long id = algo->data[0];
  for (long long j = 0; j < n; j++)
    for (long long i = 0; i < m; i++) {
      double s = 0, s2 = 0;
      float f = 0;
      for (long long l = 0; l < k; l++) {
        double a = lt_elem(A, la->type, dd->ta ? l + i * la->ld : i + l * la->ld);
        double b = lt_elem(B, lb->type, dd->tb ? j + l * lb->ld : l + j * lb->ld);
        if (id == 2) f += (float)a * (float)b;
        else if (id == 3 && l >= k / 2) s2 += a * b;
        else s += a * b;
      }
      double v = id == 2 ? (double)f : s + s2;
      if (id == 99) v *= 1.01;
      float& out = ((float*)D)[i + j * ld->ld];
      float c = be == 0 ? 0 : ((const float*)C)[i + j * lc->ld];
      out = al * (float)v + (be == 0 ? 0 : be * c);
    }
  return 0;
}
}
