//! The summary card: headline numbers, key config, training metrics, eval before -> after.
//!
//! Built once from [`RunData`] as plain data; the HTML and markdown writers only lay it out.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::run::{RunData, RunStatus};
use crate::stats::{
    count_non_finite, first, fmt_delta, fmt_duration, fmt_mib, fmt_num, last, mean_finite,
    reward_components, rolling_window, series, RewardComponent,
};

/// Whether a change is good news.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tone {
    /// Neither (or not known).
    Neutral,
    /// An improvement.
    Good,
    /// A regression.
    Bad,
}

/// A headline number.
#[derive(Debug, Clone, PartialEq)]
pub struct Tile {
    /// What it is.
    pub label: String,
    /// The number, formatted.
    pub value: String,
    /// A second line (context, comparison).
    pub detail: String,
    /// Colour of the detail line.
    pub tone: Tone,
}

/// One training metric over the run.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainRow {
    /// Display name.
    pub name: String,
    /// Metrics key.
    pub key: String,
    /// Value at the first logged step.
    pub first: Option<f64>,
    /// Value at the last logged step.
    pub last: Option<f64>,
    /// Mean over the finite values.
    pub mean: Option<f64>,
}

/// One eval metric before and after training.
#[derive(Debug, Clone, PartialEq)]
pub struct EvalRow {
    /// Display name.
    pub name: String,
    /// Before training (or at the first eval).
    pub before: Option<f64>,
    /// After training (or at the last eval).
    pub after: Option<f64>,
    /// Whether higher is better (rewards) rather than neutral (lengths).
    pub higher_is_better: bool,
}

impl EvalRow {
    /// `after - before`, when both exist.
    pub fn delta(&self) -> Option<f64> {
        Some(self.after? - self.before?)
    }

    /// Whether the change is good news.
    pub fn tone(&self) -> Tone {
        match self.delta() {
            Some(d) if self.higher_is_better && d > 0.0 => Tone::Good,
            Some(d) if self.higher_is_better && d < 0.0 => Tone::Bad,
            _ => Tone::Neutral,
        }
    }
}

/// Eval before -> after.
#[derive(Debug, Clone, PartialEq)]
pub struct EvalTable {
    /// Column title of the "before" values (`before training`, `step 10`).
    pub before_label: String,
    /// Column title of the "after" values.
    pub after_label: String,
    /// The metrics.
    pub rows: Vec<EvalRow>,
}

/// The summary card of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct Card {
    /// The run directory's name.
    pub run_name: String,
    /// Model name or path.
    pub model: Option<String>,
    /// How the run ended.
    pub status: RunStatus,
    /// Last logged step.
    pub last_step: u64,
    /// Headline numbers.
    pub tiles: Vec<Tile>,
    /// Key config entries, `(name, value)`.
    pub config: Vec<(String, String)>,
    /// Training metrics.
    pub training: Vec<TrainRow>,
    /// Eval before -> after, when any eval was logged.
    pub eval: Option<EvalTable>,
    /// What was missing, skipped or odd.
    pub notes: Vec<String>,
}

/// LightRFT names a raw `config.toml` may use for the keys the card shows (the typed config in
/// `run_summary.json` has the TRL names; `rlft::config::online::ALIASES` is the full list).
const ALIASES: [(&str, &str); 7] = [
    ("num_generations", "n_samples_per_prompt"),
    ("per_device_train_batch_size", "micro_train_batch_size"),
    ("beta", "init_kl_coef"),
    ("max_prompt_length", "prompt_max_len"),
    ("max_completion_length", "generate_max_len"),
    ("learning_rate", "actor_learning_rate"),
    ("epsilon", "eps_clip"),
];

/// Looks `key` (or its LightRFT alias) up at the top of the config, then in nested tables
/// (depth first).
fn find<'a>(cfg: &'a Value, key: &str) -> Option<&'a Value> {
    fn walk<'a>(cfg: &'a Value, key: &str) -> Option<&'a Value> {
        let obj = cfg.as_object()?;
        obj.get(key).or_else(|| {
            obj.values()
                .filter(|v| v.is_object())
                .find_map(|v| walk(v, key))
        })
    }
    let alias = ALIASES.iter().find(|a| a.0 == key).map(|a| a.1);
    walk(cfg, key).or_else(|| walk(cfg, alias?))
}

fn show(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(a) => a.iter().map(show).collect::<Vec<_>>().join(", "),
        other => other.to_string(),
    }
}

fn lora_line(cfg: &Value) -> Option<String> {
    let use_peft = find(cfg, "use_peft").and_then(Value::as_bool);
    if use_peft == Some(false) {
        return Some("off (full fine-tuning)".into());
    }
    let lora = find(cfg, "lora").filter(|v| v.is_object());
    let get = |k: &str, flat: &str| {
        lora.and_then(|l| l.get(k))
            .or_else(|| find(cfg, flat))
            .map(show)
    };
    let r = get("r", "lora_r")?;
    let mut s = format!("r {r}");
    if let Some(a) = get("lora_alpha", "lora_alpha") {
        s += &format!(", alpha {a}");
    }
    if let Some(d) = get("lora_dropout", "lora_dropout") {
        s += &format!(", dropout {d}");
    }
    if let Some(t) = get("target_modules", "lora_target_modules") {
        s += &format!(" on {t}");
    }
    Some(s)
}

fn batch_line(cfg: &Value) -> Option<String> {
    let b = find(cfg, "per_device_train_batch_size")?.as_u64()?;
    let a = find(cfg, "gradient_accumulation_steps")
        .and_then(Value::as_u64)
        .unwrap_or(1);
    let n = b * a;
    let mut s = format!("{b} x {a} accumulation = {n} completions per step");
    let Some(g) = find(cfg, "num_generations").and_then(Value::as_u64) else {
        return Some(s);
    };
    // generation_batch_size: completions per rollout, 0 or unset = one train batch.
    let r = find(cfg, "generation_batch_size")
        .and_then(Value::as_u64)
        .filter(|r| *r > 0)
        .unwrap_or(n);
    if g > 0 && r % g == 0 {
        if r == n {
            s += &format!(" = {} prompts x {g} generations", r / g);
        } else {
            s += &format!(
                "; rollouts of {r} completions = {} prompts x {g} generations",
                r / g
            );
        }
    } else {
        s += &format!(" ({r} per rollout: not a multiple of num_generations = {g})");
    }
    Some(s)
}

/// The reward functions and their weights: `python_expr_rule`, `format x0.5, accuracy`.
fn rewards_line(cfg: &Value) -> Option<String> {
    let list = find(cfg, "rewards")?.as_array()?;
    let names: Vec<String> = list
        .iter()
        .filter_map(|r| {
            let name = r.get("name").or_else(|| r.get("type"))?.as_str()?;
            match r.get("weight").and_then(Value::as_f64) {
                Some(w) if w != 1.0 => Some(format!("{name} x{w}")),
                _ => Some(name.to_owned()),
            }
        })
        .collect();
    (!names.is_empty()).then(|| names.join(", "))
}

fn config_rows(cfg: &Value) -> Vec<(String, String)> {
    let mut rows = Vec::new();
    let plain = |rows: &mut Vec<(String, String)>, keys: &[&str]| {
        for key in keys {
            if let Some(v) = find(cfg, key).filter(|v| !v.is_null()) {
                rows.push((key.to_string(), show(v)));
            }
        }
    };
    plain(&mut rows, &["algorithm", "loss_type", "scale_rewards"]);
    if let Some(r) = rewards_line(cfg) {
        rows.push(("rewards".into(), r));
    }
    plain(&mut rows, &["learning_rate", "num_generations"]);
    if let Some(b) = batch_line(cfg) {
        rows.push(("batch".into(), b));
    }
    plain(
        &mut rows,
        &[
            "max_prompt_length",
            "max_completion_length",
            "beta",
            "epsilon",
        ],
    );
    if let Some(l) = lora_line(cfg) {
        rows.push(("LoRA".into(), l));
    }
    rows
}

/// Training metrics shown in the card, in order: `(key, name)`; reward components go after
/// `reward_std`.
const TRAIN_KEYS: [(&str, &str); 10] = [
    ("completions/mean_length", "response length (tokens)"),
    ("completions/clipped_ratio", "truncated completions"),
    ("kl", "KL to reference"),
    ("entropy", "entropy"),
    ("frac_reward_zero_std", "groups with zero reward std"),
    ("clip_ratio/region_mean", "clipped ratio (PPO region)"),
    ("loss", "loss"),
    ("grad_norm", "grad norm"),
    ("learning_rate", "learning rate"),
    ("tokens_per_s", "tokens/s"),
];

fn train_rows(run: &RunData, comps: &[RewardComponent]) -> Vec<TrainRow> {
    let mut keys: Vec<(String, String)> = vec![
        ("reward".into(), "reward".into()),
        ("reward_std".into(), "reward std (within groups)".into()),
    ];
    keys.extend(comps.iter().map(|c| (c.key.clone(), c.label.clone())));
    keys.extend(
        TRAIN_KEYS
            .iter()
            .map(|(k, n)| (k.to_string(), n.to_string())),
    );
    keys.into_iter()
        .filter_map(|(key, name)| {
            let p = series(&run.metrics, &key);
            (!p.is_empty()).then(|| TrainRow {
                first: first(&p),
                last: last(&p),
                mean: mean_finite(&p),
                name,
                key,
            })
        })
        .collect()
}

/// The name of an eval key without `eval/`, `rewards/` and `/mean`.
fn eval_name(key: &str, comps: &[RewardComponent]) -> String {
    if let Some(c) = comps.iter().find(|c| c.eval_key == key) {
        return c.label.clone();
    }
    match key {
        "eval/reward" => "reward".into(),
        "eval/completions/mean_length" => "response length (tokens)".into(),
        "eval/completions/clipped_ratio" => "truncated completions".into(),
        _ => {
            let k = key.strip_prefix("eval/").unwrap_or(key);
            let k = k.strip_prefix("rewards/").unwrap_or(k);
            k.strip_suffix("/mean").unwrap_or(k).to_owned()
        }
    }
}

fn eval_table(run: &RunData, comps: &[RewardComponent]) -> Option<EvalTable> {
    let eval_rows: Vec<_> = run
        .metrics
        .iter()
        .filter(|r| r.values.iter().any(|(k, _)| k.starts_with("eval/")))
        .collect();
    let from_row = |r: &crate::run::MetricRow| -> BTreeMap<String, f64> {
        r.values
            .iter()
            .filter(|(k, _)| k.starts_with("eval/"))
            .cloned()
            .collect()
    };
    let (before, before_label) = match (&run.eval_initial, eval_rows.first()) {
        (Some(m), _) => (m.clone(), "before training".to_owned()),
        (None, Some(r)) => (from_row(r), format!("step {}", r.step)),
        (None, None) => (BTreeMap::new(), String::new()),
    };
    let first_used = run.eval_initial.is_none();
    let (after, after_label) = match (&run.eval_final, eval_rows.last()) {
        (Some(m), _) => (m.clone(), "after training".to_owned()),
        (None, Some(r)) if !(first_used && eval_rows.len() == 1) => {
            (from_row(r), format!("step {}", r.step))
        }
        _ => (BTreeMap::new(), "after".to_owned()),
    };
    if before.is_empty() && after.is_empty() {
        return None;
    }
    let mut keys: Vec<String> = vec!["eval/reward".into()];
    keys.extend(comps.iter().map(|c| c.eval_key.clone()));
    keys.push("eval/completions/mean_length".into());
    keys.push("eval/completions/clipped_ratio".into());
    // Other eval metrics a trainer may add (not the spread, lengths or timings shown elsewhere).
    for k in before.keys().chain(after.keys()) {
        let shown = ["eval/rewards/", "eval/completions/"]
            .iter()
            .any(|p| k.starts_with(p));
        if k.starts_with("eval/") && !shown && !k.ends_with("/std") && !keys.contains(k) {
            keys.push(k.clone());
        }
    }
    let rows = keys
        .into_iter()
        .filter(|k| before.contains_key(k) || after.contains_key(k))
        .map(|k| EvalRow {
            name: eval_name(&k, comps),
            before: before.get(&k).copied(),
            after: after.get(&k).copied(),
            higher_is_better: k.starts_with("eval/reward"),
        })
        .collect();
    Some(EvalTable {
        before_label,
        after_label,
        rows,
    })
}

fn tiles(run: &RunData, last_step: u64, eval: Option<&EvalTable>) -> Vec<Tile> {
    let mut tiles = Vec::new();
    let tile = |label: &str, value: String, detail: String, tone| Tile {
        label: label.into(),
        value,
        detail,
        tone,
    };
    let epoch = run.metrics.iter().rev().find_map(|r| r.get("epoch"));
    tiles.push(tile(
        "steps",
        run.global_step.unwrap_or(last_step).to_string(),
        epoch.map_or_else(String::new, |e| format!("epoch {e:.2}")),
        Tone::Neutral,
    ));
    let elapsed = run.metrics.iter().rev().find_map(|r| r.get("elapsed_s"));
    if let Some(w) = run.wall_time_s.or(elapsed) {
        let detail = if run.wall_time_s.is_none() {
            "so far"
        } else {
            ""
        };
        tiles.push(tile(
            "wall time",
            fmt_duration(w),
            detail.into(),
            Tone::Neutral,
        ));
    }
    if let Some(m) = run.peak_rss_mib {
        tiles.push(tile(
            "peak memory",
            fmt_mib(m),
            "resident set".into(),
            Tone::Neutral,
        ));
    }
    let reward = series(&run.metrics, "reward");
    let finite: Vec<f64> = reward
        .iter()
        .map(|p| p.1)
        .filter(|v| v.is_finite())
        .collect();
    if !finite.is_empty() {
        let w = rolling_window(finite.len()).min(finite.len());
        let mean = |s: &[f64]| s.iter().sum::<f64>() / s.len() as f64;
        let (start, end) = (mean(&finite[..w]), mean(&finite[finite.len() - w..]));
        let tone = match end - start {
            d if d > 0.0 => Tone::Good,
            d if d < 0.0 => Tone::Bad,
            _ => Tone::Neutral,
        };
        tiles.push(tile(
            &format!("train reward, last {w} steps"),
            fmt_num(end),
            format!(
                "first {w} steps {} ({})",
                fmt_num(start),
                fmt_delta(end - start)
            ),
            tone,
        ));
    }
    if let Some(row) = eval.and_then(|e| e.rows.iter().find(|r| r.name == "reward")) {
        let (value, detail) = match (row.before, row.after, row.delta()) {
            (Some(b), Some(a), Some(d)) => (
                fmt_num(a),
                format!("before {} ({})", fmt_num(b), fmt_delta(d)),
            ),
            (Some(b), None, _) => (fmt_num(b), "before training; no final eval yet".into()),
            (None, Some(a), _) => (fmt_num(a), "no eval before training".into()),
            _ => ("-".into(), String::new()),
        };
        tiles.push(tile("eval reward", value, detail, row.tone()));
    }
    tiles
}

/// Builds the card of a run.
pub fn build_card(run: &RunData) -> Card {
    let comps = reward_components(&run.metrics);
    let last_step = run.metrics.iter().map(|r| r.step).max().unwrap_or(0);
    let eval = eval_table(run, &comps);
    let training = train_rows(run, &comps);
    let mut notes = Vec::new();
    if run.status == RunStatus::InProgress {
        notes.push(
            "no run_summary.json yet: the run is in progress (or stopped without finishing); \
             this report shows what has been logged so far"
                .to_owned(),
        );
    }
    let non_finite: Vec<String> = training
        .iter()
        .map(|r| (r, count_non_finite(&series(&run.metrics, &r.key))))
        .filter(|(_, n)| *n > 0)
        .map(|(r, n)| format!("{} ({n})", r.key))
        .collect();
    if !non_finite.is_empty() {
        notes.push(format!(
            "non-finite values (NaN/inf), left out of means and charts: {}",
            non_finite.join(", ")
        ));
    }
    if eval.is_none() {
        notes.push("no eval logged (eval_steps unset, or no eval split)".into());
    }
    notes.extend(run.notes.iter().cloned());
    Card {
        run_name: run
            .dir
            .canonicalize()
            .unwrap_or_else(|_| run.dir.clone())
            .file_name()
            .map_or_else(
                || run.dir.display().to_string(),
                |n| n.to_string_lossy().into(),
            ),
        model: run.model.clone(),
        status: run.status.clone(),
        last_step,
        tiles: tiles(run, last_step, eval.as_ref()),
        config: run.config.as_ref().map(config_rows).unwrap_or_default(),
        training,
        eval,
        notes,
    }
}
