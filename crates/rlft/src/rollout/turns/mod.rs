//! Multi-turn rollouts: a completion may call tools in the model's own chat format and read
//! their answers (TRL's GRPOTrainer with `tools=[...]`), and play an episode with an
//! environment that answers each turn with an observation, a reward and whether it is done
//! (OpenRLHF's agent `reset`/`step`; [`rlft_tools::environment`]).
//!
//! After the first turn (generated as every rollout is, from the episode's first prompt:
//! [`episodes`]), each completion that ended its turn with an end-of-turn token goes on:
//!
//! - a turn that calls tools ([`rlft_tools::CallFormat`]) gets their answers as `tool`
//!   messages, up to `max_tool_calling_iterations` rounds (a turn with calls past the limit
//!   ends the completion);
//! - any other turn is the environment's action, when there is one: its observation follows
//!   as a `user` message, until it says done, gives no observation, or `max_turns` steps. A
//!   turn cut at the budget is still played (the environment judges it), then the episode ends.
//!
//! The inserted messages are rendered by the chat template and appended after the sampled ids
//! (token in, token out: nothing is re-tokenised), and generation continues from there. The
//! completion budget `max_completion_length` covers every token after the prompt, the inserted
//! ones too. The inserted tokens are marked in [`TurnTrace::mask`] so the loss and the log-prob
//! passes leave them out.

use std::sync::atomic::AtomicU64;

use rlft_model::generate::{Completion, FinishReason, GenerateRequest};
use rlft_text::{ChatTemplate, Message, RenderOptions, TextBundle};
use rlft_tools::{CallFormat, Environment, EnvironmentSpec, ToolAnswer, ToolBox, ToolSpec};
use serde_json::Value;

use super::{RolloutSettings, Sample};
use crate::data::prompts::PromptItem;
use crate::error::{Result, TrainerError};
use crate::run::optim::mix;

pub mod episodes;

/// Where the assistant turn ends in a rendering: the inserted messages' template text follows.
const TURN_END: &str = "\u{1}rlft-turn-end\u{1}";

/// The turns of one multi-turn completion.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TurnTrace {
    /// Per completion token: true where the policy sampled it, false on the tool answers,
    /// observations and template tokens inserted between turns (TRL's `tool_mask`).
    pub mask: Vec<bool>,
    /// Tool calls made (malformed ones included).
    pub calls: usize,
    /// Calls that failed (malformed, unknown tool, bad arguments, the tool's own error).
    pub failures: usize,
    /// Environment steps played.
    pub steps: usize,
    /// The sum of the rewards the environment's steps gave (`None`: none gave one).
    pub environment_reward: Option<f64>,
    /// The environment said the episode is done.
    pub done: bool,
    /// The whole completion decoded, inserted messages included (the sample's `text` holds
    /// the model's own turns only: what the rewards score).
    pub transcript: String,
}

/// A run's tools, as its model's template calls them.
struct Tools {
    tools: ToolBox,
    format: CallFormat,
    max_iterations: Option<usize>,
}

/// The tools and the environment of a run, and how its model's chat template carries them.
pub struct Turns {
    tools: Option<Tools>,
    environment: Option<Environment>,
    template: ChatTemplate,
    render: RenderOptions,
    /// Episodes started so far: ids are unique within the run.
    started: AtomicU64,
}

impl Turns {
    /// The tools of `specs` and the `environment` for a model with tokenizer `text`; `None`
    /// with neither. The template must render tools when there are tools (Qwen2.5, Qwen3,
    /// Llama 3 do).
    pub fn new(
        specs: &[ToolSpec],
        max_iterations: Option<usize>,
        environment: Option<&EnvironmentSpec>,
        text: &TextBundle,
    ) -> Result<Option<Turns>> {
        if specs.is_empty() && environment.is_none() {
            return Ok(None);
        }
        let what = if specs.is_empty() {
            "an [environment]"
        } else {
            "[[tools]]"
        };
        let template = text.compile_chat_template().map_err(|e| {
            TrainerError::Data(format!(
                "{what} need the model's chat template to show the turns between the model's, \
                 and this model has none ({e}); use a chat model such as qwen2.5-coder-0.5b"
            ))
        })?;
        let mut render = text.render_options(true);
        let tools = match specs.is_empty() {
            true => None,
            false => {
                let tools = ToolBox::new(specs)?;
                let format = CallFormat::detect(template.source()).ok_or_else(|| {
                    TrainerError::Data(
                        "the model's chat template does not render tools (no `tools` variable \
                         with <tool_call> or Llama 3's JSON calls); use a model whose template \
                         does (Qwen2.5, Qwen3, Llama 3.1+) or remove the [[tools]] tables"
                            .into(),
                    )
                })?;
                render.tools = Some(tools.schemas());
                Some(Tools {
                    tools,
                    format,
                    max_iterations,
                })
            }
        };
        let environment = environment.map(Environment::new).transpose()?;
        Ok(Some(Turns {
            tools,
            environment,
            template,
            render,
            started: AtomicU64::new(0),
        }))
    }

    /// Whether the run has tools.
    pub fn has_tools(&self) -> bool {
        self.tools.is_some()
    }

    /// Whether the run plays an environment.
    pub fn has_environment(&self) -> bool {
        self.environment.is_some()
    }

    /// The template text between the end of an assistant turn of conversation `prompt` and
    /// the next assistant turn, with `inserted` messages in between.
    fn between_turns(&self, prompt: &[Message], inserted: Vec<Message>) -> Result<String> {
        let mut conv = prompt.to_vec();
        conv.push(Message::assistant(TURN_END));
        conv.extend(inserted);
        let rendered = self.template.render(&conv, &self.render)?;
        let at = rendered.rfind(TURN_END).ok_or_else(|| {
            TrainerError::Data(
                "the chat template dropped the assistant turn's text, so rlft cannot tell where \
                 the next turn goes; use a template that renders assistant messages as they are"
                    .into(),
            )
        })?;
        Ok(rendered[at + TURN_END.len()..].to_string())
    }

    /// What follows a turn `body` (its ids, the end-of-turn token left out) that ended with an
    /// end-of-turn token (`ended`) or not (cut at the budget), of a completion at `p`, in
    /// episode `episode`: the messages to insert, or `None` when the completion is over.
    fn after_turn(
        &self,
        body: &[u32],
        ended: bool,
        text: &TextBundle,
        p: &mut Progress,
        trace: &mut TurnTrace,
        episode: Option<&str>,
    ) -> Result<Option<Vec<Message>>> {
        if let Some(t) = self.tools.as_ref().filter(|_| ended) {
            let calls = t.format.parse(&text.decode(body, false)?);
            if !calls.is_empty() {
                return Ok(t.answer(calls, p, trace));
            }
        }
        match (&self.environment, episode) {
            (Some(env), Some(id)) => step(env, id, &text.decode(body, true)?, ended, trace),
            _ => Ok(None),
        }
    }
}

impl Tools {
    /// The answers to a turn's `calls` as `tool` messages; `None` past the iteration limit.
    fn answer(
        &self,
        calls: Vec<std::result::Result<rlft_tools::ToolCall, String>>,
        p: &mut Progress,
        trace: &mut TurnTrace,
    ) -> Option<Vec<Message>> {
        if self.max_iterations.is_some_and(|m| p.tool_rounds >= m) {
            return None;
        }
        p.tool_rounds += 1;
        let answers: Vec<(String, ToolAnswer)> = calls
            .into_iter()
            .map(|c| match c {
                Ok(call) => (call.name.clone(), self.tools.call(&call)),
                Err(why) => (
                    String::new(),
                    ToolAnswer {
                        content: format!("error: malformed tool call: {why}"),
                        failed: true,
                    },
                ),
            })
            .collect();
        trace.calls += answers.len();
        trace.failures += answers.iter().filter(|(_, a)| a.failed).count();
        let messages = answers.into_iter().map(|(name, a)| {
            let mut m = Message::new("tool", a.content.as_str());
            m.extra.insert("name".into(), Value::String(name));
            m
        });
        Some(messages.collect())
    }
}

/// Plays `action` in episode `id` of `env`: the observation as a user message, or `None` when
/// the episode is over (done, no observation, `max_turns`, or a turn that did not end).
fn step(
    env: &Environment,
    id: &str,
    action: &str,
    ended: bool,
    trace: &mut TurnTrace,
) -> Result<Option<Vec<Message>>> {
    let limit = |steps: usize| env.max_turns().is_some_and(|m| steps >= m);
    if trace.done || limit(trace.steps) {
        return Ok(None);
    }
    let step = env.step(id, action)?;
    trace.steps += 1;
    if let Some(r) = step.reward {
        trace.environment_reward = Some(trace.environment_reward.unwrap_or(0.0) + r);
    }
    trace.done = step.done;
    let last = step.done || !ended || limit(trace.steps);
    Ok(step
        .observation
        .filter(|_| !last)
        .map(|o| vec![Message::user(o)]))
}

/// The model's own turns of a completion, decoded one by one and joined by newlines: what the
/// rewards read, so a rule that takes the last number of a reply never reads a tool's answer
/// as the model's.
fn own_turns(ids: &[u32], sampled: &[bool], text: &TextBundle) -> Result<String> {
    let mut turns = Vec::new();
    let mut start = 0;
    while start < ids.len() {
        let own = sampled[start];
        let len = sampled[start..].iter().take_while(|&&m| m == own).count();
        if own {
            turns.push(text.decode(&ids[start..start + len], true)?);
        }
        start += len;
    }
    Ok(turns.join("\n"))
}

/// Where each completion stands between rounds.
#[derive(Clone, Copy, Default)]
struct Progress {
    /// Start of its latest model turn in `completion_ids`.
    turn_start: usize,
    /// Tool-calling rounds so far.
    tool_rounds: usize,
    /// The completion is over: nothing follows its last turn.
    over: bool,
}

/// Continues first-turn `samples` (completions of `items`; `episodes[i]` the environment's
/// episode of sample `i`, empty without an environment) through their turns: answers each
/// turn's tool calls or plays it in the environment, appends what follows and generates the
/// next turn with `generate` (one request per round, a row per continuing completion, seed
/// `mix(seed, round)`), within the completion budget `s.max_new_tokens`.
pub fn continue_turns(
    samples: &mut [Sample],
    items: &[PromptItem],
    turns: &Turns,
    text: &TextBundle,
    s: &RolloutSettings,
    episodes: &[String],
    generate: &mut dyn FnMut(&GenerateRequest) -> Result<Vec<Completion>>,
) -> Result<()> {
    let budget = s.max_new_tokens;
    let mut progress = vec![Progress::default(); samples.len()];
    for round in 1u64.. {
        let mut next = Vec::new();
        for (i, sample) in samples.iter_mut().enumerate() {
            let p = &mut progress[i];
            let turn = &sample.completion_ids[p.turn_start..];
            let Some(&last) = turn.last().filter(|_| !p.over) else {
                continue;
            };
            // Each turn is looked at once: whatever happens below, it is not looked at again.
            p.over = true;
            let ended = !sample.truncated && s.eos_token_ids.contains(&last);
            let body = if ended { &turn[..turn.len() - 1] } else { turn };
            let len = sample.completion_ids.len();
            let mut trace = sample.turns.take().unwrap_or_else(|| TurnTrace {
                mask: vec![true; len],
                ..Default::default()
            });
            let episode = episodes.get(i).map(String::as_str);
            let inserted = turns.after_turn(body, ended, text, p, &mut trace, episode)?;
            let acted = trace.calls > 0 || trace.steps > 0;
            sample.turns = acted.then_some(trace);
            let Some(messages) = inserted else {
                continue;
            };
            let prompt = &sample.prompt_item(items).messages;
            let mut between = turns.between_turns(prompt, messages)?;
            // The model's own end-of-turn token already closed its turn.
            let end = text.decode(&[last], false)?;
            if !end.is_empty() && between.starts_with(&end) {
                between.drain(..end.len());
            }
            let ids = text.encode(&between, false)?;
            let room = budget.saturating_sub(len);
            let take = ids.len().min(room);
            sample.completion_ids.extend_from_slice(&ids[..take]);
            let trace = sample
                .turns
                .as_mut()
                .expect("a turn that acted has a trace");
            trace.mask.extend(std::iter::repeat_n(false, take));
            if take == room {
                sample.truncated = true; // no room left for the model's next turn
                continue;
            }
            p.turn_start = sample.completion_ids.len();
            p.over = false;
            next.push(i);
        }
        if next.is_empty() {
            break;
        }
        generate_round(samples, items, s, round, &next, generate)?;
    }
    for sample in samples.iter_mut() {
        if let Some(t) = &mut sample.turns {
            t.transcript = text.decode(&sample.completion_ids, true)?;
            sample.text = own_turns(&sample.completion_ids, &t.mask, text)?;
        }
    }
    Ok(())
}

/// Generates the next turn of samples `next`, each within what is left of the budget.
fn generate_round(
    samples: &mut [Sample],
    items: &[PromptItem],
    s: &RolloutSettings,
    round: u64,
    next: &[usize],
    generate: &mut dyn FnMut(&GenerateRequest) -> Result<Vec<Completion>>,
) -> Result<()> {
    let budget = s.max_new_tokens;
    let contexts: Vec<Vec<u32>> = next
        .iter()
        .map(|&i| {
            let sample = &samples[i];
            [
                &sample.prompt_item(items).ids[..],
                &sample.completion_ids[..],
            ]
            .concat()
        })
        .collect();
    let rooms: Vec<usize> = next
        .iter()
        .map(|&i| budget - samples[i].completion_ids.len())
        .collect();
    let req = GenerateRequest {
        prompts: contexts,
        n: 1,
        max_new_tokens: rooms.iter().copied().max().unwrap_or(0),
        sampling: s.sampling.clone(),
        seed: mix(s.seed, round),
        eos_token_ids: s.eos_token_ids.clone(),
        stop_strings: Vec::new(),
        pad_token_id: s.pad_token_id,
    };
    for c in generate(&req)? {
        let (i, room) = (next[c.prompt_index], rooms[c.prompt_index]);
        let take = c.token_ids.len().min(room);
        let sample = &mut samples[i];
        sample
            .completion_ids
            .extend_from_slice(&c.token_ids[..take]);
        if let Some(t) = &mut sample.turns {
            t.mask.extend(std::iter::repeat_n(true, take));
        }
        // Cut at the budget: the same tokens a smaller `max_new_tokens` would have given.
        sample.truncated =
            take < c.token_ids.len() || (c.finish_reason == FinishReason::Length && take == room);
    }
    Ok(())
}

#[cfg(test)]
mod tests;
