"""Dequantise a GGUF (the default model, SmolLM2-135M-Instruct Q4_1, or any Llama / Qwen2 / Qwen3
GGUF such as the built-in qwen2.5-coder-0.5b, a Q4_K_M mix) into a float32 Hugging Face
directory, the model bench.py, grpo.py and offline.py load; setup.sh runs it.

    python bench/reference/convert_gguf.py GGUF OUT_DIR

transformers reads the GGUF itself (`from_pretrained(..., gguf_file=...)`), dequantising every
weight to float32. What it does not do, or does not do the way rlft (and the model's own
tokenizer.json) does, is done here (`load_gguf`, which `scripts/reference/smollm2_golden.py` uses
too):

- the weights: every tensor of the GGUF is dequantised again with the `gguf` package and written
  into the model under its HF name, as rlft's loader (crates/rlft-model/src/gguf_load.rs) names
  it: llama.cpp's q/k row permutation undone for Llama only, Qwen2's q/k/v biases, a separate
  `output.weight` as an untied `lm_head`. Every parameter must be set exactly once, so a tensor
  transformers left out, permuted the wrong way or tied wrongly stops the conversion or is
  replaced (and said so) instead of leaving a randomly initialised or scrambled weight behind.
  Where transformers cannot load the file's weights at all, the model is built from the config
  it reads from the GGUF and filled here;
- the tokenizer: the pre-tokenizer is set from `tokenizer.ggml.pre` as rlft-text's
  `PreTokenizerKind` does (crates/rlft-text/src/bpe.rs): `smollm` and the other StarCoder-style
  vocabularies split every digit first (transformers builds plain GPT-2 ByteLevel there),
  `qwen2` uses Qwen2's split regex and NFC, `llama-bpe` Llama 3's regex with `ignore_merges`;
  the control tokens (`<|im_start|>`, `<|fim_prefix|>`, ...) are special added tokens, the
  user-defined ones (`<tool_call>`) plain added tokens; the chat template and end-of-sequence
  token are the GGUF's;
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

# rlft-text's `PRE_NAMES` (crates/rlft-text/src/bpe.rs): `tokenizer.ggml.pre` -> pre-tokenizer.
PRE_TOKENIZERS = {
    "gpt2": "gpt2", "default": "gpt2",
    "smollm": "digits_gpt2", "starcoder": "digits_gpt2", "refact": "digits_gpt2",
    "codeshell": "digits_gpt2", "exaone": "digits_gpt2", "minerva-7b": "digits_gpt2",
    "qwen2": "qwen2", "deepseek-r1-qwen": "qwen2",
    "llama-bpe": "llama3", "llama3": "llama3", "llama-v3": "llama3", "smaug-bpe": "llama3",
    "dbrx": "llama3", "falcon3": "llama3",
}
# The split regexes of Qwen2 and Llama 3 (their tokenizer.json; rlft-text's QWEN2_SPLIT_REGEX and
# LLAMA3_SPLIT_REGEX): they differ in digits, one by one against runs of up to three.
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
               r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# GGUF token types (llama.cpp's llama_token_type).
CONTROL, USER_DEFINED = 3, 4
# The GGUF architectures whose tensors `hf_name` maps, and their default RoPE base.
ARCHS = {"llama": 10_000.0, "qwen2": 1_000_000.0, "qwen3": 1_000_000.0}


def meta(reader, key, default=None):
    """A GGUF metadata value (strings decoded, arrays as lists), or `default`."""
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def hf_name(gguf_name):
    """The HF parameter name of a llama.cpp tensor (rlft-model's `gguf_load::hf_name`), or None
    for tensors that are not weights of the model."""
    direct = {"token_embd.weight": "model.embed_tokens.weight",
              "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}
    if gguf_name in direct:
        return direct[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) != 4 or parts[0] != "blk" or not parts[1].isdigit():
        return None
    module = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
              "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
              "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
              "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
              "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
              "ffn_down": "mlp.down_proj"}.get(parts[2])
    return None if module is None else f"model.layers.{parts[1]}.{module}.{parts[3]}"


def unpermute_rows(w, heads):
    """Undoes llama.cpp's rotary row permutation of a Llama q/k weight [heads * hd, in] (or bias
    [heads * hd]): the inverse of convert_hf_to_gguf.py's `LlamaModel.permute`."""
    hd = w.shape[0] // heads
    return w.reshape(heads, hd // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_weights(reader):
    """(HF name, float32 numpy array in HF layout) for every weight tensor of the GGUF, in file
    order; raises on a tensor it does not know (rather than leaving it out)."""
    import numpy as np
    from gguf.quants import dequantize

    arch = meta(reader, "general.architecture")
    if arch not in ARCHS:
        raise SystemExit(f"GGUF architecture {arch!r} is not one of {sorted(ARCHS)}")
    heads = int(meta(reader, f"{arch}.attention.head_count"))
    kv_heads = int(meta(reader, f"{arch}.attention.head_count_kv", heads))
    for t in reader.tensors:
        name = hf_name(t.name)
        if name is None:
            raise SystemExit(f"GGUF tensor {t.name!r} has no HF name here; its model is not "
                             "supported by this converter (rlft's loader reads the same set)")
        shape = tuple(int(d) for d in reversed(t.shape))  # ggml lists the fastest axis first
        w = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
        if not w.flags.writeable:  # an F32 tensor is a view of the read-only file mapping
            w = w.copy()
        if arch == "llama" and ".q_proj." in name:
            w = unpermute_rows(w, heads)
        elif arch == "llama" and ".k_proj." in name:
            w = unpermute_rows(w, kv_heads)
        yield name, w


def check_config(config, reader):
    """The config transformers read from the GGUF against the metadata rlft reads."""
    arch = meta(reader, "general.architecture")
    want = {
        "num_hidden_layers": meta(reader, f"{arch}.block_count"),
        "hidden_size": meta(reader, f"{arch}.embedding_length"),
        "intermediate_size": meta(reader, f"{arch}.feed_forward_length"),
        "num_attention_heads": meta(reader, f"{arch}.attention.head_count"),
        "num_key_value_heads": meta(reader, f"{arch}.attention.head_count_kv",
                                    meta(reader, f"{arch}.attention.head_count")),
    }
    bad = {k: (getattr(config, k, None), v) for k, v in want.items() if getattr(config, k, None) != v}
    theta = meta(reader, f"{arch}.rope.freq_base", ARCHS.get(arch))
    got = (getattr(config, "rope_parameters", None) or {}).get("rope_theta",
                                                               getattr(config, "rope_theta", None))
    if got is None or abs(float(got) - float(theta)) > 1e-3 * float(theta):
        bad["rope_theta"] = (got, theta)
    if bad:
        raise SystemExit(f"transformers' config differs from the GGUF's metadata "
                         f"(config, GGUF): {bad}")


def set_weights(model, reader):
    """Writes every GGUF tensor into `model` (see the module doc); the names (and largest
    difference) of those transformers had loaded differently: none where it reads the file right,
    as transformers 5.24 does for Llama and Qwen2 (it dequantises with the same gguf package)."""
    import torch

    params = dict(model.named_parameters())  # a tied head appears once, as the embedding
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    separate_head = any(t.name == "output.weight" for t in reader.tensors)
    if tied == separate_head:
        raise SystemExit(f"the model's LM head is {'tied' if tied else 'separate'} but the GGUF "
                         f"{'has' if separate_head else 'has no'} output.weight")
    seen, replaced = set(), []
    with torch.no_grad():
        for name, w in gguf_weights(reader):
            p = params.get(name)
            if p is None or name in seen:
                raise SystemExit(f"{type(model).__name__} has no parameter {name} (or it came "
                                 "twice) for the GGUF's tensor")
            src = torch.from_numpy(w)
            if tuple(p.shape) != tuple(src.shape):
                raise SystemExit(f"{name}: GGUF shape {tuple(src.shape)}, model {tuple(p.shape)}")
            if not torch.equal(p.data, src):
                replaced.append(f"{name} (max |diff| {(p.data - src).abs().max().item():.3g})")
                p.data.copy_(src)
            seen.add(name)
    missing = sorted(set(params) - seen)
    if missing:
        raise SystemExit(f"the GGUF sets no value for {len(missing)} parameters, e.g. {missing[:4]}")
    return replaced


def fix_tokenizer(backend, reader):
    """Sets the pre-tokenizer (normalizer, BPE option) and the added tokens of a `tokenizers`
    Tokenizer from the GGUF, as rlft-text builds them (see the module doc); what it changed."""
    from tokenizers import AddedToken, Regex, normalizers, pre_tokenizers

    changed = []
    model = meta(reader, "tokenizer.ggml.model")
    if model not in (None, "gpt2"):
        return [f"tokenizer.ggml.model = {model!r}: left as transformers built it"]
    pre = meta(reader, "tokenizer.ggml.pre")
    kind = PRE_TOKENIZERS.get(pre or "gpt2")
    if kind is None:
        raise SystemExit(f"tokenizer.ggml.pre = {pre!r} is not one rlft knows "
                         f"({', '.join(PRE_TOKENIZERS)})")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False,
                                          use_regex=kind in ("gpt2", "digits_gpt2"))
    if kind == "gpt2":
        new = byte_level
    elif kind == "digits_gpt2":
        new = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        regex = QWEN2_SPLIT if kind == "qwen2" else LLAMA3_SPLIT
        new = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False), byte_level])

    def part(key):
        return json.loads(backend.to_str())[key]

    before = part("pre_tokenizer")
    backend.pre_tokenizer = new
    if part("pre_tokenizer") != before:
        changed.append(f"pre-tokenizer set for tokenizer.ggml.pre = {pre!r} ({kind})")
    if kind == "qwen2" and part("normalizer") != {"type": "NFC"}:
        backend.normalizer = normalizers.NFC()
        changed.append("NFC normalizer set")
    if kind == "llama3" and not backend.model.ignore_merges:
        backend.model.ignore_merges = True
        changed.append("BPE ignore_merges set")
    tokens = meta(reader, "tokenizer.ggml.tokens")
    types = meta(reader, "tokenizer.ggml.token_type") or []
    have = {t.content for t in backend.get_added_tokens_decoder().values()}
    for token_type, special in ((CONTROL, True), (USER_DEFINED, False)):
        add = [AddedToken(tokens[i], special=special, normalized=False)
               for i, ty in enumerate(types) if ty == token_type and tokens[i] not in have]
        if not add:
            continue
        if special:
            backend.add_special_tokens(add)
        else:
            backend.add_tokens(add)
        changed.append(f"{len(add)} {'control' if special else 'user-defined'} tokens added")
    return changed


def load_gguf(gguf_path):
    """(model, tokenizer) from the GGUF: float32, eval mode, weights and tokenizer as rlft reads
    them."""
    import torch
    from gguf import GGUFReader
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, name = os.path.split(os.path.abspath(gguf_path))
    reader = GGUFReader(gguf_path)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except Exception as e:  # noqa: BLE001 - said, then the weights are loaded here instead
        print(f"note: transformers could not load the GGUF's weights ({type(e).__name__}: {e}); "
              "building the model from its config and loading them here", file=sys.stderr)
        config = AutoConfig.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_config(config).to(torch.float32)
    model.eval()
    bad = [n for n, p in model.named_parameters() if p.dtype != torch.float32]
    if bad or any("gguf" in type(m).__module__ for m in model.modules()):
        raise SystemExit(f"the GGUF did not load as dense float32 weights (e.g. {bad[:3]})")
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    check_config(model.config, reader)
    replaced = set_weights(model, reader)
    if replaced:
        print(f"note: {len(replaced)} tensors differed from what transformers loaded and were "
              f"replaced by the GGUF's, e.g. {replaced[:4]}", file=sys.stderr)
    for change in fix_tokenizer(tok.backend_tokenizer, reader):
        print(f"tokenizer: {change}", file=sys.stderr)
    template = meta(reader, "tokenizer.chat_template")
    if template is not None and tok.chat_template != template:
        tok.chat_template = template
        print("tokenizer: the GGUF's chat template set", file=sys.stderr)
    tokens = meta(reader, "tokenizer.ggml.tokens")
    eos = meta(reader, "tokenizer.ggml.eos_token_id")
    if eos is not None and tok.eos_token_id != eos:
        print(f"tokenizer: end of sequence {tok.eos_token!r} -> {tokens[eos]!r} (the GGUF's)",
              file=sys.stderr)
        tok.eos_token = tokens[eos]
        model.generation_config.eos_token_id = eos
    pad = meta(reader, "tokenizer.ggml.padding_token_id")
    if tok.pad_token_id is None and pad is not None:
        tok.pad_token = tokens[pad]
    bos = meta(reader, "tokenizer.ggml.bos_token_id")
    if not meta(reader, "tokenizer.ggml.add_bos_token", False) and bos is not None \
            and tok("a")["input_ids"][:1] == [bos]:
        print(f"warning: the tokenizer adds BOS {tokens[bos]!r}, which the GGUF (and rlft) do "
              "not", file=sys.stderr)
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
    if "rope_parameters" in cfg:
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
    probe = "a  2 b\n\n345 + 6789 = 7134 don't  é <|im_end|>"
    if tok2(probe)["input_ids"] != tok(probe)["input_ids"]:
        raise SystemExit("the saved tokenizer encodes differently from the converted one")
    with torch.no_grad():
        if not torch.equal(model(**enc).logits, again(**enc).logits):
            raise SystemExit(f"{out} reloads with different logits")
        ids = again.generate(**enc, max_new_tokens=48, do_sample=False,
                             pad_token_id=tok2.pad_token_id)
    answer = tok2.decode(ids[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    params = sum(p.numel() for p in again.parameters())
    print(f"wrote {out}: {params:,} float32 parameters; it reloads identically")
    print(f"prompt: {enc['input_ids'].shape[1]} tokens; ids of {probe!r}: {tok2(probe)['input_ids']}")
    print(f"greedy answer to {messages[0]['content']!r}: {answer!r}")


if __name__ == "__main__":
    main()
