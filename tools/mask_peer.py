"""The peer of glmflash's device logits mask: applying a packed allow
bitmask (one bit per token id, int32 words, as xgrammar and vLLM do) to a
[rows, vocab] logits tensor on the GPU with PyTorch, and with xgrammar's
kernel where it is installed. Prints microseconds per application (CUDA
events, median of runs). Run on the GPU machine:
  /opt/torch/.venv/bin/python tools/mask_peer.py
"""
import statistics

import torch

V = 154880
W = (V + 31) // 32


def timed(fn, reps=50):
    for _ in range(5):
        fn()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) * 1000)
    return statistics.median(ts)


def main():
    dev = torch.device("cuda")
    shifts = torch.arange(32, device=dev, dtype=torch.int32)
    for rows in (1, 8, 64):
        logits = torch.randn(rows, V, device=dev, dtype=torch.float32)
        mask = torch.randint(-(2**31), 2**31 - 1, (rows, W), device=dev, dtype=torch.int32)
        host = mask.cpu().pin_memory()

        def torch_apply():
            bits = ((mask.unsqueeze(-1) >> shifts) & 1).view(rows, -1)[:, :V].bool()
            logits.masked_fill_(~bits, float("-inf"))

        def upload_and_apply():
            mask.copy_(host, non_blocking=True)
            torch_apply()

        print(f"torch bitmask apply rows={rows}: {timed(torch_apply):.1f} us; with the mask's upload from pinned memory: {timed(upload_and_apply):.1f} us")
        try:
            import xgrammar

            def xg():
                xgrammar.apply_token_bitmask_inplace(logits, mask)

            print(f"xgrammar.apply_token_bitmask_inplace rows={rows}: {timed(xg):.1f} us")
        except Exception as e:  # not installed here
            if rows == 1:
                print(f"xgrammar: not available ({type(e).__name__}: {e})")


if __name__ == "__main__":
    main()
