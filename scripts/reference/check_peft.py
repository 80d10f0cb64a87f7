"""Check rlft's LoRA adapters against PEFT and transformers, on tiny random models of every family.

usage:
    cargo test --release -p rlft-model --test lora -- --ignored write_peft_check_fixtures
    ~/.cache/rlft/reference/venv/bin/python scripts/reference/check_peft.py [DIR]

DIR (default /tmp/rlft-peft-check, or RLFT_PEFT_CHECK_DIR) holds, per family (llama: q_proj,v_proj;
qwen2: all-linear; qwen3: all-linear with rsLoRA), what rlft wrote: `<fam>-base` (HF dir),
`<fam>-adapter` (PEFT adapter dir, non-zero B), `<fam>-merged` (HF dir from rlft's merge_lora) and
`expected.json` (rlft's logits of the adapter model). Checks, per family:
  1. PeftModel.from_pretrained(base, adapter) reads r / lora_alpha / use_rslora / targets as saved,
     and its logits match rlft's adapter model;
  2. the merged dir loads in transformers and its logits match rlft's adapter model;
  3. PEFT's merge_and_unload weights match rlft's merged weights;
  4. the other direction, when the rlft binary exists (RLFT_BIN, default target/release/rlft): an
     adapter made and saved by PEFT (random B, other targets and rank) is merged by
     `rlft merge`, and transformers' logits of that merged dir match PEFT's adapter model.
Prints the max abs differences and exits non-zero above 1e-4. Not run in CI (needs torch + peft).
"""
import json
import os
import subprocess
import sys

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

TOL = 1e-4
root = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("RLFT_PEFT_CHECK_DIR", "/tmp/rlft-peft-check")
expected = json.load(open(os.path.join(root, "expected.json")))
torch.set_num_threads(2)
worst = 0.0


def logits_of(model, rows):
    out = []
    with torch.no_grad():
        for ids in rows:
            out.append(model(torch.tensor([ids])).logits[0].float())
    return out


def max_diff(got, want):
    return max((g - torch.tensor(w)).abs().max().item() for g, w in zip(got, want))


for fam, case in expected.items():
    rows, want = case["rows"], case["logits"]
    base_dir, adapter_dir, merged_dir = (os.path.join(root, f"{fam}-{k}") for k in ("base", "adapter", "merged"))
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    peft_model = PeftModel.from_pretrained(base, adapter_dir)
    peft_model.eval()
    cfg = peft_model.peft_config["default"]
    saved = json.load(open(os.path.join(adapter_dir, "adapter_config.json")))
    assert cfg.r == saved["r"] and cfg.lora_alpha == saved["lora_alpha"], cfg
    assert cfg.use_rslora == saved["use_rslora"], cfg
    assert set(cfg.target_modules) == set(saved["target_modules"]), (cfg.target_modules, saved["target_modules"])
    n_lora = sum(1 for n, _ in peft_model.named_parameters() if "lora_" in n)
    n_saved = len(load_file(os.path.join(adapter_dir, "adapter_model.safetensors")))
    assert n_lora == n_saved, (n_lora, n_saved)
    # The adapter must matter, or the comparison proves nothing.
    with peft_model.disable_adapter():
        base_logits = logits_of(peft_model, rows)
    moved = max_diff(base_logits, want)
    assert moved > 1e-2, f"{fam}: adapter changes logits by only {moved}"
    d_peft = max_diff(logits_of(peft_model, rows), want)

    merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32)
    merged.eval()
    d_merged = max_diff(logits_of(merged, rows), want)

    peft_merged = peft_model.merge_and_unload().state_dict()
    ours = merged.state_dict()
    d_weights = max((peft_merged[k] - ours[k]).abs().max().item() for k in ours if k in peft_merged)

    scaling = cfg.lora_alpha / (cfg.r ** 0.5 if cfg.use_rslora else cfg.r)
    print(
        f"{fam}: r {cfg.r} alpha {cfg.lora_alpha} rslora {cfg.use_rslora} scaling {scaling:g} "
        f"targets {sorted(cfg.target_modules)} ({n_lora} lora tensors); adapter moves logits by "
        f"{moved:.3f}; max |logits diff| PEFT vs rlft {d_peft:.2e}, rlft-merged (transformers) vs "
        f"rlft {d_merged:.2e}; max |weight diff| PEFT merge_and_unload vs rlft merge {d_weights:.2e}"
    )
    worst = max(worst, d_peft, d_merged, d_weights)

HERE = os.path.dirname(os.path.abspath(__file__))
rlft_bin = os.environ.get("RLFT_BIN", os.path.join(HERE, "../../target/release/rlft"))
if os.path.exists(rlft_bin):
    for i, fam in enumerate(expected):
        rows = expected[fam]["rows"]
        base_dir = os.path.join(root, f"{fam}-base")
        torch.manual_seed(i)
        base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
        cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["k_proj", "o_proj", "up_proj"],
                         use_rslora=(i % 2 == 1), init_lora_weights=False, task_type="CAUSAL_LM")
        peft_model = get_peft_model(base, cfg)
        peft_model.eval()
        want = [l.tolist() for l in logits_of(peft_model, rows)]
        adapter_dir = os.path.join(root, f"{fam}-peft-adapter")
        merged_dir = os.path.join(root, f"{fam}-peft-merged")
        peft_model.save_pretrained(adapter_dir)
        subprocess.run([rlft_bin, "merge", "--model", base_dir, "--adapter", adapter_dir,
                        "--output", merged_dir, "--overwrite"], check=True)
        merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32)
        merged.eval()
        d = max_diff(logits_of(merged, rows), want)
        print(f"{fam}: PEFT-made adapter (r 4, k/o/up, rslora {cfg.use_rslora}) merged by "
              f"`rlft merge`: max |logits diff| vs PEFT {d:.2e}")
        worst = max(worst, d)
else:
    print(f"skipped the PEFT -> rlft direction: no rlft binary at {rlft_bin}")

print(f"max diff over all checks: {worst:.2e} (tolerance {TOL:g})")
sys.exit(0 if worst <= TOL else 1)
