//! TensorBoard event files, written (and read back) without TensorFlow or a protobuf compiler.
//!
//! A file `events.out.tfevents.{unix_seconds}.{hostname}` is a sequence of TFRecords:
//!
//! ```text
//! u64 LE length | u32 LE masked_crc32c(length bytes) | payload | u32 LE masked_crc32c(payload)
//! ```
//!
//! Each payload is a protobuf `tensorboard.Event`, hand-encoded here (the subset we need, field
//! numbers from `tensorboard/compat/proto/event.proto` and `summary.proto`):
//!
//! ```text
//! Event   { double wall_time = 1; int64 step = 2;
//!           oneof what { string file_version = 3; Summary summary = 5; SessionLog session_log = 7; }
//!           SourceMetadata source_metadata = 10; }      // SourceMetadata { string writer = 1; }
//! Summary { repeated Value value = 1; }
//! Value   { string tag = 1; oneof value { float simple_value = 2; } }
//! SessionLog { SessionStatus status = 1; }   // START = 1
//! ```
//!
//! Encoding follows proto3 as Python's protobuf does (fields in number order; `wall_time` and
//! `step` omitted when zero; `simple_value` always written, being in a `oneof`), so records are
//! byte-identical to TensorBoard's own writer for the same event: `tests/tensorboard.rs` checks
//! that against `tests/fixtures/tb_python.tfevents`, written by
//! `scripts/reference/tfevents_fixture.py`.
//!
//! On resume, [`EventWriter::add_session_start`] writes a `SessionLog.START` at the first new
//! step: TensorBoard then drops the points the crashed run logged past the checkpoint.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::crc32c::masked_crc32c;

/// The `file_version` of the first record of every event file.
pub const FILE_VERSION: &str = "brain.Event:2";
/// `source_metadata.writer` of the first record of files rlft writes.
pub const WRITER: &str = "rlft";

/// Errors writing or reading an event file.
#[derive(Debug, thiserror::Error)]
pub enum EventFileError {
    /// An I/O operation failed.
    #[error("tensorboard: cannot {op} `{path}`: {source}{hint}", hint = crate::checkpoint::io_hint(source))]
    Io {
        /// What was being done ("create", "write", ...).
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file is not a valid sequence of TFRecords holding `Event`s.
    #[error(
        "tensorboard: `{path}` is corrupt at byte {offset}: {reason}; a run killed mid-write leaves \
         a truncated last record, which TensorBoard ignores; anything else means the file was \
         damaged or is not an event file"
    )]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Byte offset of the bad record.
        offset: usize,
        /// What is wrong.
        reason: String,
    },
}

/// `SessionLog.status` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionStatus {
    /// `STATUS_UNSPECIFIED` (0) or an unknown value.
    Unspecified,
    /// `START` (1): a (re)start; TensorBoard purges events with `step >= this step`.
    Start,
    /// `STOP` (2).
    Stop,
    /// `CHECKPOINT` (3).
    Checkpoint,
}

impl SessionStatus {
    fn code(self) -> u64 {
        match self {
            SessionStatus::Unspecified => 0,
            SessionStatus::Start => 1,
            SessionStatus::Stop => 2,
            SessionStatus::Checkpoint => 3,
        }
    }

    fn from_code(code: u64) -> Self {
        match code {
            1 => SessionStatus::Start,
            2 => SessionStatus::Stop,
            3 => SessionStatus::Checkpoint,
            _ => SessionStatus::Unspecified,
        }
    }
}

/// What an [`Event`] carries (the `oneof what` subset rlft writes; others decode as `Other`).
#[derive(Debug, Clone, PartialEq)]
pub enum EventWhat {
    /// No `what` field.
    None,
    /// `file_version` (3): the first record, [`FILE_VERSION`].
    FileVersion(String),
    /// `summary` (5) with scalar values `(tag, simple_value)`; values of other kinds are skipped.
    Scalars(Vec<(String, f32)>),
    /// `session_log` (7).
    SessionLog(SessionStatus),
    /// Another `what` field, by field number (graph, run metadata, ...): not decoded.
    Other(u32),
}

/// One `tensorboard.Event`.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// Seconds since the Unix epoch.
    pub wall_time: f64,
    /// Global step.
    pub step: i64,
    /// The payload.
    pub what: EventWhat,
    /// `source_metadata.writer`: the program that wrote the file (TensorBoard's Python writer
    /// puts its module name on the first record; rlft writes `rlft`).
    pub source_writer: Option<String>,
}

// ---------------------------------------------------------------------------------------------
// protobuf encoding

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_key(out: &mut Vec<u8>, field: u32, wire: u8) {
    put_varint(out, ((field as u64) << 3) | wire as u64);
}

fn put_bytes(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    put_key(out, field, 2);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// The protobuf encoding of `event` (as Python's `Event.SerializeToString()`).
pub fn encode_event(event: &Event) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    if event.wall_time.to_bits() != 0 {
        put_key(&mut out, 1, 1);
        out.extend_from_slice(&event.wall_time.to_le_bytes());
    }
    if event.step != 0 {
        put_key(&mut out, 2, 0);
        put_varint(&mut out, event.step as u64); // int64: two's complement, 10 bytes if < 0
    }
    match &event.what {
        EventWhat::None | EventWhat::Other(_) => {}
        EventWhat::FileVersion(v) => put_bytes(&mut out, 3, v.as_bytes()),
        EventWhat::Scalars(values) => {
            let mut summary = Vec::new();
            for (tag, value) in values {
                let mut v = Vec::with_capacity(tag.len() + 8);
                if !tag.is_empty() {
                    put_bytes(&mut v, 1, tag.as_bytes());
                }
                put_key(&mut v, 2, 5);
                v.extend_from_slice(&value.to_le_bytes());
                put_bytes(&mut summary, 1, &v);
            }
            put_bytes(&mut out, 5, &summary);
        }
        EventWhat::SessionLog(status) => {
            let mut log = Vec::new();
            if status.code() != 0 {
                put_key(&mut log, 1, 0);
                put_varint(&mut log, status.code());
            }
            put_bytes(&mut out, 7, &log);
        }
    }
    if let Some(writer) = &event.source_writer {
        let mut meta = Vec::new();
        if !writer.is_empty() {
            put_bytes(&mut meta, 1, writer.as_bytes());
        }
        put_bytes(&mut out, 10, &meta);
    }
    out
}

/// Frames `payload` as one TFRecord.
pub fn frame_record(payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(payload.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc32c(&len).to_le_bytes());
    out.extend_from_slice(payload);
    out.extend_from_slice(&masked_crc32c(payload).to_le_bytes());
    out
}

// ---------------------------------------------------------------------------------------------
// decoding (for tests and tools)

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *self.buf.get(self.pos).ok_or("truncated varint")?;
            self.pos += 1;
            v |= ((b & 0x7f) as u64) << shift;
            if b < 0x80 {
                return Ok(v);
            }
        }
        Err("varint longer than 10 bytes".into())
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        let end = end.ok_or_else(|| format!("field of {n} bytes runs past the end"))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    /// Next `(field, wire type)`, or `None` at the end.
    fn key(&mut self) -> Result<Option<(u32, u8)>, String> {
        if self.pos == self.buf.len() {
            return Ok(None);
        }
        let k = self.varint()?;
        Ok(Some(((k >> 3) as u32, (k & 7) as u8)))
    }

    /// Reads a field's value: varint / fixed as u64, length-delimited as a slice.
    fn value(&mut self, wire: u8) -> Result<Field<'a>, String> {
        Ok(match wire {
            0 => Field::Int(self.varint()?),
            1 => Field::Int(u64::from_le_bytes(
                self.take(8)?.try_into().expect("8 bytes"),
            )),
            2 => {
                let n = self.varint()? as usize;
                Field::Bytes(self.take(n)?)
            }
            5 => Field::Int(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")) as u64),
            w => return Err(format!("unsupported protobuf wire type {w}")),
        })
    }
}

enum Field<'a> {
    Int(u64),
    Bytes(&'a [u8]),
}

fn utf8(b: &[u8]) -> Result<String, String> {
    String::from_utf8(b.to_vec()).map_err(|_| "string field is not UTF-8".to_string())
}

fn decode_summary(buf: &[u8]) -> Result<Vec<(String, f32)>, String> {
    let mut out = Vec::new();
    let mut r = Reader { buf, pos: 0 };
    while let Some((field, wire)) = r.key()? {
        match (field, r.value(wire)?) {
            (1, Field::Bytes(value)) => {
                let (mut tag, mut simple) = (String::new(), None);
                let mut v = Reader { buf: value, pos: 0 };
                while let Some((f, w)) = v.key()? {
                    match (f, v.value(w)?) {
                        (1, Field::Bytes(t)) => tag = utf8(t)?,
                        (2, Field::Int(bits)) if w == 5 => {
                            simple = Some(f32::from_bits(bits as u32))
                        }
                        _ => {}
                    }
                }
                if let Some(s) = simple {
                    out.push((tag, s));
                }
            }
            (1, Field::Int(_)) => return Err("Summary.value is not a message".into()),
            _ => {}
        }
    }
    Ok(out)
}

/// Decodes one `Event` payload (unknown fields are skipped).
pub fn decode_event(buf: &[u8]) -> Result<Event, String> {
    let mut event = Event {
        wall_time: 0.0,
        step: 0,
        what: EventWhat::None,
        source_writer: None,
    };
    let mut r = Reader { buf, pos: 0 };
    while let Some((field, wire)) = r.key()? {
        let value = r.value(wire)?;
        match (field, value) {
            (1, Field::Int(bits)) if wire == 1 => event.wall_time = f64::from_bits(bits),
            (2, Field::Int(v)) if wire == 0 => event.step = v as i64,
            (3, Field::Bytes(b)) => event.what = EventWhat::FileVersion(utf8(b)?),
            (5, Field::Bytes(b)) => event.what = EventWhat::Scalars(decode_summary(b)?),
            (7, Field::Bytes(b)) => {
                let mut status = SessionStatus::Unspecified;
                let mut s = Reader { buf: b, pos: 0 };
                while let Some((f, w)) = s.key()? {
                    if let (1, Field::Int(code)) = (f, s.value(w)?) {
                        status = SessionStatus::from_code(code);
                    }
                }
                event.what = EventWhat::SessionLog(status);
            }
            (10, Field::Bytes(b)) => {
                let mut writer = String::new();
                let mut s = Reader { buf: b, pos: 0 };
                while let Some((f, w)) = s.key()? {
                    if let (1, Field::Bytes(name)) = (f, s.value(w)?) {
                        writer = utf8(name)?;
                    }
                }
                event.source_writer = Some(writer);
            }
            (1..=3 | 5 | 7 | 10, _) => {
                return Err(format!("Event field {field} has wire type {wire}"))
            }
            (4 | 6 | 8 | 9, _) => event.what = EventWhat::Other(field),
            _ => {}
        }
    }
    Ok(event)
}

/// Splits `bytes` into TFRecord payloads, checking both CRCs of every record.
/// Errors give the byte offset of the first bad record.
pub fn read_records(bytes: &[u8]) -> Result<Vec<&[u8]>, (usize, String)> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < bytes.len() {
        let start = pos;
        let header = bytes
            .get(pos..pos + 12)
            .ok_or((start, "truncated record header".to_string()))?;
        let len_bytes = &header[..8];
        let crc = u32::from_le_bytes(header[8..12].try_into().expect("4 bytes"));
        if crc != masked_crc32c(len_bytes) {
            return Err((start, "length CRC mismatch".into()));
        }
        let len = u64::from_le_bytes(len_bytes.try_into().expect("8 bytes"));
        let len = usize::try_from(len).map_err(|_| (start, format!("record length {len}")))?;
        let body_end = (pos + 12).checked_add(len).filter(|e| e + 4 <= bytes.len());
        let body_end = body_end.ok_or((start, format!("truncated record of {len} bytes")))?;
        let payload = &bytes[pos + 12..body_end];
        let crc = u32::from_le_bytes(bytes[body_end..body_end + 4].try_into().expect("4 bytes"));
        if crc != masked_crc32c(payload) {
            return Err((start, "payload CRC mismatch".into()));
        }
        out.push(payload);
        pos = body_end + 4;
    }
    Ok(out)
}

/// Reads and decodes every event of an event file.
pub fn read_event_file(path: &Path) -> Result<Vec<Event>, EventFileError> {
    let bytes = std::fs::read(path).map_err(|source| EventFileError::Io {
        op: "read",
        path: path.to_owned(),
        source,
    })?;
    let corrupt = |offset, reason| EventFileError::Corrupt {
        path: path.to_owned(),
        offset,
        reason,
    };
    let records = read_records(&bytes).map_err(|(offset, reason)| corrupt(offset, reason))?;
    let mut events = Vec::with_capacity(records.len());
    for rec in records {
        let offset = rec.as_ptr() as usize - bytes.as_ptr() as usize - 12;
        events.push(decode_event(rec).map_err(|reason| corrupt(offset, reason))?);
    }
    Ok(events)
}

// ---------------------------------------------------------------------------------------------
// writer

/// Seconds since the Unix epoch, as TensorBoard's `wall_time`.
pub fn unix_time_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// This machine's host name for event file names (`/proc/sys/kernel/hostname`, then
/// `$HOSTNAME`, then `localhost`), with characters other than `[A-Za-z0-9._-]` replaced by `_`.
pub fn hostname() -> String {
    let raw = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into());
    raw.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || ".-_".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Writes one event file. Every `add_*` call writes and flushes its record to the OS, so a crash
/// loses nothing already logged (no fsync: a power cut may lose the last records).
#[derive(Debug)]
pub struct EventWriter {
    path: PathBuf,
    out: BufWriter<File>,
}

impl EventWriter {
    /// Creates `log_dir` if needed and a new `events.out.tfevents.{unix_seconds}.{hostname}` in
    /// it (with `.1`, `.2`, ... appended if that name exists), starting with the `file_version`
    /// record.
    pub fn create(log_dir: &Path) -> Result<Self, EventFileError> {
        let io = |op, path: &Path| {
            let path = path.to_owned();
            move |source| EventFileError::Io { op, path, source }
        };
        std::fs::create_dir_all(log_dir).map_err(io("create directory", log_dir))?;
        let now = unix_time_now();
        let base = format!("events.out.tfevents.{}.{}", now as u64, hostname());
        let mut n = 0;
        let (path, file) = loop {
            let name = if n == 0 {
                base.clone()
            } else {
                format!("{base}.{n}")
            };
            let path = log_dir.join(name);
            match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(f) => break (path, f),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => n += 1,
                Err(e) => return Err(io("create", &path)(e)),
            }
        };
        let mut w = EventWriter {
            path,
            out: BufWriter::new(file),
        };
        let what = EventWhat::FileVersion(FILE_VERSION.into());
        w.add_event(&Event {
            wall_time: now,
            step: 0,
            what,
            source_writer: Some(WRITER.into()),
        })?;
        Ok(w)
    }

    /// The file being written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes one event (any wall time) and flushes it.
    pub fn add_event(&mut self, event: &Event) -> Result<(), EventFileError> {
        let rec = frame_record(&encode_event(event));
        let res = self.out.write_all(&rec).and_then(|()| self.out.flush());
        res.map_err(|source| EventFileError::Io {
            op: "write",
            path: self.path.clone(),
            source,
        })
    }

    /// Logs scalars at `step` (one event, one `Summary.Value` per scalar, stored as f32 as
    /// TensorBoard's `simple_value` is).
    pub fn add_scalars(&mut self, step: i64, values: &[(&str, f64)]) -> Result<(), EventFileError> {
        let values = values
            .iter()
            .map(|(t, v)| (t.to_string(), *v as f32))
            .collect();
        self.add_event(&Event {
            wall_time: unix_time_now(),
            step,
            what: EventWhat::Scalars(values),
            source_writer: None,
        })
    }

    /// Marks a (re)start at `step`: TensorBoard discards earlier-written events with
    /// `step >= step` (the points a crashed run logged after its last checkpoint).
    pub fn add_session_start(&mut self, step: i64) -> Result<(), EventFileError> {
        let what = EventWhat::SessionLog(SessionStatus::Start);
        self.add_event(&Event {
            wall_time: unix_time_now(),
            step,
            what,
            source_writer: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_and_negative_steps_round_trip() {
        for step in [0i64, 1, 127, 128, 300, 1 << 40, -1, i64::MIN, i64::MAX] {
            let e = Event {
                wall_time: 1.5,
                step,
                what: EventWhat::None,
                source_writer: None,
            };
            assert_eq!(decode_event(&encode_event(&e)).unwrap(), e);
        }
    }

    #[test]
    fn zero_fields_are_omitted_like_proto3() {
        let e = Event {
            wall_time: 0.0,
            step: 0,
            what: EventWhat::None,
            source_writer: None,
        };
        assert!(encode_event(&e).is_empty());
        // simple_value is in a oneof: written even when 0.0 (0x15 = field 2, fixed32).
        let what = EventWhat::Scalars(vec![("a".into(), 0.0)]);
        let e = Event {
            wall_time: 0.0,
            step: 0,
            what,
            source_writer: None,
        };
        assert_eq!(
            encode_event(&e),
            [0x2a, 0x0a, 0x0a, 0x08, 0x0a, 0x01, b'a', 0x15, 0, 0, 0, 0]
        );
    }

    #[test]
    fn records_reject_bit_flips_and_truncation() {
        let mut file = frame_record(b"hello");
        file.extend(frame_record(b""));
        assert_eq!(read_records(&file).unwrap(), vec![&b"hello"[..], &b""[..]]);
        for i in 0..file.len() {
            let mut bad = file.clone();
            bad[i] ^= 0x10;
            assert!(read_records(&bad).is_err(), "flip at byte {i} not detected");
        }
        let err = read_records(&file[..file.len() - 1]).unwrap_err();
        assert_eq!(err.0, 21, "offset of the truncated second record");
    }
}
