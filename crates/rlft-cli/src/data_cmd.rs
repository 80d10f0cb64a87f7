//! `rlft data tiny-python-expr --output DIR`: generate the seed example's prompt set, byte for
//! byte what the Python original generates (see `rlft_data::synth`); with `--preferences`,
//! preference pairs of the same expressions.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use rlft_data::synth::tiny_python_expr::{generate, Op, TinyPythonExprOptions};
use rlft_data::synth::tiny_python_expr_preferences::{preferences, RejectedKind};
use rlft_data::synth::{save_splits, SaveFormats};

/// `rlft data`.
#[derive(Args, Debug)]
pub struct DataArgs {
    /// Which dataset to generate.
    #[command(subcommand)]
    pub command: DataCommand,
}

/// The generators of `rlft data`.
#[derive(Subcommand, Debug)]
pub enum DataCommand {
    /// Integer arithmetic expressions with their values (the tiny_python_expr GRPO example),
    /// identical to the Python original for the same seed and sizes.
    TinyPythonExpr(TinyPythonExprArgs),
    /// Preference pairs from a model's own samples: per prompt of a config's dataset, the
    /// best- and worst-scored of `num_generations` completions under its `[[rewards]]` (the
    /// pairs a reward model needs before a policy is trained against it).
    SampledPreferences(crate::sampled_pairs_cmd::SampledPreferencesArgs),
}

/// `rlft data tiny-python-expr`.
#[derive(Args, Debug)]
pub struct TinyPythonExprArgs {
    /// Output directory: a Hugging Face DatasetDict (`datasets.load_from_disk`) with `train`
    /// and `test`.
    #[arg(long, short = 'o')]
    pub output: PathBuf,
    /// Rows in the train split (distinct expressions).
    #[arg(long, default_value_t = 128)]
    pub train_size: usize,
    /// Rows in the test split (distinct expressions; generated after train, same random stream).
    #[arg(long, default_value_t = 32)]
    pub test_size: usize,
    /// Seed of the Python-compatible random generator (`random.Random(seed)`).
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Operators, comma-separated, drawn in this order: any of + - * // % **.
    #[arg(long, default_value = "+,-,*", allow_hyphen_values = true)]
    pub operators: String,
    /// Each row's depth is drawn from 1..=max-depth.
    #[arg(long, default_value_t = 3)]
    pub max_depth: u32,
    /// Leaves are drawn from 0..=leaf-max.
    #[arg(long, default_value_t = 20)]
    pub leaf_max: u32,
    /// Smallest value any operator node may take.
    #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
    pub value_min: i64,
    /// Largest value any operator node may take.
    #[arg(long, default_value_t = 200, allow_hyphen_values = true)]
    pub value_max: i64,
    /// Also write DIR/train.jsonl and DIR/test.jsonl (lines as Python's json.dumps writes them).
    #[arg(long)]
    pub jsonl: bool,
    /// Also write DIR/train.parquet and DIR/test.parquet.
    #[arg(long)]
    pub parquet: bool,
    /// Replace an existing dataset directory at --output (other non-empty directories are
    /// never deleted).
    #[arg(long)]
    pub overwrite: bool,
    /// Leave out of the test split every expression that this tiny_python_expr dataset holds
    /// in its train or test split (repeatable): a held-out test set of another seed, e.g.
    /// `--seed 7 --train-size 0 --test-size 300 --exclude data/tpe` for a model trained on
    /// data/tpe. The test split then has at most --test-size rows.
    #[arg(long, value_name = "DATASET")]
    pub exclude: Vec<PathBuf>,
    /// Write preference pairs of the same expressions instead of prompts: conversational
    /// `prompt` / `chosen` (the right boxed answer) / `rejected` (see --rejected, drawn from
    /// the seed), for `rlft reward-model` and DPO.
    #[arg(long)]
    pub preferences: bool,
    /// With --preferences: the kinds of rejected reply, drawn uniformly per row, comma-separated
    /// among wrong_number (a wrong number, boxed), missing_box (the right number, not boxed) and
    /// no_answer (no number at all, against the right number unboxed: add it for a reward
    /// model a policy is trained against; docs/datasets.md).
    #[arg(
        long,
        default_value = "wrong_number,missing_box",
        requires = "preferences"
    )]
    pub rejected: String,
}

/// Runs `rlft data ...`.
pub fn run(a: DataArgs) -> Result<()> {
    match a.command {
        DataCommand::TinyPythonExpr(a) => run_tiny_python_expr(a),
        DataCommand::SampledPreferences(a) => crate::sampled_pairs_cmd::run(a),
    }
}

fn run_tiny_python_expr(a: TinyPythonExprArgs) -> Result<()> {
    let opts = TinyPythonExprOptions {
        seed: a.seed,
        train_size: a.train_size,
        test_size: a.test_size,
        operators: Op::parse_list(&a.operators).context("--operators")?,
        max_depth: a.max_depth,
        leaf_max: a.leaf_max,
        value_min: a.value_min,
        value_max: a.value_max,
    };
    check_output(&a.output, a.overwrite)?;
    let mut ds = generate(&opts)?;
    let excluded = excluded_expressions(&a.exclude)?;
    let before = ds.test.len();
    ds.test.retain(|r| !excluded.contains(&r.expression));
    for (i, r) in ds.test.iter_mut().enumerate() {
        r.index = i;
    }
    let formats = SaveFormats {
        jsonl: a.jsonl,
        parquet: a.parquet,
    };
    let written = if a.preferences {
        let kinds = RejectedKind::parse_list(&a.rejected)
            .map_err(|e| anyhow::anyhow!("--rejected: {e}"))?;
        let (train, test) = preferences(&ds, opts.seed, &kinds);
        save_splits(&a.output, &[("train", &train), ("test", &test)], formats)
    } else {
        ds.save(&a.output, formats)
    }
    .with_context(|| format!("writing {}", a.output.display()))?;

    let ops: Vec<&str> = opts.operators.iter().map(|op| op.symbol()).collect();
    println!(
        "tiny_python_expr: seed {}, operators {}, depth 1..={}, leaves 0..={}, values {}..={}",
        opts.seed,
        ops.join(" "),
        opts.max_depth,
        opts.leaf_max,
        opts.value_min,
        opts.value_max
    );
    println!("  train: {} rows", ds.train.len());
    println!("  test:  {} rows", ds.test.len());
    if !a.exclude.is_empty() {
        println!(
            "  ({} test rows left out: their expressions are in {})",
            before - ds.test.len(),
            a.exclude
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    println!("wrote {} (DatasetDict: train, test)", a.output.display());
    for path in written.iter().skip(1) {
        println!("  {}", path.display());
    }
    if a.preferences {
        println!(
            "  rows: prompt, chosen (right answer, boxed), rejected ({})",
            a.rejected
        );
        println!(
            "train a reward model on it: rlft reward-model --config rm.toml with dataset = {:?} \
             (docs/reward-model.md)",
            a.output.display().to_string()
        );
    } else {
        println!(
            "train on it: rlft grpo --config examples/tiny_python_expr/config.toml --set \
             dataset={}",
            a.output.display()
        );
    }
    println!(
        "or in Python: datasets.load_from_disk({:?})",
        a.output.display().to_string()
    );
    Ok(())
}

/// The `extra_info.expression` of every row of the train and test splits of `datasets`.
fn excluded_expressions(datasets: &[PathBuf]) -> Result<std::collections::HashSet<String>> {
    let mut out = std::collections::HashSet::new();
    for path in datasets {
        let mut found = false;
        for split in ["train", "test"] {
            let Ok(ds) = rlft_data::load_dataset(path, Some(split)) else {
                continue;
            };
            found = true;
            for row in ds.iter() {
                let e = row["extra_info"]["expression"].as_str().with_context(|| {
                    format!(
                        "--exclude {}: a {split} row has no extra_info.expression; point it at \
                         a dataset `rlft data tiny-python-expr` wrote",
                        path.display()
                    )
                })?;
                out.insert(e.to_string());
            }
        }
        if !found {
            bail!(
                "--exclude {}: no train or test split could be read there; point it at a \
                 dataset `rlft data tiny-python-expr` wrote",
                path.display()
            );
        }
    }
    Ok(out)
}

/// Refuses a non-empty output directory (or a file) unless `--overwrite` is given.
pub(crate) fn check_output(output: &Path, overwrite: bool) -> Result<()> {
    if !output.exists() {
        return Ok(());
    }
    if !output.is_dir() {
        bail!(
            "--output {} exists and is not a directory; choose another path",
            output.display()
        );
    }
    let non_empty = std::fs::read_dir(output)
        .with_context(|| format!("reading {}", output.display()))?
        .next()
        .is_some();
    if non_empty && !overwrite {
        bail!(
            "--output {} already exists and is not empty; pass --overwrite to replace the \
             dataset there, or choose another directory",
            output.display()
        );
    }
    Ok(())
}
