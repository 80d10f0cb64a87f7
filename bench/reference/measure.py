"""What bench.py and grpo.py measure besides time, the way rlft measures it
(`crates/rlft-model/src/bench/process.rs`), so the two sides' figures mean the same thing:

- peak RSS: `VmHWM` of /proc/self/status, reset to the current RSS after loading by writing `5`
  to /proc/self/clear_refs, so it covers the benchmark itself;
- interference: the CPU that other processes (system busy time minus this process's own) and the
  hypervisor (steal) took meanwhile, in % of all CPUs, from /proc/stat;
- time statistics in ms: median, min, max and every repetition.
"""

import os
import resource
import statistics
import time


def _status_kib(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return None


def _mib(kib):
    return None if kib is None else round(kib / 1024, 1)


def rss_mib():
    """Resident memory now (VmRSS), MiB."""
    return _mib(_status_kib("VmRSS"))


def peak_rss_mib():
    """Peak resident memory (VmHWM) since the start or the last reset_peak_rss(), MiB."""
    return _mib(_status_kib("VmHWM"))


def process_peak_rss_mib():
    """Peak resident memory of the whole process, loading included (ru_maxrss), MiB."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def reset_peak_rss():
    """Resets VmHWM to the current RSS; False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def threads():
    """CPUs this process may run on (what rlft's `available_parallelism` reports)."""
    return len(os.sched_getaffinity(0))


class CpuMeter:
    """CPU time of the machine and of this process from construction to interference()."""

    def __init__(self):
        self.start = self._snapshot()

    @staticmethod
    def _snapshot():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        tck = os.sysconf("SC_CLK_TCK")
        user, nice, system, _idle, _iowait, irq, softirq, steal = v[:8]
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return {
            "busy": (user + nice + system + irq + softirq) / tck,
            "steal": steal / tck,
            "own": ru.ru_utime + ru.ru_stime,
            "wall": time.perf_counter(),
        }

    def interference(self):
        a, b = self.start, self._snapshot()
        cap = (b["wall"] - a["wall"]) * os.cpu_count() / 100
        own = b["own"] - a["own"]

        def pct(x):
            return round(x / cap, 1) if cap > 0 else 0.0

        return {
            "other_procs_cpu_pct": pct(b["busy"] - a["busy"] - own),
            "steal_pct": pct(b["steal"] - a["steal"]),
            "own_cpu_pct": pct(own),
        }


def time_reps(fn, warmup, reps):
    """Runs fn warmup times untimed, then reps times timed; the timed seconds."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def stats_ms(seconds):
    """Median, min, max and every repetition of `seconds`, in ms."""
    ms = [round(s * 1e3, 3) for s in seconds]
    return {"median_ms": round(statistics.median(ms), 3), "min_ms": min(ms), "max_ms": max(ms),
            "reps_ms": ms}
