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
    if switched_off("RLFT_RUNTIME_TUNE") {
        return;
    }
    crate::alloc::tune_malloc();
    let set = |k: &str| std::env::var_os(k).is_some();
    if !set("CANDLE_BARRIER_POOL_SPIN_LIMIT") && !set("CANDLE_NUM_THREADS") {
        // Called at the start of `main`, before other threads exist.
        std::env::set_var("CANDLE_BARRIER_POOL_SPIN_LIMIT", BARRIER_SPIN.to_string());
    }
}

/// Runs `f` on a worker thread of rayon's global pool (the caller blocks until it returns), so
/// that the parallel loops inside it start from a worker: the worker runs its share of each
/// loop itself and never sleeps on a lock waiting for the others. From a thread outside the
/// pool every parallel loop puts the caller to sleep and wakes it again; a decode step runs
/// some 250 short loops (each product, the attention), so generation runs here (measured in
/// `docs/kernels.md`). `RLFT_ON_POOL=0` runs `f` on the calling thread (A/B); so does a call
/// from inside the pool.
pub fn on_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if switched_off("RLFT_ON_POOL") || rayon::current_thread_index().is_some() {
        f()
    } else {
        rayon::scope(|_| f())
    }
}

/// Whether the environment variable `var` is set to `0`: how every `RLFT_*` A/B switch of
/// this crate turns its setting off.
pub(crate) fn switched_off(var: &str) -> bool {
    std::env::var(var).is_ok_and(|v| v == "0")
}

#[cfg(test)]
mod tests {
    /// `on_pool` runs its closure on a pool worker (inline when already on one) and hands back
    /// its result; parallel loops inside it give the same answer.
    #[test]
    fn on_pool_runs_on_a_worker() {
        use rayon::prelude::*;
        let (inside, nested, sum) = super::on_pool(|| {
            let nested = super::on_pool(rayon::current_thread_index);
            let sum: u64 = (0..1000u64).into_par_iter().sum();
            (rayon::current_thread_index(), nested, sum)
        });
        if super::switched_off("RLFT_ON_POOL") {
            assert_eq!(inside, None);
        } else {
            assert!(inside.is_some());
            assert_eq!(nested, inside, "a nested call stays on its worker");
        }
        assert_eq!(sum, 499_500);
    }
}
