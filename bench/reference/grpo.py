"""The TRL side of `rlft bench grpo|rloo --against-reference`: TRL's GRPOTrainer (RLOOTrainer)
on the CPU in the configuration of rlft's grpo case (`crates/rlft-cli/src/bench/grpo.rs`),
float32, full fine-tune:

- 64 prompts "Compute the value of the Python expression `EXPR`. Put the final answer in
  \\boxed{}." as chat messages (the model's chat template applies), made by `prompts(64, 0)`
  below with Python's `random`; rlft rebuilds the same texts with its CPython-compatible RNG;
- per step 2 prompts x 4 generations (per_device_train_batch_size 8), at most 32 new tokens,
  beta 0.001 (so TRL keeps a frozen reference model), lr 1e-6, everything else TRL's default
  (loss, AdamW, clipping) except gradient checkpointing, off as in rlft (TRL turns it on by
  default; `--gradient-checkpointing 1` turns it on);
- rewards: format (1 if the completion holds `\\boxed{...}`) and correctness (1 if the boxed
  text, stripped, is the answer), weighted 0.1 / 0.9.

`--trainer rloo` runs TRL's RLOOTrainer in the same configuration (rlft's `rloo` case): the same
prompts, group of 4, beta 0.001 (RLOO puts the KL in the reward, so every rollout has a no-grad
pass of the policy and one of the reference, both timed as `ref_logprobs` here), RLOO's defaults
for the rest (its sequence-level loss, no advantage normalisation).

    python grpo.py [--trainer grpo|rloo] [--model DIR] [--max-steps 4]
                   [--gradient-checkpointing 0|1] [--out FILE]

Writes a JSON result to --out (and prints it): `step_s` (seconds of every optimizer step, from
TrainerCallback.on_step_begin to on_step_end: generation, rewards, the reference pass, the policy
forward and backward, the optimizer step), `step_phase_s` / `step_phase_s_median` (those phases,
timed by wrapping the trainer's own methods), `peak_rss_bench_mib` (VmHWM, reset after the trainer
is built) and `peak_rss_process_mib` (whole process), versions and the config TRL resolved.
`rlft bench` drops the first step (warm-up) from the times.
"""

import argparse
import json
import operator
import os
import random
import re
import statistics
import time

import measure

CACHE = os.environ.get("RLFT_CACHE") or os.path.expanduser("~/.cache/rlft")
DEFAULT_MODEL = os.path.join(CACHE, "reference", "smollm2-135m-instruct-hf")
BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}


def prompts(n, seed):
    """n rows {"prompt": [user message], "answer": str}: a, b in 1..20, c in 1..9, two operators
    of + - *, and one of the forms `a o b o c`, `(a o b) o c`, `a o b` (Python precedence)."""
    rng = random.Random(seed)
    rows = []
    while len(rows) < n:
        a, b, c = rng.randint(1, 20), rng.randint(1, 20), rng.randint(1, 9)
        o1, o2 = rng.choice("+-*"), rng.choice("+-*")
        if o2 == "*" and o1 != "*":  # `a o1 b * c`: the product binds first
            flat = OPS[o1](a, b * c)
        else:
            flat = OPS[o2](OPS[o1](a, b), c)
        forms = [(f"{a} {o1} {b} {o2} {c}", flat),
                 (f"({a} {o1} {b}) {o2} {c}", OPS[o2](OPS[o1](a, b), c)),
                 (f"{a} {o1} {b}", OPS[o1](a, b))]
        expr, value = rng.choice(forms)
        text = f"Compute the value of the Python expression `{expr}`. Put the final answer in \\boxed{{}}."
        rows.append({"prompt": [{"role": "user", "content": text}], "answer": str(value)})
    return rows


def completion_text(c):
    """A conversational completion is a list of messages; a plain one a string."""
    return c if isinstance(c, str) else c[0]["content"]


def format_reward(completions, **_):
    return [1.0 if BOXED.search(completion_text(c)) else 0.0 for c in completions]


def correctness_reward(completions, answer, **_):
    out = []
    for c, want in zip(completions, answer):
        m = BOXED.search(completion_text(c))
        out.append(1.0 if m and m.group(1).strip() == want else 0.0)
    return out


def phase_timer():
    """A TrainerCallback timing each optimizer step and, by wrapping the trainer's methods, its
    phases."""
    from transformers import TrainerCallback

    class PhaseTimer(TrainerCallback):
        def __init__(self):
            self.steps, self.phases, self.logs, self.current = [], [], [], {}

        def add(self, phase, seconds):
            self.current[phase] = self.current.get(phase, 0.0) + seconds

        def wrap(self, owner, method, phase_of):
            inner = getattr(owner, method)

            def timed(*args, **kwargs):
                phase, t0 = phase_of(), time.perf_counter()
                try:
                    return inner(*args, **kwargs)
                finally:
                    self.add(phase, time.perf_counter() - t0)

            setattr(owner, method, timed)

        def attach(self, trainer):
            import torch

            self.wrap(trainer, "_generate_single_turn", lambda: "generate")
            self.wrap(trainer, "_calculate_rewards", lambda: "reward")
            # Without grad: the reference model's pass (and an old policy's, if TRL needs one).
            self.wrap(trainer, "_get_per_token_logps_and_entropies",
                      lambda: "policy_forward" if torch.is_grad_enabled() else "ref_logprobs")
            self.wrap(trainer.accelerator, "backward", lambda: "backward")
            trainer.add_callback(self)

        def on_step_begin(self, args, state, control, **kw):
            self.current, self.t_step = {}, time.perf_counter()

        def on_pre_optimizer_step(self, args, state, control, **kw):
            self.t_opt = time.perf_counter()

        def on_optimizer_step(self, args, state, control, **kw):
            self.add("optimizer", time.perf_counter() - self.t_opt)

        def on_step_end(self, args, state, control, **kw):
            total = time.perf_counter() - self.t_step
            self.current["other"] = total - sum(self.current.values())
            self.steps.append(total)
            self.phases.append({k: round(v, 4) for k, v in self.current.items()})
            print(f"step {state.global_step}: {total:.2f} s {self.phases[-1]}", flush=True)

        def on_log(self, args, state, control, logs=None, **kw):
            if logs:
                self.logs.append({"step": state.global_step, **logs})

    return PhaseTimer()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trainer", choices=("grpo", "rloo"), default="grpo",
                    help="TRL's GRPOTrainer or RLOOTrainer")
    ap.add_argument("--model", default=DEFAULT_MODEL, help="HF directory (default: setup.sh's)")
    ap.add_argument("--max-steps", type=int, default=4, help="optimizer steps (the first warms up)")
    ap.add_argument("--gradient-checkpointing", type=int, choices=(0, 1), default=0)
    ap.add_argument("--threads", type=int, default=measure.threads(), help="torch threads")
    ap.add_argument("--out", help="write the JSON result here")
    a = ap.parse_args()

    import shutil
    import tempfile

    import torch
    import transformers
    import trl
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer

    Config, Trainer = {"grpo": (GRPOConfig, GRPOTrainer),
                       "rloo": (RLOOConfig, RLOOTrainer)}[a.trainer]
    torch.set_num_threads(a.threads)
    work = tempfile.mkdtemp(prefix=f"rlft-reference-{a.trainer}-")
    cfg = Config(
        output_dir=work,
        num_generations=4,
        per_device_train_batch_size=8,
        max_completion_length=32,
        learning_rate=1e-6,
        beta=0.001,
        max_steps=a.max_steps,
        reward_weights=[0.1, 0.9],
        gradient_checkpointing=bool(a.gradient_checkpointing),
        use_cpu=True,
        bf16=False,
        model_init_kwargs={"dtype": "float32"},
        seed=0,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        log_completions=False,
        dataloader_num_workers=0,
    )
    t0 = time.perf_counter()
    trainer = Trainer(model=a.model, reward_funcs=[format_reward, correctness_reward],
                      args=cfg, train_dataset=Dataset.from_list(prompts(64, 0)))
    timer = phase_timer()
    timer.attach(trainer)
    init_s = time.perf_counter() - t0
    rss_after_load = measure.rss_mib()
    reset = measure.reset_peak_rss()
    cpu = measure.CpuMeter()
    t0 = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - t0
    shutil.rmtree(work, ignore_errors=True)

    keys = ["num_generations", "per_device_train_batch_size", "generation_batch_size",
            "steps_per_generation", "gradient_accumulation_steps", "max_completion_length",
            "learning_rate", "beta", "max_steps", "gradient_checkpointing", "loss_type",
            "scale_rewards", "num_iterations", "temperature", "top_k", "top_p", "reward_weights",
            "optim", "weight_decay", "lr_scheduler_type", "max_grad_norm", "epsilon",
            "normalize_advantages"]
    phases = sorted({k for p in timer.phases for k in p})
    result = {
        "trainer": Trainer.__name__,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "trl": trl.__version__},
        "torch_threads": torch.get_num_threads(),
        "config": {k: getattr(cfg, k, None) for k in keys},
        "ref_model_loaded": getattr(trainer, "ref_model", None) is not None,
        "trainer_init_s": round(init_s, 3),
        "train_s": round(train_s, 3),
        "step_s": [round(s, 4) for s in timer.steps],
        "step_phase_s": timer.phases,
        "step_phase_s_median": {
            k: round(statistics.median(p.get(k, 0.0) for p in timer.phases[1:] or timer.phases), 4)
            for k in phases},
        "rss_after_load_mib": rss_after_load,
        "peak_rss_reset": reset,
        "peak_rss_bench_mib": measure.peak_rss_mib(),
        "peak_rss_process_mib": measure.process_peak_rss_mib(),
        "train_interference": cpu.interference(),
        "logs": timer.logs,
    }
    text = json.dumps(result, indent=1, default=str)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
