"""Golden cases of rlft's built-in calculator tool: random arithmetic expressions and what
Python makes of them (`repr` of the value, or the error), written to
crates/rlft-tools/tests/data/calculator_cases.json. Standard library only:

    python3 scripts/reference/calculator_cases.py

The calculator promises Python's rules for numbers, + - * / // % ** and parentheses; each case
is {"expression": ..., "value": repr(eval(expression))} or {"expression": ..., "error": kind}
with kind "division by zero", "too large" (OverflowError or a result past 2**127) or "not a
real number" (a complex result).
"""

import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parents[2] / "crates/rlft-tools/tests/data/calculator_cases.json"
OPS = ["+", "-", "*", "/", "//", "%", "**"]


def leaf(rng):
    r = rng.random()
    if r < 0.7:
        return str(rng.randint(0, 30))
    if r < 0.85:
        return f"{rng.randint(0, 20)}.{rng.choice(['5', '25', '1', '75'])}"
    return str(rng.randint(100, 100000))


def expr(rng, depth):
    if depth == 0 or rng.random() < 0.3:
        e = leaf(rng)
    else:
        op = rng.choice(OPS)
        left = expr(rng, depth - 1)
        right = str(rng.randint(-3, 5)) if op == "**" else expr(rng, depth - 1)
        if op == "**" and right.startswith("-"):
            right = f"({right})" if rng.random() < 0.5 else right
        e = f"{left} {op} {right}"
    if rng.random() < 0.1:
        e = f"-{e}" if e[0].isdigit() else e
    return f"({e})" if depth and rng.random() < 0.6 else e


def case(e):
    try:
        v = eval(e, {"__builtins__": {}})  # the generator's own expressions only
    except ZeroDivisionError:
        return {"expression": e, "error": "division by zero"}
    except OverflowError:
        return {"expression": e, "error": "too large"}
    if isinstance(v, complex):
        return {"expression": e, "error": "not a real number"}
    if isinstance(v, int) and abs(v) >= 2**127:
        return {"expression": e, "error": "too large"}
    if isinstance(v, float) and v != v:
        return {"expression": e, "error": "not a real number"}
    return {"expression": e, "value": repr(v)}


def main():
    rng = random.Random(20261206)
    cases, seen = [], set()
    while len(cases) < 600:
        e = expr(rng, rng.randint(1, 4))
        if e not in seen:
            seen.add(e)
            cases.append(case(e))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(cases, indent=0) + "\n")
    kinds = {}
    for c in cases:
        k = c.get("error", "value")
        kinds[k] = kinds.get(k, 0) + 1
    print(f"{len(cases)} cases -> {OUT}: {kinds}")


if __name__ == "__main__":
    main()
