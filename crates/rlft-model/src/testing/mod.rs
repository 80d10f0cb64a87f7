//! Test-only helpers shared by the crate's tests (no candle types here).

pub mod det_init;
