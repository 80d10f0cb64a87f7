"""Checks a tiny_python_expr dataset written by rlft against the Python reference generator.

    rlft data tiny-python-expr --output OUT [--seed 7 --train-size 50 ...] [--jsonl] [--parquet]
    ~/.cache/rlft/reference/venv/bin/python scripts/reference/check_tiny_python_expr_dataset.py OUT \
        [--seed 7 --train-size 50 ...]   # the same generator options

Loads OUT with `datasets.load_from_disk` (it must be a DatasetDict with exactly `train` and
`test`), regenerates the rows with `tiny_python_expr_reference.build_dataset` for the same
options, and compares every row as `json.dumps` text (so key order, types and values count),
plus the column names. If OUT/{split}.jsonl exists it must equal the reference's JSONL bytes;
if OUT/{split}.parquet exists pyarrow must read the same rows. Prints one line per check;
exits 1 on the first mismatch. Not run in CI (needs `datasets`).
"""

import argparse
import json
import sys
from pathlib import Path

import datasets

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tiny_python_expr_reference as ref  # noqa: E402

COLUMNS = ["data_source", "prompt", "ability", "reward_model", "extra_info"]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--train-size", type=int, default=128)
    p.add_argument("--test-size", type=int, default=32)
    p.add_argument("--operators", default="+,-,*")
    p.add_argument("--max-depth", type=int, default=3)
    p.add_argument("--leaf-max", type=int, default=20)
    p.add_argument("--value-min", type=int, default=0)
    p.add_argument("--value-max", type=int, default=200)
    a = p.parse_args()
    out = Path(a.dir)
    want = ref.build_dataset(a.seed, a.train_size, a.test_size, tuple(a.operators.split(",")),
                             a.max_depth, a.leaf_max, a.value_min, a.value_max)
    dd = datasets.load_from_disk(str(out))
    if not isinstance(dd, datasets.DatasetDict) or sorted(dd.keys()) != ["test", "train"]:
        print(f"FAIL: {out} loaded as {type(dd).__name__} {list(getattr(dd, 'keys', list)())}")
        return 1
    for split in ("train", "test"):
        ds, rows = dd[split], want[split]
        if list(ds.column_names) != COLUMNS:
            print(f"FAIL {split}: columns {ds.column_names}, expected {COLUMNS}")
            return 1
        if len(ds) != len(rows):
            print(f"FAIL {split}: {len(ds)} rows, the reference has {len(rows)}")
            return 1
        for i, (got, exp) in enumerate(zip(ds, rows)):
            if json.dumps(got) != json.dumps(exp):
                print(f"FAIL {split} row {i}:\n  load_from_disk: {json.dumps(got)}\n  reference:      {json.dumps(exp)}")
                return 1
        print(f"ok {split}: {len(ds)} rows from load_from_disk equal the reference "
              f"(features: {ds.features})")
        jsonl = out / f"{split}.jsonl"
        if jsonl.exists():
            exp_text = "".join(json.dumps(r) + "\n" for r in rows)
            if jsonl.read_bytes() != exp_text.encode("utf-8"):
                print(f"FAIL {split}: {jsonl} differs from the reference's JSONL bytes")
                return 1
            print(f"ok {split}: {jsonl.name} is byte-identical to the reference")
        parquet = out / f"{split}.parquet"
        if parquet.exists():
            import pyarrow.parquet as pq

            table = pq.read_table(parquet).to_pylist()
            if [json.dumps(r) for r in table] != [json.dumps(r) for r in rows]:
                print(f"FAIL {split}: {parquet} rows differ from the reference")
                return 1
            print(f"ok {split}: {parquet.name} has the same rows")
    print(f"PASS: {out} matches tiny_python_expr_reference.py (seed {a.seed}, "
          f"{a.train_size}/{a.test_size}, operators {a.operators})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
