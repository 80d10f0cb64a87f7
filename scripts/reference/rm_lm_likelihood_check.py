# Usage: flock /tmp/rlft-bench.lock ~/.cache/rlft/reference/venv/bin/python \
#   scripts/reference/rm_lm_likelihood_check.py HF_DIR PREFS_TEST.jsonl [...]
# (the pairs of `rlft data tiny-python-expr --preferences --jsonl`). A diagnostic for
# docs/reward-model.md ("On the default model"), not a golden.
# Does the base LM itself rank the right answer above the wrong one? For each wrong-number pair,
# compare log p(chosen completion | prompt) with log p(rejected completion | prompt) under
# SmolLM2-135M-Instruct (HF weights), the chat template and system prompt as the RM reads them.
import json, sys, torch
from transformers import AutoTokenizer, AutoModelForCausalLM
torch.set_num_threads(2)
d = sys.argv[1]
tok = AutoTokenizer.from_pretrained(d); m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
SYS = "You are a careful arithmetic assistant. Solve the expression and respond briefly. Return the final result in the format \\boxed{answer}. Do not add unnecessary explanation."
def lp(prompt, comp):
    msgs = [{"role": "system", "content": SYS}] + prompt
    p = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    ids_p = tok(p, add_special_tokens=False).input_ids
    ids = tok(p + comp, add_special_tokens=False).input_ids
    with torch.no_grad():
        logits = m(torch.tensor([ids])).logits[0].log_softmax(-1)
    return sum(logits[i - 1, ids[i]].item() for i in range(len(ids_p), len(ids)))
for f in sys.argv[2:]:
    rows = [json.loads(l) for l in open(f)]
    w = [r for r in rows if r["extra_info"]["rejected_kind"] == "wrong_number"]
    ok = sum(lp(r["prompt"], r["chosen"][0]["content"]) > lp(r["prompt"], r["rejected"][0]["content"]) for r in w)
    print(f"{f}: base LM likelihood ranks the right answer first on {ok}/{len(w)} wrong-number pairs")
