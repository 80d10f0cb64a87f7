//! Process-wide CPU runtime settings: call [`tune`] once, first thing in `main`; [`Runtime`]
//! describes what is in force (`rlft inspect --runtime`, `rlft bench`).
//!
//! - The allocator ([`crate::alloc::tune_malloc`], unless
//!   [`Tuning::malloc_tune`](crate::tuning::Tuning::malloc_tune) is off).
//! - candle's elementwise thread pool. candle 0.11 runs large elementwise ops on its own pool of
//!   `threads - 1` workers, separate from rayon's (which gemm and the fused kernels use). Its
//!   workers spin 25,000 rounds before parking after every op, and the caller spins until they
//!   finish: with as many cores as rayon threads, the spinning threads take the cores the next
//!   gemm needs. A short spin ([`BARRIER_SPIN`]) keeps the pool's parallelism and parks idle
//!   workers at once. An explicit `CANDLE_BARRIER_POOL_SPIN_LIMIT` or `CANDLE_NUM_THREADS` is
//!   left as it is.

use crate::simd::Level;
use crate::tuning::Tuning;

/// Spin rounds of candle's pool workers before they park.
pub const BARRIER_SPIN: u32 = 200;

/// Applies every setting. Must run before any tensor op (candle reads its settings once, at
/// its first parallel op) and before other threads exist (it sets an environment variable).
pub fn tune() {
    crate::alloc::tune_malloc();
    let set = |k: &str| std::env::var_os(k).is_some();
    if !set("CANDLE_BARRIER_POOL_SPIN_LIMIT") && !set("CANDLE_NUM_THREADS") {
        // Called at the start of `main`, before other threads exist.
        std::env::set_var("CANDLE_BARRIER_POOL_SPIN_LIMIT", BARRIER_SPIN.to_string());
    }
}

/// What the kernels run with in this process: the switches, the SIMD level, the threads.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Runtime {
    /// The switches ([`crate::tuning::tuning`]).
    pub tuning: Tuning,
    /// The widest instruction set the kernels use ([`crate::simd::level`]).
    pub simd: Level,
    /// Whether the CPU has AVX-512F, AVX2 and FMA, whether or not the kernels use it.
    pub cpu_avx512: bool,
    /// Threads of rayon's pool (`RAYON_NUM_THREADS`, else one per core).
    pub threads: usize,
    /// `CANDLE_BARRIER_POOL_SPIN_LIMIT` as set now (by [`tune`] or the environment).
    pub candle_barrier_spin: Option<String>,
}

impl Runtime {
    /// The settings in force now.
    pub fn current() -> Self {
        Runtime {
            tuning: *crate::tuning::tuning(),
            simd: crate::simd::level(),
            cpu_avx512: crate::simd::cpu_has_avx512(),
            threads: rayon::current_num_threads(),
            candle_barrier_spin: std::env::var("CANDLE_BARRIER_POOL_SPIN_LIMIT").ok(),
        }
    }
}

impl std::fmt::Display for Runtime {
    /// One `name value` line each, the switches by their variable names.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "{:<32} {}", "simd", self.simd)?;
        writeln!(f, "{:<32} {}", "cpu_avx512", self.cpu_avx512)?;
        writeln!(f, "{:<32} {}", "threads", self.threads)?;
        let spin = self.candle_barrier_spin.as_deref().unwrap_or("(unset)");
        writeln!(f, "{:<32} {spin}", "CANDLE_BARRIER_POOL_SPIN_LIMIT")?;
        for (name, on) in self.tuning.vars() {
            writeln!(f, "{name:<32} {}", u8::from(on))?;
        }
        Ok(())
    }
}
