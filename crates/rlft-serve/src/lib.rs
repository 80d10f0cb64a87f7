//! # rlft-serve: an OpenAI-compatible HTTP server for rlft models
//!
//! `rlft serve --model M` answers `/v1/chat/completions`, `/v1/completions` and `/v1/models`
//! as OpenAI's API does (streaming as server-sent events, `n`, `seed`, `logprobs`, `stop`), so
//! the `openai` client, curl or any tool that speaks that API can use a model rlft trained.
//!
//! - [`engine`]: the scheduler thread that owns the decode state and runs continuous batching
//!   over rlft-model's fused CPU decoder: requests join the running batch between two decode
//!   steps and leave it when done; every sequence has its own KV cache and seeded PRNG stream.
//! - [`registry`]: the models by name, the base and LoRA adapters (PEFT directories), loaded
//!   and unloaded at run time through vLLM's `/v1/load_lora_adapter` and
//!   `/v1/unload_lora_adapter`.
//!   Runtime loading is off unless the operator names a directory the adapters must come from
//!   ([`adapter_dir`]).
//! - [`auth`]: the API key every endpoint but `/health` needs when one is set.
//! - [`protocol`], [`validate`], [`prepare`]: request bodies, their fields checked one by one
//!   (a 400 names the field and its range), and the checks into an engine job.
//! - [`tools`], [`tool_calls`]: OpenAI's `tools` shown to the model through its chat template,
//!   and the calls in its answer returned as `tool_calls` (streamed too).
//! - [`respond`]: answers and stream chunks; [`error`]: errors in OpenAI's JSON shape.
//! - [`server`]: routes, the body limit, and draining on Ctrl-C.
//!
//! ```no_run
//! # fn demo(loaded: rlft_model::LoadedModel) -> Result<(), Box<dyn std::error::Error>> {
//! use rlft_serve::{serve, AdapterDir, ApiKey, Registry, ServeOptions};
//! let registry = Registry::new(loaded, "default")?;
//! registry.load_adapter("my-lora", std::path::Path::new("out/adapter"), false)?;
//! let opts = ServeOptions {
//!     api_key: Some(ApiKey::new("my-secret")?), // requests send `Authorization: Bearer my-secret`
//!     runtime_lora: Some(AdapterDir::new(std::path::Path::new("out/grpo/rollout_adapters"))?),
//!     ..ServeOptions::default()
//! };
//! serve(registry, opts)?; // until Ctrl-C
//! # Ok(()) }
//! ```

pub mod adapter_dir;
pub mod auth;
pub mod engine;
pub mod error;
pub mod prepare;
pub mod protocol;
pub mod registry;
pub mod respond;
pub mod server;
pub mod tool_calls;
pub mod tools;
pub mod validate;

pub use adapter_dir::{AdapterDir, AdapterPathError};
pub use auth::{ApiKey, ApiKeyError};
pub use engine::{Engine, EngineConfig, Event, Job, ServedModel, SubmitError};
pub use registry::{Registry, RegistryError};
pub use server::{serve, ServeError, ServeOptions};
