//! A LoRA run's `adapter/` and `checkpoint-N/` directories as `--model`: loaded over the base
//! the adapter names (or `--base`) and merged, they generate and evaluate as the run's merged
//! `final/` does; bad combinations are clear errors.

mod common;

use std::path::Path;

use common::{ok, rlft};
use rlft_model::config::Family;
use rlft_model::tiny::{save_tiny_hf_dir, tiny_config};

/// A 2-step GRPO LoRA run on a tiny Qwen2 model, checkpointing at step 2; returns its config.
fn lora_run(dir: &Path) -> String {
    let model = dir.join("model");
    save_tiny_hf_dir(tiny_config(Family::Qwen2), 3, &model).unwrap();
    let rows: Vec<String> = (0..8)
        .map(|i| serde_json::json!({"prompt": format!("What is {i} + 2?")}).to_string())
        .collect();
    let data = dir.join("prompts.jsonl");
    std::fs::write(&data, rows.join("\n") + "\n").unwrap();
    let cfg = dir.join("run.toml");
    std::fs::write(
        &cfg,
        format!(
            "model = {model:?}\noutput_dir = {out:?}\ndataset = {data:?}\neval_dataset = {data:?}\n\
             max_completion_length = 8\nnum_generations = 4\nper_device_train_batch_size = 8\n\
             learning_rate = 5e-2\nmax_steps = 2\nsave_steps = 2\nuse_peft = true\n\
             temperature = 30.0\nseed = 3\n[lora]\nr = 8\nlora_alpha = 16\n\
             [[rewards]]\ntype = \"regex_format\"\npattern = \"[a-z]\"\n",
            out = dir.join("out"),
        ),
    )
    .unwrap();
    ok(&rlft(&["grpo", "--config", cfg.to_str().unwrap()]));
    cfg.display().to_string()
}

#[test]
fn adapter_and_checkpoint_dirs_load_over_their_base() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = lora_run(tmp.path());
    let d = |p: &str| tmp.path().join(p).display().to_string();
    // Per-token log-probs of a fixed text: the merged model's, to the last printed digit.
    let lp = |model: &str, extra: &[&str]| {
        let args = [
            "logprobs",
            "--json",
            "--model",
            model,
            "--text",
            "What is 3 + 2? 5",
        ];
        let v: serde_json::Value =
            serde_json::from_str(&ok(&rlft(&[&args[..], extra].concat()))).unwrap();
        v["tokens"].as_array().unwrap()[1..]
            .iter()
            .map(|t| t["logprob"].as_f64().unwrap())
            .collect::<Vec<_>>()
    };
    let close = |a: &[f64], b: &[f64]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-5);
    let merged = lp(&d("out/final"), &[]);
    for (model, extra) in [
        ("out/adapter", vec![]),
        ("out/checkpoint-2", vec![]),
        (
            "out/checkpoint-2",
            vec!["--base", &*Box::leak(d("model").into_boxed_str())],
        ),
    ] {
        let got = lp(&d(model), &extra);
        assert!(
            close(&got, &merged),
            "{model} {extra:?}: {got:?} vs {merged:?}"
        );
    }
    // The trained adapter changed the model: the base alone scores the text otherwise.
    assert!(!close(&lp(&d("model"), &[]), &merged));
    // eval's completions (greedy) and rewards: the same as the merged model's.
    let eval = |model: &str, out: &str| {
        ok(&rlft(&[
            "eval",
            "--config",
            &cfg,
            "--model",
            model,
            "--output",
            &d(out),
        ]));
        std::fs::read_to_string(d(out)).unwrap()
    };
    let want = eval(&d("out/final"), "final.jsonl");
    assert!(!want.is_empty());
    assert_eq!(eval(&d("out/checkpoint-2"), "ckpt.jsonl"), want);
}

#[test]
fn adapter_errors_name_the_fix() {
    let tmp = tempfile::tempdir().unwrap();
    lora_run(tmp.path());
    let d = |p: &str| tmp.path().join(p).display().to_string();
    let err = |args: &[&str]| {
        let out = rlft(args);
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    let prompt = "hi";
    let e = err(&[
        "generate",
        "--model",
        &d("out/adapter"),
        "--base",
        &d("gone"),
        prompt,
    ]);
    assert!(
        e.contains("not on this machine") && e.contains("--base"),
        "{e}"
    );
    let e = err(&[
        "generate",
        "--model",
        &d("model"),
        "--base",
        &d("model"),
        prompt,
    ]);
    assert!(e.contains("drop --base"), "{e}");
    // The base the adapter names moved away: the error says how to point at it.
    std::fs::rename(d("model"), d("moved")).unwrap();
    let e = err(&["generate", "--model", &d("out/checkpoint-2"), prompt]);
    assert!(
        e.contains("not on this machine") && e.contains("--base MODEL"),
        "{e}"
    );
    ok(&rlft(&[
        "generate",
        "--model",
        &d("out/checkpoint-2"),
        "--base",
        &d("moved"),
        prompt,
    ]));
    // The library loader, given an adapter directory, says what it is.
    let e = rlft_model::load::load_model(d("out/adapter"), &Default::default()).unwrap_err();
    assert!(e.to_string().contains("PEFT LoRA adapter"), "{e}");
}
