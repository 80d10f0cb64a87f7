"""The transformers / TRL side of the GPU check, one job per process (so each job's peak memory
is its own): `logprobs`, `grads`, `generate` and `grpo`, each writing a JSON result to --out.

- logprobs: per-token log-probs `log_softmax(logits[t])[ids[t+1]]` of given token ids, float32,
  eager attention (the reference the rlft tests use: scripts/reference/tiny_models.py).
- grads: the gradient of the mean negative log-likelihood of one token-id row with respect to
  every parameter, float32, eager attention, as safetensors.
- generate: bench/reference/bench.py's generate case on a device: the same chat prompts as
  `rlft bench generate`, sampling at T=1, exactly --new-tokens per row; one warm-up, then timed.
- grpo: TRL's GRPOTrainer in the shape of examples/tiny_python_expr/qwen25_3b.toml (the seed's
  LightRFT run), on bench/reference/grpo.py's prompts, rewards and phase timer.
"""

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# bench/reference in the repository; gpu-check-pack.sh puts it beside this file.
for cand in (os.path.join(HERE, "..", "..", "bench", "reference"), os.path.join(HERE, "reference")):
    if os.path.isdir(cand):
        sys.path.insert(0, cand)
        break

# The shape of examples/tiny_python_expr/qwen25_3b.toml in TRL's names: 8 prompts x 2 samples per
# rollout (generation_batch_size 16), micro batch 1 x 8 accumulation = 8 completions per
# optimizer step (so 2 steps per rollout), 32 new tokens, lr 1e-6, beta 0.001, AdamW betas
# (0.9, 0.95), weight decay 0.01, clip 1.0, T=1, bf16 (on a GPU).
QWEN25_3B_SHAPE = dict(num_generations=2, generation_batch_size=16, per_device_train_batch_size=1,
                       gradient_accumulation_steps=8, max_completion_length=32,
                       learning_rate=1e-6, beta=0.001, adam_beta1=0.9, adam_beta2=0.95,
                       weight_decay=0.01, max_grad_norm=1.0, temperature=1.0, top_p=1.0,
                       epsilon=0.2, loss_type="grpo", scale_rewards="group")


def sync(device):
    import torch
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def peak(device):
    import torch
    if not device.startswith("cuda"):
        with open("/proc/self/status") as f:
            hwm = [int(ln.split()[1]) for ln in f if ln.startswith("VmHWM:")]
        return {"vm_hwm_mib": round(hwm[0] / 1024, 1)} if hwm else {}
    if device.startswith("cuda"):
        return {"torch_max_allocated_mib": round(torch.cuda.max_memory_allocated() / 2**20, 1),
                "torch_max_reserved_mib": round(torch.cuda.max_memory_reserved() / 2**20, 1)}
    return {}


def job_logprobs(a):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32,
                                                 attn_implementation="eager").to(a.device)
    model.eval()
    out = []
    for ids in json.loads(a.ids):
        x = torch.tensor([ids], device=a.device)
        with torch.no_grad():
            logits = model(input_ids=x).logits[0].float()
        lsm = torch.log_softmax(logits, dim=-1)
        lp = lsm[:-1].gather(1, x[0, 1:].unsqueeze(1)).squeeze(1)
        out.append(lp.cpu().tolist())
    return {"logprobs": out}


def job_grads(a):
    """d(mean NLL of --ids' first row)/d(weight) for every parameter, float32, eager, written as
    safetensors to --grads-out (named_parameters' names: tied weights once)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32,
                                                 attn_implementation="eager").to(a.device)
    model.train()
    ids = json.loads(a.ids)[0]
    x = torch.tensor([ids], device=a.device)
    lsm = torch.log_softmax(model(input_ids=x).logits[0].float(), dim=-1)
    loss = -lsm[:-1].gather(1, x[0, 1:].unsqueeze(1)).mean()
    loss.backward()
    save_file({n: p.grad.detach().float().cpu().contiguous()
               for n, p in model.named_parameters() if p.grad is not None}, a.grads_out)
    return {"loss": loss.item()}


def job_generate(a):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from bench import EXPRS

    dtype = getattr(torch, a.dtype)
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=dtype).to(a.device)
    model.eval()
    load_s = time.perf_counter() - t0
    tok = AutoTokenizer.from_pretrained(a.model)
    tok.padding_side = "left"
    texts = []
    for i in range(a.batch):
        msg = (f"Compute the value of the Python expression `{EXPRS[i % len(EXPRS)]}`. "
               "Put the final answer in \\boxed{}.")
        texts.append(tok.apply_chat_template([{"role": "user", "content": msg}], tokenize=False,
                                             add_generation_prompt=True))
    enc = tok(texts, return_tensors="pt", padding=True).to(a.device)
    padded = enc["input_ids"].shape[1]
    cfg = GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                           max_new_tokens=a.new_tokens, min_new_tokens=a.new_tokens,
                           pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                           use_cache=True, disable_compile=True)
    torch.manual_seed(0)
    times = []
    for rep in range(a.warmup + a.reps):
        sync(a.device)
        t0 = time.perf_counter()
        with torch.no_grad():
            seqs = model.generate(**enc, generation_config=cfg)
        sync(a.device)
        if rep >= a.warmup:
            times.append(time.perf_counter() - t0)
    new = seqs.shape[1] - padded
    if new != a.new_tokens:
        raise SystemExit(f"generated {new} tokens per row, wanted {a.new_tokens}")
    toks = a.batch * a.new_tokens
    return {"load_s": round(load_s, 3), "times_s": [round(t, 4) for t in times],
            "batch": a.batch, "new_tokens_per_seq": a.new_tokens,
            "prompt_tokens_padded": padded,
            "new_tokens_per_s_median": toks / statistics.median(times), **peak(a.device)}


def job_grpo(a):
    import shutil
    import tempfile

    import torch
    import trl
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer
    from grpo import correctness_reward, format_reward, phase_timer, prompts

    cuda = a.device.startswith("cuda")
    bf16 = a.dtype == "bfloat16"
    work = tempfile.mkdtemp(prefix="rlft-gpu-check-trl-")
    cfg = GRPOConfig(output_dir=work, max_steps=a.steps, reward_weights=[0.1, 0.9],
                     gradient_checkpointing=False, use_cpu=not cuda, bf16=bf16,
                     model_init_kwargs={"dtype": a.dtype}, seed=0, logging_steps=1,
                     report_to="none", save_strategy="no", log_completions=False,
                     dataloader_num_workers=0, **QWEN25_3B_SHAPE)
    t0 = time.perf_counter()
    trainer = GRPOTrainer(model=a.model, reward_funcs=[format_reward, correctness_reward],
                          args=cfg, train_dataset=Dataset.from_list(prompts(64, 0)))
    timer = phase_timer()
    timer.attach(trainer)
    init_s = time.perf_counter() - t0
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    shutil.rmtree(work, ignore_errors=True)
    return {"trl": trl.__version__, "trainer_init_s": round(init_s, 3),
            "step_s": [round(s, 4) for s in timer.steps], "step_phase_s": timer.phases,
            "config": {k: getattr(cfg, k, None) for k in QWEN25_3B_SHAPE}, **peak(a.device)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("job", choices=("logprobs", "grads", "generate", "grpo"))
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--ids", help="logprobs: JSON list of token-id lists")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--steps", type=int, default=4, help="grpo: optimizer steps")
    ap.add_argument("--grads-out", help="grads: safetensors file of the gradients")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    import torch
    import transformers
    result = {"torch": torch.__version__, "transformers": transformers.__version__}
    result.update({"logprobs": job_logprobs, "grads": job_grads, "generate": job_generate, "grpo": job_grpo}[a.job](a))
    with open(a.out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
