"""Check rlft's reward models against transformers and PEFT: an exported `*ForSequenceClassification`
directory loads with `AutoModelForSequenceClassification` and a SEQ_CLS adapter (LoRA + the `score`
head in `modules_to_save`) loads with `PeftModel`, each giving the sequence scores rlft computed.

usage:
    cargo test --release -p rlft-model --test score -- --ignored write_score_check_fixtures
    ~/.cache/rlft/reference/venv/bin/python scripts/reference/check_score_model.py [EXPECTED_JSON]

EXPECTED_JSON (default /tmp/rlft-score-check/expected.json, or RLFT_SCORE_CHECK_DIR/expected.json)
is a list of cases {name, kind: "dir" | "adapter", path, base (adapter), pad_token_id (adapter),
rows (token ids), scores (rlft's)}; `rlft reward-model` runs add their own (see
docs/reward-model.md). Rows are scored as one right-padded batch, as TRL's RewardTrainer
collates them (attention_mask 0 on padding; transformers reads each row at its last non-pad
token). Prints the max abs difference per case and exits non-zero above 1e-4. Not run in CI
(needs torch + peft).
"""
import json
import os
import sys

import torch
from peft import PeftModel
from transformers import AutoModelForSequenceClassification

TOL = 1e-4
root = os.environ.get("RLFT_SCORE_CHECK_DIR", "/tmp/rlft-score-check")
path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "expected.json")
cases = json.load(open(path))
torch.set_num_threads(2)


def scores_of(model, rows, pad):
    t = max(len(r) for r in rows)
    ids = torch.tensor([r + [pad] * (t - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (t - len(r)) for r in rows])
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits[:, 0].float()


worst = 0.0
for case in cases:
    if case["kind"] == "dir":
        model = AutoModelForSequenceClassification.from_pretrained(case["path"], dtype=torch.float32)
        assert model.config.num_labels == 1, model.config
        pad = model.config.pad_token_id
        kind = type(model).__name__
    else:
        # What TRL's RewardTrainer starts from: the causal LM as a 1-label classifier.
        base = AutoModelForSequenceClassification.from_pretrained(
            case["base"], num_labels=1, pad_token_id=case["pad_token_id"], dtype=torch.float32
        )
        model = PeftModel.from_pretrained(base, case["path"])
        cfg = model.peft_config["default"]
        assert cfg.task_type == "SEQ_CLS" and "score" in cfg.modules_to_save, cfg
        pad = case["pad_token_id"]
        kind = f"PeftModel({type(base).__name__})"
    model.eval()
    got = scores_of(model, case["rows"], pad)
    d = (got - torch.tensor(case["scores"])).abs().max().item()
    worst = max(worst, d)
    print(f"{case['name']:>20} {kind}: {len(case['rows'])} rows, max |transformers - rlft| = {d:.2e}")

print(f"worst {worst:.2e} (tolerance {TOL})")
sys.exit(0 if worst <= TOL else 1)
