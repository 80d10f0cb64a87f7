#!/usr/bin/env python3
"""Golden scores of tiny random Llama / Qwen2 / Qwen3 `*ForSequenceClassification` models (num_labels 1).

The backbones are the tiny models of `tiny_models.py` (same configs, same deterministic initialiser,
seed 0); the head `score.weight [1, 64]` is set by the same initialiser (a linear weight: x / sqrt(64)).
For a right-padded batch (pad_token_id 2, the collator of TRL's RewardTrainer: attention_mask 1 on
every id of a row, 0 on padding) the script records, computed in float32 with eager attention:

- `token_scores[r][j]`: `model.score(model.model(ids, attention_mask).last_hidden_state)[r, j, 0]` on
  the real positions j < len(row r) (padding positions carry no meaning and are not recorded);
- `sequence_scores[r]`: `model(ids, attention_mask).logits[r, 0]`, read by transformers at the last
  non-pad token (modeling_layers.py, GenericForSequenceClassification.forward, lines 174-190);
- `score_pos[r]`: that position. Row 2 ends with the pad id (2, the EOS of the tiny tokenizer), so
  transformers reads it one token earlier: the rule the Rust side must reproduce.

It also checks that `save_pretrained` -> `AutoModelForSequenceClassification.from_pretrained` gives
the same scores and that the saved checkpoint has `score.weight` and no `lm_head.weight`.

usage:
    flock /tmp/rlft-bench.lock ~/.cache/rlft/reference/venv/bin/python scripts/reference/score_models.py
writes crates/rlft-model/tests/golden/score_<name>.json
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tiny_models as tm  # noqa: E402

PAD = 2
ROWS_FORMULA = "rows 0, 1: tiny_models.make_ids(k, len) with len 17, 11; row 2: make_ids(2, 8) + [2] (ends with the pad id)"


def rows(vocab: int) -> list[list[int]]:
    r = [tm.make_ids(0, 17, vocab), tm.make_ids(1, 11, vocab), tm.make_ids(2, 8, vocab) + [PAD]]
    assert all(PAD not in x[:-1] for x in r), r
    return r


def run(model, batch_rows: list[list[int]]):
    import torch

    t = max(len(r) for r in batch_rows)
    ids = torch.tensor([r + [PAD] * (t - len(r)) for r in batch_rows])
    mask = torch.tensor([[1] * len(r) + [0] * (t - len(r)) for r in batch_rows])
    with torch.no_grad():
        seq = model(input_ids=ids, attention_mask=mask).logits[:, 0]
        hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
        tok = model.score(hidden)[..., 0]
    token_scores = [[tok[i, j].item() for j in range(len(r))] for i, r in enumerate(batch_rows)]
    # transformers' own rule, restated to record the positions
    pos = [max(j for j, x in enumerate(r) if x != PAD) for r in batch_rows]
    for i, p in enumerate(pos):
        assert abs(seq[i].item() - tok[i, p].item()) < 1e-6, (i, p)
    return [s.item() for s in seq], token_scores, pos


def build_one(name: str, config, tmp: str):
    import torch
    import transformers
    from safetensors import safe_open
    from transformers import AutoModelForSequenceClassification

    config.num_labels = 1
    config.pad_token_id = PAD
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(config, attn_implementation="eager", dtype=torch.float32)
    model.eval()
    initialised = tm.det_init_model(model, tm.SEED)
    assert any(n == "score.weight" for n, _, _ in initialised), initialised
    r = rows(config.vocab_size)
    seq, tok, pos = run(model, r)
    # Each row alone gives the same scores (padding changes nothing on real positions).
    for i, row in enumerate(r):
        s1, t1, _ = run(model, [row])
        assert abs(s1[0] - seq[i]) < 1e-5 and max(abs(a - b) for a, b in zip(t1[0], tok[i])) < 1e-5, (name, i)

    save_dir = os.path.join(tmp, name)
    model.save_pretrained(save_dir)
    with open(os.path.join(save_dir, "config.json")) as f:
        saved_config = json.load(f)
    with safe_open(os.path.join(save_dir, "model.safetensors"), "pt") as f:
        keys = sorted(f.keys())
    assert "score.weight" in keys and "lm_head.weight" not in keys, keys
    re = AutoModelForSequenceClassification.from_pretrained(save_dir, attn_implementation="eager", dtype=torch.float32)
    re.eval()
    seq2, _, _ = run(re, r)
    assert max(abs(a - b) for a, b in zip(seq, seq2)) < 1e-6, name

    return {
        "name": name,
        "model_class": type(model).__name__,
        "config": saved_config,
        "seed": tm.SEED,
        "init": "rlft_model::testing::det_init (see scripts/reference/tiny_models.py docstring); score.weight too",
        "saved_tensors": keys,
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__},
        "attn_implementation": "eager",
        "dtype": "float32",
        "pad_token_id": PAD,
        "padding_side": "right",
        "rows_formula": ROWS_FORMULA,
        "rounding": "floats rounded to 7 significant digits",
        "rows": r,
        "score_pos": pos,
        "sequence_scores": [tm.sig7(v) for v in seq],
        "token_scores": [[tm.sig7(v) for v in row] for row in tok],
    }


def main() -> None:
    import torch

    torch.set_num_threads(min(2, os.cpu_count() or 1))
    os.makedirs(tm.OUT_DIR, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="rlft-score-") as tmp:
        for name, cfg in tm.make_configs().items():
            res = build_one(name, cfg, tmp)
            path = os.path.join(tm.OUT_DIR, f"score_{name}.json")
            with open(path, "w") as f:
                json.dump(res, f, indent=1)
                f.write("\n")
            print(f"{name}: wrote {os.path.relpath(path, tm.REPO)}; sequence scores {res['sequence_scores']}", file=sys.stderr)


if __name__ == "__main__":
    main()
