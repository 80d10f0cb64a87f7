#!/usr/bin/env python3
"""Golden references for tiny random Llama / Qwen2 / Qwen3 models, computed by HF transformers.

For each of three tiny configs this script
  1. builds the model (float32, eager attention) from a transformers config class,
  2. overwrites every parameter with the deterministic initialiser below (seed 0), so that the Rust
     tests can rebuild bit-identical weights with `rlft_model::testing::det_init` -- no weights are
     committed anywhere,
  3. saves the HF directory with `save_pretrained` to a temp dir (outside the repo), reads back the
     `config.json` transformers wrote, and checks that re-loading the dir gives the same log-probs,
  4. runs fixed inputs through the model and records next-token log-probs, the last position's
     top-5 logits and a greedy continuation,
  5. writes crates/rlft-model/tests/golden/<name>.json.

usage (baseline venv, see scripts/reference/README.md):
    flock /tmp/rlft-bench.lock ~/.cache/rlft/reference/venv/bin/python scripts/reference/tiny_models.py
    python3 scripts/reference/tiny_models.py --check-values   # initialiser pins only, no torch needed

The deterministic initialiser (identical in Rust: crates/rlft-model/src/testing/det_init.rs)
-------------------------------------------------------------------------------------------
For a tensor named `name` (HF weight name) with n elements in row-major order and a u64 `seed`:
    state = fnv1a64(utf8(name)) ^ (seed * 0x9E3779B97F4A7C15 mod 2^64)
    for i in 0..n:
        state += 0x9E3779B97F4A7C15 (mod 2^64)
        z = splitmix64_mix(state)
        u = (z >> 40) / 2^24            # in [0, 1), exact in f64
        x = 2u - 1                      # in [-1, 1), exact in f64
        value = linear weight [out, in]: x / sqrt(in)
                embedding / untied lm_head: x * 0.5
                RMSNorm weight (`*norm.weight`): 1 + 0.1 * x
                bias: 0.1 * x
    computed in f64, cast to f32 (round to nearest even) at the end.
The scales were not adjusted: the resulting log-probs are well spread (see `logprob_stats` in the
JSON files).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import struct
import sys
import tempfile

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
SEED = 0
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT_DIR = os.path.join(REPO, "crates", "rlft-model", "tests", "golden")


# ----------------------------------------------------------------------------------------------
# deterministic initialiser (pure Python, exact integer arithmetic)
# ----------------------------------------------------------------------------------------------
def fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & MASK64
    return h


def det_unit(name: str, seed: int, n: int) -> list[float]:
    """The raw x = 2u - 1 values in [-1, 1) (f64)."""
    state = fnv1a64(name.encode("utf-8")) ^ ((seed * GOLDEN) & MASK64)
    out = []
    for _ in range(n):
        state = (state + GOLDEN) & MASK64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        z = z ^ (z >> 31)
        u = (z >> 40) / 16777216.0
        out.append(2.0 * u - 1.0)
    return out


def init_kind_for(name: str, shape: tuple[int, ...]):
    """Same decision as the Rust `init_kind_for`: ("linear", fan_in) | ("embedding",) | ("norm",) | ("bias",)."""
    if name.endswith("norm.weight"):
        return ("norm",)
    if name.endswith(".bias"):
        return ("bias",)
    if "embed_tokens" in name or "lm_head" in name:
        return ("embedding",)
    if name.endswith(".weight") and len(shape) == 2:
        return ("linear", shape[1])
    raise ValueError(f"no init kind for {name} {shape}")


def det_values_f64(name: str, seed: int, n: int, kind) -> list[float]:
    xs = det_unit(name, seed, n)
    if kind[0] == "linear":
        s = math.sqrt(float(kind[1]))
        return [x / s for x in xs]
    if kind[0] == "embedding":
        return [x * 0.5 for x in xs]
    if kind[0] == "norm":
        return [1.0 + 0.1 * x for x in xs]
    if kind[0] == "bias":
        return [0.1 * x for x in xs]
    raise ValueError(kind)


def f32_bits(v: float) -> int:
    # struct's 'f' packing rounds to nearest even, like Rust's `as f32`
    return struct.unpack("<I", struct.pack("<f", v))[0]


def f32_of_bits(b: int) -> float:
    return struct.unpack("<f", struct.pack("<I", b))[0]


CHECK_VALUES = [
    # (name, seed, n, kind, indices to print)
    ("model.layers.0.self_attn.q_proj.weight", 0, 4, ("linear", 64), [0, 1, 2, 3]),
    ("model.embed_tokens.weight", 0, 2000, ("embedding",), [0, 1, 1999]),
    ("model.layers.1.post_attention_layernorm.weight", 0, 3, ("norm",), [0, 1, 2]),
    ("model.layers.0.self_attn.k_proj.bias", 1, 3, ("bias",), [0, 2]),
    ("model.layers.0.mlp.down_proj.weight", 7, 10, ("linear", 160), [9]),
]


def print_check_values() -> None:
    print("fnv1a64(b'') =", hex(fnv1a64(b"")))
    print("fnv1a64(b'a') =", hex(fnv1a64(b"a")))
    print("fnv1a64('model.embed_tokens.weight') =", hex(fnv1a64(b"model.embed_tokens.weight")))
    for name, seed, n, kind, idxs in CHECK_VALUES:
        vals = det_values_f64(name, seed, n, kind)
        for i in idxs:
            b = f32_bits(vals[i])
            print(f"{name} seed={seed} kind={kind} [{i}] = {f32_of_bits(b)!r} (f32 bits 0x{b:08x})")


# ----------------------------------------------------------------------------------------------
# fixed inputs
# ----------------------------------------------------------------------------------------------
SEQ_LENS = [17, 11]
IDS_FORMULA = "ids[k][j] = (3 + 101*k + 37*j + 11*j*j) % vocab_size, j = 0..len_k-1, len = [17, 11]"
GEN_NEW_TOKENS = 8


def make_ids(k: int, length: int, vocab: int) -> list[int]:
    return [(3 + 101 * k + 37 * j + 11 * j * j) % vocab for j in range(length)]


def sig7(v: float) -> float:
    return float(f"{v:.7g}")


# ----------------------------------------------------------------------------------------------
# tiny configs
# ----------------------------------------------------------------------------------------------
def make_configs():
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    # transformers 5 keeps every RoPE setting (theta included) in `rope_parameters`, and that is what
    # it writes to config.json. transformers 4.x wrote `"rope_theta": ...` at the top level and
    # the Llama-3 scaling as `"rope_scaling": {"rope_type": "llama3", "factor": ..., ...}` (older
    # checkpoints use the key "type" instead of "rope_type"). The Rust config reader must accept both.
    tiny_llama = LlamaConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rms_norm_eps=1e-5,
        max_position_embeddings=512,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 10000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        tie_word_embeddings=False,
        attention_bias=False,
        mlp_bias=False,
        hidden_act="silu",
    )
    tiny_qwen2 = Qwen2Config(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-6,
        max_position_embeddings=512,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        tie_word_embeddings=True,
        use_sliding_window=False,
        hidden_act="silu",
    )
    tiny_qwen3 = Qwen3Config(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,  # deliberately != hidden_size / num_attention_heads (= 16)
        rms_norm_eps=1e-6,
        max_position_embeddings=512,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        tie_word_embeddings=False,
        attention_bias=False,
        use_sliding_window=False,
        hidden_act="silu",
    )
    return {"tiny_llama": tiny_llama, "tiny_qwen2": tiny_qwen2, "tiny_qwen3": tiny_qwen3}


# ----------------------------------------------------------------------------------------------
# model building / running
# ----------------------------------------------------------------------------------------------
def det_init_model(model, seed: int) -> list:
    """Overwrite every tensor of model.state_dict() in place.

    Tied tensors (Qwen2's lm_head.weight == model.embed_tokens.weight) share storage: only the first
    name (embed_tokens) is initialised, the alias is checked to carry the same values.
    Returns [name, shape, kind] for each initialised tensor."""
    import torch

    sd = model.state_dict()
    seen = {}
    done = []
    for name, t in sd.items():
        ptr = t.data_ptr()
        if ptr in seen:
            assert torch.equal(t, sd[seen[ptr]]), (name, seen[ptr])
            continue
        seen[ptr] = name
        kind = init_kind_for(name, tuple(t.shape))
        vals = det_values_f64(name, seed, t.numel(), kind)
        new = torch.tensor(vals, dtype=torch.float64).to(torch.float32).reshape(t.shape)
        # torch's f64 -> f32 cast rounds like struct / Rust `as f32` (the pinned bit patterns)
        head = new.flatten()[:16].view(torch.int32).tolist()
        assert [b & 0xFFFFFFFF for b in head] == [f32_bits(v) for v in vals[:16]], name
        with torch.no_grad():
            t.copy_(new)
        done.append([name, list(t.shape), list(kind)])
    # every parameter must have been reached through state_dict
    for pname, p in model.named_parameters():
        assert sd[pname].data_ptr() == p.data_ptr(), pname
    return done


def run_cases(model, vocab: int):
    import torch

    cases = []
    with torch.no_grad():
        for k, length in enumerate(SEQ_LENS):
            ids = make_ids(k, length, vocab)
            x = torch.tensor([ids], dtype=torch.long)
            logits = model(input_ids=x).logits[0].to(torch.float64)  # [T, V], computed in f32
            lp = torch.log_softmax(logits, dim=-1)
            nt = [lp[t, ids[t + 1]].item() for t in range(length - 1)]
            top = torch.topk(logits[-1], 5)
            cases.append(
                {
                    "ids": ids,
                    "next_token_logprobs": nt,
                    "last_top5_ids": top.indices.tolist(),
                    "last_top5_logits": top.values.tolist(),
                }
            )
    return cases


def greedy(model, ids: list[int]):
    import torch
    from transformers import GenerationConfig

    gc = GenerationConfig(
        do_sample=False,
        max_new_tokens=GEN_NEW_TOKENS,
        min_new_tokens=0,
        eos_token_id=None,  # never stop early: exactly GEN_NEW_TOKENS tokens
        pad_token_id=0,
    )
    x = torch.tensor([ids], dtype=torch.long)
    with torch.no_grad():
        out = model.generate(x, generation_config=gc)
    new = out[0, len(ids) :].tolist()
    assert len(new) == GEN_NEW_TOKENS, new
    # cross-check the KV-cached generate against a cache-free argmax loop
    seq = list(ids)
    with torch.no_grad():
        for _ in range(GEN_NEW_TOKENS):
            logits = model(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1]
            seq.append(int(torch.argmax(logits)))
    assert seq[len(ids) :] == new, (seq[len(ids) :], new)
    return new


def build_one(name: str, config, tmp: str):
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
    model.eval()
    assert model.config._attn_implementation == "eager"
    assert all(p.dtype == torch.float32 for p in model.parameters())
    initialised = det_init_model(model, SEED)

    save_dir = os.path.join(tmp, name)
    model.save_pretrained(save_dir)
    with open(os.path.join(save_dir, "config.json")) as f:
        saved_config = json.load(f)
    from safetensors import safe_open

    with safe_open(os.path.join(save_dir, "model.safetensors"), "pt") as f:
        saved_tensors = sorted(f.keys())
        assert all(f.get_tensor(k).dtype == torch.float32 for k in saved_tensors)

    # transformers 5 writes RoPE settings as `rope_parameters` (see make_configs); make sure of it
    assert "rope_parameters" in saved_config, saved_config
    assert "rope_scaling" not in saved_config or saved_config["rope_scaling"] is None, saved_config
    assert "rope_theta" in saved_config["rope_parameters"], saved_config

    cases = run_cases(model, config.vocab_size)
    gen = greedy(model, cases[0]["ids"])

    # sanity: the saved dir reloads to the same model
    re = AutoModelForCausalLM.from_pretrained(save_dir, attn_implementation="eager", dtype=torch.float32)
    re.eval()
    cases2 = run_cases(re, config.vocab_size)
    for a, b in zip(cases, cases2):
        d = max(abs(p - q) for p, q in zip(a["next_token_logprobs"], b["next_token_logprobs"]))
        assert d < 1e-6, (name, d)
        assert a["last_top5_ids"] == b["last_top5_ids"], name
    for (pn, p), (qn, q) in zip(model.state_dict().items(), re.state_dict().items()):
        assert pn == qn and torch.equal(p, q), (pn, qn)

    all_lp = [v for c in cases for v in c["next_token_logprobs"]]
    stats = {
        "min": sig7(min(all_lp)),
        "max": sig7(max(all_lp)),
        "mean": sig7(sum(all_lp) / len(all_lp)),
        "max_abs": sig7(max(abs(v) for v in all_lp)),
        "uniform": sig7(-math.log(config.vocab_size)),
    }
    for c in cases:
        c["next_token_logprobs"] = [sig7(v) for v in c["next_token_logprobs"]]
        c["last_top5_logits"] = [sig7(v) for v in c["last_top5_logits"]]

    return {
        "name": name,
        "model_class": type(model).__name__,
        "config": saved_config,
        "seed": SEED,
        "init": "rlft_model::testing::det_init (see scripts/reference/tiny_models.py docstring)",
        "initialised_tensors": initialised,  # [name, shape, init kind], in state_dict order
        "saved_tensors": saved_tensors,  # keys of the saved model.safetensors (tied lm_head absent)
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__},
        "attn_implementation": "eager",
        "dtype": "float32",
        "ids_formula": IDS_FORMULA,
        "rounding": "floats rounded to 7 significant digits",
        "cases": cases,
        "greedy": {
            "prompt_case": 0,
            "max_new_tokens": GEN_NEW_TOKENS,
            "do_sample": False,
            "eos_token_id": None,
            "new_ids": gen,
        },
        "logprob_stats": stats,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check-values", action="store_true", help="print the initialiser pins and exit")
    ap.add_argument("--out-dir", default=OUT_DIR)
    args = ap.parse_args()
    if args.check_values:
        print_check_values()
        return

    import torch

    torch.set_num_threads(min(2, os.cpu_count() or 1))
    os.makedirs(args.out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="rlft-tiny-") as tmp:
        for name, cfg in make_configs().items():
            res = build_one(name, cfg, tmp)
            path = os.path.join(args.out_dir, f"{name}.json")
            with open(path, "w") as f:
                json.dump(res, f, indent=1)
                f.write("\n")
            s = res["logprob_stats"]
            print(
                f"{name}: wrote {os.path.relpath(path, REPO)}; logprobs min {s['min']} max {s['max']} "
                f"mean {s['mean']} (uniform {s['uniform']}); greedy {res['greedy']['new_ids']}",
                file=sys.stderr,
            )


if __name__ == "__main__":
    main()
