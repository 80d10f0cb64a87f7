"""Runs a command with a time limit and records its peak memory: on a GPU the rise of the
device's used memory over what was in use before the command started (NVML, sampled every
20 ms; one command runs at a time, so the rise is the command's: CUDA context, weights,
activations, allocator caches), on the CPU the process's peak resident set (wait4's
ru_maxrss)."""

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


def run(cmd, timeout_s, gpu=None, env=None, cwd=None):
    """Runs `cmd` (a list) for at most `timeout_s` seconds. Returns rc (None on timeout),
    seconds, stdout, the tail of stderr and the peak memory: `peak_gpu_mib` with `gpu` (a
    GpuMemory; sampled every 20 ms), else `peak_rss_mib` (the child's ru_maxrss from wait4,
    exact however short the child ran)."""
    base = gpu.used_mib() if gpu else 0.0
    top = 0.0
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=env, cwd=cwd)
        rc, rss_kib = None, 0
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                rc, rss_kib = os.waitstatus_to_exitcode(status), usage.ru_maxrss
                break
            if gpu:
                top = max(top, gpu.used_mib() - base)
            if time.perf_counter() - t0 > timeout_s:
                proc.kill()
                _, _, usage = os.wait4(proc.pid, 0)
                rss_kib = usage.ru_maxrss
                break
            time.sleep(0.02)
        proc.returncode = -9 if rc is None else rc  # reaped here, not by Popen
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    result = {"cmd": " ".join(os.path.basename(c) if i == 0 else c for i, c in enumerate(cmd)),
              "rc": rc, "timed_out": rc is None, "seconds": round(time.perf_counter() - t0, 3),
              "stdout": stdout, "stderr_tail": stderr[-3000:]}
    if gpu:
        result["peak_gpu_mib"] = round(top, 1)
    else:
        result["peak_rss_mib"] = round(rss_kib / 1024, 1)
    return result
