//! The request bodies of the OpenAI API (and vLLM's extensions) that the server reads. Unknown
//! fields are ignored, as OpenAI-compatible servers do; fields that would change the output and
//! are not implemented are read so that they can be refused with a clear message. Each field's
//! type and range is checked first by [`crate::validate`], which names the field in its error.

use rlft_text::Message;
use serde::Deserialize;
use serde_json::{Map, Value};

/// `stop`: one string or a list.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    /// One stop string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

impl Stop {
    /// The stop strings.
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Stop::One(s) => vec![s],
            Stop::Many(v) => v,
        }
    }
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk with the token counts (`choices: []`, `usage`).
    #[serde(default)]
    pub include_usage: bool,
}

/// `response_format.type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResponseFormatType {
    /// Plain text (the only one served).
    Text,
    /// JSON mode: refused.
    JsonObject,
    /// Structured output: refused.
    JsonSchema,
}

/// `response_format`.
#[derive(Debug, Clone, Deserialize)]
pub struct ResponseFormat {
    /// The format.
    #[serde(rename = "type")]
    pub kind: ResponseFormatType,
}

/// Fields shared by `/v1/chat/completions` and `/v1/completions`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Common {
    /// Most new tokens per choice.
    pub max_tokens: Option<u64>,
    /// Softmax temperature, 0 = greedy (default: the model's generation config, else 1).
    pub temperature: Option<f32>,
    /// Nucleus mass (default 1 = off).
    pub top_p: Option<f32>,
    /// Keep the k most likely tokens; 0 or -1 = off (vLLM's extension).
    pub top_k: Option<i64>,
    /// Drop tokens below min_p x the top probability (vLLM's extension).
    pub min_p: Option<f32>,
    /// Penalty on tokens already in the prompt or the completion (vLLM's extension).
    pub repetition_penalty: Option<f32>,
    /// Choices per prompt.
    pub n: Option<u64>,
    /// Stop strings (not part of the returned text).
    pub stop: Option<Stop>,
    /// Seed of the sampler: same seed, same output.
    pub seed: Option<i64>,
    /// Stream chunks as server-sent events.
    #[serde(default)]
    pub stream: Option<bool>,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// Keep going past the end-of-sequence token (vLLM's extension).
    pub ignore_eos: Option<bool>,
    /// Return the sampled token ids with each choice and the prompt's ids (vLLM's extension).
    pub return_token_ids: Option<bool>,
    /// Not implemented: refused unless 0.
    pub presence_penalty: Option<f32>,
    /// Not implemented: refused unless 0.
    pub frequency_penalty: Option<f32>,
    /// Not implemented: refused when set.
    pub logit_bias: Option<Map<String, Value>>,
    /// Only `{"type": "text"}` is served; JSON modes are refused.
    pub response_format: Option<ResponseFormat>,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    /// Served model name.
    pub model: String,
    /// The conversation, rendered with the model's chat template.
    pub messages: Vec<Message>,
    /// The shared fields.
    #[serde(flatten)]
    pub common: Common,
    /// OpenAI's newer name for `max_tokens`.
    pub max_completion_tokens: Option<u64>,
    /// Return the log-probability of each sampled token.
    pub logprobs: Option<bool>,
    /// With `logprobs`: also the k most likely tokens at each position (0-20).
    pub top_logprobs: Option<u64>,
    /// Start an assistant turn after the messages (default true; vLLM's extension).
    pub add_generation_prompt: Option<bool>,
    /// Continue the final (assistant) message instead (vLLM's extension).
    pub continue_final_message: Option<bool>,
    /// Extra template variables (vLLM's extension), e.g. `enable_thinking`.
    pub chat_template_kwargs: Option<Map<String, Value>>,
    /// Tools the model may call, `{"type": "function", "function": {"name", "description",
    /// "parameters"}}` each, shown to it through its chat template ([`crate::tools`]).
    pub tools: Option<Vec<Value>>,
    /// `"auto"` (the default) or `"none"`; `"required"` and a named function are refused.
    pub tool_choice: Option<Value>,
}

/// `prompt` of `/v1/completions`: text or token ids, one or a batch.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    /// One text.
    Text(String),
    /// Several texts.
    Texts(Vec<String>),
    /// One prompt as token ids.
    Ids(Vec<u32>),
    /// Several prompts as token ids.
    IdLists(Vec<Vec<u32>>),
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    /// Served model name.
    pub model: String,
    /// The prompt(s), used as they are (no chat template).
    pub prompt: Prompt,
    /// The shared fields.
    #[serde(flatten)]
    pub common: Common,
    /// Return log-probabilities of the sampled tokens and of the k most likely (0-20).
    pub logprobs: Option<u64>,
    /// Not implemented: refused when true.
    pub echo: Option<bool>,
    /// Not implemented: refused when set.
    pub suffix: Option<String>,
    /// Not implemented: refused when above `n`.
    pub best_of: Option<u64>,
}

/// `POST /v1/load_lora_adapter` (vLLM's runtime LoRA endpoint).
#[derive(Debug, Clone, Deserialize)]
pub struct LoadLora {
    /// The model name requests will use.
    pub lora_name: String,
    /// A PEFT adapter directory on the server's file system.
    pub lora_path: String,
    /// Replace an adapter already loaded under this name (vLLM's `load_inplace`); without it
    /// that is an error. Requests already running finish on the old weights.
    #[serde(default)]
    pub load_inplace: bool,
}

/// `POST /v1/unload_lora_adapter`.
#[derive(Debug, Clone, Deserialize)]
pub struct UnloadLora {
    /// The adapter's model name.
    pub lora_name: String,
}
