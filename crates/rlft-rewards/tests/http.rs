//! The `http` reward against a tiny in-test HTTP server on 127.0.0.1.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use rlft_rewards::{build_reward, Reward, RewardError, Sample};
use serde_json::{json, Value};

type Handler = dyn Fn(&str, &Value) -> Option<Vec<u8>> + Send + Sync;

/// Serves every connection with `handler(request head, JSON body)`; `None` closes the connection
/// without an answer. Returns the base URL and the heads of the requests seen.
fn serve(handler: Box<Handler>) -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/score", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    let handler: Arc<Handler> = Arc::from(handler);
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let (handler, log) = (Arc::clone(&handler), Arc::clone(&log));
            thread::spawn(move || handle(stream, &*handler, &log));
        }
    });
    (url, seen)
}

fn handle(mut stream: TcpStream, handler: &Handler, log: &Mutex<Vec<String>>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let (head, body) = loop {
        let n = stream.read(&mut chunk).unwrap_or(0);
        if n == 0 {
            return;
        }
        buf.extend_from_slice(&chunk[..n]);
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
        let length: usize = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length:")
                    .map(|v| v.trim().parse().unwrap())
            })
            .unwrap_or(0);
        if buf.len() >= end + 4 + length {
            break (
                head,
                serde_json::from_slice::<Value>(&buf[end + 4..end + 4 + length]).unwrap(),
            );
        }
    };
    log.lock().unwrap().push(head.clone());
    if let Some(response) = handler(&head, &body) {
        let _ = stream.write_all(&response);
    }
}

fn ok_json(body: &Value) -> Vec<u8> {
    let body = body.to_string();
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn reward(url: &str, timeout_s: f64) -> Box<dyn Reward> {
    let spec = serde_json::from_value(
        json!({"type": "http", "name": "web", "url": url, "timeout_s": timeout_s}),
    );
    build_reward(&spec.unwrap()).unwrap()
}

fn samples<'a>(completions: &[&'a str], row: &'a Value) -> Vec<Sample<'a>> {
    completions
        .iter()
        .map(|c| Sample {
            prompt: "P",
            completion: c,
            row,
            completion_ids: &[],
            completion_tokens: 3,
            truncated: false,
            environment_reward: None,
        })
        .collect()
}

#[test]
fn good_server_content_length_and_chunked() {
    let (url, seen) = serve(Box::new(|_, body| {
        let samples = body["samples"].as_array().unwrap();
        let scores: Vec<Value> = samples
            .iter()
            .map(|s| match s["completion"].as_str().unwrap() {
                "skip" => Value::Null,
                c => json!({"score": c.len(), "parts": {"tokens": s["completion_tokens"]}}),
            })
            .collect();
        let body = json!({ "scores": scores }).to_string();
        if samples.len() == 1 {
            // Chunked, in two chunks.
            let (a, b) = body.split_at(body.len() / 2);
            let wire = format!(
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{a}\r\n{:x}\r\n{b}\r\n0\r\n\r\n",
                a.len(),
                b.len()
            );
            return Some(wire.into_bytes());
        }
        Some(ok_json(&serde_json::from_str(&body).unwrap()))
    }));
    let mut r = reward(&url, 5.0);
    let row = json!({"answer": "1"});
    let out = r.score(&samples(&["ab", "skip", "abcd"], &row)).unwrap();
    assert_eq!(out.scores, vec![Some(2.0), None, Some(4.0)]);
    assert_eq!(out.part("tokens").unwrap()[0], 3.0);
    let out = r.score(&samples(&["xyz"], &row)).unwrap();
    assert_eq!(out.scores, vec![Some(3.0)]);
    let heads = seen.lock().unwrap();
    assert_eq!(heads.len(), 2);
    assert!(
        heads[0].starts_with("POST /score HTTP/1.1\r\n"),
        "{}",
        heads[0]
    );
    assert!(
        heads[0].contains("Content-Type: application/json"),
        "{}",
        heads[0]
    );
}

#[test]
fn error_status_garbage_and_wrong_count() {
    let (url, _) = serve(Box::new(|_, body| {
        let first = body["samples"][0]["completion"]
            .as_str()
            .unwrap()
            .to_string();
        Some(match first.as_str() {
            "500" => {
                b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 14\r\n\r\nmodel exploded"
                    .to_vec()
            }
            "html" => b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\n<html>".to_vec(),
            _ => ok_json(&json!({"scores": [1, 2, 3]})),
        })
    }));
    let mut r = reward(&url, 5.0);
    let row = json!({});
    let err = r.score(&samples(&["500"], &row)).unwrap_err();
    assert!(matches!(err, RewardError::Http { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("HTTP/1.1 500 Internal Server Error") && msg.contains("model exploded"),
        "{msg}"
    );
    let msg = r.score(&samples(&["html"], &row)).unwrap_err().to_string();
    assert!(
        msg.contains("invalid JSON") && msg.contains("<html>"),
        "{msg}"
    );
    let msg = r
        .score(&samples(&["x", "y"], &row))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("with 2 entries") && msg.contains("got 3 entries"),
        "{msg}"
    );
}

#[test]
fn slow_server_times_out() {
    let (url, _) = serve(Box::new(|_, _| {
        thread::sleep(Duration::from_secs(3));
        Some(ok_json(&json!({"scores": [1]})))
    }));
    let mut r = reward(&url, 0.5);
    let row = json!({});
    let start = Instant::now();
    let err = r.score(&samples(&["a"], &row)).unwrap_err();
    let elapsed = start.elapsed();
    assert!(matches!(err, RewardError::Timeout { .. }), "{err}");
    assert!(
        elapsed >= Duration::from_millis(500) && elapsed < Duration::from_millis(1500),
        "{elapsed:?}"
    );
    assert!(err.to_string().contains("reading the response"), "{err}");
}

#[test]
fn closed_and_refused_connections() {
    let (url, _) = serve(Box::new(|_, _| None));
    let row = json!({});
    let msg = reward(&url, 5.0)
        .score(&samples(&["a"], &row))
        .unwrap_err()
        .to_string();
    assert!(msg.contains("closed the connection after 0 bytes"), "{msg}");

    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let msg = reward(&format!("http://127.0.0.1:{port}/"), 5.0)
        .score(&samples(&["a"], &row))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("cannot connect") && msg.contains("is the reward server running?"),
        "{msg}"
    );
}
