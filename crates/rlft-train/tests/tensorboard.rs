//! TensorBoard event files against TensorBoard's own Python writer
//! (`tests/fixtures/tb_python.tfevents`, written by `scripts/reference/tfevents_fixture.py`).

use std::path::Path;

use rlft_train::tensorboard::{
    decode_event, encode_event, frame_record, read_event_file, read_records, Event, EventWhat,
    EventWriter, SessionStatus, FILE_VERSION, WRITER,
};

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/tb_python.tfevents"
);

fn scalars(step: i64, wall_time: f64, values: &[(&str, f32)]) -> Event {
    let values = values.iter().map(|(t, v)| (t.to_string(), *v)).collect();
    Event {
        wall_time,
        step,
        what: EventWhat::Scalars(values),
        source_writer: None,
    }
}

/// The events after the `file_version` record; keep in sync with `EVENTS` in the script.
fn expected_events() -> Vec<Event> {
    vec![
        scalars(
            1,
            1714000001.25,
            &[("train/loss", 2.5), ("train/learning_rate", 1e-5)],
        ),
        scalars(
            2,
            1714000002.5,
            &[("train/loss", 0.0), ("train/grad_norm", -3.75)],
        ),
        Event {
            wall_time: 1714000003.0,
            step: 3,
            what: EventWhat::SessionLog(SessionStatus::Start),
            source_writer: None,
        },
        scalars(
            3,
            1714000003.125,
            &[("reward/mean \u{b1} std", 0.1), ("nan", f32::NAN)],
        ),
        scalars(1 << 40, 1714000004.0, &[("eval/accuracy", 0.75)]),
        scalars(0, 0.0, &[("zero", 1.0)]),
    ]
}

/// `PartialEq` with NaN == NaN (bitwise on the values).
fn same(a: &Event, b: &Event) -> bool {
    match (&a.what, &b.what) {
        (EventWhat::Scalars(x), EventWhat::Scalars(y)) => {
            a.wall_time == b.wall_time
                && a.step == b.step
                && x.len() == y.len()
                && x.iter()
                    .zip(y)
                    .all(|((t1, v1), (t2, v2))| t1 == t2 && v1.to_bits() == v2.to_bits())
        }
        _ => a == b,
    }
}

#[test]
fn python_written_file_decodes() {
    let events = read_event_file(Path::new(FIXTURE)).unwrap();
    assert_eq!(events.len(), 7);
    let first = &events[0];
    assert_eq!(first.what, EventWhat::FileVersion(FILE_VERSION.into()));
    assert_eq!(first.step, 0);
    assert!(
        first.wall_time > 1.7e9,
        "wall time of the python run: {}",
        first.wall_time
    );
    assert_eq!(
        first.source_writer.as_deref(),
        Some("tensorboard.summary.writer.event_file_writer")
    );
    for (got, want) in events[1..].iter().zip(expected_events()) {
        assert!(same(got, &want), "got {got:?}\nwant {want:?}");
    }
}

#[test]
fn rust_encoding_is_byte_identical_to_tensorboards_writer() {
    let bytes = std::fs::read(FIXTURE).unwrap();
    let file_version = decode_event(read_records(&bytes).unwrap()[0]).unwrap();
    let mut ours = frame_record(&encode_event(&Event {
        wall_time: file_version.wall_time, // the only input the script did not choose
        step: 0,
        what: EventWhat::FileVersion(FILE_VERSION.into()),
        source_writer: Some("tensorboard.summary.writer.event_file_writer".into()),
    }));
    for e in expected_events() {
        ours.extend(frame_record(&encode_event(&e)));
    }
    assert_eq!(ours.len(), bytes.len());
    let first_diff = ours.iter().zip(&bytes).position(|(a, b)| a != b);
    assert_eq!(first_diff, None, "first differing byte");
}

#[test]
fn writer_output_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = EventWriter::create(dir.path()).unwrap();
    w.add_scalars(1, &[("train/loss", 1.5), ("train/lr", 3e-4)])
        .unwrap();
    w.add_session_start(2).unwrap();
    w.add_scalars(2, &[("train/loss", 1.25)]).unwrap();
    let path = w.path().to_owned();
    let name = path.file_name().unwrap().to_str().unwrap().to_string();
    assert!(name.starts_with("events.out.tfevents."), "{name}");
    let stamp: u64 = name.split('.').nth(3).unwrap().parse().unwrap();
    assert!(stamp > 1_700_000_000);

    // A second writer in the same second gets its own file.
    let w2 = EventWriter::create(dir.path()).unwrap();
    assert_ne!(w2.path(), path);

    // Each add_* is flushed: readable while the writer is still open.
    let events = read_event_file(&path).unwrap();
    drop(w);
    assert_eq!(events.len(), 4);
    assert_eq!(events[0].what, EventWhat::FileVersion(FILE_VERSION.into()));
    assert_eq!(events[0].source_writer.as_deref(), Some(WRITER));
    assert_eq!(events[1].step, 1);
    assert_eq!(
        events[1].what,
        EventWhat::Scalars(vec![("train/loss".into(), 1.5), ("train/lr".into(), 3e-4)])
    );
    assert_eq!(events[2].what, EventWhat::SessionLog(SessionStatus::Start));
    assert_eq!(events[2].step, 2);
    assert!(events.iter().all(|e| e.wall_time >= events[0].wall_time));
}

#[test]
fn damaged_file_is_reported_with_offset() {
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = std::fs::read(FIXTURE).unwrap();
    let first_len = 12 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize + 4;
    bytes[first_len + 20] ^= 1; // inside the second record's payload
    let path = dir.path().join("events.out.tfevents.1.x");
    std::fs::write(&path, &bytes).unwrap();
    let err = read_event_file(&path).unwrap_err().to_string();
    assert!(
        err.contains(&format!("corrupt at byte {first_len}")),
        "{err}"
    );
    assert!(err.contains("payload CRC mismatch"), "{err}");
}
