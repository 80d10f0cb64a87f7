//! `rlft serve` end to end on the default model: a real server on 127.0.0.1 (port 0, the
//! printed address) and a real HTTP client (curl). Greedy and seeded answers equal `rlft
//! generate`'s tokens, streams concatenate to the plain answer, concurrent requests batch
//! without changing a seeded answer, bad requests get OpenAI-shaped errors while the server
//! keeps serving, LoRA adapters load and unload at run time (from under the directory
//! `--allow-runtime-lora` names, only), `--api-key` / `RLFT_API_KEY` guard every endpoint but
//! `/health`, and Ctrl-C drains.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

#[path = "../../../tests/fixtures.rs"]
mod fixtures;

/// A running `rlft serve`, interrupted (SIGKILL) when dropped.
struct Server {
    child: Child,
    url: String,
    log: Arc<Mutex<String>>,
}

impl Server {
    /// Starts `rlft serve --model <default> --served-model-name smol --port 0 ARGS` and waits
    /// for its address.
    fn start(args: &[&str]) -> Server {
        Self::start_with_env(args, &[])
    }

    /// [`Server::start`] with extra environment variables (and `RLFT_API_KEY` unset unless
    /// given).
    fn start_with_env(args: &[&str], env: &[(&str, &str)]) -> Server {
        let model = fixtures::default_model().display().to_string();
        let mut child = Command::new(env!("CARGO_BIN_EXE_rlft"))
            .args(["serve", "--model", &model, "--served-model-name", "smol"])
            .args(["--port", "0"])
            .args(args)
            .env_remove("RLFT_API_KEY")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start rlft serve");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let log = Arc::new(Mutex::new(String::new()));
        let url = loop {
            let line = match lines.next() {
                Some(Ok(l)) => l,
                _ => panic!(
                    "rlft serve exited before listening: {}",
                    log.lock().unwrap()
                ),
            };
            log.lock().unwrap().push_str(&line);
            log.lock().unwrap().push('\n');
            if let Some(rest) = line.strip_prefix("listening on ") {
                break rest.split_whitespace().next().unwrap().to_string();
            }
        };
        let l = log.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                let mut l = l.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
        Server { child, url, log }
    }

    /// `curl` with `body` on stdin (POST) or none (GET): the status and the body.
    fn request(&self, path: &str, body: Option<&[u8]>) -> (u16, String) {
        self.request_with(path, body, &[])
    }

    /// [`Server::request`] with extra header lines (`"Authorization: Bearer KEY"`).
    fn request_with(&self, path: &str, body: Option<&[u8]>, headers: &[&str]) -> (u16, String) {
        let mut cmd = Command::new("curl");
        cmd.args(["-sS", "-o", "-", "-w", "\n%{http_code}"]);
        for h in headers {
            cmd.args(["-H", h]);
        }
        if body.is_some() {
            cmd.args([
                "-H",
                "content-type: application/json",
                "--data-binary",
                "@-",
            ]);
        }
        let mut child = cmd
            .arg(format!("{}{path}", self.url))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("curl is installed");
        let mut stdin = child.stdin.take().unwrap();
        let data = body.map(<[u8]>::to_vec).unwrap_or_default();
        // A rejected body may not be read to its end: a write error is expected then.
        let writer = std::thread::spawn(move || {
            let _ = stdin.write_all(&data);
        });
        let out = child.wait_with_output().unwrap();
        writer.join().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').expect("curl prints the status last");
        let code = code.trim().parse().unwrap_or_else(|_| {
            panic!(
                "curl failed: {}{}",
                text,
                String::from_utf8_lossy(&out.stderr)
            )
        });
        (code, body.to_string())
    }

    /// POSTs JSON and parses the JSON answer.
    fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let (code, text) = self.request(path, Some(body.to_string().as_bytes()));
        let v = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (code, v)
    }

    /// POSTs JSON expecting 200.
    fn ok(&self, path: &str, body: &Value) -> Value {
        let (code, v) = self.post(path, body);
        assert_eq!(code, 200, "{path}: {v}");
        v
    }

    /// A streamed request: the `data:` payloads in order.
    fn stream(&self, path: &str, body: &Value) -> Vec<String> {
        let out = Command::new("curl")
            .args(["-sSN", "-H", "content-type: application/json", "-d"])
            .arg(body.to_string())
            .arg(format!("{}{path}", self.url))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .filter_map(|l| l.strip_prefix("data: ").map(str::to_string))
            .collect()
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Sends SIGINT (Ctrl-C).
    fn interrupt(&self) {
        let ok = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -INT");
    }

    /// Waits for the process to exit (at most `secs`); its exit status.
    fn wait(&mut self, secs: u64) -> std::process::ExitStatus {
        let t0 = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(secs),
                "rlft serve did not stop: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn chat(content: &str, extra: Value) -> Value {
    let mut v = json!({"model": "smol", "messages": [{"role": "user", "content": content}]});
    v.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    v
}

/// `rlft generate --json ARGS` on the default model: token ids per output line.
fn generate(args: &[&str]) -> Vec<Vec<u64>> {
    let model = fixtures::default_model().display().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_rlft"))
        .args(["generate", "--model", &model, "--json"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            ids(&v["token_ids"])
        })
        .collect()
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap_or_else(|| panic!("no token ids in {v}"))
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

#[test]
fn answers_equal_rlft_generate_and_streams_match() {
    let s = Server::start(&[]);
    let (code, models) = s.request("/v1/models", None);
    assert_eq!(code, 200);
    let models: Value = serde_json::from_str(&models).unwrap();
    assert_eq!(models["data"][0]["id"], "smol");
    assert_eq!(s.request("/health", None).0, 200);

    // Greedy chat: the same tokens as `rlft generate --chat --greedy`.
    for q in [
        "What is the capital of France?",
        "Write a haiku about rain.",
    ] {
        let want = generate(&["--chat", "--greedy", "--max-new-tokens", "48", q]);
        let v = s.ok(
            "/v1/chat/completions",
            &chat(
                q,
                json!({"temperature": 0, "max_tokens": 48, "return_token_ids": true}),
            ),
        );
        assert_eq!(ids(&v["choices"][0]["token_ids"]), want[0], "{q}: {v}");
        let n = want[0].len() as u64;
        assert_eq!(v["usage"]["completion_tokens"], n);
        assert_eq!(
            v["choices"][0]["finish_reason"],
            if n < 48 { "stop" } else { "length" }
        );
    }

    // Seeded sampling, n = 2: the same tokens as `rlft generate --seed 7 -n 2`.
    let want = generate(&[
        "--chat",
        "--seed",
        "7",
        "--temperature",
        "0.8",
        "-n",
        "2",
        "--max-new-tokens",
        "24",
        "Tell me a joke",
    ]);
    let body = chat(
        "Tell me a joke",
        json!({"temperature": 0.8, "seed": 7, "n": 2, "max_tokens": 24, "return_token_ids": true}),
    );
    let v = s.ok("/v1/chat/completions", &body);
    for (i, w) in want.iter().enumerate() {
        assert_eq!(&ids(&v["choices"][i]["token_ids"]), w, "sample {i}");
    }

    // A raw completion: `rlft generate` without --chat.
    let want = generate(&[
        "--greedy",
        "--max-new-tokens",
        "16",
        "The three primary colours are",
    ]);
    let v = s.ok(
        "/v1/completions",
        &json!({"model": "smol", "prompt": "The three primary colours are", "max_tokens": 16,
                "temperature": 0, "return_token_ids": true, "logprobs": 2}),
    );
    assert_eq!(ids(&v["choices"][0]["token_ids"]), want[0]);
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), want[0].len());
    // Greedy: each token is the most likely one, with its log-probability.
    for (i, t) in lp["token_logprobs"].as_array().unwrap().iter().enumerate() {
        let top = lp["top_logprobs"][i].as_object().unwrap();
        assert_eq!(top.len(), 2);
        let best = top
            .values()
            .map(|x| x.as_f64().unwrap())
            .fold(f64::MIN, f64::max);
        assert!((t.as_f64().unwrap() - best).abs() < 1e-6, "{lp}");
    }

    // The stream: role chunk, deltas that concatenate to the plain answer, the finish reason,
    // the usage chunk, [DONE].
    let body = chat(
        "Name three fruits.",
        json!({"temperature": 0, "max_tokens": 40}),
    );
    let plain = s.ok("/v1/chat/completions", &body);
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let events = s.stream("/v1/chat/completions", &streamed);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(
        text,
        plain["choices"][0]["message"]["content"].as_str().unwrap()
    );
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"].as_array().unwrap().len(), 0);
    assert_eq!(usage["usage"], plain["usage"]);
    let finish = &chunks[chunks.len() - 2]["choices"][0]["finish_reason"];
    assert_eq!(finish, &plain["choices"][0]["finish_reason"]);
}

#[test]
fn concurrent_requests_share_the_batch_and_seeds_hold() {
    let s = Arc::new(Server::start(&[]));
    let seeded = chat(
        "Tell me a story about a cat.",
        json!({"temperature": 0.9, "seed": 11, "max_tokens": 40, "return_token_ids": true}),
    );
    let alone = s.ok("/v1/chat/completions", &seeded);
    // Eight requests of three samples each, and the seeded one again in the middle of them.
    let others: Vec<_> = (0..8)
        .map(|i| {
            let s = s.clone();
            std::thread::spawn(move || {
                let b = chat(
                    &format!("Question {i}: why is the sky blue?"),
                    json!({"max_tokens": 32, "n": 3, "seed": i}),
                );
                s.ok("/v1/chat/completions", &b)
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let batched = s.ok("/v1/chat/completions", &seeded);
    for o in others {
        let v = o.join().unwrap();
        assert_eq!(v["choices"].as_array().unwrap().len(), 3);
    }
    assert_eq!(
        alone["choices"][0]["token_ids"], batched["choices"][0]["token_ids"],
        "a seeded request gives the same tokens alone and in a batch"
    );
}

#[test]
fn bad_requests_get_openai_errors_and_the_server_keeps_serving() {
    let s = Server::start(&[]);
    let err = |code: u16, v: &Value, want: u16, what: &str| {
        assert_eq!(code, want, "{what}: {v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{what}: {v}"
        );
        assert!(v["error"]["type"].is_string(), "{what}: {v}");
    };
    let (code, text) = s.request(
        "/v1/chat/completions",
        Some(b"{\"model\": \"smol\", messages"),
    );
    err(
        code,
        &serde_json::from_str(&text).unwrap(),
        400,
        "malformed JSON",
    );
    let (code, v) = s.post("/v1/chat/completions", &json!({"model": "smol"}));
    err(code, &v, 400, "no messages");
    let mut body = chat("hi", json!({}));
    body["model"] = json!("nope");
    let (code, v) = s.post("/v1/chat/completions", &body);
    err(code, &v, 404, "unknown model");
    assert_eq!(v["error"]["code"], "model_not_found");
    let (code, v) = s.post(
        "/v1/chat/completions",
        &chat("hi", json!({"max_tokens": 100000})),
    );
    err(code, &v, 400, "max_tokens beyond the context");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("maximum context length"));
    let (code, v) = s.post("/v1/chat/completions", &chat("hi", json!({"n": 0})));
    err(code, &v, 400, "n = 0");
    let (code, v) = s.post(
        "/v1/chat/completions",
        &chat("hi", json!({"temperature": -1})),
    );
    err(code, &v, 400, "negative temperature");
    let big = format!(
        "{{\"model\": \"smol\", \"prompt\": \"{}\"}}",
        "a".repeat(10 << 20)
    );
    let (code, text) = s.request("/v1/completions", Some(big.as_bytes()));
    err(
        code,
        &serde_json::from_str(&text).unwrap(),
        413,
        "10 MB body",
    );

    // A client that leaves mid-stream: its sequence leaves the batch.
    let long = chat(
        "Tell me a very long story.",
        json!({"max_tokens": 2000, "ignore_eos": true, "stream": true}),
    );
    let out = Command::new("curl")
        .args(["-sSN", "--max-time", "1.5", "-d"])
        .arg(long.to_string())
        .arg(format!("{}/v1/chat/completions", s.url))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(28), "curl timed out mid-stream");
    assert!(String::from_utf8_lossy(&out.stdout).contains("data: "));
    let t0 = Instant::now();
    while !s.log().contains("cancelled") {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "no cancel logged: {}",
            s.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // And the server still answers.
    let v = s.ok(
        "/v1/chat/completions",
        &chat("Say hello.", json!({"max_tokens": 8})),
    );
    assert!(v["choices"][0]["message"]["content"].is_string());
    assert_eq!(s.request("/health", None).0, 200);
}

#[test]
fn a_full_queue_gets_429() {
    let s = Arc::new(Server::start(&["--max-num-seqs", "1", "--max-queue", "1"]));
    let long = chat(
        "Tell me a long story.",
        json!({"max_tokens": 300, "ignore_eos": true}),
    );
    let spawn = |s: &Arc<Server>| {
        let (s, b) = (s.clone(), long.clone());
        std::thread::spawn(move || s.post("/v1/chat/completions", &b).0)
    };
    let running = spawn(&s);
    std::thread::sleep(Duration::from_millis(500));
    let queued = spawn(&s);
    std::thread::sleep(Duration::from_millis(500));
    let (code, v) = s.post("/v1/chat/completions", &long);
    assert_eq!(code, 429, "{v}");
    assert_eq!(v["error"]["code"], "queue_full");
    assert_eq!(running.join().unwrap(), 200);
    assert_eq!(queued.join().unwrap(), 200);
}

/// A PEFT adapter on the default model with random `A` and `B` (so it changes the output).
fn write_adapter(dir: &Path) {
    let opts = rlft_model::load::LoadOptions {
        device: candle_core::Device::Cpu,
        dtype: candle_core::DType::F32,
        ..Default::default()
    };
    let mut m = rlft_model::load_model(fixtures::default_model(), &opts).unwrap();
    let cfg = rlft_model::LoraConfig {
        r: 4,
        lora_alpha: 32.0,
        target_modules: vec!["q_proj".into(), "v_proj".into(), "down_proj".into()],
        init_lora_weights: false,
        seed: 5,
        ..Default::default()
    };
    rlft_model::lora::attach_lora(&mut m.model, &cfg).unwrap();
    rlft_model::peft::save_adapter(&m.model, &cfg, dir, None).unwrap();
}

#[test]
fn lora_adapters_serve_by_name_and_load_at_run_time() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("adapter");
    write_adapter(&dir);
    let arg = format!("tuned={}", dir.display());
    let root = tmp.path().display().to_string();
    let s = Server::start(&["--lora", &arg, "--allow-runtime-lora", &root]);
    let (_, models) = s.request("/v1/models", None);
    let models: Value = serde_json::from_str(&models).unwrap();
    assert_eq!(models["data"][1]["id"], "tuned");
    assert_eq!(models["data"][1]["parent"], "smol");

    let ask = |model: &str| {
        let mut b = chat(
            "What is 2+2?",
            json!({"temperature": 0, "max_tokens": 12,
                                                "return_token_ids": true}),
        );
        b["model"] = json!(model);
        s.post("/v1/chat/completions", &b)
    };
    let (_, base) = ask("smol");
    let (code, tuned) = ask("tuned");
    assert_eq!(code, 200, "{tuned}");
    assert_ne!(
        base["choices"][0]["token_ids"],
        tuned["choices"][0]["token_ids"]
    );

    // vLLM's runtime endpoints: unload, load under another name, replace in place.
    let unload = |name: &str| s.post("/v1/unload_lora_adapter", &json!({"lora_name": name}));
    let load = |name: &str, inplace: bool| {
        s.post(
            "/v1/load_lora_adapter",
            &json!({"lora_name": name, "lora_path": dir.display().to_string(),
                    "load_inplace": inplace}),
        )
    };
    assert_eq!(unload("tuned").0, 200);
    assert_eq!(ask("tuned").0, 404);
    assert_eq!(unload("tuned").0, 404);
    assert_eq!(load("again", false).0, 200);
    let (_, again) = ask("again");
    assert_eq!(
        again["choices"][0]["token_ids"],
        tuned["choices"][0]["token_ids"]
    );
    let (code, v) = load("again", false);
    assert_eq!(code, 400, "a taken name without load_inplace: {v}");
    assert_eq!(load("again", true).0, 200);
    assert_eq!(load("smol", true).0, 400, "the base cannot be replaced");
    let (code, v) = s.post(
        "/v1/load_lora_adapter",
        &json!({"lora_name": "x", "lora_path": tmp.path().join("missing").display().to_string()}),
    );
    assert_eq!(code, 400, "{v}");
    // Outside the directory --allow-runtime-lora names: refused, naming it.
    let (code, v) = s.post(
        "/v1/load_lora_adapter",
        &json!({"lora_name": "x", "lora_path": format!("{root}/../..")}),
    );
    assert_eq!(code, 403, "{v}");
    assert_eq!(v["error"]["code"], "lora_path_not_allowed");
    assert!(
        v["error"]["message"].as_str().unwrap().contains(&root),
        "{v}"
    );
    assert!(s.log().contains("loaded LoRA adapter `again`"));
    assert!(s.log().contains("runtime LoRA loading on"), "{}", s.log());
}

#[test]
fn runtime_adapter_loading_is_off_by_default() {
    let s = Server::start(&[]);
    let (code, v) = s.post(
        "/v1/load_lora_adapter",
        &json!({"lora_name": "x", "lora_path": "/tmp"}),
    );
    assert_eq!(code, 403, "{v}");
    assert_eq!(v["error"]["code"], "runtime_lora_disabled");
    let (code, v) = s.post("/v1/unload_lora_adapter", &json!({"lora_name": "x"}));
    assert_eq!(code, 403, "{v}");
}

#[test]
fn an_api_key_guards_every_endpoint_but_health() {
    let body = chat("Say hi.", json!({"max_tokens": 4}));
    let body = body.to_string();
    let check = |s: &Server, key: &str| {
        let call = |headers: &[&str]| {
            let (code, text) =
                s.request_with("/v1/chat/completions", Some(body.as_bytes()), headers);
            (code, serde_json::from_str::<Value>(&text).unwrap())
        };
        let (code, v) = call(&[]);
        assert_eq!(code, 401, "{v}");
        assert_eq!(v["error"]["code"], "invalid_api_key");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        let (code, v) = call(&["Authorization: Bearer not-the-key"]);
        assert_eq!(code, 401, "{v}");
        let bearer = format!("Authorization: Bearer {key}");
        let (code, v) = call(&[&bearer]);
        assert_eq!(code, 200, "{v}");
        assert_eq!(s.request("/v1/models", None).0, 401);
        assert_eq!(s.request_with("/v1/models", None, &[&bearer]).0, 200);
        assert_eq!(s.request("/health", None).0, 200, "/health stays open");
        assert!(
            !s.log().contains(key),
            "the key is never logged: {}",
            s.log()
        );
    };
    check(
        &Server::start(&["--api-key", "flag-key-123"]),
        "flag-key-123",
    );
    check(
        &Server::start_with_env(&[], &[("RLFT_API_KEY", "env-key-456")]),
        "env-key-456",
    );
    // The flag wins over the environment.
    let s = Server::start_with_env(
        &["--api-key", "flag-key-123"],
        &[("RLFT_API_KEY", "env-key-456")],
    );
    check(&s, "flag-key-123");

    // No key on an address other machines reach: a warning; on loopback: none.
    let open = Server::start(&["--host", "0.0.0.0"]);
    assert!(
        open.log().contains("warning: listening on 0.0.0.0:") && open.log().contains("--api-key"),
        "{}",
        open.log()
    );
    assert!(!Server::start(&[]).log().contains("warning"));
    assert!(!Server::start(&["--host", "0.0.0.0", "--api-key", "k"])
        .log()
        .contains("warning"));
}

#[test]
fn ctrl_c_drains_then_stops() {
    let mut s = Server::start(&[]);
    let s_url = s.url.clone();
    // Long enough to be still running when the signal comes 400 ms in, on a fast host too.
    let long = chat(
        "Tell me a long story.",
        json!({"max_tokens": 400, "ignore_eos": true}),
    );
    let running = std::thread::spawn(move || {
        let out = Command::new("curl")
            .args(["-sS", "-d"])
            .arg(long.to_string())
            .arg(format!("{s_url}/v1/chat/completions"))
            .output()
            .unwrap();
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    });
    std::thread::sleep(Duration::from_millis(400));
    s.interrupt();
    std::thread::sleep(Duration::from_millis(200));
    let (code, v) = s.post(
        "/v1/chat/completions",
        &chat("hi", json!({"max_tokens": 4})),
    );
    assert_eq!(code, 503, "{v}");
    let v = running.join().unwrap();
    assert_eq!(
        v["usage"]["completion_tokens"], 400,
        "the running request finished: {v}"
    );
    assert!(s.wait(30).success(), "{}", s.log());
    assert!(
        s.log().contains("draining: 1 requests in flight"),
        "the signal came while the request ran: {}",
        s.log()
    );
}
