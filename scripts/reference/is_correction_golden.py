"""Golden values for rlft's importance-sampling correction of server rollouts: TRL 1.16's
`vllm_importance_sampling_correction`, transcribed into torch.

Writes crates/rlft/tests/data/is_correction_golden.json, read by
crates/rlft/tests/is_correction_golden.rs.

Transcribed from TRL `GRPOTrainer._generate_and_score_completions`
(`trl/trainer/grpo_trainer.py`, the version installed next to this script; see `meta`):
- the ratio, :2660-2709: `d = nan_to_num((old - sampling) * mask, nan=0)`, summed over the
  completion for `sequence_*` modes, `exp`, then `clamp(min=C_min, max=C_max)` for `*_truncate`
  or `masked_fill((r < C_min) | (r > C_max), 0)` for `*_mask` (a missing bound is -inf / inf);
- the metrics, :2860-2896: `sampling/sampling_logp_difference/{mean,max}` of `|old -
  sampling|` over the mask without NaNs, `sampling/importance_sampling_ratio/{min,mean,max}`
  over the masked tokens (token modes) or over every completion (sequence modes); 0 when empty.

The case: 6 completions, T = 5, ragged lengths (one of length 1), one completion masked out
(truncated under `mask_truncated_completions`: TRL zeroes its completion mask), one sampler
log-prob NaN (a token the server did not score). Old and sampler log-probs are float32; the
maths runs in float64 so the comparison isolates the formula. Clip settings: TRL's default
(C_max 3, no C_min), a tight pair (0.9, 1.1), C_min only (C_max None), for all four modes.

    flock /tmp/rlft-bench.lock ~/.cache/rlft/reference/venv/bin/python scripts/reference/is_correction_golden.py
"""

import json
import math
import os

import torch
import trl

OUT = os.path.join(
    os.path.dirname(__file__), "..", "..", "crates", "rlft", "tests", "data", "is_correction_golden.json"
)


def trl_is(old, samp, mask, mode, clip_min, clip_max):
    per_token_logps_diff = (old - samp) * mask
    per_token_logps_diff = torch.nan_to_num(per_token_logps_diff, nan=0.0)
    sequence_level_is = mode in ["sequence_mask", "sequence_truncate"]
    if sequence_level_is:
        logps_diff = per_token_logps_diff.sum(dim=-1, keepdim=True)
    else:
        logps_diff = per_token_logps_diff
    ratio = torch.exp(logps_diff)
    if mode in ["sequence_truncate", "token_truncate"]:
        ratio = torch.clamp(ratio, min=clip_min, max=clip_max)
    else:
        min_val = clip_min if clip_min is not None else -math.inf
        max_val = clip_max if clip_max is not None else math.inf
        invalid = (ratio < min_val) | (ratio > max_val)
        ratio = ratio.masked_fill(invalid, value=0.0)
    # Metrics.
    delta = torch.abs(old - samp)
    m = mask.bool()
    delta = delta[m & ~torch.isnan(delta)]
    dmean = torch.mean(delta).item() if delta.numel() > 0 else 0.0
    dmax = torch.max(delta).item() if delta.numel() > 0 else 0.0
    flat = ratio.flatten() if sequence_level_is else ratio[m]
    stats = {
        "sampling/sampling_logp_difference/mean": dmean,
        "sampling/sampling_logp_difference/max": dmax,
        "sampling/importance_sampling_ratio/min": torch.min(flat).item() if flat.numel() else 0.0,
        "sampling/importance_sampling_ratio/mean": torch.mean(flat).item() if flat.numel() else 0.0,
        "sampling/importance_sampling_ratio/max": torch.max(flat).item() if flat.numel() else 0.0,
    }
    return ratio.expand_as(old) if sequence_level_is else ratio, stats


def main():
    g = torch.Generator().manual_seed(0)
    n, t = 6, 5
    lens = [5, 3, 1, 4, 5, 2]
    keep = [True, True, True, False, True, True]
    old = (-torch.rand(n, t, generator=g) * 3).float()
    samp = (old + torch.randn(n, t, generator=g) * 0.3).float()
    samp[4, 2] = float("nan")
    mask = torch.zeros(n, t)
    for i, (l, k) in enumerate(zip(lens, keep)):
        if k:
            mask[i, :l] = 1.0
    old64, samp64 = old.double(), samp.double()
    cases = []
    for mode in ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]:
        for clip_min, clip_max in [(None, 3.0), (0.9, 1.1), (0.5, None)]:
            ratio, stats = trl_is(old64, samp64, mask.double(), mode, clip_min, clip_max)
            cases.append(
                {
                    "mode": mode,
                    "clip_min": clip_min,
                    "clip_max": clip_max,
                    "weights": [ratio[i, : lens[i]].tolist() for i in range(n)],
                    "stats": stats,
                }
            )
    data = {
        "meta": {"trl": trl.__version__, "torch": torch.__version__, "script": os.path.basename(__file__)},
        "old": [old[i, : lens[i]].tolist() for i in range(n)],
        "sampling": [[None if math.isnan(x) else x for x in samp[i, : lens[i]].tolist()] for i in range(n)],
        "keep": keep,
        "cases": cases,
    }
    with open(OUT, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    print("wrote", os.path.normpath(OUT), len(cases), "cases")


if __name__ == "__main__":
    main()
