"""rlft's GPU check: rlft against PyTorch/transformers/TRL on one machine, results as JSON.

Run by scripts/gpu-check.sh (see its header and docs/gpu.md). Three parts, each bounded in time,
each recording its own error instead of stopping the others:

(a) `logprobs`: tiny random Llama, Qwen2 and Qwen3 models written with PyTorch; rlft's per-token
    log-probs (`rlft logprobs --json`, float32 on --device) against transformers' (float32,
    eager attention, same device, same token ids); passes at max |diff| <= 1e-4. Gradients too:
    `rlft logprobs --grads` writes d(mean NLL)/d(weight) for the first text, compared with
    torch's autograd per weight at max |diff| <= 1e-4 x max(1, max |torch's|).
(b) `perf`: a Qwen2.5-3B-shaped model with random weights (bf16 on a GPU; at --size tiny the same
    family at tiny size, f32): generation tokens/s at batch 16 x 128 new tokens (`rlft bench
    generate` vs transformers' generate), and GRPO steps in the shape of
    examples/tiny_python_expr/qwen25_3b.toml (`rlft bench grpo` with that shape vs TRL's
    GRPOTrainer); each with its peak memory (GPU: device memory in use above the idle level). On
    a GPU rlft's GRPO runs twice: with its default AdamW state (f32 master weights and moments)
    and with `optim = "adamw_torch"` (TRL's: bf16 moments, no master).
(c) `plan`: `rlft plan grpo` on qwen25_3b.toml for the same model against the peak measured in (b)
    (rlft plan models the CPU process's resident memory; on a GPU the ratio says how far that
    model is from the device's).
"""

import argparse
import glob
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import models  # noqa: E402
import peak  # noqa: E402

FAMILIES = ("llama", "qwen2", "qwen3")
TEXTS = ("Compute the value of the Python expression `17 - 5 * 3`. \\boxed{2}",
         "The quick brown fox jumps over the lazy dog, 0123456789 times; then rests.")
TOLERANCE = 1e-4
# examples/tiny_python_expr/qwen25_3b.toml's shape for `rlft bench grpo` (whose own config sets
# the prompts, rewards, lr 1e-6 and beta 0.001); hf_side.QWEN25_3B_SHAPE is TRL's twin.
GRPO_SETS = ["num_generations=2", "generation_batch_size=16", "per_device_train_batch_size=1",
             "gradient_accumulation_steps=8", "max_completion_length=32", "adam_beta2=0.95",
             "weight_decay=0.01", "max_grad_norm=1.0"]


class Check:
    def __init__(self, a):
        self.a = a
        self.deadline = time.monotonic() + a.budget_s
        self.gpu, self.gpu_note = None, None
        if a.device.startswith("cuda"):
            try:
                self.gpu = peak.GpuMemory(int(a.device.partition(":")[2] or 0))
            except Exception as e:  # no NVML: times still count, GPU peaks are not measured
                self.gpu_note = f"GPU memory not measured (NVML: {type(e).__name__}: {e})"
        self.env = dict(os.environ)
        self.env["LD_LIBRARY_PATH"] = ":".join(cuda_lib_dirs() + [os.environ.get(
            "LD_LIBRARY_PATH", "")])
        self.python = sys.executable

    def left(self):
        return self.deadline - time.monotonic()

    def run(self, cmd, limit_s):
        """peak.run with the remaining budget as an upper limit."""
        limit = min(limit_s, self.left())
        if limit < 5:
            return {"cmd": " ".join(cmd[:3]), "skipped": "out of time (--budget-s)"}
        return peak.run(cmd, limit, gpu=self.gpu, env=self.env)

    def rlft(self, *args):
        return [self.a.rlft, *args]

    def hf(self, job, *args):
        return [self.python, os.path.join(HERE, "hf_side.py"), job, "--device", self.a.device,
                *args]


def cuda_lib_dirs():
    """Directories holding libcublas.so.13 & co. on this machine: the nvidia-* wheels PyTorch
    brings, then a CUDA install's."""
    dirs = []
    try:
        import nvidia
        for root in nvidia.__path__:
            dirs += sorted(glob.glob(os.path.join(root, "cu13", "lib")))
            dirs += sorted(glob.glob(os.path.join(root, "*", "lib")))
    except ImportError:
        pass
    dirs += [d for d in ("/usr/local/cuda/lib64", "/usr/local/nvidia/lib64") if os.path.isdir(d)]
    return dirs


def result_json(r, prefix="RESULT_JSON "):
    for line in (r.get("stdout") or "").splitlines():
        if line.startswith(prefix):
            return json.loads(line[len(prefix):])
    return None


def trim(r):
    """A run's record without its (parsed) stdout."""
    return {k: v for k, v in r.items() if k != "stdout"}


def part_logprobs(c, work):
    out = {"tolerance": TOLERANCE, "models": {}}
    ok = True
    for fam in FAMILIES:
        d = models.write(fam, os.path.join(work, fam), "float32", "cpu")
        rec = {"texts": []}
        ids_all, ours_all = [], []
        ours_grads = os.path.join(work, f"{fam}-grads.safetensors")
        for i, text in enumerate(TEXTS):
            grads = ["--grads", ours_grads] if i == 0 else []
            r = c.run(c.rlft("logprobs", "--model", d, "--device", c.a.device, "--dtype", "f32",
                             "--text", text, "--json", *grads), 120)
            if r.get("rc") != 0:
                rec["texts"].append({"error": trim(r)})
                continue
            toks = json.loads(r["stdout"])["tokens"]
            ids_all.append([t["id"] for t in toks])
            ours_all.append([t["logprob"] for t in toks[1:]])
        if ids_all:
            f = os.path.join(work, f"{fam}-ref.json")
            r = c.run(c.hf("logprobs", "--model", d, "--ids", json.dumps(ids_all), "--out", f), 300)
            if r.get("rc") == 0:
                theirs_all = json.load(open(f))["logprobs"]
                for ids, ours, theirs in zip(ids_all, ours_all, theirs_all):
                    diff = max(abs(x - y) for x, y in zip(ours, theirs))
                    rec["texts"].append({"tokens": len(ids), "max_abs_diff": diff,
                                         "pass": diff <= TOLERANCE})
            else:
                rec["error"] = trim(r)
            rec["grads"] = guarded(compare_grads, c, d, ids_all[0], ours_grads, work, fam)
        rec["pass"] = bool(rec["texts"]) and all(t.get("pass") for t in rec["texts"]) \
            and "error" not in rec and rec.get("grads", {}).get("pass", False)
        ok = ok and rec["pass"]
        out["models"][fam] = rec
    out["pass"] = ok
    return out


def compare_grads(c, model_dir, ids, ours_path, work, fam):
    """rlft's gradients (ours_path, from `rlft logprobs --grads`) against torch's autograd for
    the same ids: per weight, max |diff| <= TOLERANCE x max(1, max |torch's|)."""
    if not os.path.isfile(ours_path):
        return {"error": "rlft wrote no gradients", "pass": False}
    theirs_path = os.path.join(work, f"{fam}-grads-ref.safetensors")
    r = c.run(c.hf("grads", "--model", model_dir, "--ids", json.dumps([ids]), "--grads-out",
                   theirs_path, "--out", os.path.join(work, f"{fam}-grads-ref.json")), 300)
    if r.get("rc") != 0:
        return {"error": trim(r), "pass": False}
    from safetensors.torch import load_file
    ours, theirs = load_file(ours_path), load_file(theirs_path)
    worst, failed = 0.0, []
    for name, t in theirs.items():
        if name not in ours:
            failed.append(f"{name}: missing in rlft's")
            continue
        diff = (ours[name].double() - t.double()).abs().max().item()
        scale = max(1.0, t.abs().max().item())
        worst = max(worst, diff / scale)
        if diff > TOLERANCE * scale:
            failed.append(f"{name}: max |diff| {diff:.3g}")
    failed += [f"{n}: not a parameter of transformers' model" for n in ours if n not in theirs]
    return {"weights": len(theirs), "max_abs_diff_scaled": worst, "failed": failed[:10],
            "pass": not failed}


def part_perf(c, work):
    cuda = c.a.device.startswith("cuda")
    name = "qwen25_3b" if c.a.size == "3b" else "qwen25_3b_tiny"
    dtype = "bfloat16" if cuda else "float32"
    t0 = time.perf_counter()
    d = models.write(name, os.path.join(work, name), dtype, c.a.device)
    out = {"model": name, "dtype": dtype, "write_s": round(time.perf_counter() - t0, 1)}
    rdt = "bf16" if dtype == "bfloat16" else "f32"
    b, n = str(c.a.batch), str(c.a.new_tokens)

    r = c.run(c.rlft("bench", "--run-case", "generate", "--model", d, "--device", c.a.device,
                     "--dtype", rdt, "--batch", b, "--new-tokens", n, "--warmup", "1",
                     "--reps", "1"), 240)
    out["generate_rlft"] = {"result": result_json(r), **trim(r)}
    f = os.path.join(work, "hf-generate.json")
    r = c.run(c.hf("generate", "--model", d, "--dtype", dtype, "--batch", b, "--new-tokens", n,
                   "--out", f), 240)
    out["generate_transformers"] = {"result": load(f) if r.get("rc") == 0 else None, **trim(r)}

    sets = [x for s in GRPO_SETS + ([f"bf16={'true' if cuda else 'false'}"])
            for x in ("--grpo-set", s)]
    r = c.run(c.rlft("bench", "--run-case", "grpo", "--model", d, "--device", c.a.device,
                     "--reps", str(c.a.grpo_steps - 1), *sets), 300)
    out["grpo_rlft"] = {"result": result_json(r), **trim(r)}
    f = os.path.join(work, "trl-grpo.json")
    r = c.run(c.hf("grpo", "--model", d, "--dtype", dtype, "--steps", str(c.a.grpo_steps),
                   "--out", f), 300)
    out["grpo_trl"] = {"result": load(f) if r.get("rc") == 0 else None, **trim(r)}
    # TRL's AdamW state layout (bf16 moments and gradient sums, no master weights): the same
    # run with `optim = "adamw_torch"`, for the memory comparison at equal state.
    if cuda:
        r = c.run(c.rlft("bench", "--run-case", "grpo", "--model", d, "--device", c.a.device,
                         "--reps", str(c.a.grpo_steps - 1), *sets,
                         "--grpo-set", "optim=adamw_torch"), 300)
        out["grpo_rlft_adamw_torch"] = {"result": result_json(r), **trim(r)}
    out["summary"] = perf_summary(out, c.gpu is not None)
    return out, d


def load(path):
    with open(path) as f:
        return json.load(f)


def perf_summary(p, gpu):
    key = "peak_gpu_mib" if gpu else "peak_rss_mib"
    g_r = (p["generate_rlft"].get("result") or {}).get("detail", {})
    g_t = p["generate_transformers"].get("result") or {}
    s_r = (p["grpo_rlft"].get("result") or {}).get("detail", {})
    s_t = p["grpo_trl"].get("result") or {}
    return {
        "generate_tokens_per_s": {"rlft": g_r.get("new_tokens_per_s_median"),
                                  "transformers": g_t.get("new_tokens_per_s_median")},
        "generate_peak_mib": {"rlft": own(p["generate_rlft"], key),
                              "transformers": own(p["generate_transformers"], key)},
        # Two optimizer steps per rollout (16 completions, 8 per step); the first rollout warms
        # up on both sides and is left out: seconds per rollout (generation, rewards, reference
        # pass, two updates) over the rest.
        "grpo_s_per_rollout": {"rlft": per_rollout(s_r.get("step_s", [])),
                               "trl": per_rollout(s_t.get("step_s", []))},
        "grpo_peak_mib": {"rlft": own(p["grpo_rlft"], key), "trl": own(p["grpo_trl"], key),
                          "rlft_adamw_torch": own(p.get("grpo_rlft_adamw_torch", {}), key)},
        "grpo_s_per_rollout_adamw_torch": per_rollout(
            ((p.get("grpo_rlft_adamw_torch") or {}).get("result") or {})
            .get("detail", {}).get("step_s", [])),
    }


def own(run, key):
    """A run's peak: on a GPU the sampled device memory; on the CPU the peak the process reports
    itself (rlft bench's `peak_rss_mib`, hf_side's `vm_hwm_mib`: exact), else the sampled one."""
    res = run.get("result") or {}
    if key == "peak_rss_mib":
        return res.get("peak_rss_mib") or res.get("vm_hwm_mib") or run.get(key)
    return run.get(key)


def per_rollout(step_s, steps_per_rollout=2):
    """Mean seconds per rollout over the steps after the first rollout."""
    timed = step_s[steps_per_rollout:]
    n = len(timed) // steps_per_rollout
    return round(sum(timed[:n * steps_per_rollout]) / n, 4) if n else None


def part_plan(c, model_dir, perf):
    cfg = os.path.join(c.a.repo, "examples", "tiny_python_expr", "qwen25_3b.toml")
    r = c.run(c.rlft("plan", "grpo", "--config", cfg, "--set", f"model={model_dir}",
                     "--set", f"bf16={'true' if c.a.device.startswith('cuda') else 'false'}",
                     "--worst-case", "--json"), 60)
    if r.get("rc") != 0:
        return {"error": trim(r)}
    plan = json.loads(r["stdout"])["plan"]
    planned = plan["total_bytes"] / 2**20
    key = "peak_gpu_mib" if c.gpu else "peak_rss_mib"
    measured = own((perf or {}).get("grpo_rlft", {}), key)
    return {"planned_mib": round(planned, 1), "peak_phase": plan.get("peak_phase"),
            "measured_grpo_peak_mib": measured, "measured_is": key,
            "planned_over_measured": round(planned / measured, 3) if measured else None}


def meta(c):
    m = {"device": c.a.device, "size": c.a.size, "python": platform.python_version(),
         "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "note": c.gpu_note}
    try:
        import torch
        import transformers
        m.update(torch=torch.__version__, transformers=transformers.__version__)
        if c.a.device.startswith("cuda"):
            m["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError as e:
        m["import_error"] = str(e)
    try:
        import trl
        m["trl"] = trl.__version__
    except ImportError as e:
        m["trl"] = f"not importable: {e}"
    v = subprocess.run([c.a.rlft, "--version"], capture_output=True, text=True, env=c.env)
    m["rlft"] = (v.stdout or v.stderr).strip()
    if shutil.which("ldd"):
        ldd = subprocess.run(["ldd", c.a.rlft], capture_output=True, text=True, env=c.env).stdout
        m["rlft_missing_libs"] = [ln.split()[0] for ln in ldd.splitlines() if "not found" in ln]
    return m


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rlft", required=True, help="the rlft binary (a --features cuda build "
                    "for --device cuda)")
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (cpu: tests the "
                    "check itself with the CPU binary)")
    ap.add_argument("--size", choices=("3b", "tiny"), help="perf model (default: 3b on cuda, "
                    "tiny on cpu)")
    ap.add_argument("--batch", type=int, default=16, help="generation batch")
    ap.add_argument("--new-tokens", type=int, default=128, help="new tokens per row")
    ap.add_argument("--grpo-steps", type=int, default=4, help="optimizer steps per side (the "
                    "first warms up)")
    ap.add_argument("--parts", default="logprobs,perf,plan")
    ap.add_argument("--budget-s", type=float, default=540, help="stop starting work after this")
    ap.add_argument("--repo", default=default_repo(),
                    help="directory holding examples/tiny_python_expr/qwen25_3b.toml")
    ap.add_argument("--work", help="scratch directory (default: a temporary one, removed)")
    ap.add_argument("--out", required=True, help="JSON result file")
    a = ap.parse_args()
    a.rlft = os.path.abspath(a.rlft)
    a.size = a.size or ("3b" if a.device.startswith("cuda") else "tiny")
    parts = set(a.parts.split(","))
    c = Check(a)
    work = a.work or tempfile.mkdtemp(prefix="rlft-gpu-check-")
    res = {"meta": meta(c)}
    perf, model_dir = None, None
    try:
        if "logprobs" in parts:
            res["logprobs"] = guarded(part_logprobs, c, work)
        if "perf" in parts or "plan" in parts:
            got = guarded(part_perf, c, work)
            if isinstance(got, tuple):
                perf, model_dir = got
                res["perf"] = perf
            else:
                res["perf"] = got
        if "plan" in parts and model_dir:
            res["plan"] = guarded(part_plan, c, model_dir, perf)
    finally:
        res["meta"]["seconds"] = round(a.budget_s - c.left(), 1)
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
        if not a.work:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(summary(res), indent=1))


def default_repo():
    """The repository (scripts/gpu_check/ is two levels down) or a pack (one level down)."""
    for up in ("..", os.path.join("..", "..")):
        d = os.path.normpath(os.path.join(HERE, up))
        if os.path.isfile(os.path.join(d, "examples", "tiny_python_expr", "qwen25_3b.toml")):
            return d
    return os.path.normpath(os.path.join(HERE, "..", ".."))


def guarded(fn, *args):
    try:
        return fn(*args)
    except Exception as e:  # one part's failure is a result, not the end of the check
        return {"error": f"{type(e).__name__}: {e}"}


def summary(res):
    lp = res.get("logprobs", {})
    return {"logprobs_pass": lp.get("pass"),
            "logprobs_max_abs_diff": {f: max((t.get("max_abs_diff", float("nan"))
                                              for t in m.get("texts", [])), default=None)
                                      for f, m in lp.get("models", {}).items()},
            "grads_max_abs_diff_scaled": {f: (m.get("grads") or {}).get("max_abs_diff_scaled")
                                          for f, m in lp.get("models", {}).items()},
            "perf": (res.get("perf") or {}).get("summary") or (res.get("perf") or {}).get("error"),
            "plan": res.get("plan"), "seconds": res["meta"]["seconds"]}


if __name__ == "__main__":
    main()
