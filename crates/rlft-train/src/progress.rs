//! Training progress on stderr: an `indicatif` bar on a terminal, plain periodic lines
//! otherwise (CI, `nohup`, log files), both showing step/total, elapsed time, ETA, time per step
//! and a short metric string:
//!
//! ```text
//! step 120/1000 (12.0%) | elapsed 2m00s | eta 14m40s | 1.00 s/step | loss=0.4213 lr=1.00e-5
//! ```
//!
//! The ETA counts only the steps of this process, so a resumed run does not look infinitely
//! fast; the arithmetic ([`eta`], [`format_duration`], [`format_metrics`], [`status_line`]) is
//! pure and tested, and [`Progress::update_at`] takes the clock as an argument.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Default interval between plain progress lines.
pub const DEFAULT_LINE_INTERVAL: Duration = Duration::from_secs(30);

/// Time left at the average pace of this process: `elapsed / steps_done * steps_left`;
/// `None` before the first step.
pub fn eta(steps_done: u64, elapsed: Duration, steps_left: u64) -> Option<Duration> {
    if steps_done == 0 {
        return None;
    }
    Some(elapsed.mul_f64(steps_left as f64 / steps_done as f64))
}

/// `42s`, `3m05s`, `1h02m03s`, `2d03h`.
pub fn format_duration(d: Duration) -> String {
    let s = d.as_secs();
    let (days, h, m, s) = (s / 86_400, s / 3600 % 24, s / 60 % 60, s % 60);
    if days > 0 {
        format!("{days}d{h:02}h")
    } else if h > 0 {
        format!("{h}h{m:02}m{s:02}s")
    } else if m > 0 {
        format!("{m}m{s:02}s")
    } else {
        format!("{s}s")
    }
}

/// `name=value` pairs, 4 decimals, scientific notation for very small or large magnitudes.
pub fn format_metrics(values: &[(&str, f64)]) -> String {
    let fmt = |v: f64| {
        let a = v.abs();
        if v == 0.0 || !v.is_finite() || (1e-3..1e5).contains(&a) {
            format!("{v:.4}")
        } else {
            format!("{v:.2e}")
        }
    };
    values
        .iter()
        .map(|(k, v)| format!("{k}={}", fmt(*v)))
        .collect::<Vec<_>>()
        .join(" ")
}

/// One progress line: `step 120/1000 (12.0%) | elapsed 2m00s | eta 14m40s | 1.00 s/step | loss=..`.
pub fn status_line(
    step: u64,
    total: u64,
    start_step: u64,
    elapsed: Duration,
    metrics: &str,
) -> String {
    let done = step.saturating_sub(start_step);
    let pct = if total == 0 {
        100.0
    } else {
        100.0 * step as f64 / total as f64
    };
    let mut line = format!(
        "step {step}/{total} ({pct:.1}%) | elapsed {}",
        format_duration(elapsed)
    );
    match eta(done, elapsed, total.saturating_sub(step)) {
        Some(e) => line.push_str(&format!(" | eta {}", format_duration(e))),
        None => line.push_str(" | eta ?"),
    }
    if done > 0 {
        let per = elapsed.as_secs_f64() / done as f64;
        if per >= 1.0 || per == 0.0 {
            line.push_str(&format!(" | {per:.2} s/step"));
        } else {
            line.push_str(&format!(" | {:.2} steps/s", 1.0 / per));
        }
    }
    if !metrics.is_empty() {
        line.push_str(" | ");
        line.push_str(metrics);
    }
    line
}

enum Mode {
    Bar(ProgressBar),
    Lines {
        every: Duration,
        last: Option<Instant>,
        out: Box<dyn Write + Send>,
    },
    Hidden,
}

/// A progress reporter for steps `start_step..=total` (see the module docs).
pub struct Progress {
    total: u64,
    start_step: u64,
    started: Instant,
    step: u64,
    mode: Mode,
}

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mode = match self.mode {
            Mode::Bar(_) => "bar",
            Mode::Lines { .. } => "lines",
            Mode::Hidden => "hidden",
        };
        f.debug_struct("Progress")
            .field("total", &self.total)
            .field("step", &self.step)
            .field("mode", &mode)
            .finish()
    }
}

impl Progress {
    /// A bar when stderr is a terminal, else a line on stderr every [`DEFAULT_LINE_INTERVAL`].
    /// `start_step` is where a resumed run starts (0 for a fresh one).
    pub fn new(total: u64, start_step: u64) -> Self {
        if std::io::stderr().is_terminal() {
            Self::bar(total, start_step)
        } else {
            Self::lines(
                total,
                start_step,
                DEFAULT_LINE_INTERVAL,
                Box::new(std::io::stderr()),
            )
        }
    }

    /// An `indicatif` bar on stderr.
    pub fn bar(total: u64, start_step: u64) -> Self {
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
        let style = ProgressStyle::with_template("{bar:30.cyan/blue} {pos}/{len} {msg}")
            .expect("static template")
            .progress_chars("=> ");
        bar.set_style(style);
        bar.set_position(start_step);
        Self::with_mode(total, start_step, Mode::Bar(bar))
    }

    /// Plain lines to `out`: at the first update, then at most one per `every`, and at the end.
    pub fn lines(total: u64, start_step: u64, every: Duration, out: Box<dyn Write + Send>) -> Self {
        Self::with_mode(
            total,
            start_step,
            Mode::Lines {
                every,
                last: None,
                out,
            },
        )
    }

    /// Reports nothing.
    pub fn hidden(total: u64, start_step: u64) -> Self {
        Self::with_mode(total, start_step, Mode::Hidden)
    }

    fn with_mode(total: u64, start_step: u64, mode: Mode) -> Self {
        Self {
            total,
            start_step,
            started: Instant::now(),
            step: start_step,
            mode,
        }
    }

    /// Records that `step` is done, with a short metric string (see [`format_metrics`]).
    pub fn update(&mut self, step: u64, metrics: &str) {
        self.update_at(step, metrics, Instant::now());
    }

    /// [`Progress::update`] with an explicit clock (for tests and replays).
    pub fn update_at(&mut self, step: u64, metrics: &str, now: Instant) {
        self.step = step;
        let elapsed = now.saturating_duration_since(self.started);
        match &mut self.mode {
            Mode::Bar(bar) => {
                bar.set_position(step);
                let line = status_line(step, self.total, self.start_step, elapsed, metrics);
                // The bar shows step/total itself; keep what follows "elapsed".
                let msg = line
                    .split_once(" | ")
                    .map_or(line.as_str(), |(_, rest)| rest);
                bar.set_message(msg.to_string());
            }
            Mode::Lines { every, last, out } => {
                let due = match last {
                    None => true,
                    Some(t) => now.saturating_duration_since(*t) >= *every || step >= self.total,
                };
                if due {
                    *last = Some(now);
                    let line = status_line(step, self.total, self.start_step, elapsed, metrics);
                    let _ = writeln!(out, "{line}");
                    let _ = out.flush();
                }
            }
            Mode::Hidden => {}
        }
    }

    /// Prints a message without breaking the bar.
    pub fn println(&mut self, msg: &str) {
        match &mut self.mode {
            Mode::Bar(bar) => bar.println(msg),
            Mode::Lines { out, .. } => {
                let _ = writeln!(out, "{msg}");
                let _ = out.flush();
            }
            Mode::Hidden => {}
        }
    }

    /// Ends the report with `msg` (the bar stays on screen).
    pub fn finish(&mut self, msg: &str) {
        match &mut self.mode {
            Mode::Bar(bar) => bar.finish_with_message(msg.to_string()),
            Mode::Lines { out, .. } => {
                let _ = writeln!(out, "{msg}");
                let _ = out.flush();
            }
            Mode::Hidden => {}
        }
    }

    /// The last step reported.
    pub fn step(&self) -> u64 {
        self.step
    }
}
