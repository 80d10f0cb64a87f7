//! The multi-turn loop on scripted turns: exact ids and masks.

use super::*;
use crate::data::prompts::{build_prompts, PromptFormat};
use crate::data::LengthPolicy;
use rlft_model::sampling::SamplingParams;
use rlft_model::tiny::tiny_bpe_spec;
use serde_json::json;

const QWEN: &str =
    include_str!("../../../../rlft-text/tests/data/templates/qwen2.5-instruct.jinja");
const EOS: u32 = 2;

/// The tiny byte-level tokenizer with Qwen2.5's chat template (which renders tools).
fn text() -> TextBundle {
    TextBundle::from_bpe_spec(&tiny_bpe_spec(), Some(QWEN.into())).unwrap()
}

fn calculator(max_iterations: Option<usize>, text: &TextBundle) -> Turns {
    let spec: ToolSpec = serde_json::from_value(json!({"type": "calculator"})).unwrap();
    Turns::new(&[spec], max_iterations, None, text)
        .unwrap()
        .unwrap()
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

/// Row `k`'s scripted next turn, ended by the model.
fn ended(k: usize, token_ids: Vec<u32>) -> Completion {
    Completion {
        prompt_index: k,
        sample_index: 0,
        logprobs: vec![0.0; token_ids.len()],
        token_ids,
        text: String::new(),
        finish_reason: FinishReason::Stop,
    }
}

fn first_turn(prompt: usize, completion_ids: Vec<u32>) -> Sample {
    Sample::new(prompt, completion_ids, String::new(), false)
}

const CALL: &str = "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"17 * (18 - 14)\"}}\n</tool_call>";
const BETWEEN: &str =
    "\n<|im_start|>user\n<tool_response>\n68\n</tool_response><|im_end|>\n<|im_start|>assistant\n";

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
            .map(|(k, token_ids)| ended(k, token_ids))
            .collect())
    };
    let s = settings(4096);
    continue_turns(&mut samples, &items, &turns, &text, &s, &[], &mut gen).unwrap();

    // Sample 0: call, answer, final turn; every sampled id kept, the inserted ones masked.
    let between = ids(&text, BETWEEN, false);
    let want = [ids(&text, CALL, true), between.clone(), answer.clone()].concat();
    assert_eq!(samples[0].completion_ids, want);
    let t = samples[0].turns.as_ref().unwrap();
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
    let t = samples[1].turns.as_ref().unwrap();
    assert_eq!((t.calls, t.failures), (2, 1));
    assert!(t
        .transcript
        .contains("error: malformed tool call: the call has no \"name\""));
    assert!(!samples[1].text.contains("error"));
    assert_eq!(requests.len(), 2);
    assert!(samples[1].text.ends_with("</tool_call>"));

    // Sample 2 called nothing; sample 3's turn has no end token (cut): neither goes on.
    assert!(samples[2].turns.is_none() && samples[3].turns.is_none());
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
    continue_turns(
        &mut samples,
        &items,
        &turns,
        &text,
        &settings(budget),
        &[],
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
    let e = Turns::new(&[spec], None, None, &text)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("does not render tools") && e.contains("Qwen2.5"),
        "{e}"
    );
}

/// A guessing environment: `reset` says `Guess.` (with argv `seeded`: `Guess k.`, k from the
/// seed, so episodes start apart); a step of `68` is rewarded 1 and done, any other action
/// gets 0 and `No, not <action>.`.
const GUESS: &str = r#"
import json, sys
seeded = sys.argv[1:] == ["seeded"]
for line in sys.stdin:
    r = json.loads(line)
    if r["method"] == "reset":
        answer = {"observation": "Guess %d." % (r["seed"] % 7) if seeded else "Guess."}
    elif r["method"] == "step":
        right = r["action"] == "68"
        answer = {"observation": None if right else "No, not %s." % r["action"],
                  "reward": 1.0 if right else 0.0, "done": right}
    else:
        answer = {}
    print(json.dumps(answer), flush=True)
"#;

fn guessing(dir: &std::path::Path, max_turns: Option<usize>, seeded: bool) -> Turns {
    let script = dir.join("guess.py");
    std::fs::write(&script, GUESS).unwrap();
    let mut command = vec!["python3".to_string(), script.display().to_string()];
    command.extend(seeded.then(|| "seeded".to_string()));
    let spec = EnvironmentSpec {
        kind: rlft_tools::environment::EnvironmentKind::Command,
        command,
        url: None,
        timeout_s: 30.0,
        max_turns,
    };
    Turns::new(&[], None, Some(&spec), &text())
        .unwrap()
        .unwrap()
}

fn one_prompt(text: &TextBundle) -> Vec<PromptItem> {
    let ds = rlft_data::Dataset::from_rows(vec![json!({"prompt": "17 * (18 - 14)?"})]).unwrap();
    let format = PromptFormat {
        column: "prompt",
        system_prompt: None,
        tools: None,
    };
    build_prompts(&ds, text, format, 10_000, LengthPolicy::Drop)
        .unwrap()
        .0
}

/// A scripted episode: the first observation extends the prompt, each step's observation is a
/// user turn between the model's (exact ids, masked), the rewards add up, and an episode ends
/// when the environment says done, at `max_turns`, or with a turn cut at the budget (which the
/// environment still plays).
#[test]
fn scripted_episodes_give_exact_ids_masks_and_rewards() {
    let (text, dir) = (text(), tempfile::tempdir().unwrap());
    let turns = guessing(dir.path(), Some(2), false);
    let items = one_prompt(&text);
    let episodes = turns.start_episodes(&text, &items, &[0], 4, 7).unwrap();
    // Every episode starts alike: one prompt, shared, prefilled once for the group.
    let first = super::episodes::first_turn(&items, &[0], 4, &episodes);
    assert_eq!((first.contexts.len(), first.n), (1, 4));
    let prompt = episodes[0].prompt.clone().unwrap();
    assert!(prompt.text.ends_with(
        "17 * (18 - 14)?<|im_end|>\n<|im_start|>user\nGuess.<|im_end|>\n<|im_start|>assistant\n"
    ));
    assert_eq!(first.contexts[0], prompt.ids);
    let mut samples: Vec<Sample> = ["12", "68", "1234", "1"]
        .iter()
        .map(|a| {
            let mut s = first_turn(0, ids(&text, a, *a != "1234"));
            s.truncated = *a == "1234";
            s.episode_prompt = Some(prompt.clone());
            s
        })
        .collect();
    let mut requests = Vec::new();
    let mut gen = |r: &GenerateRequest| -> Result<Vec<Completion>> {
        requests.push(r.clone());
        let script = ["68", "2"];
        Ok((0..r.prompts.len())
            .map(|k| ended(k, ids(&text, script[k], true)))
            .collect())
    };
    let ids_of: Vec<String> = episodes.iter().map(|e| e.id.clone()).collect();
    let s = settings(4096);
    continue_turns(&mut samples, &items, &turns, &text, &s, &ids_of, &mut gen).unwrap();
    turns.close(&episodes).unwrap();
    // One round: episodes 0 and 3 went on, from the episode's prompt and what they said.
    assert_eq!(requests.len(), 1);
    let between = ids(
        &text,
        "\n<|im_start|>user\nNo, not 12.<|im_end|>\n<|im_start|>assistant\n",
        false,
    );
    let turn1 = ids(&text, "12", true);
    assert_eq!(
        requests[0].prompts[0],
        [&prompt.ids[..], &turn1, &between].concat()
    );
    // Episode 0: wrong, told so (masked), right: reward 0 + 1, done after 2 steps.
    let want = [turn1.clone(), between.clone(), ids(&text, "68", true)].concat();
    assert_eq!(samples[0].completion_ids, want);
    let t = samples[0].turns.as_ref().unwrap();
    let mask = [vec![true; 3], vec![false; between.len()], vec![true; 3]].concat();
    assert_eq!(t.mask, mask);
    assert_eq!(
        (t.steps, t.environment_reward, t.done),
        (2, Some(1.0), true)
    );
    assert_eq!(samples[0].text, "12\n68");
    assert!(t.transcript.contains("No, not 12."));
    // Episode 1: right at once; nothing inserted.
    let t = samples[1].turns.as_ref().unwrap();
    assert_eq!(
        (t.steps, t.environment_reward, t.done),
        (1, Some(1.0), true)
    );
    assert_eq!(samples[1].completion_ids, ids(&text, "68", true));
    // Episode 2: cut at the budget, played once, over.
    let t = samples[2].turns.as_ref().unwrap();
    assert_eq!(
        (t.steps, t.environment_reward, t.done),
        (1, Some(0.0), false)
    );
    assert_eq!(samples[2].completion_ids, ids(&text, "1234", false));
    // Episode 3: wrong twice; max_turns = 2 ends it without the second observation.
    let t = samples[3].turns.as_ref().unwrap();
    assert_eq!(
        (t.steps, t.environment_reward, t.done),
        (2, Some(0.0), false)
    );
    assert!(samples[3].text.ends_with("1\n2"));
    assert!(t.transcript.ends_with("2"));
}

/// Episodes whose first observations differ get one context each, every episode its own id
/// and seed; ids stay unique across rollouts.
#[test]
fn episodes_that_start_apart_get_their_own_contexts() {
    let (text, dir) = (text(), tempfile::tempdir().unwrap());
    let turns = guessing(dir.path(), None, true);
    let items = one_prompt(&text);
    let episodes = turns.start_episodes(&text, &items, &[0, 0], 3, 11).unwrap();
    let first = super::episodes::first_turn(&items, &[0, 0], 3, &episodes);
    assert_eq!((first.contexts.len(), first.n), (6, 1));
    for (e, ctx) in episodes.iter().zip(&first.contexts) {
        assert_eq!(&e.prompt.as_ref().unwrap().ids, ctx);
    }
    let observed: Vec<String> = first
        .contexts
        .iter()
        .map(|c| text.decode(c, false).unwrap())
        .collect();
    assert!(observed.iter().any(|o| o != &observed[0]), "{observed:?}");
    let again = turns.start_episodes(&text, &items, &[0], 1, 11).unwrap();
    let ids: std::collections::HashSet<&str> = episodes
        .iter()
        .chain(&again)
        .map(|e| e.id.as_str())
        .collect();
    assert_eq!(ids.len(), 7);
}
