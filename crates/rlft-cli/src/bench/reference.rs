//! The reference side of `rlft bench --against-reference`: PyTorch + transformers + TRL, run by
//! the repository's harness `bench/reference/` (`bench.py --run-case CASE` prints
//! `RESULT_JSON {...}`; `grpo.py` writes its result to `--out`), and the mapping of each case's
//! figures onto rlft's.
//!
//! Found without flags: the harness in `./bench/reference` or, from the executable
//! (`target/release/rlft`), in `../../bench/reference`; its venv and model where its `setup.sh`
//! puts them, under the cache root (`$RLFT_CACHE` or `~/.cache/rlft`) in `reference/`: the
//! model is the HF copy of rlft's `--model` (see [`default_model_dir`]).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};
use rlft_model::bench::process::CpuSnapshot;
use serde_json::{json, Map, Value};

use super::cases::threads;
use super::report::RefOutcome;
use super::{expand_home, result_line, BenchArgs, Case};
use crate::models::{cache_root, is_default};

/// The harness's directory inside the repository.
pub const HARNESS: &str = "bench/reference";

/// The harness directory: `bench/reference` under the current directory, else under the
/// repository the executable was built in (`<repo>/target/<profile>/rlft`).
fn find_harness() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok();
    let from_exe = exe
        .as_deref()
        .and_then(|e| e.parent()?.parent()?.parent().map(|r| r.join(HARNESS)));
    std::iter::once(PathBuf::from(HARNESS))
        .chain(from_exe)
        .find(|d| d.join("bench.py").is_file())
}

/// `bash DIR/setup.sh [MODEL]`, with DIR as short as it can be said (MODEL left out for the
/// default model).
fn setup_command(dir: &Path, model: &str) -> String {
    let shown = std::env::current_dir()
        .ok()
        .and_then(|cwd| dir.strip_prefix(cwd).ok().map(Path::to_path_buf))
        .unwrap_or_else(|| dir.to_path_buf());
    let arg = if is_default(model) {
        String::new()
    } else {
        format!(" {model}")
    };
    format!("bash {}{arg}", shown.join("setup.sh").display())
}

/// The HF directory the reference loads for rlft's `--model` when `--reference-model` is not
/// given: where `bench/reference/setup.sh MODEL` converts it, `<ref>/<name>-hf` under `ref` (the
/// cache's `reference/`), `<name>` being a built-in model's cache directory
/// (`smollm2-135m-instruct` for the default) or a GGUF file's stem; an HF directory (one with a
/// config.json) is loaded as it is.
pub fn default_model_dir(reference: &Path, model: &str) -> PathBuf {
    let name = match rlft_fetch::classify(model) {
        Ok(rlft_fetch::ModelRef::Builtin(m)) => m.cache_dir.to_string(),
        Ok(rlft_fetch::ModelRef::Path(p)) => {
            if p.join("config.json").is_file() {
                return p;
            }
            p.file_stem()
                .map_or_else(|| model.to_string(), |s| s.to_string_lossy().into_owned())
        }
        Err(_) => rlft_fetch::registry::default_model().cache_dir.to_string(),
    };
    reference.join(format!("{name}-hf"))
}

/// The located reference: its Python, scripts and model.
pub struct Reference {
    python: PathBuf,
    dir: PathBuf,
    model: PathBuf,
    /// Whether the model came from `--reference-model` (else it is `--model`'s HF copy).
    model_given: bool,
}

impl Reference {
    /// Finds the scripts, the venv's Python and the model (flags first, then the defaults of the
    /// module doc); the error says what is missing and how to build it.
    pub fn locate(a: &BenchArgs) -> std::result::Result<Self, String> {
        let dir = match &a.reference_dir {
            Some(d) => d.clone(),
            None => find_harness().ok_or_else(|| {
                format!(
                    "the reference harness `{HARNESS}/` is not in the current directory nor \
                     beside this executable's repository; run rlft from the repository root \
                     (then build the reference once with `bash {HARNESS}/setup.sh`) or pass \
                     --reference-dir"
                )
            })?,
        };
        let cache = cache_root().join("reference");
        let r = Reference {
            python: a
                .reference_python
                .as_deref()
                .map_or_else(|| cache.join("venv/bin/python"), expand_home),
            model: a
                .reference_model
                .as_deref()
                .map_or_else(|| default_model_dir(&cache, &a.model.model), expand_home),
            model_given: a.reference_model.is_some(),
            dir,
        };
        let missing: Vec<String> = [&r.python, &r.dir.join("bench.py"), &r.model]
            .iter()
            .filter(|p| !p.exists())
            .map(|p| p.display().to_string())
            .collect();
        if missing.is_empty() {
            Ok(r)
        } else {
            Err(format!(
                "the reference is not built ({} missing); build it once with `{}` (a Python \
                 venv with torch, transformers, trl and peft, about 6 GB, and the model as a \
                 float32 HF directory, 4 bytes a parameter, under {})",
                missing.join(", "),
                setup_command(&r.dir, &a.model.model),
                cache.display()
            ))
        }
    }

    /// The HF directory the reference loads.
    pub fn model(&self) -> &Path {
        &self.model
    }

    /// Whether that directory was given by `--reference-model` (else it is `--model`'s copy).
    pub fn model_given(&self) -> bool {
        self.model_given
    }

    /// Where the reference lives, for the JSON.
    pub fn describe(&self) -> Value {
        json!({"python": self.python, "dir": self.dir, "model": self.model})
    }

    /// Runs the reference's `case` (nothing for `ref_pass`, whose figure comes from the fwd_bwd
    /// case's `forward_no_grad` when fwd_bwd ran earlier in this sitting, `done`): its summary,
    /// or a note why there is none.
    pub fn run_case(&self, case: Case, a: &BenchArgs, done: &Map<String, Value>) -> RefOutcome {
        let none = |note: Option<String>, failed| RefOutcome {
            summary: None,
            note,
            failed,
        };
        let raw = match case {
            Case::All => return none(None, false),
            Case::RefPass => {
                let fwd = done.get("fwd_bwd").and_then(|e| e.get("reference"));
                return match fwd.and_then(|r| r["raw"].get("forward_no_grad")) {
                    Some(fng) => RefOutcome {
                        summary: Some(json!({
                            "source": "bench.py fwd_bwd: forward_no_grad (same batch, no grad, \
                                       logits at all 128 positions; no peak RSS of its own)",
                            "median_ms": fng["median_ms"], "min_ms": fng["min_ms"],
                            "max_ms": fng["max_ms"], "reps_ms": fng["reps_ms"],
                            "peak_rss_mib": null,
                            "other_procs_cpu_pct": fwd.map(|r| r["other_procs_cpu_pct"].clone()),
                            "steal_pct": fwd.map(|r| r["steal_pct"].clone()),
                        })),
                        note: None,
                        failed: false,
                    },
                    None => none(
                        Some(
                            "bench.py has no case of its own for this; its figure (fwd_bwd's \
                             forward_no_grad) comes with fwd_bwd run earlier in the same sitting"
                                .into(),
                        ),
                        false,
                    ),
                };
            }
            Case::Ppo => {
                return none(
                    Some(
                        "no reference: TRL 1.16 has no PPOTrainer (removed from trl.trainer, \
                         not in trl.experimental either)"
                            .into(),
                    ),
                    false,
                )
            }
            _ => {
                eprintln!("== {}: reference", case.name());
                if case.is_step() {
                    self.run_grpo_py(case, a.reps + 1)
                } else {
                    self.run_bench_py(case, a)
                }
            }
        };
        match raw.and_then(|r| summarize(case, a, r)) {
            Ok(v) => RefOutcome {
                summary: Some(v),
                note: None,
                failed: false,
            },
            Err(e) => none(Some(format!("reference failed: {e:#}")), true),
        }
    }

    /// `python SCRIPT --model MODEL --threads N`, torch on as many threads as rlft uses.
    fn command(&self, script: &str) -> Command {
        let n = threads().to_string();
        let mut c = Command::new(&self.python);
        c.arg(self.dir.join(script))
            .arg("--model")
            .arg(&self.model)
            .args(["--threads", &n])
            .env("OMP_NUM_THREADS", &n)
            .env("TOKENIZERS_PARALLELISM", "false")
            .stdin(Stdio::null());
        c
    }

    fn run_bench_py(&self, case: Case, a: &BenchArgs) -> Result<Value> {
        let out = self
            .command("bench.py")
            .args(["--run-case", case.name()])
            .args(["--reps", &a.reps.to_string()])
            .args(["--warmup", &a.warmup.to_string()])
            .args(["--batch", &a.batch.to_string()])
            .args(["--new-tokens", &a.new_tokens.to_string()])
            .output()
            .context("run the reference bench.py")?;
        if !out.status.success() {
            bail!("bench.py failed ({}): {}", out.status, tail(&out.stderr));
        }
        result_line(&String::from_utf8_lossy(&out.stdout))
            .with_context(|| format!("no RESULT_JSON from bench.py: {}", tail(&out.stderr)))
    }

    /// `grpo.py --trainer grpo|rloo` (`offline.py --trainer dpo|reward_model`) for `steps`
    /// steps.
    fn run_grpo_py(&self, case: Case, steps: usize) -> Result<Value> {
        let cpu = CpuSnapshot::now();
        let tmp = tempfile::tempdir()?;
        let out_file = tmp.path().join("grpo.json");
        let script = if case.is_offline_step() {
            "offline.py"
        } else {
            "grpo.py"
        };
        let out = self
            .command(script)
            .args(["--trainer", case.name()])
            .arg("--max-steps")
            .arg(steps.to_string())
            .arg("--out")
            .arg(&out_file)
            .stdout(Stdio::null())
            .output()
            .with_context(|| format!("run the reference {script}"))?;
        if !out.status.success() {
            bail!("{script} failed ({}): {}", out.status, tail(&out.stderr));
        }
        let text = std::fs::read_to_string(&out_file)
            .with_context(|| format!("read {}", out_file.display()))?;
        let mut raw: Value = serde_json::from_str(&text)?;
        // grpo.py measures no interference: take it from outside, over its whole run.
        let i = cpu.interference_since();
        raw["other_procs_cpu_pct"] = json!(i.other_procs_cpu_pct);
        raw["steal_pct"] = json!(i.steal_pct);
        Ok(raw)
    }
}

/// The last lines of a process's stderr.
fn tail(stderr: &[u8]) -> String {
    let s = String::from_utf8_lossy(stderr);
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

/// The reference's figures for `case` in rlft's terms: `median_ms`, `min_ms`, `max_ms`,
/// `reps_ms` of the same unit of work, `peak_rss_mib`, `other_procs_cpu_pct`, where they came
/// from (`source`), and the raw result (`raw`).
fn summarize(case: Case, a: &BenchArgs, raw: Value) -> Result<Value> {
    let pick = |key: &str| -> Result<Value> {
        let v = raw.pointer(key).cloned().unwrap_or(Value::Null);
        if !v["median_ms"].is_number() {
            bail!("no `{key}` timing in the reference's result (got {v})");
        }
        Ok(v)
    };
    let (t, source, peak) = match case {
        Case::Generate => {
            let key = format!("/batch_{}/generate", a.batch);
            (
                pick(&key)?,
                format!("bench.py generate: {key}"),
                "peak_rss_bench_mib",
            )
        }
        Case::FwdBwd | Case::Lora => (
            pick("/fwd_bwd")?,
            format!("bench.py {}: fwd_bwd", case.name()),
            "peak_rss_bench_mib",
        ),
        Case::Adamw => (
            pick("/step_fused")?,
            "bench.py adamw: step_fused".into(),
            "peak_rss_bench_mib",
        ),
        Case::Grpo | Case::Rloo | Case::Dpo | Case::RewardModel => {
            let steps: Vec<f64> = raw["step_s"]
                .as_array()
                .map(|s| s.iter().filter_map(Value::as_f64).skip(1).collect())
                .unwrap_or_default();
            if steps.is_empty() {
                bail!("grpo.py reported no step after the first");
            }
            (
                super::report::stats_ms(&steps),
                format!(
                    "{} --trainer {}: step_s after the first (CPU interference measured \
                     from outside, over the whole run, loading included)",
                    if case.is_offline_step() {
                        "offline.py"
                    } else {
                        "grpo.py"
                    },
                    case.name()
                ),
                "peak_rss_bench_mib",
            )
        }
        Case::All | Case::RefPass | Case::Ppo => {
            bail!("no reference case for {}", case.name())
        }
    };
    let mut v = json!({
        "source": source,
        "median_ms": t["median_ms"], "min_ms": t["min_ms"], "max_ms": t["max_ms"],
        "reps_ms": t["reps_ms"],
        "peak_rss_mib": raw[peak],
        "other_procs_cpu_pct": raw["other_procs_cpu_pct"],
        "steal_pct": raw["steal_pct"],
    });
    if case == Case::Generate {
        v["new_tokens_per_s_median"] =
            raw[format!("batch_{}", a.batch)]["new_tokens_per_s_median"].clone();
    }
    if case.is_step() {
        v["phase_s_median"] = raw["step_phase_s_median"].clone();
    }
    v["raw"] = raw;
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_model_follows_rlft_model() {
        let r = Path::new("/cache/reference");
        let dir = |m: &str| default_model_dir(r, m);
        assert_eq!(dir("default"), r.join("smollm2-135m-instruct-hf"));
        assert_eq!(dir("SmolLM2-135M"), r.join("smollm2-135m-instruct-hf"));
        assert_eq!(
            dir("qwen2.5-coder-0.5b"),
            r.join("qwen2.5-coder-0.5b-instruct-hf")
        );
        assert_eq!(
            dir("/nowhere/My-Model.Q8_0.gguf"),
            r.join("My-Model.Q8_0-hf")
        );
        let hf = tempfile::tempdir().unwrap();
        std::fs::write(hf.path().join("config.json"), "{}").unwrap();
        assert_eq!(dir(hf.path().to_str().unwrap()), hf.path());
        assert!(setup_command(Path::new("/x/bench/reference"), "default").ends_with("setup.sh"));
        assert!(
            setup_command(Path::new("/x/bench/reference"), "qwen2.5-coder-0.5b")
                .ends_with("setup.sh qwen2.5-coder-0.5b")
        );
    }
}
