//! Deterministic weight initialiser shared with `scripts/reference/tiny_models.py`.
//!
//! The golden files in `crates/rlft-model/tests/golden/*.json` were produced by HF transformers on
//! tiny models whose every tensor was overwritten with these values (seed 0), so the Rust tests can
//! rebuild bit-identical weights without committing any weights.
//!
//! For a tensor named `name` (the HF weight name) with `n` elements in row-major order:
//!
//! ```text
//! state = fnv1a64(utf8(name)) ^ seed.wrapping_mul(0x9E3779B97F4A7C15)
//! for i in 0..n:
//!     state = state.wrapping_add(0x9E3779B97F4A7C15)
//!     z = splitmix64_mix(state)
//!     x = 2 * ((z >> 40) as f64 / 2^24) - 1          // in [-1, 1), exact in f64
//!     value = Linear { fan_in }: x / sqrt(fan_in)
//!             Embedding:         x * 0.5             // embed_tokens, untied lm_head
//!             Norm:              1 + 0.1 * x         // RMSNorm weights
//!             Bias:              0.1 * x
//! ```
//!
//! Every step is computed in f64 and cast to f32 (round to nearest) at the end; both sides use only
//! correctly-rounded IEEE operations, so the results are bit-identical to the Python ones.

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// How a tensor's raw values in [-1, 1) are scaled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InitKind {
    /// A `[out, in]` linear weight: `x / sqrt(fan_in)`.
    Linear { fan_in: usize },
    /// Token embeddings / an untied `lm_head`: `x * 0.5`.
    Embedding,
    /// RMSNorm weight: `1 + 0.1 x`.
    Norm,
    /// Bias: `0.1 x`.
    Bias,
}

/// 64-bit FNV-1a.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    h
}

/// The splitmix64 output function.
#[inline]
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The raw values `x = 2u - 1` in [-1, 1) (f64, before scaling).
pub fn det_unit(name: &str, seed: u64, n: usize) -> Vec<f64> {
    let mut state = fnv1a64(name.as_bytes()) ^ seed.wrapping_mul(GOLDEN);
    (0..n)
        .map(|_| {
            state = state.wrapping_add(GOLDEN);
            let u = (mix(state) >> 40) as f64 / 16_777_216.0;
            2.0 * u - 1.0
        })
        .collect()
}

/// The `n` initial values (row-major) of the tensor `name`.
pub fn det_values(name: &str, seed: u64, n: usize, kind: InitKind) -> Vec<f32> {
    let xs = det_unit(name, seed, n);
    match kind {
        InitKind::Linear { fan_in } => {
            let s = (fan_in as f64).sqrt();
            xs.into_iter().map(|x| (x / s) as f32).collect()
        }
        InitKind::Embedding => xs.into_iter().map(|x| (x * 0.5) as f32).collect(),
        InitKind::Norm => xs.into_iter().map(|x| (1.0 + 0.1 * x) as f32).collect(),
        InitKind::Bias => xs.into_iter().map(|x| (0.1 * x) as f32).collect(),
    }
}

/// The init kind of an HF weight, by name (and shape for linear weights):
/// `*norm.weight` -> Norm, `*.bias` -> Bias, `embed_tokens` / `lm_head` -> Embedding, any other
/// 2-D `*.weight` -> Linear with `fan_in = shape[1]`.
///
/// Panics on anything else (e.g. a 1-D weight that is not a norm), so a new tensor kind cannot be
/// silently initialised differently from the Python side.
pub fn init_kind_for(name: &str, shape: &[usize]) -> InitKind {
    if name.ends_with("norm.weight") {
        InitKind::Norm
    } else if name.ends_with(".bias") {
        InitKind::Bias
    } else if name.contains("embed_tokens") || name.contains("lm_head") {
        InitKind::Embedding
    } else if name.ends_with(".weight") && shape.len() == 2 {
        InitKind::Linear { fan_in: shape[1] }
    } else {
        panic!("det_init: no init kind for {name} {shape:?}")
    }
}

/// `det_values` with the kind chosen by [`init_kind_for`].
pub fn det_tensor(name: &str, seed: u64, shape: &[usize]) -> Vec<f32> {
    let n = shape.iter().product();
    det_values(name, seed, n, init_kind_for(name, shape))
}

#[cfg(test)]
mod tests {
    use super::*;

    // The expected values below were printed by
    // `python3 scripts/reference/tiny_models.py --check-values` (pure-Python implementation).

    #[test]
    fn fnv1a64_known_values() {
        assert_eq!(fnv1a64(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a64(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(fnv1a64(b"model.embed_tokens.weight"), 0xa88fd795d5c6d156);
    }

    fn check(name: &str, seed: u64, n: usize, kind: InitKind, expect: &[(usize, u32)]) {
        let v = det_values(name, seed, n, kind);
        assert_eq!(v.len(), n);
        for &(i, bits) in expect {
            assert_eq!(
                v[i].to_bits(),
                bits,
                "{name} seed {seed} {kind:?} [{i}]: got {} (0x{:08x}), want {} (0x{bits:08x})",
                v[i],
                v[i].to_bits(),
                f32::from_bits(bits)
            );
        }
    }

    #[test]
    fn pinned_to_python_linear() {
        // -0.020174667, -0.10826476, 0.08914687, -0.013162076
        check(
            "model.layers.0.self_attn.q_proj.weight",
            0,
            4,
            InitKind::Linear { fan_in: 64 },
            &[
                (0, 0xbca54558),
                (1, 0xbdddb9ea),
                (2, 0x3db692a2),
                (3, 0xbc57a5c0),
            ],
        );
        // -0.07551925 (fan_in 160: sqrt not exact)
        check(
            "model.layers.0.mlp.down_proj.weight",
            7,
            10,
            InitKind::Linear { fan_in: 160 },
            &[(9, 0xbd9aa9d6)],
        );
    }

    #[test]
    fn pinned_to_python_embedding_norm_bias() {
        // -0.12870955, -0.17998183, ..., [1999] -0.2593218
        check(
            "model.embed_tokens.weight",
            0,
            2000,
            InitKind::Embedding,
            &[(0, 0xbe03cc70), (1, 0xbe384d28), (1999, 0xbe84c5d4)],
        );
        // 1.0132581, 1.061387, 1.0769222
        check(
            "model.layers.1.post_attention_layernorm.weight",
            0,
            3,
            InitKind::Norm,
            &[(0, 0x3f81b271), (1, 0x3f87db88), (2, 0x3f89d896)],
        );
        // seed 1: -0.061012875, _, -0.036793076
        check(
            "model.layers.0.self_attn.k_proj.bias",
            1,
            3,
            InitKind::Bias,
            &[(0, 0xbd79e8a3), (2, 0xbd16b456)],
        );
    }

    #[test]
    fn pinned_raw_unit() {
        let x = det_unit("model.layers.0.self_attn.q_proj.weight", 0, 3);
        assert_eq!(
            x,
            vec![
                -0.16139733791351318,
                -0.8661180734634399,
                0.7131749391555786
            ]
        );
    }

    #[test]
    fn prefix_stable_and_in_range() {
        let a = det_values("x.weight", 3, 10, InitKind::Embedding);
        let b = det_values("x.weight", 3, 1000, InitKind::Embedding);
        assert_eq!(a[..], b[..10]);
        assert!(b.iter().all(|v| (-0.5..0.5).contains(v)));
        let n = det_values("y.norm.weight", 0, 1000, InitKind::Norm);
        assert!(n.iter().all(|v| (0.9..=1.1).contains(v)));
        // a different seed or name gives different values
        assert_ne!(det_values("x.weight", 4, 10, InitKind::Embedding), a);
        assert_ne!(det_values("z.weight", 3, 10, InitKind::Embedding), a);
    }

    #[test]
    fn kinds_by_name() {
        use InitKind::*;
        assert_eq!(
            init_kind_for("model.embed_tokens.weight", &[512, 64]),
            Embedding
        );
        assert_eq!(init_kind_for("lm_head.weight", &[512, 64]), Embedding);
        assert_eq!(init_kind_for("model.norm.weight", &[64]), Norm);
        assert_eq!(
            init_kind_for("model.layers.0.input_layernorm.weight", &[64]),
            Norm
        );
        assert_eq!(
            init_kind_for("model.layers.0.post_attention_layernorm.weight", &[64]),
            Norm
        );
        assert_eq!(
            init_kind_for("model.layers.0.self_attn.q_norm.weight", &[32]),
            Norm
        );
        assert_eq!(
            init_kind_for("model.layers.0.self_attn.k_norm.weight", &[32]),
            Norm
        );
        assert_eq!(
            init_kind_for("model.layers.0.self_attn.q_proj.bias", &[64]),
            Bias
        );
        assert_eq!(
            init_kind_for("model.layers.0.self_attn.o_proj.weight", &[64, 128]),
            Linear { fan_in: 128 }
        );
        assert_eq!(
            init_kind_for("model.layers.0.mlp.down_proj.weight", &[64, 160]),
            Linear { fan_in: 160 }
        );
        assert_eq!(
            det_tensor("model.norm.weight", 0, &[4]),
            det_values("model.norm.weight", 0, 4, Norm)
        );
    }

    #[test]
    #[should_panic]
    fn unknown_kind_panics() {
        init_kind_for("model.layers.0.mystery.weight", &[64]);
    }
}
