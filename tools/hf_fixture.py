"""Build a tiny random GLM-5.3-Flash (glm5_next) checkpoint with Hugging Face transformers
and record reference outputs for an independent engine to match.

Usage: python3 hf_fixture.py OUTDIR VARIANT
VARIANT: a name from VARIANTS below; add your own variants there.

Outputs in OUTDIR/VARIANT/: checkpoint/ (config.json + model.safetensors, as save_pretrained
writes them), reference.safetensors (inputs, logits, per-layer hidden states, top-k indices),
reference.json (what each case is).
"""
import copy, json, math, os, sys
import torch
import torch.nn as nn
from safetensors.torch import save_file
from transformers.models.glm5_next import modeling_glm5_next as M
from transformers.models.glm5_next.configuration_glm5_next import Glm5NextConfig

torch.use_deterministic_algorithms(True)

VARIANTS = {
    # shared with developers
    "a": dict(seed=1234, vocab_size=256, hidden_size=64, intermediate_size=160, moe_intermediate_size=32,
              num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1,
              n_routed_experts=8, num_experts_per_tok=2, n_group=1, topk_group=1, kv_lora_rank=32,
              q_lora_rank=48, qk_nope_head_dim=16, v_head_dim=16, index_topk=16, index_head_dim=16,
              index_n_heads=16, index_kpool=4, linear_head_dim=16, linear_num_heads=4, hc_mult=4,
              pattern=None),
    # grouped expert routing (n_group 3, topk_group 2), odd sizes, hc_mult 3, a "shared" indexer layer (layer 2
    # reuses layer 1's top-k; the two DSA layers are adjacent because transformers passes top-k only from the
    # immediately preceding layer), explicit layer_types
    "b": dict(seed=4321, vocab_size=200, hidden_size=48, intermediate_size=96, moe_intermediate_size=24,
              num_hidden_layers=6, num_attention_heads=3, num_key_value_heads=3, n_shared_experts=1,
              n_routed_experts=12, num_experts_per_tok=3, n_group=3, topk_group=2, kv_lora_rank=24,
              q_lora_rank=40, qk_nope_head_dim=20, v_head_dim=12, index_topk=8, index_head_dim=12,
              index_n_heads=6, index_kpool=2, linear_head_dim=8, linear_num_heads=3, hc_mult=3,
              pattern="FFSFFF",
              layer_types=["linear_attention", "deepseek_sparse_attention", "deepseek_sparse_attention",
                           "linear_attention", "deepseek_sparse_attention", "linear_attention"]),
    # tiny "a" shapes with hc_mult 2, k-pool 8 with index_topk 16 (2 pools selected), 2 shared experts
    "c": dict(seed=99, vocab_size=256, hidden_size=64, intermediate_size=160, moe_intermediate_size=32,
              num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=4, n_shared_experts=2,
              n_routed_experts=8, num_experts_per_tok=2, n_group=1, topk_group=1, kv_lora_rank=32,
              q_lora_rank=48, qk_nope_head_dim=16, v_head_dim=16, index_topk=16, index_head_dim=16,
              index_n_heads=16, index_kpool=8, linear_head_dim=16, linear_num_heads=4, hc_mult=2,
              pattern=None),
}


def make_config(v):
    text = dict(
        vocab_size=v["vocab_size"], hidden_size=v["hidden_size"], intermediate_size=v["intermediate_size"],
        moe_intermediate_size=v["moe_intermediate_size"], num_hidden_layers=v["num_hidden_layers"],
        num_attention_heads=v["num_attention_heads"], num_key_value_heads=v["num_key_value_heads"],
        n_shared_experts=v["n_shared_experts"], n_routed_experts=v["n_routed_experts"],
        num_experts_per_tok=v["num_experts_per_tok"], n_group=v["n_group"], topk_group=v["topk_group"],
        kv_lora_rank=v["kv_lora_rank"], q_lora_rank=v["q_lora_rank"], qk_rope_head_dim=0,
        qk_nope_head_dim=v["qk_nope_head_dim"], v_head_dim=v["v_head_dim"], index_topk=v["index_topk"],
        index_head_dim=v["index_head_dim"], index_n_heads=v["index_n_heads"], index_kpool=v["index_kpool"],
        linear_head_dim=v["linear_head_dim"], linear_num_heads=v["linear_num_heads"], hc_mult=v["hc_mult"],
        pad_token_id=0, max_position_embeddings=4096,
    )
    if v["pattern"]:
        text["index_topk_pattern"] = v["pattern"]
    if v.get("layer_types"):
        text["layer_types"] = v["layer_types"]
    vision = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=v["hidden_size"],
                  projection_intermediate_size=64, patch_size=14, image_size=28)
    cfg = Glm5NextConfig(text_config=text, vision_config=vision)
    cfg._attn_implementation = "eager"
    cfg.text_config._attn_implementation = "eager"
    return cfg


@torch.no_grad()
def randomize(model, g):
    """Give every parameter O(1)-activation random values so that parity tests are meaningful."""
    for name, p in model.named_parameters():
        n = name
        if "visual" in n:
            p.normal_(0, 0.02, generator=g)
            continue
        if n.endswith("A_log"):
            p.normal_(0, 0.5, generator=g)
        elif n.endswith("dt_bias"):
            p.normal_(0, 1.0, generator=g)
        elif "conv1d" in n:
            p.normal_(0, 0.5, generator=g)
        elif n.endswith(".base"):
            p.normal_(0, 0.5, generator=g)
        elif n.endswith(".scale") and p.dim() == 1 and p.numel() == 3:
            p.uniform_(0.5, 1.5, generator=g)
        elif n.endswith(".fn"):
            p.normal_(0, 1.0 / math.sqrt(p.shape[1]), generator=g)
        elif "index_kpool_compress_ape" in n:
            p.normal_(0, 0.5, generator=g)
        elif "index_kpool_compress_gate" in n:
            p.normal_(0, 1.0 / math.sqrt(p.shape[1]), generator=g)
        elif "norm" in n and p.dim() == 1:
            if n.endswith("bias"):
                p.normal_(0, 0.1, generator=g)
            else:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
        elif "embed_tokens" in n:
            p.normal_(0, 1.0, generator=g)
        elif "experts.gate_up_proj" in n or "experts.down_proj" in n:
            p.normal_(0, 1.0 / math.sqrt(p.shape[-1]), generator=g)
        elif p.dim() == 2:
            p.normal_(0, 1.0 / math.sqrt(p.shape[1]), generator=g)
        else:
            p.normal_(0, 0.1, generator=g)
    for name, b in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            b.normal_(0, 0.05, generator=g)


class MarginWatch:
    """Track the smallest gap at every top-k boundary (MoE router groups and experts, DSA indexer pools)
    while forward passes run, so fixtures avoid near-ties that engines may legitimately break differently."""

    def __init__(self, model):
        self.model, self.worst, self.hooks, self.in_indexer = model, float("inf"), [], False

    def _gap(self, values, k):
        v = values.float()
        invalid = v < -1e30  # masked candidates (finfo.min or -inf): not choosable
        v = v.masked_fill(invalid, float("-inf"))
        if v.shape[-1] <= k:
            return
        srt = v.sort(dim=-1, descending=True)[0]
        valid = (~invalid).sum(-1)
        gap = srt[..., k - 1] - srt[..., k]
        # only rows with more valid candidates than k have a real boundary
        gap = torch.where(valid > k, gap, torch.full_like(gap, float("inf")))
        g = float(gap.min())
        assert g == g, "gap is NaN"
        self.worst = min(self.worst, g)

    def __enter__(self):
        watch = self

        def router_hook(mod, inp, out):
            logits = out[0]
            s = logits.float().sigmoid() + mod.e_score_correction_bias.float()
            if mod.num_group > 1:
                per = mod.num_experts // mod.num_group
                gs = s.view(-1, mod.num_group, per).topk(2, dim=-1)[0].sum(-1)
                watch._gap(gs, mod.topk_group)
                top_groups = gs.topk(mod.topk_group, dim=-1)[1]
                mask = torch.zeros_like(gs).scatter_(1, top_groups, 1).bool()
                mask = mask.unsqueeze(-1).expand(-1, mod.num_group, per).reshape(-1, mod.num_experts)
                s = s.masked_fill(~mask, float("-inf"))
            watch._gap(s, mod.top_k)

        orig_topk = torch.Tensor.topk

        def topk(t, k, *a, **kw):
            if watch.in_indexer:
                watch._gap(t, k)
            return orig_topk(t, k, *a, **kw)

        self.orig_topk = orig_topk
        torch.Tensor.topk = topk
        self.orig_index_fwd = M.Glm5NextTextIndexer.forward

        def index_fwd(mod, *a, **kw):
            watch.in_indexer = True
            try:
                return watch.orig_index_fwd(mod, *a, **kw)
            finally:
                watch.in_indexer = False

        M.Glm5NextTextIndexer.forward = index_fwd
        self.hooks = [m.register_forward_hook(router_hook) for m in self.model.modules()
                      if isinstance(m, M.Glm5NextTextTopkRouter)]
        return self

    def __exit__(self, *exc):
        torch.Tensor.topk = self.orig_topk
        M.Glm5NextTextIndexer.forward = self.orig_index_fwd
        for h in self.hooks:
            h.remove()


def main():
    out, variant = sys.argv[1], sys.argv[2]
    v = VARIANTS[variant]
    cfg = make_config(v)
    torch.manual_seed(v["seed"])
    model = M.Glm5NextForConditionalGeneration(cfg).eval()
    g = torch.Generator().manual_seed(v["seed"])
    randomize(model, g)
    # Make every parameter and buffer exactly representable in bf16 (the fp32-kept ones too), so the
    # checkpoint below holds exactly the values the float32 reference computes with.
    keep32 = ["e_score_correction_bias", "conv1d", "dt_bias", "A_log"]
    with torch.no_grad():
        for n, p in list(model.named_parameters()) + list(model.named_buffers()):
            if p.is_floating_point():
                p.copy_(p.to(torch.bfloat16).float())
    model = model.float()
    d = os.path.join(out, variant)
    ck = os.path.join(d, "checkpoint")
    os.makedirs(ck, exist_ok=True)
    # save as bf16 except the fp32-kept modules, like the real checkpoint (both casts are lossless)
    model_save = copy.deepcopy(model)
    with torch.no_grad():
        for n, p in list(model_save.named_parameters()) + list(model_save.named_buffers()):
            if p.is_floating_point():
                p.data = p.data.float() if any(k in n for k in keep32) else p.data.to(torch.bfloat16)
    model_save.save_pretrained(ck, safe_serialization=True)
    # check: what was written equals what the reference uses
    from safetensors.torch import load_file
    written = load_file(os.path.join(ck, "model.safetensors"))
    ref_sd = model.state_dict()
    checked = 0
    for k, t in written.items():
        if k in ref_sd:
            assert torch.equal(t.float(), ref_sd[k].float()), k
            checked += 1
    for k, t in written.items():
        if t.dtype == torch.float32:
            assert not (t.view(torch.int32) & 0xFFFF).any(), f"{k} is not bf16-representable"
    print("verified", checked, "of", len(written), "saved tensors equal the reference weights by name;",
          "all float32 tensors are bf16-representable")
    print("saved checkpoint files:", os.listdir(ck))

    gen = torch.Generator().manual_seed(v["seed"] + 1)
    V = v["vocab_size"]
    tensors, cases = {}, []
    text_model = model.model.language_model

    def hidden_capture():
        hs = []
        hooks = [l.register_forward_hook(lambda m, i, o: hs.append(o[0].detach().clone())) for l in text_model.layers]
        return hs, hooks

    def run_case(n, fn, tries=300):
        """Draw random prompts until the whole case runs with every top-k boundary well separated."""
        for _ in range(tries):
            ids = torch.randint(1, V, (1, n), generator=gen)
            with MarginWatch(model) as w, torch.no_grad():
                res = fn(ids)
            if w.worst > 2e-4:
                return ids, res, w.worst
        raise RuntimeError("no well-separated input found")

    # 1. prefill cases: full-sequence logits and per-layer hidden streams
    for i, n in enumerate([5, 37, 130]):
        def prefill(ids):
            hs, hooks = hidden_capture()
            try:
                return model(input_ids=ids, use_cache=False).logits, hs
            finally:
                for h in hooks:
                    h.remove()
        ids, (logits, hs), gap = run_case(n, prefill)
        key = f"prefill.{i}"
        tensors[key + ".input_ids"] = ids[0].to(torch.int64)
        tensors[key + ".logits"] = logits[0].float().contiguous()
        for li, h in enumerate(hs):
            tensors[key + f".hidden.{li}"] = h[0].float().contiguous()  # [S, hc, D] after layer li
        cases.append(dict(name=key, kind="prefill", length=n, min_topk_gap=gap))

    # 2. greedy decode with cache: prefill then one token at a time
    for i, (n, steps) in enumerate([(37, 24), (9, 40)]):
        def decode(ids):
            outp = model(input_ids=ids, use_cache=True)
            past = outp.past_key_values
            step_logits, toks = [outp.logits[0, -1].float()], []
            for s in range(steps):
                nxt = step_logits[-1].argmax().view(1, 1)
                toks.append(int(nxt))
                outp = model(input_ids=nxt, past_key_values=past, use_cache=True)
                past = outp.past_key_values
                step_logits.append(outp.logits[0, -1].float())
            return toks, step_logits
        ids, (toks, step_logits), gap = run_case(n, decode)
        key = f"decode.{i}"
        tensors[key + ".input_ids"] = ids[0].to(torch.int64)
        tensors[key + ".greedy_tokens"] = torch.tensor(toks, dtype=torch.int64)
        tensors[key + ".step_logits"] = torch.stack(step_logits).contiguous()  # [steps+1, V]
        cases.append(dict(name=key, kind="decode", prompt_length=n, steps=steps, min_topk_gap=gap))

    # 3. multi-token continuation from a cached state
    for i, (n1, n2) in enumerate([(20, 25), (70, 66)]):
        def extend(ids):
            o1 = model(input_ids=ids[:, :n1], use_cache=True)
            o2 = model(input_ids=ids[:, n1:], past_key_values=o1.past_key_values, use_cache=True)
            return o1.logits, o2.logits
        ids, (l1, l2), gap = run_case(n1 + n2, extend)
        key = f"extend.{i}"
        tensors[key + ".input_ids"] = ids[0].to(torch.int64)
        tensors[key + ".split"] = torch.tensor([n1], dtype=torch.int64)
        tensors[key + ".logits_first"] = l1[0].float().contiguous()
        tensors[key + ".logits_second"] = l2[0].float().contiguous()
        cases.append(dict(name=key, kind="extend", first=n1, second=n2, min_topk_gap=gap))

    save_file(tensors, os.path.join(d, "reference.safetensors"))
    meta = dict(
        produced_by="transformers " + __import__("transformers").__version__ + ", torch " + torch.__version__,
        model_class="Glm5NextForConditionalGeneration (text path only; eager attention; float32 compute)",
        weights="random, bf16-representable; e_score_correction_bias, conv1d, dt_bias, A_log kept float32",
        hidden_note="prefill.N.hidden.L is the [seq, hc_mult, hidden] residual stream after decoder layer L",
        cases=cases,
        variant=variant,
    )
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump(meta, f, indent=2)
    print(json.dumps(meta, indent=2))


if __name__ == "__main__":
    main()
