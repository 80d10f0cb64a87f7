"""Check rlft's reward models against transformers and PEFT: an exported `*ForSequenceClassification`
directory loads with `AutoModelForSequenceClassification` and a SEQ_CLS adapter (LoRA + the `score`
head in `modules_to_save`) loads with `PeftModel`, each giving the sequence scores rlft computed.

usage:
    cargo test --release -p rlft-model --test score -- --ignored write_score_check_fixtures
    ~/.cache/rlft/reference/venv/bin/python scripts/reference/check_score_model.py [EXPECTED_JSON]
    # a trained reward model: OUT is `rlft reward-model`'s output_dir, SCORES what `rlft score`
    # wrote for DATA (same --split / --system-prompt), BASE the base of OUT/adapter if any
    ~/.cache/rlft/reference/venv/bin/python scripts/reference/check_score_model.py \
        --run OUT --data DATA [--split test] [--system-prompt S] --scores SCORES [--base BASE]

EXPECTED_JSON (default /tmp/rlft-score-check/expected.json, or RLFT_SCORE_CHECK_DIR/expected.json)
is a list of cases {name, kind: "dir" | "adapter", path, base (adapter), pad_token_id (adapter),
rows (token ids), scores (rlft's)}; `rlft reward-model` runs add their own (see
docs/reward-model.md). Rows are scored as one right-padded batch, as TRL's RewardTrainer
collates them (attention_mask 0 on padding; transformers reads each row at its last non-pad
token). Prints the max abs difference per case and exits non-zero above 1e-4. Not run in CI
(needs torch + peft).

With --run, the rows of DATA (preference rows) are tokenized in Python as TRL's
RewardTrainer._prepare_dataset does (reward_trainer.py lines 680-730: EOS appended to standard
completions, `prompt + chosen` through `apply_chat_template(tokenize=True)` for conversations),
with the exported tokenizer, and scored by OUT/final (AutoModelForSequenceClassification) and
OUT/adapter (PeftModel over BASE, an HF causal-LM directory, when --base is given); the scores
must equal rlft's. Passed on SmolLM2-135M-Instruct (the default model, LoRA, 128 test pairs of
`tiny-python-expr --preferences`): max difference 1.0e-5 over 256 sequences.
"""
import argparse
import json
import os
import sys

import torch
from peft import PeftModel
from transformers import AutoModelForSequenceClassification

TOL = 1e-4
torch.set_num_threads(2)


def scores_of(model, rows, pad):
    t = max(len(r) for r in rows)
    ids = torch.tensor([r + [pad] * (t - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (t - len(r)) for r in rows])
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits[:, 0].float()


def run_cases(run_dir, data, split, system_prompt, scores_path, base):
    """Cases for a trained reward model: rows tokenized by TRL's rules, rlft's scores."""
    import datasets
    from transformers import AutoTokenizer
    from trl.data_utils import is_conversational

    if os.path.isdir(data):
        ds = datasets.load_from_disk(data)
        ds = ds[split] if isinstance(ds, datasets.DatasetDict) else ds
    else:
        ds = datasets.load_dataset("json", data_files=data, split="train")
    final = os.path.join(run_dir, "final")
    tok = AutoTokenizer.from_pretrained(final)
    rows, want = [], []
    scored = [json.loads(line) for line in open(scores_path)]
    assert len(scored) == len(ds), (len(scored), len(ds))
    for ex, sc in zip(ds, scored):
        if is_conversational(ex):
            prompt = list(ex["prompt"])
            if system_prompt and prompt[0]["role"] != "system":
                prompt = [{"role": "system", "content": system_prompt}] + prompt
            for side in ("chosen", "rejected"):
                rows.append(tok.apply_chat_template(prompt + list(ex[side]), tokenize=True, return_dict=True)["input_ids"])
        else:
            for side in ("chosen", "rejected"):
                c = ex[side] if ex[side].endswith(tok.eos_token) else ex[side] + tok.eos_token
                rows.append(tok(text=ex["prompt"] + c)["input_ids"])
        want += [sc["chosen_score"], sc["rejected_score"]]
    out = [{"name": "run-final", "kind": "dir", "path": final, "rows": rows, "scores": want}]
    adapter = os.path.join(run_dir, "adapter")
    if os.path.isdir(adapter) and base:
        cfg = json.load(open(os.path.join(final, "config.json")))
        out.append({"name": "run-adapter", "kind": "adapter", "path": adapter, "base": base,
                    "pad_token_id": cfg["pad_token_id"], "rows": rows, "scores": want})
    return out


ap = argparse.ArgumentParser()
ap.add_argument("expected", nargs="?")
ap.add_argument("--run")
ap.add_argument("--data")
ap.add_argument("--split", default="train")
ap.add_argument("--system-prompt")
ap.add_argument("--scores")
ap.add_argument("--base")
args = ap.parse_args()
if args.run:
    cases = run_cases(args.run, args.data, args.split, args.system_prompt, args.scores, args.base)
else:
    root = os.environ.get("RLFT_SCORE_CHECK_DIR", "/tmp/rlft-score-check")
    cases = json.load(open(args.expected or os.path.join(root, "expected.json")))

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
