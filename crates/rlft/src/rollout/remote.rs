//! Rollouts on OpenAI-compatible servers (`rollout_servers`; TRL: `use_vllm = true`, `vllm_mode = "server"`):
//! vLLM, SGLang or `rlft serve`, one or several.
//!
//! - Each prompt group is one `POST /v1/completions` with the prompt as token ids, `n =
//!   num_generations`, the rollout's sampling settings, `logprobs: 0` and `return_token_ids`
//!   (vLLM's extension): the sampled ids and their log-probs come back, the text is decoded
//!   here as the in-process rollout decodes it. The seed of group `g` is `mix(rollout seed,
//!   g)`, so a run repeats whichever server a group lands on.
//! - Groups are spread over the live servers from one queue (several requests in flight per
//!   server, so their continuous batching has work). A request that fails to connect, times
//!   out (`rollout_server_timeout`) or gets a 5xx/404 marks its server dead and goes back to the
//!   queue for the others; a 4xx is the request's fault and stops the run. When no server is
//!   left the rollout fails: the step is not trained on a partial batch.
//! - The policy reaches the servers as a PEFT adapter: before each rollout whose step has not
//!   been pushed, it is written to `<output_dir>/rollout_adapters/step-N` and loaded with
//!   `POST /v1/load_lora_adapter {"lora_name": "rlft-step-N", "lora_path": ...}` on every live
//!   server; requests then name that model. The previous version is unloaded and deleted.
//!   Loopback (or a shared file system) is assumed: the servers read the path the trainer
//!   wrote, so `rlft serve` must be started with `--allow-runtime-lora` naming
//!   `<output_dir>/rollout_adapters` (or a directory above it).
//! - With a key (`rollout_server_api_key` or `RLFT_API_KEY`) every request carries
//!   `Authorization: Bearer KEY`; a 401 stops the run with a message about the key (which is
//!   never printed).

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rlft_rewards::http_client::{parse_url, HttpError, Response, Url};
use rlft_text::TextBundle;
use serde_json::{json, Value};

use super::{RolloutSettings, Sample};
use crate::data::prompts::PromptItem;
use crate::error::{Result, TrainerError};
use crate::run::optim::mix;
use crate::run::Policy;

/// Most requests in flight per server.
const MAX_IN_FLIGHT: usize = 16;

/// One server.
struct Server {
    /// Base URL as configured (no `/v1`).
    base: String,
    /// `Bearer KEY`, when the servers want a key.
    auth: Option<String>,
    alive: AtomicBool,
    /// Why it was dropped.
    why: Mutex<Option<String>>,
}

impl Server {
    fn endpoint(&self, path: &str) -> Url {
        // Checked by the config; the path is appended to whatever the base has.
        let mut u = parse_url(&self.base).expect("checked base URL");
        u.path = format!("{}{path}", u.path.trim_end_matches('/'));
        u
    }

    fn drop_with(&self, why: String) {
        if self.alive.swap(false, Ordering::SeqCst) {
            eprintln!(
                "rollout server {} dropped: {why}; its work goes to the others",
                self.base
            );
        }
        *self.why.lock().unwrap() = Some(why);
    }

    fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    /// `method path` with the key's header when there is one.
    fn send(
        &self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
        timeout: Duration,
    ) -> Result<Response, HttpError> {
        let url = self.endpoint(path);
        match &self.auth {
            Some(a) => url.request_with(method, body, &[("Authorization", a)], timeout),
            None => url.request(method, body, timeout),
        }
    }
}

/// What a 401 means to the person running the trainer.
const KEY_HINT: &str = "the server wants an API key: set rollout_server_api_key (or RLFT_API_KEY) \
                        to the key it was started with (rlft serve --api-key, vllm --api-key)";

/// How a request failed.
enum Failure {
    /// The server is unusable (down, timed out, 5xx, model missing): try another.
    Server(String),
    /// The request itself is wrong (4xx): retrying elsewhere would fail the same way.
    Request(String),
}

/// Sends `body` to `path` of `s`, returns the JSON answer.
fn call(s: &Server, path: &str, body: &Value, timeout: Duration) -> Result<Value, Failure> {
    let bytes = body.to_string().into_bytes();
    let r = s
        .send("POST", path, Some(&bytes), timeout)
        .map_err(|e| match e {
            HttpError::Timeout { stage } => Failure::Server(format!(
                "POST {path} timed out after {}s while {stage}",
                timeout.as_secs_f64()
            )),
            HttpError::Failed(m) => Failure::Server(format!("POST {path}: {m}")),
        })?;
    let status = r.status;
    let text = String::from_utf8_lossy(&r.body).into_owned();
    if (200..300).contains(&status) {
        // load_lora_adapter answers plain text.
        return Ok(serde_json::from_str(&text).unwrap_or(Value::String(text)));
    }
    let mut msg = format!("POST {path}: {}", r.ok().unwrap_err());
    if status == 401 {
        msg = format!("{msg}; {KEY_HINT}");
    }
    if status >= 500 || status == 404 || status == 429 {
        Err(Failure::Server(msg))
    } else {
        Err(Failure::Request(msg))
    }
}

/// Polls `GET /v1/models` on `s` until it answers 200 (up), 401 (a key problem: dropped at
/// once) or `deadline` passes (dropped).
fn wait_until_up(s: &Server, deadline: Instant, timeout: Duration) {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let r = s.send(
            "GET",
            "/v1/models",
            None,
            left.max(Duration::from_millis(100)),
        );
        match r {
            Ok(r) if r.status == 200 => return,
            Ok(r) if r.status == 401 => {
                let what = if s.auth.is_some() {
                    "refused the API key"
                } else {
                    "answered 401"
                };
                s.drop_with(format!("GET /v1/models {what}: {KEY_HINT}"));
                return;
            }
            _ if Instant::now() >= deadline => {
                let why = match r {
                    Ok(r) => format!("GET /v1/models answered `{}`", r.status_line),
                    Err(e) => format!("GET /v1/models: {e}"),
                };
                s.drop_with(format!(
                    "not up within rollout_server_timeout = {}s ({why})",
                    timeout.as_secs_f64()
                ));
                return;
            }
            _ => std::thread::sleep(Duration::from_millis(250)),
        }
    }
}

/// The servers a run generates on, and the adapter version they hold.
pub struct ServerPool {
    servers: Vec<Server>,
    timeout: Duration,
    adapter_root: PathBuf,
    /// `(global step, model name)` of the adapter loaded on the servers.
    loaded: Option<(u64, String)>,
}

impl ServerPool {
    /// Waits up to `timeout` for each of `urls` to answer `GET /v1/models`; servers that do
    /// not (or refuse `api_key`) are dropped with a warning, none answering is an error.
    /// Adapters are written under `adapter_root`.
    pub fn connect(
        urls: &[String],
        timeout: Duration,
        adapter_root: &Path,
        api_key: Option<&str>,
    ) -> Result<Self> {
        let deadline = Instant::now() + timeout;
        let servers: Vec<Server> = urls
            .iter()
            .map(|u| Server {
                base: u.clone(),
                auth: api_key.map(|k| format!("Bearer {k}")),
                alive: AtomicBool::new(true),
                why: Mutex::new(None),
            })
            .collect();
        for s in &servers {
            wait_until_up(s, deadline, timeout);
        }
        let pool = ServerPool {
            servers,
            timeout,
            adapter_root: std::path::absolute(adapter_root)
                .map_err(TrainerError::io(adapter_root))?,
            loaded: None,
        };
        pool.any_alive()?;
        Ok(pool)
    }

    /// The base URLs of the servers still in use.
    pub fn live(&self) -> Vec<&str> {
        let live = self.servers.iter().filter(|s| s.is_alive());
        live.map(|s| s.base.as_str()).collect()
    }

    fn any_alive(&self) -> Result<()> {
        if self.servers.iter().any(Server::is_alive) {
            return Ok(());
        }
        let reasons: Vec<String> = self
            .servers
            .iter()
            .map(|s| {
                let why = s.why.lock().unwrap().clone().unwrap_or_default();
                format!("  {}: {why}", s.base)
            })
            .collect();
        Err(TrainerError::Other(format!(
            "no rollout server left (rollout_servers), so this step is not trained:\n{}\n\
             start the servers again (e.g. `rlft serve --model <base>`) and resume from the last \
             checkpoint",
            reasons.join("\n")
        )))
    }

    /// Makes the servers serve `policy`'s adapter of `step` and returns the model name to
    /// request: writes the PEFT adapter and loads it on every live server (once per step).
    pub fn push_adapter(&mut self, policy: &Policy, step: u64, base_name: &str) -> Result<String> {
        if let Some((s, name)) = &self.loaded {
            if *s == step {
                return Ok(name.clone());
            }
        }
        let lora = policy.lora.as_ref().ok_or_else(|| {
            TrainerError::Other("rollouts on servers need use_peft = true".into())
        })?;
        let dir = self.adapter_root.join(format!("step-{step}"));
        let plain = rlft_model::trainable::detached(&policy.model);
        rlft_model::peft::save_adapter(&plain, lora, &dir, Some(base_name))?;
        let name = format!("rlft-step-{step}");
        let body = json!({"lora_name": name, "lora_path": dir.display().to_string()});
        for s in self.servers.iter().filter(|s| s.is_alive()) {
            match call(s, "/v1/load_lora_adapter", &body, self.timeout) {
                Ok(_) => {}
                Err(Failure::Server(m)) => s.drop_with(m),
                Err(Failure::Request(m)) => {
                    return Err(TrainerError::Other(format!(
                        "rollout server {} refused the adapter {}: {m}. Does it serve the same \
                         base model, with runtime LoRA enabled for that directory (rlft serve \
                         --allow-runtime-lora {}; vLLM: --enable-lora and \
                         VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)?",
                        s.base,
                        dir.display(),
                        self.adapter_root.display()
                    )))
                }
            }
        }
        self.any_alive()?;
        if let Some((s, old)) = self.loaded.replace((step, name.clone())) {
            let body = json!({ "lora_name": old });
            for srv in self.servers.iter().filter(|s| s.is_alive()) {
                // A failed unload costs the server memory, not correctness.
                let _ = call(srv, "/v1/unload_lora_adapter", &body, self.timeout);
            }
            let _ = std::fs::remove_dir_all(self.adapter_root.join(format!("step-{s}")));
        }
        Ok(name)
    }

    /// Samples `settings.num_generations` completions of each of `prompts` on the servers
    /// from model `model`: the samples (groups contiguous, in the order of `prompts`, as
    /// [`super::sample_completions`]), each with the sampler's per-token log-probs.
    pub fn sample(
        &self,
        model: &str,
        text: &TextBundle,
        items: &[PromptItem],
        prompts: &[usize],
        s: &RolloutSettings,
    ) -> Result<Vec<Sample>> {
        let queue: Mutex<VecDeque<usize>> = Mutex::new((0..prompts.len()).collect());
        let results: Mutex<Vec<Option<Vec<Choice>>>> = Mutex::new(vec![None; prompts.len()]);
        let remaining = AtomicUsize::new(prompts.len());
        let fatal: Mutex<Option<String>> = Mutex::new(None);
        let live: Vec<&Server> = self.servers.iter().filter(|s| s.is_alive()).collect();
        let per_server = prompts
            .len()
            .div_ceil(live.len().max(1))
            .clamp(1, MAX_IN_FLIGHT);
        let worker = |srv: &Server| loop {
            if !srv.is_alive() || fatal.lock().unwrap().is_some() {
                return;
            }
            let Some(g) = queue.lock().unwrap().pop_front() else {
                if remaining.load(Ordering::SeqCst) == 0 {
                    return;
                }
                // A group in flight elsewhere may come back if its server fails.
                std::thread::sleep(Duration::from_millis(20));
                continue;
            };
            let body = request_body(model, &items[prompts[g]].ids, mix(s.seed, g as u64), s);
            match call(srv, "/v1/completions", &body, self.timeout)
                .and_then(|v| parse_choices(&v, s.num_generations).map_err(Failure::Server))
            {
                Ok(c) => {
                    results.lock().unwrap()[g] = Some(c);
                    remaining.fetch_sub(1, Ordering::SeqCst);
                }
                Err(Failure::Server(m)) => {
                    queue.lock().unwrap().push_back(g);
                    srv.drop_with(m);
                    return;
                }
                Err(Failure::Request(m)) => {
                    *fatal.lock().unwrap() = Some(format!("rollout server {}: {m}", srv.base));
                    return;
                }
            }
        };
        let worker = &worker;
        std::thread::scope(|scope| {
            for srv in live.iter().copied() {
                for _ in 0..per_server {
                    scope.spawn(move || worker(srv));
                }
            }
        });
        if let Some(m) = fatal.into_inner().unwrap() {
            return Err(TrainerError::Other(m));
        }
        if remaining.load(Ordering::SeqCst) > 0 {
            self.any_alive()?;
            return Err(TrainerError::Other(
                "rollout: groups left unsampled with servers alive".into(),
            ));
        }
        let mut samples = Vec::with_capacity(prompts.len() * s.num_generations);
        for (g, choices) in results.into_inner().unwrap().into_iter().enumerate() {
            for c in choices.expect("every group sampled") {
                let decoded = text.decode(&c.ids, true).unwrap_or_default();
                let mut sample = Sample::new(prompts[g], c.ids, decoded, c.truncated);
                sample.sampler_logprobs = Some(c.logprobs);
                samples.push(sample);
            }
        }
        Ok(samples)
    }
}

/// One sampled completion as a server returns it.
#[derive(Debug, Clone)]
struct Choice {
    ids: Vec<u32>,
    logprobs: Vec<f32>,
    truncated: bool,
}

/// The `/v1/completions` body of one prompt group (fields vLLM and `rlft serve` share; the
/// sampling fields left out are the servers' "off").
fn request_body(model: &str, prompt: &[u32], seed: u64, s: &RolloutSettings) -> Value {
    let p = &s.sampling;
    let mut b = json!({
        "model": model,
        "prompt": prompt,
        "n": s.num_generations,
        "max_tokens": s.max_new_tokens,
        "temperature": p.temperature,
        "top_p": p.top_p,
        "seed": seed & (i64::MAX as u64),
        "logprobs": 0,
        "return_token_ids": true,
        "stop_token_ids": s.eos_token_ids,
    });
    if p.top_k > 0 {
        b["top_k"] = json!(p.top_k);
    }
    if p.min_p > 0.0 {
        b["min_p"] = json!(p.min_p);
    }
    if p.repetition_penalty != 1.0 {
        b["repetition_penalty"] = json!(p.repetition_penalty);
    }
    b
}

/// The `n` choices of a completions answer, in `index` order, with ids and log-probs.
fn parse_choices(v: &Value, n: usize) -> std::result::Result<Vec<Choice>, String> {
    let choices = v["choices"]
        .as_array()
        .ok_or_else(|| format!("answer without `choices`: {v:.200}"))?;
    if choices.len() != n {
        return Err(format!("{} choices for n = {n}", choices.len()));
    }
    let mut out: Vec<(u64, Choice)> = Vec::with_capacity(n);
    for c in choices {
        let ids: Vec<u32> = c["token_ids"]
            .as_array()
            .ok_or(
                "a choice without `token_ids`: the server must support `return_token_ids` \
                    (vLLM >= 0.10.2, rlft serve)",
            )?
            .iter()
            .map(|x| x.as_u64().map(|x| x as u32).ok_or("bad token id"))
            .collect::<std::result::Result<_, _>>()?;
        let lps: Vec<f32> = c["logprobs"]["token_logprobs"]
            .as_array()
            .ok_or("a choice without `logprobs.token_logprobs`")?
            .iter()
            .map(|x| x.as_f64().map_or(f32::NAN, |x| x as f32))
            .collect();
        if lps.len() != ids.len() || ids.is_empty() {
            return Err(format!(
                "a choice with {} token ids and {} log-probs",
                ids.len(),
                lps.len()
            ));
        }
        let truncated = c["finish_reason"].as_str() == Some("length");
        let index = c["index"].as_u64().unwrap_or(out.len() as u64);
        out.push((
            index,
            Choice {
                ids,
                logprobs: lps,
                truncated,
            },
        ));
    }
    out.sort_by_key(|(i, _)| *i);
    Ok(out.into_iter().map(|(_, c)| c).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_parse_in_index_order() {
        let v = json!({"choices": [
            {"index": 1, "token_ids": [5, 2], "logprobs": {"token_logprobs": [-0.5, null]},
             "finish_reason": "stop"},
            {"index": 0, "token_ids": [7], "logprobs": {"token_logprobs": [-1.0]},
             "finish_reason": "length"}]});
        let c = parse_choices(&v, 2).unwrap();
        assert_eq!((c[0].ids.clone(), c[0].truncated), (vec![7], true));
        assert!(c[1].logprobs[1].is_nan() && !c[1].truncated);
        assert!(parse_choices(&v, 3).is_err());
        let no_ids = json!({"choices": [{"index": 0, "logprobs": {"token_logprobs": [-1.0]}}]});
        assert!(parse_choices(&no_ids, 1)
            .unwrap_err()
            .contains("return_token_ids"));
    }
}
