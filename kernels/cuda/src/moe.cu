// MoE: sigmoid routing with the correction bias (group-limited when
// n_group > 1), the plan that groups routing slots by expert (a
// permutation and a tile list for the grouped GEMMs in gemm.cu), the
// weighted combine, and the plugin op that appends an always-on expert.
#include "common.cuh"

#define MOE_MAX_EXPERTS 1024

// moe_route: one thread per token, as kernels/moe.Router.Route: scores
// s = sigmoid(logit), choice = s + bias, optional group stage (a group
// scores the sum of its two best choices; the best topk_group groups stay),
// top-k by choice (ties: lower index), sorted ascending, weights s
// renormalized (+1e−20) when asked, then scaled.
struct RouteArgs {
  const float* logits; const void* bias; i64 bias_bf16;
  int* idx; float* w;
  i64 T, E, K, G, TG, normalize;
  double scaling;
};
// route_write: token t's chosen experts sel[0..n) (ascending) and their
// scores sig(k) = sigmoid(logit of sel[k]): idx, and the weights — summed
// in that order, renormalized (+1e−20) when asked, scaled — with no re-read
// of w.
template <class Sig>
DEVFN void route_write(const RouteArgs& a, i64 t, const int* sel, i64 n, Sig sig) {
  float sum = 0;
  for (i64 k = 0; k < n; k++) sum += sig(k);
  for (i64 k = 0; k < n; k++) {
    float v = sig(k);
    if (a.normalize) v /= sum + 1e-20f;
    a.idx[t * a.K + k] = sel[k];
    a.w[t * a.K + k] = v * (float)a.scaling;
  }
}

KERNEL(glmf_moe_route, RouteArgs) {
  i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= a.T) return;
  const float* lt = a.logits + t * a.E;
  float choice[MOE_MAX_EXPERTS];
  unsigned char taken[MOE_MAX_EXPERTS];
  for (i64 e = 0; e < a.E; e++) {
    choice[e] = sigmoidf_d(lt[e]) + ldw(a.bias, e, a.bias_bf16);
    taken[e] = 0;
  }
  if (a.G > 1) {
    i64 per = a.E / a.G;
    float gs[64];
    unsigned char keepg[64];
    for (i64 g = 0; g < a.G; g++) {
      float x = -INFINITY, y = -INFINITY;
      for (i64 e = g * per; e < (g + 1) * per; e++) {
        float v = choice[e];
        if (v > x) { y = x; x = v; } else if (v > y) y = v;
      }
      gs[g] = x + y;
      keepg[g] = 0;
    }
    for (i64 r = 0; r < a.TG; r++) {
      i64 best = -1;
      for (i64 g = 0; g < a.G; g++)
        if (!keepg[g] && (best < 0 || gs[g] > gs[best])) best = g;
      if (best < 0) break;
      keepg[best] = 1;
    }
    for (i64 e = 0; e < a.E; e++)
      if (!keepg[e / per]) choice[e] = -INFINITY;
  }
  for (i64 k = 0; k < a.K; k++) {
    i64 best = -1;
    for (i64 e = 0; e < a.E; e++)
      if (!taken[e] && (best < 0 || choice[e] > choice[best])) best = e;
    if (best < 0) break;
    taken[best] = 1;
  }
  int sel[MOE_MAX_EXPERTS];
  i64 k = 0;
  for (i64 e = 0; e < a.E && k < a.K; e++)
    if (taken[e]) sel[k++] = (int)e;
  route_write(a, t, sel, k, [&](i64 j) { return sigmoidf_d(lt[sel[j]]); });
}

// moe_route_warp: moe_route without groups (G = 1) for K ≤ 32: a block
// routes ROUTE_WARPS tokens. Its threads first score every (token, expert)
// together (sigmoid in double, into shared memory: at decode a token's
// experts spread over the whole block, not one warp), then a warp per
// token works in registers: lane l holds the choices (score + bias) of
// experts l, l + 32, …; each of the K rounds picks the best untaken expert
// by the lane's scan in ascending order and a warp reduction (ties: lower
// index, as the serial scan; lane 0's pick is every lane's), and lane k
// keeps round k's pick. A pick's rank among the K (its place in ascending
// order) is counted over the lanes' picks; lane r then weights the r-th
// pick as route_write does (the same sum of the scores in ascending expert
// order, the same division and scaling). Every load of a phase is issued
// before its results are used.
#define ROUTE_WARPS 8
#define ROUTE_PL (MOE_MAX_EXPERTS / 32)
#define ROUTE_LD 8
KERNEL(glmf_moe_route_warp, RouteArgs) {
  __shared__ float sig_s[ROUTE_WARPS][MOE_MAX_EXPERTS];
  __shared__ int sel_s[ROUTE_WARPS][32];
  int wid = threadIdx.x / 32, lane = threadIdx.x % 32;
  i64 tb = (i64)blockIdx.x * ROUTE_WARPS, t = tb + wid;
  const int E = (int)a.E, K = (int)(a.K < a.E ? a.K : a.E);
  int nt = a.T - tb < ROUTE_WARPS ? (int)(a.T - tb) : ROUTE_WARPS;
  // this lane's biases (its choices less the scores), loaded first
  float c[ROUTE_PL];
  #pragma unroll
  for (int i = 0; i < ROUTE_PL; i++) {
    if (i * 32 >= E) break;
    int e = i * 32 + lane;
    c[i] = e < E ? ldw(a.bias, e, a.bias_bf16) : 0.f;
  }
  // the scores of the block's tokens, ROUTE_LD loads a thread at once
  for (int x0 = 0; x0 < nt * E; x0 += ROUTE_LD * 32 * ROUTE_WARPS) {
    float v[ROUTE_LD];
    #pragma unroll
    for (int j = 0; j < ROUTE_LD; j++) {
      int x = x0 + threadIdx.x + j * 32 * ROUTE_WARPS;
      v[j] = x < nt * E ? a.logits[(tb + x / E) * a.E + x % E] : 0.f;
    }
    #pragma unroll
    for (int j = 0; j < ROUTE_LD; j++) {
      int x = x0 + threadIdx.x + j * 32 * ROUTE_WARPS;
      if (x < nt * E) sig_s[x / E][x % E] = sigmoidf_d(v[j]);
    }
  }
  __syncthreads();
  if (wid >= nt) return;
  const float* sg = sig_s[wid];
  unsigned taken = 0;  // bit i: expert i·32 + lane (or none there)
  #pragma unroll
  for (int i = 0; i < ROUTE_PL; i++) {
    if (i * 32 >= E) break;
    int e = i * 32 + lane;
    if (e < E)
      c[i] = sg[e] + c[i];
    else
      taken |= 1u << i;
  }
  int mine = -1;  // lane k: round k's pick
  for (int k = 0; k < K; k++) {
    int best = -1;
    float bv = 0.f;
    #pragma unroll
    for (int i = 0; i < ROUTE_PL; i++) {
      if (i * 32 >= E) break;
      if (!((taken >> i) & 1u) && (best < 0 || c[i] > bv)) best = i * 32 + lane, bv = c[i];
    }
    for (int o = 16; o > 0; o >>= 1) {
      int ob = __shfl_xor_sync(0xffffffffu, best, o);
      float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      // the serial scan keeps the lower index unless a later one is strictly greater
      bool take = ob >= 0 && (best < 0 || (ob < best ? !(bv > ov) : ov > bv));
      if (take) best = ob, bv = ov;
    }
    best = __shfl_sync(0xffffffffu, best, 0);
    if (best >= 0 && (best & 31) == lane) taken |= 1u << (best >> 5);
    if (lane == k) mine = best;
  }
  // ascending expert order: a pick's rank is the count of smaller picks
  int rank = 0;
  for (int j = 0; j < K; j++) rank += __shfl_sync(0xffffffffu, mine, j) < mine;
  if (lane < K) sel_s[wid][rank] = mine;
  __syncwarp();
  int pk = lane < K ? sel_s[wid][lane] : 0;
  float sig = lane < K ? sg[pk] : 0.f;
  float sum = 0;
  for (int j = 0; j < K; j++) sum += __shfl_sync(0xffffffffu, sig, j);
  if (lane < K) {
    float v = sig;
    if (a.normalize) v /= sum + 1e-20f;
    a.idx[t * a.K + lane] = pk;
    a.w[t * a.K + lane] = v * (float)a.scaling;
  }
}

// moe_plan: one block of 1024 threads. Counts the routing slots of each
// expert, lays them out expert by expert (perm[p] = slot), and lists the
// tiles of at most `bm` rows each: tiles[0] = count, then (expert, p0, rows).
// At most 32 slots: warp 0 alone (moe_plan_warp).
struct PlanArgs { const int* idx; i64 TK, E, bm; int* perm; int* tiles; };

// moe_plan_warp: the plan of at most 32 routing slots (decode), by one warp
// with no barriers: lane s holds slot s's expert; a slot's place is the
// count of valid slots of lower experts plus that of its expert's lower
// slots (so an expert's slots keep ascending order); each expert's first
// slot lists its tiles after those of the lower experts. The same tiles as
// the block's plan, which would spend ~20 barriers on its scans.
DEVFN void moe_plan_warp(const PlanArgs& a) {
  int l = threadIdx.x % 32, bm = (int)a.bm;
  int e = l < a.TK ? a.idx[l] : -1;
  int ok = e >= 0 && e < a.E;
  int start = 0, cnt = 0, lower = 0;  // valid slots of lower experts; of this expert; of this expert before l
  for (int j = 0; j < 32; j++) {
    int ej = __shfl_sync(0xffffffffu, e, j), okj = __shfl_sync(0xffffffffu, ok, j);
    if (ok && okj) {
      if (ej < e) start++;
      if (ej == e) cnt++, lower += j < l;
    }
  }
  if (ok) a.perm[start + lower] = l;
  int nt = ok && lower == 0 ? (cnt + bm - 1) / bm : 0;
  int tb = 0, total = 0;  // tiles of lower experts; all
  for (int j = 0; j < 32; j++) {
    int ntj = __shfl_sync(0xffffffffu, nt, j), ej = __shfl_sync(0xffffffffu, e, j);
    total += ntj;
    if (ntj > 0 && ej < e) tb += ntj;
  }
  for (int i = 0; i < nt; i++) {
    int* tl = a.tiles + 1 + 3 * (tb + i);
    tl[0] = e;
    tl[1] = start + i * bm;
    tl[2] = cnt - i * bm < bm ? cnt - i * bm : bm;
  }
  if (l == 0) a.tiles[0] = total;
}

KERNEL(glmf_moe_plan, PlanArgs) {
  if (a.TK <= 32) {  // (uniform)
    if (threadIdx.x < 32) moe_plan_warp(a);
    return;
  }
  __shared__ int cnt[MOE_MAX_EXPERTS];
  __shared__ int cur[MOE_MAX_EXPERTS];
  i64 tid = threadIdx.x;
  for (i64 e = tid; e < MOE_MAX_EXPERTS; e += blockDim.x) cnt[e] = 0;
  __syncthreads();
  for (i64 s = tid; s < a.TK; s += blockDim.x) {
    int e = a.idx[s];
    if (e >= 0 && e < a.E) atomicAdd(&cnt[e], 1);
  }
  __syncthreads();
  int c = tid < a.E ? cnt[tid] : 0;
  int nt = (int)((c + a.bm - 1) / a.bm);
  int total, ttotal;
  int off = block_exscan(c, &total);
  int toff = block_exscan(nt, &ttotal);
  if (tid < a.E) {
    cur[tid] = off;
    for (int i = 0; i < nt; i++) {
      int* tl = a.tiles + 1 + 3 * (toff + i);
      tl[0] = (int)tid;
      tl[1] = off + i * (int)a.bm;
      int rows = c - i * (int)a.bm;
      tl[2] = rows < a.bm ? rows : (int)a.bm;
    }
  }
  if (tid == 0) a.tiles[0] = ttotal;
  __syncthreads();
  for (i64 s = tid; s < a.TK; s += blockDim.x) {
    int e = a.idx[s];
    if (e >= 0 && e < a.E) a.perm[atomicAdd(&cur[e], 1)] = (int)s;
  }
}

// moe_combine: y[t][d] = Σ_k contrib[t·K+k][d], in k order.
struct CombineArgs { const float* contrib; float* y; i64 T, K, D; };
KERNEL(glmf_moe_combine, CombineArgs) {
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= a.T * a.D) return;
  i64 t = i / a.D, d = i % a.D;
  float s = 0;
  for (i64 k = 0; k < a.K; k++) s += a.contrib[(t * a.K + k) * a.D + d];
  a.y[i] = s;
}

// moe_append_expert: idx/w [T][K] → [T][K+1] with `expert` and 1.0 last.
struct AppendArgs { const int* idx; const float* w; int* oidx; float* ow; i64 T, K, expert; };
KERNEL(glmf_moe_append_expert, AppendArgs) {
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  i64 K1 = a.K + 1;
  if (i >= a.T * K1) return;
  i64 t = i / K1, k = i % K1;
  if (k < a.K) {
    a.oidx[i] = a.idx[t * a.K + k];
    a.ow[i] = a.w[t * a.K + k];
  } else {
    a.oidx[i] = (int)a.expert;
    a.ow[i] = 1.0f;
  }
}
