"""The tiny_python_expr dataset generator in Python: the reference for rlft's Rust generator.

    python3 scripts/reference/tiny_python_expr_reference.py [--seed 42] [--train-size 128]
        [--test-size 32] [--operators "+,-,*"] [--max-depth 3] [--leaf-max 20]
        [--value-min 0] [--value-max 200] [--output FILE.jsonl]

With the default options this is the seed example's builder exactly as the project's mission
describes it ("The seed example, exactly"), and writes the vendored fixture
`tests/fixtures/tiny_python_expr/dataset_seed42_128_32.jsonl` byte for byte; regenerate it from
the repository root with

    python3 scripts/reference/tiny_python_expr_reference.py \
        --output tests/fixtures/tiny_python_expr/dataset_seed42_128_32.jsonl

Train rows then test rows, one `json.dumps(record)` per line (default separators
", " and ": ", ensure_ascii=True; the records are pure ASCII, so ensure_ascii does not change
the fixture's bytes).

The extra options generalise it the way `rlft_data::synth::TinyPythonExprOptions` does, and
with their defaults take exactly the original code path (same RNG calls in the same order):

- `operators`: chosen with `rng.choice` from the tuple in the order given;
  `//` and `%` are rejected (one of the 64 tries) when the right operand is 0;
  `**` is rejected when the exponent is negative or above MAX_POW_EXPONENT;
- every operator result must lie in [value_min, value_max] (the original: 0..=200);
- leaves are `rng.randint(0, leaf_max)`; record depth is `rng.randint(1, max_depth)`.

Plain Python 3, standard library only. Used to write the golden files in
`crates/rlft-data/tests/data/` and by `check_tiny_python_expr_dataset.py`.
"""

import argparse
import json
import operator
import random
import sys

PROMPT = (
    "Compute this Python-style arithmetic expression.\n"
    "Expression: {expr}\n"
    "Return only the final result in the format \\boxed{{answer}}."
)
SYSTEM_PROMPT = (
    "You are a careful arithmetic assistant. Solve the expression and respond briefly. "
    "Return the final result in the format \\boxed{answer}. Do not add unnecessary explanation."
)
LEAF_PROBABILITY = 0.35
MAX_TRIES = 64
MAX_POW_EXPONENT = 4

OPERATORS = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "//": operator.floordiv,
    "%": operator.mod,
    "**": operator.pow,
}
DEFAULT_OPERATORS = ("+", "-", "*")


def build_expression(rng, depth, ops=None, leaf_max=20, value_min=0, value_max=200):
    """Returns (expression text, integer value)."""
    if ops is None:
        ops = tuple((s, OPERATORS[s]) for s in DEFAULT_OPERATORS)
    if depth <= 0 or rng.random() < LEAF_PROBABILITY:
        v = rng.randint(0, leaf_max)
        return str(v), v
    for _ in range(MAX_TRIES):
        symbol, fn = rng.choice(ops)
        left, lv = build_expression(rng, depth - 1, ops, leaf_max, value_min, value_max)
        right, rv = build_expression(rng, depth - 1, ops, leaf_max, value_min, value_max)
        if symbol == "-" and lv < rv:
            left, right, lv, rv = right, left, rv, lv
        if symbol in ("//", "%") and rv == 0:
            continue
        if symbol == "**" and not 0 <= rv <= MAX_POW_EXPONENT:
            continue
        value = fn(lv, rv)
        if value_min <= value <= value_max:
            return f"({left} {symbol} {right})", value
    v = rng.randint(0, leaf_max)
    return str(v), v


def make_record(expr, value, split, index):
    answer = str(value)
    return {
        "data_source": "tiny_python_expr",
        "prompt": PROMPT.format(expr=expr),
        "ability": "math",
        "reward_model": {"ground_truth": answer},
        "extra_info": {
            "label": "python_expr_rule",
            "reference": answer,
            "answer": answer,
            "expression": expr,
            "split": split,
            "index": index,
        },
    }


def build_split(rng, split, size, ops, max_depth, leaf_max, value_min, value_max):
    seen = set()
    records = []
    while len(records) < size:
        depth = rng.randint(1, max_depth)
        expr, value = build_expression(rng, depth, ops, leaf_max, value_min, value_max)
        if expr in seen:
            continue
        seen.add(expr)
        records.append(make_record(expr, value, split, len(records)))
    return records


def build_dataset(seed=42, train_size=128, test_size=32, operators=DEFAULT_OPERATORS,
                  max_depth=3, leaf_max=20, value_min=0, value_max=200):
    """Returns {"train": [...], "test": [...]}; test continues train's RNG stream."""
    rng = random.Random(seed)
    ops = tuple((s, OPERATORS[s]) for s in operators)
    args = (ops, max_depth, leaf_max, value_min, value_max)
    train = build_split(rng, "train", train_size, *args)
    test = build_split(rng, "test", test_size, *args)
    return {"train": train, "test": test}


def to_jsonl(dataset):
    return "".join(json.dumps(r) + "\n" for split in ("train", "test") for r in dataset[split])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--train-size", type=int, default=128)
    p.add_argument("--test-size", type=int, default=32)
    p.add_argument("--operators", default="+,-,*")
    p.add_argument("--max-depth", type=int, default=3)
    p.add_argument("--leaf-max", type=int, default=20)
    p.add_argument("--value-min", type=int, default=0)
    p.add_argument("--value-max", type=int, default=200)
    p.add_argument("--output", help="JSONL file (default: stdout)")
    a = p.parse_args()
    ds = build_dataset(a.seed, a.train_size, a.test_size, tuple(a.operators.split(",")),
                       a.max_depth, a.leaf_max, a.value_min, a.value_max)
    text = to_jsonl(ds)
    if a.output:
        with open(a.output, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
