//! Deterministic train/test splits for held-out evaluation.
//!
//! The shuffle is fully specified here so a split can be reproduced from the seed alone, in
//! any language, independent of crate versions:
//!
//! 1. RNG: SplitMix64 (Steele, Lea, Flood 2014) with state = `seed`: each draw adds
//!    `0x9E3779B97F4A7C15` to the state (wrapping) and returns
//!    `z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9; z = (z ^ (z >> 27)) * 0x94D049BB133111EB;
//!    z ^ (z >> 31)`.
//! 2. Uniform `j` in `0..=i`: Lemire's multiply-shift with rejection (bound `b = i + 1`;
//!    `m = x * b` as 128 bits; reject while `(m mod 2^64) < (2^64 - b) mod b`; `j = m >> 64`).
//! 3. Permutation: Fisher-Yates (Durstenfeld) on `0..n`, for `i` from `n - 1` down to 1, swap
//!    positions `i` and `j`.
//! 4. Test rows are the first `n_test` entries of the permutation, train rows the rest, both in
//!    permutation order (as `datasets.Dataset.train_test_split` lays them out).
//!
//! `n_test` is `ceil(fraction * n)` for a fraction (as in `datasets`), or the count itself.
//! The permutation is not numpy's, so indices differ from `datasets`' for the same seed.

use crate::dataset::Dataset;
use crate::error::{DataError, Result};

/// How many rows go to the test split.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TestSize {
    /// A fraction in (0, 1) of the rows, rounded up.
    Fraction(f64),
    /// An exact number of rows, at least 1 and below the dataset's length.
    Count(usize),
}

impl From<f64> for TestSize {
    fn from(f: f64) -> Self {
        TestSize::Fraction(f)
    }
}

impl From<usize> for TestSize {
    fn from(n: usize) -> Self {
        TestSize::Count(n)
    }
}

/// The two halves of [`train_test_split`].
#[derive(Debug, Clone, PartialEq)]
pub struct TrainTest {
    /// Rows to train on.
    pub train: Dataset,
    /// Held-out rows.
    pub test: Dataset,
}

/// Splits `dataset` into shuffled train and test parts, deterministically from `seed` (the
/// algorithm is in the module docs). Both parts keep the columns and source. Errors if either
/// part would be empty or `test_size` is out of range.
pub fn train_test_split(
    dataset: &Dataset,
    test_size: impl Into<TestSize>,
    seed: u64,
) -> Result<TrainTest> {
    let n = dataset.len();
    let n_test = match test_size.into() {
        TestSize::Fraction(f) => {
            if !(f > 0.0 && f < 1.0) {
                return Err(DataError::InvalidSplit(format!(
                    "test_size {f} must be a fraction strictly between 0 and 1, or a row count"
                )));
            }
            (f * n as f64).ceil() as usize
        }
        TestSize::Count(k) => k,
    };
    if n_test == 0 || n_test >= n {
        return Err(DataError::InvalidSplit(format!(
            "dataset {} has {n} rows, so a test split of {n_test} would leave {} split empty; \
             use a test size between 1 and {} rows",
            dataset.source_name(),
            if n_test == 0 { "the test" } else { "the train" },
            n.saturating_sub(1)
        )));
    }
    let order = permutation(n, seed);
    Ok(TrainTest {
        train: dataset.select(&order[n_test..]),
        test: dataset.select(&order[..n_test]),
    })
}

/// The permutation of `0..n` that [`train_test_split`] uses for `seed`.
pub fn permutation(n: usize, seed: u64) -> Vec<usize> {
    let mut rng = SplitMix64(seed);
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        order.swap(i, j);
    }
    order
}

/// SplitMix64: a 64-bit state advanced by a Weyl sequence and mixed (see the module docs).
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..bound` (`bound` > 0), unbiased (Lemire 2019).
    fn below(&mut self, bound: u64) -> u64 {
        let threshold = bound.wrapping_neg() % bound;
        loop {
            let m = u128::from(self.next_u64()) * u128::from(bound);
            if (m as u64) >= threshold {
                return (m >> 64) as u64;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_matches_the_reference_sequence() {
        // First outputs for seed 0 from the reference C implementation (Vigna's splitmix64.c).
        let mut rng = SplitMix64(0);
        assert_eq!(rng.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(rng.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        assert_eq!(rng.next_u64(), 0x06C4_5D18_8009_454F);
    }

    #[test]
    fn permutation_is_a_permutation_and_repeats() {
        for n in [0, 1, 2, 10, 257] {
            let p = permutation(n, 42);
            let mut sorted = p.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..n).collect::<Vec<_>>());
            assert_eq!(p, permutation(n, 42));
        }
        assert_ne!(permutation(50, 1), permutation(50, 2));
    }
}
