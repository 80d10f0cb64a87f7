//! `rlft generate` and `rlft chat`.

use std::io::{BufRead, Write};
use std::time::Instant;

use anyhow::{bail, Result};
use clap::Args;
use rlft_model::{generate, GenerateRequest, LoadedModel, SamplingParams};
use rlft_text::Message;

use crate::common::{chat_prompt_ids, load, ModelArgs};

/// Sampling options shared by `generate` and `chat`. Unset values come from the model's
/// generation_config.json when it asks for sampling, else temperature 1, no truncation.
#[derive(Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Greedy decoding (argmax); overrides the sampling options.
    #[arg(long)]
    pub greedy: bool,
    /// Softmax temperature (0 = greedy).
    #[arg(long)]
    pub temperature: Option<f32>,
    /// Keep the k most likely tokens (0 = off).
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Nucleus sampling mass (1 = off).
    #[arg(long)]
    pub top_p: Option<f32>,
    /// Drop tokens below min_p x the top probability (0 = off).
    #[arg(long)]
    pub min_p: Option<f32>,
    /// Penalty on already-seen tokens (1 = off).
    #[arg(long)]
    pub repetition_penalty: Option<f32>,
    /// Most new tokens per sample.
    #[arg(long, default_value_t = 256)]
    pub max_new_tokens: usize,
    /// Seed of the sampler (same seed, same text).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Stop when the text contains this string (repeatable).
    #[arg(long = "stop")]
    pub stop: Vec<String>,
}

impl SamplingArgs {
    fn params(&self, m: &LoadedModel) -> SamplingParams {
        if self.greedy {
            return SamplingParams::greedy();
        }
        let base = if m.generation.do_sample {
            m.generation.sampling.clone()
        } else {
            SamplingParams::default()
        };
        SamplingParams {
            temperature: self.temperature.unwrap_or(base.temperature),
            top_k: self.top_k.unwrap_or(base.top_k),
            top_p: self.top_p.unwrap_or(base.top_p),
            min_p: self.min_p.unwrap_or(base.min_p),
            repetition_penalty: self.repetition_penalty.unwrap_or(base.repetition_penalty),
        }
    }

    fn request(&self, m: &LoadedModel, prompts: Vec<Vec<u32>>, n: usize) -> GenerateRequest {
        GenerateRequest {
            prompts,
            n,
            max_new_tokens: self.max_new_tokens,
            sampling: self.params(m),
            seed: self.seed,
            eos_token_ids: m.generation.eos_token_ids.clone(),
            stop_strings: self.stop.clone(),
            pad_token_id: m.generation.pad_token_id.unwrap_or(0),
        }
    }
}

/// `rlft generate`.
#[derive(Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Prompts (each one is a batch row); `-` reads one prompt per line from stdin.
    #[arg(required = true)]
    pub prompts: Vec<String>,
    /// Wrap each prompt as a user message in the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// System message for --chat.
    #[arg(long)]
    pub system: Option<String>,
    /// Samples per prompt (they share one prefill of the prompt).
    #[arg(short = 'n', long, default_value_t = 1)]
    pub num_samples: usize,
    /// Print JSON lines (text, token ids, log-probs, finish reason) instead of text.
    #[arg(long)]
    pub json: bool,
}

fn read_prompts(raw: &[String]) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for p in raw {
        if p == "-" {
            for line in std::io::stdin().lock().lines() {
                let line = line?;
                if !line.trim().is_empty() {
                    out.push(line);
                }
            }
        } else {
            out.push(p.clone());
        }
    }
    if out.is_empty() {
        bail!("no prompts given; pass prompts as arguments or `-` to read them from stdin");
    }
    Ok(out)
}

/// Runs `rlft generate`.
pub fn run_generate(a: GenerateArgs) -> Result<()> {
    if a.system.is_some() && !a.chat {
        bail!("--system needs --chat (the system message goes into the chat template)");
    }
    let prompts = read_prompts(&a.prompts)?;
    let m = load(&a.model)?;
    let ids: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| {
            if a.chat {
                let mut msgs = Vec::new();
                if let Some(s) = &a.system {
                    msgs.push(Message::system(s.as_str()));
                }
                msgs.push(Message::user(p.as_str()));
                chat_prompt_ids(&m, &msgs)
            } else {
                Ok(m.text.encode(p, true)?)
            }
        })
        .collect::<Result<_>>()?;
    let req = a.sampling.request(&m, ids, a.num_samples);
    let t0 = Instant::now();
    let detok = |ids: &[u32]| m.text.decode(ids, true).unwrap_or_default();
    let out = generate(&m.model, &req, &detok)?;
    let secs = t0.elapsed().as_secs_f64();
    let new_tokens: usize = out.iter().map(|c| c.token_ids.len()).sum();
    for c in &out {
        if a.json {
            let v = serde_json::json!({
                "prompt": prompts[c.prompt_index],
                "prompt_index": c.prompt_index,
                "sample_index": c.sample_index,
                "text": c.text,
                "token_ids": c.token_ids,
                "logprobs": c.logprobs,
                "finish_reason": c.finish_reason,
            });
            println!("{v}");
        } else {
            if out.len() > 1 {
                println!(
                    "--- prompt {} sample {} ({:?})",
                    c.prompt_index, c.sample_index, c.finish_reason
                );
            }
            println!("{}", c.text);
        }
    }
    eprintln!(
        "{new_tokens} new tokens in {secs:.2}s ({:.1} tokens/s)",
        new_tokens as f64 / secs.max(1e-9)
    );
    Ok(())
}

/// `rlft chat`.
#[derive(Args, Debug)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// System message.
    #[arg(long)]
    pub system: Option<String>,
}

/// Runs `rlft chat`: one line per user turn; `/reset`, `/system TEXT`, `/exit`. Replies stream
/// as they are decoded (through the server's engine, [`rlft_serve::Engine`]); a model the fused
/// CPU decoder does not run (bf16, CUDA) prints each reply when it is done.
pub fn run_chat(a: ChatArgs) -> Result<()> {
    let m = load(&a.model)?;
    let sampling = a.sampling.params(&m);
    let mut chat = if rlft_model::decode_fast::supported(&m.model) {
        let registry = rlft_serve::Registry::new(m, "chat")?;
        Replier::Streaming {
            model: registry.base().clone(),
            engine: rlft_serve::Engine::start(rlft_serve::EngineConfig::default()),
        }
    } else {
        Replier::Whole(Box::new(m))
    };
    let mut system = a.system.clone();
    let mut history: Vec<Message> = Vec::new();
    let stdin = std::io::stdin();
    let mut turn = 0u64;
    eprintln!("chat: type a message; /reset clears the history, /system TEXT sets it, /exit quits");
    loop {
        eprint!("> ");
        std::io::stderr().flush().ok();
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 {
            break;
        }
        let line = line.trim_end_matches(['\n', '\r']);
        match line.trim() {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                history.clear();
                eprintln!("(history cleared)");
                continue;
            }
            cmd if cmd.starts_with("/system") => {
                let s = cmd.trim_start_matches("/system").trim();
                system = (!s.is_empty()).then(|| s.to_string());
                history.clear();
                eprintln!("(system message set; history cleared)");
                continue;
            }
            _ => {}
        }
        history.push(Message::user(line));
        let mut msgs: Vec<Message> = system.iter().map(|s| Message::system(s.as_str())).collect();
        msgs.extend(history.iter().cloned());
        let mut args = a.sampling.clone();
        args.seed = a.sampling.seed.wrapping_add(turn);
        let reply = match &mut chat {
            Replier::Whole(m) => {
                let ids = chat_prompt_ids(m, &msgs)?;
                let req = args.request(m, vec![ids], 1);
                let detok = |ids: &[u32]| m.text.decode(ids, true).unwrap_or_default();
                let out = generate(&m.model, &req, &detok)?;
                let reply = out[0].text.trim().to_string();
                println!("{reply}");
                reply
            }
            Replier::Streaming { model, engine } => {
                let ids = served_chat_ids(model, &msgs)?;
                let ctx = model.max_model_len();
                if ids.len() + args.max_new_tokens > ctx {
                    bail!(
                        "the conversation ({} tokens) + --max-new-tokens ({}) exceeds the model's \
                         context of {ctx} tokens; /reset the history or lower --max-new-tokens",
                        ids.len(),
                        args.max_new_tokens
                    );
                }
                let job = rlft_serve::Job {
                    model: model.clone(),
                    prompts: vec![ids],
                    n: 1,
                    max_tokens: args.max_new_tokens.max(1),
                    sampling: sampling.clone(),
                    seed: args.seed,
                    stop: rlft_text::StopStrings::new(args.stop.clone())?,
                    ignore_eos: false,
                    top_logprobs: None,
                };
                stream_reply(engine, job)?
            }
        };
        history.push(Message::assistant(reply.as_str()));
        turn += 1;
    }
    Ok(())
}

/// How `rlft chat` produces replies.
enum Replier {
    /// Token by token through the serving engine (the fused CPU decoder).
    Streaming {
        model: std::sync::Arc<rlft_serve::ServedModel>,
        engine: rlft_serve::Engine,
    },
    /// One `generate` call per reply (other devices and dtypes).
    Whole(Box<LoadedModel>),
}

/// Renders `messages` with a served model's chat template into prompt ids.
fn served_chat_ids(m: &rlft_serve::ServedModel, messages: &[Message]) -> Result<Vec<u32>> {
    let tpl = m.template.as_ref().map_err(|why| {
        anyhow::anyhow!("this model has no usable chat template ({why}); use `rlft generate`")
    })?;
    let text = tpl.render(messages, &m.text.render_options(true))?;
    Ok(m.text.encode(&text, false)?)
}

/// Prints a reply as its tokens are decoded (leading whitespace skipped, as the printed reply
/// was trimmed before) and returns it trimmed.
fn stream_reply(engine: &rlft_serve::Engine, job: rlft_serve::Job) -> Result<String> {
    let mut rx = engine.submit(job)?;
    let mut reply = String::new();
    let mut out = std::io::stdout().lock();
    while let Some(ev) = rx.blocking_recv() {
        match ev {
            rlft_serve::Event::Token { text, .. } => {
                let piece = if reply.trim().is_empty() {
                    text.trim_start()
                } else {
                    text.as_str()
                };
                reply.push_str(&text);
                if !piece.is_empty() {
                    write!(out, "{piece}")?;
                    out.flush()?;
                }
            }
            rlft_serve::Event::Finished { .. } => break,
            rlft_serve::Event::Failed(e) => bail!("generation failed: {e}"),
        }
    }
    writeln!(out)?;
    Ok(reply.trim().to_string())
}
