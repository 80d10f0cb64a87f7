"""The TRL side of `rlft bench dpo|reward_model --against-reference`: TRL's DPOTrainer
(RewardTrainer) on the CPU in the configuration of rlft's offline step cases
(`crates/rlft-cli/src/bench/offline.rs`), float32, full fine-tune:

- 64 conversational preference rows made from grpo.py's `prompts(64, 0)`: `prompt` (the user
  message), `chosen` = "The value is \\boxed{ANSWER}.", `rejected` = the same with ANSWER + 1;
  rlft builds the same rows;
- per step 8 pairs (per_device_train_batch_size 8), lr 1e-6, everything else the trainer's
  default except gradient checkpointing, off as in rlft;
- DPO: beta 0.1, sigmoid loss, a frozen reference model (TRL's default without PEFT), the
  reference pass in every step; reward model: a new `score` head, the Bradley-Terry loss.

    python offline.py [--trainer dpo|reward_model] [--model DIR] [--max-steps 4] [--out FILE]

Writes a JSON result to --out (and prints it) with grpo.py's keys: `step_s` (seconds of every
optimizer step, on_step_begin to on_step_end), `step_phase_s` / `step_phase_s_median`,
`peak_rss_bench_mib`. `rlft bench` drops the first step (warm-up) from the times.
"""

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time

import grpo
import measure


def preference_rows(n, seed):
    """`prompt` / `chosen` / `rejected` messages from grpo.py's prompts."""
    rows = []
    for r in grpo.prompts(n, seed):
        say = lambda v: [{"role": "assistant", "content": f"The value is \\boxed{{{v}}}."}]
        rows.append({"prompt": r["prompt"], "chosen": say(r["answer"]), "rejected": say(int(r["answer"]) + 1)})
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trainer", choices=("dpo", "reward_model"), default="dpo")
    ap.add_argument("--model", default=grpo.DEFAULT_MODEL, help="HF directory (default: setup.sh's)")
    ap.add_argument("--max-steps", type=int, default=4, help="optimizer steps (the first warms up)")
    ap.add_argument("--threads", type=int, default=measure.threads(), help="torch threads")
    ap.add_argument("--out", help="write the JSON result here")
    a = ap.parse_args()

    import torch
    import transformers
    import trl
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer, RewardConfig, RewardTrainer

    Config, Trainer = {"dpo": (DPOConfig, DPOTrainer), "reward_model": (RewardConfig, RewardTrainer)}[a.trainer]
    torch.set_num_threads(a.threads)
    work = tempfile.mkdtemp(prefix=f"rlft-reference-{a.trainer}-")
    own = {"beta": 0.1} if a.trainer == "dpo" else {}
    cfg = Config(
        output_dir=work,
        per_device_train_batch_size=8,
        learning_rate=1e-6,
        max_steps=a.max_steps,
        gradient_checkpointing=False,
        use_cpu=True,
        bf16=False,
        model_init_kwargs={"dtype": "float32"},
        seed=0,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        dataloader_num_workers=0,
        **own,
    )
    t0 = time.perf_counter()
    trainer = Trainer(model=a.model, args=cfg, train_dataset=Dataset.from_list(preference_rows(64, 0)))
    timer = grpo.phase_timer()
    timer.wrap(trainer.accelerator, "backward", lambda: "backward")  # forward and optimizer: the rest
    trainer.add_callback(timer)
    init_s = time.perf_counter() - t0
    rss_after_load = measure.rss_mib()
    reset = measure.reset_peak_rss()
    cpu = measure.CpuMeter()
    t0 = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - t0
    shutil.rmtree(work, ignore_errors=True)
    phases = sorted({k for p in timer.phases for k in p})
    result = {
        "trainer": Trainer.__name__,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__},
        "torch_threads": torch.get_num_threads(),
        "config": {k: getattr(cfg, k, None) for k in ["per_device_train_batch_size", "learning_rate", "beta", "loss_type", "max_length", "precompute_ref_log_probs", "gradient_checkpointing"]},
        "ref_model_loaded": getattr(trainer, "ref_model", None) is not None,
        "trainer_init_s": round(init_s, 3),
        "train_s": round(train_s, 3),
        "step_s": [round(s, 4) for s in timer.steps],
        "step_phase_s": timer.phases,
        "step_phase_s_median": {
            k: round(statistics.median(p.get(k, 0.0) for p in timer.phases[1:] or timer.phases), 4) for k in phases
        },
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
