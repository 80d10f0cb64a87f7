# Held-out prompts and a paired comparison of two evals: a diagnostic for the learning claims of
# examples/preference/README.md, not a golden.
#
#   # prompts of DATASET's test split that no TRAINED_ON dataset holds (any split), as a DatasetDict
#   python scripts/reference/heldout_prompts.py filter DATASET OUT TRAINED_ON [TRAINED_ON ...] [--max N]
#   # two `rlft eval --output` files on the same prompts: accuracy of each, prompts gained and lost,
#   # and the exact two-sided sign test on the changed prompts
#   python scripts/reference/heldout_prompts.py compare BEFORE.jsonl AFTER.jsonl [--key REWARD]
#   # an `rlft eval --output` file of tiny_python_expr prompts scored by another harness: the truth
#   # recomputed from the prompt's expression with Python's own arithmetic (an AST walk, no eval),
#   # the answer the first \boxed{} (format) or else the last number, compared as numbers
#   python scripts/reference/heldout_prompts.py rescore EVAL.jsonl
#
# Needs `datasets` (the reference venv: ~/.cache/rlft/reference/venv/bin/python) for `filter`.
import argparse, ast, json, math, operator, re


def prompt_text(prompt):
    """The user's text of a row's prompt (a string or chat messages)."""
    if isinstance(prompt, list):
        return prompt[-1]["content"]
    return prompt


def filter_cmd(a):
    from datasets import DatasetDict, load_from_disk

    seen = set()
    for path in a.trained_on:
        dd = load_from_disk(path)
        for split in dd:
            seen.update(prompt_text(p) for p in dd[split]["prompt"])
    test = load_from_disk(a.dataset)["test"]
    keep = [i for i, p in enumerate(test["prompt"]) if prompt_text(p) not in seen]
    if a.max:
        keep = keep[: a.max]
    sub = test.select(keep)
    # `rlft eval` reads the test split; train holds one row so the DatasetDict has both splits.
    DatasetDict({"train": sub.select(range(1)), "test": sub}).save_to_disk(a.out)
    print(f"{a.out}: {len(sub)} of {len(test)} test prompts are in none of {len(a.trained_on)} dataset(s)")


def compare_cmd(a):
    before = [json.loads(l) for l in open(a.before)]
    after = [json.loads(l) for l in open(a.after)]
    if [r["prompt"] for r in before] != [r["prompt"] for r in after]:
        raise SystemExit("the two evals are not on the same prompts in the same order: eval both on one dataset")
    get = lambda r: r["rewards"][a.key]
    gained = sum(get(x) < get(y) for x, y in zip(before, after))
    lost = sum(get(x) > get(y) for x, y in zip(before, after))
    n, k = gained + lost, min(gained, lost)
    p = min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n) if n else 1.0
    m = len(before)
    print(f"{m} prompts, {a.key}: {sum(map(get, before)) / m:.3f} -> {sum(map(get, after)) / m:.3f}; "
          f"{gained} gained, {lost} lost; sign test p = {p:.2g}")


OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
       ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Div: operator.truediv,
       ast.Pow: operator.pow}


def arith(node):
    """The value of an arithmetic expression's AST: numbers, + - * / // % **, unary minus."""
    if isinstance(node, ast.Expression):
        return arith(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in OPS:
        return OPS[type(node.op)](arith(node.left), arith(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = arith(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    raise ValueError(f"not arithmetic: {ast.dump(node)}")


def as_number(text):
    try:
        return float(text.strip().strip("$").replace(",", "").rstrip("."))
    except ValueError:
        return None


def rescore_cmd(a):
    rows = [json.loads(l) for l in open(a.eval)]
    right = boxed = agree = 0
    for r in rows:
        expr = re.search(r"Expression:\s*(.+)", r["prompt"]).group(1).strip()
        truth = arith(ast.parse(expr, mode="eval"))
        box = re.search(r"\\boxed\{([^{}]*)\}", r["completion"])
        in_box = box.group(1).strip() if box else ""
        nums = re.findall(r"-?\d+(?:\.\d+)?", r["completion"].replace(",", ""))
        value = as_number(in_box or (nums[-1] if nums else ""))
        ok = value is not None and abs(value - truth) < 1e-9
        right += ok
        boxed += bool(in_box)
        agree += ok == (r["rewards"].get("python_expr_rule/accuracy", 0) == 1)
    n = len(rows)
    print(f"{n} prompts: accuracy {right / n:.3f}, format {boxed / n:.3f} (this harness); "
          f"rlft's accuracy agrees on {agree} of {n}")


ap = argparse.ArgumentParser()
sub = ap.add_subparsers(dest="cmd", required=True)
f = sub.add_parser("filter")
f.add_argument("dataset"); f.add_argument("out"); f.add_argument("trained_on", nargs="+")
f.add_argument("--max", type=int, default=0)
c = sub.add_parser("compare")
c.add_argument("before"); c.add_argument("after")
c.add_argument("--key", default="python_expr_rule/accuracy")
r = sub.add_parser("rescore")
r.add_argument("eval")
a = ap.parse_args()
{"filter": filter_cmd, "compare": compare_cmd, "rescore": rescore_cmd}[a.cmd](a)
