//! Multi-turn rollouts end to end: a tiny model taught (by SFT, here) to call a calculator
//! trains with GRPO through its tool calls, and GRPO, RLOO and PPO train it through episodes
//! of an environment; tool answers and observations land in its completions, the metrics count
//! calls and steps, and a resumed run equals an uninterrupted one bit for bit.

mod common;

use std::path::{Path, PathBuf};

use common::online::{config_with_rewards, metric, DIGIT};
use common::train::{assert_resumes_exactly, offline_config, run};
use rlft::config::online::{OnlineConfig, PpoConfig, RlooConfig};
use rlft::config::sft::SftConfig;
use rlft::config::TrainerConfig;
use rlft::run::RunOptions;

/// The tiny model's template with tool support: the tools are not shown (so the SFT prompt is
/// the rollout's), and the `{# <tool_call> #}` comment marks the Hermes call format.
const TEMPLATE: &str = "{# tools as <tool_call> blocks #}{%- if tools %}{% endif %}{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// What the model learns to say first: a call of tool `c` (the calculator, renamed).
const CALL: &str = "{\"name\": \"c\", \"arguments\": {\"expression\": \"6*7\"}}";

/// The tiny model with [`TEMPLATE`], fine-tuned to answer every prompt with [`CALL`].
fn tool_caller(dir: &Path) -> PathBuf {
    let model = common::tiny_model(dir);
    std::fs::write(model.join("chat_template.jinja"), TEMPLATE).unwrap();
    let data = dir.join("calls.jsonl");
    let rows: String = (0..16)
        .map(|i| {
            let row = serde_json::json!({
                "prompt": [{"role": "user", "content": format!("{}+{}=", i * 7 % 23, i * 5 % 17)}],
                "completion": [{"role": "assistant", "content": CALL}],
            });
            format!("{row}\n")
        })
        .collect();
    std::fs::write(&data, rows).unwrap();
    let sft: SftConfig = offline_config(
        dir,
        &data,
        "learning_rate = 1e-2\nmax_steps = 40\nmax_length = 96\nsave_steps = 1000",
    );
    run(&sft, &RunOptions::default());
    dir.join("out/final")
}

fn grpo(dir: &Path, model: &Path) -> OnlineConfig {
    let extra = format!(
        "model = \"{}\"\ntemperature = 1.0\nmax_steps = 4\nmax_completion_length = 160\n\
         max_tool_calling_iterations = 2\n[[tools]]\ntype = \"calculator\"\nname = \"c\"\n",
        model.display()
    );
    config_with_rewards(dir, &extra, DIGIT)
}

#[test]
fn tool_calls_and_environments_train_and_resume_exactly() {
    let [m, a, b] = common::tempdirs();
    let model = tool_caller(m.path());
    tool_calls(a.path(), b.path(), &model);
    let [c, d, e, f] = common::tempdirs();
    environment_episodes(c.path(), d.path(), &model);
    other_trainers_play_episodes(e.path(), f.path(), &model);
}

fn tool_calls(a: &Path, b: &Path, model: &Path) {
    let (full, _, _) = assert_resumes_exactly(&grpo(a, model), &grpo(b, model), 2, "tools");
    for step in 0..4 {
        let calls = metric(&full, step, "tools/call_frequency");
        assert!(calls > 0.5, "step {step}: {calls} calls per completion");
        assert!(metric(&full, step, "tools/failure_frequency").is_finite());
    }
    let samples = std::fs::read_to_string(a.join("out/samples.jsonl")).unwrap();
    // The calculator's answer follows the call, as the template renders a tool message.
    assert!(
        samples.contains("tool\\n42"),
        "{}",
        &samples[..600.min(samples.len())]
    );
}

/// An environment with per-episode state: `reset` says `Start k.` (k from the episode's seed,
/// so the episodes of a group start apart), each step rewards the digits of the action mod 3
/// and answers `Again.`, and the episode is done after two steps.
const ENV: &str = r#"
import json, sys
steps = {}
for line in sys.stdin:
    r = json.loads(line)
    if r["method"] == "reset":
        steps[r["episode"]] = 0
        answer = {"observation": "Start %d." % (r["seed"] % 3)}
    elif r["method"] == "step":
        steps[r["episode"]] += 1
        digits = sum(c.isdigit() for c in r["action"])
        answer = {"observation": "Again.", "reward": float(digits % 3),
                  "done": steps[r["episode"]] >= 2}
    else:
        for e in r["episodes"]:
            del steps[e]
        answer = {}
    print(json.dumps(answer), flush=True)
"#;

/// The online config `C` over `model` with [`ENV`] and its reward, `steps` optimiser steps.
fn with_env<C: TrainerConfig>(dir: &Path, model: &Path, steps: usize) -> C {
    let script = dir.join("env.py");
    std::fs::write(&script, ENV).unwrap();
    let extra = format!(
        "model = \"{}\"\ntemperature = 1.0\nmax_steps = {steps}\nmax_completion_length = 160\n\
         [environment]\ntype = \"command\"\ncommand = [\"python3\", \"{}\"]\n",
        model.display(),
        script.display()
    );
    let rewards = format!("{DIGIT}[[rewards]]\ntype = \"environment\"\n");
    config_with_rewards(dir, &extra, &rewards)
}

fn environment_episodes(a: &Path, b: &Path, model: &Path) {
    let (full, _, _) = assert_resumes_exactly(
        &with_env::<OnlineConfig>(a, model, 4),
        &with_env::<OnlineConfig>(b, model, 4),
        2,
        "environment",
    );
    // The model ends its turns (SFT taught it), so episodes go on after their first step.
    assert!(metric(&full, 0, "env/steps") > 1.0);
    assert!(metric(&full, 0, "env/done_frequency") > 0.0);
    for step in 0..4 {
        let steps = metric(&full, step, "env/steps");
        assert!(
            (1.0..=2.0).contains(&steps),
            "step {step}: {steps} steps per episode"
        );
        let r = metric(&full, step, "rewards/environment/mean");
        assert!(
            (0.0..=4.0).contains(&r),
            "step {step}: environment reward {r}"
        );
    }
    let samples = std::fs::read_to_string(a.join("out/samples.jsonl")).unwrap();
    // The first observation extends the prompt; the next is a user turn in the completion.
    assert!(
        samples.contains("Start "),
        "{}",
        &samples[..600.min(samples.len())]
    );
    assert!(
        samples.contains("user\\nAgain."),
        "{}",
        &samples[..600.min(samples.len())]
    );
}

fn other_trainers_play_episodes(a: &Path, b: &Path, model: &Path) {
    let rloo: RlooConfig = with_env(a, model, 2);
    let (s, _) = run(&*rloo, &RunOptions::default());
    let ppo: PpoConfig = with_env(b, model, 2);
    let (p, _) = run(&*ppo, &RunOptions::default());
    for (summary, what) in [(&s, "rloo"), (&p, "ppo")] {
        assert!(metric(summary, 0, "env/steps") > 1.0, "{what}");
        for step in 0..2 {
            assert!(metric(summary, step, "loss").is_finite(), "{what}");
        }
    }
}
