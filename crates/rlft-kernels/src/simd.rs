//! The one SIMD dispatch of rlft's kernels: what the CPU offers, checked at run time.
//!
//! The binary is built for baseline x86-64 (SSE2, 4 f32 lanes). Kernels get wider vectors in
//! two ways, both decided here:
//!
//! - Loops written as plain Rust run inside a function compiled for AVX2 + FMA when the CPU has
//!   them ([`run`], through the [`simd!`](crate::simd!) macro for an expression or
//!   [`simd_fn!`](crate::simd_fn!) for a whole function): LLVM vectorises them 8 f32 wide.
//! - Hand-written intrinsic kernels (`stream`, `quant`) pick their AVX-512 or AVX2 version by
//!   [`avx512`] and [`avx2_fma`].
//!
//! [`level`] names the widest level in use, for reports (`rlft inspect --runtime`).

use std::sync::OnceLock;

/// The instruction sets the kernels use on this CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Baseline x86-64 (SSE2) or another architecture: portable loops only.
    Baseline,
    /// AVX2 and FMA: 8-lane loops and kernels.
    Avx2Fma,
    /// AVX-512F (with AVX2 and FMA): the decoding kernels' 16-lane twins.
    Avx512,
}

impl Level {
    /// A short name: `avx512`, `avx2+fma`, `baseline`.
    pub fn name(self) -> &'static str {
        match self {
            Level::Baseline => "baseline",
            Level::Avx2Fma => "avx2+fma",
            Level::Avx512 => "avx512",
        }
    }
}

impl serde::Serialize for Level {
    /// As its [`Level::name`].
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl std::fmt::Display for Level {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The widest level the kernels use here: AVX-512 only when the CPU has it and
/// [`Tuning::avx512`](crate::tuning::Tuning::avx512) leaves it on.
pub fn level() -> Level {
    if avx512() {
        Level::Avx512
    } else if avx2_fma() {
        Level::Avx2Fma
    } else {
        Level::Baseline
    }
}

/// Whether the CPU has AVX2 and FMA (std caches the check).
#[inline(always)]
pub fn avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the AVX-512 kernels run: the CPU has AVX-512F, AVX2 and FMA, and `RLFT_AVX512` does
/// not turn them off (decided once).
#[inline]
pub fn avx512() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| cpu_has_avx512() && crate::tuning::tuning().avx512)
}

/// Whether the CPU has AVX-512F, AVX2 and FMA, whatever the tuning says.
pub fn cpu_has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx512f") && avx2_fma()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Calls `f` from a function compiled for AVX2 + FMA.
///
/// # Safety
/// The CPU must support AVX2 and FMA ([`avx2_fma`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn with_avx2_fma<R>(f: impl FnOnce() -> R) -> R {
    f()
}

/// Runs `f` inside a function compiled for AVX2 + FMA when the CPU has them, else as it is.
/// The kernels' loops, written as `#[inline(always)]` functions called from `f`, are inlined
/// into the AVX2 function and vectorised 8 f32 wide there (4 wide with SSE2 otherwise).
///
/// Call it through [`simd!`](crate::simd!), which passes the code as an `#[inline(always)]`
/// closure. A closure that LLVM chooses not to inline (it is called from both branches below)
/// is compiled once, for baseline x86-64, and the AVX2 function only jumps to it: look for
/// `ymm` registers in the disassembly of a kernel's closure to check.
#[inline(always)]
pub fn run<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        if avx2_fma() {
            // SAFETY: the CPU supports AVX2 and FMA (checked just above).
            return unsafe { with_avx2_fma(f) };
        }
    }
    f()
}

/// `simd!(expr)` evaluates `expr` inside [`simd::run`](crate::simd::run): compiled for
/// AVX2 + FMA where the CPU has them. The expression becomes an `#[inline(always)]` closure,
/// so its code (and the `#[inline(always)]` kernels it calls) lands in the AVX2 function.
#[macro_export]
macro_rules! simd {
    ($body:expr) => {
        $crate::simd::run(
            #[inline(always)]
            || $body,
        )
    };
}

/// Defines a function from a loop body that runs through [`simd::run`](crate::simd::run):
/// the body becomes an `#[inline(always)]` function of the same arguments (so LLVM sees them as
/// the function's own, non-aliasing slices), compiled into the AVX2 + FMA function where the
/// CPU has them and into the baseline one otherwise.
///
/// ```
/// rlft_kernels::simd_fn! {
///     /// `acc += a * x`.
///     pub fn axpy<>(acc: &mut [f32], x: &[f32], a: f32) {
///         for (o, v) in acc.iter_mut().zip(x) {
///             *o += a * v;
///         }
///     }
/// }
/// let mut acc = [1.0f32; 3];
/// axpy(&mut acc, &[1.0, 2.0, 3.0], 2.0);
/// assert_eq!(acc, [3.0, 5.0, 7.0]);
/// ```
#[macro_export]
macro_rules! simd_fn {
    ($(#[$m:meta])* $vis:vis fn $name:ident<$($g:ident: $b:path),*>($($a:ident: $t:ty),* $(,)?) $(-> $r:ty)? $body:block) => {
        $(#[$m])*
        $vis fn $name<$($g: $b),*>($($a: $t),*) $(-> $r)? {
            #[inline(always)]
            fn body<$($g: $b),*>($($a: $t),*) $(-> $r)? $body
            $crate::simd::run(
                #[inline(always)]
                || body($($a),*),
            )
        }
    };
}
