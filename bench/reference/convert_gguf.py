"""Dequantise the default model's GGUF (SmolLM2-135M-Instruct, Q4_1) into a float32 Hugging Face
directory, the model bench.py and grpo.py load; setup.sh runs it.

    python bench/reference/convert_gguf.py GGUF OUT_DIR

transformers reads the GGUF itself (`from_pretrained(..., gguf_file=...)`), dequantising every
weight to float32. Three things it does not do are done here (`load_gguf`, which
`scripts/reference/smollm2_golden.py` uses too):

- the tokenizer: transformers builds SmolLM2's pre-tokenizer as plain GPT-2 ByteLevel; SmolLM2's
  own tokenizer.json (and llama.cpp, and rlft) split digits one by one first. That pre-tokenizer is
  restored, so the reference tokenises like the model's real tokenizer (the two differ only where
  a run of whitespace precedes a digit);
- saving: transformers keeps its GGUF quantizer attached to a model it has fully dequantised and
  then refuses `save_pretrained`; the weights are checked to be dense float32 and it is detached;
- config.json: the legacy top-level `rope_theta` is added beside transformers 5's
  `rope_parameters`, for loaders that only know the older layout.

The saved directory is reloaded and must give the same logits as the model in memory; the script
ends by printing a greedy answer to a chat prompt, to show the model works.
"""

import json
import os
import sys


def load_gguf(gguf_path):
    """(model, tokenizer) from the GGUF: float32, eval mode, tokenizer as the model's own."""
    import torch
    from tokenizers import pre_tokenizers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = os.path.split(os.path.abspath(gguf_path))
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    model.eval()
    bad = [n for n, p in model.named_parameters() if p.dtype != torch.float32]
    if bad or any("gguf" in type(m).__module__ for m in model.modules()):
        raise SystemExit(f"the GGUF did not load as dense float32 weights (e.g. {bad[:3]})")
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    backend = tok.backend_tokenizer
    current = json.loads(backend.to_str())["pre_tokenizer"]
    if current.get("type") == "ByteLevel":
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ])
    return model, tok


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    gguf_path, out = sys.argv[1], sys.argv[2]
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(min(2, os.cpu_count() or 1))
    model, tok = load_gguf(gguf_path)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    cfg_path = os.path.join(out, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg.setdefault("rope_theta", cfg["rope_parameters"]["rope_theta"])
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    for name in os.listdir(out):  # safetensors writes 0600
        os.chmod(os.path.join(out, name), 0o644)

    again = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    tok2 = AutoTokenizer.from_pretrained(out)
    messages = [{"role": "user", "content": "What is 3 + 4 * 2? Put the final answer in \\boxed{}."}]
    text = tok2.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    enc = tok2(text, return_tensors="pt")
    if enc["input_ids"].tolist() != tok(text, return_tensors="pt")["input_ids"].tolist():
        raise SystemExit("the saved tokenizer encodes differently from the converted one")
    with torch.no_grad():
        if not torch.equal(model(**enc).logits, again(**enc).logits):
            raise SystemExit(f"{out} reloads with different logits")
        ids = again.generate(**enc, max_new_tokens=48, do_sample=False,
                             pad_token_id=tok2.pad_token_id)
    answer = tok2.decode(ids[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    params = sum(p.numel() for p in again.parameters())
    print(f"wrote {out}: {params:,} float32 parameters; it reloads identically")
    print(f"greedy answer to {messages[0]['content']!r}: {answer!r}")


if __name__ == "__main__":
    main()
