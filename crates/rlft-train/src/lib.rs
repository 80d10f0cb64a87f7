//! # rlft-train: the training core of rlft
//!
//! What turns a loss into a parameter update, each piece pinned to PyTorch / transformers by
//! golden tests (`tests/`, produced by `scripts/reference/*_golden.py`):
//!
//! - [`adamw`]: [`AdamW`] with PyTorch's semantics and parameter groups ([`ParamGroup`]: vars +
//!   lr multiplier + weight decay); a reference kernel in candle tensor ops and a fused,
//!   multi-threaded in-place CPU kernel ([`AdamWKernel`]); f32 state and master weights for
//!   bf16/f16 parameters, the master in 2 bytes beside a bf16 parameter, or PyTorch's state in
//!   the parameter's dtype ([`AdamWPrecision`]); state as named tensors for checkpoints.
//! - [`clip`]: [`clip_grad_norm`], global L2 norm clipping (`clip_grad_norm_`), reporting a
//!   non-finite norm instead of poisoning the gradients.
//! - [`schedule`]: [`LrScheduler`] / [`LrSchedule`] / [`Warmup`], transformers' schedules as
//!   values (`lr_at(step, total_steps)`), deserialisable from their names.
//! - [`accumulate`]: [`GradAccumulator`], gradient accumulation over micro-batches (mean or
//!   token-weighted).
//! - [`bench`]: the AdamW benchmark of `rlft bench adamw` and `examples/adamw_bench.rs`.
//!
//! One optimizer step, in order:
//!
//! ```text
//! for micro-batch: loss.backward() -> acc.add_token_weighted(&grads, tokens, total)
//! grads = acc.finish(); clip = clip_grad_norm(&mut grads, &vars, max_norm)
//! if clip.is_finite() { opt.set_lr(sched.lr_at(step, total)); opt.step(&grads) }
//! ```

pub mod accumulate;
pub mod adamw;
pub mod bench;
pub mod clip;
mod cpu;
pub mod error;
pub mod schedule;

pub use accumulate::GradAccumulator;
pub use adamw::{AdamW, AdamWConfig, AdamWKernel, AdamWPrecision, ParamGroup};
pub use clip::{clip_grad_norm, global_grad_norm, ClipOutcome};
pub use error::{Result, TrainError};
pub use schedule::{LrSchedule, LrScheduler, Warmup};

// Run plumbing: checkpoints, metrics, TensorBoard, progress, Ctrl-C.
pub mod checkpoint;
pub mod crc32c;
pub mod metrics;
pub mod progress;
pub mod shutdown;
pub mod tensorboard;
