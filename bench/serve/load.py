"""A bounded load test of an OpenAI-compatible server: a fixed number of chat requests, all in
flight at once (64 by default), each asking for 32-128 new tokens; it stops by itself and prints
one JSON object: errors, p50/p99 latency, total completion tokens per second.

    # starts `rlft serve` on the default model itself (a free port), measures, stops it
    ~/.cache/rlft/reference/venv/bin/python bench/serve/load.py
    # or measures a server that is already running (e.g. llama-cpp-python's)
    ~/.cache/rlft/reference/venv/bin/python bench/serve/load.py --base-url http://127.0.0.1:8000/v1 --model M

Requests are seeded and ask the server to ignore end-of-sequence (`ignore_eos`, which rlft serve
and vLLM honour; for llama-cpp-python `--eos-logit-bias 2 0` bans SmolLM2's end tokens instead), so
every server decodes the same number of tokens; the tokens counted are those the server reports
in `usage`. Run it with nothing else busy on the machine (under
`flock /tmp/rlft-bench.lock`).
"""

import argparse
import asyncio
import json
import os
import platform
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import openai

REPO = Path(__file__).resolve().parents[2]

QUESTIONS = [
    "Explain why the sky is blue.",
    "Write a short poem about the sea.",
    "What are the benefits of regular exercise?",
    "Describe how a bicycle works.",
    "Give me three tips for learning a new language.",
    "What is the difference between weather and climate?",
    "Tell me a story about a brave mouse.",
    "How do plants make their food?",
]


def start_rlft(rlft, model, extra):
    proc = subprocess.Popen(
        [rlft, "serve", "--model", model, "--served-model-name", "default", "--port", "0", *extra],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    for line in proc.stderr:
        m = re.match(r"listening on (http://\S+)", line)
        if m:
            # Keep reading stderr so the server never blocks on a full pipe.
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
            return proc, m.group(1) + "/v1"
    sys.exit("rlft serve exited before listening")


def default_model():
    if os.environ.get("RLFT_DEFAULT_MODEL"):
        return os.environ["RLFT_DEFAULT_MODEL"]
    out = subprocess.run([str(REPO / "scripts/fetch-default-model.sh")], capture_output=True,
                         text=True, check=True)
    return out.stdout.strip()


async def one(client, model, i, args):
    max_tokens = args.min_tokens + (i * 37) % (args.max_tokens - args.min_tokens + 1)
    t0 = time.perf_counter()
    try:
        r = await client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
            max_tokens=max_tokens,
            temperature=0.7,
            seed=i,
            **eos_options(args),
        )
        return time.perf_counter() - t0, r.usage.completion_tokens, None
    except Exception as e:  # noqa: BLE001 - every failure counts as an error
        return time.perf_counter() - t0, 0, repr(e)


def eos_options(args):
    """`ignore_eos`, or for a server without it (llama-cpp-python) a -100 logit bias on the
    end-of-sequence ids: either way every request decodes its max_tokens."""
    if args.eos_logit_bias:
        return {"logit_bias": {str(t): -100 for t in args.eos_logit_bias}}
    return {"extra_body": {"ignore_eos": True}}


def percentile(xs, q):
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


async def run(args, base_url, model):
    # A server started with a key (RLFT_API_KEY, which `rlft serve` reads too) wants it back.
    client = openai.AsyncOpenAI(base_url=base_url, api_key=os.environ.get("RLFT_API_KEY", "unused"),
                                max_retries=0, timeout=3600)
    # One short request first, so model loading and first-call costs stay out of the numbers.
    warm = argparse.Namespace(**{**vars(args), "min_tokens": 4, "max_tokens": 4})
    await one(client, model, 0, warm)
    sem = asyncio.Semaphore(args.concurrency)

    async def bounded(i):
        async with sem:
            return await one(client, model, i, args)

    t0 = time.perf_counter()
    results = await asyncio.gather(*(bounded(i) for i in range(args.requests)))
    wall = time.perf_counter() - t0
    lat = [r[0] for r in results]
    errors = [r[2] for r in results if r[2]]
    tokens = sum(r[1] for r in results)
    return {
        "server": args.label,
        "model": model,
        "requests": args.requests,
        "concurrency": args.concurrency,
        "new_tokens_per_request": [args.min_tokens, args.max_tokens],
        "errors": len(errors),
        "first_errors": errors[:3],
        "latency_p50_s": round(percentile(lat, 0.5), 3),
        "latency_p99_s": round(percentile(lat, 0.99), 3),
        "wall_s": round(wall, 3),
        "completion_tokens": tokens,
        "tokens_per_s": round(tokens / wall, 1),
        "cpu": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-url", help="a running server's /v1 URL; default: start rlft serve")
    ap.add_argument("--model", help="model name (with --base-url) or path (rlft serve)")
    ap.add_argument("--rlft", default=str(REPO / "target/release/rlft"))
    ap.add_argument("--label", default="rlft serve")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--min-tokens", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--eos-logit-bias", type=int, nargs="*", default=[],
                    help="end-of-sequence ids to ban with logit_bias instead of ignore_eos")
    ap.add_argument("--out", help="also write the JSON here")
    ap.add_argument("serve_args", nargs="*", help="extra `rlft serve` arguments (after --)")
    args = ap.parse_args()
    proc = None
    if args.base_url:
        base_url, model = args.base_url, args.model or "default"
    else:
        proc, base_url = start_rlft(args.rlft, args.model or default_model(), args.serve_args)
        model = "default"
    try:
        result = asyncio.run(run(args, base_url, model))
    finally:
        if proc:
            proc.terminate()
            proc.wait(timeout=60)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    sys.exit(1 if result["errors"] else 0)


if __name__ == "__main__":
    main()
