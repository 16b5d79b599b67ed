"""Re-run a fixture's reference cases in float64 with transformers (the "exact" answer).

Usage: python3 exact.py FIXTURE_DIR OUT.safetensors

FIXTURE_DIR holds checkpoint/ and reference.safetensors (testdata/glm5next-tiny-*). The same
inputs are run twice on the CPU: in float32 (a check that this transformers reproduces the
committed reference) and in float64. OUT gets the float64 results under the reference's tensor
names (stored as float64), so the engine's error and the float32 reference's own error can both be
measured against it. Prints, per tensor, max |fp32 rerun - reference| and max |reference - fp64|.
"""
import sys
import torch
from safetensors.torch import load_file, save_file
from transformers.models.glm5_next import modeling_glm5_next as M

torch.use_deterministic_algorithms(True)


def load(ck, dtype):
    kw = dict(torch_dtype=torch.float32, attn_implementation="eager")
    if dtype == torch.float64:  # grouped_mm takes no float64
        kw["experts_implementation"] = "eager"
    m = M.Glm5NextForConditionalGeneration.from_pretrained(ck, **kw)
    m = m.to(dtype).eval()
    return m


@torch.no_grad()
def run(model, ref):
    out = {}
    text = model.model.language_model
    names = sorted({k.rsplit(".", 1)[0] for k in ref if k.endswith("input_ids")})
    for key in names:
        ids = ref[key + ".input_ids"].view(1, -1)
        if key.startswith("prefill"):
            hs = []
            hooks = [l.register_forward_hook(lambda m, i, o: hs.append(o[0].detach().clone())) for l in text.layers]
            logits = model(input_ids=ids, use_cache=False).logits
            for h in hooks:
                h.remove()
            out[key + ".logits"] = logits[0]
            for li, h in enumerate(hs):
                out[key + f".hidden.{li}"] = h[0]
        elif key.startswith("decode"):
            toks = ref[key + ".greedy_tokens"]
            o = model(input_ids=ids, use_cache=True)
            past, steps = o.past_key_values, [o.logits[0, -1]]
            for t in toks:  # the reference's trajectory, as the engine's eval follows it
                o = model(input_ids=t.view(1, 1), past_key_values=past, use_cache=True)
                past = o.past_key_values
                steps.append(o.logits[0, -1])
            out[key + ".step_logits"] = torch.stack(steps)
        elif key.startswith("extend"):
            n1 = int(ref[key + ".split"][0])
            o1 = model(input_ids=ids[:, :n1], use_cache=True)
            o2 = model(input_ids=ids[:, n1:], past_key_values=o1.past_key_values, use_cache=True)
            out[key + ".logits_first"] = o1.logits[0]
            out[key + ".logits_second"] = o2.logits[0]
    return out


def main():
    d, dst = sys.argv[1], sys.argv[2]
    ref = load_file(d + "/reference.safetensors")
    r32 = run(load(d + "/checkpoint", torch.float32), ref)
    r64 = run(load(d + "/checkpoint", torch.float64), ref)
    for k in sorted(r64):
        a = ref[k].double()
        print(f"{k:28s} rerun32-ref {float((r32[k].double()-a).abs().max()):.2e}  ref-fp64 {float((a-r64[k]).abs().max()):.2e}")
    save_file({k: v.contiguous().to(torch.float64) for k, v in r64.items()}, dst)


if __name__ == "__main__":
    main()
