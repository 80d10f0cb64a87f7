"""Checks that Python `datasets` loads what rlft-data's writer saves, row for row.

    cargo run --release -p rlft-data --example convert_dataset -- INPUT OUT_DIR [TEST_FRACTION]
    ~/.cache/rlft/reference/venv/bin/python scripts/reference/check_load_from_disk.py OUT_DIR

Loads OUT_DIR/dict with `datasets.load_from_disk` and compares every split with
OUT_DIR/{split}.jsonl (written by rlft-data from the same rows): same columns in the same order,
and rows equal as JSON text (so 1 vs 1.0 and key order count). Also checks that the features
`datasets` reads back from dataset_info.json agree with the Arrow schema of the shards, and
that pyarrow reads OUT_DIR/{split}.parquet (rlft-data's Parquet writer) as the same rows. Prints a
summary; exits 1 on the first mismatch. Not run in CI.
"""

import json
import sys
from pathlib import Path

import datasets
import pyarrow.parquet as pq


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    out = Path(sys.argv[1])
    dd = datasets.load_from_disk(str(out / "dict"))
    if not isinstance(dd, datasets.DatasetDict):
        print(f"FAIL: {out / 'dict'} loaded as {type(dd).__name__}, expected DatasetDict")
        return 1
    for split, ds in dd.items():
        expected = [json.loads(line) for line in open(out / f"{split}.jsonl", encoding="utf-8") if line.strip()]
        if len(ds) != len(expected):
            print(f"FAIL {split}: {len(ds)} rows from load_from_disk, {len(expected)} in the JSONL")
            return 1
        if expected and list(ds.column_names) != list(expected[0].keys()):
            print(f"FAIL {split}: columns {ds.column_names} vs {list(expected[0].keys())}")
            return 1
        inferred = datasets.Features.from_arrow_schema(ds.data.schema)
        if inferred != ds.features:
            print(f"FAIL {split}: dataset_info features {ds.features} != shard schema {inferred}")
            return 1
        for i, (got, want) in enumerate(zip(ds, expected)):
            a = json.dumps(got, ensure_ascii=False)
            b = json.dumps(want, ensure_ascii=False)
            if a != b:
                print(f"FAIL {split} row {i}:\n  load_from_disk: {a}\n  jsonl:          {b}")
                return 1
        parquet = out / f"{split}.parquet"
        if parquet.exists():
            table = pq.read_table(parquet)
            for i, (got, want) in enumerate(zip(table.to_pylist(), expected)):
                if json.dumps(got, ensure_ascii=False) != json.dumps(want, ensure_ascii=False):
                    print(f"FAIL {split} row {i} of {parquet}:\n  pyarrow: {got}\n  jsonl:   {want}")
                    return 1
            if table.num_rows != len(expected):
                print(f"FAIL {split}: {table.num_rows} rows in {parquet}, {len(expected)} in the JSONL")
                return 1
        print(f"ok {split}: {len(ds)} rows, fingerprint {ds._fingerprint}, features {ds.features}")
    print(f"datasets {datasets.__version__}: {out / 'dict'} matches the JSONL row for row")
    return 0


if __name__ == "__main__":
    sys.exit(main())
