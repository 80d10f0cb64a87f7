//! The report of a GRPO run: `rlft report RUN_DIR`.
//!
//! [`write_report`] reads a run directory ([`run`]: `metrics.jsonl`, and when present
//! `samples.jsonl`, `run_summary.json`, `config.toml`), builds
//! - a summary card ([`card`]): model, key config and batch arithmetic, training metrics (first,
//!   final, mean), eval before -> after with deltas, wall time, peak memory, steps, and notes on
//!   what was missing or non-finite;
//! - a reward dashboard ([`dashboard`]): reward with its rolling mean, each reward component,
//!   response length with its min-max band, KL, and groups with zero reward std, eval points as
//!   markers, drawn with plotters to PNG and SVG with an embedded font;
//! - sample rollout cases ([`cases`]): first and last logged steps, best and worst rewards,
//!   eval samples;
//!
//! and writes them to `RUN_DIR/report/`: `report.html` (one self-contained page, [`html`]),
//! `report.md` ([`markdown`]), `dashboard.png`, `dashboard.svg`, each atomically (temp file +
//! rename), so a reader never sees half a file. A run still in progress (no `run_summary.json`)
//! is reported as such with what it has logged.

pub mod card;
pub mod cases;
pub mod dashboard;
mod error;
mod font;
pub mod html;
pub mod markdown;
pub mod run;
pub mod stats;
mod text;

use std::io::Write;
use std::path::{Path, PathBuf};

pub use error::ReportError;

use error::io_err;

/// Name of the folder the report is written to, inside the run directory.
pub const REPORT_DIR: &str = "report";

/// Where [`write_report`] put its files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportPaths {
    /// `RUN_DIR/report`.
    pub dir: PathBuf,
    /// The self-contained page.
    pub html: PathBuf,
    /// The markdown summary.
    pub markdown: PathBuf,
    /// The dashboard as PNG.
    pub png: PathBuf,
    /// The dashboard as SVG.
    pub svg: PathBuf,
    /// The dashboard's size in pixels, `(width, height)`.
    pub dashboard_size: (u32, u32),
}

/// Writes `bytes` to `path` through a temporary file in the same directory and a rename.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), ReportError> {
    let name = path
        .file_name()
        .map_or_else(Default::default, |n| n.to_string_lossy());
    let tmp = path.with_file_name(format!(".{name}.tmp-{}", std::process::id()));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp).map_err(io_err("create", &tmp))?;
        f.write_all(bytes).map_err(io_err("write", &tmp))?;
        f.sync_all().map_err(io_err("sync", &tmp))?;
        std::fs::rename(&tmp, path).map_err(io_err("rename into place", path))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Reads the run in `run_dir` and writes its report to `run_dir/report/`.
///
/// Fails with a message saying what a run directory holds when `metrics.jsonl` is missing or
/// has no record; everything else missing is noted in the report instead.
pub fn write_report(run_dir: &Path) -> Result<ReportPaths, ReportError> {
    let run = run::read_run(run_dir)?;
    let card = card::build_card(&run);
    let dash = dashboard::build_dashboard(&run, &card);
    let cases = cases::pick_cases(&run.samples);
    let svg = dash.render_svg()?;
    let png = dash.render_png()?;
    let html = html::render_html(&card, &svg, &cases);
    let md = markdown::render_markdown(&card, &cases);

    let dir = run_dir.join(REPORT_DIR);
    std::fs::create_dir_all(&dir).map_err(io_err("create", &dir))?;
    let paths = ReportPaths {
        html: dir.join("report.html"),
        markdown: dir.join("report.md"),
        png: dir.join("dashboard.png"),
        svg: dir.join("dashboard.svg"),
        dashboard_size: dash.size(),
        dir,
    };
    write_atomic(&paths.png, &png)?;
    write_atomic(&paths.svg, svg.as_bytes())?;
    write_atomic(&paths.markdown, md.as_bytes())?;
    write_atomic(&paths.html, html.as_bytes())?;
    Ok(paths)
}
