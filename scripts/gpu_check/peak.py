"""Runs a command with a time limit and records its peak memory: on a GPU the rise of the
device's used memory over what was in use before the command started (NVML, sampled every
20 ms; one command runs at a time, so the rise is the command's: CUDA context, weights,
activations, allocator caches), on the CPU the process's peak resident set (VmHWM, sampled
every 20 ms; a process that ends within a sample is under-read, so check.py prefers the peak a
child reports itself). Not wait4's ru_maxrss: Linux carries the forking Python's RSS into it."""

import os
import subprocess
import tempfile
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
    """VmHWM of a live process (MiB; per address space, so it starts afresh at exec), or None."""
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
    seconds, stdout, the tail of stderr and the peak memory, sampled every 20 ms:
    `peak_gpu_mib` with `gpu` (a GpuMemory), else `peak_rss_mib`."""
    base = gpu.used_mib() if gpu else 0.0
    top = 0.0
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=env, cwd=cwd)
        rc = None
        while True:
            v = (gpu.used_mib() - base) if gpu else vm_hwm_mib(proc.pid)
            if v is not None:
                top = max(top, v)
            pid, status, _ = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                rc = os.waitstatus_to_exitcode(status)
                break
            if time.perf_counter() - t0 > timeout_s:
                proc.kill()
                os.wait4(proc.pid, 0)
                break
            time.sleep(0.02)
        proc.returncode = -9 if rc is None else rc  # reaped here, not by Popen
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    result = {"cmd": " ".join(os.path.basename(c) if i == 0 else c for i, c in enumerate(cmd)),
              "rc": rc, "timed_out": rc is None, "seconds": round(time.perf_counter() - t0, 3),
              "stdout": stdout, "stderr_tail": stderr[-3000:]}
    result["peak_gpu_mib" if gpu else "peak_rss_mib"] = round(top, 1)
    return result
