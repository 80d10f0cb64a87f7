"""Check that a directory written by `rlft convert` loads in transformers and computes what the
reference computes (SmolLM2 golden values from tests/fixtures/smollm2/golden.json).

usage: ~/.cache/rlft/reference/venv/bin/python scripts/reference/check_convert.py DIR [GOLDEN]
(the venv of `bash bench/reference/setup.sh`)

Checks: AutoTokenizer ids for every golden text, apply_chat_template text, per-token log-probs
within 1e-3, last-position top-5 ids, greedy continuations token-identical. Prints one line per
check and exits non-zero on the first mismatch. Not run in CI (needs torch).
"""
import json
import os
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
d = sys.argv[1]
golden_path = sys.argv[2] if len(sys.argv) > 2 else os.path.join(HERE, "../../tests/fixtures/smollm2/golden.json")
g = json.load(open(golden_path))
torch.set_num_threads(2)
tok = AutoTokenizer.from_pretrained(d)
model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
model.eval()

for c in g["tokenize"]:
    ids = tok(c["text"], add_special_tokens=False)["input_ids"]
    assert ids == c["ids"], (c["text"], ids, c["ids"])
print("tokenizer ids: ok", len(g["tokenize"]))
for c in g["chat_template"]:
    text = tok.apply_chat_template(c["messages"], tokenize=False, add_generation_prompt=c["add_generation_prompt"])
    assert text == c["text"], (text, c["text"])
print("chat template: ok", len(g["chat_template"]))
with torch.no_grad():
    for c in g["logprobs"]:
        ids = torch.tensor([c["ids"]])
        logits = model(ids).logits[0].float()
        lp = torch.log_softmax(logits, -1)
        got = lp[:-1].gather(-1, ids[0, 1:, None])[:, 0]
        diff = (got - torch.tensor(c["next_token_logprobs"])).abs().max().item()
        assert diff < 1e-3, diff
        top5 = logits[-1].topk(5).indices.tolist()
        assert top5 == c["last_top5_ids"], (top5, c["last_top5_ids"])
        print(f"logprobs: ok (max diff {diff:.2e}), top-5 ok")
    for c in g["greedy"]:
        prompt = torch.tensor([c["prompt_ids"]])
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                             max_new_tokens=len(c["new_ids"]))
        new = out[0, prompt.shape[1]:].tolist()
        assert new == c["new_ids"], (new, c["new_ids"])
    print("greedy: ok", len(g["greedy"]))
print("transformers loads", d, "and matches the golden values")
