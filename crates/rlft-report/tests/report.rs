//! `write_report` on synthetic run directories: a finished 30-step run with eval every 10 steps,
//! NaN values, missing and unknown keys, and samples with unicode and HTML special characters;
//! a run in progress; missing and empty metrics.
//!
//! Set `RLFT_REPORT_TEST_OUT=DIR` to keep the finished run (and its report) in DIR for a look.

use std::fmt::Write as _;
use std::path::Path;

use rlft_report::{write_report, ReportError};

const NASTY: &str =
    "<script>alert('x')</script> & \"quotes\" \u{3c0} \u{2248} 3.14 caf\u{e9} \u{1f680}";

/// A deterministic wobble in [-1, 1].
fn noise(i: u64) -> f64 {
    ((i * 2654435761) % 1000) as f64 / 500.0 - 1.0
}

fn metrics(steps: u64) -> String {
    let mut out = String::new();
    for step in 1..=steps {
        let t = step as f64 / steps as f64;
        let fmt = (0.2 + 0.8 * t + 0.08 * noise(step)).clamp(0.0, 1.0);
        let acc = (0.1 + 0.7 * t * t + 0.1 * noise(step + 7)).clamp(0.0, 1.0);
        let reward = 0.1 * fmt + 0.9 * acc;
        let kl = if step == 7 {
            "\"NaN\"".to_owned()
        } else {
            format!("{}", 0.002 * t + 0.0003 * noise(step + 3).abs())
        };
        let mean_len = 60.0 - 30.0 * t + 4.0 * noise(step + 11);
        let _ = write!(
            out,
            "{{\"step\":{step},\"epoch\":{:.4},\"wall_time\":{},\"elapsed_s\":{},\"loss\":{},\
             \"reward\":{reward},\"reward_std\":{},\"rewards/python_expr_rule/mean\":{reward},\
             \"rewards/python_expr_rule/std\":0.3,\"rewards/python_expr_rule/format/mean\":{fmt},\
             \"rewards/python_expr_rule/accuracy/mean\":{acc},\"frac_reward_zero_std\":{},",
            step as f64 / 10.0,
            1.7e9 + step as f64 * 4.0,
            step as f64 * 4.0,
            0.01 * noise(step),
            0.3 - 0.2 * t,
            (0.6 * t).min(1.0),
        );
        if step > 2 {
            let _ = write!(out, "\"kl\":{kl},");
        }
        let grad = if step == 12 {
            "\"Infinity\"".to_owned()
        } else {
            "0.8".into()
        };
        let _ = writeln!(
            out,
            "\"completions/mean_length\":{mean_len},\"completions/min_length\":{},\
             \"completions/max_length\":{},\"completions/clipped_ratio\":0.0,\
             \"learning_rate\":1e-6,\"grad_norm\":{grad},\"tokens_per_s\":250.5,\
             \"time/generate\":3.1,\"time/update\":0.8,\"custom/unknown\":\"text\",\"odd\":[1]}}",
            mean_len - 20.0,
            mean_len + 25.0,
        );
        if step % 10 == 0 {
            let _ = writeln!(
                out,
                "{{\"step\":{step},\"epoch\":{:.4},\"wall_time\":{},\"elapsed_s\":{},\
                 \"eval/reward\":{},\"eval/rewards/python_expr_rule/mean\":{},\
                 \"eval/rewards/python_expr_rule/format/mean\":{},\
                 \"eval/rewards/python_expr_rule/accuracy/mean\":{},\
                 \"eval/completions/mean_length\":{}}}",
                step as f64 / 10.0,
                1.7e9 + step as f64 * 4.0 + 1.0,
                step as f64 * 4.0 + 1.0,
                0.2 + 0.02 * step as f64,
                0.2 + 0.02 * step as f64,
                0.4 + 0.02 * step as f64,
                0.15 + 0.02 * step as f64,
                50.0 - step as f64,
            );
        }
    }
    out
}

fn sample(step: u64, split: &str, prompt: &str, completion: &str, reward: f64) -> String {
    let fmt = if completion.contains("\\boxed") {
        1.0
    } else {
        0.0
    };
    let adv = if split == "train" {
        format!(",\"advantage\":{}", reward - 0.5)
    } else {
        String::new()
    };
    format!(
        "{{\"step\":{step},\"split\":\"{split}\",\"prompt\":{},\"completion\":{},\"reward\":{reward},\
         \"rewards\":{{\"python_expr_rule\":{reward},\"python_expr_rule/format\":{fmt},\
         \"python_expr_rule/accuracy\":{}}}{adv},\"completion_tokens\":{},\"truncated\":{}}}\n",
        serde_json::to_string(prompt).unwrap(),
        serde_json::to_string(completion).unwrap(),
        if reward > 0.5 { 1.0 } else { 0.0 },
        completion.len() / 3,
        completion.len() > 60,
    )
}

fn samples() -> String {
    let p = |e: &str| {
        format!(
            "Compute this Python-style arithmetic expression.\nExpression: {e}\n\
             Return only the final result in the format \\boxed{{answer}}."
        )
    };
    let mut out = String::new();
    out += &sample(1, "train", &p("(3 + 4)"), "The answer is 7.", 0.0);
    out += &sample(1, "train", &p("(2 * 9)"), NASTY, 0.0);
    out += &sample(15, "train", &p("(12 - 5)"), "\\boxed{7}", 1.0);
    out += &sample(30, "train", &p("((2 * 3) + 1)"), "\\boxed{7}", 1.0);
    out += &sample(30, "train", &p("(20 - 19)"), "\\boxed{2}", 0.1);
    out += &sample(10, "eval", &p("(1 + 1)"), "It is 2", 0.0);
    out += &sample(30, "eval", &p("(1 + 1)"), "\\boxed{2}", 1.0);
    out += "{not json\n";
    out
}

const CONFIG: &str = r#"{"model":"default","algorithm":"grpo","loss_type":"dapo","learning_rate":1e-6,
"num_generations":4,"per_device_train_batch_size":8,"gradient_accumulation_steps":2,
"max_completion_length":128,"beta":0.001,"use_peft":true,
"rewards":[{"type":"python_expr_rule","weight":0.5}],
"lora":{"r":16,"lora_alpha":32,"lora_dropout":0.05,"target_modules":["q_proj","v_proj"]}}"#;

fn write_run(dir: &Path, finished: bool) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("metrics.jsonl"), metrics(30)).unwrap();
    if finished {
        std::fs::write(dir.join("samples.jsonl"), samples()).unwrap();
        let summary = format!(
            "{{\"config\":{CONFIG},\"model\":\"SmolLM2-135M-Instruct\",\"wall_time_s\":241.7,\
             \"peak_rss_mib\":1843.2,\"global_step\":30,\
             \"eval_initial\":{{\"eval/reward\":0.125,\"eval/rewards/python_expr_rule/accuracy/mean\":0.1,\
             \"eval/completions/mean_length\":61.5}},\
             \"eval_final\":{{\"eval/reward\":0.8125,\"eval/rewards/python_expr_rule/accuracy/mean\":0.75,\
             \"eval/completions/mean_length\":22.25}},\"status\":\"finished\"}}"
        );
        std::fs::write(dir.join("run_summary.json"), summary).unwrap();
    }
    std::fs::write(
        dir.join("config.toml"),
        "model = \"default\"\nactor_learning_rate = 2e-6\nn_samples_per_prompt = 8\n",
    )
    .unwrap();
}

fn png_size(path: &Path) -> (u32, u32) {
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(path).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    // Not blank: the chart drew something other than the white background.
    assert!(buf[..info.buffer_size()].iter().any(|&b| b < 128));
    (info.width, info.height)
}

#[test]
fn finished_run_report() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = match std::env::var_os("RLFT_REPORT_TEST_OUT") {
        Some(d) => d.into(),
        None => tmp.path().join("grpo-run"),
    };
    write_run(&dir, true);
    let paths = write_report(&dir).unwrap();
    for p in [&paths.html, &paths.markdown, &paths.png, &paths.svg] {
        assert!(p.starts_with(dir.join("report")), "{}", p.display());
        assert!(std::fs::metadata(p).unwrap().len() > 0, "{}", p.display());
    }
    // reward, format, accuracy, length, KL, zero-std: 3 rows of 2.
    assert_eq!(paths.dashboard_size, (1400, 92 + 3 * 360 + 8));
    assert_eq!(png_size(&paths.png), paths.dashboard_size);

    let html = std::fs::read_to_string(&paths.html).unwrap();
    assert!(html.contains(
        "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;quotes&quot; \u{3c0} \u{2248} 3.14 caf\u{e9} \u{1f680}"
    ));
    assert!(
        !html.contains("<script"),
        "no raw script tag (and no JS at all)"
    );
    assert!(html.contains("<svg"), "the dashboard SVG is inlined");
    assert!(
        !html.contains("<link") && !html.contains("<img"),
        "no external assets"
    );
    // Card numbers: model, status, wall time, memory, steps, config, eval before -> after.
    for needle in [
        "SmolLM2-135M-Instruct",
        "finished",
        "4 min 01 s",
        "1.80 GiB",
        ">30<",
        "dapo",
        "1e-6",
        "8 x 2 accumulation = 16 completions per step = 4 prompts x 4 generations",
        "r 16, alpha 32, dropout 0.05 on q_proj, v_proj",
        "0.125",
        "0.812",
        "+0.688",
        "accuracy",
        "format",
        "kl (1)",
        "grad_norm (1)",
        "python_expr_rule x0.5",
    ] {
        assert!(html.contains(needle), "report.html lacks {needle:?}");
    }
    assert!(html.contains("samples.jsonl: 1 unreadable line(s) skipped"));
    for group in [
        "First logged step (1)",
        "Last logged step (30)",
        "Best rewards",
        "Worst rewards",
        "Eval at step 10",
        "Eval at step 30",
    ] {
        assert!(
            html.contains(group),
            "report.html lacks the group {group:?}"
        );
    }

    let md = std::fs::read_to_string(&paths.markdown).unwrap();
    assert!(md.contains("# GRPO run report: "));
    assert!(md.contains("| reward | 0.125 | 0.812 | +0.688 |"), "{md}");
    assert!(md.contains("![dashboard](dashboard.png)"));
    let svg = std::fs::read_to_string(&paths.svg).unwrap();
    assert!(svg.contains("<svg") && svg.contains("Reward: accuracy"));
    // No temp files left behind.
    let leftovers: Vec<_> = std::fs::read_dir(&paths.dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
        .collect();
    assert!(leftovers.is_empty());
}

#[test]
fn run_in_progress_still_renders() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("live");
    write_run(&dir, false);
    // A torn last line, as while the trainer writes.
    let mut m = std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap();
    m.push_str("{\"step\":31,\"epo");
    std::fs::write(dir.join("metrics.jsonl"), m).unwrap();
    let paths = write_report(&dir).unwrap();
    let html = std::fs::read_to_string(&paths.html).unwrap();
    assert!(html.contains("in progress"));
    assert!(html.contains("the last line is incomplete"));
    assert!(html.contains("No samples logged"));
    // The config comes from config.toml (LightRFT names) when there is no run summary.
    assert!(
        html.contains("learning_rate</td><td>2e-6") && html.contains("num_generations</td><td>8")
    );
    // Eval before -> after from the metrics' eval lines.
    assert!(html.contains("step 10") && html.contains("step 30"));
    assert_eq!(png_size(&paths.png), paths.dashboard_size);
}

#[test]
fn missing_or_empty_metrics_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let err = write_report(tmp.path()).unwrap_err();
    assert!(matches!(err, ReportError::MissingMetrics { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("has no metrics.jsonl") && msg.contains("rlft grpo"),
        "{msg}"
    );

    std::fs::write(tmp.path().join("metrics.jsonl"), "\n").unwrap();
    let err = write_report(tmp.path()).unwrap_err();
    assert!(matches!(err, ReportError::EmptyMetrics { .. }), "{err}");
    assert!(err.to_string().contains("the file is empty"), "{err}");

    std::fs::write(tmp.path().join("metrics.jsonl"), "garbage\n").unwrap();
    let err = write_report(tmp.path()).unwrap_err();
    assert!(
        err.to_string().contains("1 unreadable line(s); line 1"),
        "{err}"
    );

    let err = write_report(&tmp.path().join("nope")).unwrap_err();
    assert!(matches!(err, ReportError::NotADirectory { .. }), "{err}");
    assert!(
        !tmp.path().join("report").exists(),
        "no report for a failed run dir"
    );
}
