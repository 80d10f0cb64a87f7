//! `metrics.jsonl` and its TensorBoard mirror: lines survive a crash, a resume drops what the
//! crashed run logged past its checkpoint, bad names are refused.

use std::io::Write;

use rlft_train::metrics::{read_metrics, MetricsLogger, METRICS_FILE};
use rlft_train::tensorboard::{read_event_file, EventWhat, SessionStatus};

fn steps(dir: &std::path::Path) -> Vec<u64> {
    read_metrics(&dir.join(METRICS_FILE))
        .unwrap()
        .iter()
        .map(|r| r.step)
        .collect()
}

#[test]
fn every_line_is_on_disk_when_log_returns() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = MetricsLogger::create(dir.path(), false).unwrap();
    let rec = log
        .log(1, 0.125, &[("loss", 2.5), ("learning_rate", 1e-5)])
        .unwrap();
    log.log(2, 0.25, &[("loss", f64::NAN)]).unwrap();
    // Read while the logger is still open (as after a crash).
    let text = std::fs::read_to_string(dir.path().join(METRICS_FILE)).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2);
    assert!(
        lines[0].starts_with(r#"{"step":1,"epoch":0.125,"wall_time":"#),
        "{}",
        lines[0]
    );
    assert!(
        lines[0].ends_with(r#","loss":2.5,"learning_rate":0.00001}"#),
        "{}",
        lines[0]
    );
    assert!(lines[1].ends_with(r#""loss":"NaN"}"#), "{}", lines[1]);
    let back = read_metrics(log.path()).unwrap();
    assert_eq!(back[0], rec);
    assert!(back[1].values[0].1.is_nan());
    assert!(back[1].elapsed_s >= back[0].elapsed_s && back[0].wall_time > 1.7e9);
}

#[test]
fn bad_names_are_refused_with_a_fix() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = MetricsLogger::create(dir.path(), false).unwrap();
    let err = log.log(1, 0.0, &[("step", 1.0)]).unwrap_err().to_string();
    assert!(
        err.contains("`step`") && err.contains("reserved") && err.contains("train/step"),
        "{err}"
    );
    let err = log
        .log(1, 0.0, &[("a", 1.0), ("a", 2.0)])
        .unwrap_err()
        .to_string();
    assert!(err.contains("twice"), "{err}");
    assert!(log.log(1, 0.0, &[("", 1.0)]).is_err());
    assert_eq!(
        std::fs::read_to_string(log.path()).unwrap(),
        "",
        "nothing written for a refused call"
    );
}

#[test]
fn resume_drops_steps_after_the_checkpoint_and_a_torn_line() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = MetricsLogger::create(dir.path(), false).unwrap();
    for step in 1..=6 {
        log.log(step, step as f64 / 4.0, &[("loss", 10.0 - step as f64)])
            .unwrap();
    }
    drop(log);
    // The crash hit mid-line.
    let path = dir.path().join(METRICS_FILE);
    std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap()
        .write_all(br#"{"step":7,"epo"#)
        .unwrap();
    assert_eq!(
        steps(dir.path()),
        vec![1, 2, 3, 4, 5, 6],
        "readers skip a torn last line"
    );
    let elapsed_at_4 = read_metrics(&path).unwrap()[3].elapsed_s;

    let mut log = MetricsLogger::resume(dir.path(), 4, false).unwrap();
    assert_eq!(steps(dir.path()), vec![1, 2, 3, 4]);
    assert!(
        log.elapsed_s() >= elapsed_at_4,
        "training time continues from the kept lines"
    );
    log.log(5, 1.25, &[("loss", 0.5)]).unwrap();
    log.log(6, 1.5, &[("loss", 0.25)]).unwrap();
    let recs = read_metrics(&path).unwrap();
    assert_eq!(
        recs.iter().map(|r| r.step).collect::<Vec<_>>(),
        vec![1, 2, 3, 4, 5, 6]
    );
    assert_eq!(recs[4].values, vec![("loss".to_string(), 0.5)]);
    assert!(recs[4].elapsed_s >= elapsed_at_4);

    // Resuming a run that never logged starts a fresh file.
    let fresh = tempfile::tempdir().unwrap();
    MetricsLogger::resume(fresh.path(), 10, false)
        .unwrap()
        .log(11, 1.0, &[("x", 1.0)])
        .unwrap();
    assert_eq!(steps(fresh.path()), vec![11]);
}

#[test]
fn a_corrupt_line_in_the_middle_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(METRICS_FILE);
    let text = "{\"step\":1,\"epoch\":0,\"wall_time\":1,\"elapsed_s\":0}\nnot json\n{}\n";
    std::fs::write(&path, text).unwrap();
    let err = MetricsLogger::resume(dir.path(), 5, false)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("line 2") && err.contains("metrics.jsonl"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        text,
        "left as it was"
    );
}

#[test]
fn tensorboard_mirror_and_resume_marker() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = MetricsLogger::create(dir.path(), true).unwrap();
    log.log(1, 0.5, &[("train/loss", 1.5), ("train/lr", 1e-4)])
        .unwrap();
    let first = log.tensorboard_path().unwrap().to_owned();
    drop(log);
    let events = read_event_file(&first).unwrap();
    assert_eq!(events.len(), 2);
    assert_eq!(events[1].step, 1);
    assert_eq!(
        events[1].what,
        EventWhat::Scalars(vec![("train/loss".into(), 1.5), ("train/lr".into(), 1e-4)])
    );

    let mut log = MetricsLogger::resume(dir.path(), 1, true).unwrap();
    log.log(2, 1.0, &[("train/loss", 1.25)]).unwrap();
    let second = log.tensorboard_path().unwrap().to_owned();
    assert_ne!(first, second);
    let events = read_event_file(&second).unwrap();
    assert!(matches!(events[0].what, EventWhat::FileVersion(_)));
    assert_eq!(
        (events[1].step, &events[1].what),
        (2, &EventWhat::SessionLog(SessionStatus::Start))
    );
    assert_eq!(events[2].step, 2);
}
