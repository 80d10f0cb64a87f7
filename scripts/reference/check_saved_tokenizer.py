"""Check that a tokenizer directory written by rlft-text's `save_tokenizer_dir` loads in
transformers and behaves as written.

usage: python scripts/reference/check_saved_tokenizer.py SAVED_DIR [REFERENCE_DIR]

SAVED_DIR: written by save_tokenizer_dir (e.g. by the gguf_tokenizer test with
RLFT_SAVE_TOKENIZER_TO=SAVED_DIR). REFERENCE_DIR: a Hugging Face tokenizer directory of the same
model to compare special tokens, chat template and ids with.
Checks: AutoTokenizer loads it; its ids and decodes equal those of the raw tokenizer.json (the
`tokenizers` library, which rlft-text also uses), so transformers adds nothing (no BOS, no
cleanup); apply_chat_template gives the same text as with the reference. Exits non-zero on failure.
"""
import sys

from tokenizers import Tokenizer
from transformers import AutoTokenizer

TEXTS = [
    "Hello world!",
    "Compute this Python-style arithmetic expression.\nExpression: ((10 - 3) + 13)\nReturn only the final result.",
    "Héllo wörld! 日本語 emoji 🤗 tabs\tand\nnewlines  ",
    "12345 + 678 = 13023",
    "<|im_start|>user\nhi<|im_end|>\n",
    "a  2 b\n\n3 don't  ",
]
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"}]


def main():
    saved = sys.argv[1]
    ref_dir = sys.argv[2] if len(sys.argv) > 2 else None
    tok = AutoTokenizer.from_pretrained(saved)
    raw = Tokenizer.from_file(f"{saved}/tokenizer.json")
    print(f"loaded {type(tok).__name__}: bos={tok.bos_token!r} eos={tok.eos_token!r} pad={tok.pad_token!r} unk={tok.unk_token!r}")
    failures = []
    for text in TEXTS:
        ids = tok(text)["input_ids"]
        if ids != raw.encode(text).ids:
            failures.append(f"ids of {text!r}: transformers {ids} vs tokenizer.json {raw.encode(text).ids}")
        for skip in (False, True):
            a, b = tok.decode(ids, skip_special_tokens=skip), raw.decode(ids, skip_special_tokens=skip)
            if a != b:
                failures.append(f"decode(skip={skip}) of {text!r}: {a!r} vs {b!r}")
    if ref_dir:
        ref = AutoTokenizer.from_pretrained(ref_dir)
        for attr in ("bos_token", "eos_token", "pad_token", "unk_token", "chat_template"):
            if getattr(tok, attr) != getattr(ref, attr):
                failures.append(f"{attr}: {getattr(tok, attr)!r} vs reference {getattr(ref, attr)!r}")
        for gen in (True, False):
            a = tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=gen)
            b = ref.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=gen)
            if a != b:
                failures.append(f"apply_chat_template(add_generation_prompt={gen}): {a!r} vs {b!r}")
        differ = [t for t in TEXTS if tok(t)["input_ids"] != ref(t)["input_ids"]]
        print(f"ids equal to the reference on {len(TEXTS) - len(differ)}/{len(TEXTS)} texts; differing: {differ}")
    for failure in failures:
        print("FAIL", failure)
    print("OK" if not failures else f"{len(failures)} failures")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
