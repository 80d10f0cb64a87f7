"""Runs a command with a time limit and records its peak memory: on a GPU the rise of the
device's used memory over what was in use before the command started (NVML, sampled every
20 ms; one command runs at a time, so the rise is the command's: CUDA context, weights,
activations, allocator caches), on the CPU the process's peak resident set (VmHWM, sampled)."""

import os
import subprocess
import threading
import time


class GpuMemory:
    """Device-wide used memory through NVML (nvidia-ml-py, in the GPU image)."""

    def __init__(self, index=0):
        import pynvml
        pynvml.nvmlInit()
        self.nvml = pynvml
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)

    def used_mib(self):
        return self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used / 2**20


def vm_hwm_mib(pid):
    """VmHWM of a live process (MiB), or None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def run(cmd, timeout_s, gpu=None, env=None, cwd=None):
    """Runs `cmd` (a list) for at most `timeout_s` seconds. Returns rc (None on timeout),
    seconds, stdout, the tail of stderr and the peak memory (`peak_gpu_mib` with `gpu`, a
    GpuMemory, else `peak_rss_mib`)."""
    base = gpu.used_mib() if gpu else 0.0
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=cwd)
    top = [0.0]
    done = threading.Event()

    def sample():
        while not done.is_set():
            v = (gpu.used_mib() - base) if gpu else vm_hwm_mib(proc.pid)
            if v is not None:
                top[0] = max(top[0], v)
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        out, err = proc.communicate(timeout=timeout_s)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        rc = None
    done.set()
    sampler.join()
    result = {"cmd": " ".join(os.path.basename(c) if i == 0 else c for i, c in enumerate(cmd)),
              "rc": rc, "timed_out": rc is None, "seconds": round(time.perf_counter() - t0, 3),
              "stdout": out, "stderr_tail": err[-3000:]}
    result["peak_gpu_mib" if gpu else "peak_rss_mib"] = round(top[0], 1)
    return result
