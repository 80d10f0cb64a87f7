//! `type = "command"`: a reward process started once and kept running, speaking JSON lines.
//!
//! Per batch, rlft writes the samples to the process's stdin (one line per sample, or one
//! `{"samples": [...]}` line with `batch = true`) and reads the answers from its stdout. Three
//! threads per process keep rlft from ever blocking on it: a writer (a process that stops
//! reading cannot stall rlft on a full pipe), a stdout reader feeding a channel that rlft waits
//! on with the batch's deadline, and a stderr reader keeping the last lines for error messages.
//!
//! Any failure (timeout, crash, garbage) kills the process (its whole process group on Unix) and
//! the next batch starts a fresh one. `Process` is that machinery on its own; the `python`
//! reward ([`super::python`]) drives one too.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{parse_scores_body, sample_lines, samples_body, Collector, EXPECTED_ANSWER};
use crate::error::excerpt;
use crate::spec::{timeout, CommandSpec};
use crate::{Reward, RewardError, RewardOutput, Sample};

/// Longest stdout line accepted (a guard against a process that never prints a newline).
const MAX_LINE: u64 = 64 << 20;
/// Stderr lines kept for error messages.
const STDERR_LINES: usize = 20;

/// The `command` reward.
pub struct CommandReward {
    batch: bool,
    process: Process,
}

/// A reward process kept running between batches: started on the first request, sent one
/// request per batch, read line by line against the batch's deadline, and killed (with its
/// process group) when it times out, crashes or says something out of protocol. The `command`
/// and `python` rewards and the external tools of crate `rlft-tools` all drive one, so there
/// is a single process manager.
pub struct Process {
    reward: String,
    /// What the process is and what it answers, for messages: ("reward", "samples").
    /// What the process is, what it answers, one answer's unit, one request's unit.
    noun: (&'static str, &'static str, &'static str, &'static str),
    argv: Vec<String>,
    /// How messages name the process.
    shown: String,
    /// The config key that names the program, for the hint when it cannot start.
    program_key: &'static str,
    timeout: Duration,
    timeout_s: f64,
    worker: Option<Worker>,
}

/// A running reward process and the threads around it.
struct Worker {
    child: Child,
    /// The child has been reaped: its pid (and group id) may belong to someone else now.
    reaped: bool,
    input: Option<Sender<Vec<u8>>>,
    lines: Receiver<Line>,
    stderr: Arc<Mutex<VecDeque<String>>>,
    stderr_done: Receiver<()>,
}

enum Line {
    Text(String),
    Eof,
    Failed(String),
}

impl CommandReward {
    /// Validates the spec; the process starts on the first batch.
    pub fn new(name: String, spec: &CommandSpec) -> Result<Self, RewardError> {
        if spec.command.is_empty() || spec.command[0].trim().is_empty() {
            return Err(RewardError::config(
                &name,
                "`command` is empty; give the program and its arguments, e.g. command = [\"python3\", \"reward.py\"]",
            ));
        }
        let shown = format!("`{}`", spec.command.join(" "));
        Ok(CommandReward {
            batch: spec.batch,
            process: Process::new(name, spec.command.clone(), shown, "command", spec.timeout_s)?,
        })
    }

    fn try_score(&mut self, batch: &[Sample<'_>]) -> Result<RewardOutput, RewardError> {
        let n = batch.len();
        let payload = if self.batch {
            let mut body = samples_body(batch);
            body.push(b'\n');
            body
        } else {
            sample_lines(batch)
        };
        let deadline = self.process.send(payload, n)?;
        if self.batch {
            let line = self.process.next_line(deadline, 0, n)?;
            return parse_scores_body(&line, n).map_err(|e| self.process.protocol(e));
        }
        let mut collector = Collector::new(n);
        loop {
            let i = n - collector.missing();
            let line = self.process.next_line(deadline, i, n)?;
            let answer = serde_json::from_str::<Value>(&line)
                .map_err(|e| e.to_string())
                .and_then(|v| collector.push(&v));
            if let Err(why) = answer {
                return Err(self.process.protocol(format!(
                    "answer line for sample {i} of {n} is not {EXPECTED_ANSWER}: `{}` ({why}); \
                     print exactly one answer per sample on stdout and send logs to stderr",
                    excerpt(&line, 200)
                )));
            }
            if collector.missing() == 0 {
                return Ok(collector.finish());
            }
        }
    }
}

impl Reward for CommandReward {
    fn name(&self) -> &str {
        &self.process.reward
    }

    fn score(&mut self, batch: &[Sample<'_>]) -> Result<RewardOutput, RewardError> {
        if batch.is_empty() {
            return Ok(RewardOutput::default());
        }
        let result = self.try_score(batch);
        if result.is_err() {
            self.process.reset(); // the next batch starts a fresh process
        }
        result
    }
}

impl Process {
    /// A process running `argv` (not started yet), named `shown` in messages; each batch may
    /// take `timeout_s` seconds. `program_key` is the config key naming `argv[0]`.
    pub fn new(
        reward: String,
        argv: Vec<String>,
        shown: String,
        program_key: &'static str,
        timeout_s: f64,
    ) -> Result<Self, RewardError> {
        Ok(Process {
            timeout: timeout(&reward, timeout_s)?,
            noun: ("reward", "samples", "sample", "batch"),
            reward,
            argv,
            shown,
            program_key,
            timeout_s,
            worker: None,
        })
    }

    fn spawn(&self) -> Result<Worker, RewardError> {
        let mut cmd = Command::new(&self.argv[0]);
        cmd.args(&self.argv[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        #[cfg(unix)]
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let mut child = cmd.spawn().map_err(|e| RewardError::Process {
            reward: self.reward.clone(),
            message: format!(
                "cannot start {}: {e}; check that the program exists, is executable and is on PATH \
                 (or give its full path in `{}`)",
                self.shown, self.program_key
            ),
        })?;
        let (stdin, stdout, stderr) =
            match (child.stdin.take(), child.stdout.take(), child.stderr.take()) {
                (Some(i), Some(o), Some(e)) => (i, o, e),
                _ => unreachable!("all three pipes were requested"),
            };
        match start_threads(&self.reward, stdin, stdout, stderr) {
            Ok((input, lines, stderr, stderr_done)) => Ok(Worker {
                child,
                reaped: false,
                input: Some(input),
                lines,
                stderr,
                stderr_done,
            }),
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(e)
            }
        }
    }

    /// The same process named in messages as a `what` answering `units` (a tool answering
    /// calls) instead of a reward answering samples.
    pub fn named(mut self, what: &'static str, units: &'static str) -> Self {
        self.noun = (what, units, "request", "request");
        self
    }

    /// A protocol error of this reward.
    pub fn protocol(&self, message: String) -> RewardError {
        RewardError::Protocol {
            reward: self.reward.clone(),
            message,
        }
    }

    /// Kills the process, if one runs; the next [`Process::send`] starts a fresh one.
    pub fn reset(&mut self) {
        if let Some(mut worker) = self.worker.take() {
            worker.kill();
        }
    }

    /// The error for a process that closed its stdout: its exit status and last stderr lines.
    fn crashed(&mut self, answered: usize, of: usize) -> RewardError {
        let Some(mut worker) = self.worker.take() else {
            return self.protocol(format!("the {} process is gone", self.noun.0));
        };
        let status = worker.wait_exit(Duration::from_secs(2));
        let _ = worker.stderr_done.recv_timeout(Duration::from_millis(500));
        let stderr = worker.stderr_tail();
        RewardError::Process {
            reward: self.reward.clone(),
            message: format!(
                "{} process {} {status} after answering {answered} of {of} {}; {stderr}",
                self.noun.0, self.shown, self.noun.1
            ),
        }
    }

    /// Starts the process if none runs, checks that it printed nothing since the last batch,
    /// and sends `payload` (the request for a batch of `n` samples). Returns the deadline of
    /// the answer.
    pub fn send(&mut self, payload: Vec<u8>, n: usize) -> Result<Instant, RewardError> {
        let deadline = Instant::now() + self.timeout;
        if self.worker.is_none() {
            self.worker = Some(self.spawn()?);
        }
        let worker = self.worker.as_mut().expect("just started");
        // Anything the process printed since the last batch is out of protocol.
        loop {
            match worker.lines.try_recv() {
                Ok(Line::Text(line)) if line.trim().is_empty() => {}
                Ok(Line::Text(line)) => {
                    return Err(self.protocol(format!(
                        "the process printed a line when no answer was due: `{}`; print exactly \
                         one answer per {} on stdout and send logs to stderr",
                        excerpt(&line, 200),
                        self.noun.2
                    )))
                }
                Ok(Line::Failed(message)) => return Err(self.protocol(message)),
                Ok(Line::Eof) | Err(TryRecvError::Disconnected) => return Err(self.crashed(0, n)),
                Err(TryRecvError::Empty) => break,
            }
        }
        if let Some(input) = &worker.input {
            let _ = input.send(payload); // a dead writer means a dead process: reading reports it
        }
        Ok(deadline)
    }

    /// The next non-blank line of the process's stdout, waiting until `deadline`. A process
    /// that exits or does not answer in time is killed; `answered` of `n` samples say how far
    /// the batch got, for the error.
    pub fn next_line(
        &mut self,
        deadline: Instant,
        answered: usize,
        n: usize,
    ) -> Result<String, RewardError> {
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            let Some(worker) = self.worker.as_mut() else {
                return Err(self.protocol(format!("the {} process is gone", self.noun.0)));
            };
            match worker.lines.recv_timeout(remaining) {
                Ok(Line::Text(line)) if line.trim().is_empty() => {}
                Ok(Line::Text(line)) => return Ok(line),
                Ok(Line::Failed(message)) => {
                    self.reset();
                    return Err(self.protocol(message));
                }
                Ok(Line::Eof) | Err(RecvTimeoutError::Disconnected) => {
                    return Err(self.crashed(answered, n))
                }
                Err(RecvTimeoutError::Timeout) => {
                    self.reset();
                    return Err(RewardError::Timeout {
                        reward: self.reward.clone(),
                        seconds: self.timeout_s,
                        detail: format!(
                            "process {} answered {answered} of {n} {}; it was killed and starts \
                             again on the next {}",
                            self.shown, self.noun.1, self.noun.3
                        ),
                    });
                }
            }
        }
    }
}

type Threads = (
    Sender<Vec<u8>>,
    Receiver<Line>,
    Arc<Mutex<VecDeque<String>>>,
    Receiver<()>,
);

/// Starts the stdin writer, stdout reader and stderr collector of a new process.
fn start_threads(
    reward: &str,
    stdin: ChildStdin,
    stdout: ChildStdout,
    stderr: ChildStderr,
) -> Result<Threads, RewardError> {
    let (input, to_write) = mpsc::channel::<Vec<u8>>();
    spawn_thread(reward, "stdin", move || {
        let mut stdin = stdin;
        for bytes in to_write {
            if stdin
                .write_all(&bytes)
                .and_then(|()| stdin.flush())
                .is_err()
            {
                break; // the process is gone; the stdout reader reports it
            }
        }
    })?;
    let (line_tx, lines) = mpsc::channel();
    spawn_thread(reward, "stdout", move || read_lines(stdout, line_tx))?;
    let tail = Arc::new(Mutex::new(VecDeque::new()));
    let (done_tx, stderr_done) = mpsc::channel();
    let keep = Arc::clone(&tail);
    spawn_thread(reward, "stderr", move || {
        let mut reader = BufReader::new(stderr);
        loop {
            // Pieces of at most 64 KiB: a process that never prints a newline costs no memory.
            let mut buf = Vec::new();
            match (&mut reader).take(64 << 10).read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            let line = excerpt(String::from_utf8_lossy(&buf).trim_end(), 300);
            let mut tail = keep.lock().unwrap_or_else(|e| e.into_inner());
            if tail.len() == STDERR_LINES {
                tail.pop_front();
            }
            tail.push_back(line);
        }
        let _ = done_tx.send(());
    })?;
    Ok((input, lines, tail, stderr_done))
}

fn spawn_thread(
    reward: &str,
    role: &str,
    f: impl FnOnce() + Send + 'static,
) -> Result<(), RewardError> {
    let name = format!("reward-{reward}-{role}");
    thread::Builder::new()
        .name(name)
        .spawn(f)
        .map(|_| ())
        .map_err(|e| RewardError::Process {
            reward: reward.to_string(),
            message: format!("cannot start a thread: {e}"),
        })
}

/// Sends each stdout line to `tx` until EOF (then `Eof`), a read error or an over-long line.
fn read_lines(stdout: impl Read, tx: Sender<Line>) {
    let mut reader = BufReader::new(stdout);
    loop {
        let mut buf = Vec::new();
        let line = match (&mut reader).take(MAX_LINE).read_until(b'\n', &mut buf) {
            Ok(0) => Line::Eof,
            Ok(_) if buf.last() != Some(&b'\n') && buf.len() as u64 >= MAX_LINE => {
                Line::Failed(format!(
                "the process printed a line longer than {} MiB; answers must be one short JSON \
                 value per line",
                MAX_LINE >> 20
            ))
            }
            Ok(_) => Line::Text(String::from_utf8_lossy(&buf).into_owned()),
            Err(e) => Line::Failed(format!("reading the process's stdout failed: {e}")),
        };
        let last = !matches!(line, Line::Text(_));
        if tx.send(line).is_err() || last {
            return;
        }
    }
}

impl Worker {
    /// Waits up to `grace` for the process to exit, then kills it; describes how it ended.
    fn wait_exit(&mut self, grace: Duration) -> String {
        self.input = None;
        let end = Instant::now() + grace;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => {
                    self.reaped = true;
                    return format!("exited ({status})");
                }
                Ok(None) if Instant::now() < end => thread::sleep(Duration::from_millis(5)),
                Ok(None) => {
                    self.kill();
                    return "closed its stdout but kept running (killed)".to_string();
                }
                Err(e) => return format!("could not be waited for ({e})"),
            }
        }
    }

    fn kill(&mut self) {
        if self.reaped {
            return;
        }
        #[cfg(unix)]
        if let Ok(pid) = i32::try_from(self.child.id()) {
            // The process leads its own group (process_group(0)): kill helpers it started too.
            // SAFETY: kill(2) with a negative pid signals a process group; no memory is involved.
            unsafe {
                libc::kill(-pid, libc::SIGKILL);
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.reaped = true;
    }

    fn stderr_tail(&self) -> String {
        let tail = self.stderr.lock().unwrap_or_else(|e| e.into_inner());
        if tail.is_empty() {
            "its stderr was empty".to_string()
        } else {
            let lines: Vec<&str> = tail.iter().map(String::as_str).collect();
            format!("last lines of its stderr:\n  {}", lines.join("\n  "))
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Close stdin so a well-behaved process can exit by itself, then make sure it is gone.
        let _ = self.wait_exit(Duration::from_millis(200));
        self.kill();
    }
}
