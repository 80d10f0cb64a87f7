//! Multi-turn rollouts with tools: a completion may call tools in the model's own chat format,
//! read their answers and go on, as TRL's GRPOTrainer does with `tools=[...]`.
//!
//! After the first turn (generated as every rollout is), each completion that ended its turn
//! with an end-of-turn token and called tools ([`rlft_tools::CallFormat`]) gets their answers
//! appended as `tool` messages rendered by the chat template, and generation continues from
//! there, until no completion calls a tool, `max_tool_calling_iterations` rounds, or the
//! completion budget (`max_completion_length` covers every token after the prompt, the tool
//! answers too). Token in, token out: the sampled ids are kept as they are and the template's
//! tokens are appended after them, never re-tokenised. The appended tokens are marked in
//! [`ToolTrace::mask`] so the loss and the log-prob passes leave them out.

use rlft_model::generate::{Completion, FinishReason, GenerateRequest};
use rlft_text::{ChatTemplate, Message, RenderOptions, TextBundle};
use rlft_tools::{CallFormat, ToolAnswer, ToolBox, ToolSpec};
use serde_json::Value;

use super::{RolloutSettings, Sample};
use crate::data::prompts::PromptItem;
use crate::error::{Result, TrainerError};
use crate::run::optim::mix;

/// Where the assistant turn ends in a rendering: the tool answers' template text follows it.
const TURN_END: &str = "\u{1}rlft-turn-end\u{1}";

/// The tool calls of one completion.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolTrace {
    /// Per completion token: true where the policy sampled it, false on the tool answers and
    /// template tokens inserted between turns (TRL's `tool_mask`).
    pub mask: Vec<bool>,
    /// Tool calls made (malformed ones included).
    pub calls: usize,
    /// Calls that failed (malformed, unknown tool, bad arguments, the tool's own error).
    pub failures: usize,
    /// The whole completion decoded, tool answers included (the sample's `text` holds the
    /// model's own turns only: what the rewards score).
    pub transcript: String,
}

/// The tools of a run and how its model's chat template carries them.
pub struct Turns {
    tools: ToolBox,
    format: CallFormat,
    template: ChatTemplate,
    render: RenderOptions,
    max_iterations: Option<usize>,
}

impl Turns {
    /// The tools of `specs` for a model with tokenizer `text`; `None` without tools. The
    /// template must render tools (Qwen2.5, Qwen3, Llama 3 do).
    pub fn new(
        specs: &[ToolSpec],
        max_iterations: Option<usize>,
        text: &TextBundle,
    ) -> Result<Option<Turns>> {
        if specs.is_empty() {
            return Ok(None);
        }
        let tools = ToolBox::new(specs)?;
        let template = text.compile_chat_template().map_err(|e| {
            TrainerError::Data(format!(
                "[[tools]] need the model's chat template to show the tools and their answers, \
                 and this model has none ({e}); use a chat model such as qwen2.5-coder-0.5b"
            ))
        })?;
        let format = CallFormat::detect(template.source()).ok_or_else(|| {
            TrainerError::Data(
                "the model's chat template does not render tools (no `tools` variable with \
                 <tool_call> or Llama 3's JSON calls); use a model whose template does (Qwen2.5, \
                 Qwen3, Llama 3.1+) or remove the [[tools]] tables"
                    .into(),
            )
        })?;
        let mut render = text.render_options(true);
        render.tools = Some(tools.schemas());
        Ok(Some(Turns {
            tools,
            format,
            template,
            render,
            max_iterations,
        }))
    }

    /// The template text between the end of an assistant turn of conversation `prompt` and
    /// the next assistant turn, with `answers` as `tool` messages in between.
    fn between_turns(
        &self,
        prompt: &[Message],
        answers: &[(String, ToolAnswer)],
    ) -> Result<String> {
        let mut conv = prompt.to_vec();
        conv.push(Message::assistant(TURN_END));
        for (name, a) in answers {
            let mut m = Message::new("tool", a.content.as_str());
            m.extra.insert("name".into(), Value::String(name.clone()));
            conv.push(m);
        }
        let rendered = self.template.render(&conv, &self.render)?;
        let at = rendered.rfind(TURN_END).ok_or_else(|| {
            TrainerError::Data(
                "the chat template dropped the assistant turn's text, so rlft cannot tell where \
                 the tool answers go; use a template that renders assistant messages as they are"
                    .into(),
            )
        })?;
        Ok(rendered[at + TURN_END.len()..].to_string())
    }

    /// The calls in one turn, answered: `(tool name, answer)`.
    fn answer(&self, turn: &str) -> Vec<(String, ToolAnswer)> {
        self.format
            .parse(turn)
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
            .collect()
    }
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
#[derive(Clone, Copy)]
struct Progress {
    /// Start of its latest model turn in `completion_ids`.
    turn_start: usize,
    /// Tool-calling rounds so far.
    rounds: usize,
}

/// Continues first-turn `samples` (completions of `items`) through their tool calls: answers
/// each turn's calls, appends them and generates the next turn with `generate` (one request per
/// round, a row per continuing completion, seed `mix(seed, round)`), within the completion
/// budget `s.max_new_tokens`. Completions that call no tool are left as they are.
pub fn continue_with_tools(
    samples: &mut [Sample],
    items: &[PromptItem],
    turns: &Turns,
    text: &TextBundle,
    s: &RolloutSettings,
    generate: &mut dyn FnMut(&GenerateRequest) -> Result<Vec<Completion>>,
) -> Result<()> {
    let budget = s.max_new_tokens;
    let mut progress = vec![
        Progress {
            turn_start: 0,
            rounds: 0
        };
        samples.len()
    ];
    for round in 1u64.. {
        let mut next = Vec::new();
        for (i, sample) in samples.iter_mut().enumerate() {
            let p = progress[i];
            let turn = &sample.completion_ids[p.turn_start..];
            let Some((&last, body)) = turn.split_last() else {
                continue;
            };
            if sample.truncated
                || !s.eos_token_ids.contains(&last)
                || turns.max_iterations.is_some_and(|m| p.rounds >= m)
            {
                continue;
            }
            let answers = turns.answer(&text.decode(body, false)?);
            if answers.is_empty() {
                continue;
            }
            let mut between = turns.between_turns(&items[sample.prompt].messages, &answers)?;
            // The model's own end-of-turn token already closed its turn.
            let end = text.decode(&[last], false)?;
            if !end.is_empty() && between.starts_with(&end) {
                between.drain(..end.len());
            }
            let inserted = text.encode(&between, false)?;
            let len = sample.completion_ids.len();
            let trace = sample.tools.get_or_insert_with(|| ToolTrace {
                mask: vec![true; len],
                ..Default::default()
            });
            trace.calls += answers.len();
            trace.failures += answers.iter().filter(|(_, a)| a.failed).count();
            let room = budget.saturating_sub(len);
            let take = inserted.len().min(room);
            sample.completion_ids.extend_from_slice(&inserted[..take]);
            trace.mask.extend(std::iter::repeat_n(false, take));
            if take == room {
                sample.truncated = true; // no room left for the model's next turn
                continue;
            }
            progress[i] = Progress {
                turn_start: sample.completion_ids.len(),
                rounds: p.rounds + 1,
            };
            next.push(i);
        }
        if next.is_empty() {
            break;
        }
        let contexts: Vec<Vec<u32>> = next
            .iter()
            .map(|&i| {
                [
                    &items[samples[i].prompt].ids[..],
                    &samples[i].completion_ids[..],
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
        let outs = generate(&req)?;
        for c in outs {
            let (i, room) = (next[c.prompt_index], rooms[c.prompt_index]);
            let take = c.token_ids.len().min(room);
            let sample = &mut samples[i];
            sample
                .completion_ids
                .extend_from_slice(&c.token_ids[..take]);
            if let Some(t) = &mut sample.tools {
                t.mask.extend(std::iter::repeat_n(true, take));
            }
            // Cut at the budget: the same tokens a smaller `max_new_tokens` would have given.
            sample.truncated = take < c.token_ids.len()
                || (c.finish_reason == FinishReason::Length && take == room);
        }
    }
    for sample in samples.iter_mut() {
        if let Some(t) = &mut sample.tools {
            t.transcript = text.decode(&sample.completion_ids, true)?;
            sample.text = own_turns(&sample.completion_ids, &t.mask, text)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::prompts::{build_prompts, PromptFormat};
    use crate::data::LengthPolicy;
    use rlft_model::sampling::SamplingParams;
    use rlft_model::tiny::tiny_bpe_spec;
    use serde_json::json;

    const QWEN: &str =
        include_str!("../../../rlft-text/tests/data/templates/qwen2.5-instruct.jinja");
    const EOS: u32 = 2;

    /// The tiny byte-level tokenizer with Qwen2.5's chat template (which renders tools).
    fn text() -> TextBundle {
        TextBundle::from_bpe_spec(&tiny_bpe_spec(), Some(QWEN.into())).unwrap()
    }

    fn calculator(max_iterations: Option<usize>, text: &TextBundle) -> Turns {
        let spec: ToolSpec = serde_json::from_value(json!({"type": "calculator"})).unwrap();
        Turns::new(&[spec], max_iterations, text).unwrap().unwrap()
    }

    fn settings(max_new_tokens: usize) -> RolloutSettings {
        RolloutSettings {
            num_generations: 1,
            max_new_tokens,
            sampling: SamplingParams::greedy(),
            seed: 7,
            eos_token_ids: vec![EOS],
            pad_token_id: EOS,
        }
    }

    fn ids(text: &TextBundle, s: &str, eos: bool) -> Vec<u32> {
        let mut v = text.encode(s, false).unwrap();
        v.extend(eos.then_some(EOS));
        v
    }

    fn first_turn(prompt: usize, completion_ids: Vec<u32>) -> Sample {
        Sample {
            prompt,
            completion_ids,
            text: String::new(),
            truncated: false,
            sampler_logprobs: None,
            tools: None,
        }
    }

    const CALL: &str = "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"17 * (18 - 14)\"}}\n</tool_call>";
    const BETWEEN: &str = "\n<|im_start|>user\n<tool_response>\n68\n</tool_response><|im_end|>\n<|im_start|>assistant\n";

    /// A scripted transcript: the tool answers land between the turns as the template renders
    /// them, masked; the sampled tokens are kept exactly; malformed calls, calls past
    /// `max_tool_calling_iterations` and the budget end or fail turns as they should.
    #[test]
    fn scripted_transcript_gives_exact_ids_and_masks() {
        let text = text();
        let turns = calculator(Some(2), &text);
        let ds = rlft_data::Dataset::from_rows(vec![json!({"prompt": "17 * (18 - 14)?"})]).unwrap();
        let schemas = turns.render.tools.clone().unwrap();
        let format = PromptFormat {
            column: "prompt",
            system_prompt: None,
            tools: Some(&schemas),
        };
        let (items, _) = build_prompts(&ds, &text, format, 10_000, LengthPolicy::Drop).unwrap();
        assert!(items[0].text.contains("<tools>") && items[0].text.contains("\"calculator\""));
        let answer = ids(&text, "So \\boxed{68}.", true);
        let mut samples = vec![
            first_turn(0, ids(&text, CALL, true)),
            first_turn(0, ids(&text, "<tool_call>{\"name\": 17}</tool_call>", true)),
            first_turn(0, ids(&text, "\\boxed{68}", true)),
            first_turn(0, ids(&text, CALL, false)),
        ];
        let first_len = samples[0].completion_ids.len();
        let mut requests = Vec::new();
        let mut gen = |r: &GenerateRequest| -> Result<Vec<Completion>> {
            requests.push(r.clone());
            // Round 1: sample 0 answers, sample 1 calls again; round 2: sample 1 calls again.
            let script = match requests.len() {
                1 => vec![answer.clone(), ids(&text, CALL, true)],
                _ => vec![ids(&text, CALL, true)],
            };
            Ok(script
                .into_iter()
                .enumerate()
                .map(|(k, token_ids)| Completion {
                    prompt_index: k,
                    sample_index: 0,
                    logprobs: vec![0.0; token_ids.len()],
                    token_ids,
                    text: String::new(),
                    finish_reason: FinishReason::Stop,
                })
                .collect())
        };
        let s = settings(4096);
        continue_with_tools(&mut samples, &items, &turns, &text, &s, &mut gen).unwrap();

        // Sample 0: call, answer, final turn; every sampled id kept, the inserted ones masked.
        let between = ids(&text, BETWEEN, false);
        let want = [ids(&text, CALL, true), between.clone(), answer.clone()].concat();
        assert_eq!(samples[0].completion_ids, want);
        let t = samples[0].tools.as_ref().unwrap();
        let mask = [
            vec![true; first_len],
            vec![false; between.len()],
            vec![true; answer.len()],
        ];
        assert_eq!(t.mask, mask.concat());
        assert_eq!((t.calls, t.failures), (1, 0));
        assert_eq!(samples[0].sampled_tokens(), first_len + answer.len());
        assert!(t
            .transcript
            .ends_with("68\n</tool_response>\nassistant\nSo \\boxed{68}."));
        // The rewards read the model's own turns only.
        assert_eq!(samples[0].text, format!("{CALL}\nSo \\boxed{{68}}."));
        // The continuation's context is the prompt and everything so far; round r's seed.
        assert_eq!(
            requests[0].prompts[0],
            [&items[0].ids[..], &want[..first_len + between.len()]].concat()
        );
        assert_eq!((requests[0].n, requests[0].seed), (1, mix(7, 1)));
        assert_eq!(requests[1].seed, mix(7, 2));

        // Sample 1: a malformed call is a failed call the model reads; then two good calls, the
        // second past max_tool_calling_iterations = 2, so the completion ends there.
        let t = samples[1].tools.as_ref().unwrap();
        assert_eq!((t.calls, t.failures), (2, 1));
        assert!(t
            .transcript
            .contains("error: malformed tool call: the call has no \"name\""));
        assert!(!samples[1].text.contains("error"));
        assert_eq!(requests.len(), 2);
        assert!(samples[1].text.ends_with("</tool_call>"));

        // Sample 2 called nothing; sample 3's turn has no end token (cut): neither goes on.
        assert!(samples[2].tools.is_none() && samples[3].tools.is_none());
    }

    /// The tool answer is cut at the completion budget, and the completion is truncated.
    #[test]
    fn budget_covers_the_tool_answers() {
        let text = text();
        let turns = calculator(None, &text);
        let ds = rlft_data::Dataset::from_rows(vec![json!({"prompt": "x"})]).unwrap();
        let format = PromptFormat {
            column: "prompt",
            system_prompt: None,
            tools: None,
        };
        let (items, _) = build_prompts(&ds, &text, format, 10_000, LengthPolicy::Drop).unwrap();
        let call = ids(&text, CALL, true);
        let budget = call.len() + 5;
        let mut samples = vec![first_turn(0, call.clone())];
        let mut gen = |_: &GenerateRequest| -> Result<Vec<Completion>> {
            panic!("no room is left for another turn")
        };
        continue_with_tools(
            &mut samples,
            &items,
            &turns,
            &text,
            &settings(budget),
            &mut gen,
        )
        .unwrap();
        assert_eq!(samples[0].completion_ids.len(), budget);
        assert!(samples[0].truncated);
        let between = ids(&text, BETWEEN, false);
        assert_eq!(&samples[0].completion_ids[call.len()..], &between[..5]);
    }

    #[test]
    fn a_template_without_tools_is_refused_with_the_fix() {
        let text = rlft_model::tiny::tiny_text_bundle().unwrap();
        let spec: ToolSpec = serde_json::from_value(json!({"type": "calculator"})).unwrap();
        let e = Turns::new(&[spec], None, &text).err().unwrap().to_string();
        assert!(
            e.contains("does not render tools") && e.contains("Qwen2.5"),
            "{e}"
        );
    }
}
