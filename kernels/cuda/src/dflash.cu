// DFlash block drafter (op dflash_attn): per-head RMSNorm and RoPE of the
// block's q and k rows and of the new context rows' k rows, the context
// rows' K and V appended to each sequence's draft cache, then the block's
// non-causal attention over the cached context keys and the block's own
// keys (GQA; online softmax over key tiles, split over long contexts like
// flash-decoding, and a reduce of the splits in a fixed order).
#include "common.cuh"

// The per-step metadata of a dflash_attn batch of S sequences: per
// sequence its draft-cache slot, the context positions L[s] it has cached
// before the op, its new context rows c[s] and the first of them among the
// op's context rows (crow0[s] = Σ_{r<s} c[r]). Sequence s's block rows are
// rows s·B … s·B+B−1 of q/kb/vb; its context rows take positions
// L[s] … L[s]+c[s]−1 and its block rows L[s]+c[s] … L[s]+c[s]+B−1.
struct DFlashMeta { const int* slot; const int* L; const int* c; const int* crow0; i64 S; };

// dflash_ctx_seq: the sequence holding context row t (the last s with
// crow0[s] ≤ t: a sequence of no context rows shares its crow0 with the
// next one, and the later of them is the one whose rows start there).
DEVFN i64 dflash_ctx_seq(const DFlashMeta& m, i64 t) {
  i64 lo = 0, hi = m.S - 1;
  while (lo < hi) {
    i64 mid = (lo + hi + 1) >> 1;
    if (m.crow0[mid] <= t) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// dflash_norm_rope: one warp writes y = RoPE(w ⊙ x / rms(x)) for one head
// row of hd (even) values at position pos: the RMSNorm of Qwen3's q_norm /
// k_norm (the sum of squares and the square root in double, then fp32),
// then the NeoX rotation (rotate_half) with transformers' fp32 angles, as
// the CPU (kernels/dflash): for i < hd/2, inv_i = fp32(1/theta^(2i/hd)),
// θ_i = fp32(pos·inv_i), y_i = n_i·cos θ_i − n_{i+hd/2}·sin θ_i,
// y_{i+hd/2} = n_{i+hd/2}·cos θ_i + n_i·sin θ_i (cos and sin in double,
// rounded to fp32). y may alias x (a lane reads both halves of its pairs
// before writing them).
DEVFN void dflash_norm_rope(float* y, const float* x, const void* w, i64 wbf16, i64 hd, i64 pos, double eps, double theta) {
  int lane = threadIdx.x & 31;
  i64 half = hd / 2;
  double ss = 0;
  for (i64 i = lane; i < hd; i += 32) ss += (double)x[i] * (double)x[i];
  ss = warp_sum_d(ss);
  float r = (float)(1.0 / sqrt(ss / (double)hd + eps));
  for (i64 i = lane; i < half; i += 32) {
    float lo = (x[i] * r) * ldw(w, i, wbf16), hi = (x[i + half] * r) * ldw(w, i + half, wbf16);
    float inv = (float)(1.0 / pow(theta, (double)(2 * i) / (double)hd));
    float ang = (float)((double)pos * (double)inv);
    float c = (float)cos((double)ang), s = (float)sin((double)ang);
    y[i] = lo * c - hi * s;
    y[i + half] = hi * c + lo * s;
  }
}

// dflash_prep: a warp per head row: the block's q rows (Tb·Hq of them) into
// qo, its k rows (Tb·Hkv) into kbo, and the Tc context rows' k (normed and
// roped) and v (as they are) into the draft caches at the slot's positions
// L[s]+j. Caches are per slot [positions][Hkv·hd] floats (slot_stride
// floats a slot). 256 threads a block, 8 rows.
struct DFlashPrepArgs {
  const float* q; const float* kb; const float* kc; const float* vc;
  const void* qw; i64 qw_bf16; const void* kw; i64 kw_bf16;
  float* qo; float* kbo;
  float* kcache; float* vcache; i64 slot_stride;
  DFlashMeta m;
  i64 Tc, Hq, Hkv, hd, B;
  double eps, theta;
};
KERNEL(glmf_dflash_prep, DFlashPrepArgs) {
  i64 item = (i64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const i64 hd = a.hd, Tb = a.m.S * a.B;
  const double eps = a.eps;
  i64 nq = Tb * a.Hq, nkb = Tb * a.Hkv;
  if (item < nq) {
    i64 t = item / a.Hq, h = item % a.Hq, s = t / a.B;
    i64 pos = a.m.L[s] + a.m.c[s] + t % a.B;
    i64 off = t * a.Hq * hd + h * hd;
    dflash_norm_rope(a.qo + off, a.q + off, a.qw, a.qw_bf16, hd, pos, eps, a.theta);
    return;
  }
  item -= nq;
  if (item < nkb) {
    i64 t = item / a.Hkv, h = item % a.Hkv, s = t / a.B;
    i64 pos = a.m.L[s] + a.m.c[s] + t % a.B;
    i64 off = t * a.Hkv * hd + h * hd;
    dflash_norm_rope(a.kbo + off, a.kb + off, a.kw, a.kw_bf16, hd, pos, eps, a.theta);
    return;
  }
  item -= nkb;
  if (item >= a.Tc * a.Hkv) return;
  i64 t = item / a.Hkv, h = item % a.Hkv, s = dflash_ctx_seq(a.m, t);
  i64 pos = a.m.L[s] + (t - a.m.crow0[s]);
  i64 src = t * a.Hkv * hd + h * hd;
  i64 dst = (i64)a.m.slot[s] * a.slot_stride + pos * a.Hkv * hd + h * hd;
  dflash_norm_rope(a.kcache + dst, a.kc + src, a.kw, a.kw_bf16, hd, pos, eps, a.theta);
  for (i64 i = threadIdx.x & 31; i < hd; i += 32) a.vcache[dst + i] = a.vc[src + i];
}

// Attention tiles: keys staged DFLASH_KT at a time; a block of
// DFLASH_WARPS warps serves DFLASH_QB queries of one KV head group
// (DFLASH_QPW a warp: query qq·DFLASH_WARPS + warp of the chunk); head
// dims up to DFLASH_MAXHD (DFLASH_MAXHD/32 output values a lane).
#define DFLASH_KT 32
#define DFLASH_WARPS 8
#define DFLASH_QPW 4
#define DFLASH_QB 32
#define DFLASH_MAXHD 128
// the fewest keys a split takes
#define DFLASH_KMIN 64

// dflash_split: the keys a split of a sequence of n keys takes: n over the
// nsplit splits, rounded up to whole tiles, at least DFLASH_KMIN (so short
// contexts take few splits, long ones all of the grid's, and a graph
// captured at one length divides every other well).
DEVFN i64 dflash_split(i64 n, i64 nsplit) {
  i64 ks = (n + nsplit - 1) / nsplit;
  ks = (ks + DFLASH_KT - 1) / DFLASH_KT * DFLASH_KT;
  return ks < DFLASH_KMIN ? DFLASH_KMIN : ks;
}

DEVFN float dflash_warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// dflash_attn: the partial attention of one split of keys. Grid (nsplit,
// Hkv·nchunk, S), 256 threads, dynamic shared memory 4·(DFLASH_QB +
// 2·DFLASH_KT)·hd bytes. Block (x, y, z) takes sequence z, KV head
// g = y mod Hkv and its group's queries [c·QB, c·QB+QB) (c = y / Hkv;
// query i of the group is block row i / G, head g·G + i mod G, G = Hq/Hkv),
// and the keys [x·ks, x·ks+ks) of the sequence's N+B (N = L+c cached
// context keys, then its B block keys; ks = dflash_split(N+B, nsplit)).
// Per query it runs the online softmax over the split's key tiles (scores
// scale·q·k in fp32 chains over the head dims, exponentials in double) and
// writes the split's running max, sum and unnormalised output to
// part_ml/part_o at ((z·nsplit + x)·Hkv + g)·B·G + i. A split past the keys
// writes nothing.
struct DFlashAttnArgs {
  const float* q; const float* kb; const float* vb;  // [Tb][Hq·hd] normed+roped q; [Tb][Hkv·hd] block keys (normed+roped), values
  const float* kcache; const float* vcache; i64 slot_stride;
  DFlashMeta m;
  float* part_o; float* part_ml;
  i64 Hq, Hkv, hd, B, nsplit;
  double scale;
};

// A float4 of shared or global memory (16-byte aligned where the head dim
// is a multiple of 4: every row then starts on 16 bytes).
struct __align__(16) dflash_f4 { float x, y, z, w; };

// dflash_attn_tiles: the kernel's body (sm: its dynamic shared memory).
// VEC (head dims a multiple of 4) moves four floats a load: the tiles
// staged with 16-byte loads, a query's four dims read at once, lane l
// accumulating dims 4l…4l+3; otherwise lane l accumulates dims l, l+32, ….
// Every sum runs in the same order either way (scores over d ascending,
// outputs over the tile's keys ascending), so both give the same bits.
template <bool VEC>
DEVFN void dflash_attn_tiles(const DFlashAttnArgs& a, float* sm) {
  const int hd = (int)a.hd, G = (int)(a.Hq / a.Hkv), nq = (int)a.B * G;
  const i64 s = blockIdx.z;
  const int g = (int)(blockIdx.y % a.Hkv), q0 = (int)(blockIdx.y / a.Hkv) * DFLASH_QB;
  if (q0 >= nq) return;
  const i64 N = a.m.L[s] + a.m.c[s], Ntot = N + a.B;
  const i64 ks = dflash_split(Ntot, a.nsplit), k0 = (i64)blockIdx.x * ks;
  if (k0 >= Ntot) return;
  const i64 k1 = k0 + ks < Ntot ? k0 + ks : Ntot;
  float* Qs = sm;                      // [QB][hd]
  float* Ks = Qs + DFLASH_QB * hd;     // [hd][KT], key j of dim d at column (j + d) mod KT
  float* Vs = Ks + DFLASH_KT * hd;     // [KT][hd]
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
  const i64 ld = a.Hkv * hd;
  for (int i = tid; i < DFLASH_QB * hd; i += blockDim.x) {
    int qi = q0 + i / hd, d = i % hd;
    float v = 0;
    if (qi < nq) v = a.q[(s * a.B + qi / G) * a.Hq * hd + (i64)(g * G + qi % G) * hd + d];
    Qs[i] = v;
  }
  const float* kcs = a.kcache + (i64)a.m.slot[s] * a.slot_stride + (i64)g * hd;
  const float* vcs = a.vcache + (i64)a.m.slot[s] * a.slot_stride + (i64)g * hd;
  bool live[DFLASH_QPW];
  float O[DFLASH_QPW][DFLASH_MAXHD / 32], mx[DFLASH_QPW], l[DFLASH_QPW];
#pragma unroll
  for (int qq = 0; qq < DFLASH_QPW; qq++) {
    live[qq] = q0 + qq * DFLASH_WARPS + w < nq;
    mx[qq] = -INFINITY;
    l[qq] = 0;
#pragma unroll
    for (int i = 0; i < DFLASH_MAXHD / 32; i++) O[qq][i] = 0;
  }
  // the head dim of this lane's accumulator i
#define DFLASH_DIM(i) (VEC ? 4 * lane + (i) : lane + 32 * (i))
  const float scale = (float)a.scale;
  for (i64 t0 = k0; t0 < k1; t0 += DFLASH_KT) {
    const int nk = (int)(k1 - t0 < DFLASH_KT ? k1 - t0 : DFLASH_KT);
    __syncthreads();  // the previous tile is consumed (the queries staged, on the first)
    const int W4 = VEC ? 4 : 1, C = hd / W4;  // loads a row
    for (int i = tid; i < DFLASH_KT * C; i += blockDim.x) {
      int j = i / C, d = (i % C) * W4;
      float kv[4] = {0, 0, 0, 0}, vv[4] = {0, 0, 0, 0};
      if (j < nk) {
        i64 key = t0 + j;
        const float *kr, *vr;
        if (key < N) {
          kr = kcs + key * ld + d;
          vr = vcs + key * ld + d;
        } else {
          i64 r = (s * a.B + key - N) * ld + (i64)g * hd + d;
          kr = a.kb + r;
          vr = a.vb + r;
        }
        if (VEC) {
          dflash_f4 k4 = *(const dflash_f4*)kr, v4 = *(const dflash_f4*)vr;
          kv[0] = k4.x, kv[1] = k4.y, kv[2] = k4.z, kv[3] = k4.w;
          vv[0] = v4.x, vv[1] = v4.y, vv[2] = v4.z, vv[3] = v4.w;
        } else {
          kv[0] = kr[0];
          vv[0] = vr[0];
        }
      }
#pragma unroll
      for (int e = 0; e < W4; e++) Ks[(d + e) * DFLASH_KT + ((j + d + e) & (DFLASH_KT - 1))] = kv[e];
      if (VEC) *(dflash_f4*)(Vs + j * hd + d) = dflash_f4{vv[0], vv[1], vv[2], vv[3]};
      else Vs[j * hd + d] = vv[0];
    }
    __syncthreads();
    // scores: lane j takes key j of the tile for each of the warp's queries
    float sc[DFLASH_QPW];
#pragma unroll
    for (int qq = 0; qq < DFLASH_QPW; qq++) sc[qq] = 0;
    if (VEC) {
      for (int d = 0; d < hd; d += 4) {
        float k4[4];
#pragma unroll
        for (int e = 0; e < 4; e++) k4[e] = Ks[(d + e) * DFLASH_KT + ((lane + d + e) & (DFLASH_KT - 1))];
#pragma unroll
        for (int qq = 0; qq < DFLASH_QPW; qq++) {
          dflash_f4 q4 = *(const dflash_f4*)(Qs + (qq * DFLASH_WARPS + w) * hd + d);
          sc[qq] = fmaf(q4.x, k4[0], sc[qq]);
          sc[qq] = fmaf(q4.y, k4[1], sc[qq]);
          sc[qq] = fmaf(q4.z, k4[2], sc[qq]);
          sc[qq] = fmaf(q4.w, k4[3], sc[qq]);
        }
      }
    } else {
      for (int d = 0; d < hd; d++) {
        float kv = Ks[d * DFLASH_KT + ((lane + d) & (DFLASH_KT - 1))];
#pragma unroll
        for (int qq = 0; qq < DFLASH_QPW; qq++) sc[qq] = fmaf(Qs[(qq * DFLASH_WARPS + w) * hd + d], kv, sc[qq]);
      }
    }
    float p[DFLASH_QPW];
#pragma unroll
    for (int qq = 0; qq < DFLASH_QPW; qq++) {
      p[qq] = 0;
      if (!live[qq]) continue;  // warp-uniform
      float x = lane < nk ? sc[qq] * scale : -INFINITY;
      float mnew = fmaxf(mx[qq], dflash_warp_max(x));  // finite: the tile has a key
      float alpha = (float)exp((double)(mx[qq] - mnew));
      p[qq] = lane < nk ? (float)exp((double)(x - mnew)) : 0.f;
      l[qq] = l[qq] * alpha + warp_sum(p[qq]);
      mx[qq] = mnew;
#pragma unroll
      for (int i = 0; i < DFLASH_MAXHD / 32; i++) O[qq][i] *= alpha;
    }
    for (int j = 0; j < nk; j++) {
      float v[DFLASH_MAXHD / 32];
      if (VEC) {
        dflash_f4 v4 = {0, 0, 0, 0};
        if (4 * lane < hd) v4 = *(const dflash_f4*)(Vs + j * hd + 4 * lane);
        v[0] = v4.x, v[1] = v4.y, v[2] = v4.z, v[3] = v4.w;
      } else {
#pragma unroll
        for (int i = 0; i < DFLASH_MAXHD / 32; i++) v[i] = lane + 32 * i < hd ? Vs[j * hd + lane + 32 * i] : 0.f;
      }
#pragma unroll
      for (int qq = 0; qq < DFLASH_QPW; qq++) {
        if (!live[qq]) continue;
        float pj = __shfl_sync(0xffffffffu, p[qq], j);
#pragma unroll
        for (int i = 0; i < DFLASH_MAXHD / 32; i++) O[qq][i] = fmaf(pj, v[i], O[qq][i]);
      }
    }
  }
#pragma unroll
  for (int qq = 0; qq < DFLASH_QPW; qq++) {
    if (!live[qq]) continue;
    i64 pi = (((s * a.nsplit + blockIdx.x) * a.Hkv + g) * nq) + q0 + qq * DFLASH_WARPS + w;
#pragma unroll
    for (int i = 0; i < DFLASH_MAXHD / 32; i++)
      if (DFLASH_DIM(i) < hd) a.part_o[pi * hd + DFLASH_DIM(i)] = O[qq][i];
    if (lane == 0) {
      a.part_ml[2 * pi] = mx[qq];
      a.part_ml[2 * pi + 1] = l[qq];
    }
  }
#undef DFLASH_DIM
}

KERNEL(glmf_dflash_attn, DFlashAttnArgs) {
  DYN_SMEM(float, sm);
  if (a.hd % 4 == 0) dflash_attn_tiles<true>(a, sm);
  else dflash_attn_tiles<false>(a, sm);
}

// dflash_reduce: o[s·B + j][h·hd + d] = Σ_x e_x·O_x[d] / Σ_x e_x·l_x over
// the splits x of the sequence's keys (e_x = exp(m_x − max m), in double),
// in split order. Grid (Hq, B, S), a thread per head dim (any block size).
struct DFlashReduceArgs {
  const float* part_o; const float* part_ml; float* o;
  DFlashMeta m;
  i64 Hq, Hkv, hd, B, nsplit;
};
KERNEL(glmf_dflash_reduce, DFlashReduceArgs) {
  const i64 h = blockIdx.x, j = blockIdx.y, s = blockIdx.z;
  const i64 G = a.Hq / a.Hkv, g = h / G, nq = a.B * G, qi = j * G + h % G;
  const i64 Ntot = a.m.L[s] + a.m.c[s] + a.B;
  const i64 ks = dflash_split(Ntot, a.nsplit), nsp = (Ntot + ks - 1) / ks;
  float M = -INFINITY;
  for (i64 x = 0; x < nsp; x++) M = fmaxf(M, a.part_ml[2 * (((s * a.nsplit + x) * a.Hkv + g) * nq + qi)]);
  for (i64 d = threadIdx.x; d < a.hd; d += blockDim.x) {
    float den = 0, num = 0;
    for (i64 x = 0; x < nsp; x++) {
      i64 pi = ((s * a.nsplit + x) * a.Hkv + g) * nq + qi;
      float e = (float)exp((double)(a.part_ml[2 * pi] - M));
      den += e * a.part_ml[2 * pi + 1];
      num += e * a.part_o[pi * a.hd + d];
    }
    a.o[(s * a.B + j) * a.Hq * a.hd + h * a.hd + d] = num / den;
  }
}

// concat_cols: y[r][off + c] = x_j[r][c − o_j] for the columns of the
// launch's inputs (at most 8: x_j [R][w_j] at column o_j = Σ_{i<j} w_i of
// the launch) in an output of N columns (the trunk's target-layer hidden
// rows, concatenated; more inputs take more launches, each at its off).
struct ConcatArgs {
  const float* x[8]; i64 w[8]; i64 nin;
  float* y; i64 R, N, off;
};
KERNEL(glmf_concat_cols, ConcatArgs) {
  i64 W = 0;
  for (i64 j = 0; j < a.nin; j++) W += a.w[j];
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= a.R * W) return;
  i64 r = i / W, c = i % W, o = 0;
  for (i64 j = 0; j < a.nin; j++) {
    if (c < o + a.w[j]) {
      a.y[r * a.N + a.off + c] = a.x[j][r * a.w[j] + (c - o)];
      return;
    }
    o += a.w[j];
  }
}
