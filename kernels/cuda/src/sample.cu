// Sampling on the device: one block per logits row picks a token with the
// rule of core/sample.Pick (greedy, or top-k → temperature → min-p → top-p →
// the draw u), and reports the log-softmax of the pick and the most likely
// alternatives, so that only ids and a few numbers leave the device.
//
// Order is the CPU's: logits descending, ties by lower index (desc_key).
// Probability masses are summed as 2^62 fixed-point integers, so every sum
// is exact and independent of thread scheduling.
//
// A row with logits processing (its spec's edits or allow mask) is first
// processed by glmf_logits_process into the processed rows' buffer, which
// the sampler then reads for that row (the raw logits stay as they are).
#include "common.cuh"

#define SAMPLE_MAX_TOP 32

// One token's edit (core/sample.Edit): l' = penalize(l, penalty) + add, at
// least −FLT_MAX; a raw non-finite l is left as it is. The values are
// float32s held exactly in doubles.
struct LogitEdit {
  i64 token;
  double penalty, add;
};

struct SampleSpec {
  double temperature, top_p, min_p, u;
  i64 top_k, n_top;
  // logits processing (core/sample.Apply): n_edits edits sorted by token
  // (unique), then allow (0: none), a mask of one bit per token (bit i%32
  // of word i/32) whose clear bits ban their tokens (−FLT_MAX). Device
  // addresses into the step's metadata.
  const LogitEdit* edits;
  i64 n_edits;
  const unsigned* allow;
};

// sample_processed says whether a row's logits are processed (then the
// sampler reads them from the processed rows' buffer).
DEVFN bool sample_processed(const SampleSpec& sp) { return sp.n_edits > 0 || sp.allow != 0; }

#define LOGIT_MAX 3.4028234663852886e38f  // FLT_MAX; −LOGIT_MAX is a ban (core/sample.Banned)

DEVFN bool logit_finite(float v) { return fabsf(v) <= LOGIT_MAX; }

struct SampleOut {
  i64 nonfinite;       // non-finite logits in the row (then nothing else is set
  i64 first_bad;       // but these two and bad_value)
  double bad_value;
  i64 token;
  double lse;          // log Σ exp(l): logprob(x) = l(x) − lse
  double tok_logit;
  i64 n_top;
  i64 top_id[SAMPLE_MAX_TOP];
  double top_logit[SAMPLE_MAX_TOP];
};

// A chunk's share of a row (glmf_sample_part): its non-finite count and
// first bad index, its largest logit, Σ exp(l − mx) over the chunk (in
// double) and its nt smallest keys (the row's n_top, at least 1: top[0] is
// the chunk's argmax; ~0 past the chunk's length).
struct SamplePart {
  double bad;
  i64 first_bad;
  double se;
  double mx;  // a float
  i64 nt;
  u64 top[SAMPLE_MAX_TOP];
};

struct SampleArgs {
  const float* logits; i64 vocab, rows;
  const SampleSpec* specs;
  SampleOut* out;
  u64* mass;          // scratch [rows][vocab]
  const SamplePart* parts; i64 nchunks;  // glmf_sample_part's [rows][nchunks]
  const float* processed;  // glmf_logits_process's rows [rows][vocab] (0: none)
};

// Values a thread of glmf_sample_part holds: a chunk is at most
// SAMPLE_PART_PER·blockDim.x logits.
#define SAMPLE_PART_PER 8

struct SamplePartArgs {
  const float* logits; i64 vocab, rows, chunk, nchunks;
  const SampleSpec* specs;
  SamplePart* parts;
  const float* processed;  // glmf_logits_process's rows [rows][vocab] (0: none)
};

// sample_row is the logits row the sampler reads: the processed one when
// the row is processed.
DEVFN const float* sample_row(const float* logits, const float* processed, const SampleSpec& sp, i64 row, i64 vocab) {
  return (processed && sample_processed(sp) ? processed : logits) + row * vocab;
}

struct LogitsProcessArgs {
  const float* logits; i64 vocab, rows, chunk, nchunks;
  const SampleSpec* specs;
  float* out;  // the processed rows [rows][vocab] (only processed rows are written)
};

// edit_lower is the first of n edits (sorted by token) whose token is ≥ t.
DEVFN i64 edit_lower(const LogitEdit* e, i64 n, i64 t) {
  i64 lo = 0, hi = n;
  while (lo < hi) {
    i64 mid = (lo + hi) >> 1;
    if (e[mid].token < t) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// logit_edit applies one edit to a raw logit, as core/sample.Apply does
// (no contraction into fused operations: the host rounds each step).
DEVFN float logit_edit(float l, const LogitEdit& e) {
  if (!logit_finite(l)) return l;
  float p = (float)e.penalty, add = (float)e.add;
  if (p != 0.f && p != 1.f) {
    l = l > 0.f ? l / p : __fmul_rn(l, p);
    if (l > LOGIT_MAX) l = LOGIT_MAX;  // a penalty near 0 divides past the finite range
  }
  l = __fadd_rn(l, add);
  if (!(l >= -LOGIT_MAX)) l = -LOGIT_MAX;  // −Inf (a ban) or below the finite range
  return l;
}

// glmf_logits_process: block (c, row) processes chunk c of a processed
// row (its spec has edits or a mask) into out, as core/sample.Apply: each
// logit copied, or −FLT_MAX where the mask's bit is clear (a raw
// non-finite value is left for the sampler to report); then the chunk's
// edits (a range of the row's sorted edits, found by binary search)
// overwrite their tokens. A row without processing returns at once.
KERNEL(glmf_logits_process, LogitsProcessArgs) {
  i64 c = blockIdx.x, row = blockIdx.y;
  if (row >= a.rows || c >= a.nchunks) return;
  const SampleSpec sp = a.specs[row];
  if (!sample_processed(sp)) return;
  const float* l = a.logits + row * a.vocab;
  float* o = a.out + row * a.vocab;
  const unsigned* m = sp.allow;
  i64 i0 = c * a.chunk, i1 = i0 + a.chunk < a.vocab ? i0 + a.chunk : a.vocab;
  for (i64 i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
    float v = l[i];
    if (m && !((m[i >> 5] >> (i & 31)) & 1u) && logit_finite(v)) v = -LOGIT_MAX;
    o[i] = v;
  }
  if (sp.n_edits == 0) return;
  __syncthreads();  // the edits overwrite what the copy wrote
  i64 e0 = edit_lower(sp.edits, sp.n_edits, i0), e1 = edit_lower(sp.edits, sp.n_edits, i1);
  for (i64 e = e0 + threadIdx.x; e < e1; e += blockDim.x) {
    const LogitEdit E = sp.edits[e];
    i64 t = E.token;
    float v = logit_edit(l[t], E);
    if (m && !((m[t >> 5] >> (t & 31)) & 1u) && logit_finite(v)) v = -LOGIT_MAX;
    o[t] = v;
  }
}

// glmf_sample_part: block (c, row) reduces chunk c (logits [c·chunk,
// (c+1)·chunk)) of a row, its values in registers: a grid of blocks reads
// the vocabulary at the bandwidth one block cannot reach. glmf_sample then
// combines the chunks in a fixed order.
KERNEL(glmf_sample_part, SamplePartArgs) {
  i64 c = blockIdx.x, row = blockIdx.y;
  if (row >= a.rows || c >= a.nchunks) return;
  const float* l = sample_row(a.logits, a.processed, a.specs[row], row, a.vocab);
  i64 i0 = c * a.chunk, i1 = i0 + a.chunk < a.vocab ? i0 + a.chunk : a.vocab;
  float v[SAMPLE_PART_PER];
#pragma unroll
  for (int q = 0; q < SAMPLE_PART_PER; q++) {
    i64 i = i0 + threadIdx.x + (i64)q * blockDim.x;
    v[q] = i < i1 ? l[i] : 0.f;
  }
  double bad = 0;
  u64 firstb = ~0ull;
  float mx = -INFINITY;
#pragma unroll
  for (int q = 0; q < SAMPLE_PART_PER; q++) {
    i64 i = i0 + threadIdx.x + (i64)q * blockDim.x;
    if (i >= i1) continue;
    if (!(fabsf(v[q]) <= 3.4028234663852886e38f)) {
      bad += 1;
      if ((u64)i < firstb) firstb = (u64)i;
    } else {
      mx = fmaxf(mx, v[q]);
    }
  }
  bad = block_sum_d(bad);
  firstb = block_min_u64(firstb);
  mx = block_max(mx);
  double se = 0;
  if (bad == 0) {
#pragma unroll
    for (int q = 0; q < SAMPLE_PART_PER; q++) {
      i64 i = i0 + threadIdx.x + (i64)q * blockDim.x;
      if (i < i1) se += exp((double)(v[q] - mx));
    }
  }
  se = block_sum_d(se);
  i64 nt = a.specs[row].n_top;
  nt = nt < 1 ? 1 : nt > SAMPLE_MAX_TOP ? SAMPLE_MAX_TOP : nt;
  SamplePart* P = a.parts + row * a.nchunks + c;
  u64 prev = 0;
  for (i64 j = 0; j < nt; j++) {
    u64 kmin = ~0ull;
#pragma unroll
    for (int q = 0; q < SAMPLE_PART_PER; q++) {
      i64 i = i0 + threadIdx.x + (i64)q * blockDim.x;
      if (i >= i1) continue;
      u64 k = desc_key(v[q], (unsigned)i);
      if ((j == 0 || k > prev) && k < kmin) kmin = k;
    }
    kmin = block_min_u64(kmin);
    if (threadIdx.x == 0) P->top[j] = kmin;
    prev = kmin;
  }
  if (threadIdx.x == 0) {
    P->bad = bad;
    P->first_bad = (i64)firstb;
    P->se = se;
    P->mx = (double)mx;
    P->nt = nt;
  }
}

#define FIX_ONE 4611686018427387904.0  // 2^62

KERNEL(glmf_sample, SampleArgs) {
  i64 row = blockIdx.x;
  if (row >= a.rows) return;
  const SampleSpec sp = a.specs[row];
  const float* l = sample_row(a.logits, a.processed, sp, row, a.vocab);
  SampleOut* o = a.out + row;
  i64 V = a.vocab;
  // glmf_sample_part's chunks (a.parts), else the row itself
  const SamplePart* P = a.parts ? a.parts + row * a.nchunks : 0;
  i64 NC = a.nchunks;
  // non-finite logits end the request with an error, never a silent token
  double bad = 0;
  u64 firstb = ~0ull;
  if (P) {
    for (i64 c = threadIdx.x; c < NC; c += blockDim.x) {
      bad += P[c].bad;
      if ((u64)P[c].first_bad < firstb) firstb = (u64)P[c].first_bad;
    }
  } else {
    for (i64 i = threadIdx.x; i < V; i += blockDim.x)
      if (!(fabsf(l[i]) <= 3.4028234663852886e38f)) {
        bad += 1;
        if ((u64)i < firstb) firstb = (u64)i;
      }
  }
  bad = block_sum_d(bad);
  firstb = block_min_u64(firstb);
  if (bad > 0) {
    if (threadIdx.x == 0) {
      o->nonfinite = (i64)bad;
      o->first_bad = (i64)firstb;
      o->bad_value = (double)l[firstb];
    }
    return;
  }
  if (threadIdx.x == 0) o->nonfinite = 0;
  // max, argmax (lowest index), log-sum-exp
  float mx = -INFINITY;
  if (P) {
    for (i64 c = threadIdx.x; c < NC; c += blockDim.x) mx = fmaxf(mx, (float)P[c].mx);
  } else {
    for (i64 i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, l[i]);
  }
  mx = block_max(mx);
  double se = 0;
  if (P) {  // a chunk's sum is relative to its own maximum
    for (i64 c = threadIdx.x; c < NC; c += blockDim.x) se += P[c].se * exp(P[c].mx - (double)mx);
  } else {
    for (i64 i = threadIdx.x; i < V; i += blockDim.x) se += exp((double)(l[i] - mx));
  }
  se = block_sum_d(se);
  double lse = (double)mx + log(se);
  u64 best = ~0ull;
  if (P) {
    for (i64 c = threadIdx.x; c < NC; c += blockDim.x)
      if (P[c].top[0] < best) best = P[c].top[0];
  } else {
    for (i64 i = threadIdx.x; i < V; i += blockDim.x) {
      u64 k = desc_key(l[i], (unsigned)i);
      if (k < best) best = k;
    }
  }
  best = block_min_u64(best);  // the argmax: largest logit, lowest index
  i64 tok = (i64)(best & 0xffffffffu);
  if (sp.temperature > 0) {
    u64* m = a.mass + row * V;
    double T = sp.temperature, dmx = (double)mx;
    // top-k: the k-th key in order bounds the candidates
    u64 kbound = ~0ull;
    if (sp.top_k > 0 && sp.top_k < V) {
      kbound = radix_select(V, (u64)sp.top_k, [&](i64 i, u64* key, u64* w) {
        *key = desc_key(l[i], (unsigned)i);
        *w = 1;
        return true;
      });
    }
    double z = 0;
    for (i64 i = threadIdx.x; i < V; i += blockDim.x)
      if (desc_key(l[i], (unsigned)i) <= kbound) z += exp(((double)l[i] - dmx) / T);
    z = block_sum_d(z);
    double cut = sp.min_p > 0 ? sp.min_p * (1.0 / z) : 0;
    // masses of the candidates (0 outside), min-p applied: as on the
    // host, a token of probability 0 (a ban, an underflow) is no candidate,
    // and a kept one keeps a (tiny) mass
    for (i64 i = threadIdx.x; i < V; i += blockDim.x) {
      u64 mv = 0;
      if (desc_key(l[i], (unsigned)i) <= kbound) {
        double pr = exp(((double)l[i] - dmx) / T) / z;
        if (pr > 0 && (pr >= cut || desc_key(l[i], (unsigned)i) == best)) {
          mv = (u64)(pr * FIX_ONE);
          if (mv == 0) mv = 1;
        }
      }
      m[i] = mv;
    }
    __syncthreads();
    u64 pbound = ~0ull;
    if (sp.top_p < 1) {
      u64 target = (u64)(sp.top_p * FIX_ONE);
      if (target == 0) target = 1;
      pbound = radix_select(V, target, [&](i64 i, u64* key, u64* w) {
        *key = desc_key(l[i], (unsigned)i);
        *w = m[i];
        return true;
      });
    }
    // total kept mass, then the draw
    __shared__ u64 tot_s;
    if (threadIdx.x == 0) tot_s = 0;
    __syncthreads();
    u64 part = 0;
    for (i64 i = threadIdx.x; i < V; i += blockDim.x)
      if (desc_key(l[i], (unsigned)i) <= pbound) part += m[i];
    atomicAdd(&tot_s, part);
    __syncthreads();
    u64 total = tot_s;
    u64 target = (u64)(sp.u * (double)total);
    if (target == 0) target = 1;
    u64 key = radix_select(V, target, [&](i64 i, u64* k, u64* w) {
      *k = desc_key(l[i], (unsigned)i);
      *w = *k <= pbound ? m[i] : 0;
      return true;
    });
    if (key != ~0ull) tok = (i64)(key & 0xffffffffu);
  }
  // top alternatives: successive smallest keys
  i64 nt = sp.n_top < SAMPLE_MAX_TOP ? sp.n_top : SAMPLE_MAX_TOP;
  u64 prev = 0;
  for (i64 j = 0; j < nt; j++) {
    u64 kmin = ~0ull;
    if (P) {  // the row's j-th key is among the chunks' nt smallest
      for (i64 e = threadIdx.x; e < NC * nt; e += blockDim.x) {
        u64 k = P[e / nt].top[e % nt];
        if ((j == 0 || k > prev) && k < kmin) kmin = k;
      }
    } else {
      for (i64 i = threadIdx.x; i < V; i += blockDim.x) {
        u64 k = desc_key(l[i], (unsigned)i);
        if ((j == 0 || k > prev) && k < kmin) kmin = k;
      }
    }
    kmin = block_min_u64(kmin);
    if (threadIdx.x == 0) {
      i64 id = (i64)(kmin & 0xffffffffu);
      o->top_id[j] = id;
      o->top_logit[j] = (double)l[id];
    }
    prev = kmin;
  }
  if (threadIdx.x == 0) {
    o->token = tok;
    o->lse = lse;
    o->tok_logit = (double)l[tok];
    o->n_top = nt;
  }
}
