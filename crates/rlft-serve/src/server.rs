//! The HTTP side: routes, the API key, the JSON body reader, the admin endpoints, and the
//! server's life (bind, serve, drain on Ctrl-C or SIGTERM, stop).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{DefaultBodyLimit, FromRequest, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::from_fn_with_state;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};

use crate::adapter_dir::{AdapterDir, AdapterPathError};
use crate::auth::{require_key, ApiKey};
use crate::engine::{Engine, EngineConfig};
use crate::error::{json_response, ApiError};
use crate::protocol::{ChatRequest, CompletionRequest, LoadLora, UnloadLora};
use crate::registry::{Registry, RegistryError};
use crate::validate::Checked;
use crate::{prepare, respond, validate};

/// How the server runs.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Address to listen on.
    pub host: String,
    /// Port (0: any free port; the chosen one is printed).
    pub port: u16,
    /// Engine limits.
    pub engine: EngineConfig,
    /// Largest request body in bytes; larger ones get 413.
    pub max_body_bytes: usize,
    /// The key every request but `/health` must carry (`Authorization: Bearer KEY`); `None`:
    /// open to anyone who can connect.
    pub api_key: Option<ApiKey>,
    /// Where `/v1/load_lora_adapter` may read adapters from; `None`: the runtime adapter
    /// endpoints are off (403).
    pub runtime_lora: Option<AdapterDir>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            host: "127.0.0.1".into(),
            port: 8000,
            engine: EngineConfig::default(),
            max_body_bytes: 4 << 20,
            api_key: None,
            runtime_lora: None,
        }
    }
}

/// What every handler sees.
#[derive(Clone)]
pub struct AppState {
    /// The decoding engine.
    pub engine: Arc<Engine>,
    /// The served models.
    pub registry: Arc<Registry>,
    /// Body limit in bytes.
    pub max_body_bytes: usize,
    /// The API key requests must carry.
    pub api_key: Option<ApiKey>,
    /// Where runtime adapters may come from (`None`: runtime loading is off).
    pub runtime_lora: Option<AdapterDir>,
}

/// The routes of the server, behind the API key check (`/health` excepted).
pub fn router(state: AppState) -> Router {
    let key = state.api_key.clone();
    Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/load_lora_adapter", post(load_lora))
        .route("/v1/unload_lora_adapter", post(unload_lora))
        .fallback(|| async { ApiError::not_found("no such endpoint").into_response() })
        // `ApiJson` applies the limit itself, with an OpenAI-shaped 413.
        .layer(DefaultBodyLimit::disable())
        .layer(from_fn_with_state(key, require_key))
        .with_state(state)
}

/// A JSON body read with the server's size limit and checked field by field
/// ([`validate::parse`]); errors in OpenAI's shape (400 for bad JSON or a bad field, naming it;
/// 413 for a body over the limit).
pub struct ApiJson<T>(pub T);

impl<T: Checked> FromRequest<AppState> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        let bytes = read_body(req.into_body(), state.max_body_bytes).await?;
        validate::parse(&bytes).map(ApiJson)
    }
}

/// Bytes read past the limit before answering 413 and closing: a client that writes its whole
/// body before reading (most do, without `Expect: 100-continue`) then sees the 413 instead of a
/// broken pipe.
const DISCARD_LIMIT: usize = 64 << 20;

/// The body, or 413 when it is over `limit` bytes (read on, up to [`DISCARD_LIMIT`], and
/// dropped).
async fn read_body(body: Body, limit: usize) -> Result<Vec<u8>, ApiError> {
    use futures_util::StreamExt;
    let mut stream = body.into_data_stream();
    let mut buf = Vec::new();
    let mut seen = 0usize;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk
            .map_err(|e| ApiError::bad_request(format!("could not read the request body: {e}")))?;
        seen += chunk.len();
        if seen > DISCARD_LIMIT {
            break;
        }
        if seen <= limit {
            buf.extend_from_slice(&chunk);
        }
    }
    if seen > limit {
        return Err(ApiError::too_large(limit));
    }
    Ok(buf)
}

async fn health(State(s): State<AppState>) -> Response {
    if s.engine.is_draining() {
        return (StatusCode::SERVICE_UNAVAILABLE, "draining").into_response();
    }
    StatusCode::OK.into_response()
}

async fn models(State(s): State<AppState>) -> Response {
    let data: Vec<Value> = s
        .registry
        .list()
        .iter()
        .map(|m| {
            json!({
                "id": m.name,
                "object": "model",
                "created": m.created,
                "owned_by": "rlft",
                "root": m.root.display().to_string(),
                "parent": m.parent,
                "max_model_len": m.max_model_len(),
            })
        })
        .collect();
    json_response(StatusCode::OK, &json!({"object": "list", "data": data}))
}

async fn chat(State(s): State<AppState>, ApiJson(req): ApiJson<ChatRequest>) -> Response {
    generate(&s, prepare::chat(&s.registry, req)).await
}

async fn completions(
    State(s): State<AppState>,
    ApiJson(req): ApiJson<CompletionRequest>,
) -> Response {
    generate(&s, prepare::completion(&s.registry, req)).await
}

async fn generate(s: &AppState, p: Result<prepare::Prepared, ApiError>) -> Response {
    let p = match p {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let rx = match s.engine.submit(p.job.clone()) {
        Ok(rx) => rx,
        Err(e) => return ApiError::from(e).into_response(),
    };
    if p.stream {
        respond::stream(p, rx)
    } else {
        respond::collect(p, rx).await
    }
}

/// 403 for the runtime adapter endpoints of a server started without a directory for them.
fn runtime_lora_off() -> Response {
    ApiError::forbidden(
        None,
        "runtime_lora_disabled",
        "loading and unloading LoRA adapters at run time is off on this server; start rlft \
         serve with --allow-runtime-lora DIR to load adapters from under DIR (for a trainer: \
         the directory its adapters are written to, <output_dir>/rollout_adapters)",
    )
    .into_response()
}

fn adapter_path_error(e: AdapterPathError) -> ApiError {
    match e {
        AdapterPathError::Outside { .. } => {
            ApiError::forbidden(Some("lora_path"), "lora_path_not_allowed", e.to_string())
        }
        AdapterPathError::RootMissing { .. } | AdapterPathError::NotADirectory { .. } => {
            ApiError::bad_param("lora_path", e.to_string())
        }
    }
}

async fn load_lora(State(s): State<AppState>, ApiJson(req): ApiJson<LoadLora>) -> Response {
    let Some(dir) = &s.runtime_lora else {
        return runtime_lora_off();
    };
    let path = match dir.resolve(&req.lora_path) {
        Ok(p) => p,
        Err(e) => return adapter_path_error(e).into_response(),
    };
    let reg = s.registry.clone();
    let name = req.lora_name.clone();
    let loaded =
        tokio::task::spawn_blocking(move || reg.load_adapter(&name, &path, req.load_inplace)).await;
    match loaded {
        Ok(Ok(m)) => {
            eprintln!("loaded LoRA adapter `{}` from {}", m.name, m.root.display());
            plain(format!(
                "Success: LoRA adapter '{}' added successfully.",
                req.lora_name
            ))
        }
        Ok(Err(e)) => registry_error(e).into_response(),
        Err(e) => ApiError::internal(format!("loading the adapter panicked: {e}")).into_response(),
    }
}

async fn unload_lora(State(s): State<AppState>, ApiJson(req): ApiJson<UnloadLora>) -> Response {
    if s.runtime_lora.is_none() {
        return runtime_lora_off();
    }
    match s.registry.unload_adapter(&req.lora_name) {
        Ok(()) => {
            eprintln!("unloaded LoRA adapter `{}`", req.lora_name);
            plain(format!(
                "Success: LoRA adapter '{}' removed successfully.",
                req.lora_name
            ))
        }
        Err(e) => registry_error(e).into_response(),
    }
}

fn registry_error(e: RegistryError) -> ApiError {
    match e {
        RegistryError::NotFound(_) => ApiError::not_found(e.to_string()),
        RegistryError::Load { .. } | RegistryError::Unsupported => {
            ApiError::bad_param("lora_path", e.to_string())
        }
        _ => ApiError::bad_param("lora_name", e.to_string()),
    }
}

fn plain(text: String) -> Response {
    let mut r = Response::new(Body::from(text));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// Why the server could not run.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Binding or serving failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: std::io::Error,
    },
}

/// Serves `registry` until Ctrl-C or SIGTERM: prints `listening on http://ADDR` on stderr when
/// ready; on the first signal stops taking new requests (503), finishes the running and queued
/// ones, then returns; a second signal exits at once.
pub fn serve(registry: Registry, opts: ServeOptions) -> Result<(), ServeError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|source| ServeError::Io {
            what: "starting the async runtime".into(),
            source,
        })?;
    rt.block_on(serve_async(registry, opts))
}

async fn serve_async(registry: Registry, opts: ServeOptions) -> Result<(), ServeError> {
    let addr = format!("{}:{}", opts.host, opts.port);
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .map_err(|source| ServeError::Io {
            what: format!("binding {addr} (is another server on that port? try --port)"),
            source,
        })?;
    let local: SocketAddr = listener.local_addr().map_err(|source| ServeError::Io {
        what: "reading the bound address".into(),
        source,
    })?;
    warn_if_open(&local, &opts);
    let state = AppState {
        engine: Arc::new(Engine::start(opts.engine.clone())),
        registry: Arc::new(registry),
        max_body_bytes: opts.max_body_bytes,
        api_key: opts.api_key.clone(),
        runtime_lora: opts.runtime_lora.clone(),
    };
    eprintln!(
        "listening on http://{local} (models: {}; OpenAI API under /v1; Ctrl-C drains and stops)",
        state.registry.names().join(", ")
    );
    let engine = state.engine.clone();
    let app = router(state);
    axum::serve(listener, app)
        .with_graceful_shutdown(drain_on_signal(engine))
        .await
        .map_err(|source| ServeError::Io {
            what: "serving".into(),
            source,
        })?;
    eprintln!("stopped");
    Ok(())
}

/// Says what the access settings are: a warning for a server without a key on an address
/// other machines can reach, and where runtime adapters may come from.
fn warn_if_open(local: &SocketAddr, opts: &ServeOptions) {
    if let Some(dir) = &opts.runtime_lora {
        let note = if dir.path().is_dir() {
            ""
        } else {
            " (it does not exist yet)"
        };
        eprintln!(
            "runtime LoRA loading on: /v1/load_lora_adapter reads adapters from under {}{note}",
            dir.path().display()
        );
    }
    if opts.api_key.is_none() && !local.ip().is_loopback() {
        eprintln!(
            "warning: listening on {local} without an API key: anyone who can reach this address \
             can generate{}. Set --api-key KEY or RLFT_API_KEY, and put a TLS reverse proxy in \
             front of it (docs/serve.md, \"Running a rollout fleet safely\")",
            if opts.runtime_lora.is_some() {
                " and load adapters"
            } else {
                ""
            }
        );
    }
}

/// Resolves once a signal came and the engine has finished every request it had.
async fn drain_on_signal(engine: Arc<Engine>) {
    signal().await;
    engine.drain();
    eprintln!(
        "draining: {} requests in flight finish, new ones get 503 (signal again to stop now)",
        engine.in_flight()
    );
    let idle = async {
        while engine.in_flight() > 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::select! {
        _ = idle => {}
        _ = signal() => {
            eprintln!("second signal: stopping now");
            std::process::exit(130);
        }
    }
}

/// Ctrl-C, or SIGTERM on Unix.
async fn signal() {
    #[cfg(unix)]
    {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = async {
                match term.as_mut() {
                    Some(t) => { t.recv().await; }
                    None => std::future::pending::<()>().await,
                }
            } => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
