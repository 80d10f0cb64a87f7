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
//!
//! Generation, the no-grad log-prob passes and each training step run through [`on_pool`]: on
//! a rayon worker, with the pool's other workers spinning between loops instead of parking.

use std::sync::atomic::{AtomicBool, Ordering};

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
/// some 250 short parallel loops (each product, the attention), so generation runs here
/// (measured in `docs/kernels.md`). `RLFT_ON_POOL=0` runs `f` on the calling thread (A/B); so
/// does a call from inside the pool.
///
/// While `f` runs, the pool's other workers do not park between loops: each runs
/// [`keep_awake`] (the jobs of the pool as they come, spinning in between) until `f` returns,
/// as OpenMP's threads spin for a "block time" after a parallel region. A parked worker has
/// to be woken (a futex call, an interrupt to a halted CPU), and on a virtual machine the
/// host gives an idle CPU away: `rlft bench generate` ran 11% faster with the spinning, the
/// host's steal on the run 0-3% against 1-11% (docs/kernels.md). One call spins at a time
/// (two whose spinners each waited on the other's `f` would never finish); a concurrent call
/// runs without. `RLFT_SPIN=0` turns the spinning off.
pub fn on_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if switched_off("RLFT_ON_POOL") || rayon::current_thread_index().is_some() {
        return f();
    }
    let session = if switched_off("RLFT_SPIN") || rayon::current_num_threads() < 2 {
        None
    } else {
        SpinSession::take()
    };
    let Some(session) = session else {
        return rayon::scope(|_| f());
    };
    let stop = &session.stop;
    rayon::scope(|s| {
        let owner = rayon::current_thread_index();
        s.spawn_broadcast(move |_, ctx| {
            if Some(ctx.index()) != owner {
                keep_awake(stop);
            }
        });
        // Set on return and on a panic alike, or the scope would wait on its spinners forever.
        let _stop = StopOnDrop(stop);
        f()
    })
}

/// [`on_pool`] for work on `device`: a GPU keeps the calling thread (the one its context was
/// made on).
pub fn on_pool_for<R: Send>(device: &candle_core::Device, f: impl FnOnce() -> R + Send) -> R {
    if device.is_cpu() {
        on_pool(f)
    } else {
        f()
    }
}

/// Whether some [`on_pool`] call has the pool's workers spinning.
static SPINNING: AtomicBool = AtomicBool::new(false);

/// The one spinning [`on_pool`] call; gives the turn back when dropped.
struct SpinSession {
    /// Tells the spinners to return.
    stop: AtomicBool,
}

impl SpinSession {
    /// The turn to spin, unless another call has it.
    fn take() -> Option<SpinSession> {
        SPINNING
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .ok()
            .map(|_| SpinSession {
                stop: AtomicBool::new(false),
            })
    }
}

impl Drop for SpinSession {
    fn drop(&mut self) {
        SPINNING.store(false, Ordering::Release);
    }
}

/// Sets the flag when dropped.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// Runs the pool's jobs on this worker until `stop`, never parking: between jobs it spins,
/// and every [`YIELD_EVERY`] empty rounds offers the core to any other runnable thread
/// (`sched_yield`; candle's own elementwise workers share the cores).
fn keep_awake(stop: &AtomicBool) {
    let mut idle = 0u32;
    while !stop.load(Ordering::Acquire) {
        if let Some(rayon::Yield::Executed) = rayon::yield_now() {
            idle = 0;
            continue;
        }
        idle = idle.wrapping_add(1);
        if idle.is_multiple_of(YIELD_EVERY) {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

/// Empty rounds of [`keep_awake`] between two `sched_yield`s.
const YIELD_EVERY: u32 = 64;

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

    /// Calls from several threads at once (one of them spins, the others not) all finish with
    /// the right answers: two spinning calls could each wait on the other's spinner.
    #[test]
    fn concurrent_calls_finish() {
        use rayon::prelude::*;
        let sums: Vec<u64> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4u64)
                .map(|k| {
                    s.spawn(move || {
                        (0..20)
                            .map(|_| {
                                super::on_pool(|| {
                                    (0..20_000u64).into_par_iter().map(|i| i * k).sum::<u64>()
                                })
                            })
                            .sum::<u64>()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (k, s) in sums.iter().enumerate() {
            assert_eq!(*s, 20 * k as u64 * 199_990_000);
        }
    }

    /// A panic inside `f` reaches the caller (the spinners are stopped, nothing hangs) and
    /// gives the turn to spin back.
    #[test]
    fn panic_stops_the_spinners() {
        let r = std::panic::catch_unwind(|| super::on_pool(|| panic!("inside")));
        assert!(r.is_err());
        assert_eq!(super::on_pool(|| 7), 7);
    }
}
