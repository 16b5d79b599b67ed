// DSA: per-batch metadata, the k-pool lightning indexer (append and pool
// keys into the slot's cache, score the visible pools, select the best
// plus the incomplete tail) and sparse NoPE MLA in the absorbed form
// (attention in the kv_lora latent space: q·W_k, then W_v on the result).
#include "common.cuh"

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
  float* pools; i64 pools_stride;        // per slot [maxPools][D]
  float* pend_k; float* pend_g; i64 pend_stride;  // per slot [kpool][D]
  i64 D, kpool;
  const int* ckpt;                       // [S] checkpoint position or −1 (0: no records)
  float* rec_k; float* rec_g; i64 rec_stride;  // per slot [kpool−1+depth][D]
};
KERNEL(glmf_indexer_append, IdxAppendArgs) {
  i64 s = blockIdx.x, d = threadIdx.x;
  if (s >= a.m.S || d >= a.D) return;
  i64 slot = a.m.seq_slot[s], pos0 = a.m.seq_pos0[s], n = a.m.seq_n[s], row0 = a.m.seq_row0[s];
  float* pk = a.pend_k + slot * a.pend_stride;
  float* pg = a.pend_g + slot * a.pend_stride;
  float* pools = a.pools + slot * a.pools_stride;
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
      pools[(pos / a.kpool) * a.D + d] = (float)(acc / sum);
    }
  }
}

// indexer_score: scores[t][p] = Σ_h w[t][h]·wscale·ReLU(q_h·key_p·scale) for
// the pools p < visible[t]. Grid (ceil(maxvis/128), T), 128 threads.
struct IdxScoreArgs {
  BatchMeta m;
  const int* visible;
  const float* q; const float* w;   // [T][H·D], [T][H]
  const float* pools; i64 pools_stride;
  float* scores; i64 ld;            // [T][ld]
  i64 H, D;
  double scale, wscale;
};
KERNEL(glmf_indexer_score, IdxScoreArgs) {
  DYN_SMEM(float, qs);
  i64 t = blockIdx.y;
  if (t >= a.m.T) return;
  i64 HD = a.H * a.D;
  for (i64 i = threadIdx.x; i < HD; i += blockDim.x) qs[i] = a.q[t * HD + i];
  __syncthreads();
  i64 p = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (p >= a.visible[t]) return;
  const float* key = a.pools + (i64)a.m.seq_slot[a.m.row_seq[t]] * a.pools_stride + p * a.D;
  float scale = (float)a.scale, wscale = (float)a.wscale;
  float s = 0;
  for (i64 h = 0; h < a.H; h++) {
    float dot = 0;
    for (i64 x = 0; x < a.D; x++) dot += qs[h * a.D + x] * key[x];
    dot *= scale;
    if (dot > 0) s += (a.w[t * a.H + h] * wscale) * dot;
  }
  a.scores[t * a.ld + p] = s;
}

// indexer_select: per row (block of 256): the best min(topk/kpool,
// visible) pools by score (ties: lower pool), listed in pool order as
// positions, then the tail positions [kpool·visible, pos]; −1 pads.
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
  i64 keep = a.keep < n ? a.keep : n;
  u64 bound = ~0ull;
  if (keep < n && keep > 0) {
    bound = radix_select(n, (u64)keep, [&](i64 i, u64* key, u64* w) {
      *key = desc_key(sc[i], (unsigned)i);
      *w = 1;
      return true;
    });
  }
  for (i64 i = threadIdx.x; i < a.width; i += blockDim.x) row[i] = -1;
  __syncthreads();
  // compaction in pool order
  __shared__ int base_s;
  if (threadIdx.x == 0) base_s = 0;
  __syncthreads();
  if (keep > 0) {
    for (i64 c0 = 0; c0 < n; c0 += blockDim.x) {
      i64 p = c0 + threadIdx.x;
      int flag = p < n && desc_key(sc[p], (unsigned)p) <= bound;
      int total;
      int off = block_exscan(flag, &total);
      if (flag) {
        i64 o = (i64)(base_s + off) * a.kpool;
        for (i64 x = 0; x < a.kpool; x++) row[o + x] = (int)(p * a.kpool + x);
      }
      __syncthreads();
      if (threadIdx.x == 0) base_s += total;
      __syncthreads();
    }
  }
  if (a.tail && threadIdx.x == 0) {
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
// padding (the host checks that they fit). Grid T, one thread per row.
struct IdxSharedArgs {
  BatchMeta m;
  const int* saved; i64 saved_stride, saved_width;
  const int* share_pos;  // [S] position of the saved selection
  int* sel; i64 width;
};
KERNEL(glmf_indexer_shared, IdxSharedArgs) {
  i64 t = blockIdx.x;
  if (t >= a.m.T || threadIdx.x != 0) return;
  i64 s = a.m.row_seq[t];
  const int* sv = a.saved + (i64)a.m.seq_slot[s] * a.saved_stride;
  int* row = a.sel + t * a.width;
  i64 o = 0;
  for (i64 i = 0; i < a.saved_width && o < a.width; i++)
    if (sv[i] >= 0) row[o++] = sv[i];
  for (i64 p = (i64)a.share_pos[s] + 1; p <= a.m.row_pos[t] && o < a.width; p++) row[o++] = (int)p;
  for (; o < a.width; o++) row[o] = -1;
}

// mla_append: cache[slot][pos] = c_kv[t] for every row.
struct MLAAppendArgs { BatchMeta m; const float* ckv; float* cache; i64 slot_stride, R; };
KERNEL(glmf_mla_append, MLAAppendArgs) {
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= a.m.T * a.R) return;
  i64 t = i / a.R, r = i % a.R;
  i64 slot = a.m.seq_slot[a.m.row_seq[t]];
  a.cache[slot * a.slot_stride + (i64)a.m.row_pos[t] * a.R + r] = a.ckv[i];
}

// mla_qabs: qa[t][h][r] = Σ_d q[t][h][d]·W[h·(dq+dv)+d][r] (the key half of
// kv_b_proj absorbed into the query). One block per (t, h).
struct MLAQAbsArgs {
  const float* q; const void* w; i64 w_bf16; float* qa; i64 T, H, dq, dv, R;
};
KERNEL(glmf_mla_qabs, MLAQAbsArgs) {
  DYN_SMEM(float, qs);
  i64 th = blockIdx.x;
  if (th >= a.T * a.H) return;
  i64 h = th % a.H;
  for (i64 d = threadIdx.x; d < a.dq; d += blockDim.x) qs[d] = a.q[th * a.dq + d];
  __syncthreads();
  for (i64 r = threadIdx.x; r < a.R; r += blockDim.x) {
    float acc = 0;
    for (i64 d = 0; d < a.dq; d++) acc += qs[d] * ldw(a.w, (h * (a.dq + a.dv) + d) * a.R + r, a.w_bf16);
    a.qa[th * a.R + r] = acc;
  }
}

// mla_attend: per (t, h) block: logits = scale·qa·c_p over the selected
// positions, softmax (float32 sums, exp in double, as the CPU), and the
// latent output ol[t][h] = Σ_p a_p·c_p. No selected position: zeros.
struct MLAAttendArgs {
  BatchMeta m;
  const float* qa; const int* sel; i64 width;
  const float* cache; i64 slot_stride;
  float* ol; i64 T, H, R; double scale;
};
KERNEL(glmf_mla_attend, MLAAttendArgs) {
  DYN_SMEM(float, lg);  // [width] logits, then weights
  i64 th = blockIdx.x;
  if (th >= a.T * a.H) return;
  i64 t = th / a.H;
  const int* srow = a.sel + t * a.width;
  const float* cache = a.cache + (i64)a.m.seq_slot[a.m.row_seq[t]] * a.slot_stride;
  const float* q = a.qa + th * a.R;
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
  float scale = (float)a.scale;
  for (i64 i = warp; i < a.width; i += nw) {
    int p = srow[i];
    if (p < 0) continue;
    float d = 0;
    for (i64 r = lane; r < a.R; r += 32) d += q[r] * cache[(i64)p * a.R + r];
    d = warp_sum(d);
    if (lane == 0) lg[i] = d * scale;
  }
  __syncthreads();
  __shared__ int any_s;
  if (threadIdx.x == 0) {
    float mx = -INFINITY;
    int any = 0;
    for (i64 i = 0; i < a.width; i++)
      if (srow[i] >= 0) {
        any = 1;
        if (lg[i] > mx) mx = lg[i];
      }
    float s = 0;
    for (i64 i = 0; i < a.width; i++)
      if (srow[i] >= 0) {
        lg[i] = (float)exp((double)(lg[i] - mx));
        s += lg[i];
      }
    for (i64 i = 0; i < a.width; i++) lg[i] = srow[i] >= 0 ? lg[i] / s : 0;
    any_s = any;
  }
  __syncthreads();
  for (i64 r = threadIdx.x; r < a.R; r += blockDim.x) {
    float acc = 0;
    if (any_s)
      for (i64 i = 0; i < a.width; i++) {
        int p = srow[i];
        if (p >= 0) acc += lg[i] * cache[(i64)p * a.R + r];
      }
    a.ol[th * a.R + r] = acc;
  }
}

// mla_expand: o[t][h·dv+e] = Σ_r W[h·(dq+dv)+dq+e][r]·ol[t][h][r] (the value
// half of kv_b_proj). One block per (t, h).
struct MLAExpandArgs {
  const float* ol; const void* w; i64 w_bf16; float* o; i64 T, H, dq, dv, R;
};
KERNEL(glmf_mla_expand, MLAExpandArgs) {
  DYN_SMEM(float, ls);
  i64 th = blockIdx.x;
  if (th >= a.T * a.H) return;
  i64 h = th % a.H;
  for (i64 r = threadIdx.x; r < a.R; r += blockDim.x) ls[r] = a.ol[th * a.R + r];
  __syncthreads();
  for (i64 e = threadIdx.x; e < a.dv; e += blockDim.x) {
    float acc = 0;
    i64 wrow = (h * (a.dq + a.dv) + a.dq + e) * a.R;
    for (i64 r = 0; r < a.R; r++) acc += ldw(a.w, wrow + r, a.w_bf16) * ls[r];
    a.o[th * a.dv + e] = acc;
  }
}
