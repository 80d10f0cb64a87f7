#!/usr/bin/env python3
"""Compares two directories written by scripts/same-metrics.sh, run by run and step by step.

Every metric of every logged step must be equal (timings, `time/*` and throughput keys,
excepted: they are measured, not computed). A key present on one side only is a difference too,
unless it is listed in --renamed OLD=NEW. Exit status 1 on any difference.

    python3 scripts/compare-metrics.py BEFORE AFTER [--renamed old=new ...]
"""
import argparse
import json
import math
import pathlib
import sys

MEASURED = ("time/", "wall_time", "seconds", "per_second", "tokens_per_s", "samples_per_s", "peak_rss", "elapsed")


def measured(key):
    return any(part in key for part in MEASURED)


def rows(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def same(a, b):
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def compare_run(name, before, after, renamed):
    problems = []
    if len(before) != len(after):
        problems.append(f"{name}: {len(before)} logged rows before, {len(after)} after")
    for i, (b, a) in enumerate(zip(before, after)):
        b = {renamed.get(k, k): v for k, v in b.items() if not measured(k)}
        a = {k: v for k, v in a.items() if not measured(k)}
        for key in sorted(set(b) | set(a)):
            if key not in a or key not in b:
                side = "after" if key not in a else "before"
                problems.append(f"{name} row {i}: {key} missing {side}")
            elif not same(b[key], a[key]):
                problems.append(f"{name} row {i}: {key} {b[key]!r} -> {a[key]!r}")
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before", type=pathlib.Path)
    ap.add_argument("after", type=pathlib.Path)
    ap.add_argument("--renamed", action="append", default=[], help="OLD=NEW metric key")
    args = ap.parse_args()
    renamed = dict(r.split("=", 1) for r in args.renamed)
    runs = sorted(p.parent.name for p in args.before.glob("*/metrics.jsonl"))
    if not runs:
        sys.exit(f"no */metrics.jsonl under {args.before}: run scripts/same-metrics.sh first")
    problems = []
    for name in runs:
        after = args.after / name / "metrics.jsonl"
        if not after.exists():
            problems.append(f"{name}: no {after}")
            continue
        before_rows, after_rows = rows(args.before / name / "metrics.jsonl"), rows(after)
        found = compare_run(name, before_rows, after_rows, renamed)
        status = "same" if not found else f"{len(found)} differences"
        print(f"{name:20} {len(before_rows):3} rows  {status}")
        problems += found
    for p in problems[:50]:
        print("  " + p)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
