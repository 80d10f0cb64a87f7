"""`rlft serve` against the official `openai` Python client (pinned in bench/reference/requirements.txt).

Starts `rlft serve` on 127.0.0.1 (a free port) on the default model, runs plain, streamed, n > 1
and log-prob requests for chat and text completions, checks greedy parity with `rlft generate`,
sends bad input (malformed JSON, unknown model, max_tokens beyond the context or below 1, a 10 MB
body, a client that disconnects mid-stream) and checks the server keeps serving, then stops it
with Ctrl-C (SIGINT) and checks it drains and exits 0. Then a server started with `--api-key`:
the client with that key works, a wrong key raises `openai.AuthenticationError`, and curl
without the key gets 401 everywhere but `/health`; runtime adapter loading is refused (403)
unless `--allow-runtime-lora` names a directory, and then outside that directory.

    cargo build --release -p rlft-cli
    ~/.cache/rlft/reference/venv/bin/python tests/serve/openai_client.py [--rlft target/release/rlft]

Prints one line per check and `all checks passed`; exits 1 on the first failure.
"""

import argparse
import atexit
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import openai

REPO = Path(__file__).resolve().parents[2]


def default_model():
    if os.environ.get("RLFT_DEFAULT_MODEL"):
        return os.environ["RLFT_DEFAULT_MODEL"]
    out = subprocess.run(
        [str(REPO / "scripts/fetch-default-model.sh")], capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


class Server:
    def __init__(self, rlft, model, *extra):
        env = {k: v for k, v in os.environ.items() if k != "RLFT_API_KEY"}
        self.proc = subprocess.Popen(
            [rlft, "serve", "--model", model, "--served-model-name", "smol", "--port", "0", *extra],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        atexit.register(self.proc.kill)
        self.log = []
        for line in self.proc.stderr:
            self.log.append(line)
            m = re.match(r"listening on (http://\S+)", line)
            if m:
                self.url = m.group(1)
                break
        else:
            sys.exit("rlft serve exited before listening:\n" + "".join(self.log))
        threading.Thread(target=self._drain_log, daemon=True).start()

    def _drain_log(self):
        for line in self.proc.stderr:
            self.log.append(line)

    def raw(self, path, body: bytes):
        req = urllib.request.Request(
            self.url + path, data=body, headers={"content-type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())


def curl(url, *args):
    """`curl` to `url`: (status, body)."""
    out = subprocess.run(
        ["curl", "-sS", "-o", "-", "-w", "\n%{http_code}", *args, url],
        capture_output=True, text=True, check=True,
    )
    body, code = out.stdout.rsplit("\n", 1)
    return int(code), body


def check(name, cond, detail=""):
    if not cond:
        print(f"FAIL {name} {detail}")
        sys.exit(1)
    print(f"ok   {name}")


def generate_ids(rlft, model, *args):
    out = subprocess.run(
        [rlft, "generate", "--model", model, "--json", *args],
        capture_output=True,
        text=True,
        check=True,
    )
    return [json.loads(line)["token_ids"] for line in out.stdout.splitlines()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlft", default=str(REPO / "target/release/rlft"))
    args = ap.parse_args()
    model = default_model()
    s = Server(args.rlft, model)
    client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
    msgs = [{"role": "user", "content": "What is the capital of France?"}]

    ids = [m.id for m in client.models.list().data]
    check("models.list", ids == ["smol"], ids)

    # Plain chat, greedy: the tokens of `rlft generate --chat --greedy`.
    r = client.chat.completions.create(
        model="smol", messages=msgs, temperature=0, max_tokens=48,
        extra_body={"return_token_ids": True},
    )
    want = generate_ids(args.rlft, model, "--chat", "--greedy", "--max-new-tokens", "48",
                        msgs[0]["content"])[0]
    got = r.choices[0].model_extra["token_ids"]
    check("chat greedy == rlft generate --greedy", got == want, (got, want))
    check("chat usage", r.usage.completion_tokens == len(want) and r.usage.prompt_tokens > 0)
    plain = r.choices[0].message.content
    check("chat content", "Paris" in plain, plain)

    # Streamed: the deltas concatenate to the plain answer; usage arrives last.
    stream = client.chat.completions.create(
        model="smol", messages=msgs, temperature=0, max_tokens=48, stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    check("stream == plain", text == plain, (text, plain))
    check("stream usage chunk", chunks[-1].usage is not None
          and chunks[-1].usage.completion_tokens == len(want) and not chunks[-1].choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    check("stream finish_reason", finish == [r.choices[0].finish_reason], finish)

    # n > 1 with a seed: three choices, and the same three again.
    def sample():
        return client.chat.completions.create(
            model="smol", messages=[{"role": "user", "content": "Tell me a joke."}],
            n=3, seed=5, temperature=0.9, max_tokens=24,
        )
    a, b = sample(), sample()
    texts = [c.message.content for c in a.choices]
    check("n=3 choices", [c.index for c in a.choices] == [0, 1, 2] and len(set(texts)) > 1, texts)
    check("seed repeats", texts == [c.message.content for c in b.choices])
    want = generate_ids(args.rlft, model, "--chat", "--seed", "5", "--temperature", "0.9", "-n", "3",
                        "--max-new-tokens", "24", "Tell me a joke.")
    c = client.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": "Tell me a joke."}],
        n=3, seed=5, temperature=0.9, max_tokens=24, extra_body={"return_token_ids": True},
    )
    check("seeded n=3 == rlft generate --seed -n 3",
          [ch.model_extra["token_ids"] for ch in c.choices] == want)

    # Log-probs: one entry per token, top_logprobs sorted, greedy picks the top one.
    r = client.chat.completions.create(
        model="smol", messages=msgs, temperature=0, max_tokens=12, logprobs=True, top_logprobs=3,
    )
    lp = r.choices[0].logprobs.content
    check("chat logprobs length", len(lp) == r.usage.completion_tokens)
    ok = all(
        len(e.top_logprobs) == 3
        and e.top_logprobs[0].token == e.token
        and abs(e.top_logprobs[0].logprob - e.logprob) < 1e-6
        and e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob >= e.top_logprobs[2].logprob
        for e in lp
    )
    check("chat top_logprobs", ok)

    # Text completions: a batch of prompts, n = 2, log-probs; and streamed.
    r = client.completions.create(
        model="smol", prompt=["The sky is", "Two plus two is"], n=2, max_tokens=8, seed=1,
        logprobs=2,
    )
    check("completions choices", [c.index for c in r.choices] == [0, 1, 2, 3])
    check("completions logprobs", all(
        len(c.logprobs.tokens) == len(c.logprobs.token_logprobs) == len(c.logprobs.top_logprobs)
        and all(len(t) == 2 for t in c.logprobs.top_logprobs) for c in r.choices))
    plain = client.completions.create(model="smol", prompt="Once upon a time", max_tokens=20,
                                      temperature=0).choices[0].text
    streamed = "".join(
        c.choices[0].text for c in client.completions.create(
            model="smol", prompt="Once upon a time", max_tokens=20, temperature=0, stream=True)
        if c.choices
    )
    check("completions stream == plain", streamed == plain, (streamed, plain))

    # Bad input.
    try:
        client.chat.completions.create(model="nope", messages=msgs, max_tokens=4)
        check("unknown model", False)
    except openai.NotFoundError as e:
        check("unknown model -> 404", e.status_code == 404 and "nope" in str(e))
    try:
        client.chat.completions.create(model="smol", messages=msgs, max_tokens=100000)
        check("max_tokens beyond context", False)
    except openai.BadRequestError as e:
        check("max_tokens beyond context -> 400", "maximum context length" in str(e))
    try:
        client.chat.completions.create(model="smol", messages=msgs, max_tokens=-1)
        check("max_tokens = -1", False)
    except openai.BadRequestError as e:
        check("max_tokens = -1 -> 400 naming the field",
              e.param == "max_tokens" and "max_tokens must be an integer >= 1, got -1" in str(e),
              (e.param, str(e)))
    try:
        client.completions.create(model="smol", prompt="Hi", max_tokens=4, top_p=1.5)
        check("top_p = 1.5", False)
    except openai.BadRequestError as e:
        check("top_p = 1.5 -> 400 naming the field and its range",
              e.param == "top_p" and "a number > 0 and <= 1" in str(e), (e.param, str(e)))
    code, body = s.raw("/v1/chat/completions", b'{"model": "smol", "messages": [')
    check("malformed JSON -> 400", code == 400 and "message" in body["error"], body)
    big = json.dumps({"model": "smol", "prompt": "a" * (10 << 20)}).encode()
    code, body = s.raw("/v1/completions", big)
    check("10 MB body -> 413", code == 413 and "error" in body, code)

    # A client that disconnects mid-stream.
    stream = client.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": "Tell me a very long story."}],
        max_tokens=2000, stream=True, extra_body={"ignore_eos": True},
    )
    for i, _ in enumerate(stream):
        if i == 5:
            break
    stream.close()
    t0 = time.time()
    while not any("cancelled" in line for line in s.log) and time.time() - t0 < 10:
        time.sleep(0.05)
    check("disconnect mid-stream: the job is cancelled", any("cancelled" in l for l in s.log))
    r = client.chat.completions.create(model="smol", messages=msgs, max_tokens=8)
    check("still serving after bad input", r.choices[0].message.content is not None)

    # No runtime adapter loading unless switched on.
    code, body = curl(s.url + "/v1/load_lora_adapter", "-H", "content-type: application/json",
                      "-d", json.dumps({"lora_name": "x", "lora_path": "/tmp"}))
    check("load_lora_adapter off by default -> 403",
          code == 403 and json.loads(body)["error"]["code"] == "runtime_lora_disabled", body)

    # Ctrl-C: drains and exits 0.
    s.proc.send_signal(signal.SIGINT)
    check("Ctrl-C stops the server", s.proc.wait(timeout=30) == 0)

    check_api_key(args.rlft, model)
    print("all checks passed")


def check_api_key(rlft, model):
    """A server with --api-key and --allow-runtime-lora, through the client and curl."""
    key = "sk-rlft-test-" + os.urandom(8).hex()
    adapters = Path(os.environ.get("TMPDIR", "/tmp")) / f"rlft-openai-client-{os.getpid()}"
    adapters.mkdir(parents=True, exist_ok=True)
    s = Server(rlft, model, "--api-key", key, "--allow-runtime-lora", str(adapters))
    msgs = [{"role": "user", "content": "Say hi."}]
    good = openai.OpenAI(base_url=s.url + "/v1", api_key=key, max_retries=0)
    r = good.chat.completions.create(model="smol", messages=msgs, max_tokens=4)
    check("api key: the right key works", r.choices[0].message.content is not None)
    check("api key: models.list with the key", [m.id for m in good.models.list().data] == ["smol"])
    bad = openai.OpenAI(base_url=s.url + "/v1", api_key="sk-wrong", max_retries=0)
    try:
        bad.chat.completions.create(model="smol", messages=msgs, max_tokens=4)
        check("api key: a wrong key", False)
    except openai.AuthenticationError as e:
        check("api key: a wrong key -> AuthenticationError (401, invalid_api_key)",
              e.status_code == 401 and e.code == "invalid_api_key", (e.status_code, e.code))
    code, body = curl(s.url + "/v1/models")
    check("api key: curl without the key -> 401", code == 401
          and json.loads(body)["error"]["type"] == "invalid_request_error", body)
    code, _ = curl(s.url + "/v1/models", "-H", f"Authorization: Bearer {key}")
    check("api key: curl with the key -> 200", code == 200)
    code, _ = curl(s.url + "/health")
    check("api key: /health stays open", code == 200)
    auth = ["-H", f"Authorization: Bearer {key}", "-H", "content-type: application/json"]
    code, body = curl(s.url + "/v1/load_lora_adapter", *auth, "-d",
                      json.dumps({"lora_name": "x", "lora_path": str(adapters / "../..")}))
    check("runtime LoRA: a path outside the directory -> 403 naming it",
          code == 403 and str(adapters) in json.loads(body)["error"]["message"], body)
    check("api key: never in the server's log", not any(key in line for line in s.log))
    s.proc.send_signal(signal.SIGINT)
    check("Ctrl-C stops the keyed server", s.proc.wait(timeout=30) == 0)
    adapters.rmdir()


if __name__ == "__main__":
    main()
