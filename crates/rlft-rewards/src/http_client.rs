//! A minimal HTTP/1.1 client on `std::net::TcpStream`, shared by the `http` reward and by
//! rlft's rollout client (`rollout_servers`): one connection per request
//! (`Connection: close`), `Content-Length` or chunked responses, and one deadline covering name
//! resolution, connecting, sending and reading.
//!
//! Plain `http://` only: `https://` would need a TLS stack (rustls or OpenSSL) as a dependency of
//! every rlft build, for what is usually a server on the same machine or private network.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::error::excerpt;

/// Largest response accepted.
const MAX_RESPONSE: usize = 64 << 20;

/// The parts of an `http://` URL this client needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Url {
    /// Host name or address (IPv6 without brackets).
    pub host: String,
    /// Port (80 when the URL has none).
    pub port: u16,
    /// Path and query, starting with `/`.
    pub path: String,
}

/// Parses an `http://` URL; the error says what is wrong with it.
pub fn parse_url(url: &str) -> Result<Url, String> {
    let lower = url.to_ascii_lowercase();
    if lower.starts_with("https://") {
        return Err(format!(
            "`url` {url:?} uses https, which is not supported: rlft has no TLS dependency. \
             Serve over plain http (e.g. on 127.0.0.1) or put a local http proxy in front of it"
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

/// Why a request got no complete response.
#[derive(Debug, Clone, PartialEq)]
pub enum HttpError {
    /// The deadline passed while `stage` (e.g. "connecting", "reading the response").
    Timeout {
        /// What was being done.
        stage: &'static str,
    },
    /// Connecting, sending or reading failed, or the answer is not HTTP.
    Failed(String),
}

impl std::fmt::Display for HttpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HttpError::Timeout { stage } => write!(f, "timed out while {stage}"),
            HttpError::Failed(m) => f.write_str(m),
        }
    }
}

/// A complete HTTP response.
#[derive(Debug)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// The status line, e.g. `HTTP/1.1 404 Not Found`.
    pub status_line: String,
    /// The body (chunked encoding undone).
    pub body: Vec<u8>,
}

impl Url {
    /// Sends `method path` with `body` (as JSON when given) and reads the whole response, all
    /// within `timeout`. Any status is a response; the caller decides what a 4xx/5xx means.
    pub fn request(
        &self,
        method: &str,
        body: Option<&[u8]>,
        timeout: Duration,
    ) -> Result<Response, HttpError> {
        self.request_with(method, body, &[], timeout)
    }

    /// [`Url::request`] with extra header lines `(name, value)`, e.g. `Authorization`; a
    /// value with a line break is refused (it would start another header). Values are never
    /// part of an error message.
    pub fn request_with(
        &self,
        method: &str,
        body: Option<&[u8]>,
        headers: &[(&str, &str)],
        timeout: Duration,
    ) -> Result<Response, HttpError> {
        let head = self.head(method, body.map(<[u8]>::len), headers)?;
        let deadline = Instant::now() + timeout;
        let left = || {
            deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1))
        };
        let timed_out = |stage| HttpError::Timeout { stage };
        let addrs = self.resolve(left())?;
        let mut stream = None;
        let mut last_error = None;
        for addr in addrs {
            if Instant::now() >= deadline {
                return Err(timed_out("connecting"));
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
            (None, Some(e)) if is_timeout(&e) => return Err(timed_out("connecting")),
            (None, e) => {
                let why = e.map_or("no address".to_string(), |e| e.to_string());
                return Err(HttpError::Failed(format!(
                    "cannot connect ({why}); is the server running?"
                )));
            }
        };
        let _ = stream.set_nodelay(true);
        let io = |e: std::io::Error, stage: &'static str| {
            if is_timeout(&e) {
                timed_out(stage)
            } else {
                HttpError::Failed(format!("{stage} failed: {e}"))
            }
        };
        stream
            .set_write_timeout(Some(left()))
            .map_err(|e| io(e, "sending"))?;
        stream
            .write_all(head.as_bytes())
            .map_err(|e| io(e, "sending"))?;
        if let Some(b) = body {
            stream.write_all(b).map_err(|e| io(e, "sending"))?;
        }
        let mut buf = Vec::new();
        let mut chunk = vec![0u8; 64 << 10];
        loop {
            if let Some(response) = parse_response(&buf, false).map_err(HttpError::Failed)? {
                return Ok(response);
            }
            if Instant::now() >= deadline {
                return Err(timed_out("reading the response"));
            }
            stream
                .set_read_timeout(Some(left()))
                .map_err(|e| io(e, "reading the response"))?;
            match stream.read(&mut chunk) {
                Ok(0) => {
                    return parse_response(&buf, true)
                        .map_err(HttpError::Failed)?
                        .ok_or_else(|| {
                            HttpError::Failed(format!(
                                "the server closed the connection after {} bytes, before a \
                                 complete response",
                                buf.len()
                            ))
                        });
                }
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io(e, "reading the response")),
            }
            if buf.len() > MAX_RESPONSE {
                return Err(HttpError::Failed(format!(
                    "response larger than {} MiB",
                    MAX_RESPONSE >> 20
                )));
            }
        }
    }

    /// The request line and headers (a JSON body of `body_len` bytes when given).
    fn head(
        &self,
        method: &str,
        body_len: Option<usize>,
        headers: &[(&str, &str)],
    ) -> Result<String, HttpError> {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        let mut extra = match body_len {
            Some(n) => format!("Content-Type: application/json\r\nContent-Length: {n}\r\n"),
            None => String::new(),
        };
        for (name, value) in headers {
            if [name, value].iter().any(|s| s.contains(['\r', '\n'])) {
                return Err(HttpError::Failed(format!(
                    "header `{}` has a line break",
                    name.escape_debug()
                )));
            }
            extra.push_str(&format!("{name}: {value}\r\n"));
        }
        Ok(format!(
            "{method} {} HTTP/1.1\r\nHost: {host}:{}\r\nUser-Agent: rlft\r\n{extra}Accept: \
             application/json\r\nConnection: close\r\n\r\n",
            self.path, self.port,
        ))
    }

    /// Resolves the host in a helper thread so that a slow resolver cannot outlast the deadline.
    fn resolve(&self, within: Duration) -> Result<Vec<SocketAddr>, HttpError> {
        let (tx, rx) = mpsc::channel();
        let target = (self.host.clone(), self.port);
        thread::Builder::new()
            .name("http-resolve".into())
            .spawn(move || {
                let _ = tx.send(target.to_socket_addrs().map(Vec::from_iter));
            })
            .map_err(|e| HttpError::Failed(format!("cannot start a thread: {e}")))?;
        match rx.recv_timeout(within) {
            Ok(Ok(addrs)) if !addrs.is_empty() => Ok(addrs),
            Ok(Ok(_)) => Err(HttpError::Failed(format!(
                "host `{}` has no address",
                self.host
            ))),
            Ok(Err(e)) => Err(HttpError::Failed(format!(
                "cannot resolve host `{}`: {e}",
                self.host
            ))),
            Err(_) => Err(HttpError::Timeout {
                stage: "resolving the host name",
            }),
        }
    }
}

impl Response {
    /// The body of a 2xx answer; otherwise the status line and an excerpt of the body.
    pub fn ok(self) -> Result<Vec<u8>, String> {
        if (200..300).contains(&self.status) {
            Ok(self.body)
        } else {
            let body = String::from_utf8_lossy(&self.body);
            Err(format!(
                "the server answered `{}`: {}",
                self.status_line,
                excerpt(body.trim(), 300)
            ))
        }
    }
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
    )
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
    fn extra_headers_go_in_the_head_and_line_breaks_are_refused() {
        let u = parse_url("http://127.0.0.1:8000/v1/models").unwrap();
        let head = u
            .head("GET", None, &[("Authorization", "Bearer k")])
            .unwrap();
        assert!(head.starts_with("GET /v1/models HTTP/1.1\r\n"), "{head}");
        assert!(head.contains("\r\nAuthorization: Bearer k\r\n"), "{head}");
        assert!(head.ends_with("\r\n\r\n") && !head.contains("Content-Length"));
        let e = u
            .head("GET", Some(2), &[("Authorization", "Bearer k\r\nX: y")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("line break") && !e.contains("Bearer"), "{e}");
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
