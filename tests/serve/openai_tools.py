"""`rlft serve` with tools, through the official `openai` Python client (pinned in
bench/reference/requirements.txt).

Starts `rlft serve` on 127.0.0.1 (a free port) on the built-in `qwen2.5-coder-0.5b` (Qwen2.5's
chat template renders tools; the model writes its calls as a JSON object), gives it a
calculator tool and asks "Compute 17 * (18 - 14) with the calculator", greedy:

- `chat.completions.create(..., tools=[...])` answers with `finish_reason == "tool_calls"` and
  `message.tool_calls` whose arguments parse as JSON with an `expression`;
- the same request streamed gives the same calls as `delta.tool_calls` chunks (index, id, type,
  name, arguments) and the same finish reason;
- the conversation with that call and a `tool` message holding its result gets an answer as
  content that holds the result (the 0.5B model echoes it as more call-like JSON lines, which
  are not one well-formed call, so they stay content; greedy, it runs to `max_tokens`);
- `tool_choice="none"` gives content and no calls, `tool_choice="required"` a 400
  (`BadRequestError` naming `tool_choice`);
- the default model (SmolLM2, whose template has no tools) refuses `tools` with a 400.

    cargo build --release -p rlft-cli
    ~/.cache/rlft/reference/venv/bin/python tests/serve/openai_tools.py [--rlft target/release/rlft]

Any Python with `openai` installed works (`pip install openai==3.60.0`). Prints one line per
check, the answers it got, and `all checks passed`; exits 1 on the first failure.
"""

import argparse
import ast
import json
import operator
import signal

import openai

# The helpers of the other openai-package check, beside this file (on sys.path as a script).
from openai_client import REPO, Server, check, default_model

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression with + - * / and parentheses.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. 2 * (3 + 4)"}},
            "required": ["expression"],
        },
    },
}
QUESTION = "Compute 17 * (18 - 14) with the calculator"
OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
       ast.Div: operator.truediv, ast.USub: operator.neg}


def calculate(expression):
    """The tool: arithmetic parsed, never run as code."""
    def ev(n):
        if isinstance(n, ast.Constant) and isinstance(n.value, (int, float)):
            return n.value
        if isinstance(n, ast.BinOp) and type(n.op) in OPS:
            return OPS[type(n.op)](ev(n.left), ev(n.right))
        if isinstance(n, ast.UnaryOp) and type(n.op) in OPS:
            return OPS[type(n.op)](ev(n.operand))
        raise ValueError(f"not arithmetic: {expression}")
    return ev(ast.parse(expression, mode="eval").body)


def streamed_calls(chunks):
    """The calls of a stream, its content and its finish reason, deltas put together by index."""
    calls, content, finish = {}, "", None
    for c in chunks:
        if not c.choices:
            continue
        ch = c.choices[0]
        content += ch.delta.content or ""
        for d in ch.delta.tool_calls or []:
            call = calls.setdefault(d.index, {"id": None, "type": None, "name": "", "arguments": ""})
            call["id"] = d.id or call["id"]
            call["type"] = d.type or call["type"]
            if d.function:
                call["name"] += d.function.name or ""
                call["arguments"] += d.function.arguments or ""
        finish = ch.finish_reason or finish
    return [calls[i] for i in sorted(calls)], content, finish


def expect_400(request, what, param):
    """Checks that `request()` is refused with a 400 naming `param`."""
    try:
        request()
        check(what, False)
    except openai.BadRequestError as e:
        print(f"     {what}:", e.message)
        check(f"{what} -> 400 naming {param}", e.param == param)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlft", default=str(REPO / "target/release/rlft"))
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    args = ap.parse_args()
    s = Server(args.rlft, args.model)
    client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
    msgs = [{"role": "user", "content": QUESTION}]
    ask = dict(model="smol", tools=[CALCULATOR], temperature=0, max_tokens=96)

    # Not streamed.
    r = client.chat.completions.create(messages=msgs, **ask)
    choice = r.choices[0]
    print("     answer:", choice.message.model_dump_json(exclude_none=True))
    check("finish_reason == tool_calls", choice.finish_reason == "tool_calls", choice)
    calls = choice.message.tool_calls or []
    check("one calculator call", len(calls) == 1 and calls[0].type == "function"
          and calls[0].function.name == "calculator", calls)
    check("call id call_...", calls[0].id.startswith("call_"), calls[0].id)
    arguments = json.loads(calls[0].function.arguments)
    check("arguments parse as JSON with an expression", "expression" in arguments, arguments)
    result = calculate(arguments["expression"])
    check(f"the expression {arguments['expression']!r} computes 68", result == 68, result)

    # Streamed: the same calls, as delta.tool_calls.
    chunks = list(client.chat.completions.create(messages=msgs, stream=True, **ask))
    scalls, scontent, sfinish = streamed_calls(chunks)
    print("     stream:", json.dumps({"content": scontent, "tool_calls": scalls,
                                       "finish_reason": sfinish}))
    check("stream finish_reason == tool_calls", sfinish == "tool_calls", sfinish)
    check("stream calls == plain calls",
          [(c["name"], json.loads(c["arguments"])) for c in scalls]
          == [(c.function.name, json.loads(c.function.arguments)) for c in calls], scalls)
    check("stream call ids and types", all(c["id"].startswith("call_") and c["type"] == "function"
                                           for c in scalls))
    check("stream content == plain content", scontent == (choice.message.content or ""))
    check("stream: no call text leaks as content", "calculator" not in scontent, scontent)

    # The follow-up: the call and its result, then an answer.
    follow = msgs + [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": calls[0].id, "content": str(result)},
    ]
    r2 = client.chat.completions.create(messages=follow, **ask)
    answer = r2.choices[0].message
    print("     follow-up:", answer.model_dump_json(exclude_none=True))
    check("follow-up answers with content", not answer.tool_calls and answer.content, r2)
    check("follow-up content holds the result 68", "68" in answer.content, answer.content)
    s2 = list(client.chat.completions.create(messages=follow, stream=True, **ask))
    scalls, text, finish = streamed_calls(s2)
    check("follow-up streamed == plain", (scalls, text, finish)
          == ([], answer.content, r2.choices[0].finish_reason), text)

    # tool_choice.
    r3 = client.chat.completions.create(messages=msgs, tool_choice="none", **ask)
    print("     tool_choice=none:", r3.choices[0].message.model_dump_json(exclude_none=True))
    check("tool_choice=none: content, no calls", r3.choices[0].message.tool_calls is None
          and r3.choices[0].finish_reason != "tool_calls")
    expect_400(lambda: client.chat.completions.create(messages=msgs, tool_choice="required", **ask),
               "tool_choice=required", "tool_choice")

    s.proc.send_signal(signal.SIGINT)
    check("Ctrl-C stops the server", s.proc.wait(timeout=30) == 0)

    # A model whose template renders no tools.
    smol = Server(args.rlft, default_model())
    c = openai.OpenAI(base_url=smol.url + "/v1", api_key="unused", max_retries=0)
    expect_400(lambda: c.chat.completions.create(messages=msgs, **ask),
               "tools on a template without tools", "tools")
    smol.proc.send_signal(signal.SIGINT)
    check("Ctrl-C stops the second server", smol.proc.wait(timeout=30) == 0)
    print("all checks passed")


if __name__ == "__main__":
    main()
