"""Golden values for rlft's GRPO maths: TRL's advantage and loss formulas, transcribed into torch.

Writes crates/rlft/tests/data/grpo_loss_golden.json, read by crates/rlft/tests/grpo_golden.rs.

What is transcribed (TRL `GRPOTrainer`, the version installed next to this script; see `meta`):
- advantages, from `_generate_and_score_completions` (`multi_objective_aggregation =
  "sum_then_normalize"`): `(r - group mean) / (std + eps)` with std the group's (`scale_rewards =
  "group"`) or the whole batch's (`"batch"`) unbiased `nanstd`, no division for `"none"`; groups
  of one take std 0 as TRL does for `num_generations == 1`. TRL hard-codes eps = 1e-4; the
  LightRFT-style cases use eps = 1e-9 and clamp |A| <= 10 (verl/LightRFT clamp), and a clamp of 1
  is added to the TRL cases to see it bite. `frac_zero_std` is the fraction of groups whose std
  `isclose`s 0; `trl_frac_reward_zero_std` is what TRL logs (under "batch" it tests the batch std).
- the loss, from `_compute_loss` with `importance_sampling_level = "token"`, no entropy mask, no
  vLLM correction, no `delta`, in train mode: ratio, two-sided clip, `-min(r A, clip(r) A)`, k3
  KL added with weight beta, and the grpo / bnpo / dr_grpo / dapo aggregations, with
  `current_gradient_accumulation_steps = 2`. For dapo, TRL's normaliser
  `num_items_in_batch / num_processes * accumulation_steps / steps_per_generation` is taken
  with one process and `steps_per_generation == accumulation_steps`, i.e. the token count of the
  whole optimiser step; here it is set to 2 * (tokens of this micro-batch) + 3, as if the other
  micro-batch of the step held a few more tokens. num_iterations = 1 means
  `old = logp.detach()`; num_iterations = 2 passes the stored old log-probs. Clip off means
  epsilon = 1e9. Stats are TRL's logged means (`global_masked_mean` on one process).
  Gradients are `d loss / d logp` from autograd.

The case: 3 groups x 4 generations, T = 6 completion positions, ragged masks (one empty row,
lengths 0..6), one group with identical rewards (advantage 0 everywhere), random log-probs drawn
in float32 with a fixed seed (so they are exact in f32 and f64). Everything is computed in
float64; the Rust test checks its f32 loss within 1e-5 and the f64 paths tighter.

Run: flock /tmp/rlft-bench.lock ~/.cache/rlft/reference/venv/bin/python scripts/reference/grpo_loss_golden.py
"""

import json
import os

import torch
import trl

OUT = os.path.join(
    os.path.dirname(__file__), "..", "..", "crates", "rlft", "tests", "data", "grpo_loss_golden.json"
)
TRL_EPS = 1e-4
NUM_GENERATIONS = 4
T = 6
MAX_COMPLETION_LENGTH = 8
ACCUMULATION_STEPS = 2
CLIP_ON = (0.2, 0.28)  # (epsilon_low, epsilon_high): DAPO's clip-higher
CLIP_OFF = (1e9, 1e9)


def nanstd(x, dim=None):
    """TRL's `trl.trainer.utils.nanstd`: Bessel-corrected std ignoring NaNs."""
    mean = torch.nanmean(x, dim=dim, keepdim=True)
    var = torch.nanmean((x - mean) ** 2, dim=dim, keepdim=True)
    # TRL divides int64 counts, which gives torch's default float32; kept in x's dtype here.
    count = torch.sum(~torch.isnan(x), dim=dim, keepdim=True).to(x.dtype)
    corr = torch.where(count > 1, count / (count - 1), torch.full_like(count, float("nan")))
    std = torch.sqrt(var * corr)
    return std.squeeze(dim) if dim is not None else std.squeeze()


def advantages(rewards, g, scale, eps, clamp):
    """TRL's sum_then_normalize branch, with its hard-coded 1e-4 replaced by `eps`, then a clamp."""
    mean_grouped = torch.nanmean(rewards.view(-1, g), dim=1)
    group_std = nanstd(rewards.view(-1, g), dim=1) if g > 1 else torch.zeros_like(mean_grouped)
    mean_rep = mean_grouped.repeat_interleave(g, dim=0)
    if scale in ("group", "none"):
        std = group_std.repeat_interleave(g, dim=0)
    elif scale == "batch":
        std = nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
    else:
        raise ValueError(scale)
    adv = rewards - mean_rep
    if scale != "none":
        adv = adv / (std + eps)
    trl_frac = torch.isclose(std, torch.zeros_like(std)).double().mean().item()
    adv = torch.nan_to_num(adv, nan=0.0)
    if clamp is not None:
        adv = adv.clamp(-clamp, clamp)
    frac = torch.isclose(group_std, torch.zeros_like(group_std)).double().mean().item()
    return {
        "advantages": adv.tolist(),
        "group_mean": mean_grouped.tolist(),
        "group_std": group_std.tolist(),
        "frac_zero_std": frac,
        "trl_frac_reward_zero_std": trl_frac,
    }


def loss(inp, loss_type, eps_low, eps_high, num_iterations, beta):
    """TRL `_compute_loss` from the log-probs on (token-level ratios, train mode)."""
    logp = inp["logp"].clone().requires_grad_(True)
    mask = inp["mask"]
    adv = inp["advantages"].unsqueeze(1)
    old = inp["old_logp"] if num_iterations > 1 else logp.detach()
    coef_1 = torch.exp(logp - old)
    if beta != 0.0:
        ref = inp["ref_logp"]
        per_token_kl = torch.exp(ref - logp) - (ref - logp) - 1
    coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
    per_token_loss = -torch.min(coef_1 * adv, coef_2 * adv)
    if beta != 0.0:
        per_token_loss = per_token_loss + beta * per_token_kl
    k = ACCUMULATION_STEPS
    if loss_type == "grpo":
        out = ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean() / k
    elif loss_type == "bnpo":
        out = (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0) / k
    elif loss_type == "dr_grpo":
        out = (per_token_loss * mask).sum() / (per_token_loss.size(0) * MAX_COMPLETION_LENGTH) / k
    elif loss_type == "dapo":
        out = (per_token_loss * mask).sum() / inp["num_items_in_batch"].clamp(min=1.0)
    else:
        raise ValueError(loss_type)
    out.backward()

    def masked_mean(x):
        return ((x * mask).sum() / mask.sum().clamp(min=1.0)).item()

    low = ((coef_1 < 1 - eps_low) & (adv < 0)).double()
    high = ((coef_1 > 1 + eps_high) & (adv > 0)).double()
    region = ((coef_1 < 1 - eps_low) & (adv < 0) | (coef_1 > 1 + eps_high) & (adv > 0)).double()
    return {
        "loss_type": loss_type,
        "epsilon_low": eps_low,
        "epsilon_high": eps_high,
        "num_iterations": num_iterations,
        "beta": beta,
        "loss": out.item(),
        "grad_logp": logp.grad.tolist(),
        "kl": masked_mean(per_token_kl.detach()) if beta != 0.0 else None,
        "clip_low": masked_mean(low),
        "clip_high": masked_mean(high),
        "clip_region": masked_mean(region),
        "tokens": mask.sum().item(),
    }


def main():
    torch.manual_seed(0)
    f64 = torch.float64
    # Rewards: group 0 varied, group 1 identical (no signal), group 2 on a large scale (so the
    # LightRFT clamp of 10 bites under scale "none").
    rewards = torch.tensor([1.0, 0.0, 0.5, 1.0, 2.0, 2.0, 2.0, 2.0, 0.0, 5.0, 20.0, 31.0], dtype=f64)
    near = torch.tensor([0.5, 0.5, 0.5, 0.5 + 1e-6, 1.0, 0.0, 0.0, 0.0], dtype=f64)
    singles = torch.tensor([1.0, 2.0, 5.0], dtype=f64)
    adv_cases = []
    for scale in ("group", "batch", "none"):
        for name, eps, clamp in (("trl", TRL_EPS, None), ("trl_clamp1", TRL_EPS, 1.0), ("lightrft", 1e-9, 10.0)):
            adv_cases.append(("main_" + name, rewards, NUM_GENERATIONS, scale, eps, clamp))
        # A group with a tiny spread: eps 1e-4 damps it, eps 1e-9 standardises it fully.
        adv_cases.append(("near_identical_trl", near, 4, scale, TRL_EPS, None))
        adv_cases.append(("near_identical_lightrft", near, 4, scale, 1e-9, 10.0))
        adv_cases.append(("groups_of_one", singles, 1, scale, TRL_EPS, None))
    out_adv = []
    for name, r, g, scale, eps, clamp in adv_cases:
        case = {"name": name, "rewards": r.tolist(), "group_size": g, "scale": scale, "epsilon": eps, "clamp": clamp}
        case.update(advantages(r, g, scale, eps, clamp))
        out_adv.append(case)

    n = rewards.numel()
    lengths = torch.tensor([6, 4, 1, 5, 0, 3, 6, 2, 6, 5, 3, 4])
    mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).to(f64)
    logp = (torch.rand(n, T) * -4.0 - 0.01).to(torch.float32)
    old = (logp + (torch.rand(n, T) - 0.5)).to(torch.float32)
    ref = (logp + (torch.rand(n, T) * 2.0 - 1.0)).to(torch.float32)
    adv = torch.tensor(advantages(rewards, NUM_GENERATIONS, "group", TRL_EPS, None)["advantages"])
    adv = adv.to(torch.float32)  # what the trainer hands the loss
    inp = {
        "logp": logp.to(f64),
        "old_logp": old.to(f64),
        "ref_logp": ref.to(f64),
        "advantages": adv.to(f64),
        "mask": mask,
        "num_items_in_batch": torch.tensor(2.0 * mask.sum().item() + 3.0, dtype=f64),
    }
    out_loss = []
    for loss_type in ("grpo", "bnpo", "dr_grpo", "dapo"):
        for eps_low, eps_high in (CLIP_ON, CLIP_OFF):
            for num_iterations in (1, 2):
                for beta in (0.0, 0.04):
                    out_loss.append(loss(inp, loss_type, eps_low, eps_high, num_iterations, beta))
    clipped = [c for c in out_loss if c["num_iterations"] == 2 and c["epsilon_low"] < 1]
    assert all(c["clip_low"] > 0 and c["clip_high"] > 0 for c in clipped), "the case should clip both sides"

    doc = {
        "meta": {
            "script": "scripts/reference/grpo_loss_golden.py",
            "trl": trl.__version__,
            "torch": torch.__version__,
            "dtype": "float64 (inputs exact in float32)",
            "max_completion_length": MAX_COMPLETION_LENGTH,
            "accumulation_steps": ACCUMULATION_STEPS,
        },
        "advantage_cases": out_adv,
        "loss_inputs": {
            "n": n,
            "t": T,
            "logp": inp["logp"].tolist(),
            "old_logp": inp["old_logp"].tolist(),
            "ref_logp": inp["ref_logp"].tolist(),
            "advantages": inp["advantages"].tolist(),
            "mask": mask.tolist(),
            "num_items_in_batch": inp["num_items_in_batch"].item(),
            "max_completion_length": MAX_COMPLETION_LENGTH,
            "accumulation_steps": ACCUMULATION_STEPS,
        },
        "loss_cases": out_loss,
    }
    with open(OUT, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"wrote {os.path.normpath(OUT)} ({os.path.getsize(OUT)} bytes): "
          f"{len(out_adv)} advantage cases, {len(out_loss)} loss cases")


if __name__ == "__main__":
    main()
