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
- advantages from several reward functions with `None` (NaN) rewards (`multi_reward_cases`):
  TRL 1.16 `grpo_trainer.py:2756-2810` as is, both `multi_objective_aggregation`s, every
  `scale_rewards`, with unscorable rows (every function None), a group with no scored row and
  one with a single scored row; TRL's hard-coded 1e-4 is `eps`, a clamp is added after as above.
  `group_mean` / `group_std` / `frac_zero_std` are rlft's per-group statistics of the weighted
  totals (`nansum`, unscorable rows NaN); NaN is written as null.
- the loss, from TRL 1.16 `_compute_loss` (`grpo_trainer.py:3020-3290`), no vLLM correction, no
  off-policy mask, no entropy bonus, in train mode: the ratio per token or per sequence
  (`importance_sampling_level`, :3083-3095), the k3 KL optionally times the ratio
  (`use_bias_correction_kl`, :3098-3105), the policy term of `loss_type` (clipped with the
  `delta` cap, :3112-3120; cispo, :3109-3111; sapo, :3121-3124), the high-entropy mask
  (`get_high_entropy_mask`, :1380-1417, applied at :3143-3144), the KL added with weight beta
  (:3149-3150), and the grpo / bnpo / dr_grpo / dapo / cispo / sapo aggregations (:3153-3176),
  with `current_gradient_accumulation_steps = 2`. The first 32 cases (token level, no delta, no
  mask, no bias correction) predate TRL 1.16's options and are unchanged. For dapo, TRL's normaliser
  `num_items_in_batch / num_processes * accumulation_steps / steps_per_generation` is taken
  with one process and `steps_per_generation == accumulation_steps`, i.e. the token count of the
  whole optimiser step; here it is set to 2 * (tokens of this micro-batch) + 3, as if the other
  micro-batch of the step held a few more tokens. num_iterations = 1 means
  `old = logp.detach()`; num_iterations = 2 passes the stored old log-probs. Clip off means
  epsilon = 1e9. Stats are TRL's logged means (`global_masked_mean` on one process, :3259:
  over the rows for a `(B, 1)` sequence-level ratio). Gradients are `d loss / d logp` from
  autograd.
- `quantile_cases`: `torch.quantile` of float32 values (the entropy threshold), to pin rlft's
  f32 transcription of it bit for bit.

The case: 3 groups x 4 generations, T = 6 completion positions, ragged masks (one empty row,
lengths 0..6), one group with identical rewards (advantage 0 everywhere), random log-probs and
entropies drawn in float32 with a fixed seed (so they are exact in f32 and f64). Everything is computed in
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


def high_entropy_mask(entropies, mask, threshold):
    """TRL 1.16 `GRPOTrainer.get_high_entropy_mask` (grpo_trainer.py:1380-1417), one process."""
    local = entropies[mask.bool()].float()
    if local.numel() == 0:
        return torch.zeros_like(entropies, dtype=torch.bool)
    entropy_threshold = torch.quantile(local, threshold)
    masked_entropies = entropies * mask.float()
    entropy_mask = masked_entropies >= entropy_threshold
    return entropy_mask & mask.bool()


def loss_case(loss_type, eps_low, eps_high, num_iterations, beta, level="token", delta=None,
              top_entropy_quantile=1.0, use_bias_correction_kl=False, sapo_pos=1.0, sapo_neg=1.05):
    return {
        "loss_type": loss_type,
        "epsilon_low": eps_low,
        "epsilon_high": eps_high,
        "num_iterations": num_iterations,
        "beta": beta,
        "importance_sampling_level": level,
        "delta": delta,
        "top_entropy_quantile": top_entropy_quantile,
        "use_bias_correction_kl": use_bias_correction_kl,
        "sapo_temperature_pos": sapo_pos,
        "sapo_temperature_neg": sapo_neg,
    }


def loss(inp, c):
    """TRL 1.16 `_compute_loss` (grpo_trainer.py:3020-3290) from the log-probs on, train mode."""
    logp = inp["logp"].clone().requires_grad_(True)
    mask = inp["mask"]
    entropies = inp["entropies"]
    loss_type, beta = c["loss_type"], c["beta"]
    eps_low, eps_high = c["epsilon_low"], c["epsilon_high"]
    # :3049-3052
    if c["top_entropy_quantile"] < 1.0:
        entropy_mask = high_entropy_mask(entropies, mask, 1 - c["top_entropy_quantile"])
    else:
        entropy_mask = None
    adv = inp["advantages"].unsqueeze(1)
    old = inp["old_logp"] if c["num_iterations"] > 1 else logp.detach()
    # :3083-3095
    log_ratio = logp - old
    if c["importance_sampling_level"] == "token":
        log_importance_weights = log_ratio
    elif c["importance_sampling_level"] == "sequence":
        log_importance_weights = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        log_importance_weights = log_importance_weights.unsqueeze(-1)
    else:
        raise ValueError(c["importance_sampling_level"])
    coef_1 = torch.exp(log_importance_weights)
    # :3098-3105
    if beta != 0.0:
        ref = inp["ref_logp"]
        per_token_kl = torch.exp(ref - logp) - (ref - logp) - 1
        if c["use_bias_correction_kl"]:
            per_token_kl = per_token_kl * coef_1
    # :3109-3124
    if loss_type == "cispo":
        clamped_ratios = torch.clamp(coef_1, max=eps_high).detach()
        per_token_loss = -clamped_ratios * adv * logp
    elif loss_type in ("grpo", "bnpo", "dr_grpo", "dapo"):
        coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
        if c["delta"] is not None:
            coef_1 = torch.clamp(coef_1, max=c["delta"])
        per_token_loss = -torch.min(coef_1 * adv, coef_2 * adv)
    elif loss_type == "sapo":
        # TRL passes the temperatures as Python floats, which torch.where makes float32 tensors;
        # here they take the inputs' dtype so that the float64 golden is not rounded to f32
        # (in training both are float32 and the two agree).
        pos = torch.tensor(c["sapo_temperature_pos"], dtype=adv.dtype)
        neg = torch.tensor(c["sapo_temperature_neg"], dtype=adv.dtype)
        temperatures = torch.where(adv > 0, pos, neg)
        soft_coef_1 = torch.sigmoid(temperatures * (coef_1 - 1)) * 4 / temperatures
        per_token_loss = -soft_coef_1 * adv
    else:
        raise ValueError(loss_type)
    # :3143-3150
    if entropy_mask is not None:
        per_token_loss = per_token_loss * entropy_mask
    if beta != 0.0:
        per_token_loss = per_token_loss + beta * per_token_kl
    # :3153-3176
    k = ACCUMULATION_STEPS
    if loss_type in ("grpo", "sapo"):
        out = ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean() / k
    elif loss_type == "bnpo":
        out = (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0) / k
    elif loss_type == "dr_grpo":
        out = (per_token_loss * mask).sum() / (per_token_loss.size(0) * MAX_COMPLETION_LENGTH) / k
    elif loss_type in ("cispo", "dapo"):
        # num_items_in_batch / num_processes * accumulation_steps / steps_per_generation, with
        # one process and steps_per_generation == accumulation_steps.
        out = (per_token_loss * mask).sum() / inp["num_items_in_batch"].clamp(min=1.0)
    out.backward()

    # :3259-3265
    def global_masked_mean(x):
        if x.shape[1] == 1:
            local_sum, local_count = x.sum(), torch.tensor(float(x.shape[0]), dtype=x.dtype)
        else:
            local_sum, local_count = (x * mask).sum(), mask.sum()
        return (local_sum / local_count.clamp(min=1.0)).item()

    out_case = dict(c)
    out_case.update({
        "loss": out.item(),
        "grad_logp": logp.grad.tolist(),
        "kl": global_masked_mean(per_token_kl.detach()) if beta != 0.0 else None,
        "clip_low": None,
        "clip_high": None,
        "clip_region": None,
        "cispo_clip_ratio": None,
        "tokens": mask.sum().item(),
    })
    coef_1 = coef_1.detach()
    # :3272-3286
    if loss_type in ("grpo", "bnpo", "dr_grpo", "dapo"):
        is_low_clipped = (coef_1 < 1 - eps_low) & (adv < 0)
        is_high_clipped = (coef_1 > 1 + eps_high) & (adv > 0)
        is_region_clipped = is_low_clipped | is_high_clipped
        out_case["clip_low"] = global_masked_mean(is_low_clipped.double())
        out_case["clip_high"] = global_masked_mean(is_high_clipped.double())
        out_case["clip_region"] = global_masked_mean(is_region_clipped.double())
    elif loss_type == "cispo":
        is_cispo_clipped = (coef_1 > eps_high) & (adv > 0)
        out_case["cispo_clip_ratio"] = global_masked_mean(is_cispo_clipped.double())
    if entropy_mask is not None:
        out_case["entropy_mask_kept"] = int(entropy_mask.sum().item())
    return out_case


def loss_cases():
    """The old 32 cases (TRL's token-level loss), then TRL 1.16's options."""
    cases = []
    for loss_type in ("grpo", "bnpo", "dr_grpo", "dapo"):
        for eps_low, eps_high in (CLIP_ON, CLIP_OFF):
            for num_iterations in (1, 2):
                for beta in (0.0, 0.04):
                    cases.append(loss_case(loss_type, eps_low, eps_high, num_iterations, beta))
    lo, hi = CLIP_ON
    # GSPO: sequence-level ratios.
    cases.append(loss_case("grpo", lo, hi, 1, 0.0, level="sequence"))
    for loss_type in ("grpo", "bnpo", "dr_grpo", "dapo"):
        for beta in (0.0, 0.04):
            cases.append(loss_case(loss_type, lo, hi, 2, beta, level="sequence",
                                   use_bias_correction_kl=beta != 0.0))
    # Two-sided clipping: delta above and below 1 + epsilon_high.
    for delta in (1.3, 1.1):
        for loss_type in ("grpo", "dapo"):
            for level in ("token", "sequence"):
                cases.append(loss_case(loss_type, lo, hi, 2, 0.0, level=level, delta=delta))
    # CISPO: epsilon_high is the cap of the ratio (5.0 recommended; 1.2 bites here).
    cases.append(loss_case("cispo", lo, 5.0, 1, 0.0))
    for eps_max in (5.0, 1.2):
        for level in ("token", "sequence"):
            for beta in (0.0, 0.04):
                cases.append(loss_case("cispo", lo, eps_max, 2, beta, level=level,
                                       use_bias_correction_kl=beta != 0.0))
    # SAPO: TRL's temperatures and others.
    cases.append(loss_case("sapo", lo, hi, 1, 0.0))
    for pos, neg in ((1.0, 1.05), (2.0, 0.5)):
        for level in ("token", "sequence"):
            for beta in (0.0, 0.04):
                cases.append(loss_case("sapo", lo, hi, 2, beta, level=level,
                                       use_bias_correction_kl=beta != 0.0, sapo_pos=pos, sapo_neg=neg))
    # The high-entropy mask.
    for q in (0.2, 0.0, 0.5):
        for loss_type, eps_high in (("grpo", hi), ("dapo", hi), ("cispo", 5.0), ("sapo", hi)):
            cases.append(loss_case(loss_type, lo, eps_high, 2, 0.04, top_entropy_quantile=q,
                                   use_bias_correction_kl=True))
    cases.append(loss_case("grpo", lo, hi, 2, 0.0, level="sequence", top_entropy_quantile=0.2))
    # The KL's bias correction at token level (on- and off-policy).
    for loss_type in ("grpo", "dapo"):
        for num_iterations in (1, 2):
            cases.append(loss_case(loss_type, lo, hi, num_iterations, 0.04, use_bias_correction_kl=True))
    return cases


def nan_to_none(xs):
    return [None if x != x else x for x in xs]


def multi_reward_advantages(rewards_per_func, weights, g, agg, scale, eps, clamp):
    """TRL 1.16 grpo_trainer.py:2756-2810 with its 1e-4 replaced by `eps`, then a clamp."""
    unscorable_mask = torch.isnan(rewards_per_func).all(dim=1)
    if agg == "sum_then_normalize":
        rewards = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)
        rewards[unscorable_mask] = torch.nan
        mean_grouped_rewards = torch.nanmean(rewards.view(-1, g), dim=1)
        mean_grouped_rewards = mean_grouped_rewards.repeat_interleave(g, dim=0)
        if scale in ("group", "none"):
            if g > 1:
                std_rewards = nanstd(rewards.view(-1, g), dim=1)
                std_rewards = std_rewards.repeat_interleave(g, dim=0)
            else:
                std_rewards = torch.zeros_like(rewards)
        elif scale == "batch":
            if rewards.numel() > 1:
                std_rewards = nanstd(rewards).expand_as(rewards)
            else:
                std_rewards = torch.zeros_like(rewards)
        advantages = rewards - mean_grouped_rewards
        if scale != "none":
            advantages = advantages / (std_rewards + eps)
    elif agg == "normalize_then_sum":
        k = rewards_per_func.shape[1]
        grouped = rewards_per_func.view(-1, g, k)
        mean_k = torch.nanmean(grouped, dim=1, keepdim=True)
        std_k = nanstd(grouped, dim=1).unsqueeze(1) if g > 1 else torch.zeros_like(mean_k)
        reward_k = (grouped - mean_k) / (std_k + eps)
        reward_k = reward_k.view(-1, k)
        rewards = (reward_k * weights.unsqueeze(0)).nansum(dim=1)
        rewards[unscorable_mask] = torch.nan
        std_rewards = nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
        advantages = (rewards - torch.nanmean(rewards)) / (std_rewards + eps)
    else:
        raise ValueError(agg)
    advantages = torch.nan_to_num(advantages, nan=0.0)
    if clamp is not None:
        advantages = advantages.clamp(-clamp, clamp)
    # rlft's per-group statistics of the weighted totals (TRL's logged `rewards`, :2826-2827).
    totals = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)
    totals[unscorable_mask] = torch.nan
    group_mean = torch.nanmean(totals.view(-1, g), dim=1)
    group_std = nanstd(totals.view(-1, g), dim=1) if g > 1 else torch.zeros_like(group_mean)
    frac = torch.isclose(group_std, torch.zeros_like(group_std)).double().mean().item()
    return {
        "advantages": advantages.tolist(),
        "group_mean": nan_to_none(group_mean.tolist()),
        "group_std": nan_to_none(group_std.tolist()),
        "frac_zero_std": frac,
    }


def multi_reward_cases():
    nan = float("nan")
    f64 = torch.float64
    # 2 functions x 4 groups of 4: group 0 scored (f2 missing once), group 1 unscorable, group 2
    # one scored row, group 3 one unscorable row and one f1-only row.
    f1 = [1.0, 0.0, 1.0, 0.5, nan, nan, nan, nan, 0.3, nan, nan, nan, 1.0, nan, 0.0, 0.25]
    f2 = [3.0, nan, -1.0, 7.0, nan, nan, nan, nan, nan, nan, nan, nan, 2.0, nan, -4.0, nan]
    two = torch.tensor([f1, f2], dtype=f64).T.contiguous()
    # One external function answering null for some rows; groups of 2 (one all-null group).
    one = torch.tensor([[0.5], [nan], [1.0], [0.0], [nan], [nan], [0.2], [0.9]], dtype=f64)
    # Nothing missing, to tie the multi-reward path to the single-reward one.
    full = torch.tensor([[1.0, 2.0], [0.0, 0.5], [0.5, 9.0], [1.0, 1.0], [2.0, 3.0], [2.0, 3.0]], dtype=f64)
    inputs = [
        ("two_functions_with_none", two, [1.0, 0.5], 4),
        ("one_function_with_null", one, [1.0], 2),
        ("two_functions_all_scored", full, [1.0, 2.0], 3),
        ("groups_of_one", two[:6], [1.0, 0.5], 1),
    ]
    out = []
    for name, r, w, g in inputs:
        weights = torch.tensor(w, dtype=f64)
        settings = [("sum_then_normalize", s) for s in ("group", "batch", "none")]
        settings.append(("normalize_then_sum", "group"))
        for agg, scale in settings:
            for clamp in (None, 1.0):
                case = {"name": name, "rewards_per_func": [nan_to_none(col) for col in r.T.tolist()],
                        "weights": w, "group_size": g, "aggregation": agg, "scale": scale,
                        "epsilon": TRL_EPS, "clamp": clamp}
                case.update(multi_reward_advantages(r, weights, g, agg, scale, TRL_EPS, clamp))
                out.append(case)
    return out


def quantile_cases():
    gen = torch.Generator().manual_seed(1)
    out = []
    qs = [0.0, 0.2, 0.5, 0.8, 0.9, 1.0, 1 - 0.2, 1 - 0.9, 1 - 0.7]
    for n in (1, 2, 5, 46, 100, 257):
        values = (torch.rand(n, generator=gen) * 3.0).to(torch.float32)
        quantiles = [torch.quantile(values, q).item() for q in qs]
        out.append({"values": values.tolist(), "qs": qs, "quantiles": quantiles})
    return out


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
    # Drawn after the others, so that the old cases' inputs stay what they were.
    entropies = (torch.rand(n, T) * 3.0).to(torch.float32)
    adv = torch.tensor(advantages(rewards, NUM_GENERATIONS, "group", TRL_EPS, None)["advantages"])
    adv = adv.to(torch.float32)  # what the trainer hands the loss
    inp = {
        "logp": logp.to(f64),
        "old_logp": old.to(f64),
        "ref_logp": ref.to(f64),
        "advantages": adv.to(f64),
        "mask": mask,
        "entropies": entropies.to(f64),
        "num_items_in_batch": torch.tensor(2.0 * mask.sum().item() + 3.0, dtype=f64),
    }
    out_loss = [loss(inp, c) for c in loss_cases()]
    clipped = [c for c in out_loss if c["num_iterations"] == 2 and c["epsilon_low"] < 1
               and c["clip_low"] is not None and c["importance_sampling_level"] == "token"
               and c["delta"] is None]
    assert all(c["clip_low"] > 0 and c["clip_high"] > 0 for c in clipped), "the case should clip both sides"
    assert any(c["cispo_clip_ratio"] for c in out_loss), "some cispo case should cap its weight"
    for c in out_loss:
        if c["delta"] is not None and c["importance_sampling_level"] == "token":
            plain = loss(inp, dict(c, delta=None))
            assert plain["loss"] != c["loss"], f"delta = {c['delta']} should change the loss"
    # The entropy threshold must not sit within float rounding of a kept entropy.
    active = inp["entropies"][mask.bool()]
    for q in (0.2, 0.0, 0.5):
        thr = torch.quantile(active.float(), 1 - q).item()
        gap = (active - thr).abs().min().item()
        assert gap == 0.0 or gap > 1e-6, (q, gap)

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
            "entropies": inp["entropies"].tolist(),
            "num_items_in_batch": inp["num_items_in_batch"].item(),
            "max_completion_length": MAX_COMPLETION_LENGTH,
            "accumulation_steps": ACCUMULATION_STEPS,
        },
        "loss_cases": out_loss,
        "multi_reward_cases": multi_reward_cases(),
        "quantile_cases": quantile_cases(),
    }
    with open(OUT, "w") as f:
        json.dump(doc, f, indent=1, allow_nan=False)
        f.write("\n")
    print(f"wrote {os.path.normpath(OUT)} ({os.path.getsize(OUT)} bytes): "
          f"{len(out_adv)} advantage cases, {len(out_loss)} loss cases, "
          f"{len(doc['multi_reward_cases'])} multi-reward cases, {len(doc['quantile_cases'])} quantile cases")


if __name__ == "__main__":
    main()
