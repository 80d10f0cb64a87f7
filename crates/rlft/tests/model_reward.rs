//! `[[rewards]] type = "model"` on tiny random models: the rewards a GRPO run logs are the
//! scores `rlft score` gives the same prompt + completion rows (the reward model reads them
//! with its own chat template, in batches); PPO takes the reward model as its reward and as
//! its critic's start; config errors name the fix.

mod common;

use std::path::{Path, PathBuf};

use candle_core::{DType, Device};
use common::online::config;
use rlft::config::online::OnlineConfig;
use rlft::config::online::PpoConfig;
use rlft::online::{prepare, train};
use rlft::reward_model::score::score_dataset;
use rlft::run::RunOptions;
use rlft_model::config::Family;
use rlft_model::export::ExportOptions;
use rlft_model::load::LoadOptions;
use rlft_model::score::{load_score_model, save_score_model, ScoreHead, ScoreModel};
use rlft_model::tiny::{random_model, tiny_bpe_spec, tiny_config};
use serde_json::{json, Value};

/// A chat template unlike the policy's (`<|im_start|>role\n...`): the reward model must
/// render the conversation itself.
const RM_TEMPLATE: &str = "{% for m in messages %}[{{ m.role }}]: {{ m.content }}\n\
                           {% endfor %}{% if add_generation_prompt %}[assistant]: {% endif %}";

const SYSTEM: &str = "Answer with the sum.";

/// Writes a tiny reward model (random backbone of seed 11, a head of std 1 so that scores
/// spread) with its own chat template; returns its directory. `own_vocab`: a Llama whose
/// tokenizer puts seven more special tokens before the bytes, so every text token id differs
/// from the policy's (the reward model must re-tokenize); else a Qwen2 with the policy's
/// tokenizer (what a PPO critic needs).
fn write_reward_model(dir: &Path, own_vocab: bool) -> PathBuf {
    let path = dir.join(if own_vocab { "rm-llama" } else { "rm" });
    let mut spec = tiny_bpe_spec();
    let cfg = if own_vocab {
        let extra: Vec<String> = (0..7).map(|i| format!("<|rm{i}|>")).collect();
        spec.tokens.splice(3..3, extra);
        spec.token_types
            .splice(3..3, [rlft_text::token_type::CONTROL; 7]);
        tiny_config(Family::Llama)
    } else {
        tiny_config(Family::Qwen2)
    };
    let hidden = cfg.hidden_size;
    let model = random_model(cfg, 11, DType::F32, &Device::Cpu).unwrap();
    let head = ScoreHead::normal(hidden, 1.0, 3, DType::F32, &Device::Cpu).unwrap();
    let text = rlft_text::TextBundle::from_bpe_spec(&spec, Some(RM_TEMPLATE.into())).unwrap();
    let generation = rlft_model::GenerationConfig {
        eos_token_ids: vec![2],
        bos_token_id: Some(1),
        pad_token_id: Some(2),
        ..Default::default()
    };
    let opts = ExportOptions::default();
    save_score_model(&model, &head, &text, &generation, 2, &path, &opts).unwrap();
    path
}

/// `n` conversational prompt rows `{"prompt": [{"role": "user", "content": "a+b="}]}`.
fn write_chat_sums(path: &Path, n: usize) {
    let mut s = String::new();
    for i in 0..n {
        let (a, b) = (i * 7 % 23, i * 5 % 17);
        let row = json!({"prompt": [{"role": "user", "content": format!("{a}+{b}=")}]});
        s.push_str(&format!("{row}\n"));
    }
    std::fs::write(path, s).unwrap();
}

/// The dataset row whose user text the logged (rendered) prompt holds.
fn row_of<'a>(rows: &'a [Value], rendered: &str, user: impl Fn(&Value) -> String) -> &'a Value {
    let hits: Vec<&Value> = rows
        .iter()
        .filter(|r| rendered.contains(&format!("\n{}<|im_end|>", user(r))))
        .collect();
    assert_eq!(hits.len(), 1, "no single row for {rendered:?}");
    hits[0]
}

/// The train samples of a run and, for each, `rlft score`'s score of its prompt + completion
/// row (scored one at a time, so no batch or padding is shared with the run).
fn logged_and_scored(
    out: &Path,
    data: &Path,
    rm: &ScoreModel,
    system: Option<&str>,
    user: impl Fn(&Value) -> String,
) -> Vec<(f64, f64)> {
    let rows: Vec<Value> = std::fs::read_to_string(data)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let logged: Vec<Value> = std::fs::read_to_string(out.join("samples.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|v: &Value| v["split"] == "train")
        .collect();
    assert!(logged.len() >= 4, "{} samples logged", logged.len());
    let score_rows: Vec<Value> = logged
        .iter()
        .map(|s| {
            let row = row_of(&rows, s["prompt"].as_str().unwrap(), &user);
            json!({"prompt": row["prompt"], "completion": s["completion"]})
        })
        .collect();
    let ds = rlft_data::Dataset::new(vec!["prompt".into(), "completion".into()], score_rows);
    let (scored, _) = score_dataset(rm, &ds, system, 1).unwrap();
    logged
        .iter()
        .zip(&scored)
        .map(|(l, s)| {
            (
                l["rewards"]["rm"].as_f64().unwrap(),
                s["score"].as_f64().unwrap(),
            )
        })
        .collect()
}

fn assert_parity(pairs: &[(f64, f64)]) {
    for (got, want) in pairs {
        assert!(
            (got - want).abs() < 1e-4,
            "logged {got} vs rlft score {want}"
        );
    }
    let first = pairs[0].0;
    assert!(
        pairs.iter().any(|(g, _)| (g - first).abs() > 1e-3),
        "the reward model gave every completion the same score: {pairs:?}"
    );
}

#[test]
fn grpo_logs_the_reward_models_scores() {
    let dir = tempfile::tempdir().unwrap();
    let rm_dir = write_reward_model(dir.path(), true);
    let data = dir.path().join("chat.jsonl");
    write_chat_sums(&data, 16);
    let extra = format!(
        "dataset = \"{}\"\nsystem_prompt = \"{SYSTEM}\"\nnum_completions_to_log = 64\n\
         max_steps = 3\nnum_generations = 2\nlogging_steps = 1\n\
         [[rewards]]\ntype = \"model\"\nname = \"rm\"\npath = \"{}\"\nbatch_size = 3\n\
         weight = 2.0",
        data.display(),
        rm_dir.display()
    );
    let cfg: OnlineConfig = config(dir.path(), &extra);
    let mut p = prepare(&cfg, Path::new(&cfg.args.model), &Device::Cpu).unwrap();
    let s = train(&cfg, &mut p, &RunOptions::default()).unwrap();
    let rm = load_score_model(&rm_dir, None, &LoadOptions::default()).unwrap();
    let user = |r: &Value| r["prompt"][0]["content"].as_str().unwrap().to_string();
    let pairs = logged_and_scored(&cfg.args.output_dir, &data, &rm, Some(SYSTEM), user);
    assert_parity(&pairs);
    // The weight applies as for any reward: the logged total is 2x the model's score.
    let logged: Vec<Value> = std::fs::read_to_string(cfg.args.output_dir.join("samples.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for l in &logged {
        let (total, rm) = (l["reward"].as_f64().unwrap(), l["rewards"]["rm"].as_f64());
        assert!((total - 2.0 * rm.unwrap()).abs() < 1e-5, "{l}");
    }
    let mean = common::online::metric(&s, 0, "rewards/rm/mean");
    assert!(mean.is_finite(), "{mean}");
    // The reward model's tokens are not the policy's: same text, other ids.
    let first = &p.train[0];
    let rm_ids = rm.text.encode(&first.text, false).unwrap();
    assert_eq!(rm.text.decode(&rm_ids, false).unwrap(), first.text);
    assert_ne!(rm_ids, first.ids);
}

#[test]
fn ppo_takes_the_reward_model_as_reward_and_critic() {
    let dir = tempfile::tempdir().unwrap();
    let rm_dir = write_reward_model(dir.path(), false);
    let more = format!(
        "max_steps = 2\nnum_generations = 1\nper_device_train_batch_size = 4\n\
         num_completions_to_log = 64\nlogging_steps = 1\nvalue_model = \"{0}\"\n\
         [[rewards]]\ntype = \"model\"\nname = \"rm\"\npath = \"{0}\"\nbatch_size = 2",
        rm_dir.display()
    );
    let cfg: PpoConfig = config(dir.path(), &more);
    let mut p = prepare(&cfg, Path::new(&cfg.args.model), &Device::Cpu).unwrap();
    let rm = load_score_model(&rm_dir, None, &LoadOptions::default()).unwrap();
    // The critic starts as the reward model: same head.
    let critic = p.critic.as_ref().expect("ppo has a critic");
    let head = |h: &ScoreHead| -> Vec<f32> {
        let w = h.weight.flatten_all().unwrap().to_dtype(DType::F32);
        w.unwrap().to_vec1().unwrap()
    };
    assert_eq!(head(&critic.model.head), head(&rm.head));
    let s = train(&cfg, &mut p, &RunOptions::default()).unwrap();
    assert!(common::online::metric(&s, 1, "value_loss").is_finite());
    // String prompts: the standard format (prompt + completion + EOS), as `rlft score` reads
    // a string prompt + completion row.
    let data = PathBuf::from(&cfg.args.dataset);
    let user = |r: &Value| r["prompt"].as_str().unwrap().to_string();
    let pairs = logged_and_scored(&cfg.args.output_dir, &data, &rm, None, user);
    assert_parity(&pairs);
}

fn load_error(dir: &Path, reward: &str) -> String {
    let cfg: OnlineConfig = config(dir, &format!("[[rewards]]\n{reward}"));
    match prepare(&cfg, Path::new(&cfg.args.model), &Device::Cpu) {
        Ok(_) => panic!("{reward} loaded"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn config_errors_name_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // The policy's own directory: a causal LM, no score head.
    let _: OnlineConfig = config(d, "");
    let lm = d.join("model");
    let e = load_error(d, &format!("type = \"model\"\npath = \"{}\"", lm.display()));
    assert!(
        e.contains("is not a reward model")
            && e.contains(&lm.display().to_string())
            && e.contains("rlft reward-model")
            && e.contains("ForSequenceClassification"),
        "{e}"
    );
    let e = load_error(d, "type = \"model\"\npath = \"/no/such/rm\"");
    assert!(
        e.contains("/no/such/rm") && e.contains("does not exist"),
        "{e}"
    );
    let table: toml::Table = "model = \"m\"\n[[rewards]]\ntype = \"model\"\nweight = 1.0"
        .parse()
        .unwrap();
    let e = <OnlineConfig as rlft::config::TrainerConfig>::from_table(table, "x.toml")
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("`path` is missing"), "{e}");
    let rm = write_reward_model(d, false);
    let e = load_error(
        d,
        &format!(
            "type = \"model\"\npath = \"{}\"\nbatch_size = 0",
            rm.display()
        ),
    );
    assert!(e.contains("`batch_size` must be at least 1"), "{e}");
}
