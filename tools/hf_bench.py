#!/usr/bin/env python3
"""Benchmark Hugging Face transformers (5.17, model type glm5_next) on a glmflash checkpoint, on one
CUDA GPU, to sit beside `glmflash bench --device cuda` run on the same checkpoint and the same GPU.

What it measures (the workload of `glmflash bench`, cmd/glmflash/bench.go and core/attrib/steps.go):
  * prefill P tokens (one row per --prompts value): one sequence of P tokens, batch 1, from an
    empty cache (use_cache=True, the cache the model builds itself), only the last position's
    logits computed (logits_to_keep=1, glmflash's LastLogits) and copied to the host; the tokens
    are glmflash's BenchTokens(P, seed 1): token i = (1*7919 + i*104729) mod vocab.
    tok/s = P / seconds.
  * decode batch B (one row per --batches value): B sequences, sequence i prefilled (not timed)
    with BenchTokens(32, seed i+2) as one [B, 32] batch; then --decode-steps steps, each one
    forward of one token per sequence on the cache the prefill returned (past_key_values: the
    model's own cache, with its linear-attention states; nothing hand-built), the greedy token of
    every sequence taken on the GPU (argmax) and copied to the host. As in glmflash's bench the
    token fed at step st to sequence i is (st*31 + i) mod vocab, not the sampled one, so the
    work does not depend on the weights. tok/s = B*steps / seconds; ms_per_step = seconds/steps.
  Each row: --warmup runs, then --reps timed runs; tokens_per_s is the median of the timed runs
  (glmflash's rule: the middle element of the sorted runs). Every timed region is bracketed by
  torch.cuda.synchronize(). No attention mask is passed (no padding: every sequence of a batch
  has the same length), so the pad id plays no part and the streams are glmflash's exactly.
  Device memory: torch.cuda.memory_allocated() after loading (the weights; the vision tower,
  absent from glmflash checkpoints, is dropped first when none of its weights were in the
  checkpoint) and, per row, torch.cuda.max_memory_allocated() over its runs (peak stats reset
  before the row). These are PyTorch allocator numbers; glmflash reports its own arenas.

How it loads: the glm5_next causal-LM class (a text-only *ForCausalLM class if transformers has
one, else AutoModelForCausalLM, else the checkpoint's own `architectures` class,
Glm5NextForConditionalGeneration), bfloat16, on cuda:0, with --attn (sdpa by default:
transformers' own default where the model supports it; the fixtures use eager). Missing and
unexpected keys are reported in the JSON, not fatal, unless trunk (text) weights are missing.
An FP8 checkpoint (quantization_config quant_method "fp8"):
  --fp8 keep        transformers' fine-grained FP8 integration keeps the e4m3 weights and
                    their block scales (FP8Linear / FP8Experts modules); the checkpoint's bf16
                    linears (KDA, indexer, kv_b_proj, lm_head, ...) and the vision tower are
                    listed in modules_to_not_convert, else transformers converts every nn.Linear.
                    Its forward needs transformers' finegrained-fp8 kernel, which comes through
                    the `kernels` package (0.16.x) from the Hub: where that is missing every row
                    records the ImportError;
  --fp8 dequantize  FineGrainedFP8Config(dequantize=True) loads them as bf16; if transformers
                    refuses, the script writes a bf16 copy (code x block scale, exact for glmflash's
                    power-of-two scales) to a temporary directory and loads that ("manual");
  --fp8 auto        keep, with a 4-token smoke forward; on any failure, dequantize, with the
                    reason recorded.
TF32: left at PyTorch's default (torch.backends.cuda.matmul.allow_tf32 is False by default; the
value seen is recorded). Gradients off (torch.inference_mode()).

Usage:
  python3 tools/hf_bench.py --model DIR [--prompts 512,4096] [--batches 1,8,64]
      [--decode-steps 32] [--reps 3] [--warmup 1] [--fp8 auto|keep|dequantize]
      [--attn eager|sdpa] [--experts default|eager|grouped_mm|batched_mm] --json OUT.json
The JSON is rewritten after every row, so a run cut short keeps the rows it finished.
Standard library, torch, transformers and safetensors only.
"""
import argparse
import gc
import importlib.util
import inspect
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback

MIB = 1 << 20


def bench_tokens(n, seed, vocab):
    """glmflash's attrib.BenchTokens: token i = (seed*7919 + i*104729) mod vocab."""
    return [(seed * 7919 + i * 104729) % vocab for i in range(n)]


def int_list(s):
    try:
        v = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {s!r}")
    if not v or any(x < 1 for x in v):
        raise argparse.ArgumentTypeError(f"values must be >= 1: {s!r}")
    return v


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="checkpoint directory (config.json + safetensors)")
    p.add_argument("--prompts", type=int_list, default=[512, 4096], help="prefill lengths (default 512,4096)")
    p.add_argument("--batches", type=int_list, default=[1, 8, 64], help="decode batch sizes (default 1,8,64)")
    p.add_argument("--decode-steps", type=int, default=32, help="timed decode steps per run (default 32)")
    p.add_argument("--reps", type=int, default=3, help="timed runs per row (default 3)")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs before them (default 1)")
    p.add_argument("--fp8", choices=["auto", "keep", "dequantize"], default="auto",
                   help="FP8 checkpoints: keep FP8 weights, dequantize to bf16, or keep falling back to dequantize")
    p.add_argument("--attn", choices=["eager", "sdpa"], default="sdpa", help="attention implementation (default sdpa)")
    p.add_argument("--experts", choices=["default", "eager", "grouped_mm", "batched_mm"], default="default",
                   help="transformers' experts_implementation (default: whatever transformers picks)")
    p.add_argument("--tmp-dir", default=None, help="where a manual bf16 copy of an FP8 checkpoint goes (default: system temp)")
    p.add_argument("--json", required=True, help="write the results here")
    a = p.parse_args(argv)
    if a.decode_steps < 1 or a.reps < 1 or a.warmup < 0:
        p.error("--decode-steps and --reps must be >= 1, --warmup >= 0")
    return a


def short_err(e, limit=2000):
    s = f"{type(e).__name__}: {e}"
    return s if len(s) <= limit else s[:limit] + " …"


# ----------------------------------------------------------------------------------------------
# checkpoint inspection (no torch needed)

def read_config(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        return json.load(f)


def fp8_quant_config(cfg):
    for c in (cfg, cfg.get("text_config") or {}):
        q = c.get("quantization_config")
        if isinstance(q, dict) and q.get("quant_method") == "fp8":
            return q
    return None


def config_summary(cfg):
    t = cfg.get("text_config") or cfg
    layer_types = t.get("layer_types") or []
    mlp_types = t.get("mlp_layer_types") or []
    return {
        "model_type": cfg.get("model_type"),
        "architectures": cfg.get("architectures"),
        "layers": t.get("num_hidden_layers"),
        "hidden": t.get("hidden_size"),
        "vocab": t.get("vocab_size"),
        "experts": t.get("n_routed_experts", t.get("num_local_experts")),
        "experts_per_token": t.get("num_experts_per_tok"),
        "shared_experts": t.get("n_shared_experts"),
        "moe_intermediate": t.get("moe_intermediate_size"),
        "attention_heads": t.get("num_attention_heads"),
        "linear_attention_layers": sum(1 for x in layer_types if x == "linear_attention"),
        "sparse_attention_layers": sum(1 for x in layer_types if x != "linear_attention"),
        "moe_layers": sum(1 for x in mlp_types if x == "sparse"),
        "hc_mult": t.get("hc_mult"),
        "index_topk": t.get("index_topk"),
        "max_position_embeddings": t.get("max_position_embeddings"),
        "mtp_layers": t.get("num_nextn_predict_layers", 0),
        "quantization_config": fp8_quant_config(cfg),
    }


def weight_files(model_dir):
    idx = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            return sorted(set(json.load(f)["weight_map"].values()))
    return sorted(n for n in os.listdir(model_dir) if n.endswith(".safetensors"))


def checkpoint_dtypes(model_dir):
    """{tensor name: safetensors dtype string (e.g. "BF16", "F8_E4M3")}, read from the headers."""
    out = {}
    for fn in weight_files(model_dir):
        with open(os.path.join(model_dir, fn), "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
        for k, v in header.items():
            if k != "__metadata__":
                out[k] = v.get("dtype")
    return out


def bf16_linear_modules(model_dir, cfg, ckpt_dtypes):
    """The nn.Linear modules of the model (built on the meta device) that have no FP8 weight in
    the checkpoint. transformers' FP8 integration converts every nn.Linear not listed in
    quantization_config.modules_to_not_convert; glmflash's FP8 layout (like the released one)
    keeps the KDA, indexer, kv_b_proj, lm_head and other projections in bf16 without scales, so
    they must be listed for the FP8 weights to be kept as transformers keeps them."""
    import torch
    from transformers import AutoConfig
    from transformers.models.glm5_next import modeling_glm5_next as M
    fp8 = {k[: -len(".weight")] for k, d in ckpt_dtypes.items() if d == "F8_E4M3" and k.endswith(".weight")}
    config = AutoConfig.from_pretrained(model_dir)
    arch = (cfg.get("architectures") or ["Glm5NextForConditionalGeneration"])[0]
    cls = getattr(M, arch, M.Glm5NextForConditionalGeneration)
    with torch.device("meta"):
        meta = cls(config)
    names = [n for n, m in meta.named_modules() if isinstance(m, torch.nn.Linear) and n not in fp8]
    del meta
    return config, names


# ----------------------------------------------------------------------------------------------
# loading

def write_dequantized_copy(src, dst, block):
    """Write a bf16 copy of an FP8 checkpoint: every float8_e4m3fn tensor W with a companion
    W_scale_inv (F32 [ceil(R/bm), ceil(C/bn)]) becomes W*scale (per bm x bn block) in bf16, the
    scales are dropped, everything else is copied; config.json loses its quantization_config."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file
    bm, bn = block
    os.makedirs(dst, exist_ok=True)
    files = weight_files(src)
    weight_map = {}
    for fn in files:
        out = {}
        with safe_open(os.path.join(src, fn), framework="pt") as f:
            keys = set(f.keys())
            for k in keys:
                if k.endswith("_scale_inv") and k[: -len("_scale_inv")] in keys:
                    continue
                t = f.get_tensor(k)
                if t.dtype == torch.float8_e4m3fn:
                    s = f.get_tensor(k + "_scale_inv") if k + "_scale_inv" in keys else None
                    if s is None:
                        raise RuntimeError(f"{fn}: FP8 tensor {k} has no {k}_scale_inv in the same file")
                    R, C = t.shape[-2:]
                    s = s.float().repeat_interleave(bm, dim=-2)[..., :R, :].repeat_interleave(bn, dim=-1)[..., :C]
                    t = (t.float() * s).to(torch.bfloat16)
                out[k] = t.contiguous()
                weight_map[k] = fn
        save_file(out, os.path.join(dst, fn), metadata={"format": "pt"})
        del out
    if len(files) > 1:
        with open(os.path.join(dst, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": weight_map}, f)
    cfg = read_config(src)
    cfg.pop("quantization_config", None)
    if isinstance(cfg.get("text_config"), dict):
        cfg["text_config"].pop("quantization_config", None)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    for extra in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if os.path.exists(os.path.join(src, extra)):
            shutil.copy(os.path.join(src, extra), os.path.join(dst, extra))


def candidate_classes(cfg):
    """(label, loader) pairs in the order tried: a text *ForCausalLM class of glm5_next if one
    exists, AutoModelForCausalLM, then the checkpoint's architectures class."""
    import transformers
    out = []
    M = None
    try:
        from transformers.models.glm5_next import modeling_glm5_next as M
    except Exception:
        pass
    if M is not None:
        for name in ("Glm5NextForCausalLM", "Glm5NextTextForCausalLM"):
            if hasattr(M, name):
                out.append((f"modeling_glm5_next.{name}", getattr(M, name)))
    out.append(("AutoModelForCausalLM", transformers.AutoModelForCausalLM))
    for name in (cfg.get("architectures") or []) + ["Glm5NextForConditionalGeneration"]:
        cls = getattr(M, name, None) if M is not None else None
        cls = cls or getattr(transformers, name, None)
        if cls is not None and all(cls is not c for _, c in out):
            out.append((f"{cls.__module__.rsplit('.', 1)[-1]}.{name}", cls))
    return out


def is_vision_key(k):
    return ".visual." in k or k.startswith("visual.") or "vision_tower" in k or "model.visual" in k


def from_pretrained(cls, path, args, extra):
    import torch
    kw = dict(dtype=torch.bfloat16, device_map="cuda:0", attn_implementation=args.attn)
    if args.experts != "default":
        kw["experts_implementation"] = args.experts
    kw.update(extra)
    try:
        res = cls.from_pretrained(path, output_loading_info=True, **kw)
    except TypeError as e:
        if "output_loading_info" not in str(e):
            raise
        res = (cls.from_pretrained(path, **kw), {})
    if isinstance(res, tuple):
        model, info = res
    else:
        model, info = res, {}
    return model, {k: sorted(map(str, v)) if isinstance(v, (list, set, tuple)) else str(v) for k, v in (info or {}).items()}


def load_with_classes(cfg, path, args, extra, notes):
    """Try each candidate class; accept the first whose load leaves no trunk weight missing."""
    import torch
    last = None
    for label, cls in candidate_classes(cfg):
        t0 = time.perf_counter()
        try:
            model, info = from_pretrained(cls, path, args, extra)
        except Exception as e:
            notes.append(f"{label}: load failed: {short_err(e, 600)}")
            last = e
            free_cuda()
            continue
        secs = time.perf_counter() - t0
        missing = info.get("missing_keys", [])
        trunk_missing = [k for k in missing if not is_vision_key(k)]
        if trunk_missing:
            notes.append(f"{label}: {len(trunk_missing)} trunk weights missing (e.g. {trunk_missing[:3]}); trying the next class")
            last = RuntimeError(f"{label}: trunk weights missing: {trunk_missing[:5]}")
            del model
            free_cuda()
            continue
        return model, info, label, secs
    raise RuntimeError(f"no class loaded the checkpoint: {short_err(last, 1500) if last else 'none tried'}")


def free_cuda():
    import torch
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def smoke(model, vocab):
    """4-token prefill with cache, then one decode step: does the forward run at all?"""
    import torch
    dev = torch.device("cuda:0")
    with torch.inference_mode():
        ids = torch.tensor([bench_tokens(4, 1, vocab)], device=dev)
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
        out = model(input_ids=ids[:, -1:], past_key_values=out.past_key_values, use_cache=True, logits_to_keep=1)
        v = out.logits.float()
        if not torch.isfinite(v).all():
            raise RuntimeError("smoke forward gave non-finite logits")
    torch.cuda.synchronize()


def describe_weights(model):
    """Parameter and buffer bytes by dtype, and the class of the first MoE experts module."""
    by_dtype = {}
    vision = 0
    for n, t in list(model.named_parameters()) + list(model.named_buffers()):
        b = t.numel() * t.element_size()
        by_dtype[str(t.dtype).replace("torch.", "")] = by_dtype.get(str(t.dtype).replace("torch.", ""), 0) + b
        if is_vision_key("." + n):
            vision += b
    experts_cls = None
    linear_classes = {}
    for n, m in model.named_modules():
        cn = type(m).__name__
        if experts_cls is None and n.endswith("mlp.experts"):
            experts_cls = cn
        if cn.endswith("Linear") and not is_vision_key("." + n):
            linear_classes[cn] = linear_classes.get(cn, 0) + 1
    return {"bytes_by_dtype": by_dtype, "vision_bytes": vision, "experts_module": experts_cls,
            "linear_modules": linear_classes}


def drop_vision_if_absent(model, ckpt_names, load):
    """glmflash checkpoints carry no vision tower: free the randomly initialised one."""
    if any(is_vision_key("." + k) for k in ckpt_names):
        load["vision_tower"] = "kept (weights in the checkpoint)"
        return
    inner = getattr(model, "model", None)
    if inner is not None and getattr(inner, "visual", None) is not None:
        n = sum(p.numel() * p.element_size() for p in inner.visual.parameters())
        try:
            inner.visual = None
            load["vision_tower"] = f"dropped: not in the checkpoint ({n} bytes of random weights freed)"
        except Exception as e:
            load["vision_tower"] = f"kept (random weights, {n} bytes): could not drop: {short_err(e, 300)}"
    else:
        load["vision_tower"] = "none in the model"


def load_model(args, cfg, vocab):
    """Returns (model, load record)."""
    import torch
    q = fp8_quant_config(cfg)
    load = {"checkpoint_fp8": q is not None, "fp8_option": args.fp8, "attn_implementation": args.attn,
            "experts_implementation_option": args.experts, "notes": []}
    notes = load["notes"]
    ckpt_dtypes = checkpoint_dtypes(args.model)
    ckpt_names = set(ckpt_dtypes)

    def finish(model, info, label, secs, path):
        load.update(model_class=label, load_seconds=round(secs, 3), path=path,
                    missing_keys=info.get("missing_keys", []), unexpected_keys=info.get("unexpected_keys", []),
                    mismatched_keys=info.get("mismatched_keys", []), error_msgs=info.get("error_msgs", []))
        return model

    def keep():
        extra = {}
        if q is not None:
            # list the bf16 linears (and the vision tower) as modules_to_not_convert in the
            # config the model is built from; the checkpoint's own list is kept too
            config, names = bf16_linear_modules(args.model, cfg, ckpt_dtypes)
            qd = dict(q)
            qd["modules_to_not_convert"] = sorted(set((q.get("modules_to_not_convert") or []) + names + ["model.visual"]))
            config.quantization_config = qd
            extra["config"] = config
            load["fp8_modules_to_not_convert"] = len(qd["modules_to_not_convert"])
        model, info, label, secs = load_with_classes(cfg, args.model, args, extra, notes)
        return finish(model, info, label, secs, "fp8-keep" if q else "bf16")

    def dequantize():
        try:
            from transformers import FineGrainedFP8Config
            params = inspect.signature(FineGrainedFP8Config.__init__).parameters
            if "dequantize" not in params and not any(p.kind == p.VAR_KEYWORD for p in params.values()):
                raise TypeError("FineGrainedFP8Config has no dequantize option")
            qc = FineGrainedFP8Config(dequantize=True, weight_block_size=tuple(q.get("weight_block_size", (128, 128))),
                                      activation_scheme=q.get("activation_scheme", "dynamic"))
            if not getattr(qc, "dequantize", False):
                raise TypeError("FineGrainedFP8Config ignored dequantize=True")
            model, info, label, secs = load_with_classes(cfg, args.model, args, {"quantization_config": qc}, notes)
            return finish(model, info, label, secs, "fp8-dequantize (transformers FineGrainedFP8Config(dequantize=True))")
        except Exception as e:
            notes.append(f"FineGrainedFP8Config(dequantize=True) failed: {short_err(e, 800)}; writing a bf16 copy")
            free_cuda()
        tmp = tempfile.mkdtemp(prefix="hf_bench_bf16_", dir=args.tmp_dir)
        try:
            t0 = time.perf_counter()
            write_dequantized_copy(args.model, tmp, tuple(q.get("weight_block_size", (128, 128))))
            conv = time.perf_counter() - t0
            model, info, label, secs = load_with_classes(read_config(tmp), tmp, args, {}, notes)
            load["manual_dequantize_seconds"] = round(conv, 3)
            return finish(model, info, label, secs, "fp8-dequantize (manual bf16 copy)")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    if q is None:
        model = keep()
    elif args.fp8 == "keep":
        model = keep()
    elif args.fp8 == "dequantize":
        model = dequantize()
    else:
        model = None
        try:
            model = keep()
            smoke(model, vocab)
        except Exception as e:
            load["fallback_reason"] = short_err(e)
            notes.append(f"fp8 keep failed, falling back to dequantize: {short_err(e, 800)}")
            traceback.print_exc()
            model = None
        if model is None:
            # outside the except block: its traceback holds keep()'s frames, and
            # with them the FP8 model, until the block ends
            free_cuda()
            model = dequantize()
    model.eval()
    drop_vision_if_absent(model, ckpt_names, load)
    free_cuda()
    torch.cuda.synchronize()
    load["weights_bytes_allocated"] = torch.cuda.memory_allocated()
    load["reserved_bytes_after_load"] = torch.cuda.memory_reserved()
    load["weights"] = describe_weights(model)
    c = getattr(model, "config", None)
    tc = getattr(c, "text_config", None) or c
    load["fp8_weights_in_model"] = load["weights"]["bytes_by_dtype"].get("float8_e4m3fn", 0)
    load["config_attn_implementation"] = getattr(tc, "_attn_implementation", None)
    load["config_experts_implementation"] = getattr(tc, "_experts_implementation", getattr(c, "_experts_implementation", None))
    try:
        smoke(model, vocab)
        load["smoke"] = "ok"
    except Exception as e:
        load["smoke"] = short_err(e)
        traceback.print_exc()
    return model, load


# ----------------------------------------------------------------------------------------------
# workloads

def main(argv=None):
    args = parse_args(argv)
    cfg = read_config(args.model)
    summary = config_summary(cfg)
    vocab = summary["vocab"]
    if not vocab:
        sys.exit(f"{args.model}/config.json: no vocab_size")
    limit = summary.get("max_position_embeddings")
    if limit and (max(args.prompts) > limit or 32 + args.decode_steps > limit):
        sys.exit(f"--prompts ({max(args.prompts)}) and 32 + --decode-steps must fit max_position_embeddings ({limit})")

    import torch
    import transformers
    if not torch.cuda.is_available():
        sys.exit("no CUDA device visible to torch")
    torch.set_grad_enabled(False)
    dev = torch.device("cuda:0")
    torch.cuda.set_device(dev)

    report = {
        "tool": "tools/hf_bench.py",
        "model": os.path.abspath(args.model),
        "argv": sys.argv[1:] if argv is None else argv,
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__, "cuda": torch.version.cuda},
        "device": {"name": torch.cuda.get_device_name(dev), "capability": list(torch.cuda.get_device_capability(dev)),
                   "total_bytes": torch.cuda.get_device_properties(dev).total_memory},
        "tf32": {"matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
                 "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
                 "float32_matmul_precision": torch.get_float32_matmul_precision(),
                 "note": "left at PyTorch's defaults"},
        "config": summary,
        "optional_kernels": {m: importlib.util.find_spec(m) is not None
                             for m in ("fla", "causal_conv1d", "deep_gemm", "kernels", "triton")},
        "settings": {"prompts": args.prompts, "batches": args.batches, "decode_steps": args.decode_steps,
                     "reps": args.reps, "warmup": args.warmup, "decode_prompt_tokens": 32},
        "results": [],
    }

    def write_json():
        tmp = args.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(report, f, indent=2, default=str)
        os.replace(tmp, args.json)

    torch.cuda.reset_peak_memory_stats(dev)
    try:
        model, load = load_model(args, cfg, vocab)
    except Exception as e:
        traceback.print_exc()
        report["load"] = {"error": short_err(e, 4000)}
        write_json()
        print(f"load failed: {short_err(e, 800)}", file=sys.stderr)
        return 1
    load["peak_bytes_during_load"] = torch.cuda.max_memory_allocated(dev)
    report["load"] = load
    write_json()

    def run_row(name, run, steps=None):
        """warmup + reps runs of run() -> (tokens, seconds); one result row, errors recorded."""
        row = {"name": name, "tokens_per_s": None, "runs": [], "runs_tokens_per_s": [], "ms_per_step": None,
               "peak_mem_bytes": None, "error": None}
        free_cuda()
        torch.cuda.reset_peak_memory_stats(dev)
        secs_runs = []
        try:
            for r in range(args.warmup + args.reps):
                n, secs = run()
                tps = n / secs
                print(f"  {name}: run {r + 1}/{args.warmup + args.reps}{' (warm-up)' if r < args.warmup else ''}: "
                      f"{tps:.1f} tok/s", file=sys.stderr, flush=True)
                if r >= args.warmup:
                    row["runs"].append(tps)
                    secs_runs.append(secs)
            srt = sorted(row["runs"])
            row["tokens_per_s"] = srt[len(srt) // 2]
            if steps:
                ms = sorted(1000 * s / steps for s in secs_runs)
                row["ms_per_step"] = ms[len(ms) // 2]
                row["runs_ms_per_step"] = [1000 * s / steps for s in secs_runs]
        except Exception as e:
            row["error"] = short_err(e)
            row["oom"] = isinstance(e, torch.cuda.OutOfMemoryError)
            traceback.print_exc()
        row["runs_tokens_per_s"] = list(row["runs"])
        row["peak_mem_bytes"] = torch.cuda.max_memory_allocated(dev)
        row["peak_reserved_bytes"] = torch.cuda.max_memory_reserved(dev)
        free_cuda()
        report["results"].append(row)
        write_json()

    def prefill_run(P):
        ids = torch.tensor([bench_tokens(P, 1, vocab)], dtype=torch.long, device=dev)

        def run():
            with torch.inference_mode():
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
                last = out.logits[:, -1].float().cpu()
                torch.cuda.synchronize()
                secs = time.perf_counter() - t0
            del out, last
            return P, secs
        return run

    def decode_run(B):
        prompts = torch.tensor([bench_tokens(32, i + 2, vocab) for i in range(B)], dtype=torch.long, device=dev)
        steps = torch.tensor([[[(st * 31 + i) % vocab] for i in range(B)] for st in range(args.decode_steps)],
                             dtype=torch.long, device=dev)  # [steps, B, 1], uploaded before timing

        def run():
            with torch.inference_mode():
                out = model(input_ids=prompts, use_cache=True, logits_to_keep=1)
                past = out.past_key_values
                del out
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for st in range(args.decode_steps):
                    out = model(input_ids=steps[st], past_key_values=past, use_cache=True, logits_to_keep=1)
                    past = out.past_key_values
                    greedy = out.logits[:, -1].argmax(dim=-1).cpu()  # ids back to the host, as glmflash
                    del out
                torch.cuda.synchronize()
                secs = time.perf_counter() - t0
            del past, greedy
            return B * args.decode_steps, secs
        return run

    for P in args.prompts:
        run_row(f"prefill {P} tokens", prefill_run(P))
    for B in args.batches:
        run_row(f"decode batch {B}", decode_run(B), steps=args.decode_steps)

    # human table
    gib = lambda b: f"{b / (1 << 30):.2f} GiB" if b is not None else "-"
    print(f"model    {report['model']} ({summary['layers']} layers, hidden {summary['hidden']}, "
          f"{summary['experts']} experts, vocab {vocab})")
    print(f"versions torch {torch.__version__}, transformers {transformers.__version__}; "
          f"device {report['device']['name']}")
    print(f"load     {load.get('path')} via {load.get('model_class')} in {load.get('load_seconds')} s; "
          f"attn {load.get('config_attn_implementation')}, experts {load.get('config_experts_implementation')}; "
          f"smoke {load.get('smoke')}")
    if load.get("fallback_reason"):
        print(f"fallback {load['fallback_reason'][:300]}")
    print(f"weights  {gib(load['weights_bytes_allocated'])} allocated after load; "
          f"missing keys {len(load.get('missing_keys', []))}, unexpected {len(load.get('unexpected_keys', []))}")
    for r in report["results"]:
        if r["error"]:
            print(f"{r['name']:<22} ERROR {r['error'][:200]}")
            continue
        runs = " ".join(f"{x:.1f}" for x in r["runs"])
        step = f"  {r['ms_per_step']:.2f} ms/step" if r["ms_per_step"] is not None else ""
        print(f"{r['name']:<22} {r['tokens_per_s']:10.1f} tokens/s  (median of {len(r['runs'])}; runs [{runs}])"
              f"{step}  peak {gib(r['peak_mem_bytes'])}")
    write_json()
    return 0


if __name__ == "__main__":
    sys.exit(main())
