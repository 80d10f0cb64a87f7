//! Process-wide CPU runtime settings: call [`tune`] once, first thing in `main`.
//!
//! - The allocator ([`crate::alloc::tune_malloc`]).
//! - candle's elementwise thread pool. candle 0.11 runs large elementwise ops on its own pool of
//!   `threads - 1` workers, separate from rayon's (which gemm and the fused kernels use). Its
//!   workers spin 25,000 rounds before parking after every op, and the caller spins until they
//!   finish: with as many cores as rayon threads, the spinning threads take the cores the next
//!   gemm needs (on 2 cores, 7-14% of a training step's CPU time went to those spins). A short
//!   spin ([`BARRIER_SPIN`]) keeps the pool's parallelism and parks idle workers at once.
//!   An explicit `CANDLE_BARRIER_POOL_SPIN_LIMIT` or `CANDLE_NUM_THREADS` is left as it is.

/// Spin rounds of candle's pool workers before they park.
pub const BARRIER_SPIN: u32 = 200;

/// Applies every setting; `RLFT_RUNTIME_TUNE=0` leaves the process as it is (for A/B checks).
/// Must run before any tensor op (candle reads its settings once, at its first parallel op).
pub fn tune() {
    if std::env::var("RLFT_RUNTIME_TUNE").is_ok_and(|v| v == "0") {
        return;
    }
    crate::alloc::tune_malloc();
    let set = |k: &str| std::env::var_os(k).is_some();
    if !set("CANDLE_BARRIER_POOL_SPIN_LIMIT") && !set("CANDLE_NUM_THREADS") {
        // Called at the start of `main`, before other threads exist.
        std::env::set_var("CANDLE_BARRIER_POOL_SPIN_LIMIT", BARRIER_SPIN.to_string());
    }
}
