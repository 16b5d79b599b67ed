#!/usr/bin/env python3
"""MTP (NextN) reference fixture for glmflash: the tiny-a GLM-5.3-Flash model of hf_fixture.py
plus an MTP draft layer, with the MTP layer's logits computed in PyTorch (float32 throughout)
following architecture.md §7. transformers has no MTP module, so the MTP layer is assembled
from transformers' own DSA attention (Glm5NextTextAttention, with its indexer) and MoE
(Glm5NextTextMoE) modules, and cross-checked against an independent plain-torch implementation
of §7 (when both run, they must agree within 1e-4, else the script stops).

HOW TO RUN (on the GPU machine: Python 3.12, PyTorch 2.11, transformers 5.17 with glm5_next,
safetensors), from the repository root:

    python3 tools/mtp_reference.py --out /tmp/glm5next-tiny-mtp              # GPU if present
    python3 tools/mtp_reference.py --out /tmp/glm5next-tiny-mtp --device cpu # or on the CPU

It takes well under a minute (it may redraw prompts until every top-k boundary is well
separated; it prints each attempt). It prints what it finds (transformers' classes, the MTP
module's parameters and shapes, the written tensors), then a summary. Exit status 0 means
the fixture is complete and self-consistent. Then, in the repository:

    rm -rf testdata/glm5next-tiny-mtp && cp -r /tmp/glm5next-tiny-mtp testdata/glm5next-tiny-mtp
    go test ./tests -run 'TestMTPTransformersParity' -v
    # and on the GPU: make test-gpu (TestCUDAMTPTransformersParity)

Outputs in OUT/ (the layout of testdata/glm5next-tiny-*):
  checkpoint/              config.json (text_config.num_nextn_predict_layers = 1) and
                           model.safetensors: the trunk as transformers saves it, plus the MTP
                           layer's tensors under their released names
                           model.language_model.layers.{L}.* (L = num_hidden_layers = 8):
                           enorm, hnorm, eh_proj, input_layernorm, post_attention_layernorm,
                           self_attn.* (MLA + its own indexer), mlp.* (router, per-expert
                           gate/up/down_proj, shared_experts), shared_head.norm. BF16, except
                           e_score_correction_bias (F32); every value bf16-representable.
  reference.safetensors    per case mtp.{i}: input_ids [n] (i64), trunk_logits [n,V],
                           trunk_hidden [n,D] (transformers' last_hidden_state: after the stream
                           mean and the final norm, what feeds lm_head), mtp_input_ids [n]
                           (input_ids[1:] + the trunk's greedy next token), split [1], mtp_logits
                           [n,V], mtp_hidden [n,D] (after shared_head.norm), draft_tokens [K],
                           draft_logits [K,V], draft_hidden [K,D] (float32).
  reference.json           format "glmflash-mtp-reference/1", versions, the implementation used,
                           the cross-check, the smallest top-k gap of every case, notes.

The cases (prefill-style call over a prompt, then chained draft steps, §7):
  * the MTP layer runs over the whole prompt from an empty MTP cache: position i reads token
    input_ids[i+1] (the last position: the trunk's greedy next token) and the trunk's final
    hidden row i; the same prefill is also run as two calls, [0, split) and [split, n), on the
    cache, and must give the same rows (checked here; the Go test runs it so);
  * draft step k (MTP position n+k) reads the argmax of the previous logits row and the previous
    MTP hidden row (post-norm recycle), continuing the MTP cache; draft_tokens[k] is that token.
  No embedding is zeroed at position 0 (SGLang's convention; vLLM zeroes it: draft-only effect).
"""
import argparse
import copy
import json
import math
import os
import shutil
import sys
import time
import traceback

# Deterministic cuBLAS needs a workspace setting before torch initialises CUDA.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

FORMAT = "glmflash-mtp-reference/1"
HERE = os.path.dirname(os.path.abspath(__file__))
# prompt length and split point of the two-call MTP prefill, per case
CASES = [(9, 4), (41, 23), (70, 33)]
DRAFT_STEPS = 5
MIN_GAP = 2e-4  # every top-k boundary (experts, indexer pools, greedy picks) at least this far apart
AGREE_TOL = 1e-4  # transformers-module MTP vs plain-torch MTP


def log(*a):
    print(*a, flush=True)


def bf16_round(t):
    return t.to(torch.bfloat16).to(torch.float32)


# ---------------------------------------------------------------------------------------------
# The MTP layer's weights (random, O(1) activations as hf_fixture.randomize() draws them).


def mtp_specs(tc):
    """(relative name, shape, kind) of every tensor of the MTP layer, in checkpoint naming
    (relative to model.language_model.layers.{L}.), for text config tc."""
    D, E, I = tc.hidden_size, tc.n_routed_experts, tc.moe_intermediate_size
    H, dq, dv = tc.num_attention_heads, tc.qk_nope_head_dim + tc.qk_rope_head_dim, tc.v_head_dim
    R, QR, Hi, Di, kp = tc.kv_lora_rank, tc.q_lora_rank, tc.index_n_heads, tc.index_head_dim, tc.index_kpool
    S = I * tc.n_shared_experts
    s = [
        ("enorm.weight", [D]), ("hnorm.weight", [D]), ("eh_proj.weight", [D, 2 * D]),
        ("input_layernorm.weight", [D]), ("post_attention_layernorm.weight", [D]),
        ("self_attn.q_a_proj.weight", [QR, D]), ("self_attn.q_a_layernorm.weight", [QR]),
        ("self_attn.q_b_proj.weight", [H * dq, QR]),
        ("self_attn.kv_a_proj_with_mqa.weight", [R + tc.qk_rope_head_dim, D]),
        ("self_attn.kv_a_layernorm.weight", [R]), ("self_attn.kv_b_proj.weight", [H * (tc.qk_nope_head_dim + dv), R]),
        ("self_attn.o_proj.weight", [D, H * dv]),
        ("self_attn.indexer.wq_b.weight", [Hi * Di, QR]), ("self_attn.indexer.wk.weight", [Di, D]),
        ("self_attn.indexer.k_norm.weight", [Di]), ("self_attn.indexer.k_norm.bias", [Di]),
        ("self_attn.indexer.weights_proj.weight", [Hi, D]),
        ("self_attn.indexer.index_kpool_compress_gate", [Di, D]),
        ("self_attn.indexer.index_kpool_compress_ape", [kp, Di]),
        ("mlp.gate.weight", [E, D]), ("mlp.gate.e_score_correction_bias", [E]),
    ]
    for e in range(E):
        s += [(f"mlp.experts.{e}.gate_proj.weight", [I, D]), (f"mlp.experts.{e}.up_proj.weight", [I, D]),
              (f"mlp.experts.{e}.down_proj.weight", [D, I])]
    if S > 0:
        s += [("mlp.shared_experts.gate_proj.weight", [S, D]), ("mlp.shared_experts.up_proj.weight", [S, D]),
              ("mlp.shared_experts.down_proj.weight", [D, S])]
    s += [("shared_head.norm.weight", [D])]
    return s


def random_mtp_weights(tc, seed):
    """The MTP layer's weights as float32 tensors (bf16-representable), drawn like randomize()."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in mtp_specs(tc):
        if name.endswith("e_score_correction_bias"):
            t = torch.randn(shape, generator=g) * 0.05
        elif "index_kpool_compress_ape" in name:
            t = torch.randn(shape, generator=g) * 0.5
        elif "norm" in name and len(shape) == 1:
            t = torch.randn(shape, generator=g) * 0.1 + (0.0 if name.endswith("bias") else 1.0)
        elif len(shape) == 2:
            t = torch.randn(shape, generator=g) / math.sqrt(shape[1])
        else:
            t = torch.randn(shape, generator=g) * 0.1
        out[name] = bf16_round(t)
    return out


# ---------------------------------------------------------------------------------------------
# Top-k margins.


class Gaps:
    """The smallest gap seen at a top-k boundary (k-th vs (k+1)-th value, valid candidates)."""

    def __init__(self):
        self.worst = float("inf")

    def note(self, values, k):
        v = values.detach().float().reshape(-1, values.shape[-1])
        v = v.masked_fill(v < -1e30, float("-inf"))
        if v.shape[-1] <= k:
            return
        srt = v.sort(dim=-1, descending=True)[0]
        valid = torch.isfinite(v).sum(-1)
        gap = srt[:, k - 1] - srt[:, k]
        gap = torch.where(valid > k, gap, torch.full_like(gap, float("inf")))
        g = float(gap.min())
        assert g == g, "gap is NaN"
        self.worst = min(self.worst, g)


# ---------------------------------------------------------------------------------------------
# Plain-torch MTP layer (architecture §7, §3.6 MoE, §3.8 MLA, §6 k-pool indexer), float32.


class TorchMTP:
    """The MTP layer written from the architecture document, on weights in checkpoint naming."""

    def __init__(self, tc, W, embed, lm_head, device, gaps):
        self.tc, self.dev, self.gaps = tc, device, gaps
        self.W = {k: v.to(device=device, dtype=torch.float32) for k, v in W.items()}
        self.embed, self.lm_head = embed, lm_head
        self.eps = tc.rms_norm_eps

    def new_cache(self):
        tc = self.tc
        z = lambda n: torch.zeros(0, n, device=self.dev)  # noqa: E731
        return {"ckv": z(tc.kv_lora_rank), "ik": z(tc.index_head_dim), "ig": z(tc.index_head_dim)}

    def rms(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.W[w]

    def lin(self, x, w):
        return x @ self.W[w].T

    @torch.no_grad()
    def forward(self, ids, h, cache):
        """ids [S] (long), h [S, D] → logits [S, V], hm [S, D]; appends to cache."""
        e = self.embed[ids]
        z = torch.cat([self.rms(e, "enorm.weight"), self.rms(h, "hnorm.weight")], -1) @ self.W["eh_proj.weight"].T
        z = z + self.attention(self.rms(z, "input_layernorm.weight"), cache)
        z = z + self.moe(self.rms(z, "post_attention_layernorm.weight"))
        hm = self.rms(z, "shared_head.norm.weight")
        return hm @ self.lm_head.T, hm

    def attention(self, x, cache):
        tc = self.tc
        S = x.shape[0]
        H, dq, dv = tc.num_attention_heads, tc.qk_nope_head_dim, tc.v_head_dim
        Hi, Di, kp = tc.index_n_heads, tc.index_head_dim, tc.index_kpool
        P0 = cache["ckv"].shape[0]
        qres = self.rms(self.lin(x, "self_attn.q_a_proj.weight"), "self_attn.q_a_layernorm.weight")
        Q = self.lin(qres, "self_attn.q_b_proj.weight").view(S, H, dq)
        ckv = self.rms(self.lin(x, "self_attn.kv_a_proj_with_mqa.weight"), "self_attn.kv_a_layernorm.weight")
        ik = F.layer_norm(self.lin(x, "self_attn.indexer.wk.weight"), (Di,), self.W["self_attn.indexer.k_norm.weight"],
                          self.W["self_attn.indexer.k_norm.bias"], 1e-6)
        ig = self.lin(x, "self_attn.indexer.index_kpool_compress_gate")
        cache["ckv"] = torch.cat([cache["ckv"], ckv])
        cache["ik"] = torch.cat([cache["ik"], ik])
        cache["ig"] = torch.cat([cache["ig"], ig])
        N = P0 + S
        qi = self.lin(qres, "self_attn.indexer.wq_b.weight").view(S, Hi, Di)
        hw = self.lin(x, "self_attn.indexer.weights_proj.weight") * Hi ** -0.5
        npools = N // kp
        if npools > 0:
            K = cache["ik"][: npools * kp].view(npools, kp, Di)
            G = cache["ig"][: npools * kp].view(npools, kp, Di) + self.W["self_attn.indexer.index_kpool_compress_ape"][None]
            keys = (torch.softmax(G, dim=1) * K).sum(1)  # softmax over the pool's slots, per channel
        kv = (cache["ckv"] @ self.W["self_attn.kv_b_proj.weight"].T).view(N, H, dq + dv)
        Kf, Vf = kv[..., :dq], kv[..., dq:]
        out = torch.zeros(S, H * dv, device=self.dev)
        keep = tc.index_topk // kp
        for s in range(S):
            t = P0 + s
            vis = (t + 1) // kp
            pos = []
            if vis > 0:
                sc = F.relu(torch.einsum("hd,pd->hp", qi[s], keys[:vis]) * Di ** -0.5)
                score = hw[s] @ sc
                k = min(keep, vis)
                self.gaps.note(score, k)
                sel = torch.topk(score, k).indices
                pos.append((sel[:, None] * kp + torch.arange(kp, device=self.dev)[None]).reshape(-1))
            pos.append(torch.arange(vis * kp, t + 1, device=self.dev))
            pos = torch.cat(pos)
            lg = torch.einsum("hd,jhd->hj", Q[s], Kf[pos]) * dq ** -0.5
            p = torch.softmax(lg, dim=-1)
            out[s] = torch.einsum("hj,jhd->hd", p, Vf[pos]).reshape(-1)
        return self.lin(out, "self_attn.o_proj.weight")

    def swiglu(self, x, g, u, d):
        lim = self.tc.swiglu_limit
        a, b = self.lin(x, g), self.lin(x, u)
        if lim is not None:
            a = a.clamp(max=lim)
            b = b.clamp(min=-lim, max=lim)
        return self.lin(F.silu(a) * b, d)

    def moe(self, y):
        tc = self.tc
        E, K = tc.n_routed_experts, tc.num_experts_per_tok
        s = torch.sigmoid(self.lin(y, "mlp.gate.weight"))
        choice = s + self.W["mlp.gate.e_score_correction_bias"]
        if tc.n_group > 1:
            per = E // tc.n_group
            gs = choice.view(-1, tc.n_group, per).topk(2, dim=-1)[0].sum(-1)
            self.gaps.note(gs, tc.topk_group)
            keepg = torch.zeros_like(gs).scatter_(1, gs.topk(tc.topk_group, dim=-1)[1], 1).bool()
            choice = choice.masked_fill(~keepg.repeat_interleave(per, dim=1), float("-inf"))
        self.gaps.note(choice, K)
        sel = choice.topk(K, dim=-1).indices
        w = s.gather(1, sel)
        if tc.norm_topk_prob:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        w = w * tc.routed_scaling_factor
        out = torch.zeros_like(y)
        for t in range(y.shape[0]):
            for k in range(K):
                e = int(sel[t, k])
                p = f"mlp.experts.{e}."
                out[t] += w[t, k] * self.swiglu(y[t:t + 1], p + "gate_proj.weight", p + "up_proj.weight", p + "down_proj.weight")[0]
        if tc.n_shared_experts > 0:
            out = out + self.swiglu(y, "mlp.shared_experts.gate_proj.weight", "mlp.shared_experts.up_proj.weight",
                                    "mlp.shared_experts.down_proj.weight")
        return out


# ---------------------------------------------------------------------------------------------
# The MTP layer from transformers' own modules (a DSA + MoE decoder layer without mHC).


def build_hf_mtp(M, tc, W, device):
    """An nn.Module holding enorm, hnorm, eh_proj, the pre-norm layer (transformers'
    Glm5NextTextAttention with its indexer, Glm5NextTextMoE) and shared_head.norm, loaded with
    W (checkpoint naming). The attention and MoE get a copy of the text config describing one
    DSA + MoE layer with a full indexer (layer_idx 0 of that config)."""
    import torch.nn as nn

    mcfg = copy.deepcopy(tc)
    mcfg.num_hidden_layers = 1
    mcfg.layer_types = ["deepseek_sparse_attention"]
    mcfg.mlp_layer_types = ["sparse"]
    mcfg.indexer_types = ["full"]
    mcfg._attn_implementation = "eager"
    D, eps = tc.hidden_size, tc.rms_norm_eps

    class HFMTP(nn.Module):
        def __init__(self):
            super().__init__()
            self.enorm = M.Glm5NextTextRMSNorm(D, eps=eps)
            self.hnorm = M.Glm5NextTextRMSNorm(D, eps=eps)
            self.eh_proj = nn.Linear(2 * D, D, bias=False)
            self.input_layernorm = M.Glm5NextTextRMSNorm(D, eps=eps)
            self.post_attention_layernorm = M.Glm5NextTextRMSNorm(D, eps=eps)
            self.self_attn = M.Glm5NextTextAttention(mcfg, 0)
            self.mlp = M.Glm5NextTextMoE(mcfg)
            self.shared_head = nn.ModuleDict({"norm": M.Glm5NextTextRMSNorm(D, eps=eps)})

    mod = HFMTP()
    params = dict(mod.named_parameters())
    params.update(dict(mod.named_buffers()))
    log("transformers MTP module: parameters and buffers")
    for n, p in params.items():
        log(f"  {n:55s} {tuple(p.shape)}")
    E, I = tc.n_routed_experts, tc.moe_intermediate_size
    target = {}
    for name, t in W.items():
        if name.startswith("mlp.experts."):
            continue
        target[name] = t
    target["mlp.experts.gate_up_proj"] = torch.stack(
        [torch.cat([W[f"mlp.experts.{e}.gate_proj.weight"], W[f"mlp.experts.{e}.up_proj.weight"]], 0) for e in range(E)])
    target["mlp.experts.down_proj"] = torch.stack([W[f"mlp.experts.{e}.down_proj.weight"] for e in range(E)])
    pnames = {n for n, _ in mod.named_parameters()}
    missing = sorted(n for n in set(params) - set(target) if n in pnames)
    unknown = sorted(set(target) - set(params))
    if missing or unknown:
        raise RuntimeError(f"transformers MTP module does not match the checkpoint names: module-only {missing}, checkpoint-only {unknown}")
    for n in sorted(set(params) - set(target)):
        log(f"  note: buffer {n} is not a checkpoint tensor; left as the module made it")
    with torch.no_grad():
        for n, t in target.items():
            p = params[n]
            if tuple(p.shape) != tuple(t.shape):
                raise RuntimeError(f"{n}: module shape {tuple(p.shape)}, checkpoint {tuple(t.shape)}")
            p.copy_(t)
    log(f"  loaded {len(target)} tensors (experts: gate_up_proj[e] = cat(gate_proj, up_proj) of expert e, I = {I})")
    return mod.float().to(device).eval(), mcfg


class HFRunner:
    """Runs the transformers-module MTP layer with its own DynamicCache."""

    def __init__(self, M, hf_mod, mcfg, embed, lm_head, device):
        from transformers.cache_utils import DynamicCache

        self.M, self.mod, self.mcfg = M, hf_mod, mcfg
        self.embed, self.lm_head, self.dev = embed, lm_head, device
        self.DynamicCache = DynamicCache

    def new_cache(self):
        return self.DynamicCache(config=self.mcfg)

    @torch.no_grad()
    def forward(self, ids, h, cache):
        m = self.mod
        S = ids.shape[0]
        e = self.embed[ids][None]
        z = m.eh_proj(torch.cat([m.enorm(e), m.hnorm(h[None])], -1))  # embedding first
        mask = torch.ones(1, S, dtype=torch.bool, device=self.dev)  # the indexer's padding mask: every token is real
        p0 = cache.get_seq_length()
        pos = torch.arange(p0, p0 + S, device=self.dev)[None]  # unused by NoPE MLA; passed as the decoder layer does
        a = m.self_attn(hidden_states=m.input_layernorm(z), attention_mask=mask, past_key_values=cache, prev_topk_indices=None,
                        position_ids=pos, position_embeddings=None, use_cache=True)[0]
        z = z + a
        z = z + m.mlp(m.post_attention_layernorm(z))
        hm = m.shared_head["norm"](z)[0]
        return hm @ self.lm_head.T, hm


# ---------------------------------------------------------------------------------------------


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="See the header of this file for the full instructions.")
    ap.add_argument("--out", required=True, help="output directory (checkpoint/, reference.safetensors, reference.json)")
    ap.add_argument("--device", default="auto", help="auto (cuda when available), cpu or cuda[:N]")
    ap.add_argument("--variant", default="a", help="hf_fixture.py variant of the trunk (default a: tiny-a)")
    ap.add_argument("--impl", default="auto", choices=["auto", "transformers", "torch"],
                    help="MTP implementation: auto = transformers modules, cross-checked with plain torch (plain torch alone "
                         "if the modules cannot be built); transformers or torch forces one (no cross-check)")
    ap.add_argument("--tries", type=int, default=300, help="prompt draws per case before giving up on well-separated top-k")
    ap.add_argument("--force", action="store_true", help="replace a non-empty --out")
    return ap.parse_args()


def main():
    args = parse_args()
    sys.path.insert(0, HERE)
    import transformers
    import hf_fixture as HF  # the trunk: make_config, randomize, MarginWatch (sets deterministic algorithms)
    from safetensors.torch import load_file, save_file

    M = HF.M
    log(f"python {sys.version.split()[0]}, torch {torch.__version__}, transformers {transformers.__version__}")
    log(f"transformers glm5_next module: {M.__file__}")
    for cls in ["Glm5NextForConditionalGeneration", "Glm5NextTextAttention", "Glm5NextTextIndexer", "Glm5NextTextMoE",
                "Glm5NextTextTopkRouter", "Glm5NextTextRMSNorm"]:
        log(f"  {cls}: {'found' if hasattr(M, cls) else 'MISSING'}")
    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        # hf_fixture.py asks for deterministic algorithms; an op without a deterministic CUDA kernel
        # should warn rather than stop the run (float32 nondeterminism is far below the 1e-4 gate)
        torch.use_deterministic_algorithms(True, warn_only=True)
        log(f"device {device}: {torch.cuda.get_device_name(device)} (TF32 off, float32 highest precision)")
    else:
        log(f"device {device}")
    torch.set_float32_matmul_precision("highest")

    out = os.path.abspath(args.out)
    if os.path.isdir(out) and os.listdir(out) and not args.force:
        sys.exit(f"--out {out} is not empty (pass --force to replace its contents)")
    ck = os.path.join(out, "checkpoint")
    if os.path.isdir(ck):
        shutil.rmtree(ck)  # --force: no stale shard or index may survive
    os.makedirs(ck, exist_ok=True)

    # 1. the trunk, exactly as hf_fixture.py builds variant a (same seed, same draws)
    v = HF.VARIANTS[args.variant]
    cfg = HF.make_config(v)
    torch.manual_seed(v["seed"])
    model = M.Glm5NextForConditionalGeneration(cfg).eval()
    HF.randomize(model, torch.Generator().manual_seed(v["seed"]))
    with torch.no_grad():
        for n, p in list(model.named_parameters()) + list(model.named_buffers()):
            if p.is_floating_point():
                p.copy_(p.to(torch.bfloat16).float())
    model = model.float()
    tc = cfg.text_config
    L = tc.num_hidden_layers
    prefix = f"model.language_model.layers.{L}."
    log(f"trunk: variant {args.variant}, {L} layers, hidden {tc.hidden_size}, vocab {tc.vocab_size}; MTP layer index {L}")

    # 2. the MTP layer's weights (their own generator: the trunk is tiny-a's)
    W = random_mtp_weights(tc, v["seed"] + 4242)
    log(f"MTP layer: {len(W)} tensors")

    # 3. the checkpoint: the trunk as transformers saves it, plus the MTP tensors
    keep32 = ["e_score_correction_bias", "conv1d", "dt_bias", "A_log"]
    model_save = copy.deepcopy(model)
    with torch.no_grad():
        for n, p in list(model_save.named_parameters()) + list(model_save.named_buffers()):
            if p.is_floating_point():
                p.data = p.data.float() if any(k in n for k in keep32) else p.data.to(torch.bfloat16)
    model_save.save_pretrained(ck, safe_serialization=True)
    del model_save
    files = sorted(f for f in os.listdir(ck) if f.endswith(".safetensors"))
    log(f"save_pretrained wrote {sorted(os.listdir(ck))}")
    mtp_tensors = {prefix + n: (t.float() if any(k in n for k in keep32) else t.to(torch.bfloat16)).contiguous() for n, t in W.items()}
    index = os.path.join(ck, "model.safetensors.index.json")
    if os.path.exists(index):  # sharded: the MTP layer gets a shard of its own
        with open(index) as f:
            idx = json.load(f)
        save_file(mtp_tensors, os.path.join(ck, "model-mtp.safetensors"), metadata={"format": "pt"})
        for n in mtp_tensors:
            idx["weight_map"][n] = "model-mtp.safetensors"
        with open(index, "w") as f:
            json.dump(idx, f, indent=2)
        log("sharded checkpoint: MTP tensors in model-mtp.safetensors, index updated")
    else:
        if files != ["model.safetensors"]:
            sys.exit(f"unexpected checkpoint files {files}")
        path = os.path.join(ck, "model.safetensors")
        sd = load_file(path)
        clash = [n for n in sd if n.startswith(prefix)]
        if clash:
            sys.exit(f"the trunk checkpoint already has layer-{L} tensors: {clash[:5]}")
        sd.update(mtp_tensors)
        save_file(sd, path, metadata={"format": "pt"})
        log(f"model.safetensors: {len(sd) - len(mtp_tensors)} trunk tensors + {len(mtp_tensors)} MTP tensors")
    cpath = os.path.join(ck, "config.json")
    with open(cpath) as f:
        cj = json.load(f)
    (cj["text_config"] if "text_config" in cj else cj)["num_nextn_predict_layers"] = 1
    with open(cpath, "w") as f:
        json.dump(cj, f, indent=2)
    log("config.json: num_nextn_predict_layers = 1")
    # what was written is what the reference computes with
    written = {}
    for fname in sorted(os.listdir(ck)):
        if fname.endswith(".safetensors"):
            written.update(load_file(os.path.join(ck, fname)))
    ref_sd = model.state_dict()
    for n, t in written.items():
        if t.is_floating_point() and t.dtype == torch.float32:
            assert not (t.view(torch.int32) & 0xFFFF).any(), f"{n} is not bf16-representable"
        if n in ref_sd:
            assert torch.equal(t.float(), ref_sd[n].float()), n
        elif n.startswith(prefix):
            assert torch.equal(t.float(), W[n[len(prefix):]]), n
            log(f"  {n:75s} {str(t.dtype):15s} {tuple(t.shape)}")
    log(f"verified: the {len(written)} written tensors equal the weights the reference uses")
    tiny_a = os.path.join(HERE, "..", "testdata", "glm5next-tiny-a", "checkpoint", "model.safetensors")
    if args.variant == "a" and os.path.exists(tiny_a):
        ta = load_file(tiny_a)
        same = all(n in written and torch.equal(ta[n], written[n]) for n in ta)
        log(f"trunk identical to testdata/glm5next-tiny-a: {same}" + ("" if same else " (informational: this fixture carries its own checkpoint)"))

    # 4. the MTP implementations
    model = model.to(device)
    text = model.model.language_model
    embed = text.embed_tokens.weight.detach().float()
    lm_head = model.lm_head.weight.detach().float()
    gaps = Gaps()
    impls = {}
    if args.impl in ("auto", "torch"):
        impls["torch"] = TorchMTP(tc, W, embed, lm_head, device, gaps)
    hf_mod = None
    if args.impl in ("auto", "transformers"):
        try:
            hf_mod, mcfg = build_hf_mtp(M, tc, W, device)
            runner = HFRunner(M, hf_mod, mcfg, embed, lm_head, device)
            # smoke test: a 3-token call then a 1-token call on its cache
            c = runner.new_cache()
            log(f"  transformers MTP cache: {type(c).__name__} with layers {[type(x).__name__ for x in getattr(c, 'layers', [])]}")
            hid = torch.randn(3, tc.hidden_size, generator=torch.Generator().manual_seed(0)).to(device)
            l3, h3 = runner.forward(torch.tensor([1, 2, 3], device=device), hid, c)
            l1, h1 = runner.forward(torch.tensor([4], device=device), h3[-1:], c)
            log(f"  transformers MTP smoke test: logits {tuple(l3.shape)} then {tuple(l1.shape)}, hidden {tuple(h1.shape)}, "
                f"cache length {c.get_seq_length()}")
            if tuple(l3.shape) != (3, tc.vocab_size) or tuple(h1.shape) != (1, tc.hidden_size) or c.get_seq_length() != 4:
                raise RuntimeError("unexpected output shapes or cache length")
            impls["transformers"] = runner
        except Exception:
            traceback.print_exc()
            hf_mod = None
            if args.impl == "transformers":
                sys.exit("could not run the MTP layer from transformers' modules (see above)")
            log("WARNING: could not run the MTP layer from transformers' modules (see above): using the plain-torch "
                "implementation only; please report this output")
    primary = "transformers" if "transformers" in impls else "torch"
    log(f"MTP implementations: {sorted(impls)}; the fixture records {primary}'s")

    def run_mtp(impl, ids, hid, split, K):
        """Prefill (one call and two calls) then K chained draft steps."""
        c1 = impl.new_cache()
        logits, hm = impl.forward(ids, hid, c1)
        c2 = impl.new_cache()
        la, ha = impl.forward(ids[:split], hid[:split], c2)
        lb, hb = impl.forward(ids[split:], hid[split:], c2)
        split_diff = max(float((torch.cat([la, lb]) - logits).abs().max()), float((torch.cat([ha, hb]) - hm).abs().max()))
        toks, dl, dh = [], [], []
        pl, ph = logits[-1], hm[-1:]
        for _ in range(K):
            tok = int(pl.argmax())
            toks.append(tok)
            l, h = impl.forward(torch.tensor([tok], device=device), ph, c1)
            dl.append(l[0])
            dh.append(h[0])
            pl, ph = l[0], h
        return logits, hm, split_diff, toks, torch.stack(dl), torch.stack(dh)

    # 5. the cases
    gen = torch.Generator().manual_seed(v["seed"] + 7)
    V = tc.vocab_size
    tensors, cases, agree_worst, split_worst = {}, [], 0.0, 0.0
    container = torch.nn.ModuleList([model] + ([hf_mod] if hf_mod is not None else []))
    for ci, (n, split) in enumerate(CASES):
        for attempt in range(1, args.tries + 1):
            ids = torch.randint(1, V, (1, n), generator=gen).to(device)
            gaps.worst = float("inf")
            with HF.MarginWatch(container) as w, torch.no_grad():
                tl = model(input_ids=ids, use_cache=False).logits[0].float()
                th = text(input_ids=ids, use_cache=False).last_hidden_state[0].float()
                head_diff = float((th @ lm_head.T - tl).abs().max())
                if head_diff > 1e-4:
                    sys.exit(f"transformers' last_hidden_state is not what lm_head reads: max|lm_head·h − logits| = {head_diff:.2e}")
                nxt = int(tl[-1].argmax())
                mids = torch.cat([ids[0, 1:], torch.tensor([nxt], device=device)])
                res = {name: run_mtp(impl, mids, th, split, DRAFT_STEPS) for name, impl in impls.items()}
            r = res[primary]
            gaps.note(tl[-1:], 1)
            gaps.note(r[0], 1)
            gaps.note(r[4], 1)
            worst = min(w.worst, gaps.worst)
            agree = 0.0
            if len(res) == 2:
                a, b = res["transformers"], res["torch"]
                if a[3] != b[3]:
                    agree = float("inf")
                else:
                    agree = max(float((x - y).abs().max()) for x, y in [(a[0], b[0]), (a[1], b[1]), (a[4], b[4]), (a[5], b[5])])
            log(f"case {ci} (n={n}) attempt {attempt}: smallest top-k gap {worst:.2e}, two-call prefill max|Δ| {r[2]:.1e}"
                + (f", transformers vs torch max|Δ| {agree:.1e}" if len(res) == 2 else ""))
            if worst <= MIN_GAP:
                continue  # a near-tie: the implementations may legitimately break it differently; draw again
            if len(res) == 2 and not agree <= AGREE_TOL:
                sys.exit(f"the transformers-module MTP and the plain-torch MTP disagree (max|Δ| {agree:.2e} > {AGREE_TOL}, "
                         f"draft tokens {a[3]} vs {b[3]}): one of them is wrong. Rerun with --impl transformers or --impl torch "
                         "to record one of them, and report this output")
            if r[2] > 1e-4:
                sys.exit(f"the MTP prefill as two calls differs from one call by {r[2]:.2e}: the cache path is broken")
            break
        else:
            sys.exit(f"case {ci}: no prompt with every top-k boundary above {MIN_GAP} in {args.tries} tries")
        agree_worst, split_worst = max(agree_worst, agree), max(split_worst, r[2])
        logits, hm, _, toks, dl, dh = r
        key = f"mtp.{ci}"
        f32 = lambda t: t.detach().float().cpu().contiguous()  # noqa: E731
        i64 = lambda x: torch.as_tensor(x, dtype=torch.int64).cpu().contiguous()  # noqa: E731
        tensors.update({
            key + ".input_ids": i64(ids[0]), key + ".trunk_logits": f32(tl), key + ".trunk_hidden": f32(th),
            key + ".mtp_input_ids": i64(mids), key + ".split": i64([split]),
            key + ".mtp_logits": f32(logits), key + ".mtp_hidden": f32(hm),
            key + ".draft_tokens": i64(toks), key + ".draft_logits": f32(dl), key + ".draft_hidden": f32(dh),
        })
        cases.append(dict(name=key, prompt_length=n, split=split, draft_steps=DRAFT_STEPS, next_token=nxt, draft_tokens=toks,
                          min_topk_gap=worst if math.isfinite(worst) else None, attempts=attempt))

    # 6. save
    save_file(tensors, os.path.join(out, "reference.safetensors"))
    meta = dict(
        format=FORMAT,
        produced_by=f"tools/mtp_reference.py; transformers {transformers.__version__}, torch {torch.__version__}, device {device}",
        variant=args.variant,
        mtp_layer=L,
        mtp_implementation=primary,
        mtp_implementation_note={
            "transformers": "Glm5NextTextAttention (MLA + Glm5NextTextIndexer, own DynamicCache) and Glm5NextTextMoE of "
                            "transformers, Glm5NextTextRMSNorm for enorm/hnorm/input/post-attention/shared_head norms, eh_proj "
                            "an nn.Linear on cat(enorm(embedding), hnorm(h)); no mHC",
            "torch": "plain PyTorch from architecture.md §7 (MLA expanded form, k-pool indexer, sigmoid-routed MoE)",
        }[primary],
        cross_check=(f"transformers-module and plain-torch MTP agree within {agree_worst:.2e} (max |Δ| over logits, hidden rows)"
                     if len(impls) == 2 else "none: one implementation ran"),
        two_call_prefill_max_diff=split_worst,
        weights="trunk: hf_fixture.py variant " + args.variant + " (same seed and draws); MTP layer: random (seed "
                + str(v["seed"] + 4242) + "), O(1) activations as randomize(), bf16-representable, BF16 on disk "
                "except e_score_correction_bias (F32)",
        compute="float32 throughout (TF32 off)",
        trunk_hidden="transformers' last_hidden_state: after the unweighted stream mean and the final norm (what lm_head reads)",
        conventions="MTP position i reads (token i+1, trunk hidden i); the last prompt position reads the trunk's greedy next "
                    "token; draft steps recycle the MTP's post-shared_head.norm hidden; no position-0 embedding zeroing",
        cases=cases,
    )
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(meta, f, indent=2, allow_nan=False)  # strict JSON: Go reads it
    log(json.dumps(meta, indent=2))
    log(f"\nOK: wrote {out}/checkpoint, reference.safetensors ({len(tensors)} tensors) and reference.json")
    log("next, in the repository:\n"
        f"  rm -rf testdata/glm5next-tiny-mtp && cp -r {out} testdata/glm5next-tiny-mtp\n"
        "  go test ./tests -run TestMTPTransformersParity -v")


if __name__ == "__main__":
    t0 = time.time()
    main()
    log(f"took {time.time() - t0:.1f} s")
