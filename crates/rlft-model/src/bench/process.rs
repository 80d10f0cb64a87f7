//! Process measurements for benchmarks (Linux `/proc`; elsewhere they read as absent or zero):
//! resident memory, the peak-RSS counter and its reset, CPU seconds, and the CPU that other
//! processes (and the hypervisor) took while a benchmark ran, computed as the reference harness
//! (`bench/reference/measure.py`) computes its `other_procs_cpu_pct`.

use std::time::Instant;

use serde::Serialize;

/// Clock ticks per second of `/proc/*/stat` and `/proc/stat` (`USER_HZ`, 100 on every Linux
/// architecture rlft builds for).
const CLK_TCK: f64 = 100.0;

/// A `/proc/self/status` field in KiB (`VmRSS`, `VmHWM`...).
pub fn status_kib(key: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// Current resident memory of this process in MiB (`VmRSS`).
pub fn rss_mib() -> Option<f64> {
    status_kib("VmRSS").map(|kib| kib as f64 / 1024.0)
}

/// Peak resident memory of this process in MiB (`VmHWM`): since the start, or since the last
/// [`reset_peak_rss`].
pub fn peak_rss_mib() -> Option<f64> {
    status_kib("VmHWM").map(|kib| kib as f64 / 1024.0)
}

/// Resets the peak-RSS counter to the current RSS (writes `5` to `/proc/self/clear_refs`, as
/// the reference's bench.py does after loading its model); false where unsupported.
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// CPU seconds (user + system, all threads) this process has used (`/proc/self/stat` fields 14
/// and 15).
pub fn cpu_seconds() -> f64 {
    self_stat_seconds(11)
}

/// CPU seconds used by this process's finished, waited-for children (and theirs):
/// `/proc/self/stat` fields 16 and 17.
pub fn children_cpu_seconds() -> f64 {
    self_stat_seconds(13)
}

/// The sum of the `/proc/self/stat` fields at `index` and `index + 1`, counted from field 3, in
/// seconds.
fn self_stat_seconds(index: usize) -> f64 {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The command name (field 2) may hold spaces: count from the closing parenthesis, after
    // which field 3 (state) comes first, so field 14 is at index 11.
    let f: Vec<u64> = s
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    (f.get(index).unwrap_or(&0) + f.get(index + 1).unwrap_or(&0)) as f64 / CLK_TCK
}

/// System-wide busy and steal seconds (`/proc/stat`) and the CPU seconds of this process and its
/// waited-for children at one moment; [`CpuSnapshot::interference_since`] turns two of them into
/// percentages. Around a child process (a reference script) run to completion, "own" is the
/// child's work, so "other" is everything else.
#[derive(Debug, Clone, Copy)]
pub struct CpuSnapshot {
    busy_s: f64,
    steal_s: f64,
    own_s: f64,
    cpus: usize,
    wall: Instant,
}

/// How the machine's CPU time was spent over a benchmark, in % of all its CPUs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Interference {
    /// CPU used by other processes: system busy time minus this process's own.
    pub other_procs_cpu_pct: f64,
    /// Time the hypervisor gave to other guests.
    pub steal_pct: f64,
    /// This process's own CPU time (with its children's that finished meanwhile).
    pub own_cpu_pct: f64,
}

impl CpuSnapshot {
    /// Takes a snapshot now.
    pub fn now() -> Self {
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let v: Vec<f64> = stat
            .lines()
            .next()
            .unwrap_or("")
            .split_whitespace()
            .skip(1)
            .map(|x| x.parse().unwrap_or(0.0))
            .collect();
        let at = |i: usize| v.get(i).copied().unwrap_or(0.0);
        // user nice system idle iowait irq softirq steal
        let busy = at(0) + at(1) + at(2) + at(5) + at(6);
        let cpus = stat
            .lines()
            .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
            .count();
        CpuSnapshot {
            busy_s: busy / CLK_TCK,
            steal_s: at(7) / CLK_TCK,
            own_s: cpu_seconds() + children_cpu_seconds(),
            cpus: cpus.max(1),
            wall: Instant::now(),
        }
    }

    /// CPU use since this snapshot, in % of all CPUs over the elapsed wall time (rounded to
    /// 0.1, as bench.py prints it).
    pub fn interference_since(&self) -> Interference {
        let now = CpuSnapshot::now();
        let cap = (now.wall - self.wall).as_secs_f64() * self.cpus as f64 / 100.0;
        let pct = |x: f64| {
            if cap > 0.0 {
                (x / cap * 10.0).round() / 10.0
            } else {
                0.0
            }
        };
        let own = now.own_s - self.own_s;
        Interference {
            other_procs_cpu_pct: pct(now.busy_s - self.busy_s - own),
            steal_pct: pct(now.steal_s - self.steal_s),
            own_cpu_pct: pct(own),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_memory_and_cpu() {
        if !std::path::Path::new("/proc/self/status").exists() {
            return;
        }
        assert!(rss_mib().unwrap() > 0.0);
        assert!(peak_rss_mib().unwrap() >= rss_mib().unwrap() * 0.5);
        let snap = CpuSnapshot::now();
        let mut x = 0u64;
        for i in 0..3_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        let i = snap.interference_since();
        assert!(i.own_cpu_pct >= 0.0 && i.other_procs_cpu_pct.is_finite());
        assert!(cpu_seconds() >= 0.0);
    }

    #[test]
    fn a_waited_for_child_counts_as_own_cpu() {
        if !std::path::Path::new("/proc/self/stat").exists() {
            return;
        }
        let (snap, before) = (CpuSnapshot::now(), children_cpu_seconds());
        let st = std::process::Command::new("sh")
            .args(["-c", "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done"])
            .status()
            .unwrap();
        assert!(st.success());
        assert!(
            children_cpu_seconds() > before,
            "the child's CPU time is counted"
        );
        assert!(snap.interference_since().own_cpu_pct > 0.0);
    }
}
