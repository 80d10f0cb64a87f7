"""PyTorch's AdamW step time on SmolLM2-135M's parameter shapes, the twin of
crates/rlft-train/examples/adamw_bench.rs (same shapes, lr 1e-6, weight decay 0, fixed gradients,
one warm-up step, median [min] of --reps timed steps), to compare ratios in one sitting.

Run: flock /tmp/rlft-bench.lock ~/.cache/rlft/reference/venv/bin/python scripts/reference/adamw_bench.py
"""

import argparse
import statistics
import time

import torch


def shapes():
    h, kv, mlp = 576, 192, 1536
    s = [(49152, h)]
    for _ in range(30):
        s += [(h, h), (kv, h), (kv, h), (h, h), (mlp, h), (mlp, h), (h, mlp), (h,), (h,)]
    s.append((h,))
    return s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    params = []
    for s in shapes():
        p = torch.nn.Parameter(torch.empty(s).uniform_(-0.05, 0.05))
        p.grad = torch.empty(s).uniform_(-1e-3, 1e-3)
        params.append(p)
    n = sum(p.numel() for p in params)
    print(f"torch {torch.__version__} AdamW step, {n / 1e6:.1f}M f32 params in {len(params)} tensors, "
          f"{torch.get_num_threads()} threads, median [min] of {args.reps} steps")
    for name, kw in [("for-loop", dict(foreach=False)), ("fused", dict(fused=True))]:
        opt = torch.optim.AdamW(params, lr=1e-6, weight_decay=0.0, **kw)
        opt.step()
        ts = []
        for _ in range(args.reps):
            t = time.perf_counter()
            opt.step()
            ts.append((time.perf_counter() - t) * 1e3)
        print(f"  torch {name:<9} {statistics.median(ts):8.1f} ms [{min(ts):7.1f}]")
        del opt
    grads = [p.grad for p in params]
    for name, max_norm in [("clip_grad_norm_(1e9)", 1e9), ("clip_grad_norm_(1e-3)", 1e-3)]:
        torch.nn.utils.clip_grad_norm_(params, max_norm)
        ts = []
        for _ in range(args.reps):
            t = time.perf_counter()
            torch.nn.utils.clip_grad_norm_(params, max_norm)
            ts.append((time.perf_counter() - t) * 1e3)
        print(f"  torch {name:<21} {statistics.median(ts):6.1f} ms [{min(ts):7.1f}]")
    del grads


if __name__ == "__main__":
    main()
