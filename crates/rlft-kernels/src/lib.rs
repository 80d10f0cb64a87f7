//! # rlft-kernels: the CPU kernels and process runtime of rlft
//!
//! The fast paths under `rlft-model`, which knows nothing of them beyond these functions: the
//! fused training ops (candle custom ops with their own backward), the decoding kernels (f32
//! weights streamed once per step, GGUF Q4_1/Q8_0 blocks unpacked in registers), the SIMD
//! dispatch they share, and the process settings they run under (allocator, thread pool,
//! switches). Nothing here knows a model: every kernel takes tensors or slices and shapes.
//!
//! - [`fused`]: training ops with backward, one graph node each (RMSNorm, SwiGLU, RoPE,
//!   attention, linear and LoRA layers, the LM head's log-probs, constant-operand ops).
//! - [`stream`]: the f32 streaming `x @ W^T` for few rows (decoding, LoRA factors).
//! - [`quant`]: frozen weights kept as GGUF blocks ([`quant::QuantWeight`]) and their products.
//! - [`decode`]: the slice kernels a fused decoder pass is made of (norms, RoPE, attention over
//!   a cache, products that stream or call gemm by size).
//! - [`gemm`]: the gemm crate's products as the training ops call them.
//! - [`math`]: the float types, a vectorisable `exp`, lane-parallel reductions.
//! - [`simd`](mod@simd): the one run-time SIMD dispatch (AVX2 + FMA, AVX-512, baseline).
//! - [`alloc`]: the cache-line allocator and glibc's settings; [`pool`]: running a step on
//!   the thread pool with spinning workers; [`runtime`]: [`runtime::tune`] for `main` and a
//!   report of what is in force; [`op_time`]: wall time per op.
//! - [`tuning`](mod@tuning): [`Tuning`], the documented switches, read once from the environment.
//!
//! ```
//! use candle_core::{Device, Tensor};
//!
//! // RMSNorm as one graph node with its own backward (f32 or f64 on the CPU).
//! let x = Tensor::new(&[[1f32, 2.0, 3.0, 4.0]], &Device::Cpu)?;
//! let w = Tensor::ones(4, candle_core::DType::F32, &Device::Cpu)?;
//! let y = rlft_kernels::fused::norm::rms_norm(&x, &w, 1e-6)?;
//! let rms = (30f32 / 4.0).sqrt();
//! assert!((y.to_vec2::<f32>()?[0][3] - 4.0 / rms).abs() < 1e-6);
//! println!("{}", rlft_kernels::runtime::Runtime::current());
//! # Ok::<(), candle_core::Error>(())
//! ```

pub mod alloc;
pub mod decode;
pub mod fused;
pub mod gemm;
#[cfg(target_arch = "x86_64")]
mod hsum;
pub mod math;
pub mod op_time;
pub mod pool;
pub mod quant;
pub mod runtime;
pub mod simd;
pub mod stream;
pub mod tuning;

pub use tuning::{tuning, Tuning};
