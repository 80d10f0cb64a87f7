//! The thread pool's part in a step: [`on_pool`] runs generation, the no-grad log-prob passes
//! and each training step on a rayon worker, with the pool's other workers spinning between
//! parallel loops instead of parking (unless [`Tuning::spin`](crate::tuning::Tuning::spin) is
//! off).

use std::sync::atomic::{AtomicBool, Ordering};

/// Runs `f` on a worker thread of rayon's global pool (the caller blocks until it returns), so
/// that the parallel loops inside it start from a worker: the worker runs its share of each
/// loop itself and never sleeps on a lock waiting for the others. From a thread outside the
/// pool every parallel loop puts the caller to sleep and wakes it again; a decode step runs
/// some 250 short parallel loops (each product, the attention), so generation runs here
/// (measured in `docs/kernels.md`). A call from inside the pool runs `f` where it is.
///
/// While `f` runs, the pool's other workers do not park between loops: each runs
/// `keep_awake` (the jobs of the pool as they come, spinning in between) until `f` returns or
/// no job came for 20 ms, as OpenMP's threads spin for a "block time" after a parallel region. A parked worker has
/// to be woken (a futex call, an interrupt to a halted CPU), and on a virtual machine the
/// host gives an idle CPU away, which the spinning avoids (docs/kernels.md). One call spins at
/// a time (two whose spinners each waited on the other's `f` would never finish); a concurrent
/// call runs without. `RLFT_SPIN=0` turns the spinning off ([`crate::tuning::Tuning::spin`]).
pub fn on_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if rayon::current_thread_index().is_some() {
        return f();
    }
    let session = if !crate::tuning::tuning().spin || rayon::current_num_threads() < 2 {
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
/// (`sched_yield`; candle's own elementwise workers share the cores). After [`IDLE_LIMIT`]
/// without a job it returns, as OpenMP's threads sleep after their block time: a worker may
/// take this job while it waits inside another job (when several threads call [`on_pool`] at
/// once), and spinning there until `stop` would hold that job, which the call that set `stop`
/// may be waiting on.
fn keep_awake(stop: &AtomicBool) {
    let mut idle = 0u32;
    let mut idle_since = std::time::Instant::now();
    while !stop.load(Ordering::Acquire) {
        if let Some(rayon::Yield::Executed) = rayon::yield_now() {
            idle = 0;
            continue;
        }
        if idle == 0 {
            idle_since = std::time::Instant::now();
        }
        idle = idle.wrapping_add(1);
        if idle.is_multiple_of(YIELD_EVERY) {
            if idle_since.elapsed() > IDLE_LIMIT {
                return;
            }
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

/// Empty rounds of [`keep_awake`] between two `sched_yield`s.
const YIELD_EVERY: u32 = 64;

/// How long [`keep_awake`] spins without a job before it returns: far longer than the gaps
/// between the parallel loops of a step, which the spinning is for.
const IDLE_LIMIT: std::time::Duration = std::time::Duration::from_millis(20);

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
        assert!(inside.is_some());
        assert_eq!(nested, inside, "a nested call stays on its worker");
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
