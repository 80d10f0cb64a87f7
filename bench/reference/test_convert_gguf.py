"""Checks of convert_gguf.py's own logic on tiny inputs, without torch or a model file: the GGUF ->
HF tensor names and layouts (Llama's q/k permutation undone, Qwen2's biases, a separate head,
K-quants dequantised), and the tokenizer set from `tokenizer.ggml.pre` and the token types.

    python bench/reference/test_convert_gguf.py      # needs numpy, gguf, tokenizers (the venv's)

Prints `N passed, 0 failed`; exits non-zero on a failure.
"""

import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import convert_gguf as cg  # noqa: E402


def permute(w, heads):
    """llama.cpp's convert_hf_to_gguf.py `LlamaModel.permute` (HF -> GGUF row order)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# K-quants (256 weights a block): bytes per block, byte offsets of the block's f16 scales.
K_BLOCKS = {"Q4_K": (144, (0, 2)), "Q6_K": (210, (208,))}


def quantized(rng, shape, qtype):
    """(float32 array, the GGUF data of `qtype` that dequantises to it). gguf-py cannot quantise
    K-quants: their blocks are random bytes with a small scale, dequantised by gguf-py."""
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import dequantize, quantize

    a = rng.standard_normal(shape).astype(np.float32)
    if qtype == Q.F32:
        return a, a
    if qtype.name not in K_BLOCKS:
        data = quantize(a, qtype)
        return dequantize(data, qtype).astype(np.float32), data
    size, scales = K_BLOCKS[qtype.name]
    rows, cols = shape
    data = rng.integers(0, 256, (rows, cols // 256 * size), dtype=np.uint8)
    scale = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    for b in range(cols // 256):
        for at in scales:
            data[:, b * size + at:b * size + at + 2] = scale
    return dequantize(data, qtype).astype(np.float32), data


def write_gguf(path, arch, tensors, heads, kv_heads):
    """A GGUF of `tensors` {gguf name: (GGUF data, ggml type)}."""
    from gguf import GGMLQuantizationType as Q, GGUFWriter

    w = GGUFWriter(path, arch)
    w.add_block_count(1)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_embedding_length(32)
    w.add_feed_forward_length(256)
    for name, (data, qtype) in tensors.items():
        w.add_tensor(name, data, raw_dtype=None if qtype == Q.F32 else qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def model_tensors(rng, arch, heads, kv_heads, separate_head):
    """{gguf name: (float32 weight in HF layout, GGUF data, ggml type)} of one tiny layer:
    hidden 32, head_dim 32 / heads, ffn 256, vocab 256, in the types of a Q4_K_M mix."""
    from gguf import GGMLQuantizationType as Q

    hd = 32 // heads
    spec = {
        "token_embd.weight": ((256, 32), Q.Q5_0),
        "output_norm.weight": ((32,), Q.F32),
        "blk.0.attn_norm.weight": ((32,), Q.F32),
        "blk.0.ffn_norm.weight": ((32,), Q.F32),
        "blk.0.attn_q.weight": ((heads * hd, 32), Q.F32),
        "blk.0.attn_k.weight": ((kv_heads * hd, 32), Q.F32),
        "blk.0.attn_v.weight": ((kv_heads * hd, 32), Q.Q8_0),
        "blk.0.attn_output.weight": ((32, 32), Q.Q8_0),
        # ggml rows are 256 wide for K-quants: the ffn weights stand in with that row length
        "blk.0.ffn_gate.weight": ((32, 256), Q.Q4_K),
        "blk.0.ffn_up.weight": ((32, 256), Q.Q4_K),
        "blk.0.ffn_down.weight": ((32, 256), Q.Q6_K),
    }
    if arch == "qwen2":
        for p, n in (("q", heads), ("k", kv_heads), ("v", kv_heads)):
            spec[f"blk.0.attn_{p}.bias"] = ((n * hd,), Q.F32)
    if separate_head:
        spec["output.weight"] = ((256, 32), Q.Q8_0)
    return {k: (*quantized(rng, shape, q), q) for k, (shape, q) in spec.items()}


CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


@check
def names_cover_a_qwen2_file():
    names = ["token_embd.weight", "output.weight", "output_norm.weight"] + [
        f"blk.23.{m}.{k}" for m in ("attn_q", "attn_k", "attn_v") for k in ("weight", "bias")] + [
        f"blk.23.{m}.weight" for m in ("attn_norm", "ffn_norm", "attn_output", "ffn_gate",
                                       "ffn_up", "ffn_down", "attn_q_norm", "attn_k_norm")]
    got = {n: cg.hf_name(n) for n in names}
    assert None not in got.values(), got
    assert got["blk.23.attn_q.bias"] == "model.layers.23.self_attn.q_proj.bias"
    assert got["output.weight"] == "lm_head.weight"
    assert cg.hf_name("rope_freqs.weight") is None and cg.hf_name("blk.x.attn_q.weight") is None


@check
def tensors_come_back_in_hf_layout():
    from gguf import GGMLQuantizationType as Q, GGUFReader

    rng = np.random.default_rng(0)
    for arch, separate in (("llama", False), ("qwen2", True)):
        heads, kv = 4, 2
        hf = model_tensors(rng, arch, heads, kv, separate)
        on_disk = {k: (data, q) for k, (_, data, q) in hf.items()}
        if arch == "llama":  # llama.cpp stores Llama's q/k rows permuted
            on_disk["blk.0.attn_q.weight"] = (permute(hf["blk.0.attn_q.weight"][0], heads), Q.F32)
            on_disk["blk.0.attn_k.weight"] = (permute(hf["blk.0.attn_k.weight"][0], kv), Q.F32)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "tiny.gguf")
            write_gguf(path, arch, on_disk, heads, kv)
            got = dict(cg.gguf_weights(GGUFReader(path)))
        assert len(got) == len(hf), (arch, sorted(got))
        for gname, (want, _, qtype) in hf.items():
            w = got[cg.hf_name(gname)]
            assert w.dtype == np.float32 and w.shape == want.shape, (arch, gname, w.shape)
            assert np.array_equal(w, want), (arch, gname, qtype.name, float(np.abs(w - want).max()))
        assert ("lm_head.weight" in got) == separate


@check
def an_unknown_tensor_stops_the_conversion():
    from gguf import GGMLQuantizationType as Q, GGUFReader

    rng = np.random.default_rng(1)
    on_disk = {k: (data, q) for k, (_, data, q) in model_tensors(rng, "llama", 4, 2, False).items()}
    on_disk["blk.0.mystery.weight"] = (np.ones(4, np.float32), Q.F32)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "tiny.gguf")
        write_gguf(path, "llama", on_disk, 4, 2)
        try:
            dict(cg.gguf_weights(GGUFReader(path)))
        except SystemExit as e:
            assert "mystery" in str(e)
        else:
            raise AssertionError("no error for an unknown tensor")


class Field:
    def __init__(self, value):
        self.value = value

    def contents(self):
        return self.value


class Reader:
    def __init__(self, **kv):
        self.fields = {k.replace("__", "."): Field(v) for k, v in kv.items()}


def tiny_tokenizer():
    """A byte-level BPE over digits and `a`, with GPT-2's ByteLevel pre-tokenizer (what
    transformers builds for a `gpt2` GGUF vocabulary)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tokens = ["1", "2", "3", "4", "5", "a", "Ġ", "12", "123", "45", "Ġa", "<|im_end|>", "<tool>"]
    merges = [("1", "2"), ("12", "3"), ("4", "5"), ("Ġ", "a")]
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    types = [1] * 11 + [cg.CONTROL, cg.USER_DEFINED]
    return tok, tokens, types


def pieces(tok, text):
    return tok.encode(text).tokens


@check
def the_pre_tokenizer_follows_tokenizer_ggml_pre():
    want = {"gpt2": ["123", "45"], "smollm": ["1", "2", "3", "4", "5"],
            "qwen2": ["1", "2", "3", "4", "5"], "llama-bpe": ["123", "45"]}
    for pre, expect in want.items():
        tok, tokens, types = tiny_tokenizer()
        reader = Reader(tokenizer__ggml__model="gpt2", tokenizer__ggml__pre=pre,
                        tokenizer__ggml__tokens=tokens, tokenizer__ggml__token_type=types)
        changed = cg.fix_tokenizer(tok, reader)
        assert pieces(tok, "12345") == expect, (pre, pieces(tok, "12345"), changed)
        assert pieces(tok, "a<|im_end|>a <tool>") == ["a", "<|im_end|>", "a", "Ġ", "<tool>"], pre
        assert tok.decode(tok.encode("a<|im_end|><tool>").ids) == "a<tool>", pre
        assert tok.model.ignore_merges == (pre == "llama-bpe"), pre
        if pre == "gpt2":
            assert not any("pre-tokenizer" in c for c in changed), changed
        if pre == "qwen2":
            assert "NFC" in tok.to_str() and pieces(tok, "a  a") == ["a", "Ġ", "Ġa"], pieces(tok, "a  a")
    tok, tokens, types = tiny_tokenizer()
    try:
        cg.fix_tokenizer(tok, Reader(tokenizer__ggml__pre="mystery", tokenizer__ggml__tokens=tokens))
    except SystemExit as e:
        assert "mystery" in str(e)
    else:
        raise AssertionError("no error for an unknown pre-tokenizer")


def main():
    failed = 0
    for fn in CHECKS:
        try:
            fn()
            print(f"ok   {fn.__name__}")
        except Exception as e:  # noqa: BLE001 - reported, counted
            failed += 1
            print(f"FAIL {fn.__name__}: {type(e).__name__}: {e}")
    print(f"{len(CHECKS) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
