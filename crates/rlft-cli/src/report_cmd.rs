//! `rlft report RUN_DIR`: the report of a GRPO run (summary card, reward dashboard, rollouts).

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

/// `rlft report`.
#[derive(Args, Debug)]
pub struct ReportArgs {
    /// The run directory (a GRPO config's output_dir, holding metrics.jsonl); works on a run in
    /// progress too.
    pub run_dir: PathBuf,
}

/// Runs `rlft report`: writes report.html, report.md, dashboard.png and dashboard.svg under
/// RUN_DIR/report/ and prints their paths.
pub fn run(a: ReportArgs) -> Result<()> {
    let paths = rlft_report::write_report(&a.run_dir)?;
    println!("{}", paths.html.display());
    println!("{}", paths.markdown.display());
    println!("{}", paths.png.display());
    println!("{}", paths.svg.display());
    Ok(())
}
