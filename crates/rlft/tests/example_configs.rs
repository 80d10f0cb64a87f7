//! Every config shipped in `examples/` parses and validates, so the READMEs' commands work.

use std::path::Path;

use rlft::config::dpo::DpoConfig;
use rlft::config::online::OnlineConfig;
use rlft::config::online::{PpoConfig, RlooConfig};
use rlft::config::online_dpo::OnlineDpoConfig;
use rlft::config::sft::SftConfig;
use rlft::config::TrainerConfig;

fn examples() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

fn load<C: TrainerConfig>(path: &Path) -> C {
    C::load(path, &[]).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn grpo_example_configs_parse() {
    let dir = examples().join("tiny_python_expr");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            // `cpu_rloo.toml` is an `rlft rloo` config, `cpu_ppo.toml` an `rlft ppo` one,
            // `cpu_online_dpo.toml` an `rlft online-dpo` one, `cpu_dpo.toml` an `rlft dpo` one.
            let name = path.file_stem().unwrap().to_string_lossy().to_string();
            let cfg = match name.as_str() {
                "cpu_dpo" => {
                    load::<DpoConfig>(&path);
                    continue;
                }
                "cpu_rloo" => load::<RlooConfig>(&path).0,
                "cpu_ppo" => load::<PpoConfig>(&path).0,
                "cpu_online_dpo" => load::<OnlineDpoConfig>(&path).online(),
                _ => load::<OnlineConfig>(&path),
            };
            let plan = cfg.plan(128);
            assert!(plan.total_steps > 0, "{}", path.display());
            n += 1;
        }
    }
    assert!(
        n >= 3,
        "expected cpu.toml, config.toml and qwen25_3b.toml in {}",
        dir.display()
    );
    // The seed mirror's batch arithmetic is the seed's: 16 prompts x 4 samples per rollout,
    // 4 optimiser steps of 16 completions each.
    let seed = OnlineConfig::load(&dir.join("config.toml"), &[]).unwrap();
    let p = seed.plan(128);
    assert_eq!(
        (
            p.rollout_prompts,
            p.rollout_completions,
            p.train_batch,
            p.steps_per_rollout
        ),
        (16, 64, 16, 4)
    );
}

#[test]
fn sft_example_config_parses() {
    let path = examples().join("sft/sft.toml");
    SftConfig::load(&path, &["dataset=x.jsonl".into()]).unwrap();
}

#[test]
fn preference_example_configs_parse() {
    let dir = examples().join("preference");
    let dpo: DpoConfig = load(&dir.join("dpo.toml"));
    assert!(dpo.args.use_peft);
    let rm: rlft::config::reward::RewardConfig = load(&dir.join("rm.toml"));
    assert_eq!(rm.center_rewards_coefficient, Some(0.01));
    let grpo: OnlineConfig = load(&dir.join("grpo_rm.toml"));
    assert_eq!(grpo.rollout.rewards.len(), 1);
    assert_eq!(grpo.rollout.rewards[0].kind.type_name(), "model");
    assert!(grpo.plan(128).total_steps > 0);
}
