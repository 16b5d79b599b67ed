// KDA (Kimi delta attention): the short causal conv with its per-slot
// state, the forget gate, and the delta rule with its per-slot recurrent
// state (the recurrent form, token by token, for every token count).
#include "common.cuh"

#define KDA_MAX_CONV 8

// kda_conv: causal depthwise conv + SiLU over the 3P channels of q|k|v of
// every sequence, continuing from and updating the slot's conv state
// ([3P][K−1] raw inputs, oldest first). A sequence whose slot is
// checkpointed (ckpt[s] ≥ 0: the checkpoint's position) also writes the
// window after every position p into snap[slot][p − ckpt] (the rollback
// record). Grid (ceil(3P/256), S).
struct KDAConvArgs {
  BatchMeta m;
  const int* lens;  // device lengths (seq_lengths) when the graph reads them, else 0
  const float* q; const float* k; const float* v;
  const void* w; i64 w_bf16;  // [3P][K]
  float* oq; float* ok; float* ov;
  float* state; i64 slot_stride;  // this layer's conv states, per slot
  i64 P, ksize;
  const int* ckpt;                // [S] checkpoint position or −1 (0: no records)
  float* snap; i64 snap_stride;   // per slot [depth][3P][K−1]
};
KERNEL(glmf_kda_conv, KDAConvArgs) {
  i64 c = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  i64 s = blockIdx.y;
  i64 C = 3 * a.P;
  if (c >= C || s >= a.m.S) return;
  i64 n = a.lens ? a.lens[s] : a.m.seq_n[s];
  i64 row0 = a.m.seq_row0[s];
  float* st = a.state + (i64)a.m.seq_slot[s] * a.slot_stride + c * (a.ksize - 1);
  const float* src = c < a.P ? a.q : (c < 2 * a.P ? a.k : a.v);
  float* dst = c < a.P ? a.oq : (c < 2 * a.P ? a.ok : a.ov);
  i64 cc = c % a.P;
  float win[KDA_MAX_CONV];
  for (i64 j = 0; j < a.ksize - 1; j++) win[j] = st[j];
  i64 ck = a.ckpt ? a.ckpt[s] : -1;
  i64 pos0 = a.m.seq_pos0[s];
  for (i64 j = 0; j < n; j++) {
    i64 r = row0 + j;
    float u = src[r * a.P + cc];
    float acc = 0;
    for (i64 jj = 0; jj < a.ksize - 1; jj++) acc += ldw(a.w, c * a.ksize + jj, a.w_bf16) * win[jj];
    acc += ldw(a.w, c * a.ksize + a.ksize - 1, a.w_bf16) * u;
    dst[r * a.P + cc] = siluf_d(acc);
    for (i64 jj = 0; jj + 1 < a.ksize - 1; jj++) win[jj] = win[jj + 1];
    if (a.ksize > 1) win[a.ksize - 2] = u;
    if (ck >= 0) {
      float* sn = a.snap + (i64)a.m.seq_slot[s] * a.snap_stride + (pos0 + j - ck) * C * (a.ksize - 1) + c * (a.ksize - 1);
      for (i64 jj = 0; jj < a.ksize - 1; jj++) sn[jj] = win[jj];
    }
  }
  for (i64 j = 0; j < a.ksize - 1; j++) st[j] = win[j];
}

// kda_gate: g = lb·sigmoid(exp(A_log[h])·(z + dt_bias)) with a lower bound,
// else −exp(A_log[h])·softplus(z + dt_bias), in double as the CPU does.
struct KDAGateArgs {
  const float* z; const void* alog; i64 alog_bf16; const void* dt; i64 dt_bf16;
  float* g; i64 T, H, Dh, has_lb; double lb;
};
KERNEL(glmf_kda_gate, KDAGateArgs) {
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  i64 P = a.H * a.Dh;
  if (i >= a.T * P) return;
  i64 c = i % P, h = c / a.Dh;
  double rate = exp((double)ldw(a.alog, h, a.alog_bf16));
  double v = (double)(a.z[i] + ldw(a.dt, c, a.dt_bf16));
  if (a.has_lb) {
    a.g[i] = (float)(a.lb * (1.0 / (1.0 + exp(-rate * v))));
  } else {
    double sp = v;
    if (v <= 20) sp = log1p(exp(v));
    a.g[i] = (float)(-rate * sp);
  }
}

// kda_recurrent: per (sequence, head), token by token:
//   q,k ← L2-normalized (q also scaled by Dh^−½);
//   S = diag(e^g)·S;  δ = β(v − Sᵀk);  S += k⊗δ;  o = Sᵀq.
// A checkpointed sequence (ckpt[s] ≥ 0) also writes S after every
// position p into snap[slot][p − ckpt] (the rollback record).
// One block per (head, sequence); thread j owns column j of S.
struct KDAAttnArgs {
  BatchMeta m;
  const int* lens;
  const float* q; const float* k; const float* v; const float* g; const float* beta;
  float* o;
  float* state; i64 slot_stride;  // this layer's states [slot][H][Dh][Dh]
  i64 H, Dh;
  double qscale;
  const int* ckpt;                // [S] checkpoint position or −1 (0: no records)
  float* snap; i64 snap_stride;   // per slot [depth][H][Dh][Dh]
};
KERNEL(glmf_kda_recurrent, KDAAttnArgs) {
  DYN_SMEM(float, sm);
  i64 h = blockIdx.x, s = blockIdx.y;
  if (s >= a.m.S) return;
  i64 D = a.Dh, P = a.H * D;
  float* qs = sm;
  float* ks = sm + D;
  float* es = sm + 2 * D;
  i64 n = a.lens ? a.lens[s] : a.m.seq_n[s];
  i64 row0 = a.m.seq_row0[s];
  float* S = a.state + (i64)a.m.seq_slot[s] * a.slot_stride + h * D * D;
  i64 j = threadIdx.x;
  i64 ck = a.ckpt ? a.ckpt[s] : -1;
  i64 pos0 = a.m.seq_pos0[s];
  for (i64 t = 0; t < n; t++) {
    i64 r = row0 + t;
    float sq = 0, sk = 0;
    for (i64 c = threadIdx.x; c < D; c += blockDim.x) {
      float qv = a.q[r * P + h * D + c], kv = a.k[r * P + h * D + c];
      qs[c] = qv;
      ks[c] = kv;
      es[c] = (float)exp((double)a.g[r * P + h * D + c]);
      sq += qv * qv;
      sk += kv * kv;
    }
    sq = block_sum(sq);
    sk = block_sum(sk);
    float fq = (float)a.qscale / (float)sqrt((double)(sq + 1e-6f));
    float fk = 1.0f / (float)sqrt((double)(sk + 1e-6f));
    for (i64 c = threadIdx.x; c < D; c += blockDim.x) {
      qs[c] *= fq;
      ks[c] *= fk;
    }
    __syncthreads();
    if (j < D) {
      float pred = 0;
      for (i64 c = 0; c < D; c++) {
        float x = S[c * D + j] * es[c];
        S[c * D + j] = x;
        pred += ks[c] * x;
      }
      float b = a.beta[r * a.H + h];
      pred = b * (a.v[r * P + h * D + j] - pred);
      float out = 0;
      float* sn = ck >= 0 ? a.snap + (i64)a.m.seq_slot[s] * a.snap_stride + (pos0 + t - ck) * a.H * D * D + h * D * D : 0;
      for (i64 c = 0; c < D; c++) {
        float x = S[c * D + j] + ks[c] * pred;
        S[c * D + j] = x;
        if (sn) sn[c * D + j] = x;
        out += qs[c] * x;
      }
      a.o[r * P + h * D + j] = out;
    }
    __syncthreads();
  }
}

// kda_recurrent_reg: the same recurrence with the state held in registers,
// for head_dim D in {8, 16, 32, 64, 128} (a compile-time D keeps every
// state address a constant offset). A state column j only meets other
// columns through q, k and g, so a block of KDA_COLS threads owns KDA_COLS
// columns of one (head, sequence): grid (H, S, ceil(D/KDA_COLS)). The state
// is read once before the sequence's tokens and written once after them
// (and to the rollback record per token when checkpointed), instead of
// twice per token. Per column the sums run over c in ascending order as in
// glmf_kda_recurrent.
#define KDA_COLS 32
template <int D>
DEVFN void kda_recurrent_reg(const KDAAttnArgs& a) {
  __shared__ float qs[D], ks[D], es[D];
  i64 h = blockIdx.x, s = blockIdx.y;
  if (s >= a.m.S) return;
  i64 P = a.H * D;
  i64 j = (i64)blockIdx.z * KDA_COLS + threadIdx.x;
  bool col = j < D;
  i64 n = a.lens ? a.lens[s] : a.m.seq_n[s];
  i64 row0 = a.m.seq_row0[s];
  float* S = a.state + (i64)a.m.seq_slot[s] * a.slot_stride + h * D * D + (col ? j : 0);
  i64 ck = a.ckpt ? a.ckpt[s] : -1;
  i64 pos0 = a.m.seq_pos0[s];
  float st[D];
  #pragma unroll
  for (int c = 0; c < D; c++) st[c] = col ? S[c * D] : 0.f;
  for (i64 t = 0; t < n; t++) {
    i64 r = row0 + t;
    const float* qr = a.q + r * P + h * D;
    const float* kr = a.k + r * P + h * D;
    const float* gr = a.g + r * P + h * D;
    // the token's loads, all in flight at once: q, k, g (NC a thread),
    // then beta and v of the thread's column
    constexpr int NC = (D + KDA_COLS - 1) / KDA_COLS;
    float qv[NC], kv[NC], gv[NC];
    #pragma unroll
    for (int i = 0; i < NC; i++) {
      int c = threadIdx.x + i * KDA_COLS;
      if (c < D) qv[i] = qr[c], kv[i] = kr[c], gv[i] = gr[c];
    }
    float b = 0, vj = 0;
    if (col) b = a.beta[r * a.H + h], vj = a.v[r * P + h * D + j];
    float sq = 0, sk = 0;
    #pragma unroll
    for (int i = 0; i < NC; i++) {
      int c = threadIdx.x + i * KDA_COLS;
      if (c < D) {
        qs[c] = qv[i];
        ks[c] = kv[i];
        es[c] = (float)exp((double)gv[i]);
        sq += qv[i] * qv[i];
        sk += kv[i] * kv[i];
      }
    }
    sq = warp_sum(sq);
    sk = warp_sum(sk);
    float fq = (float)a.qscale / (float)sqrt((double)(sq + 1e-6f));
    float fk = 1.0f / (float)sqrt((double)(sk + 1e-6f));
    for (int c = threadIdx.x; c < D; c += KDA_COLS) {
      qs[c] *= fq;
      ks[c] *= fk;
    }
    __syncthreads();
    if (col) {
      float pred = 0;
      #pragma unroll
      for (int c = 0; c < D; c++) {
        float x = st[c] * es[c];
        st[c] = x;
        pred += ks[c] * x;
      }
      pred = b * (vj - pred);
      float out = 0;
      float* sn = ck >= 0 ? a.snap + (i64)a.m.seq_slot[s] * a.snap_stride + (pos0 + t - ck) * a.H * D * D + h * D * D + j : 0;
      #pragma unroll
      for (int c = 0; c < D; c++) {
        float x = st[c] + ks[c] * pred;
        st[c] = x;
        out += qs[c] * x;
      }
      if (sn) {
        #pragma unroll
        for (int c = 0; c < D; c++) sn[c * D] = st[c];
      }
      a.o[r * P + h * D + j] = out;
    }
    __syncthreads();
  }
  if (col) {
    #pragma unroll
    for (int c = 0; c < D; c++) S[c * D] = st[c];
  }
}
KERNEL(glmf_kda_recurrent_reg8, KDAAttnArgs) { kda_recurrent_reg<8>(a); }
KERNEL(glmf_kda_recurrent_reg16, KDAAttnArgs) { kda_recurrent_reg<16>(a); }
KERNEL(glmf_kda_recurrent_reg32, KDAAttnArgs) { kda_recurrent_reg<32>(a); }
KERNEL(glmf_kda_recurrent_reg64, KDAAttnArgs) { kda_recurrent_reg<64>(a); }
KERNEL(glmf_kda_recurrent_reg128, KDAAttnArgs) { kda_recurrent_reg<128>(a); }
