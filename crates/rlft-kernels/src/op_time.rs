//! Wall time per fused op, to see where a training step goes: `RLFT_OP_TIMES=1` turns it on
//! ([`Tuning::op_times`](crate::tuning::Tuning::op_times)), [`span`] times one call of an op's forward or backward (or a phase of the
//! decoder: prefill, decode step, its products, attention, LM head, sampling), [`take`]
//! returns the totals gathered since the last call. `rlft bench fwd_bwd|lora|generate` prints
//! them after the timed reps when it is on, `rlft bench grpo` after all its steps. What a step
//! spends outside these spans is candle's own work (its ops, gradient sums, allocation) and the
//! gaps between ops.
//!
//! Off, a span costs one relaxed atomic load. Spans do not nest, except the phases named
//! `"<name>: <phase>"` (e.g. `"generate: prefill"`), which hold other spans: [`table`] lists
//! them but leaves them out of the time it accounts for.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// 0 = not read yet, 1 = off, 2 = on.
static STATE: AtomicU8 = AtomicU8::new(0);

static TOTALS: Mutex<BTreeMap<&'static str, Total>> = Mutex::new(BTreeMap::new());

/// Calls and seconds of one op and phase.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Total {
    /// Calls timed.
    pub calls: u64,
    /// Wall seconds summed over the calls.
    pub seconds: f64,
}

/// Whether the timing is on: [`Tuning::op_times`](crate::tuning::Tuning::op_times) (`RLFT_OP_TIMES`)
/// unless [`set_enabled`] said otherwise.
pub fn enabled() -> bool {
    match STATE.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => {
            let on = crate::tuning::tuning().op_times;
            STATE.store(if on { 2 } else { 1 }, Ordering::Relaxed);
            on
        }
    }
}

/// Turns the timing on or off for this process (tests, benchmarks), whatever the environment.
pub fn set_enabled(on: bool) {
    STATE.store(if on { 2 } else { 1 }, Ordering::Relaxed);
}

/// A running timer of `name`; adds its wall time to the totals when dropped.
pub struct Span {
    name: &'static str,
    start: Instant,
}

/// Times the caller's scope under `name` (e.g. `"swiglu bwd"`) when the timing is on.
pub fn span(name: &'static str) -> Option<Span> {
    enabled().then(|| Span {
        name,
        start: Instant::now(),
    })
}

impl Drop for Span {
    fn drop(&mut self) {
        let s = self.start.elapsed().as_secs_f64();
        if let Ok(mut t) = TOTALS.lock() {
            let e = t.entry(self.name).or_default();
            e.calls += 1;
            e.seconds += s;
        }
    }
}

/// The totals since the last call (or the start), by name; resets them.
pub fn take() -> Vec<(&'static str, Total)> {
    TOTALS
        .lock()
        .map(|mut t| std::mem::take(&mut *t).into_iter().collect())
        .unwrap_or_default()
}

/// Whether `name` is a phase that holds other spans (`"generate: prefill"`).
fn is_phase(name: &str) -> bool {
    name.contains(": ")
}

/// The totals as a table: one line per op and phase, seconds per step (`steps` = how many steps
/// the totals cover), its share of `step_s` seconds per step, then the rest of the step.
pub fn table(totals: &[(&'static str, Total)], steps: usize, step_s: f64) -> String {
    let steps = steps.max(1) as f64;
    let mut rows: Vec<_> = totals.to_vec();
    rows.sort_by(|a, b| b.1.seconds.total_cmp(&a.1.seconds));
    let mut out = format!(
        "{:<26} {:>8} {:>10} {:>7}\n",
        "op (RLFT_OP_TIMES)", "calls", "s/step", "share"
    );
    let mut sum = 0.0;
    for (name, t) in &rows {
        let s = t.seconds / steps;
        if !is_phase(name) {
            sum += s;
        }
        out += &format!(
            "{name:<26} {:>8} {s:>10.3} {:>6.1}%\n",
            (t.calls as f64 / steps).round(),
            100.0 * s / step_s
        );
    }
    out += &format!(
        "{:<26} {:>8} {:>10.3} {:>6.1}%\n",
        "outside these ops",
        "",
        step_s - sum,
        100.0 * (step_s - sum) / step_s
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_add_up_only_when_on() {
        set_enabled(false);
        drop(span("test-op off"));
        set_enabled(true);
        for _ in 0..3 {
            let _s = span("test-op on");
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        set_enabled(false);
        let got = take();
        assert!(got.iter().all(|(n, _)| *n != "test-op off"));
        let on = got.iter().find(|(n, _)| *n == "test-op on").unwrap().1;
        assert_eq!(on.calls, 3);
        assert!(on.seconds >= 0.006, "{}", on.seconds);
        let t = table(&[("test-op on", on)], 3, 0.01);
        assert!(t.contains("test-op on") && t.contains("outside these ops"));
        // A phase is listed but not counted: the rest is the step less the ops alone.
        let op = Total {
            calls: 1,
            seconds: 0.25,
        };
        let phase = Total {
            calls: 1,
            seconds: 0.75,
        };
        let t = table(&[("phase: all", phase), ("op", op)], 1, 1.0);
        let rest = t.lines().last().unwrap();
        assert!(rest.contains("0.750") && t.contains("phase: all"), "{t}");
    }
}
