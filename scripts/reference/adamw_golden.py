"""Golden values for rlft-train's AdamW: torch.optim.AdamW on a small fixed parameter set.

Writes crates/rlft-train/tests/golden/adamw.json:
- three float32 tensors `w1` [4, 3], `b1` [5], `w2` [2, 3, 2] with values
  `init[name][i] = scale * sin(0.37 * i + phase)` (flattened, row-major);
- two param groups: group 0 = [w1, w2], weight_decay 0.1, lr = lr_t;
  group 1 = [b1], weight_decay 0.0, lr = 0.5 * lr_t (lr multiplier 0.5);
- betas (0.9, 0.95), eps 1e-8, 6 steps with lr_t = 0.01 * (1 + 0.25 * t) for t = 0..5;
- the gradient of step t is `g[name][i] = sin(0.1 * i + t + phase_g) * 0.5 + 0.05 * t` computed in
  float32 and stored (exactly, as the float64 value of each float32) so Rust needs no formula;
  at step 3 `b1` has no gradient (PyTorch skips it and does not advance its step count);
- after each step every parameter (float32 values as float64), and after the last step the
  optimizer state: per parameter (PyTorch's index order) `step`, `exp_avg`, `exp_avg_sq`.

Run: flock /tmp/rlft-bench.lock ~/.cache/rlft/reference/venv/bin/python scripts/reference/adamw_golden.py
"""

import json
import math
import os

import torch

torch.manual_seed(0)
torch.set_num_threads(1)

SHAPES = {"w1": [4, 3], "b1": [5], "w2": [2, 3, 2]}
INIT = {"w1": (0.8, 0.1), "b1": (0.3, 1.3), "w2": (1.5, -0.7)}  # (scale, phase)
GRAD_PHASE = {"w1": 0.0, "b1": 0.5, "w2": 2.0}
BETAS = (0.9, 0.95)
EPS = 1e-8
STEPS = 6
GROUPS = [
    {"params": ["w1", "w2"], "weight_decay": 0.1, "lr_mult": 1.0},
    {"params": ["b1"], "weight_decay": 0.0, "lr_mult": 0.5},
]


def numel(shape):
    return math.prod(shape)


def lr_at(t):
    return 0.01 * (1.0 + 0.25 * t)


def grad_values(name, t):
    n = numel(SHAPES[name])
    i = torch.arange(n, dtype=torch.float32)
    return torch.sin(0.1 * i + t + GRAD_PHASE[name]) * 0.5 + 0.05 * t


def main():
    params = {}
    for name, shape in SHAPES.items():
        scale, phase = INIT[name]
        i = torch.arange(numel(shape), dtype=torch.float32)
        params[name] = torch.nn.Parameter((scale * torch.sin(0.37 * i + phase)).reshape(shape))
    init = {name: p.detach().flatten().tolist() for name, p in params.items()}

    groups = [
        {"params": [params[n] for n in g["params"]], "weight_decay": g["weight_decay"], "lr": lr_at(0) * g["lr_mult"]}
        for g in GROUPS
    ]
    opt = torch.optim.AdamW(groups, lr=lr_at(0), betas=BETAS, eps=EPS, foreach=False)

    steps = []
    for t in range(STEPS):
        for g, spec in zip(opt.param_groups, GROUPS):
            g["lr"] = lr_at(t) * spec["lr_mult"]
        grads = {}
        for name, p in params.items():
            if t == 3 and name == "b1":
                p.grad = None
                grads[name] = None
            else:
                g = grad_values(name, t)
                p.grad = g.reshape(SHAPES[name]).clone()
                grads[name] = g.tolist()
        opt.step()
        steps.append(
            {
                "lr": lr_at(t),
                "grads": grads,
                "params": {name: p.detach().flatten().tolist() for name, p in params.items()},
            }
        )

    # The fused CPU kernel must agree with the single-tensor one we record.
    fused = {name: torch.nn.Parameter(torch.tensor(init[name]).reshape(SHAPES[name])) for name in SHAPES}
    fgroups = [
        {"params": [fused[n] for n in g["params"]], "weight_decay": g["weight_decay"], "lr": lr_at(0) * g["lr_mult"]}
        for g in GROUPS
    ]
    fopt = torch.optim.AdamW(fgroups, lr=lr_at(0), betas=BETAS, eps=EPS, fused=True)
    for t, rec in enumerate(steps):
        for g, spec in zip(fopt.param_groups, GROUPS):
            g["lr"] = lr_at(t) * spec["lr_mult"]
        for name, p in fused.items():
            gv = rec["grads"][name]
            p.grad = None if gv is None else torch.tensor(gv, dtype=torch.float32).reshape(SHAPES[name])
        fopt.step()
    for name in SHAPES:
        diff = (fused[name].detach() - params[name].detach()).abs().max().item()
        assert diff < 1e-6, (name, diff)

    order = [n for g in GROUPS for n in g["params"]]
    sd = opt.state_dict()["state"]
    state = {
        str(idx): {
            "param": name,
            "step": float(sd[idx]["step"]),
            "exp_avg": sd[idx]["exp_avg"].flatten().tolist(),
            "exp_avg_sq": sd[idx]["exp_avg_sq"].flatten().tolist(),
        }
        for idx, name in enumerate(order)
    }

    out = {
        "torch_version": torch.__version__,
        "betas": list(BETAS),
        "eps": EPS,
        "groups": GROUPS,
        "shapes": SHAPES,
        "init": init,
        "steps": steps,
        "final_state": state,
    }
    path = os.path.join(os.path.dirname(__file__), "../../crates/rlft-train/tests/golden/adamw.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print("wrote", os.path.normpath(path))


if __name__ == "__main__":
    main()
