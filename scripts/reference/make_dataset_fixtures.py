"""Golden dataset fixtures for crates/rlft-data, written by Hugging Face `datasets` and pyarrow.

Run from the repository root with the baseline venv (datasets 5.x, pyarrow):

    ~/.cache/rlft/reference/venv/bin/python scripts/reference/make_dataset_fixtures.py

Writes, under crates/rlft-data/tests/fixtures/ (a few KB, committed):

- tiny_expr_dict/     `DatasetDict.save_to_disk`: splits train (6 rows) and test (3 rows) in the
                      shape of the tiny_python_expr dataset (data_source, prompt, ability,
                      reward_model {ground_truth}, extra_info {label, reference, answer,
                      expression, split, index}) plus a chat `messages` list-of-structs column
                      and a few more (float, bool, nullable int, list of strings).
- tiny_expr_{split}.parquet   `Dataset.to_parquet` of each split.
- tiny_expr_{split}.jsonl     `json.dumps(row)` of each row of `ds` (what Python sees, exactly;
                              not `Dataset.to_json`, whose pandas path turns nullable ints into
                              floats and rounds floats to 10 digits).
- arrow_types.arrow / .parquet / .expected.json
                      one pyarrow table of assorted Arrow types (int8..uint64, float32,
                      large_string, dictionary, large_list, fixed_size_list, map, null, nested
                      nulls) as an IPC stream and as Parquet, with the rows it must read as.

The rows are hand-written and deterministic; only `_fingerprint` in state.json is random.
"""

import json
import math
import shutil
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq

OUT = Path(__file__).resolve().parents[2] / "crates" / "rlft-data" / "tests" / "fixtures"

EXPRESSIONS = [
    ("8", "8"),
    ("(13 * 2)", "26"),
    ("19 - 4", "15"),
    ("7 // 2", "3"),
    ("2 ** 5", "32"),
    ("(6 + 3) * 2", "18"),
    ("17 % 5", "2"),
    ("-3 + 10", "7"),
    ("9 * 9", "81"),
]


def record(i: int, split: str, index: int) -> dict:
    expression, answer = EXPRESSIONS[i]
    prompt = (
        "Compute this Python-style arithmetic expression.\n"
        f"Expression: {expression}\n"
        "Return only the final result in the format \\boxed{answer}."
    )
    return {
        "data_source": "tiny_python_expr",
        "prompt": prompt,
        "ability": "math",
        "reward_model": {"ground_truth": answer},
        "extra_info": {
            "label": "python_expr_rule",
            "reference": answer,
            "answer": answer,
            "expression": expression,
            "split": split,
            "index": index,
        },
        "messages": [
            {"role": "system", "content": "Be brief. Ünïcödé ✓ 数学"},
            {"role": "user", "content": f"Compute {expression}"},
        ][: 1 + (i % 2)] if i != 3 else [],
        "difficulty": [0.5, 0.25, 1.0, 0.125, 2.5, 0.75, 1e-3, 3.0, -0.5][i],
        "verified": i % 3 != 0,
        "parent_index": None if i % 2 else i * 1000,
        "tags": [["arith"], [], ["mul", "paren"], ["floor-div"], ["pow"], ["mul"], ["mod"], ["neg"], []][i],
    }


def build_dict() -> datasets.DatasetDict:
    train = [record(i, "train", i) for i in range(6)]
    test = [record(6 + i, "test", i) for i in range(3)]
    return datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(train), "test": datasets.Dataset.from_list(test)}
    )


def arrow_types_table() -> tuple[pa.Table, list]:
    dict_strings = pa.array(["red", "green", "red", None]).dictionary_encode()
    table = pa.table(
        {
            "i8": pa.array([-128, 0, 127, None], pa.int8()),
            "i32": pa.array([1, -2, 2**31 - 1, 4], pa.int32()),
            "u16": pa.array([0, 1, 65535, None], pa.uint16()),
            "u64": pa.array([0, 2**63, 2**64 - 1, 5], pa.uint64()),
            "f32": pa.array([1.1, -0.5, None, 3.25], pa.float32()),
            "f64": pa.array([0.1, float("nan"), 1e300, -2.0], pa.float64()),
            "b": pa.array([True, False, None, True]),
            "s": pa.array(["a", "", None, "é\n\"q\""]),
            "ls": pa.array(["large", None, "x", "y"], pa.large_string()),
            "dict": dict_strings,
            "ll": pa.array([["a"], [], None, ["b", None]], pa.large_list(pa.string())),
            "fsl": pa.array([[1.0, 2.0], [3.0, 4.0], None, [5.0, 6.0]], pa.list_(pa.float64(), 2)),
            "nested": pa.array(
                [{"x": [1, 2], "y": {"z": "deep"}}, None, {"x": None, "y": None}, {"x": [], "y": {"z": None}}],
                pa.struct([("x", pa.list_(pa.int64())), ("y", pa.struct([("z", pa.string())]))]),
            ),
            "m": pa.array([[("k", 1)], [], None, [("a", 2), ("b", 3)]], pa.map_(pa.string(), pa.int64())),
            "nul": pa.array([None] * 4, pa.null()),
        }
    )
    rows = table.to_pylist()
    for row in rows:
        # JSON has no NaN: the reader maps non-finite floats to null.
        if isinstance(row["f64"], float) and not math.isfinite(row["f64"]):
            row["f64"] = None
        # Maps with string keys read as objects.
        if row["m"] is not None:
            row["m"] = dict(row["m"])
    return table, rows


def main() -> None:
    if OUT.exists():
        for p in OUT.iterdir():
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    OUT.mkdir(parents=True, exist_ok=True)

    dd = build_dict()
    dd.save_to_disk(str(OUT / "tiny_expr_dict"))
    for split, ds in dd.items():
        ds.to_parquet(str(OUT / f"tiny_expr_{split}.parquet"))
        with open(OUT / f"tiny_expr_{split}.jsonl", "w", encoding="utf-8") as f:
            for row in ds:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")

    table, rows = arrow_types_table()
    with pa.OSFile(str(OUT / "arrow_types.arrow"), "wb") as sink:
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table, max_chunksize=3)  # two batches
    pq.write_table(table, str(OUT / "arrow_types.parquet"))
    with open(OUT / "arrow_types.expected.json", "w", encoding="utf-8") as f:
        json.dump(rows, f, ensure_ascii=False, indent=1)

    total = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    print(f"datasets {datasets.__version__}, pyarrow {pa.__version__}: wrote {OUT} ({total} bytes)")


if __name__ == "__main__":
    main()
