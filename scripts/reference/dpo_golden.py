"""Golden values for rlft's DPO losses: TRL 1.16's DPOTrainer loss, transcribed into torch.

Writes crates/rlft/tests/data/dpo_golden.json, read by crates/rlft/tests/dpo_golden.rs.

What is transcribed (TRL `DPOTrainer._compute_loss`, trl/trainer/dpo_trainer.py of TRL 1.16; the
installed version is in `meta`):
- the sequence log-prob: `per_token_logps.sum(dim=1)` over the label-masked completion tokens
  (line 1304); here `(per_token * completion_mask).sum(1)` on ragged random rows;
- the log-ratios and `delta_score` with `f_divergence_type="reverse_kl"` (lines 1349-1383);
- every `loss_type` of the loop (lines 1386-1526) and the weighted sum
  `loss += per_sequence_loss.mean() * loss_weight` (line 1528), `use_weighting=False`;
- the logged rewards, accuracies, margins and log-probs (lines 1581-1599).
The gradients d loss / d policy log-probs come from autograd.

Cases: 6 pairs of ragged completions (1..7 tokens), random per-token log-probs in float32
(exact in f64), computed in float64; each loss type alone (beta 0.1 and 0.5, label_smoothing 0.1
where it is read, 1e-3 for exo_pair), and two weighted lists (MPO-like
`["sigmoid", "bco_pair", "sft"]` with `[0.8, 0.2, 1.0]`, `["robust", "apo_zero"]` with
`[1.0, 0.5]`).

Run: flock /tmp/rlft-bench.lock ~/.cache/rlft/reference/venv/bin/python scripts/reference/dpo_golden.py
"""

import json
import os

import torch
import torch.nn.functional as F
import trl

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "crates", "rlft", "tests", "data", "dpo_golden.json")
N, T = 6, 7


def trl_loss(per_token_logps, completion_mask, ref_logps, loss_types, loss_weights, beta, label_smoothing, discopop_tau=0.05):
    """dpo_trainer.py 1300-1528 and 1581-1599 (reverse_kl, no ld_alpha, no use_weighting).

    `per_token_logps`, `completion_mask`: [2N, T], chosen rows first (the shift is already done:
    position t holds the log-prob of completion token t). `ref_logps`: [2N].
    """
    shift_completion_mask = completion_mask
    logps = (per_token_logps * shift_completion_mask).sum(dim=1)
    chosen_logps, rejected_logps = logps.chunk(2, dim=0)
    ref_chosen_logps, ref_rejected_logps = ref_logps.chunk(2, dim=0)
    chosen_logratios = chosen_logps - ref_chosen_logps
    rejected_logratios = rejected_logps - ref_rejected_logps
    chosen_scores, rejected_scores = chosen_logratios, rejected_logratios
    delta_score = chosen_scores - rejected_scores
    loss = 0.0
    for loss_type, loss_weight in zip(loss_types, loss_weights, strict=True):
        if loss_type == "sigmoid":
            per_sequence_loss = -F.logsigmoid(beta * delta_score)
        elif loss_type == "hinge":
            per_sequence_loss = torch.relu(1 - beta * delta_score)
        elif loss_type == "ipo":
            chosen_mask, rejected_mask = completion_mask.chunk(2, dim=0)
            chosen_avg_score = chosen_scores / chosen_mask.sum(dim=1).clamp(min=1.0)
            rejected_avg_score = rejected_scores / rejected_mask.sum(dim=1).clamp(min=1.0)
            ipo_delta = chosen_avg_score - rejected_avg_score
            per_sequence_loss = (ipo_delta - 1 / (2 * beta)) ** 2
        elif loss_type == "exo_pair":
            epsilon = torch.tensor(label_smoothing, dtype=torch.float64)
            qw = torch.sigmoid(beta * delta_score)
            log_qw = F.logsigmoid(beta * delta_score)
            log_pw = torch.log1p(-epsilon)
            ql = torch.sigmoid(-beta * delta_score)
            log_ql = F.logsigmoid(-beta * delta_score)
            log_pl = torch.log(epsilon)
            per_sequence_loss = qw * (log_qw - log_pw) + ql * (log_ql - log_pl)
        elif loss_type == "nca_pair":
            chosen_rewards = beta * chosen_logratios
            rejected_rewards = beta * rejected_logratios
            per_sequence_loss = (
                -F.logsigmoid(chosen_rewards) - 0.5 * F.logsigmoid(-chosen_rewards) - 0.5 * F.logsigmoid(-rejected_rewards)
            )
        elif loss_type == "robust":
            clean_loss_term = -(1 - label_smoothing) * F.logsigmoid(beta * delta_score)
            flipped_loss_term = -label_smoothing * F.logsigmoid(-beta * delta_score)
            per_sequence_loss = (clean_loss_term - flipped_loss_term) / (1 - 2 * label_smoothing)
        elif loss_type == "bco_pair":
            chosen_rewards = beta * chosen_logratios
            rejected_rewards = beta * rejected_logratios
            per_sequence_loss = -F.logsigmoid(chosen_rewards) - F.logsigmoid(-rejected_rewards)
        elif loss_type == "sppo_hard":
            winner_margin_error = (chosen_logratios - 0.5 / beta) ** 2
            loser_margin_error = (rejected_logratios + 0.5 / beta) ** 2
            per_sequence_loss = winner_margin_error + loser_margin_error
        elif loss_type == "aot":
            logratios = chosen_logps - rejected_logps
            ref_logratios = ref_chosen_logps - ref_rejected_logps
            logratios_sorted, _ = torch.sort(logratios, dim=0)
            ref_logratios_sorted, _ = torch.sort(ref_logratios, dim=0)
            delta = logratios_sorted - ref_logratios_sorted
            per_sequence_loss = -F.logsigmoid(beta * delta) * (1 - label_smoothing) - F.logsigmoid(-beta * delta) * label_smoothing
        elif loss_type == "aot_unpaired":
            chosen_logratios_sorted, _ = torch.sort(chosen_logratios, dim=0)
            rejected_logratios_sorted, _ = torch.sort(rejected_logratios, dim=0)
            delta = chosen_logratios_sorted - rejected_logratios_sorted
            per_sequence_loss = -F.logsigmoid(beta * delta) * (1 - label_smoothing) - F.logsigmoid(-beta * delta) * label_smoothing
        elif loss_type == "apo_zero":
            losses_chosen = 1 - torch.sigmoid(beta * chosen_logratios)
            losses_rejected = torch.sigmoid(beta * rejected_logratios)
            per_sequence_loss = losses_chosen + losses_rejected
        elif loss_type == "apo_down":
            losses_chosen = torch.sigmoid(beta * chosen_logratios)
            losses_rejected = 1 - torch.sigmoid(beta * (chosen_logratios - rejected_logratios))
            per_sequence_loss = losses_chosen + losses_rejected
        elif loss_type == "discopop":
            logits = delta_score * beta
            log_ratio_modulation = torch.sigmoid(logits / discopop_tau)
            logistic_component = -F.logsigmoid(logits)
            exp_component = torch.exp(-logits)
            per_sequence_loss = logistic_component * (1 - log_ratio_modulation) + exp_component * log_ratio_modulation
        elif loss_type == "sft":
            chosen_mask, _ = shift_completion_mask.chunk(2, dim=0)
            chosen_per_token_logps, _ = per_token_logps.chunk(2, dim=0)
            batch_loss = -chosen_per_token_logps[chosen_mask.bool()].mean()
            per_sequence_loss = batch_loss.expand(chosen_per_token_logps.size(0))
        elif loss_type == "sigmoid_norm":
            chosen_mask, rejected_mask = completion_mask.chunk(2, dim=0)
            chosen_avg_score = chosen_scores / chosen_mask.sum(dim=1).clamp(min=1.0)
            rejected_avg_score = rejected_scores / rejected_mask.sum(dim=1).clamp(min=1.0)
            delta = chosen_avg_score - rejected_avg_score
            per_sequence_loss = -F.logsigmoid(beta * delta)
        else:
            raise ValueError(loss_type)
        loss += per_sequence_loss.mean() * loss_weight
    chosen_rewards = beta * chosen_logratios.detach()
    rejected_rewards = beta * rejected_logratios.detach()
    stats = {
        "rewards/chosen": chosen_rewards.mean().item(),
        "rewards/rejected": rejected_rewards.mean().item(),
        "rewards/accuracies": (chosen_rewards > rejected_rewards).float().mean().item(),
        "rewards/margins": (chosen_rewards - rejected_rewards).mean().item(),
        "logps/chosen": chosen_logps.detach().mean().item(),
        "logps/rejected": rejected_logps.detach().mean().item(),
    }
    return loss, stats, logps.detach()


def main():
    g = torch.Generator().manual_seed(20260)
    lens = torch.tensor([1, 3, 7, 2, 5, 4, 6, 2, 3, 7, 1, 5])  # chosen rows, then rejected
    mask = (torch.arange(T).unsqueeze(0) < lens.unsqueeze(1)).double()
    per_token = (-torch.rand(2 * N, T, generator=g) * 3).float().double()
    ref_logps = ((per_token * mask).sum(1) + (torch.randn(2 * N, generator=g) * 2).float().double()).detach()
    cases = []
    singles = [
        ("sigmoid", 0.0),
        ("hinge", 0.0),
        ("ipo", 0.0),
        ("exo_pair", 1e-3),
        ("nca_pair", 0.0),
        ("robust", 0.1),
        ("bco_pair", 0.0),
        ("sppo_hard", 0.0),
        ("aot", 0.1),
        ("aot_unpaired", 0.1),
        ("apo_zero", 0.0),
        ("apo_down", 0.0),
        ("discopop", 0.0),
        ("sft", 0.0),
        ("sigmoid_norm", 0.0),
    ]
    combos = [(["sigmoid", "bco_pair", "sft"], [0.8, 0.2, 1.0], 0.0), (["robust", "apo_zero"], [1.0, 0.5], 0.1)]
    todo = [([t], [1.0], ls, beta) for t, ls in singles for beta in (0.1, 0.5)]
    todo += [(ts, ws, ls, 0.1) for ts, ws, ls in combos]
    for types, weights, ls, beta in todo:
        x = per_token.clone().requires_grad_(True)
        loss, stats, logps = trl_loss(x, mask, ref_logps, types, weights, beta, ls)
        loss.backward()
        # d loss / d logps: every token of a row has the row's gradient (sum over tokens).
        grad = [x.grad[i, 0].item() for i in range(2 * N)]
        cases.append(
            {"loss_type": types, "loss_weights": weights, "beta": beta, "label_smoothing": ls, "loss": loss.item(), "grad_chosen": grad[:N], "grad_rejected": grad[N:], "stats": stats}
        )
    rows = [per_token[i, : lens[i]].tolist() for i in range(2 * N)]
    out = {
        "meta": {"trl": trl.__version__, "torch": torch.__version__, "source": "trl/trainer/dpo_trainer.py:1300-1599"},
        "per_token_chosen": rows[:N],
        "per_token_rejected": rows[N:],
        "logps_chosen": logps[:N].tolist(),
        "logps_rejected": logps[N:].tolist(),
        "ref_chosen": ref_logps[:N].tolist(),
        "ref_rejected": ref_logps[N:].tolist(),
        "cases": cases,
    }
    with open(OUT, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"wrote {os.path.normpath(OUT)}: {len(cases)} cases")


if __name__ == "__main__":
    main()
