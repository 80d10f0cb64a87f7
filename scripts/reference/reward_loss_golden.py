"""Golden values for rlft's reward-model loss: TRL's Bradley-Terry loss, transcribed into torch.

Writes crates/rlft/tests/data/reward_loss_golden.json, read by crates/rlft/tests/reward_golden.rs.

What is transcribed (TRL `RewardTrainer.compute_loss`, trl/trainer/reward_trainer.py of TRL 1.16,
lines 786-815; the installed version is in `meta`):
    rewards_chosen, rewards_rejected = torch.chunk(logits.squeeze(-1), chunks=2)
    loss = -logsigmoid(rewards_chosen - rewards_rejected [- margin]).mean()
    loss += center_rewards_coefficient * mean((rewards_chosen + rewards_rejected) ** 2)   # if set
    accuracy = mean(rewards_chosen > rewards_rejected); margin = mean(rewards_chosen - rewards_rejected)
    min_reward / mean_reward / max_reward over all 2n scores
with the gradients d loss / d rewards from autograd. The scores are one `logits` tensor (chosen
rows first, as DataCollatorForPreference batches them), so the test can also check the chunking.

Cases: 7 pairs with a tie and a large |difference| (saturated sigmoid), with and without a
`margin` column and centring (coefficient 0.01, TRL's recommended value, and 0.5 to see it bite).
Scores are drawn in float32 with a fixed seed (exact in f32 and f64); everything is computed in
float64. The Rust test checks its f64 loss and gradients within 1e-12 and the f32 path within 1e-6.

Run: flock /tmp/rlft-bench.lock ~/.cache/rlft/reference/venv/bin/python scripts/reference/reward_loss_golden.py
"""

import json
import os

import torch
import trl

OUT = os.path.join(
    os.path.dirname(__file__), "..", "..", "crates", "rlft", "tests", "data", "reward_loss_golden.json"
)


def trl_loss(logits, margin, coef):
    """reward_trainer.py lines 786-815, with `inputs["margin"]` present iff margin is not None."""
    rewards_chosen, rewards_rejected = torch.chunk(logits.squeeze(-1), chunks=2)
    if margin is not None:
        loss = -torch.nn.functional.logsigmoid(rewards_chosen - rewards_rejected - margin).mean()
    else:
        loss = -torch.nn.functional.logsigmoid(rewards_chosen - rewards_rejected).mean()
    if coef is not None:
        loss += coef * torch.mean((rewards_chosen + rewards_rejected) ** 2)
    with torch.no_grad():
        stats = {
            "min_reward": logits.min().item(),
            "mean_reward": logits.mean().item(),
            "max_reward": logits.max().item(),
            "accuracy": (rewards_chosen > rewards_rejected).float().mean().item(),
            "margin": (rewards_chosen - rewards_rejected).mean().item(),
        }
    return loss, stats


def main():
    g = torch.Generator().manual_seed(1234)
    n = 7
    chosen = (torch.randn(n, generator=g) * 2).float()
    rejected = (torch.randn(n, generator=g) * 2).float()
    rejected[3] = chosen[3]  # a tie: not counted as accurate
    chosen[5], rejected[5] = 30.0, -25.0  # saturated: loss ~ 0
    chosen[6], rejected[6] = -20.0, 20.0  # saturated the other way: loss ~ 40
    margin = torch.rand(n, generator=g).float()
    cases = []
    for use_margin in (False, True):
        for coef in (None, 0.01, 0.5):
            logits = torch.cat([chosen, rejected]).double().unsqueeze(-1).requires_grad_(True)
            m = margin.double() if use_margin else None
            loss, stats = trl_loss(logits, m, coef)
            loss.backward()
            grad = logits.grad.squeeze(-1)
            cases.append(
                {
                    "margin_column": m.tolist() if m is not None else None,
                    "center_rewards_coefficient": coef,
                    "loss": loss.item(),
                    "grad_chosen": grad[:n].tolist(),
                    "grad_rejected": grad[n:].tolist(),
                    **stats,
                }
            )
    out = {
        "meta": {"trl": trl.__version__, "torch": torch.__version__, "source": "trl/trainer/reward_trainer.py:786-815"},
        "chosen": chosen.double().tolist(),
        "rejected": rejected.double().tolist(),
        "cases": cases,
    }
    with open(OUT, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"wrote {os.path.normpath(OUT)}: {len(cases)} cases, losses {[round(c['loss'], 4) for c in cases]}")


if __name__ == "__main__":
    main()
