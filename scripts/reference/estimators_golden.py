"""Golden values for rlft's online estimators and losses, transcribed from their anchors into torch.

Writes crates/rlft/tests/data/estimators_golden.json, read by crates/rlft/tests/estimators_golden.rs.

Transcribed (each function below names its anchor file and lines):
- RLOO advantages with the KL off the reward: TRL 1.16 trl/trainer/rloo_trainer.py 1646-1699.
- RLOO's sequence-level clipped loss: TRL 1.16 trl/trainer/rloo_trainer.py 1812-1835.
- REINFORCE++ / REINFORCE++-baseline / GAE, the KL estimators, the per-token reward, the batch
  whitening: OpenRLHF (commit 3c3be62) openrlhf/models/utils.py 64-126 (`compute_approx_kl`,
  `compute_reward`), openrlhf/trainer/ppo_utils/experience_maker.py 238-410
  (`compute_advantages_and_returns`, `get_advantages_and_returns`, `get_cumulative_returns`).
- `whiten_rewards`: TRL <= 1.15 trl/trainer/utils.py `masked_whiten` (shift_mean=False), as
  PPOTrainer applied it to the per-token rewards.
- The clipped value loss: OpenRLHF openrlhf/models/loss.py 233-269 (`ValueLoss`, token-level
  aggregation over one micro-batch), divided by the accumulation steps as accelerate does.
- Dynamic sampling's group filter: verl recipe/dapo dapo_ray_trainer.py (`filter_groups`: keep a
  prompt whose metric has std > 0 or a single sample).

The case: 3 groups x 4 completions, T = 6 positions, ragged lengths 1..6, one group with equal
rewards, random log-probs / reference log-probs / values in float32 (exact in f64), computed in
float64. Rows in the JSON hold only the active tokens.

Run: flock /tmp/rlft-bench.lock ~/.cache/rlft/reference/venv/bin/python scripts/reference/estimators_golden.py
"""

import json
import os

import torch

OUT = os.path.join(
    os.path.dirname(__file__), "..", "..", "crates", "rlft", "tests", "data", "estimators_golden.json"
)
G, NG, T = 4, 3, 6
N = G * NG
KL_COEF = 0.05
GAMMA = 0.9
LAM = 0.95


def compute_approx_kl(log_probs, log_probs_base, kl_estimator="k1"):
    """OpenRLHF models/utils.py 64-95."""
    log_ratio = log_probs.double() - log_probs_base.double()
    if kl_estimator == "k2":
        log_ratio = log_ratio**2 / 2.0
    elif kl_estimator == "k3":
        log_ratio = (-log_ratio).exp() - 1 + log_ratio
    return log_ratio.clamp(min=-10, max=10)


def compute_reward(r, kl_coef, kl, action_mask):
    """OpenRLHF models/utils.py 98-126."""
    kl_reward = -kl_coef * kl
    eos_indices = action_mask.size(1) - 1 - action_mask.long().fliplr().argmax(dim=1, keepdim=True)
    last_reward = torch.zeros_like(kl).scatter_(dim=1, index=eos_indices, src=r.unsqueeze(1).to(kl.dtype))
    return last_reward + kl_reward


def get_advantages_and_returns(values, rewards, action_mask, gamma, lambd):
    """OpenRLHF experience_maker.py 333-378."""
    lastgaelam = 0
    advantages_reversed = []
    response_length = rewards.size(1)
    values = action_mask * values
    rewards = action_mask * rewards
    for t in reversed(range(response_length)):
        nextvalues = values[:, t + 1] if t < response_length - 1 else 0.0
        delta = rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam = delta + gamma * lambd * lastgaelam
        advantages_reversed.append(lastgaelam)
    advantages = torch.stack(advantages_reversed[::-1], dim=1)
    returns = advantages + values
    return advantages, returns


def get_cumulative_returns(rewards, action_mask, gamma):
    """OpenRLHF experience_maker.py 380-410."""
    returns = torch.zeros_like(rewards)
    cumulative_return = torch.zeros(rewards.size(0), dtype=rewards.dtype)
    rewards = action_mask * rewards
    for t in reversed(range(rewards.size(1))):
        cumulative_return = rewards[:, t] + gamma * cumulative_return
        returns[:, t] = cumulative_return
    return returns


def whiten_openrlhf(advantages, action_mask):
    """OpenRLHF experience_maker.py 313-330 (std norm on)."""
    num_actions = action_mask.sum()
    mean = (advantages * action_mask).sum() / num_actions
    var = ((advantages - mean).pow(2) * action_mask).sum() / num_actions
    return (advantages - mean) * var.clamp(min=1e-8).rsqrt()


def masked_whiten_trl(values, mask, shift_mean=True):
    """TRL <= 1.15 trl/trainer/utils.py masked_mean / masked_var / masked_whiten."""
    mean = (values * mask).sum() / mask.sum()
    centered = values - mean
    var = (centered**2 * mask).sum() / mask.sum()
    bessel = mask.sum() / (mask.sum() - 1)
    var = var * bessel
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened += mean
    return whitened


def openrlhf_estimate(estimator, scores, kl, values, mask, gamma, whiten_rewards=False):
    """experience_maker.py 238-330 for one experience holding the whole batch."""
    rewards = scores.reshape(-1, G)
    if estimator == "reinforce_baseline":
        rewards = rewards - rewards.mean(-1, keepdim=True)
    rewards = rewards.reshape(-1)
    reward = compute_reward(rewards, KL_COEF, kl, mask)
    if estimator == "gae":
        if whiten_rewards:  # TRL PPOTrainer: whiten, then zero the padding
            reward = masked_whiten_trl(reward, mask, shift_mean=False) * mask
        adv, ret = get_advantages_and_returns(values, reward, mask, gamma, LAM)
    else:
        if estimator == "reinforce_baseline":
            gamma = 1.0
        ret = get_cumulative_returns(reward, mask, gamma)
        adv = ret.clone()
    adv = whiten_openrlhf(adv, mask)
    return adv, ret


def trl_rloo(scores, old, ref, mask, normalize):
    """TRL 1.16 rloo_trainer.py 1646-1699 (all rows scorable)."""
    rewards = scores.clone()
    per_token_kl = old - ref
    kl = (per_token_kl * mask).sum(-1)
    rewards = rewards - KL_COEF * kl
    grouped = rewards.view(-1, G)
    baselines = ((grouped.sum(1, keepdim=True) - grouped) / (G - 1)).view(-1)
    adv = rewards - baselines
    if normalize:
        mean = adv.mean()
        std = adv.std()  # nanstd: Bessel-corrected
        adv = (adv - mean) / (std + 1e-4)
    return adv


def trl_rloo_loss(logp, old, adv, mask, eps_low, eps_high, k):
    """TRL 1.16 rloo_trainer.py 1812-1835, loss / accumulation steps."""
    logps = (logp * mask).sum(1)
    old_logps = (old * mask).sum(1)
    coef_1 = torch.exp(logps - old_logps)
    coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
    loss = -torch.min(coef_1 * adv, coef_2 * adv).mean() / k
    low = ((coef_1 < 1 - eps_low) & (adv < 0)).double().mean()
    high = ((coef_1 > 1 + eps_high) & (adv > 0)).double().mean()
    return loss, low.item(), high.item()


def value_loss(values, old_values, returns, mask, clip, k):
    """OpenRLHF models/loss.py 233-269 with token-level aggregation; / k (accelerate)."""
    values_clipped = old_values + (values - old_values).clamp(-clip, clip)
    surr1 = (values_clipped - returns) ** 2
    surr2 = (values - returns) ** 2
    loss = torch.max(surr1, surr2)
    loss = (loss * mask).sum() / mask.sum()
    clipfrac = (((surr1 > surr2).double() * mask).sum() / mask.sum()).item()
    return 0.5 * loss / k, clipfrac


def filter_groups(rewards):
    """verl dapo filter_groups: keep a prompt whose rewards have std > 0 (np.std, ddof 0)."""
    g = rewards.view(-1, G)
    return [bool(row.std(unbiased=False) > 0) for row in g]


def rows(x, mask):
    return [[x[i, t].item() for t in range(T) if mask[i, t] > 0] for i in range(N)]


def main():
    gen = torch.Generator().manual_seed(7)
    lens = torch.tensor([1, 6, 3, 4, 6, 2, 5, 6, 3, 3, 6, 1])
    mask = (torch.arange(T)[None, :] < lens[:, None]).double()
    f32 = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float32).double()
    old = -f32(N, T).abs() - 0.1
    ref = old + 0.3 * f32(N, T)
    values = 0.5 * f32(N, T)
    scores = torch.tensor([1.0, 0.0, 0.5, 1.0, 0.2, 0.2, 0.2, 0.2, 0.0, 1.5, -0.5, 0.25], dtype=torch.float64)
    out = {"group_size": G, "lens": lens.tolist(), "kl_coef": KL_COEF, "gamma": GAMMA, "lam": LAM,
           "scores": scores.tolist(), "old": rows(old, mask), "ref": rows(ref, mask),
           "values": rows(values, mask), "cases": {}}
    for est in ["k1", "k2", "k3"]:
        out["cases"][f"kl_{est}"] = rows(compute_approx_kl(old, ref, est), mask)
    kl = compute_approx_kl(old, ref, "k1")
    for norm in [False, True]:
        out["cases"][f"rloo_normalize_{norm}"] = trl_rloo(scores, old, ref, mask, norm).tolist()
    for est in ["reinforce", "reinforce_baseline", "gae"]:
        for wr in ([False, True] if est == "gae" else [False]):
            adv, ret = openrlhf_estimate(est, scores, kl, values, mask, GAMMA, wr)
            out["cases"][f"{est}_whiten_rewards_{wr}"] = {"advantages": rows(adv, mask), "returns": rows(ret, mask)}
    # Losses, with gradients.
    logp = (old + 0.15 * f32(N, T)).requires_grad_(True)
    adv = trl_rloo(scores, old, ref, mask, False)
    loss, low, high = trl_rloo_loss(logp, old, adv, mask, 0.2, 0.28, 2)
    loss.backward()
    out["rloo_loss"] = {"logp": rows(logp.detach(), mask), "advantages": adv.tolist(), "eps_low": 0.2,
                        "eps_high": 0.28, "k": 2, "loss": loss.item(), "clip_low": low, "clip_high": high,
                        "grad": rows(logp.grad, mask)}
    v = (values + 0.3 * f32(N, T)).requires_grad_(True)
    _, ret = openrlhf_estimate("gae", scores, kl, values, mask, GAMMA)
    vl, frac = value_loss(v, values, ret, mask, 0.2, 2)
    vl.backward()
    out["value_loss"] = {"values": rows(v.detach(), mask), "returns": rows(ret, mask), "clip": 0.2, "k": 2,
                         "loss": vl.item(), "clipfrac": frac, "grad": rows(v.grad, mask)}
    out["filter_groups"] = {"keep": filter_groups(scores)}
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(out, f, indent=1)
    print("wrote", os.path.normpath(OUT))


if __name__ == "__main__":
    main()
