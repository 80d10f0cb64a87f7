//! `rlft data sampled-preferences` end to end on a tiny random model: every pair's chosen
//! completion is the one the config's reward scores higher (checked against the regex the
//! reward applies), the rows are seeded, `--include` appends a preference dataset,
//! `--reference` pairs a preference dataset's chosen replies against the samples scored below
//! them, and a config that cannot make pairs is refused.

mod common;

use common::{ok_all as ok, rlft};

use std::path::Path;

use rlft_model::config::Family;
use rlft_model::tiny::{save_tiny_hf_dir, tiny_config};
use serde_json::Value;

fn rows(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn pairs_are_ordered_by_the_reward_and_seeded() {
    let dir = tempfile::tempdir().unwrap();
    let d = |p: &str| dir.path().join(p).display().to_string();
    let model = d("model");
    save_tiny_hf_dir(tiny_config(Family::Llama), 5, Path::new(&model)).unwrap();
    let tpe = [
        "data",
        "tiny-python-expr",
        "--train-size",
        "12",
        "--test-size",
    ];
    ok(&rlft(&[&tpe[..], &["4", "-o", &d("prompts")]].concat()));
    ok(&rlft(
        &[
            &tpe[..],
            &["3", "--preferences", "--jsonl", "-o", &d("prefs")],
        ]
        .concat(),
    ));
    let cfg = dir.path().join("pairs.toml");
    std::fs::write(
        &cfg,
        format!(
            "model = {model:?}\ndataset = {:?}\neval_split = \"test\"\n\
             num_generations = 4\nmax_completion_length = 6\ntemperature = 1.0\n\
             [[rewards]]\ntype = \"regex_format\"\npattern = \"[A-Za-z]\"\n",
            d("prompts")
        ),
    )
    .unwrap();
    let cfg = cfg.display().to_string();
    let run = |out: &str, extra: &[&str]| {
        let base = ["data", "sampled-preferences", "-c", &cfg, "--jsonl", "-o"];
        ok(&rlft(&[&base[..], &[out], extra].concat()))
    };
    let log = run(&d("a"), &[]);
    assert!(log.contains("train: 12 prompts, 48 completions"), "{log}");
    let train = rows(&dir.path().join("a/train.jsonl"));
    assert!(!train.is_empty(), "no pairs at all: {log}");
    for r in &train {
        let (c, j) = (&r["chosen"][0]["content"], &r["rejected"][0]["content"]);
        let (c, j) = (c.as_str().unwrap(), j.as_str().unwrap());
        // regex_format scores 1 when the pattern is found, 0 when not.
        let letter = |t: &str| t.chars().any(|ch| ch.is_ascii_alphabetic());
        assert!(letter(c) && !letter(j), "{r}");
        assert_eq!(r["chosen_reward"], 1.0);
        assert_eq!(r["rejected_reward"], 0.0);
        assert_eq!(r["chosen"][0]["role"], "assistant");
        assert!(
            r["prompt"].is_array() && r["reward_model"].is_object(),
            "{r}"
        );
    }
    let pairs = train.len();
    assert!(log.contains(&format!(
        "{pairs} pairs (0 against 0 reference replies), {} prompts without a sampled pair",
        12 - pairs
    )));
    // Same config and seed: the same rows.
    run(&d("b"), &[]);
    let same = |f: &str| {
        std::fs::read(dir.path().join("a").join(f)).unwrap()
            == std::fs::read(dir.path().join("b").join(f)).unwrap()
    };
    assert!(same("train.jsonl") && same("test.jsonl"));
    // --include appends the synthetic pairs after the sampled ones, split by split.
    run(&d("c"), &["--include", &d("prefs")]);
    let mixed = rows(&dir.path().join("c/train.jsonl"));
    assert_eq!(mixed.len(), pairs + 12);
    assert_eq!(mixed[..pairs], train[..]);
    assert_eq!(rows(&dir.path().join("c/test.jsonl")).len(), {
        rows(&dir.path().join("a/test.jsonl")).len() + 3
    });
    // --reference: the synthetic pairs' chosen replies, matched by prompt, are paired against
    // the samples that score below them (here: those without a letter).
    let log = run(&d("r"), &["--reference", &d("prefs")]);
    let with_ref = rows(&dir.path().join("r/train.jsonl"));
    let refs: Vec<Value> = rows(&dir.path().join("prefs/train.jsonl"));
    let reference_of = |prompt: &Value| {
        refs.iter()
            .find(|r| &r["prompt"] == prompt)
            .map(|r| r["chosen"].clone())
    };
    // Both builders draw the same expressions for a seed, so every train prompt has one.
    assert!(
        log.contains("train: 12 of 12 prompts have a reference reply"),
        "{log}"
    );
    let against: Vec<&Value> = with_ref
        .iter()
        .filter(|r| reference_of(&r["prompt"]).as_ref() == Some(&r["chosen"]))
        .collect();
    assert!(!against.is_empty(), "{log}");
    for r in &against {
        let j = r["rejected"][0]["content"].as_str().unwrap();
        assert!(!j.chars().any(|ch| ch.is_ascii_alphabetic()), "{r}");
        assert_eq!(
            (&r["chosen_reward"], &r["rejected_reward"]),
            (&1.0.into(), &0.0.into())
        );
    }
    // The sampled pairs are the same as without references.
    let sampled: Vec<&Value> = with_ref.iter().filter(|r| !against.contains(r)).collect();
    assert_eq!(sampled, train.iter().collect::<Vec<_>>());
    assert!(
        log.contains(&format!("({} against", against.len())),
        "{log}"
    );
    // One completion per prompt cannot make a pair: refused with the fix.
    let out = rlft(&[
        "data",
        "sampled-preferences",
        "-c",
        &cfg,
        "--set",
        "num_generations=1",
        "-o",
        &d("d"),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("num_generations"), "{err}");
}
