"""The PyTorch + transformers side of `rlft bench --against-reference`: the same cases as rlft's
(`crates/rlft-cli/src/bench/`), on the same model (the default GGUF dequantised to f32 by
setup.sh), float32 on the CPU.

Cases (one timed repetition each):
  generate  model.generate with the KV cache: BATCH chat prompts (the arithmetic questions of
            rlft's generate case, left-padded), exactly NEW_TOKENS new tokens per row
            (min_new_tokens = max_new_tokens), sampling at temperature 1 with no top-k/top-p
  fwd_bwd   forward + backward of a full fine-tune: 8 x 128 random ids (torch seed 0), loss =
            -mean log-prob of positions 64..127, logits computed at all 128 positions (as a plain
            transformers forward does; with --completion-logits, or RLFT_REF_COMPLETION_LOGITS=1
            in the environment `rlft bench` passes on, only at the 65 positions the loss reads,
            `logits_to_keep` as TRL's trainers do and as rlft's loss does); also times the same
            loss without grad (`forward_no_grad`, what rlft's `ref_pass` case is compared with)
  lora      the same with peft LoRA r=16, alpha 32, no dropout on q,k,v,o,gate,up,down (base frozen)
  adamw     torch.optim.AdamW(fused=True).step() over every parameter, lr 1e-6, no weight decay,
            fixed random gradients (`step_fused`); its peak RSS covers gradients, optimizer state
            and steps, as rlft's does

    python bench.py --run-case CASE [--model DIR] [--reps 3] [--warmup 1] [--batch 8]
                    [--new-tokens 32] [--threads N] [--completion-logits]

runs one case in this process and prints one line `RESULT_JSON {...}` (what `rlft bench` reads;
see `crates/rlft-cli/src/bench/reference.rs`). The peak RSS is reset after loading, so
`peak_rss_bench_mib` covers the benchmark itself. Without --run-case, each case of --cases runs in
a fresh process of its own (so each peak RSS is its own) and the results are printed as JSON.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import measure

HERE = os.path.dirname(os.path.abspath(__file__))
CACHE = os.environ.get("RLFT_CACHE") or os.path.expanduser("~/.cache/rlft")
DEFAULT_MODEL = os.path.join(CACHE, "reference", "smollm2-135m-instruct-hf")
CASES = ("generate", "fwd_bwd", "lora", "adamw")
ROWS, SEQ, PROMPT = 8, 128, 64
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# rlft's generate prompts (crates/rlft-cli/src/bench/cases.rs, EXPRS), in the same order.
EXPRS = ["3 + 4 * 2", "17 - 5 * 3", "(8 + 2) * 7", "45 // 4 + 6", "9 * 9 - 40", "2 ** 5 - 11",
         "(13 - 6) * (2 + 3)", "100 % 7 * 3", "6 * 7 + 8", "(5 + 5) ** 2 // 4"]


def load_model(path):
    import torch
    from transformers import AutoModelForCausalLM

    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return model, time.perf_counter() - t0


def random_batch(vocab):
    """ROWS x SEQ ids drawn with a fixed seed (the work does not depend on them)."""
    import torch

    ids = torch.randint(0, vocab, (ROWS, SEQ), generator=torch.Generator().manual_seed(0))
    return ids, torch.ones_like(ids)


def completion_nll(model, ids, mask, completion_logits=False):
    """-mean log-prob of tokens PROMPT..SEQ-1 given everything before them; the LM head at all
    SEQ positions, or (`completion_logits`) only at the SEQ - PROMPT + 1 last, of which the loss
    reads all but the last."""
    import torch

    if completion_logits:
        logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=SEQ - PROMPT + 1).logits
        logits = logits[:, :-1, :]
    else:
        logits = model(input_ids=ids, attention_mask=mask).logits[:, PROMPT - 1:-1, :]
    pred = torch.log_softmax(logits.float(), dim=-1)
    return -pred.gather(-1, ids[:, PROMPT:].unsqueeze(-1)).mean()


def start_measuring():
    """After loading: the RSS then, the peak-RSS reset, and a CPU meter."""
    return {"rss_after_load_mib": measure.rss_mib(), "peak_rss_reset": measure.reset_peak_rss(),
            "cpu": measure.CpuMeter()}


def finish_measuring(m):
    return {"rss_after_load_mib": m["rss_after_load_mib"], "peak_rss_reset": m["peak_rss_reset"],
            "peak_rss_bench_mib": measure.peak_rss_mib(),
            "peak_rss_process_mib": measure.process_peak_rss_mib(), **m["cpu"].interference()}


def case_fwd_bwd(a, lora=False):
    import torch

    model, load_s = load_model(a.model)
    if lora:
        from peft import LoraConfig, get_peft_model

        cfg = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, bias="none",
                         target_modules=LORA_TARGETS, task_type="CAUSAL_LM")
        model = get_peft_model(model, cfg)
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    ids, mask = random_batch(model.config.vocab_size)
    m = start_measuring()
    fwd, bwd = [], []

    def step():
        t0 = time.perf_counter()
        loss = completion_nll(model, ids, mask, a.completion_logits)
        t1 = time.perf_counter()
        loss.backward()
        fwd.append(t1 - t0)
        bwd.append(time.perf_counter() - t1)
        model.zero_grad(set_to_none=True)

    times = measure.time_reps(step, a.warmup, a.reps)
    out = {"load_s": round(load_s, 3), "shape": [ROWS, SEQ], "completion_tokens": ROWS * (SEQ - PROMPT),
           "logits_positions": SEQ - PROMPT + 1 if a.completion_logits else SEQ,
           "trainable_params": sum(p.numel() for p in trainable),
           "fwd_bwd": measure.stats_ms(times),
           "of_which_forward": measure.stats_ms(fwd[a.warmup:]),
           "of_which_backward": measure.stats_ms(bwd[a.warmup:]),
           "tokens_per_s_median": round(ROWS * SEQ / statistics.median(times), 1)}
    if not lora:
        def no_grad_pass():
            with torch.no_grad():
                completion_nll(model, ids, mask, a.completion_logits)

        out["forward_no_grad"] = measure.stats_ms(measure.time_reps(no_grad_pass, a.warmup, a.reps))
    out.update(finish_measuring(m))
    return out


def case_lora(a):
    return case_fwd_bwd(a, lora=True)


def case_generate(a):
    import torch
    from transformers import AutoTokenizer, GenerationConfig

    model, load_s = load_model(a.model)
    model.eval()
    tok = AutoTokenizer.from_pretrained(a.model)
    tok.padding_side = "left"
    texts = []
    for i in range(a.batch):
        msg = (f"Compute the value of the Python expression `{EXPRS[i % len(EXPRS)]}`. "
               "Put the final answer in \\boxed{}.")
        texts.append(tok.apply_chat_template([{"role": "user", "content": msg}], tokenize=False,
                                             add_generation_prompt=True))
    enc = tok(texts, return_tensors="pt", padding=True)
    padded = enc["input_ids"].shape[1]
    cfg = GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                           max_new_tokens=a.new_tokens, min_new_tokens=a.new_tokens,
                           pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                           use_cache=True, disable_compile=True)
    torch.manual_seed(0)
    m = start_measuring()
    last = []

    def run():
        with torch.no_grad():
            last[:] = [model.generate(**enc, generation_config=cfg)]

    times = measure.time_reps(run, a.warmup, a.reps)
    new = last[0].shape[1] - padded
    if new != a.new_tokens:
        raise SystemExit(f"generate made {new} new tokens per row, not {a.new_tokens}")
    toks = a.batch * new
    batch = {"padded_prompt_len": padded, "prompt_lens": enc["attention_mask"].sum(1).tolist(),
             "new_tokens_per_seq": new, "generate": measure.stats_ms(times),
             "new_tokens_per_s_median": round(toks / statistics.median(times), 2),
             "new_tokens_per_s_best": round(toks / min(times), 2),
             "sample_completion": tok.decode(last[0][0, padded:], skip_special_tokens=False)}
    return {"load_s": round(load_s, 3), "attn_implementation": model.config._attn_implementation,
            f"batch_{a.batch}": batch, **finish_measuring(m)}


def case_adamw(a):
    import torch

    model, load_s = load_model(a.model)
    params = [p for p in model.parameters() if p.requires_grad]
    m = start_measuring()
    g = torch.Generator().manual_seed(0)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g) * 1e-3
    opt = torch.optim.AdamW(params, lr=1e-6, weight_decay=0.0, fused=True)
    times = measure.time_reps(opt.step, a.warmup, a.reps)
    return {"load_s": round(load_s, 3), "n_params": sum(p.numel() for p in params),
            "n_tensors": len(params), "step_fused": measure.stats_ms(times), **finish_measuring(m)}


def run_case(a):
    import torch
    import transformers

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    out = {"case": a.run_case, **globals()["case_" + a.run_case](a)}
    out["torch_threads"] = torch.get_num_threads()
    out["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__}
    print("RESULT_JSON " + json.dumps(out), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-case", choices=CASES, help="run this case here and print RESULT_JSON")
    ap.add_argument("--cases", default=",".join(CASES), help="without --run-case: cases to run")
    ap.add_argument("--model", default=DEFAULT_MODEL, help="HF directory (default: setup.sh's)")
    ap.add_argument("--reps", type=int, default=3, help="timed repetitions")
    ap.add_argument("--warmup", type=int, default=1, help="untimed repetitions first")
    ap.add_argument("--batch", type=int, default=8, help="generate: prompts")
    ap.add_argument("--new-tokens", type=int, default=32, help="generate: new tokens per row")
    ap.add_argument("--threads", type=int, default=measure.threads(), help="torch threads")
    ap.add_argument("--completion-logits", action="store_true",
                    default=os.environ.get("RLFT_REF_COMPLETION_LOGITS", "") not in ("", "0"),
                    help="fwd_bwd, lora: the LM head only at the positions the loss reads "
                         "(default: at all 128, as published; env RLFT_REF_COMPLETION_LOGITS=1)")
    a = ap.parse_args()
    if a.reps < 1:
        ap.error("--reps must be at least 1")
    if a.run_case:
        return run_case(a)
    results = {}
    for case in a.cases.split(","):
        cmd = [sys.executable, os.path.abspath(__file__), "--run-case", case, "--model", a.model,
               "--reps", str(a.reps), "--warmup", str(a.warmup), "--batch", str(a.batch),
               "--new-tokens", str(a.new_tokens), "--threads", str(a.threads)]
        cmd += ["--completion-logits"] if a.completion_logits else []
        env = {**os.environ, "OMP_NUM_THREADS": str(a.threads), "TOKENIZERS_PARALLELISM": "false"}
        p = subprocess.run(cmd, capture_output=True, text=True, env=env)
        line = [x for x in p.stdout.splitlines() if x.startswith("RESULT_JSON ")]
        if p.returncode == 0 and line:
            results[case] = json.loads(line[-1][len("RESULT_JSON "):])
        else:
            results[case] = {"error": f"exit status {p.returncode}", "stderr": p.stderr[-3000:]}
        print(f"{case}: " + json.dumps(results[case]), file=sys.stderr, flush=True)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
