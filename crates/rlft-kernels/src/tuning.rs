//! [`Tuning`]: the process's kernel and runtime switches, read once from the environment.
//!
//! Each switch is an environment variable, so a measurement can compare both settings with
//! the same binary (`RLFT_SPIN=0 rlft bench generate`). The defaults are what measured best on
//! the development machines (`docs/kernels.md` has the numbers); a switch stays only while some
//! machine or use may want the other setting. `rlft bench` records the values in force beside
//! its results, and `rlft inspect --runtime` prints them with the SIMD level in use.
//!
//! Read once: the first call to [`tuning`] reads the environment and every later call returns
//! the same values, so one process never mixes two settings.

use std::sync::OnceLock;

/// The switches, as read from the environment ([`tuning`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Tuning {
    /// `RLFT_SPIN` (default on; `RLFT_SPIN=0` turns it off). While generation or a training
    /// step runs on the thread pool ([`crate::pool::on_pool`]), the pool's other workers spin
    /// between parallel loops instead of parking, so the many short loops of a decode step
    /// cost no wake-up and a virtual machine does not hand an idle core away between them.
    /// It costs CPU time, not wall time: turn it off on a machine shared with other work
    /// that needs the cores more than this process needs the wall-clock gain.
    pub spin: bool,
    /// `RLFT_MALLOC_TUNE` (default on; `=0` leaves glibc's allocator alone). Raises glibc's
    /// mmap threshold to its maximum, stops heap trimming and keeps every thread on one arena
    /// ([`crate::alloc::tune_malloc`]), so the buffers of one training step are reused by the
    /// next instead of being faulted in again. Freed memory then stays with the process until
    /// it exits: turn it off to compare allocators or when the process must give memory back
    /// between phases. `rlft plan`'s memory model assumes it on.
    pub malloc_tune: bool,
    /// `RLFT_AVX512` (default on; `=0` keeps the AVX2 kernels). On a CPU with AVX-512F the
    /// decoding kernels (f32 streaming and GGUF block products) run their 16-lane twins. Turn
    /// it off to run the AVX2 kernels on an AVX-512 host: to test them there, or on a CPU that
    /// slows its clock for 512-bit instructions.
    pub avx512: bool,
    /// `RLFT_OP_TIMES` (default off; any value but empty or `0` turns it on). Times every
    /// fused op's forward and backward and the decoder's phases ([`crate::op_time`]);
    /// `rlft bench` prints the table after its timed reps. A diagnostic: when off, a span
    /// costs one relaxed atomic load.
    pub op_times: bool,
}

impl Default for Tuning {
    /// The defaults, whatever the environment says.
    fn default() -> Self {
        Tuning {
            spin: true,
            malloc_tune: true,
            avx512: true,
            op_times: false,
        }
    }
}

impl Tuning {
    /// The settings `var` (an environment lookup) gives: each switch at its default unless
    /// its variable says otherwise.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Self {
        let off = |name: &str| var(name).is_some_and(|v| v == "0");
        let d = Tuning::default();
        Tuning {
            spin: d.spin && !off("RLFT_SPIN"),
            malloc_tune: d.malloc_tune && !off("RLFT_MALLOC_TUNE"),
            avx512: d.avx512 && !off("RLFT_AVX512"),
            op_times: var("RLFT_OP_TIMES").is_some_and(|v| !v.is_empty() && v != "0"),
        }
    }

    /// The settings of this process's environment (read now; [`tuning`] reads it once).
    pub fn from_env() -> Self {
        Tuning::from_vars(|k| std::env::var(k).ok())
    }

    /// `(environment variable, value)` for each switch, in field order.
    pub fn vars(&self) -> [(&'static str, bool); 4] {
        [
            ("RLFT_SPIN", self.spin),
            ("RLFT_MALLOC_TUNE", self.malloc_tune),
            ("RLFT_AVX512", self.avx512),
            ("RLFT_OP_TIMES", self.op_times),
        ]
    }
}

impl std::fmt::Display for Tuning {
    /// `RLFT_SPIN=1 RLFT_MALLOC_TUNE=1 RLFT_AVX512=1 RLFT_OP_TIMES=0`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (name, on)) in self.vars().iter().enumerate() {
            let sep = if i == 0 { "" } else { " " };
            write!(f, "{sep}{name}={}", u8::from(*on))?;
        }
        Ok(())
    }
}

/// The process's [`Tuning`], read from the environment at the first call.
pub fn tuning() -> &'static Tuning {
    static TUNING: OnceLock<Tuning> = OnceLock::new();
    TUNING.get_or_init(Tuning::from_env)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn switches_read_their_variables() {
        let none = Tuning::from_vars(|_| None);
        assert_eq!(none, Tuning::default());
        let all_off = Tuning::from_vars(|_| Some("0".into()));
        assert_eq!(
            all_off,
            Tuning {
                spin: false,
                malloc_tune: false,
                avx512: false,
                op_times: false,
            }
        );
        let times = Tuning::from_vars(|k| (k == "RLFT_OP_TIMES").then(|| "1".into()));
        assert!(times.op_times && times.spin);
        let empty = Tuning::from_vars(|k| (k == "RLFT_OP_TIMES").then(String::new));
        assert!(!empty.op_times);
        assert_eq!(
            Tuning::default().to_string(),
            "RLFT_SPIN=1 RLFT_MALLOC_TUNE=1 RLFT_AVX512=1 RLFT_OP_TIMES=0"
        );
    }
}
