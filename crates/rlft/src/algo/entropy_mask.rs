//! The high-entropy token mask of "Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive
//! Effective Reinforcement Learning for LLM Reasoning" (Wang et al., 2025, arXiv:2506.01939):
//! only the tokens whose entropy is in the top `rho` quantile of the batch carry the policy
//! gradient (TRL's `top_entropy_quantile`).
//!
//! TRL 1.16 `GRPOTrainer.get_high_entropy_mask` (`trl/trainer/grpo_trainer.py:1380-1417`):
//!
//! ```text
//! threshold = torch.quantile(entropies[mask].float(), 1 - rho)      linear interpolation, f32
//! keep      = (entropies * mask >= threshold) & mask
//! ```
//!
//! over the micro-batch (TRL gathers across processes; one process here). No active token:
//! nothing is kept. The mask is a decision, not a function of the weights: no gradient flows
//! through it.

/// `torch.quantile(values, q)` with its default linear interpolation, bit for bit as PyTorch
/// computes it for a float32 tensor (pinned by `tests/grpo_golden.rs`): `rank = f32(q) * (n -
/// 1)` held in f64, `lo = floor(rank)`, `hi = ceil(rank)`, `w = f32(rank - lo)`, then
/// `torch.lerp(v[lo], v[hi], w)` in f32: `v + w (u - v)` for `w < 0.5`, else `u - (u - v)(1 -
/// w)`, each one fused multiply-add as PyTorch's CPU kernel computes it. `None` for no values.
/// `values` is sorted in place. NaN values are not expected (entropies are finite).
pub fn quantile_f32(values: &mut [f32], q: f64) -> Option<f32> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f32::total_cmp);
    let rank = f64::from(q as f32) * (values.len() - 1) as f64;
    let lo = rank.floor() as usize;
    let hi = (rank.ceil() as usize).min(values.len() - 1);
    let w = (rank - lo as f64) as f32;
    let (v, u) = (values[lo], values[hi]);
    Some(if w.abs() < 0.5 {
        w.mul_add(u - v, v)
    } else {
        (-(u - v)).mul_add(1.0 - w, u)
    })
}

/// The entropy threshold of [`high_entropy_mask`]: the `1 - top_entropy_quantile` quantile of
/// the active tokens' entropies (rounded to f32 first, as TRL's `.float()` does). `None` when
/// no token is active.
///
/// - `entropies`, `mask`: `[N * T]` row-major; `mask` 0/1.
pub fn entropy_threshold(
    entropies: &[f64],
    mask: &[f64],
    top_entropy_quantile: f64,
) -> Option<f32> {
    assert_eq!(
        entropies.len(),
        mask.len(),
        "entropies and mask differ in size"
    );
    let mut active: Vec<f32> = entropies
        .iter()
        .zip(mask)
        .filter(|(_, &m)| m != 0.0)
        .map(|(&e, _)| e as f32)
        .collect();
    quantile_f32(&mut active, 1.0 - top_entropy_quantile)
}

/// `[N * T]` 0/1: 1 where the token is active and its entropy is at least the threshold of
/// [`entropy_threshold`], compared in f64 as torch compares an f64 tensor with an f32 scalar.
/// (So for f64 entropies that are not exact in f32, the lowest may fall below its own
/// rounded value, as in TRL; training's entropies are f32.)
pub fn high_entropy_mask(entropies: &[f64], mask: &[f64], top_entropy_quantile: f64) -> Vec<f64> {
    let Some(thr) = entropy_threshold(entropies, mask, top_entropy_quantile) else {
        return vec![0.0; mask.len()];
    };
    let thr = f64::from(thr);
    entropies
        .iter()
        .zip(mask)
        .map(|(&e, &m)| f64::from(u8::from(m != 0.0 && e * m >= thr)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantile_interpolates_linearly() {
        let mut v = [3.0f32, 1.0, 2.0, 4.0];
        assert_eq!(quantile_f32(&mut v, 0.0), Some(1.0));
        assert_eq!(quantile_f32(&mut v, 1.0), Some(4.0));
        assert_eq!(quantile_f32(&mut v, 0.5), Some(2.5));
        assert_eq!(quantile_f32(&mut [7.0], 0.3), Some(7.0));
        assert_eq!(quantile_f32(&mut [], 0.3), None);
    }

    #[test]
    fn mask_keeps_the_top_quantile_of_active_tokens() {
        // Two rows of 3; the last token of row 1 is padding (its high entropy must not count).
        // Values exact in f32 (the quantile is taken of f32 values, as TRL's `.float()`).
        let e = [0.125, 0.5, 0.875, 0.25, 0.75, 9.0];
        let m = [1.0, 1.0, 1.0, 1.0, 1.0, 0.0];
        // Active entropies sorted: 0.125 0.25 0.5 0.75 0.875; top 0.4 -> quantile 0.6 at rank
        // 2.4: 0.5 + 0.4 * 0.25 = 0.6 -> keeps 0.75 and 0.875.
        assert_eq!(
            high_entropy_mask(&e, &m, 0.4),
            vec![0.0, 0.0, 1.0, 0.0, 1.0, 0.0]
        );
        // 1.0 keeps every active token, 0.0 only the highest.
        assert_eq!(high_entropy_mask(&e, &m, 1.0), m.to_vec());
        assert_eq!(
            high_entropy_mask(&e, &m, 0.0),
            vec![0.0, 0.0, 1.0, 0.0, 0.0, 0.0]
        );
        assert_eq!(high_entropy_mask(&e, &[0.0; 6], 0.5), vec![0.0; 6]);
    }
}
