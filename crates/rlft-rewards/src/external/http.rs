//! `type = "http"`: POST `{"samples": [...]}` to an endpoint, read `{"scores": [...]}`.
//!
//! A minimal HTTP/1.1 client on `std::net::TcpStream`: one connection per batch
//! (`Connection: close`), `Content-Length` or chunked responses, and one deadline (`timeout_s`)
//! covering name resolution, connecting, sending and reading.
//!
//! Plain `http://` only: `https://` would need a TLS stack (rustls or OpenSSL) as a dependency of
//! every rlft build, for what is usually a reward server on the same machine or private network.
//! Put a local plain-HTTP proxy in front of a remote HTTPS endpoint, or use a `command` reward.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use super::{parse_scores_body, samples_body};
use crate::error::excerpt;
use crate::spec::{timeout, HttpSpec};
use crate::{Reward, RewardError, RewardOutput, Sample};

/// Largest response accepted.
const MAX_RESPONSE: usize = 64 << 20;

/// The `http` reward.
pub struct HttpReward {
    name: String,
    url: String,
    host: String,
    port: u16,
    path: String,
    timeout: Duration,
    timeout_s: f64,
}

/// The parts of an `http://` URL this client needs.
#[derive(Debug, PartialEq)]
struct Url {
    host: String,
    port: u16,
    path: String,
}

fn parse_url(url: &str) -> Result<Url, String> {
    let lower = url.to_ascii_lowercase();
    if lower.starts_with("https://") {
        return Err(format!(
            "`url` {url:?} uses https, which is not supported: rlft-rewards has no TLS dependency. \
             Serve the reward over plain http (e.g. on 127.0.0.1), put a local http proxy in front \
             of it, or use a `command` reward"
        ));
    }
    let Some(rest) = lower.strip_prefix("http://").map(|_| &url[7..]) else {
        return Err(format!(
            "`url` {url:?} must start with http://, e.g. \"http://127.0.0.1:8000/score\""
        ));
    };
    let rest = rest.split('#').next().unwrap_or_default();
    let split = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(split);
    let path = match path {
        "" => "/".to_string(),
        p if p.starts_with('?') => format!("/{p}"),
        p => p.to_string(),
    };
    if authority.contains('@') {
        return Err(format!(
            "`url` {url:?}: user:password@ in URLs is not supported"
        ));
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6
            .split_once(']')
            .ok_or_else(|| format!("`url` {url:?}: unclosed `[`"))?;
        (host, after.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return Err(format!("`url` {url:?} has no host"));
    }
    let port = match port {
        None => 80,
        Some(p) => p
            .parse()
            .map_err(|_| format!("`url` {url:?}: port `{p}` is not a number in 1..65535"))?,
    };
    Ok(Url {
        host: host.to_string(),
        port,
        path,
    })
}

impl HttpReward {
    /// Validates the URL and timeout; nothing is contacted until the first batch.
    pub fn new(name: String, spec: &HttpSpec) -> Result<Self, RewardError> {
        let url = parse_url(spec.url.trim()).map_err(|m| RewardError::config(&name, m))?;
        Ok(HttpReward {
            timeout: timeout(&name, spec.timeout_s)?,
            timeout_s: spec.timeout_s,
            name,
            url: spec.url.trim().to_string(),
            host: url.host,
            port: url.port,
            path: url.path,
        })
    }

    fn error(&self, message: String) -> RewardError {
        RewardError::Http {
            reward: self.name.clone(),
            message: format!("POST {}: {message}", self.url),
        }
    }

    fn timed_out(&self, stage: &str) -> RewardError {
        RewardError::Timeout {
            reward: self.name.clone(),
            seconds: self.timeout_s,
            detail: format!("POST {} while {stage}", self.url),
        }
    }

    /// Sends `body`, returns the response body of a 2xx answer.
    fn post(&self, body: &[u8]) -> Result<Vec<u8>, RewardError> {
        let deadline = Instant::now() + self.timeout;
        let left = || {
            deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1))
        };
        let addrs = self.resolve(left())?;
        let mut stream = None;
        let mut last_error = None;
        for addr in addrs {
            if Instant::now() >= deadline {
                return Err(self.timed_out("connecting"));
            }
            match TcpStream::connect_timeout(&addr, left()) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last_error = Some(e),
            }
        }
        let mut stream = match (stream, last_error) {
            (Some(s), _) => s,
            (None, Some(e)) if is_timeout(&e) => return Err(self.timed_out("connecting")),
            (None, e) => {
                let why = e.map_or("no address".to_string(), |e| e.to_string());
                return Err(self.error(format!(
                    "cannot connect ({why}); is the reward server running?"
                )));
            }
        };
        let _ = stream.set_nodelay(true);
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        let head = format!(
            "POST {} HTTP/1.1\r\nHost: {host}:{}\r\nUser-Agent: rlft-rewards\r\nContent-Type: \
             application/json\r\nAccept: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            self.path,
            self.port,
            body.len()
        );
        let io = |e: std::io::Error, stage: &str| {
            if is_timeout(&e) {
                self.timed_out(stage)
            } else {
                self.error(format!("{stage} failed: {e}"))
            }
        };
        stream
            .set_write_timeout(Some(left()))
            .map_err(|e| io(e, "sending"))?;
        stream
            .write_all(head.as_bytes())
            .map_err(|e| io(e, "sending"))?;
        stream.write_all(body).map_err(|e| io(e, "sending"))?;
        let mut buf = Vec::new();
        let mut chunk = vec![0u8; 64 << 10];
        loop {
            if let Some(response) = parse_response(&buf, false).map_err(|m| self.error(m))? {
                return self.check_status(response);
            }
            if Instant::now() >= deadline {
                return Err(self.timed_out("reading the response"));
            }
            stream
                .set_read_timeout(Some(left()))
                .map_err(|e| io(e, "reading the response"))?;
            match stream.read(&mut chunk) {
                Ok(0) => {
                    let response = parse_response(&buf, true).map_err(|m| self.error(m))?;
                    return match response {
                        Some(r) => self.check_status(r),
                        None => Err(self.error(format!(
                            "the server closed the connection after {} bytes, before a complete response",
                            buf.len()
                        ))),
                    };
                }
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io(e, "reading the response")),
            }
            if buf.len() > MAX_RESPONSE {
                return Err(self.error(format!("response larger than {} MiB", MAX_RESPONSE >> 20)));
            }
        }
    }

    /// Resolves the host in a helper thread so that a slow resolver cannot outlast the deadline.
    fn resolve(&self, within: Duration) -> Result<Vec<SocketAddr>, RewardError> {
        let (tx, rx) = mpsc::channel();
        let target = (self.host.clone(), self.port);
        thread::Builder::new()
            .name(format!("reward-{}-resolve", self.name))
            .spawn(move || {
                let _ = tx.send(target.to_socket_addrs().map(Vec::from_iter));
            })
            .map_err(|e| self.error(format!("cannot start a thread: {e}")))?;
        match rx.recv_timeout(within) {
            Ok(Ok(addrs)) if !addrs.is_empty() => Ok(addrs),
            Ok(Ok(_)) => Err(self.error(format!("host `{}` has no address", self.host))),
            Ok(Err(e)) => Err(self.error(format!("cannot resolve host `{}`: {e}", self.host))),
            Err(_) => Err(self.timed_out("resolving the host name")),
        }
    }

    fn check_status(&self, response: Response) -> Result<Vec<u8>, RewardError> {
        if (200..300).contains(&response.status) {
            Ok(response.body)
        } else {
            let body = String::from_utf8_lossy(&response.body);
            Err(self.error(format!(
                "the server answered `{}`: {}",
                response.status_line,
                excerpt(body.trim(), 300)
            )))
        }
    }
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
    )
}

/// A complete HTTP response.
#[derive(Debug)]
struct Response {
    status: u16,
    status_line: String,
    body: Vec<u8>,
}

/// Parses `buf` as a response: `Ok(None)` when more bytes are needed (`eof`: no more will come,
/// so a body without a length ends here).
fn parse_response(buf: &[u8], eof: bool) -> Result<Option<Response>, String> {
    let mut start = 0;
    loop {
        let rest = &buf[start..];
        let Some(end) = find(rest, b"\r\n\r\n") else {
            return Ok(None);
        };
        let head = String::from_utf8_lossy(&rest[..end]);
        let mut lines = head.split("\r\n");
        let status_line = lines.next().unwrap_or_default().to_string();
        let status = status_line
            .strip_prefix("HTTP/1.")
            .and_then(|s| s.get(2..5))
            .and_then(|s| s.parse::<u16>().ok())
            .ok_or_else(|| format!("not an HTTP response: `{}`", excerpt(&status_line, 100)))?;
        let body_start = start + end + 4;
        if (100..200).contains(&status) {
            start = body_start; // 100 Continue and friends: a final response follows
            continue;
        }
        let mut length = None;
        let mut chunked = false;
        for line in lines {
            let Some((key, value)) = line.split_once(':') else {
                continue;
            };
            let value = value.trim();
            if key.trim().eq_ignore_ascii_case("content-length") {
                length = Some(
                    value
                        .parse::<usize>()
                        .map_err(|_| format!("bad Content-Length `{value}`"))?,
                );
            } else if key.trim().eq_ignore_ascii_case("transfer-encoding") {
                chunked = value.to_ascii_lowercase().contains("chunked");
            }
        }
        let body = &buf[body_start..];
        let body = if chunked {
            match decode_chunked(body)? {
                Some(b) => b,
                None if eof => {
                    return Err("the connection closed inside a chunked body".to_string())
                }
                None => return Ok(None),
            }
        } else if let Some(n) = length {
            if body.len() < n {
                return if eof {
                    Err(format!("the body ended after {} of {n} bytes", body.len()))
                } else {
                    Ok(None)
                };
            }
            body[..n].to_vec()
        } else if eof || status == 204 || status == 304 {
            body.to_vec()
        } else {
            return Ok(None);
        };
        return Ok(Some(Response {
            status,
            status_line,
            body,
        }));
    }
}

/// Decodes a chunked body; `Ok(None)` while incomplete.
fn decode_chunked(mut data: &[u8]) -> Result<Option<Vec<u8>>, String> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = find(data, b"\r\n") else {
            return Ok(None);
        };
        let size_text = String::from_utf8_lossy(&data[..eol]);
        let size_hex = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_hex, 16)
            .map_err(|_| format!("bad chunk size `{size_hex}`"))?;
        data = &data[eol + 2..];
        if size == 0 {
            // Trailers end with an empty line.
            return Ok(
                if data.starts_with(b"\r\n") || find(data, b"\r\n\r\n").is_some() {
                    Some(out)
                } else {
                    None
                },
            );
        }
        if data.len() < size.saturating_add(2) {
            return Ok(None);
        }
        out.extend_from_slice(&data[..size]);
        data = &data[size + 2..];
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

impl Reward for HttpReward {
    fn name(&self) -> &str {
        &self.name
    }

    fn score(&mut self, batch: &[Sample<'_>]) -> Result<RewardOutput, RewardError> {
        if batch.is_empty() {
            return Ok(RewardOutput::default());
        }
        let body = self.post(&samples_body(batch))?;
        let text = String::from_utf8_lossy(&body);
        parse_scores_body(&text, batch.len()).map_err(|m| RewardError::Protocol {
            reward: self.name.clone(),
            message: format!("POST {}: {m}", self.url),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let u = parse_url("http://127.0.0.1:8000/score?x=1#frag").unwrap();
        assert_eq!(
            u,
            Url {
                host: "127.0.0.1".into(),
                port: 8000,
                path: "/score?x=1".into()
            }
        );
        let u = parse_url("HTTP://localhost").unwrap();
        assert_eq!(
            u,
            Url {
                host: "localhost".into(),
                port: 80,
                path: "/".into()
            }
        );
        let u = parse_url("http://[::1]:9/a").unwrap();
        assert_eq!(
            u,
            Url {
                host: "::1".into(),
                port: 9,
                path: "/a".into()
            }
        );
        assert!(parse_url("https://x")
            .unwrap_err()
            .contains("no TLS dependency"));
        assert!(parse_url("ftp://x")
            .unwrap_err()
            .contains("must start with http://"));
        assert!(parse_url("http://x:99999/").unwrap_err().contains("port"));
        assert!(parse_url("http:///a").unwrap_err().contains("no host"));
    }

    #[test]
    fn responses() {
        let r = parse_response(
            b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nabcdEXTRA",
            false,
        )
        .unwrap()
        .unwrap();
        assert_eq!((r.status, r.body.as_slice()), (200, &b"abcd"[..]));
        assert!(
            parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nab", false)
                .unwrap()
                .is_none()
        );
        assert!(parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nab", true).is_err());
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n";
        assert_eq!(
            parse_response(chunked, false).unwrap().unwrap().body,
            b"abcde"
        );
        assert!(parse_response(&chunked[..chunked.len() - 2], false)
            .unwrap()
            .is_none());
        let r = parse_response(
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.0 500 Oops\r\n\r\nboom",
            true,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (r.status, r.status_line.as_str(), r.body.as_slice()),
            (500, "HTTP/1.0 500 Oops", &b"boom"[..])
        );
        assert!(parse_response(b"SSH-2.0-OpenSSH\r\n\r\n", false)
            .unwrap_err()
            .contains("not an HTTP response"));
    }
}
