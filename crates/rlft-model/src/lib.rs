//! # rlft-model: the model runtime of rlft
//!
//! The only crate that knows tensors and devices. It loads the models users train (Hugging Face
//! directories and GGUF files; Llama, Qwen2/2.5 and Qwen3), computes what transformers computes,
//! and generates text.
//!
//! - [`config`]: `config.json` <-> [`config::ModelConfig`] (both rope layouts).
//! - [`decoder`]: the transformer with HF weight names; [`decoder::CausalLm::forward`] takes an
//!   external [`kv_cache::KvCache`] so one set of weights serves rollout, reference and training.
//! - [`ops`]: RMSNorm, RoPE, grouped-query attention over `rlft-kernels`' fused ops on the CPU,
//!   candle's ops and differentiable composites elsewhere.
//! - [`decode_fast`]: the fused f32 forward pass generation runs on the CPU, reading frozen
//!   weights from their GGUF blocks while they mirror the tensors ([`quantized`]).
//! - [`sampling`], [`generate`](mod@generate): batched, seeded generation sharing each prompt's prefill.
//! - [`load`]: one entry point, [`load::load_model`], for directories and GGUF files;
//!   [`export`] writes any loaded model back as an HF directory.
//! - [`trainable`]: trainable weights (`Var`s inside the model), per-token log-probs with a
//!   graph, the masked NLL loss.
//! - [`lora`]: LoRA adapters on the linear layers (PEFT semantics; one layer's adapter is
//!   [`adapter::LoraAdapter`]), merge, adapters on/off;
//!   [`peft`] reads and writes them as PEFT adapter directories.
//! - [`score`]: the scalar `score` head of reward models and critics (transformers'
//!   `*ForSequenceClassification`, one label): per-token and sequence scores, load and export.
//! - [`checkpoint`]: activation checkpointing of the decoder layers in training.
//! - [`tiny`]: deterministic tiny random models for tests.
//! - [`bench`](mod@bench): the standard forward+backward and reference-pass benchmark work, and process
//!   measurements (peak RSS, interference), shared by `rlft bench` and the examples.

pub mod adapter;
pub mod bench;
pub mod checkpoint;
pub mod config;
pub mod decode_fast;
pub mod decoder;
pub mod error;
pub mod export;
pub mod generate;
pub mod generation_config;
pub mod gguf_load;
pub mod kv_cache;
pub mod load;
pub mod lora;
pub mod ops;
pub mod peft;
pub mod quantized;
pub mod safetensors_io;
pub mod sampling;
pub mod score;
pub mod shared_prefix;
pub mod testing;
pub mod tiny;
pub mod trainable;
pub mod util;
pub mod weight;

pub use config::{Family, ModelConfig};
pub use decoder::{Batch, CausalLm};
pub use error::{ModelError, Result};
pub use generate::{generate, Completion, FinishReason, GenerateRequest};
pub use generation_config::GenerationConfig;
pub use kv_cache::KvCache;
pub use load::{load_model, LoadedModel};
pub use lora::{LoraAdapter, LoraConfig};
pub use sampling::SamplingParams;
