//! Multi-turn rollouts end to end: a tiny model taught (by SFT, here) to call a calculator
//! trains with GRPO through its tool calls; the answers land in its completions, the metrics
//! count the calls, and a resumed run equals an uninterrupted one bit for bit.

mod common;

use std::path::{Path, PathBuf};

use common::online::{config_with_rewards, metric, DIGIT};
use common::train::{assert_resumes_exactly, offline_config, run};
use rlft::config::online::OnlineConfig;
use rlft::config::sft::SftConfig;
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
fn tool_calls_train_and_resume_exactly() {
    let [m, a, b] = common::tempdirs();
    let model = tool_caller(m.path());
    let (full, _, _) =
        assert_resumes_exactly(&grpo(a.path(), &model), &grpo(b.path(), &model), 2, "tools");
    for step in 0..4 {
        let calls = metric(&full, step, "tools/call_frequency");
        assert!(calls > 0.5, "step {step}: {calls} calls per completion");
        assert!(metric(&full, step, "tools/failure_frequency").is_finite());
    }
    let samples = std::fs::read_to_string(a.path().join("out/samples.jsonl")).unwrap();
    // The calculator's answer follows the call, as the template renders a tool message.
    assert!(
        samples.contains("tool\\n42"),
        "{}",
        &samples[..600.min(samples.len())]
    );
}
