//! Where an external tool or an environment is reached: a JSON-lines process or an HTTP
//! endpoint, one JSON request and one answer per exchange.

use std::sync::Mutex;
use std::time::Duration;

use rlft_rewards::external::command::Process;
use rlft_rewards::http_client::{HttpError, Url};

/// A process (started on the first request, kept running) or an HTTP endpoint.
pub(crate) enum Endpoint {
    /// One request line on stdin, one answer line on stdout.
    Command(Mutex<Process>),
    /// Each request POSTed, the answer in the body.
    Http {
        /// The parsed endpoint.
        endpoint: Url,
        /// The URL as configured, for messages.
        url: String,
        /// The limit of one request, connecting included.
        timeout: Duration,
    },
}

impl Endpoint {
    /// Sends `body` (one JSON value) and returns the answer's text, or what went wrong. A
    /// process that failed (crashed, hung, broke the protocol) is killed; the next request
    /// starts a fresh one.
    pub(crate) fn exchange(&self, body: Vec<u8>) -> Result<String, String> {
        match self {
            Endpoint::Command(p) => {
                let mut p = p.lock().unwrap_or_else(|e| e.into_inner());
                let mut line = body;
                line.push(b'\n');
                let r = p.send(line, 1).and_then(|d| p.next_line(d, 0, 1));
                if r.is_err() {
                    p.reset();
                }
                r.map_err(|e| e.detail())
            }
            Endpoint::Http {
                endpoint,
                url,
                timeout,
            } => match endpoint.request("POST", Some(&body), *timeout) {
                Ok(r) => r
                    .ok()
                    .map(|b| String::from_utf8_lossy(&b).into_owned())
                    .map_err(|m| format!("POST {url}: {m}")),
                Err(HttpError::Timeout { stage }) => Err(format!(
                    "POST {url}: no answer within {} s (while {stage}); raise timeout_s if it is \
                     just slow",
                    timeout.as_secs_f64()
                )),
                Err(HttpError::Failed(m)) => Err(format!("POST {url}: {m}")),
            },
        }
    }

    /// Kills the process, if this is one (its answer broke the protocol).
    pub(crate) fn reset(&self) {
        if let Endpoint::Command(p) = self {
            p.lock().unwrap_or_else(|e| e.into_inner()).reset();
        }
    }
}
