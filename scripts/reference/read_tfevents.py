"""Reads TensorBoard event files with TensorBoard's own EventAccumulator (no TensorFlow needed)
and prints the scalars; with --compare-jsonl, checks them against rlft's metrics.jsonl.

A check of rlft's TFRecord framing, protobuf encoding and resume marker (SessionLog.START) by the
reader TensorBoard itself uses. Not run in CI. With the baseline venv:

    ~/.cache/rlft/reference/venv/bin/python -m pip install tensorboard
    cargo run --release -p rlft-train --example tfevents_demo -- /tmp/tb_demo
    ~/.cache/rlft/reference/venv/bin/python scripts/reference/read_tfevents.py /tmp/tb_demo/tensorboard \
        --compare-jsonl /tmp/tb_demo/metrics.jsonl
"""

import argparse
import json
import math
import struct
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def number(v):
    return {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}.get(v, v)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", help="an event file or a directory of them")
    ap.add_argument("--compare-jsonl", help="rlft metrics.jsonl that the event files mirror")
    args = ap.parse_args()

    acc = EventAccumulator(args.path, size_guidance={"scalars": 0})  # 0 = keep every point
    acc.Reload()
    scalars = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    print(json.dumps(scalars, indent=1))
    if not args.compare_jsonl:
        return

    expected = {}
    with open(args.compare_jsonl) as f:
        for line in f:
            rec = json.loads(line)
            for k, v in rec.items():
                if k not in ("step", "epoch", "wall_time", "elapsed_s"):
                    expected.setdefault(k, []).append((rec["step"], f32(number(v))))
    problems = []
    for tag in sorted(set(expected) | set(scalars)):
        want, got = expected.get(tag, []), scalars.get(tag, [])
        same = len(want) == len(got) and all(
            s1 == s2 and (v1 == v2 or (math.isnan(v1) and math.isnan(v2))) for (s1, v1), (s2, v2) in zip(want, got)
        )
        if not same:
            problems.append(f"{tag}: metrics.jsonl has {want}, TensorBoard read {got}")
    n = sum(len(v) for v in expected.values())
    if problems:
        print("MISMATCH\n" + "\n".join(problems))
        sys.exit(1)
    print(f"OK: TensorBoard's EventAccumulator read the same {n} scalars ({len(expected)} tags) as metrics.jsonl")


if __name__ == "__main__":
    main()
