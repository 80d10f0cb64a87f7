//! Writes a small run's metrics (`metrics.jsonl` + TensorBoard event files) with a crash and a
//! resume in the middle, for `scripts/reference/read_tfevents.py` to read back with
//! TensorBoard's own reader:
//!
//! ```sh
//! cargo run --release -p rlft-train --example tfevents_demo -- /tmp/tb_demo
//! python scripts/reference/read_tfevents.py /tmp/tb_demo/tensorboard --compare-jsonl /tmp/tb_demo/metrics.jsonl
//! ```
//!
//! The first run logs steps 1-6 and "crashes"; the resumed run restarts from a checkpoint at
//! step 4 and logs 5-8 with other values. Both readers must see steps 1-8 once, 5-8 from the
//! second run.

use rlft_train::metrics::MetricsLogger;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::path::PathBuf::from(
        std::env::args()
            .nth(1)
            .ok_or("usage: tfevents_demo OUT_DIR")?,
    );
    let mut log = MetricsLogger::create(&dir, true)?;
    for step in 1..=6u64 {
        let s = step as f64;
        log.log(
            step,
            s / 4.0,
            &[
                ("train/loss", 10.0 - s),
                ("train/learning_rate", 1e-4 * s),
                ("train/nan", f64::NAN),
            ],
        )?;
    }
    drop(log);
    let mut log = MetricsLogger::resume(&dir, 4, true)?;
    for step in 5..=8u64 {
        let s = step as f64;
        log.log(
            step,
            s / 4.0,
            &[
                ("train/loss", 100.0 + s),
                ("train/learning_rate", 1e-4 * s),
                ("train/nan", f64::NAN),
            ],
        )?;
    }
    println!(
        "wrote {} and {}",
        log.path().display(),
        log.tensorboard_path().unwrap().display()
    );
    Ok(())
}
