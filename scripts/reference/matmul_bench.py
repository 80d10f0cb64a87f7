"""torch.matmul on the shapes of `cargo run --release -p rlft-model --example matmul_bench`.

Prints one line per `[m, k] @ [k, n]` product (x @ W^T with W stored [n, k], as in a linear
layer): median of 9 timed calls after one warm-up, and GFLOP/s, on the threads torch uses
(`torch.get_num_threads()`, all cores by default). Run it right after the Rust example, in the
same minutes, to compare the gemm crate with PyTorch's BLAS (MKL/oneDNN) on this CPU:

    flock /tmp/rlft-bench.lock ~/.cache/rlft/reference/venv/bin/python scripts/reference/matmul_bench.py
"""

import time

import torch

SHAPES = [
    (1016, 576, 1536),
    (1016, 1536, 576),
    (480, 576, 1536),
    (480, 576, 576),
    (480, 1536, 576),
    (8, 576, 192),
    (8, 576, 576),
    (8, 576, 1536),
    (8, 1536, 576),
    (8, 576, 49152),
]


def median_time(f, reps=9):
    f()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    ts.sort()
    return ts[reps // 2]


def main():
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{torch.backends.cpu.get_cpu_capability()}")
    with torch.no_grad():
        for m, k, n in SHAPES:
            x = torch.randn(m, k)
            w = torch.randn(n, k)
            t = median_time(lambda: torch.matmul(x, w.t()))
            print(f"{m:>4}x{k:>4}x{n:>6}  torch {t * 1e3:>7.2f} ms "
                  f"{2 * m * k * n / t / 1e9:>6.1f} GFLOP/s")


if __name__ == "__main__":
    main()
