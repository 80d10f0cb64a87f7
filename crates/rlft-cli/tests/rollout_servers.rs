//! GRPO with rollouts on servers (`rollout_servers`; TRL: `use_vllm`, `vllm_mode = "server"`) end to end: two
//! real `rlft serve` processes on 127.0.0.1 (port 0, the printed address) serving a tiny random
//! model, and `rlft grpo` with LoRA sampling on both.
//!
//! - the metrics are those of an in-process run of the same config plus the
//!   importance-sampling stats (`sampling/*`) and the adapter push time;
//! - every step's adapter is hot-loaded on both servers (their logs), and the next rollout's
//!   sampler log-probs follow it: the trainer/sampler difference stays at float noise while
//!   the policy moves away from the base by far more (KL);
//! - killing one server mid-run moves its groups to the other and the run takes every step;
//! - with no server left the run stops with a clear error;
//! - servers with an API key: the trainer sends `rollout_server_api_key` and never writes it to its
//!   logs, `config.toml` or `run_summary.json`; a wrong key stops the run with a message about
//!   the key.
//!
//! The servers load adapters only from the trainer's `<output_dir>/rollout_adapters`
//! (`--allow-runtime-lora`), as docs/serve.md tells operators to start them.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rlft_model::config::Family;
use rlft_model::tiny::{save_tiny_hf_dir, tiny_config};
use serde_json::Value;

/// A running `rlft serve`, killed when dropped.
struct Server {
    child: Child,
    url: String,
    log: Arc<Mutex<String>>,
}

impl Server {
    /// `rlft serve` on the tiny model under `dir`, loading runtime adapters from the server
    /// run's `out_servers/rollout_adapters`, with `extra` arguments.
    fn start(dir: &Path, extra: &[&str]) -> Server {
        let model = dir.join("model");
        let adapters = dir.join("out_servers/rollout_adapters");
        let mut child = Command::new(env!("CARGO_BIN_EXE_rlft"))
            .args(["serve", "--model", model.to_str().unwrap(), "--port", "0"])
            .args(["--allow-runtime-lora", adapters.to_str().unwrap()])
            .args(extra)
            .env_remove("RLFT_API_KEY")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start rlft serve");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let log = Arc::new(Mutex::new(String::new()));
        let url = loop {
            let Some(Ok(line)) = lines.next() else {
                panic!(
                    "rlft serve exited before listening: {}",
                    log.lock().unwrap()
                );
            };
            log.lock().unwrap().push_str(&format!("{line}\n"));
            if let Some(rest) = line.strip_prefix("listening on ") {
                break rest.split_whitespace().next().unwrap().to_string();
            }
        };
        let l = log.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                l.lock().unwrap().push_str(&format!("{line}\n"));
            }
        });
        Server { child, url, log }
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// The adapter names this server loaded, in order.
    fn loaded(&self) -> Vec<String> {
        self.log()
            .lines()
            .filter_map(|l| l.strip_prefix("loaded LoRA adapter `"))
            .map(|l| l.split('`').next().unwrap().to_string())
            .collect()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A tiny random model, prompts and a GRPO config with LoRA; `servers` = the base URLs (empty:
/// the in-process rollout).
fn setup(dir: &Path, servers: &[&str], steps: usize) -> std::path::PathBuf {
    let model = dir.join("model");
    if !model.exists() {
        save_tiny_hf_dir(tiny_config(Family::Qwen2), 3, &model).unwrap();
        let rows: Vec<String> = (0..16)
            .map(|i| serde_json::json!({"prompt": format!("What is {i} + {}?", i % 5)}).to_string())
            .collect();
        std::fs::write(dir.join("prompts.jsonl"), rows.join("\n") + "\n").unwrap();
    }
    let urls: Vec<String> = servers.iter().map(|u| format!("{u:?}")).collect();
    let on_servers = if servers.is_empty() {
        String::new()
    } else {
        format!(
            "rollout_servers = [{}]\nrollout_server_timeout = 60\n",
            urls.join(", ")
        )
    };
    let out = dir.join(if servers.is_empty() {
        "out_local"
    } else {
        "out_servers"
    });
    let text = format!(
        r#"
model = "{model}"
output_dir = "{out}"
dataset = "{data}"
max_prompt_length = 64
max_completion_length = 12
num_generations = 4
per_device_train_batch_size = 8
gradient_accumulation_steps = 1
learning_rate = 5e-2
max_steps = {steps}
beta = 0.04
use_peft = true
report_to = ["jsonl"]
seed = 7
# The random model is peaked: a hot sampler gives groups with different rewards.
temperature = 30.0
{on_servers}
[lora]
r = 8
lora_alpha = 16

[[rewards]]
type = "regex_format"
pattern = "[a-z]"
"#,
        model = model.display(),
        out = out.display(),
        data = dir.join("prompts.jsonl").display(),
    );
    let cfg = dir.join(if servers.is_empty() {
        "local.toml"
    } else {
        "servers.toml"
    });
    std::fs::write(&cfg, text).unwrap();
    cfg
}

fn grpo(cfg: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rlft"));
    c.args(["grpo", "--config", cfg.to_str().unwrap()]);
    c.env_remove("RLFT_API_KEY");
    c
}

/// Adds `rollout_server_api_key = KEY` to the config at `cfg`.
fn with_key(cfg: &Path, key: &str) {
    let text = std::fs::read_to_string(cfg).unwrap();
    let text = text.replace(
        "rollout_server_timeout = 60\n",
        &format!("rollout_server_timeout = 60\nrollout_server_api_key = \"{key}\"\n"),
    );
    std::fs::write(cfg, text).unwrap();
}

fn ok(out: Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "rlft grpo failed: {err}");
    err
}

/// The per-step metrics of a run.
fn metrics(out_dir: &Path) -> Vec<serde_json::Map<String, Value>> {
    let text = std::fs::read_to_string(out_dir.join("metrics.jsonl")).unwrap();
    text.lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter_map(|v| v.as_object().cloned())
        .filter(|m| m.contains_key("loss"))
        .collect()
}

fn num(m: &serde_json::Map<String, Value>, k: &str) -> f64 {
    m.get(k)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("no {k} in {m:?}"))
}

#[test]
fn grpo_on_two_servers_matches_in_process_metrics_and_follows_the_adapter() {
    let tmp = tempfile::tempdir().unwrap();
    let steps = 3;
    let local = setup(tmp.path(), &[], steps);
    // Both servers want a key; the trainer sends it from its config.
    let key = "rollout-fleet-key-42";
    let (a, b) = (
        Server::start(tmp.path(), &["--api-key", key]),
        Server::start(tmp.path(), &["--api-key", key]),
    );
    let cfg = setup(tmp.path(), &[&a.url, &b.url], steps);
    with_key(&cfg, key);
    let err = ok(grpo(&cfg).output().unwrap());
    assert!(err.contains("rollouts on 2 server(s)"), "{err}");
    assert!(!err.contains(key), "the key is not logged");
    for f in ["config.toml", "run_summary.json"] {
        let text = std::fs::read_to_string(tmp.path().join("out_servers").join(f)).unwrap();
        assert!(!text.contains(key), "{f} holds the key in clear");
        assert!(text.contains("rollout_server_api_key"), "{f}: {text}");
    }
    ok(grpo(&local).output().unwrap());

    let served = metrics(&tmp.path().join("out_servers"));
    let inproc = metrics(&tmp.path().join("out_local"));
    assert_eq!((served.len(), inproc.len()), (steps, steps));
    // Same metrics in kind: the in-process keys, plus the sampler correction, the trainer's
    // own log-prob pass it needs (TRL runs it too) and the adapter push.
    let keys = |m: &serde_json::Map<String, Value>| {
        let mut k: Vec<String> = m.keys().cloned().collect();
        k.sort();
        k
    };
    let extra = [
        "sampling/importance_sampling_ratio/max",
        "sampling/importance_sampling_ratio/mean",
        "sampling/importance_sampling_ratio/min",
        "sampling/sampling_logp_difference/max",
        "sampling/sampling_logp_difference/mean",
        "time/old_logprobs",
        "time/push_adapter",
    ];
    for (s, l) in served.iter().zip(&inproc) {
        let mut want = keys(l);
        want.extend(extra.iter().map(|k| k.to_string()));
        want.sort();
        assert_eq!(keys(s), want);
        for k in ["reward", "reward_std", "kl", "loss"] {
            assert!(num(s, k).is_finite(), "{k}");
        }
    }
    // Every step's adapter reached both servers, in order.
    let names: Vec<String> = (0..steps).map(|s| format!("rlft-step-{s}")).collect();
    assert_eq!(a.loaded(), names, "server a: {}", a.log());
    assert_eq!(b.loaded(), names, "server b: {}", b.log());
    // ...and the rollouts sampled from it: the sampler's log-probs equal the trainer's up to
    // float noise at every step, while the trained adapter moved the policy far from the base
    // (a server still on the base, or a step behind, would differ by about that much).
    let last = served.last().unwrap();
    let kl = num(last, "kl");
    for m in &served {
        let diff = num(m, "sampling/sampling_logp_difference/max");
        eprintln!(
            "step {}: logp diff max {diff:e}, kl {}, reward {} std {} len {}",
            m["step"],
            num(m, "kl"),
            num(m, "reward"),
            num(m, "reward_std"),
            num(m, "completions/mean_length")
        );
        assert!(diff < 1e-3, "sampler vs trainer log-prob difference {diff}");
        let r = num(m, "sampling/importance_sampling_ratio/mean");
        assert!((r - 1.0).abs() < 1e-2, "IS ratio {r}");
    }
    assert!(
        kl > 1e-3,
        "the policy hardly moved (kl {kl}): the test shows nothing"
    );
}

#[test]
fn killing_a_server_mid_run_moves_its_work_to_the_other() {
    let tmp = tempfile::tempdir().unwrap();
    let steps = 5;
    setup(tmp.path(), &[], steps);
    let mut a = Server::start(tmp.path(), &[]);
    let b = Server::start(tmp.path(), &[]);
    let cfg = setup(tmp.path(), &[&a.url, &b.url], steps);
    let mut run = grpo(&cfg)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Kill server a once it holds step 2's adapter (the third rollout is on its way).
    let t0 = Instant::now();
    while !a.loaded().contains(&"rlft-step-2".to_string()) {
        assert!(t0.elapsed() < Duration::from_secs(300), "{}", a.log());
        if let Some(status) = run.try_wait().unwrap() {
            panic!("the run ended ({status}) before step 2: {}", a.log());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    let err = ok(run.wait_with_output().unwrap());
    assert!(
        err.contains(&format!("rollout server {} dropped", a.url)),
        "{err}"
    );
    let m = metrics(&tmp.path().join("out_servers"));
    let steps_logged: Vec<u64> = m.iter().map(|m| m["step"].as_u64().unwrap()).collect();
    assert_eq!(steps_logged, (1..=steps as u64).collect::<Vec<_>>());
    let names: Vec<String> = (0..steps).map(|s| format!("rlft-step-{s}")).collect();
    assert_eq!(b.loaded(), names, "{}", b.log());
    assert!(!a.loaded().contains(&"rlft-step-4".to_string()));
}

#[test]
fn a_wrong_api_key_stops_the_run_with_a_message_about_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    setup(tmp.path(), &[], 2);
    let s = Server::start(tmp.path(), &["--api-key", "the-right-key"]);
    let cfg = setup(tmp.path(), &[&s.url], 2);
    with_key(&cfg, "a-wrong-key");
    let out = grpo(&cfg).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("rollout_server_api_key"), "{err}");
    assert!(
        !err.contains("a-wrong-key") && !err.contains("the-right-key"),
        "{err}"
    );
    // No key at all: the same advice, from the environment's side too.
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(
        &cfg,
        text.replace("rollout_server_api_key = \"a-wrong-key\"\n", ""),
    )
    .unwrap();
    let out = grpo(&cfg).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("RLFT_API_KEY"), "{err}");
    // The key from the environment is enough to get past the check (the run itself is the
    // first test's business: one step here).
    let out = grpo(&cfg)
        .args(["--set", "max_steps=1"])
        .env("RLFT_API_KEY", "the-right-key")
        .output()
        .unwrap();
    ok(out);
}

#[test]
fn no_server_left_is_a_clear_error_and_no_step_is_taken() {
    let tmp = tempfile::tempdir().unwrap();
    setup(tmp.path(), &[], 2);
    // A port nothing listens on: bind one, then free it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let cfg = setup(tmp.path(), &[&format!("http://127.0.0.1:{port}")], 2);
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("rollout_server_timeout = 60", "rollout_server_timeout = 1");
    std::fs::write(&cfg, text).unwrap();
    let out = grpo(&cfg).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("no rollout server left"), "{err}");
    assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
    let metrics = tmp.path().join("out_servers/metrics.jsonl");
    let trained = std::fs::read_to_string(metrics).unwrap_or_default();
    assert!(!trained.contains("\"loss\""), "{trained}");
}
