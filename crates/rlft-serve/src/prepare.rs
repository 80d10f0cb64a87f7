//! From a request body to an engine [`Job`]: the model by name, the prompt (chat template or
//! raw text/ids), and the sampling fields checked and resolved against the model's defaults.
//! Field types and ranges come checked by [`crate::validate`]; the checks here are those that
//! need the model (the context length, the vocabulary) or refuse what is not implemented.

use std::sync::Arc;

use rlft_model::SamplingParams;
use rlft_text::{RenderOptions, StopStrings};
use rlft_tools::CallFormat;

use crate::engine::{random_seed, Job, ServedModel};
use crate::error::ApiError;
use crate::protocol::{ChatRequest, Common, CompletionRequest, Prompt, ResponseFormatType};
use crate::registry::Registry;

/// Most alternatives per position `top_logprobs` / `logprobs` may ask for (vLLM's limit).
pub const MAX_TOP_LOGPROBS: u64 = 20;
/// `max_tokens` of `/v1/completions` when unset (OpenAI's default).
pub const COMPLETION_DEFAULT_MAX_TOKENS: usize = 16;

/// Which endpoint: the shape of the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completion,
}

/// A request ready for the engine, with what the answer needs.
#[derive(Debug)]
pub struct Prepared {
    /// The endpoint.
    pub kind: Kind,
    /// The engine's job.
    pub job: Job,
    /// Answer with server-sent events.
    pub stream: bool,
    /// Send a usage chunk at the end of a stream.
    pub include_usage: bool,
    /// Report log-probabilities.
    pub logprobs: bool,
    /// Add the token ids (vLLM's `return_token_ids`).
    pub return_token_ids: bool,
    /// Read tool calls out of the answer in this format (a chat request with tools).
    pub tool_calls: Option<CallFormat>,
}

/// Resolves a chat request.
pub fn chat(reg: &Registry, req: ChatRequest) -> Result<Prepared, ApiError> {
    let model = find_model(reg, &req.model)?;
    let template = model.template.as_ref().map_err(|why| {
        ApiError::bad_request(format!(
            "model `{}` has no usable chat template ({why}); use /v1/completions with a raw prompt",
            model.name
        ))
    })?;
    let tools = crate::tools::resolve(
        &model.name,
        template,
        req.tools.as_deref(),
        req.tool_choice.as_ref(),
    )?;
    let messages = crate::tools::template_messages(&req.messages)?;
    let cont = req.continue_final_message.unwrap_or(false);
    let opts = RenderOptions {
        add_generation_prompt: req.add_generation_prompt.unwrap_or(!cont),
        continue_final_message: cont,
        kwargs: req.chat_template_kwargs.clone().unwrap_or_default(),
        tools: tools.as_ref().map(|t| t.schemas.clone()),
        ..model.text.render_options(true)
    };
    let text = template
        .render(&messages, &opts)
        .map_err(|e| ApiError::bad_param("messages", e.to_string()))?;
    let ids = model
        .text
        .encode(&text, false)
        .map_err(|e| ApiError::bad_param("messages", e.to_string()))?;
    let top = match (req.logprobs.unwrap_or(false), req.top_logprobs) {
        (false, Some(k)) if k > 0 => {
            return Err(ApiError::bad_param(
                "top_logprobs",
                "top_logprobs needs \"logprobs\": true",
            ))
        }
        (false, _) => None,
        (true, k) => Some(check_top(k.unwrap_or(0), "top_logprobs")?),
    };
    let max = req.max_completion_tokens.or(req.common.max_tokens);
    let job = job(&model, vec![ids], &req.common, max, None, top)?;
    Ok(Prepared {
        tool_calls: tools.map(|t| t.format),
        ..finish(Kind::Chat, job, &req.common, top.is_some())
    })
}

/// Resolves a completion request.
pub fn completion(reg: &Registry, req: CompletionRequest) -> Result<Prepared, ApiError> {
    let model = find_model(reg, &req.model)?;
    if req.echo.unwrap_or(false) {
        return Err(ApiError::bad_param("echo", "echo is not supported"));
    }
    if req.suffix.is_some() {
        return Err(ApiError::bad_param("suffix", "suffix is not supported"));
    }
    let n = req.common.n.unwrap_or(1);
    if req.best_of.is_some_and(|b| b > n) {
        return Err(ApiError::bad_param(
            "best_of",
            "best_of above n is not supported; ask for n choices and rank them yourself",
        ));
    }
    let encode = |p: &str| {
        model
            .text
            .encode(p, true)
            .map_err(|e| ApiError::bad_param("prompt", e.to_string()))
    };
    let prompts: Vec<Vec<u32>> = match &req.prompt {
        Prompt::Text(p) => vec![encode(p)?],
        Prompt::Texts(ps) => ps.iter().map(|p| encode(p)).collect::<Result<_, _>>()?,
        Prompt::Ids(ids) => vec![ids.clone()],
        Prompt::IdLists(l) => l.clone(),
    };
    if prompts.is_empty() {
        return Err(ApiError::bad_param("prompt", "the prompt list is empty"));
    }
    let vocab = model.model.config.vocab_size;
    for p in &prompts {
        if p.is_empty() {
            return Err(ApiError::bad_param(
                "prompt",
                "a prompt has no tokens; every prompt needs at least one token",
            ));
        }
        if let Some(bad) = p.iter().find(|&&t| t as usize >= vocab) {
            return Err(ApiError::bad_param(
                "prompt",
                format!("token id {bad} is outside the vocabulary (size {vocab})"),
            ));
        }
    }
    let top = req.logprobs.map(|k| check_top(k, "logprobs")).transpose()?;
    let job = job(
        &model,
        prompts,
        &req.common,
        req.common.max_tokens,
        Some(COMPLETION_DEFAULT_MAX_TOKENS),
        top,
    )?;
    Ok(finish(Kind::Completion, job, &req.common, top.is_some()))
}

fn finish(kind: Kind, job: Job, c: &Common, logprobs: bool) -> Prepared {
    Prepared {
        kind,
        job,
        stream: c.stream.unwrap_or(false),
        include_usage: c.stream_options.as_ref().is_some_and(|o| o.include_usage),
        logprobs,
        return_token_ids: c.return_token_ids.unwrap_or(false),
        tool_calls: None,
    }
}

fn find_model(reg: &Registry, name: &str) -> Result<Arc<ServedModel>, ApiError> {
    reg.get(name)
        .ok_or_else(|| ApiError::unknown_model(name, &reg.names()))
}

fn check_top(k: u64, param: &'static str) -> Result<usize, ApiError> {
    if k > MAX_TOP_LOGPROBS {
        return Err(ApiError::bad_param(
            param,
            format!("{param} must be at most {MAX_TOP_LOGPROBS} (got {k})"),
        ));
    }
    Ok(k as usize)
}

/// The job for `prompts` on `model`: `max_tokens` checked against the context (unset: the
/// endpoint's default, or all the room the longest prompt leaves), sampling fields over the
/// model's defaults.
fn job(
    model: &Arc<ServedModel>,
    prompts: Vec<Vec<u32>>,
    c: &Common,
    max_tokens: Option<u64>,
    default_max: Option<usize>,
    top_logprobs: Option<usize>,
) -> Result<Job, ApiError> {
    let ctx = model.max_model_len();
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let max_tokens = match max_tokens {
        Some(0) => {
            return Err(ApiError::bad_param(
                "max_tokens",
                "max_tokens must be at least 1",
            ))
        }
        Some(m) => usize::try_from(m).unwrap_or(usize::MAX),
        None => default_max.unwrap_or(ctx.saturating_sub(longest)),
    };
    if longest + max_tokens > ctx || longest >= ctx {
        return Err(ApiError::bad_param(
            "max_tokens",
            format!(
                "This model's maximum context length is {ctx} tokens. However, you requested \
                 {} tokens ({longest} in the prompt, {max_tokens} in the completion). Please \
                 reduce the length of the prompt or of max_tokens.",
                longest.saturating_add(max_tokens)
            ),
        ));
    }
    let n = match c.n.unwrap_or(1) {
        0 => return Err(ApiError::bad_param("n", "n must be at least 1")),
        n => usize::try_from(n).unwrap_or(usize::MAX),
    };
    for (param, v) in [
        ("presence_penalty", c.presence_penalty),
        ("frequency_penalty", c.frequency_penalty),
    ] {
        if v.is_some_and(|v| v != 0.0) {
            return Err(ApiError::bad_param(
                param,
                format!("{param} is not supported; use repetition_penalty (1 = off) instead"),
            ));
        }
    }
    if c.response_format
        .as_ref()
        .is_some_and(|f| f.kind != ResponseFormatType::Text)
    {
        return Err(ApiError::bad_param(
            "response_format",
            "only {\"type\": \"text\"} is supported (no JSON mode or structured output); \
             ask for JSON in the prompt and parse the text",
        ));
    }
    if c.logit_bias.as_ref().is_some_and(|b| !b.is_empty()) {
        return Err(ApiError::bad_param(
            "logit_bias",
            "logit_bias is not supported",
        ));
    }
    let d = &model.defaults;
    let sampling = SamplingParams {
        temperature: c.temperature.unwrap_or(d.temperature),
        top_k: c
            .top_k
            .map_or(d.top_k, |k| usize::try_from(k.max(0)).unwrap_or(0)),
        top_p: c.top_p.unwrap_or(d.top_p),
        min_p: c.min_p.unwrap_or(d.min_p),
        repetition_penalty: c.repetition_penalty.unwrap_or(d.repetition_penalty),
    };
    sampling.validate().map_err(ApiError::bad_request)?;
    let stop = StopStrings::new(c.stop.clone().map(|s| s.into_vec()).unwrap_or_default())
        .map_err(|e| ApiError::bad_param("stop", e.to_string()))?;
    Ok(Job {
        model: model.clone(),
        prompts,
        n,
        max_tokens,
        sampling,
        seed: c.seed.map_or_else(random_seed, |s| s as u64),
        stop,
        ignore_eos: c.ignore_eos.unwrap_or(false),
        top_logprobs,
    })
}
