// DSA: per-batch metadata, the k-pool lightning indexer (append and pool
// keys into the slot's cache, score the visible pools, select the best
// plus the incomplete tail) and sparse NoPE MLA in the absorbed form
// (attention in the kv_lora latent space: q·W_k, then W_v on the result).
#include "common.cuh"

// Paged caches: the MLA latents and the indexer's pooled keys of a store
// live in pages of `page` rows (latent rows: tokens; pool rows: pools), and
// pt ([slots][pt_stride] page ids, at a fixed address for the store's
// life) maps page i of a slot's cache to its page in the buffer. Without a
// page table (pt null) a slot's rows are contiguous, slot_rows per slot.
// cache_row is the buffer row that holds row p of slot's cache.
DEVFN i64 cache_row(const int* pt, i64 pt_stride, i64 page, i64 slot, i64 slot_rows, i64 p) {
  return pt ? (i64)pt[slot * pt_stride + p / page] * page + p % page : slot * slot_rows + p;
}

// The MLA latents are fp32 or bf16 (cache_bf16 ≠ 0: the runtime's kv dtype
// bf16, rounded to nearest even as they are appended); ldw reads either.

// dsa_meta: visible[t] = complete pools row t can see = (pos+1)/kpool.
struct DSAMetaArgs { BatchMeta m; int* visible; i64 kpool; };
KERNEL(glmf_dsa_meta, DSAMetaArgs) {
  i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= a.m.T) return;
  a.visible[t] = (int)((a.m.row_pos[t] + 1) / a.kpool);
}

// indexer_append: per sequence (block) and channel (thread), in token
// order: stage the key and gate in the slot's pending pool; a pool that
// fills is pooled (per-channel softmax of gate+ape over its kpool rows,
// weighted mean of the keys, in double) into the slot's pool keys. A
// checkpointed sequence (ckpt[s] ≥ 0) also keeps every raw row in its
// rollback record, row p − ⌊ckpt/kpool⌋·kpool for position p.
struct IdxAppendArgs {
  BatchMeta m;
  const float* k; const float* gate;     // [T][D]
  const void* ape; i64 ape_bf16;         // [kpool][D]
  float* pools; i64 pools_stride;        // per slot [maxPools][D] (no page table), else pages of `page` pools
  float* pend_k; float* pend_g; i64 pend_stride;  // per slot [kpool][D]
  i64 D, kpool;
  const int* ckpt;                       // [S] checkpoint position or −1 (0: no records)
  float* rec_k; float* rec_g; i64 rec_stride;  // per slot [kpool−1+depth][D]
  const int* pt; i64 pt_stride, page;    // the pools' page table (cache_row)
};
KERNEL(glmf_indexer_append, IdxAppendArgs) {
  i64 s = blockIdx.x, d = threadIdx.x;
  if (s >= a.m.S || d >= a.D) return;
  i64 slot = a.m.seq_slot[s], pos0 = a.m.seq_pos0[s], n = a.m.seq_n[s], row0 = a.m.seq_row0[s];
  float* pk = a.pend_k + slot * a.pend_stride;
  float* pg = a.pend_g + slot * a.pend_stride;
  i64 ck = a.ckpt ? a.ckpt[s] : -1;
  i64 rbase = ck >= 0 ? ck / a.kpool * a.kpool : 0;
  for (i64 j = 0; j < n; j++) {
    i64 pos = pos0 + j, sp = pos % a.kpool;
    pk[sp * a.D + d] = a.k[(row0 + j) * a.D + d];
    pg[sp * a.D + d] = a.gate[(row0 + j) * a.D + d];
    if (ck >= 0) {
      a.rec_k[slot * a.rec_stride + (pos - rbase) * a.D + d] = a.k[(row0 + j) * a.D + d];
      a.rec_g[slot * a.rec_stride + (pos - rbase) * a.D + d] = a.gate[(row0 + j) * a.D + d];
    }
    if (sp == a.kpool - 1) {
      double mx = -INFINITY;
      for (i64 jj = 0; jj < a.kpool; jj++) {
        double l = (double)(pg[jj * a.D + d] + ldw(a.ape, jj * a.D + d, a.ape_bf16));
        mx = l > mx ? l : mx;
      }
      double sum = 0, acc = 0;
      for (i64 jj = 0; jj < a.kpool; jj++) {
        double l = (double)(pg[jj * a.D + d] + ldw(a.ape, jj * a.D + d, a.ape_bf16));
        double e = exp(l - mx);
        sum += e;
        acc += e * (double)pk[jj * a.D + d];
      }
      a.pools[cache_row(a.pt, a.pt_stride, a.page, slot, a.pools_stride / a.D, pos / a.kpool) * a.D + d] = (float)(acc / sum);
    }
  }
}

// indexer_score: scores[t][p] = Σ_h w[t][h]·wscale·ReLU(q_h·key_p·scale) for
// the pools p < visible[t] of the rows that see more than keep pools (the
// others take every pool unscored). A warp per SCORE_PW pools: lane l runs
// the dots of heads l, l+32, … (a chain over the D channels per pool, the
// pools' keys in shared memory), sums its heads' terms in order, and the
// warp adds the lanes in a fixed tree. Grid (ceil(maxvis/SCORE_PB), T), 256
// threads, dynamic shared memory 4·(H·(D+1) + 8·SCORE_PW·D) bytes.
#define SCORE_PW 4
#define SCORE_PB (8 * SCORE_PW)
struct IdxScoreArgs {
  BatchMeta m;
  const int* visible;
  const float* q; const float* w;   // [T][H·D], [T][H]
  const float* pools; i64 pools_stride;
  float* scores; i64 ld;            // [T][ld]
  i64 H, D, keep;
  double scale, wscale;
  const int* pt; i64 pt_stride, page;  // the pools' page table (cache_row)
};
KERNEL(glmf_indexer_score, IdxScoreArgs) {
  DYN_SMEM(float, qs);  // [H][D+1], then per warp [SCORE_PW][D] keys
  i64 t = blockIdx.y;
  if (t >= a.m.T) return;
  i64 n = a.visible[t];
  i64 p0 = (i64)blockIdx.x * SCORE_PB;
  if (n <= a.keep || p0 >= n) return;
  i64 D = a.D, D1 = a.D + 1;
  for (i64 i = threadIdx.x; i < a.H * D; i += blockDim.x) qs[(i / D) * D1 + i % D] = a.q[t * a.H * D + i];
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float* ks = qs + a.H * D1 + (i64)warp * SCORE_PW * D;
  i64 pb = p0 + (i64)warp * SCORE_PW;
  int np = pb >= n ? 0 : n - pb < SCORE_PW ? (int)(n - pb) : SCORE_PW;
  i64 slot = a.m.seq_slot[a.m.row_seq[t]];
  for (i64 i = lane; i < np * D; i += 32)
    ks[i] = a.pools[cache_row(a.pt, a.pt_stride, a.page, slot, a.pools_stride / D, pb + i / D) * D + i % D];
  __syncthreads();
  if (np == 0) return;
  const float* wr = a.w + t * a.H;
  float scale = (float)a.scale, wscale = (float)a.wscale;
  float c[SCORE_PW];
  for (int j = 0; j < SCORE_PW; j++) c[j] = 0.f;
  for (i64 h = lane; h < a.H; h += 32) {
    const float* qh = qs + h * D1;
    float dot[SCORE_PW];
    for (int j = 0; j < SCORE_PW; j++) dot[j] = 0.f;
#pragma unroll 4
    for (i64 x = 0; x < D; x++) {
      float qv = qh[x];
      for (int j = 0; j < SCORE_PW; j++) dot[j] = fmaf(qv, ks[j * D + x], dot[j]);
    }
    float wt = wr[h] * wscale;
    for (int j = 0; j < SCORE_PW; j++) {
      float v = dot[j] * scale;
      if (v > 0) c[j] += wt * v;
    }
  }
  for (int j = 0; j < SCORE_PW; j++) {
    float sj = warp_sum(c[j]);
    if (lane == 0 && j < np) a.scores[t * a.ld + pb + j] = sj;
  }
}

// indexer_select: per row (block of 256): the best min(topk/kpool,
// visible) pools by score (ties: lower pool; NaN last), listed in pool
// order as positions, then the tail positions [kpool·visible, pos]; −1
// pads. A row that sees no more pools than it keeps takes them all
// unscored; the others find the threshold by a 4-pass radix select on the
// scores and compact by per-thread segments (two block scans).
struct IdxSelectArgs {
  BatchMeta m;
  const int* visible;
  const float* scores; i64 ld;
  int* sel; i64 width;
  i64 kpool, keep, tail;
};
KERNEL(glmf_indexer_select, IdxSelectArgs) {
  i64 t = blockIdx.x;
  if (t >= a.m.T) return;
  int* row = a.sel + t * a.width;
  const float* sc = a.scores + t * a.ld;
  i64 n = a.visible[t];
  if (n <= a.keep) {  // every pool, then the tail: positions 0, 1, … in order
    i64 end = a.tail ? (i64)a.m.row_pos[t] + 1 : n * a.kpool;
    for (i64 i = threadIdx.x; i < a.width; i += blockDim.x) row[i] = i < end ? (int)i : -1;
    return;
  }
  i64 keep = a.keep;
  int tid = threadIdx.x, nth = blockDim.x;
  for (i64 i = tid; i < a.width; i += nth) row[i] = -1;
  if (keep > 0) {
    // the keep-th smallest 32-bit key (descending score; a NaN after every
    // number), by 8-bit digits: T, and r = how many pools of key T are
    // kept (the lowest ones: the CPU's tie order)
    __shared__ int hist[256];
    __shared__ unsigned prefix_s, tgt_s;
    auto key = [&](i64 p) {
      float v = sc[p];
      return v != v ? 0xffffffffu : ~ordf(v);
    };
    unsigned prefix = 0, mask = 0, tgt = (unsigned)keep;
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int b = tid; b < 256; b += nth) hist[b] = 0;
      __syncthreads();
      for (i64 p = tid; p < n; p += nth) {
        unsigned k = key(p);
        if ((k & mask) == prefix) atomicAdd(&hist[(k >> shift) & 255], 1);
      }
      __syncthreads();
      // the digit whose cumulative count reaches tgt (blockDim = 256)
      int c = tid < 256 ? hist[tid] : 0, total;
      int ex = block_exscan(c, &total);
      if (tid < 256 && (unsigned)ex < tgt && tgt <= (unsigned)(ex + c)) {
        prefix_s = prefix | ((unsigned)tid << shift);
        tgt_s = tgt - (unsigned)ex;
      }
      __syncthreads();
      prefix = prefix_s;
      tgt = tgt_s;
      mask |= 255u << shift;
    }
    // compaction in pool order: thread i takes the pools of its segment
    // [i·seg, +seg): those below T, and the first tgt of those equal to T
    i64 seg = (n + nth - 1) / nth, p0 = tid * seg, p1 = p0 + seg < n ? p0 + seg : n;
    int ne = 0, total;
    for (i64 p = p0; p < p1; p++) ne += key(p) == prefix;
    int eq0 = block_exscan(ne, &total);
    int nk = 0;
    for (i64 p = p0, e = eq0; p < p1; p++) {
      unsigned k = key(p);
      if (k < prefix || (k == prefix && (unsigned)e++ < tgt)) nk++;
    }
    int o = block_exscan(nk, &total);
    for (i64 p = p0, e = eq0; p < p1; p++) {
      unsigned k = key(p);
      if (k < prefix || (k == prefix && (unsigned)e++ < tgt)) {
        for (i64 x = 0; x < a.kpool; x++) row[(i64)o * a.kpool + x] = (int)(p * a.kpool + x);
        o++;
      }
    }
  }
  __syncthreads();
  if (a.tail && tid == 0) {
    i64 o = keep * a.kpool;
    for (i64 pos = n * a.kpool; pos <= a.m.row_pos[t]; pos++) row[o++] = (int)pos;
  }
}

// indexer_save: the slot's shared selection (index_share_for_mtp_iteration)
// becomes its sequence's last selection row. Grid S.
struct IdxSaveArgs { BatchMeta m; const int* sel; i64 width; int* saved; i64 saved_stride; };
KERNEL(glmf_indexer_save, IdxSaveArgs) {
  i64 s = blockIdx.x;
  if (s >= a.m.S) return;
  const int* row = a.sel + (i64)a.m.last_row[s] * a.width;
  int* dst = a.saved + (i64)a.m.seq_slot[s] * a.saved_stride;
  for (i64 i = threadIdx.x; i < a.width; i += blockDim.x) dst[i] = row[i];
}

// indexer_shared: a row without scoring: the slot's saved selection (its
// positions, in order) then every position in (share_pos[s], pos], then −1
// padding (the host checks that they fit). Grid T, a power-of-two block:
// the saved entries are compacted in chunks of the block.
struct IdxSharedArgs {
  BatchMeta m;
  const int* saved; i64 saved_stride, saved_width;
  const int* share_pos;  // [S] position of the saved selection
  int* sel; i64 width;
};
KERNEL(glmf_indexer_shared, IdxSharedArgs) {
  i64 t = blockIdx.x;
  if (t >= a.m.T) return;
  i64 s = a.m.row_seq[t];
  const int* sv = a.saved + (i64)a.m.seq_slot[s] * a.saved_stride;
  int* row = a.sel + t * a.width;
  i64 o = 0;  // entries written so far (the same in every thread)
  for (i64 c0 = 0; c0 < a.saved_width; c0 += blockDim.x) {
    i64 i = c0 + threadIdx.x;
    int v = i < a.saved_width ? sv[i] : -1;
    int total;
    int off = block_exscan(v >= 0, &total);
    if (v >= 0 && o + off < a.width) row[o + off] = v;
    o += total;
  }
  if (o > a.width) o = a.width;
  i64 p0 = (i64)a.share_pos[s] + 1, p1 = a.m.row_pos[t];
  for (i64 i = o + threadIdx.x; i < a.width; i += blockDim.x) {
    i64 p = p0 + (i - o);
    row[i] = p <= p1 ? (int)p : -1;
  }
}

// mla_append: cache[slot][pos] = c_kv[t] for every row (through the page
// table where there is one: cache_row).
struct MLAAppendArgs { BatchMeta m; const float* ckv; void* cache; i64 slot_stride, R; const int* pt; i64 pt_stride, page; i64 cache_bf16; };
KERNEL(glmf_mla_append, MLAAppendArgs) {
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= a.m.T * a.R) return;
  i64 t = i / a.R, r = i % a.R;
  i64 slot = a.m.seq_slot[a.m.row_seq[t]];
  i64 at = cache_row(a.pt, a.pt_stride, a.page, slot, a.slot_stride / a.R, a.m.row_pos[t]) * a.R + r;
  if (a.cache_bf16)
    ((u16*)a.cache)[at] = (u16)(__float_as_uint(bf16_round(a.ckv[i])) >> 16);
  else
    ((float*)a.cache)[at] = a.ckv[i];
}

// Absorbed MLA as small SIMT GEMMs (fp32 FMAs, register tiles of MT×NT
// per thread over a TM×TN block tile, K staged through shared memory in
// chunks of MLA_KT). Every output is one thread's fmaf chain over k in
// ascending order, so it does not depend on the tile shape: the big (256
// threads) and small (128 threads, for few rows) variants, and any batch,
// give the same bits.
//   mla_qabs:    qa[t][h] = q[t][h]·W_UK[h]          (per head, T×dq·dq×R)
//   mla_logits:  lg[t][h][i] = qa[t][h]·c_sel[t][i]  (per row, H×R·R×width)
//   mla_softmax: lg[t][h] ← softmax(scale·lg) over the selected entries
//   mla_accum:   ol[t][h] = Σ_i lg[t][h][i]·c_sel[t][i]  (per row, H×width·width×R)
//   mla_expand:  o[t][h] = W_UV[h]·ol[t][h]          (per head, T×R·R×dv)
// The latent rows a block stages serve all TM heads of its tile (MQA).
#define MLA_KT 32

struct __align__(16) mla_f4 { float x, y, z, w; };
struct __align__(8) mla_f2 { float x, y; };
// mla_ld: 4 or 2 consecutive floats (16- or 8-byte aligned) in one load.
DEVFN void mla_ld(float (&d)[4], const float* s) {
  mla_f4 v = *(const mla_f4*)s;
  d[0] = v.x; d[1] = v.y; d[2] = v.z; d[3] = v.w;
}
DEVFN void mla_ld(float (&d)[2], const float* s) {
  mla_f2 v = *(const mla_f2*)s;
  d[0] = v.x; d[1] = v.y;
}

// mla_mm: acc[i][j] = Σ_{k<K} A(m, k)·B(k, n) for the thread's rows
// m = tm·MT+i and columns n = tn·NT+j of the block tile (tm, tn from
// mla_tile). la(m, k) and lb(k, n) return the operands (0 outside);
// kB says B is contiguous in k (loads then run along k). FOLD > 0 (a
// multiple of MLA_KT): the chain restarts every FOLD k and the chunks'
// sums are added in order, ((0 + s0) + s1) + …
template <int TM, int TN, int MT, int NT, bool kB, int FOLD = 0, class LA, class LB>
DEVFN void mla_mm(i64 K, LA la, LB lb, float (&acc)[MT][NT]) {
  constexpr int NTH = (TM / MT) * (TN / NT);
  __shared__ __align__(16) float As[MLA_KT][TM + 4];
  __shared__ __align__(16) float Bs[MLA_KT][TN + 4];
  int tid = threadIdx.x, tn = tid % (TN / NT), tm = tid / (TN / NT);
  float tot[MT][NT];  // FOLD: the chunks' sum (unused otherwise)
  for (int i = 0; i < MT; i++)
    for (int j = 0; j < NT; j++) acc[i][j] = tot[i][j] = 0.f;
  for (i64 k0 = 0; k0 < K; k0 += MLA_KT) {
    for (int idx = tid; idx < TM * MLA_KT; idx += NTH) {
      int k = idx % MLA_KT, m = idx / MLA_KT;
      As[k][m] = k0 + k < K ? la(m, k0 + k) : 0.f;
    }
    for (int idx = tid; idx < TN * MLA_KT; idx += NTH) {
      int k, n;
      if (kB) { k = idx % MLA_KT; n = idx / MLA_KT; }
      else { n = idx % TN; k = idx / TN; }
      Bs[k][n] = k0 + k < K ? lb(k0 + k, n) : 0.f;
    }
    __syncthreads();
#pragma unroll 4
    for (int k = 0; k < MLA_KT; k++) {
      float av[MT], bv[NT];
      mla_ld(av, &As[k][tm * MT]);
      mla_ld(bv, &Bs[k][tn * NT]);
      for (int i = 0; i < MT; i++)
        for (int j = 0; j < NT; j++) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
    __syncthreads();
    if (FOLD > 0 && ((k0 + MLA_KT) % (FOLD > 0 ? FOLD : 1) == 0 || k0 + MLA_KT >= K))
      for (int i = 0; i < MT; i++)
        for (int j = 0; j < NT; j++) {
          tot[i][j] += acc[i][j];
          acc[i][j] = 0.f;
        }
  }
  if (FOLD > 0)
    for (int i = 0; i < MT; i++)
      for (int j = 0; j < NT; j++) acc[i][j] = tot[i][j];
}

template <int TN, int NT> DEVFN int mla_tn() { return threadIdx.x % (TN / NT); }
template <int TN, int NT> DEVFN int mla_tm() { return threadIdx.x / (TN / NT); }

// mla_qabs / mla_expand: per head h (grid z) and tile of rows (y) and
// columns (x): c[m·ldc + h·c_head + n] = Σ_k a[m·lda + h·a_head + k]·W(k, n)
// with W(k, n) = w[h·w_head + w_off + k·w_ld + n] (qabs: W_UK is [dq][R])
// or w[h·w_head + w_off + n·w_ld + k] (expand: W_UV is [dv][R]).
struct MLAHeadMMArgs {
  const float* a; i64 lda, a_head;
  const void* w; i64 w_bf16, w_head, w_off, w_ld;
  float* c; i64 ldc, c_head;
  i64 M, N, K;
};
template <int TM, int TN, int MT, int NT, bool kB>
DEVFN void mla_head_mm(const MLAHeadMMArgs& a) {
  i64 h = blockIdx.z, m0 = (i64)blockIdx.y * TM, n0 = (i64)blockIdx.x * TN;
  const float* A = a.a + h * a.a_head;
  i64 wb = h * a.w_head + a.w_off;
  float acc[MT][NT];
  mla_mm<TM, TN, MT, NT, kB>(
      a.K,
      [&](int m, i64 k) { return m0 + m < a.M ? A[(m0 + m) * a.lda + k] : 0.f; },
      [&](i64 k, int n) {
        if (n0 + n >= a.N) return 0.f;
        return ldw(a.w, wb + (kB ? (n0 + n) * a.w_ld + k : k * a.w_ld + n0 + n), a.w_bf16);
      },
      acc);
  int tm = mla_tm<TN, NT>(), tn = mla_tn<TN, NT>();
  for (int i = 0; i < MT; i++) {
    i64 m = m0 + tm * MT + i;
    if (m >= a.M) continue;
    for (int j = 0; j < NT; j++) {
      i64 n = n0 + tn * NT + j;
      if (n < a.N) a.c[m * a.ldc + h * a.c_head + n] = acc[i][j];
    }
  }
}
KERNEL(glmf_mla_qabs, MLAHeadMMArgs) { mla_head_mm<64, 64, 4, 4, false>(a); }
KERNEL(glmf_mla_qabs_s, MLAHeadMMArgs) { mla_head_mm<16, 32, 2, 2, false>(a); }
KERNEL(glmf_mla_expand, MLAHeadMMArgs) { mla_head_mm<64, 64, 4, 4, true>(a); }
KERNEL(glmf_mla_expand_s, MLAHeadMMArgs) { mla_head_mm<16, 32, 2, 2, true>(a); }

// mla_logits: for row t = t0 + blockIdx.z, heads [y·TM, +TM) and selection
// entries [x·TN, +TN): lg[z][h][i] = qa[t][h]·cache[sel[t][i]] (unscaled);
// a tile with no selected entry writes nothing (softmax reads only selected
// entries).
struct MLALogitsArgs {
  BatchMeta m;
  const float* qa; const int* sel; i64 width;
  const void* cache; i64 slot_stride;
  float* lg; i64 t0, H, R;
  const int* pt; i64 pt_stride, page;  // the latents' page table (cache_row)
  i64 cache_bf16;                       // the latents are bf16
};
template <int TM, int TN, int MT, int NT>
DEVFN void mla_logits(const MLALogitsArgs& a) {
  __shared__ i64 ps[TN];  // the entries' buffer rows (−1: unselected)
  i64 t = a.t0 + blockIdx.z, h0 = (i64)blockIdx.y * TM, i0 = (i64)blockIdx.x * TN;
  const int* srow = a.sel + t * a.width;
  i64 slot = a.m.seq_slot[a.m.row_seq[t]];
  int any = 0;
  for (int n = threadIdx.x; n < TN; n += blockDim.x) {
    int p = i0 + n < a.width ? srow[i0 + n] : -1;
    ps[n] = p >= 0 ? cache_row(a.pt, a.pt_stride, a.page, slot, a.slot_stride / a.R, p) : -1;
    any |= p >= 0;
  }
  any = block_reduce(any, [](int x, int y) { return x | y; });
  if (!any) return;
  const float* q = a.qa + (t * a.H + h0) * a.R;
  float acc[MT][NT];
  mla_mm<TM, TN, MT, NT, true>(
      a.R,
      [&](int m, i64 k) { return h0 + m < a.H ? q[m * a.R + k] : 0.f; },
      [&](i64 k, int n) { return ps[n] >= 0 ? ldw(a.cache, ps[n] * a.R + k, a.cache_bf16) : 0.f; },
      acc);
  int tm = mla_tm<TN, NT>(), tn = mla_tn<TN, NT>();
  float* lg = a.lg + (i64)blockIdx.z * a.H * a.width;
  for (int i = 0; i < MT; i++) {
    i64 h = h0 + tm * MT + i;
    if (h >= a.H) continue;
    for (int j = 0; j < NT; j++) {
      i64 n = i0 + tn * NT + j;
      if (n < a.width) lg[h * a.width + n] = acc[i][j];
    }
  }
}
KERNEL(glmf_mla_logits, MLALogitsArgs) { mla_logits<64, 64, 4, 4>(a); }
KERNEL(glmf_mla_logits_s, MLALogitsArgs) { mla_logits<16, 32, 2, 2>(a); }

// mla_softmax: per (head x, row t0 + y), a power-of-two block: over the selected
// entries, l = scale·lg, e = exp(l − max) in double rounded to float, the
// weights e/Σe (float32 sum), as the CPU; unselected entries (and a row
// with none) get 0.
struct MLASoftmaxArgs { const int* sel; i64 width; float* lg; i64 t0, H; double scale; };
KERNEL(glmf_mla_softmax, MLASoftmaxArgs) {
  i64 z = blockIdx.y, t = a.t0 + z, h = blockIdx.x;
  const int* srow = a.sel + t * a.width;
  float* l = a.lg + (z * a.H + h) * a.width;
  float scale = (float)a.scale;
  // the entries up to the row's last selected one (past it: weight 0,
  // which accum does not read and no partial sum below would change by)
  int last = 0;
  for (i64 i = threadIdx.x; i < a.width; i += blockDim.x)
    if (srow[i] >= 0) last = (int)i + 1;
  i64 n = block_reduce(last, [](int x, int y) { return x > y ? x : y; });
  float mx = -INFINITY;
  for (i64 i = threadIdx.x; i < n; i += blockDim.x)
    if (srow[i] >= 0) mx = fmaxf(mx, l[i] * scale);
  mx = block_max(mx);
  float s = 0;
  for (i64 i = threadIdx.x; i < n; i += blockDim.x) {
    float e = 0;
    if (srow[i] >= 0) e = (float)exp((double)(l[i] * scale - mx));
    l[i] = e;
    s += e;
  }
  s = block_sum(s);
  for (i64 i = threadIdx.x; i < n; i += blockDim.x) l[i] = srow[i] >= 0 ? l[i] / s : 0.f;
}

// mla_accum: for row t = t0 + blockIdx.z, heads [y·TM, +TM) and latent
// dims [x·TN, +TN): ol[t][h][r] = Σ_i w[z][h][i]·cache[sel[t][i]][r] over
// the entries up to the row's last selected one (unselected: weight 0), as
// the sum in order of the chunks of MLA_AD_CH entries' chains (the decode
// kernel computes the chunks in parallel).
#define MLA_AD_CH 256
struct MLAAccumArgs {
  BatchMeta m;
  const float* lg; const int* sel; i64 width;
  const void* cache; i64 slot_stride;
  float* ol; i64 t0, H, R;
  const int* pt; i64 pt_stride, page;  // the latents' page table (cache_row)
  i64 cache_bf16;                       // the latents are bf16
};
template <int TM, int TN, int MT, int NT>
DEVFN void mla_accum(const MLAAccumArgs& a) {
  i64 z = blockIdx.z, t = a.t0 + z, h0 = (i64)blockIdx.y * TM, r0 = (i64)blockIdx.x * TN;
  const int* srow = a.sel + t * a.width;
  int last = 0;
  for (i64 i = threadIdx.x; i < a.width; i += blockDim.x)
    if (srow[i] >= 0) last = (int)i + 1;
  i64 K = block_reduce(last, [](int x, int y) { return x > y ? x : y; });
  i64 slot = a.m.seq_slot[a.m.row_seq[t]], slot_rows = a.slot_stride / a.R;
  const float* w = a.lg + (z * a.H + h0) * a.width;
  float acc[MT][NT];
  mla_mm<TM, TN, MT, NT, false, MLA_AD_CH>(
      K,
      [&](int m, i64 k) { return h0 + m < a.H ? w[m * a.width + k] : 0.f; },
      [&](i64 k, int n) {
        int p = srow[k];
        return p >= 0 && r0 + n < a.R ? ldw(a.cache, cache_row(a.pt, a.pt_stride, a.page, slot, slot_rows, p) * a.R + r0 + n, a.cache_bf16) : 0.f;
      },
      acc);
  int tm = mla_tm<TN, NT>(), tn = mla_tn<TN, NT>();
  for (int i = 0; i < MT; i++) {
    i64 h = h0 + tm * MT + i;
    if (h >= a.H) continue;
    for (int j = 0; j < NT; j++) {
      i64 r = r0 + tn * NT + j;
      if (r < a.R) a.ol[(t * a.H + h) * a.R + r] = acc[i][j];
    }
  }
}
KERNEL(glmf_mla_accum, MLAAccumArgs) { mla_accum<64, 64, 4, 4>(a); }
KERNEL(glmf_mla_accum_s, MLAAccumArgs) { mla_accum<16, 32, 2, 2>(a); }

// Decode-shaped absorbed MLA (few rows): the same outputs, bit for bit, as
// the tiled kernels above (every output the same fmaf chain over k or over
// the selection entries in ascending order; entries of −1 add nothing), in
// shapes whose work follows the entries a row actually selects and whose
// weight reads stream the kv_b slices.

// mla_gemv: qabs / expand for M ≤ MLA_GV_MAXM rows: per head h (grid y) and
// MLA_GV_NC columns (x): c[m·ldc + h·c_head + n·c_n] = Σ_k A(m, k)·W(k, n),
// A(m, k) = Σ_p a[p·a_part_stride + m·lda + h·a_head + k] (0 + the live
// parts in order: mla_accum_d's chunks), W as in MLAHeadMMArgs (kB: W(k, n)
// contiguous in k). The block stages MLA_GV_KC×MLA_GV_NC weight tiles through shared
// memory with 16-byte loads (the next tile's loads in flight while the
// current one is used); thread (n = tid % NC, g = tid / NC) keeps the rows
// m ≡ g (mod 256/NC). 256 threads.
#define MLA_GV_NC 32
#define MLA_GV_KC 128
#define MLA_GV_MAXM 16
struct MLAGemvArgs {
  const float* a; i64 lda, a_head;
  i64 a_parts, a_part_stride;  // A is the sum, in order, of a_parts arrays (≥ 1)
  const int* a_live;           // [M][a_parts]: 0 where a part is all zeros (skipped); null: all live
  const void* w; i64 w_bf16, w_head, w_off, w_ld;
  float* c; i64 ldc, c_head, c_n;
  i64 M, N, K;
};
// (The shared tiles are the kernel's, one pair for both instantiations.)
template <bool kB, bool BF>
DEVFN void mla_gemv(const MLAGemvArgs& a, float (&Ws)[MLA_GV_KC][MLA_GV_NC + 1], float (&As)[MLA_GV_MAXM][MLA_GV_KC]) {
  constexpr int NC = MLA_GV_NC, KC = MLA_GV_KC, NTH = 256, G = NTH / NC;
  constexpr int MR = (MLA_GV_MAXM + G - 1) / G;  // rows per thread
  constexpr int PER = BF ? 8 : 4;                 // elements per 16-byte load
  constexpr int NV = KC * NC / PER / NTH;         // 16-byte loads per thread and tile
  i64 h = blockIdx.y, n0 = (i64)blockIdx.x * NC;
  int tid = threadIdx.x, tn = tid % NC, tg = tid / NC;
  const float* A = a.a + h * a.a_head;
  i64 wb = h * a.w_head + a.w_off;
  // vector loads: the contiguous dimension (k for kB, else n) in whole
  // aligned groups
  i64 cont = kB ? a.K : a.N;
  bool vec = ((wb | a.w_ld | cont) % PER) == 0 && ((u64)a.w & 15) == 0;
  i64 nk = (a.K + KC - 1) / KC;
  uint4 raw[NV];
  // element e of a tile is (k, n) with, for kB, n = e / KC, k = e % KC,
  // else k = e / NC, n = e % NC
  auto load = [&](i64 kc) {
    i64 k0 = kc * KC;
#pragma unroll
    for (int j = 0; j < NV; j++) {
      int e = (tid + j * NTH) * PER;
      int k = kB ? e % KC : e / NC, n = kB ? e / KC : e % NC;
      i64 gk = k0 + k, gn = n0 + n;
      raw[j] = make_uint4(0, 0, 0, 0);
      if (gk < a.K && gn < a.N) {
        i64 off = wb + (kB ? gn * a.w_ld + gk : gk * a.w_ld + gn);
        raw[j] = BF ? *(const uint4*)((const u16*)a.w + off) : *(const uint4*)((const float*)a.w + off);
      }
    }
  };
  auto store = [&](i64 kc) {
    i64 k0 = kc * KC;
    if (vec) {
#pragma unroll
      for (int j = 0; j < NV; j++) {
        int e = (tid + j * NTH) * PER;
        int k = kB ? e % KC : e / NC, n = kB ? e / KC : e % NC;
        unsigned u[4] = {raw[j].x, raw[j].y, raw[j].z, raw[j].w};
#pragma unroll
        for (int x = 0; x < PER; x++) {
          float v = BF ? bf16f((u16)(x & 1 ? u[x >> 1] >> 16 : u[x >> 1] & 0xffffu)) : __uint_as_float(u[x]);
          if (kB) Ws[k + x][n] = v; else Ws[k][n + x] = v;
        }
      }
    } else {
      for (int e = tid; e < KC * NC; e += NTH) {
        int k = e / NC, n = e % NC;
        i64 gk = k0 + k, gn = n0 + n;
        Ws[k][n] = gk < a.K && gn < a.N ? ldw(a.w, wb + (kB ? gn * a.w_ld + gk : gk * a.w_ld + gn), BF) : 0.f;
      }
    }
    for (int e = tid; e < a.M * KC; e += NTH) {
      int m = e / KC, k = e % KC;
      float v = 0.f;
      if (k0 + k < a.K)
        for (i64 pi = 0; pi < a.a_parts; pi++)
          if (!a.a_live || a.a_live[m * a.a_parts + pi]) v += A[pi * a.a_part_stride + m * a.lda + k0 + k];
      As[m][k] = v;
    }
  };
  float acc[MR];
#pragma unroll
  for (int i = 0; i < MR; i++) acc[i] = 0.f;
  if (vec) load(0);
  for (i64 kc = 0; kc < nk; kc++) {
    __syncthreads();
    store(kc);
    __syncthreads();
    if (vec && kc + 1 < nk) load(kc + 1);
    int kn = a.K - kc * KC < KC ? (int)(a.K - kc * KC) : KC;
#pragma unroll
    for (int i = 0; i < MR; i++) {
      int m = tg + i * G;
      if (m < a.M) {
        float s = acc[i];
#pragma unroll 8
        for (int k = 0; k < kn; k++) s = fmaf(As[m][k], Ws[k][tn], s);
        acc[i] = s;
      }
    }
  }
  i64 n = n0 + tn;
  if (n >= a.N) return;
#pragma unroll
  for (int i = 0; i < MR; i++) {
    int m = tg + i * G;
    if (m < a.M) a.c[m * a.ldc + h * a.c_head + n * a.c_n] = acc[i];
  }
}
// at most 64 registers: four blocks resident per SM, their tile loads in
// flight together
KERNEL_BOUNDS(glmf_mla_qabs_gv, MLAGemvArgs, 256, 4) {
  __shared__ __align__(16) float Ws[MLA_GV_KC][MLA_GV_NC + 1];
  __shared__ float As[MLA_GV_MAXM][MLA_GV_KC];
  if (a.w_bf16) mla_gemv<false, true>(a, Ws, As); else mla_gemv<false, false>(a, Ws, As);
}
KERNEL_BOUNDS(glmf_mla_expand_gv, MLAGemvArgs, 256, 4) {
  __shared__ __align__(16) float Ws[MLA_GV_KC][MLA_GV_NC + 1];
  __shared__ float As[MLA_GV_MAXM][MLA_GV_KC];
  if (a.w_bf16) mla_gemv<true, true>(a, Ws, As); else mla_gemv<true, false>(a, Ws, As);
}

// mla_logits_d: for row t (grid y) and selection entries [x·MLA_LD_E, +E):
// lg[t][h][i] = qt[t][·][h]·cache[sel[t][i]] (unscaled) for every head, with
// the absorbed queries k-major (qt[t][k][h]); a block whose entries are all
// −1 (past the row's selection) exits at once. The E latents are staged in
// shared memory once and serve every head; the queries pass through shared
// memory in chunks of MLA_LD_KQ k (contiguous in qt), the next chunk's loads
// in flight while the current one is used. Thread (h, g) runs the chains of
// entries 4g … 4g+3. 256 threads; dynamic shared memory (E·R + KQ·H)
// floats.
#define MLA_LD_E 12
#define MLA_LD_KQ 64
struct MLALogitsDArgs {
  BatchMeta m;
  const float* qt; const int* sel; i64 width;
  const void* cache; i64 slot_stride;
  float* lg; i64 H, R;
  const int* pt; i64 pt_stride, page;  // the latents' page table (cache_row)
  i64 cache_bf16;                       // the latents are bf16
};
KERNEL(glmf_mla_logits_d, MLALogitsDArgs) {
  constexpr int E = MLA_LD_E, KQ = MLA_LD_KQ, NTH = 256, EG = 4, QV = 4;  // QV: float4 query loads per thread
  DYN_SMEM(float, lat);
  float* qs = lat + E * a.R;  // [KQ][H]
  __shared__ i64 ps[E];  // the entries' buffer rows (−1: unselected)
  i64 t = blockIdx.y, i0 = (i64)blockIdx.x * E;
  int tid = threadIdx.x;
  const int* srow = a.sel + t * a.width;
  if (tid < E) {
    int p = i0 + tid < a.width ? srow[i0 + tid] : -1;
    ps[tid] = p >= 0 ? cache_row(a.pt, a.pt_stride, a.page, a.m.seq_slot[a.m.row_seq[t]], a.slot_stride / a.R, p) : -1;
  }
  __syncthreads();
  int any = 0;
  for (int e = 0; e < E; e++) any |= ps[e] >= 0;
  if (!any) return;
  const float* cache = (const float*)a.cache;  // (the vector path: fp32 latents)
  if (!a.cache_bf16 && (a.R & 3) == 0 && ((u64)cache & 15) == 0) {
    // LV float4 loads a thread in flight at once
    constexpr int LV = 8;
    int R4 = (int)(a.R / 4), n4 = E * R4;
    for (int x0 = 0; x0 < n4; x0 += LV * NTH) {
      mla_f4 v[LV];
#pragma unroll
      for (int j = 0; j < LV; j++) {
        int x = x0 + tid + j * NTH, e = x / R4;
        v[j] = mla_f4{0.f, 0.f, 0.f, 0.f};
        if (x < n4 && ps[e] >= 0) v[j] = ((const mla_f4*)(cache + ps[e] * a.R))[x % R4];
      }
#pragma unroll
      for (int j = 0; j < LV; j++) {
        int x = x0 + tid + j * NTH;
        if (x < n4) ((mla_f4*)lat)[x] = v[j];
      }
    }
  } else {
    for (i64 x = tid; x < E * a.R; x += NTH) {
      int e = (int)(x / a.R);
      lat[x] = ps[e] >= 0 ? ldw(a.cache, ps[e] * a.R + x % a.R, a.cache_bf16) : 0.f;
    }
  }
  const float* q = a.qt + t * a.R * a.H;
  // query chunk kc: qt[kc·KQ·H, +KQ·H) (contiguous), KQ·H ≤ NTH·QV·4 and
  // aligned for the vector path
  bool qvec = a.H * KQ <= NTH * QV * 4 && (a.H & 3) == 0 && ((u64)q & 15) == 0;
  i64 nk = (a.R + KQ - 1) / KQ;
  mla_f4 qr[QV];
  auto qload = [&](i64 kc) {
    i64 base = kc * KQ * a.H, lim = a.R * a.H;
    for (int j = 0; j < QV; j++) {
      i64 x = (i64)(tid + j * NTH) * 4;
      qr[j] = mla_f4{0.f, 0.f, 0.f, 0.f};
      if (x < KQ * a.H && base + x < lim) qr[j] = *(const mla_f4*)(q + base + x);
    }
  };
  if (qvec) qload(0);
  float acc[EG];
  i64 h = tid % a.H;
  int e0 = (int)(tid / a.H) * EG;
  bool active = tid < a.H * (E / EG) && (ps[e0] >= 0 || ps[e0 + 1] >= 0 || ps[e0 + 2] >= 0 || ps[e0 + 3] >= 0);
  for (int e = 0; e < EG; e++) acc[e] = 0.f;
  for (i64 kc = 0; kc < nk; kc++) {
    __syncthreads();
    if (qvec) {
      for (int j = 0; j < QV; j++) {
        i64 x = (i64)(tid + j * NTH) * 4;
        if (x < KQ * a.H) *(mla_f4*)(qs + x) = qr[j];
      }
    } else {
      i64 base = kc * KQ * a.H, lim = a.R * a.H;
      for (i64 x = tid; x < KQ * a.H; x += NTH) qs[x] = base + x < lim ? q[base + x] : 0.f;
    }
    __syncthreads();
    if (qvec && kc + 1 < nk) qload(kc + 1);
    if (!active) continue;
    int kn = a.R - kc * KQ < KQ ? (int)(a.R - kc * KQ) : KQ;
    const float* l0 = lat + e0 * a.R + kc * KQ;
#pragma unroll 8
    for (int k = 0; k < kn; k++) {
      float qv = qs[k * a.H + h];
      for (int e = 0; e < EG; e++) acc[e] = fmaf(qv, l0[e * a.R + k], acc[e]);
    }
  }
  if (!active) return;
  float* lg = a.lg + t * a.H * a.width;
  for (int e = 0; e < EG; e++)
    if (ps[e0 + e] >= 0) lg[h * a.width + i0 + e0 + e] = acc[e];
}

// mla_accum_d: the partial sums of mla_accum's chunks, all in parallel:
// for row t, chunk c (entries [c·MLA_AD_CH, +MLA_AD_CH)), heads [h0, +8)
// and latent dims [x·32, +32): part[t][c][h][r] = Σ_i w[t][h][i]·
// cache[sel[t][i]][r] over the chunk's selected entries in order (+0 for a
// chunk with none, which writes only live[t][c] = 0, else 1); the expand
// adds the live ones in chunk order. Grid (ceil(R/32),
// ceil(width/MLA_AD_CH), T·ceil(H/8)); lane = r, warp = head; the chunk's
// entries, latents and weights are staged in shared memory at once.
struct MLAAccumDArgs {
  BatchMeta m;
  const float* lg; const int* sel; i64 width;
  const void* cache; i64 slot_stride;
  float* part; int* live; i64 H, R;
  const int* pt; i64 pt_stride, page;  // the latents' page table (cache_row)
  i64 cache_bf16;                       // the latents are bf16
};
KERNEL(glmf_mla_accum_d, MLAAccumDArgs) {
  constexpr int CH = MLA_AD_CH, NTH = 256, LV = CH * 32 / 4 / NTH;  // float4 latent loads per thread
  __shared__ i64 ps[CH];  // the entries' buffer rows (−1: unselected)
  __shared__ __align__(16) float lat[CH][32];
  __shared__ float ws[8][CH];
  __shared__ int any_s;
  i64 hg = (a.H + 7) / 8, nch = (a.width + CH - 1) / CH;
  i64 t = blockIdx.z / hg, h0 = (blockIdx.z % hg) * 8, c = blockIdx.y, c0 = c * CH, r0 = (i64)blockIdx.x * 32;
  int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  i64 h = h0 + warp, r = r0 + lane;
  const int* srow = a.sel + t * a.width;
  if (tid == 0) any_s = 0;
  __syncthreads();
  i64 slot = a.m.seq_slot[a.m.row_seq[t]];
  for (int i = tid; i < CH; i += NTH) {
    int p = c0 + i < a.width ? srow[c0 + i] : -1;
    ps[i] = p >= 0 ? cache_row(a.pt, a.pt_stride, a.page, slot, a.slot_stride / a.R, p) : -1;
    if (p >= 0) any_s = 1;
  }
  __syncthreads();
  float* out = a.part + ((t * nch + c) * a.H + h) * a.R + r;
  if (blockIdx.x == 0 && blockIdx.z % hg == 0 && tid == 0) a.live[t * nch + c] = any_s;
  if (!any_s) return;
  const float* cache = (const float*)a.cache;  // (the vector path: fp32 latents)
  const float* w = a.lg + t * a.H * a.width;
  {  // the 8 heads' weights of the chunk, every load in flight at once
    constexpr int WV = 8 * CH / NTH;
    float v[WV];
#pragma unroll
    for (int j = 0; j < WV; j++) {
      int x = tid + j * NTH, hh = x / CH, i = x % CH;
      v[j] = h0 + hh < a.H && ps[i] >= 0 ? w[(h0 + hh) * a.width + c0 + i] : 0.f;
    }
#pragma unroll
    for (int j = 0; j < WV; j++) {
      int x = tid + j * NTH;
      ws[x / CH][x % CH] = v[j];
    }
  }
  if (!a.cache_bf16 && (a.R & 3) == 0 && r0 + 32 <= a.R && ((u64)cache & 15) == 0) {
    mla_f4 v[LV];
#pragma unroll
    for (int j = 0; j < LV; j++) {
      int x = tid + j * NTH, e = x / 8, q = x % 8;
      v[j] = mla_f4{0.f, 0.f, 0.f, 0.f};
      if (ps[e] >= 0) v[j] = *(const mla_f4*)(cache + ps[e] * a.R + r0 + 4 * q);
    }
#pragma unroll
    for (int j = 0; j < LV; j++) {
      int x = tid + j * NTH, e = x / 8, q = x % 8;
      *(mla_f4*)&lat[e][4 * q] = v[j];
    }
  } else {
    for (int x = tid; x < CH * 32; x += NTH) {
      int e = x / 32, rr = x % 32;
      lat[e][rr] = ps[e] >= 0 && r0 + rr < a.R ? ldw(a.cache, ps[e] * a.R + r0 + rr, a.cache_bf16) : 0.f;
    }
  }
  __syncthreads();
  if (h >= a.H || r >= a.R) return;
  float acc = 0.f;
#pragma unroll 8
  for (int i = 0; i < CH; i++)
    if (ps[i] >= 0) acc = fmaf(ws[warp][i], lat[i][lane], acc);
  *out = acc;
}
