"""Golden values for rlft-train's LR schedules: transformers' `get_scheduler` (LambdaLR).

Writes crates/rlft-train/tests/golden/lr_schedules.json: for each case (schedule name, base lr,
total steps, warmup given as a transformers `warmup_steps` value, i.e. a step count if >= 1 and a
ratio of the total if < 1, and scheduler kwargs), the warmup step count transformers derives
(`TrainingArguments.get_warmup_steps`: `int(w)` if w >= 1 else `ceil(total * w)`) and the lr in
force at optimizer steps 0..total+2 (`get_last_lr()` before each `optimizer.step()`;
`scheduler.step()` after it, as the Trainer does). Steps past the end pin what happens if a run
overshoots (linear clamps at 0, cosine turns back up).

rlft's `constant` honours the warmup, i.e. it is transformers' `constant_with_warmup` (transformers'
own `constant` silently ignores `warmup_steps`; the two agree when the warmup is 0), so the cases
named `constant` here are computed with `constant_with_warmup`.

Run: flock /tmp/rlft-bench.lock ~/.cache/rlft/reference/venv/bin/python scripts/reference/lr_schedules_golden.py
"""

import json
import os
from types import SimpleNamespace

import torch
import transformers
from transformers import TrainingArguments, get_scheduler

CASES = [
    # (name, base_lr, total, warmup, kwargs)
    ("constant", 1e-3, 10, 0, {}),
    ("constant", 5e-6, 10, 3, {}),
    ("constant", 2e-5, 17, 0.1, {}),
    ("linear", 1e-3, 10, 0, {}),
    ("linear", 3e-4, 20, 5, {}),
    ("linear", 1e-6, 37, 0.05, {}),
    ("linear", 1e-4, 8, 0.5, {}),
    ("cosine", 1e-3, 10, 0, {}),
    ("cosine", 3e-4, 25, 4, {}),
    ("cosine", 1e-6, 100, 0.1, {}),
    ("cosine", 7e-5, 13, 0.3, {}),
    ("cosine_with_min_lr", 1e-3, 10, 0, {"min_lr_rate": 0.1}),
    ("cosine_with_min_lr", 3e-4, 30, 0.1, {"min_lr_rate": 0.05}),
    ("cosine_with_min_lr", 1e-5, 12, 2, {"min_lr_rate": 0.5}),
]


def warmup_steps(w, total):
    return TrainingArguments.get_warmup_steps(SimpleNamespace(warmup_steps=w), total)


def main():
    out_cases = []
    for name, base_lr, total, warmup, kwargs in CASES:
        nw = warmup_steps(warmup, total)
        p = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.SGD([p], lr=base_lr)
        hf_name = "constant_with_warmup" if name == "constant" else name
        sched = get_scheduler(
            hf_name,
            opt,
            num_warmup_steps=nw,
            num_training_steps=total,
            scheduler_specific_kwargs=kwargs or None,
        )
        lrs = []
        for _ in range(total + 3):
            lrs.append(sched.get_last_lr()[0])
            opt.step()
            sched.step()
        out_cases.append(
            {
                "schedule": name,
                "transformers_name": hf_name,
                "base_lr": base_lr,
                "total_steps": total,
                "warmup": warmup,
                "warmup_steps": nw,
                "kwargs": kwargs,
                "lrs": lrs,
            }
        )
    out = {"transformers_version": transformers.__version__, "cases": out_cases}
    path = os.path.join(os.path.dirname(__file__), "../../crates/rlft-train/tests/golden/lr_schedules.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print("wrote", os.path.normpath(path))


if __name__ == "__main__":
    main()
