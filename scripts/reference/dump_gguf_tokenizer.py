"""Dump the tokenizer arrays of a GGUF file to JSON, for rlft-text's dev check
(crates/rlft-text/tests/gguf_tokenizer.rs) of `build_bpe_tokenizer` against a real vocabulary.

usage: python scripts/reference/dump_gguf_tokenizer.py MODEL.gguf OUT.json
  e.g. ~/.cache/rlft/reference/venv/bin/python scripts/reference/dump_gguf_tokenizer.py \
         "$(./scripts/fetch-default-model.sh)" /tmp/smollm2_vocab.json

Writes {"tokenizer.ggml.tokens": [...], "tokenizer.ggml.merges": [...], ...} with the keys the
test reads (missing keys are null). Needs the `gguf` package (pip install gguf).
"""
import json
import sys

from gguf import GGUFReader, GGUFValueType

KEYS = [
    "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.merges",
    "tokenizer.ggml.token_type", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id", "tokenizer.ggml.add_bos_token",
    "tokenizer.chat_template",
]


def value(field):
    if field.types[0] == GGUFValueType.ARRAY:
        item_type = field.types[1]
        items = [field.parts[i] for i in field.data]
        if item_type == GGUFValueType.STRING:
            return [bytes(p).decode("utf-8") for p in items]
        return [p.tolist()[0] for p in items]
    part = field.parts[field.data[0]]
    if field.types[0] == GGUFValueType.STRING:
        return bytes(part).decode("utf-8")
    return part.tolist()[0]


def main():
    reader = GGUFReader(sys.argv[1])
    out = {key: (value(reader.fields[key]) if key in reader.fields else None) for key in KEYS}
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False)
    print(f"{len(out['tokenizer.ggml.tokens'])} tokens, {len(out['tokenizer.ggml.merges'] or [])} merges, "
          f"pre={out['tokenizer.ggml.pre']!r} -> {sys.argv[2]}")


if __name__ == "__main__":
    main()
