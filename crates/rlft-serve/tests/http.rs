//! The HTTP layer on a tiny random model, requests sent through the router (no socket): the API
//! key (401 without it or with a wrong one, 200 with it, `/health` open), the runtime adapter
//! endpoints (off unless a directory is named; paths outside it, `..` and symlink escapes
//! refused with 403) and the field checks (a 400 naming each field and its range).

use std::path::Path;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use rlft_model::config::Family;
use rlft_model::load::{load_model, LoadOptions};
use rlft_model::tiny::{save_tiny_hf_dir, tiny_config};
use rlft_serve::server::{router, AppState};
use rlft_serve::{AdapterDir, ApiKey, Engine, EngineConfig, Registry};
use serde_json::{json, Value};
use tower::ServiceExt;

const KEY: &str = "test-key-0123456789";

fn opts() -> LoadOptions {
    LoadOptions {
        device: candle_core::Device::Cpu,
        dtype: candle_core::DType::F32,
        ..Default::default()
    }
}

/// The server's router on a tiny model saved under `dir/model`.
fn server(dir: &Path, key: Option<&str>, lora_dir: Option<&Path>) -> Router {
    let model = dir.join("model");
    if !model.exists() {
        save_tiny_hf_dir(tiny_config(Family::Qwen2), 3, &model).unwrap();
    }
    let registry = Registry::new(load_model(&model, &opts()).unwrap(), "tiny").unwrap();
    router(AppState {
        engine: Arc::new(Engine::start(EngineConfig::default())),
        registry: Arc::new(registry),
        max_body_bytes: 1 << 20,
        api_key: key.map(|k| ApiKey::new(k).unwrap()),
        runtime_lora: lora_dir.map(|d| AdapterDir::new(d).unwrap()),
    })
}

/// A PEFT adapter with random factors on the tiny model, written to `dir`.
fn write_adapter(model: &Path, dir: &Path) {
    let mut m = load_model(model, &opts()).unwrap();
    let cfg = rlft_model::LoraConfig {
        r: 2,
        lora_alpha: 4.0,
        target_modules: vec!["q_proj".into(), "v_proj".into()],
        init_lora_weights: false,
        seed: 5,
        ..Default::default()
    };
    rlft_model::lora::attach_lora(&mut m.model, &cfg).unwrap();
    rlft_model::peft::save_adapter(&m.model, &cfg, dir, None).unwrap();
}

/// Sends a request: the status, the `WWW-Authenticate` header and the body (JSON, or a string).
async fn send(
    app: &Router,
    method: &str,
    path: &str,
    body: Option<&Value>,
    auth: Option<&str>,
) -> (StatusCode, Option<String>, Value) {
    let mut req = Request::builder().method(method).uri(path);
    if let Some(a) = auth {
        req = req.header("authorization", a);
    }
    let body = match body {
        Some(b) => {
            req = req.header("content-type", "application/json");
            Body::from(b.to_string())
        }
        None => Body::empty(),
    };
    let r = app.clone().oneshot(req.body(body).unwrap()).await.unwrap();
    let status = r.status();
    let www = r
        .headers()
        .get("www-authenticate")
        .map(|v| v.to_str().unwrap().to_string());
    let bytes = axum::body::to_bytes(r.into_body(), usize::MAX)
        .await
        .unwrap();
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    let v = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, www, v)
}

fn completion() -> Value {
    json!({"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 2, "temperature": 0})
}

#[tokio::test]
async fn with_a_key_every_endpoint_but_health_needs_it() {
    let tmp = tempfile::tempdir().unwrap();
    let app = server(tmp.path(), Some(KEY), None);
    let bearer = format!("Bearer {KEY}");
    let c = completion();

    let (status, www, v) = send(&app, "POST", "/v1/completions", Some(&c), None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{v}");
    assert_eq!(www.as_deref(), Some("Bearer"));
    let e = &v["error"];
    assert_eq!(e["type"], "invalid_request_error", "{v}");
    assert_eq!(e["code"], "invalid_api_key", "{v}");
    assert!(e["param"].is_null(), "{v}");
    assert!(e["message"]
        .as_str()
        .unwrap()
        .contains("Authorization: Bearer"));

    for wrong in [
        "Bearer wrong-key",
        "Basic dGVzdA==",
        KEY,
        "Bearer test-key-012345678",
    ] {
        let (status, _, v) = send(&app, "POST", "/v1/completions", Some(&c), Some(wrong)).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{wrong}: {v}");
        let m = v["error"]["message"].as_str().unwrap();
        assert!(m.starts_with("Incorrect API key provided"), "{m}");
        assert!(
            !m.contains("wrong-key") && !m.contains(KEY),
            "the key is never echoed: {m}"
        );
    }
    for (method, path) in [
        ("GET", "/v1/models"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/load_lora_adapter"),
        ("POST", "/v1/unload_lora_adapter"),
        ("GET", "/no/such/route"),
    ] {
        let (status, _, v) = send(&app, method, path, None, None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{path}: {v}");
    }

    let (status, _, v) = send(&app, "POST", "/v1/completions", Some(&c), Some(&bearer)).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert!(v["choices"][0]["text"].is_string(), "{v}");
    let (status, _, v) = send(&app, "GET", "/v1/models", None, Some(&bearer)).await;
    assert_eq!(
        (status, &v["data"][0]["id"]),
        (StatusCode::OK, &json!("tiny"))
    );
    let (status, _, _) = send(&app, "GET", "/no/such/route", None, Some(&bearer)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _, _) = send(&app, "GET", "/health", None, None).await;
    assert_eq!(status, StatusCode::OK, "/health is open");
}

#[tokio::test]
async fn without_a_key_requests_pass_as_before() {
    let tmp = tempfile::tempdir().unwrap();
    let app = server(tmp.path(), None, None);
    let (status, _, v) = send(&app, "POST", "/v1/completions", Some(&completion()), None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let (status, _, _) = send(&app, "GET", "/v1/models", None, Some("Bearer anything")).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn runtime_adapters_are_off_unless_a_directory_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let app = server(tmp.path(), None, None);
    let load = json!({"lora_name": "a", "lora_path": tmp.path().display().to_string()});
    let (status, _, v) = send(&app, "POST", "/v1/load_lora_adapter", Some(&load), None).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{v}");
    assert_eq!(v["error"]["code"], "runtime_lora_disabled");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("--allow-runtime-lora"));
    let unload = json!({"lora_name": "a"});
    let (status, _, v) = send(&app, "POST", "/v1/unload_lora_adapter", Some(&unload), None).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{v}");
}

#[tokio::test]
async fn adapters_load_only_from_under_the_named_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("out/rollout_adapters");
    let app = server(tmp.path(), None, Some(&root));
    write_adapter(&tmp.path().join("model"), &root.join("step-0"));
    let outside = tmp.path().join("elsewhere");
    write_adapter(&tmp.path().join("model"), &outside);
    let load = |path: String| json!({"lora_name": "rlft-step-0", "lora_path": path});

    // The path the trainer sends: absolute, under the directory.
    let inside = root.join("step-0").display().to_string();
    let (status, _, v) = send(
        &app,
        "POST",
        "/v1/load_lora_adapter",
        Some(&load(inside)),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let mut c = completion();
    c["model"] = json!("rlft-step-0");
    let (status, _, v) = send(&app, "POST", "/v1/completions", Some(&c), None).await;
    assert_eq!(status, StatusCode::OK, "{v}");

    #[cfg(unix)]
    std::os::unix::fs::symlink(&outside, root.join("escape")).unwrap();
    let mut refused = vec![
        outside.display().to_string(),
        "../../elsewhere".to_string(),
        format!("{}/../../elsewhere", root.display()),
        "/".to_string(),
    ];
    if cfg!(unix) {
        refused.push("escape".into());
        refused.push(root.join("escape").display().to_string());
    }
    for p in refused {
        let (status, _, v) = send(
            &app,
            "POST",
            "/v1/load_lora_adapter",
            Some(&load(p.clone())),
            None,
        )
        .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{p}: {v}");
        assert_eq!(v["error"]["code"], "lora_path_not_allowed", "{p}: {v}");
        assert_eq!(v["error"]["param"], "lora_path", "{p}: {v}");
        let m = v["error"]["message"].as_str().unwrap();
        assert!(
            m.contains(&root.display().to_string()),
            "names the directory: {m}"
        );
    }
    let (status, _, v) = send(
        &app,
        "POST",
        "/v1/load_lora_adapter",
        Some(&load("step-9".into())),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["error"]["param"], "lora_path");

    let unload = json!({"lora_name": "rlft-step-0"});
    let (status, _, v) = send(&app, "POST", "/v1/unload_lora_adapter", Some(&unload), None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
}

/// (endpoint, field, value, the message after "FIELD must be ").
const CHAT: &str = "/v1/chat/completions";
const COMPLETIONS: &str = "/v1/completions";

fn field_cases() -> Vec<(&'static str, &'static str, Value, &'static str)> {
    let int1 = "an integer >= 1";
    let i64_range = "an integer between -9223372036854775808 and 9223372036854775807";
    vec![
        (CHAT, "model", json!(5), "a string"),
        (CHAT, "max_tokens", json!(-1), int1),
        (CHAT, "max_tokens", json!(0), int1),
        (CHAT, "max_tokens", json!("10"), int1),
        (CHAT, "max_tokens", json!(1.5), int1),
        (CHAT, "max_completion_tokens", json!(0), int1),
        (CHAT, "temperature", json!(-0.5), "a number >= 0"),
        (CHAT, "temperature", json!("hot"), "a number >= 0"),
        (CHAT, "temperature", json!(1e300), "a number >= 0"),
        (CHAT, "top_p", json!(0), "a number > 0 and <= 1"),
        (CHAT, "top_p", json!(1.5), "a number > 0 and <= 1"),
        (CHAT, "top_k", json!(-2), "an integer >= -1 (-1 or 0: off)"),
        (CHAT, "top_k", json!(2.5), "an integer >= -1 (-1 or 0: off)"),
        (CHAT, "min_p", json!(1.5), "a number between 0 and 1"),
        (
            CHAT,
            "repetition_penalty",
            json!(0),
            "a number > 0 (1: off)",
        ),
        (CHAT, "n", json!(0), int1),
        (CHAT, "n", json!(true), int1),
        (CHAT, "seed", json!("x"), i64_range),
        (CHAT, "seed", json!(18446744073709551615u64), i64_range),
        (CHAT, "stop", json!(5), "a string or a list of strings"),
        (
            CHAT,
            "stop",
            json!(["a", 1]),
            "a string or a list of strings",
        ),
        (CHAT, "stream", json!("yes"), "true or false"),
        (
            CHAT,
            "stream_options",
            json!({"include_usage": "yes"}),
            "an object such as {\"include_usage\": true}",
        ),
        (CHAT, "ignore_eos", json!(1), "true or false"),
        (CHAT, "return_token_ids", json!("no"), "true or false"),
        (
            CHAT,
            "presence_penalty",
            json!(3),
            "a number between -2 and 2",
        ),
        (
            CHAT,
            "frequency_penalty",
            json!(-2.5),
            "a number between -2 and 2",
        ),
        (CHAT, "logit_bias", json!([1]), "a JSON object"),
        (CHAT, "logprobs", json!(1), "true or false"),
        (
            CHAT,
            "top_logprobs",
            json!(21),
            "an integer between 0 and 20",
        ),
        (
            CHAT,
            "top_logprobs",
            json!(-1),
            "an integer between 0 and 20",
        ),
        (CHAT, "add_generation_prompt", json!("x"), "true or false"),
        (CHAT, "continue_final_message", json!(0), "true or false"),
        (CHAT, "chat_template_kwargs", json!([]), "a JSON object"),
        (CHAT, "tools", json!({}), "a list"),
        (CHAT, "messages", json!("hi"), "a list of messages"),
        (
            COMPLETIONS,
            "prompt",
            json!(5),
            "a string, a list of strings, a list of token ids or a list of lists of token ids",
        ),
        (
            COMPLETIONS,
            "prompt",
            json!([1, "a"]),
            "a string, a list of strings",
        ),
        (
            COMPLETIONS,
            "prompt",
            json!([-1]),
            "a string, a list of strings",
        ),
        (
            COMPLETIONS,
            "logprobs",
            json!(21),
            "an integer between 0 and 20 (the number of most likely tokens to report)",
        ),
        (
            COMPLETIONS,
            "logprobs",
            json!(true),
            "an integer between 0 and 20",
        ),
        (COMPLETIONS, "max_tokens", json!(-1), int1),
        (COMPLETIONS, "echo", json!("x"), "true or false"),
        (COMPLETIONS, "suffix", json!(1), "a string"),
        (COMPLETIONS, "best_of", json!(0), int1),
    ]
}

#[tokio::test]
async fn each_bad_field_gets_a_400_naming_it_and_its_range() {
    let tmp = tempfile::tempdir().unwrap();
    let app = server(tmp.path(), None, None);
    for (path, field, value, want) in field_cases() {
        let mut body = match path {
            CHAT => json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}),
            _ => completion(),
        };
        body[field] = value.clone();
        let (status, _, v) = send(&app, "POST", path, Some(&body), None).await;
        let what = format!("{path} {field} = {value}: {v}");
        assert_eq!(status, StatusCode::BAD_REQUEST, "{what}");
        let e = &v["error"];
        assert_eq!(e["type"], "invalid_request_error", "{what}");
        assert_eq!(e["param"], field, "{what}");
        let m = e["message"].as_str().unwrap();
        assert!(m.starts_with(&format!("{field} must be {want}")), "{what}");
        assert!(m.contains(&format!("got {value}")), "{what}");
    }
    // The exact text for the example.
    let mut body = completion();
    body["max_tokens"] = json!(-1);
    let (_, _, v) = send(&app, "POST", COMPLETIONS, Some(&body), None).await;
    assert_eq!(
        v["error"]["message"],
        "max_tokens must be an integer >= 1, got -1"
    );
}

#[tokio::test]
async fn enum_and_nested_fields_name_what_they_take() {
    let tmp = tempfile::tempdir().unwrap();
    let app = server(tmp.path(), None, None);
    let mut body = completion();
    body["response_format"] = json!({"type": "xml"});
    let (status, _, v) = send(&app, "POST", COMPLETIONS, Some(&body), None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(v["error"]["param"], "response_format");
    assert_eq!(
        v["error"]["message"],
        "response_format.type must be one of \"text\", \"json_object\", \"json_schema\", got \"xml\""
    );
    // A known format that is not served: refused, not ignored.
    body["response_format"] = json!({"type": "json_object"});
    let (status, _, v) = send(&app, "POST", COMPLETIONS, Some(&body), None).await;
    assert_eq!(
        (status, &v["error"]["param"]),
        (StatusCode::BAD_REQUEST, &json!("response_format"))
    );
    body["response_format"] = json!({"type": "text"});
    body["max_tokens"] = json!(2.0);
    body["seed"] = json!(null);
    let (status, _, v) = send(&app, "POST", COMPLETIONS, Some(&body), None).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "text format, a whole float, a null: {v}"
    );

    let chat = json!({"model": "tiny", "messages": [{"content": "no role"}]});
    let (status, _, v) = send(&app, "POST", CHAT, Some(&chat), None).await;
    assert_eq!(
        (status, &v["error"]["param"]),
        (StatusCode::BAD_REQUEST, &json!("messages"))
    );
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("messages[0] must be"),
        "{v}"
    );
    let (status, _, v) = send(&app, "POST", CHAT, Some(&json!({"model": "tiny"})), None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("messages is required"),
        "{v}"
    );
    let load = json!({"lora_name": "x", "lora_path": 5});
    let lapp = server(tmp.path(), None, Some(tmp.path()));
    let (status, _, v) = send(&lapp, "POST", "/v1/load_lora_adapter", Some(&load), None).await;
    assert_eq!(
        (status, &v["error"]["param"]),
        (StatusCode::BAD_REQUEST, &json!("lora_path"))
    );
}
