"""Values printed by CPython's `random.Random` for rlft-data's `pyrandom` tests.

    python3 scripts/reference/pyrandom_golden.py   # writes crates/rlft-data/tests/data/pyrandom_golden.json

Plain Python 3 (standard library only). For each seed, every sequence starts from a fresh
`random.Random(seed)`:

- `getrandbits32`: 8 x `getrandbits(32)` (the raw MT19937 outputs);
- `random`: 8 x `random()`, as `repr` strings (they round-trip exactly through a correctly
  rounding parser such as Rust's `str::parse::<f64>`; serde_json's default number parser
  can be one ulp off);
- `getrandbits`: `getrandbits(k)` for k in GETRANDBITS_KS, in that order, from one generator;
- `randint_0_20`: 20 x `randint(0, 20)`;
- `randrange`: `randrange(start, stop[, step])` for each case in RANDRANGE_CASES, one generator;
- `randbelow`: `_randbelow(n)` for n in RANDBELOW_NS, one generator;
- `choice3`: 20 x the index `choice(range(3))` picks;
- `mixed`: the seed generator's pattern, `random()`, `randint(0, 20)`, `choice` of 3, interleaved
  (12 rounds, each [random, randint, choice]).

Negative seeds use their absolute value, and seeds above 2**32 use several 32-bit key words,
exactly as CPython's `init_by_array` seeding does; both are covered.
"""

import json
import random
import sys
from pathlib import Path

SEEDS = [0, 1, 7, 42, 12345, 2**32, 2**64 - 1, -42, 2**70 + 123]
GETRANDBITS_KS = [0, 1, 5, 31, 32, 33, 48, 63, 64, 7]
RANDRANGE_CASES = [[0, 21], [1, 4], [-5, 5], [3, 100, 7], [100, 3, -7], [0, 2**40 + 3], [10, 11]]
RANDBELOW_NS = [1, 2, 3, 21, 64, 65, 1000, 2**31, 2**32 + 1, 2**53 + 5, 2**64 - 1]


def golden(seed):
    out = {"seed": str(seed)}  # a string: some seeds exceed what JSON readers keep exact
    r = random.Random(seed)
    out["getrandbits32"] = [r.getrandbits(32) for _ in range(8)]
    r = random.Random(seed)
    out["random"] = [repr(r.random()) for _ in range(8)]
    r = random.Random(seed)
    out["getrandbits"] = [[k, str(r.getrandbits(k))] for k in GETRANDBITS_KS]
    r = random.Random(seed)
    out["randint_0_20"] = [r.randint(0, 20) for _ in range(20)]
    r = random.Random(seed)
    out["randrange"] = [[case, r.randrange(*case)] for case in RANDRANGE_CASES]
    r = random.Random(seed)
    out["randbelow"] = [[str(n), str(r._randbelow(n))] for n in RANDBELOW_NS]
    r = random.Random(seed)
    out["choice3"] = [r.choice(range(3)) for _ in range(20)]
    r = random.Random(seed)
    out["mixed"] = [[repr(r.random()), r.randint(0, 20), r.choice(range(3))] for _ in range(12)]
    return out


def main():
    dest = Path(__file__).resolve().parents[2] / "crates/rlft-data/tests/data/pyrandom_golden.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "python": sys.version.split()[0],
        "cases": [golden(s) for s in SEEDS],
    }
    cases = ",\n".join("  " + json.dumps(c) for c in doc["cases"])
    dest.write_text(f'{{"python": {json.dumps(doc["python"])}, "cases": [\n{cases}\n]}}\n')
    print(f"wrote {dest} ({dest.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
