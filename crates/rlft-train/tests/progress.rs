//! Progress reporting: ETA arithmetic, formatting, and when plain lines are printed.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rlft_train::progress::{eta, format_duration, format_metrics, status_line, Progress};

#[derive(Clone, Default)]
struct Buf(Arc<Mutex<Vec<u8>>>);

impl Write for Buf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Buf {
    fn lines(&self) -> Vec<String> {
        String::from_utf8(self.0.lock().unwrap().clone())
            .unwrap()
            .lines()
            .map(String::from)
            .collect()
    }
}

#[test]
fn eta_uses_the_pace_of_this_process() {
    assert_eq!(eta(0, Duration::from_secs(5), 10), None);
    assert_eq!(
        eta(10, Duration::from_secs(20), 90),
        Some(Duration::from_secs(180))
    );
    assert_eq!(eta(3, Duration::from_secs(3), 0), Some(Duration::ZERO));
}

#[test]
fn durations_and_metrics_format_compactly() {
    let s = Duration::from_secs;
    assert_eq!(format_duration(s(0)), "0s");
    assert_eq!(format_duration(s(42)), "42s");
    assert_eq!(format_duration(s(185)), "3m05s");
    assert_eq!(format_duration(s(3723)), "1h02m03s");
    assert_eq!(format_duration(s(2 * 86_400 + 3 * 3600 + 59)), "2d03h");
    assert_eq!(
        format_metrics(&[
            ("loss", 0.42133),
            ("lr", 1e-5),
            ("reward", 0.0),
            ("n", f64::NAN)
        ]),
        "loss=0.4213 lr=1.00e-5 reward=0.0000 n=NaN"
    );
    assert_eq!(format_metrics(&[]), "");
}

#[test]
fn status_line_of_a_resumed_run() {
    // Resumed at step 100; 20 steps in 40 s -> 2 s/step; 880 left.
    let line = status_line(120, 1000, 100, Duration::from_secs(40), "loss=0.5000");
    assert_eq!(
        line,
        "step 120/1000 (12.0%) | elapsed 40s | eta 29m20s | 2.00 s/step | loss=0.5000"
    );
    let line = status_line(100, 1000, 100, Duration::from_secs(1), "");
    assert_eq!(line, "step 100/1000 (10.0%) | elapsed 1s | eta ?");
    let fast = status_line(50, 100, 0, Duration::from_secs(5), "");
    assert!(fast.ends_with("| 10.00 steps/s"), "{fast}");
}

#[test]
fn plain_lines_first_then_every_interval_then_last() {
    let buf = Buf::default();
    let mut p = Progress::lines(10, 0, Duration::from_secs(30), Box::new(buf.clone()));
    let t0 = Instant::now();
    let at = |s| t0 + Duration::from_secs(s);
    p.update_at(1, "loss=1.0000", at(1)); // first: printed
    p.update_at(2, "", at(10)); // 9 s later: quiet
    p.update_at(3, "", at(31)); // 30 s after the last line: printed
    p.update_at(4, "", at(40));
    p.update_at(10, "loss=0.1000", at(45)); // the last step: printed
    p.println("saved checkpoint-10");
    p.finish("done");
    let lines = buf.lines();
    assert_eq!(lines.len(), 5, "{lines:#?}");
    assert!(
        lines[0].starts_with("step 1/10 (10.0%)") && lines[0].ends_with("loss=1.0000"),
        "{}",
        lines[0]
    );
    assert!(lines[1].starts_with("step 3/10"), "{}", lines[1]);
    assert!(
        lines[2].starts_with("step 10/10 (100.0%)") && lines[2].contains("eta 0s"),
        "{}",
        lines[2]
    );
    assert_eq!(lines[3..], ["saved checkpoint-10", "done"]);
    assert_eq!(p.step(), 10);
}

#[test]
fn bar_and_hidden_modes_accept_updates() {
    // Not a terminal here: indicatif draws nothing, but the calls must work.
    let mut p = Progress::bar(5, 2);
    p.update(3, "loss=1.0");
    p.println("msg");
    p.finish("done");
    let mut h = Progress::hidden(5, 0);
    h.update(5, "");
    assert_eq!(h.step(), 5);
}
