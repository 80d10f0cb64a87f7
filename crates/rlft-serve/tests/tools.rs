//! Chat requests with tools on a tiny random model with Qwen2.5's chat template, through the
//! router: the tools reach the prompt, a conversation holding a call and its answer renders as
//! the template writes them, `tool_choice` "none" leaves the tools out and "required" is
//! refused, and a model whose template has no tools is refused. A random model writes no calls:
//! the mapping from a call in the text to `tool_calls` is tested in `src/tool_calls.rs`, and on
//! a real model with the `openai` client in `tests/serve/openai_tools.py`.

use std::path::Path;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use rlft_model::config::Family;
use rlft_model::load::{load_model, LoadOptions};
use rlft_model::tiny::{save_tiny_hf_dir, tiny_config, tiny_text_bundle};
use rlft_serve::server::{router, AppState};
use rlft_serve::{Engine, EngineConfig, Registry};
use serde_json::{json, Value};
use tower::ServiceExt;

const QWEN: &str = include_str!("../../rlft-text/tests/data/templates/qwen2.5-instruct.jinja");

/// The router on a tiny model; with `template`, that chat template replaces the tiny one.
fn server(dir: &Path, template: Option<&str>) -> Router {
    let model = dir.join("model");
    // Room for Qwen2.5's tool prompt, about 750 tokens of the byte-level tiny tokenizer.
    let config = rlft_model::ModelConfig {
        max_position_embeddings: 2048,
        ..tiny_config(Family::Qwen2)
    };
    save_tiny_hf_dir(config, 3, &model).unwrap();
    if let Some(t) = template {
        std::fs::write(model.join("chat_template.jinja"), t).unwrap();
    }
    let opts = LoadOptions {
        device: candle_core::Device::Cpu,
        dtype: candle_core::DType::F32,
        ..Default::default()
    };
    let registry = Registry::new(load_model(&model, &opts).unwrap(), "tiny").unwrap();
    router(AppState {
        engine: Arc::new(Engine::start(EngineConfig::default())),
        registry: Arc::new(registry),
        max_body_bytes: 1 << 20,
        api_key: None,
        runtime_lora: None,
    })
}

/// POSTs a chat request: the status and the body (JSON, or the event stream as a string).
async fn chat(app: &Router, body: &Value) -> (StatusCode, Value) {
    let req = Request::builder()
        .method("POST")
        .uri("/v1/chat/completions")
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let r = app.clone().oneshot(req).await.unwrap();
    let status = r.status();
    let bytes = axum::body::to_bytes(r.into_body(), usize::MAX)
        .await
        .unwrap();
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn calculator() -> Value {
    json!({"type": "function", "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                       "required": ["expression"]},
    }})
}

fn request(messages: Value) -> Value {
    json!({"model": "tiny", "messages": messages, "tools": [calculator()], "max_tokens": 6,
           "temperature": 0, "return_token_ids": true})
}

/// The prompt the server rendered, from `prompt_token_ids` (the tiny tokenizer round-trips).
fn prompt(v: &Value) -> String {
    let ids: Vec<u32> = serde_json::from_value(v["prompt_token_ids"].clone()).unwrap();
    tiny_text_bundle().unwrap().decode(&ids, false).unwrap()
}

#[tokio::test]
async fn tools_reach_the_prompt_and_answers_keep_their_shape() {
    let tmp = tempfile::tempdir().unwrap();
    let app = server(tmp.path(), Some(QWEN));
    let user = json!([{"role": "user", "content": "Compute 17 * (18 - 14) with the calculator"}]);
    let (status, v) = chat(&app, &request(user.clone())).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let p = prompt(&v);
    assert!(
        p.contains("# Tools\n\nYou may call one or more functions"),
        "{p}"
    );
    for part in [
        "<tools>\n{\"",
        "\"name\": \"calculator\"",
        "\"description\": \"Evaluate an arithmetic expression\"",
        "}\n</tools>",
    ] {
        assert!(p.contains(part), "{part} in {p}");
    }
    let c = &v["choices"][0];
    assert_eq!(c["message"]["role"], "assistant", "{v}");
    // A random model writes no call: its text is the content, as without tools.
    assert!(c["message"]["content"].is_string(), "{v}");
    assert!(c["message"].get("tool_calls").is_none(), "{v}");
    assert!(["stop", "length"].contains(&c["finish_reason"].as_str().unwrap()));

    // Streamed, the held-back text still all arrives, and the stream ends as before.
    let mut body = request(user);
    body["stream"] = json!(true);
    body["return_token_ids"] = json!(false);
    let (status, s) = chat(&app, &body).await;
    assert_eq!(status, StatusCode::OK);
    let events: Vec<Value> = s
        .as_str()
        .unwrap()
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert!(s.as_str().unwrap().trim_end().ends_with("data: [DONE]"));
    let text: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, c["message"]["content"].as_str().unwrap());
    let last = &events.last().unwrap()["choices"][0];
    assert_eq!(last["finish_reason"], c["finish_reason"]);
}

#[tokio::test]
async fn a_conversation_with_a_call_and_its_answer_renders() {
    let tmp = tempfile::tempdir().unwrap();
    let app = server(tmp.path(), Some(QWEN));
    let messages = json!([
        {"role": "user", "content": "Compute 17 * (18 - 14) with the calculator"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_abc", "type": "function",
         "function": {"name": "calculator", "arguments": "{\"expression\": \"17 * (18 - 14)\"}"}}]},
        {"role": "tool", "tool_call_id": "call_abc", "content": "68"},
    ]);
    let (status, v) = chat(&app, &request(messages.clone())).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let p = prompt(&v);
    let want = "<|im_start|>assistant\n<tool_call>\n{\"name\": \"calculator\", \"arguments\": \
                {\"expression\": \"17 * (18 - 14)\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n\
                <tool_response>\n68\n</tool_response><|im_end|>\n<|im_start|>assistant\n";
    assert!(p.ends_with(want), "{p}");

    // The same conversation without `tools` in the request renders too.
    let mut body = request(messages.clone());
    body.as_object_mut().unwrap().remove("tools");
    let (status, v) = chat(&app, &body).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert!(prompt(&v).ends_with(want));

    // Arguments that are not JSON: a 400 saying which.
    let mut bad = messages;
    bad[1]["tool_calls"][0]["function"]["arguments"] = json!("expression = 17");
    let (status, v) = chat(&app, &request(bad)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["error"]["param"], "messages");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("messages[1].tool_calls[0].function.arguments is not valid JSON"));
}

#[tokio::test]
async fn tool_choice_none_drops_the_tools_and_required_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let app = server(tmp.path(), Some(QWEN));
    let user = json!([{"role": "user", "content": "Hi"}]);
    let mut body = request(user.clone());
    body["tool_choice"] = json!("none");
    let (status, v) = chat(&app, &body).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert!(!prompt(&v).contains("# Tools"));
    body["tool_choice"] = json!("auto");
    let (status, v) = chat(&app, &body).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert!(prompt(&v).contains("# Tools"));

    for choice in [
        json!("required"),
        json!({"type": "function", "function": {"name": "calculator"}}),
    ] {
        body["tool_choice"] = choice.clone();
        let (status, v) = chat(&app, &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{choice}: {v}");
        assert_eq!(v["error"]["param"], "tool_choice");
        let m = v["error"]["message"].as_str().unwrap();
        assert!(m.contains("not supported") && m.contains("\"auto\""), "{m}");
    }
    body["tool_choice"] = json!("sometimes");
    let (status, v) = chat(&app, &body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("tool_choice must be \"auto\", \"none\", \"required\""));

    let mut body = request(user);
    body["tools"] = json!([{"name": "calculator"}]);
    let (status, v) = chat(&app, &body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(v["error"]["param"], "tools");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("tools[0] must be {\"type\": \"function\""));
}

#[tokio::test]
async fn a_template_without_tools_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let app = server(tmp.path(), None);
    let (status, v) = chat(&app, &request(json!([{"role": "user", "content": "Hi"}]))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["error"]["param"], "tools");
    let m = v["error"]["message"].as_str().unwrap();
    assert!(
        m.contains("chat template of model `tiny` does not render tools")
            && m.contains("without `tools`"),
        "{m}"
    );
}
