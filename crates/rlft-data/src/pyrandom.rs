//! A random number generator that draws exactly what CPython's `random.Random(seed)` draws.
//!
//! Synthetic datasets written by Python scripts (`random.Random(42)`, then `random()`,
//! `randint`, `choice`) can only be reproduced byte for byte with the same generator and the
//! same reductions on top of it. [`PyRandom`] is that generator:
//!
//! - the core is MT19937 (Matsumoto and Nishimura, 1998), seeded the way CPython seeds from a
//!   Python int: `init_by_array` with the 32-bit words of the seed's absolute value, least
//!   significant word first (seed 0 gives the key `[0]`);
//! - [`PyRandom::random`] takes 53 bits from two draws, `(a >> 5) * 2**26 + (b >> 6)`, over
//!   `2**53`;
//! - [`PyRandom::getrandbits`] keeps the top `k` bits of a draw (`k <= 32`) or fills 32-bit
//!   words little end first, the last one cut to the bits left;
//! - [`PyRandom::randbelow`] is CPython's `_randbelow_with_getrandbits`: draw
//!   `getrandbits(n.bit_length())` until the value is below `n`;
//! - `randrange`, `randint` and `choice` are the Python 3.2+ definitions on top of it.
//!
//! Pinned by `tests/pyrandom.rs` against values printed by CPython
//! (`scripts/reference/pyrandom_golden.py`).
//!
//! ```
//! use rlft_data::pyrandom::PyRandom;
//!
//! let mut rng = PyRandom::new(0); // random.Random(0)
//! assert_eq!(rng.random(), 0.8444218515250481);
//! assert_eq!(rng.randint(0, 20), 13);
//! ```

/// Number of 32-bit words in the MT19937 state.
const N: usize = 624;
/// MT19937's middle word offset.
const M: usize = 397;
const MATRIX_A: u32 = 0x9908_b0df;
const UPPER_MASK: u32 = 0x8000_0000;
const LOWER_MASK: u32 = 0x7fff_ffff;

/// CPython's `random.Random`: MT19937 plus Python's reductions (see the module docs).
///
/// Methods that Python guards with `ValueError` (an empty range, `choice` of nothing) panic
/// here; callers pass ranges they have validated.
#[derive(Clone)]
pub struct PyRandom {
    state: [u32; N],
    index: usize,
}

impl std::fmt::Debug for PyRandom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PyRandom")
            .field("index", &self.index)
            .finish_non_exhaustive()
    }
}

impl PyRandom {
    /// `random.Random(seed)` for a non-negative integer seed.
    pub fn new(seed: u64) -> Self {
        Self::from_int(i128::from(seed))
    }

    /// `random.Random(seed)` for any integer seed that fits in an `i128`; like CPython, a
    /// negative seed is replaced by its absolute value.
    pub fn from_int(seed: i128) -> Self {
        let mut n = seed.unsigned_abs();
        let mut key = Vec::with_capacity(4);
        while n != 0 {
            key.push(n as u32); // the low 32 bits
            n >>= 32;
        }
        if key.is_empty() {
            key.push(0);
        }
        Self::from_key(&key)
    }

    /// MT19937 seeded by `init_by_array(key)`; `key` holds the seed's 32-bit words, least
    /// significant first. An empty key is treated as `[0]`.
    pub fn from_key(key: &[u32]) -> Self {
        let key: &[u32] = if key.is_empty() { &[0] } else { key };
        let mut rng = Self::init_genrand(19_650_218);
        let mt = &mut rng.state;
        let (mut i, mut j) = (1usize, 0usize);
        for _ in 0..N.max(key.len()) {
            let prev = mt[i - 1] ^ (mt[i - 1] >> 30);
            mt[i] = (mt[i] ^ prev.wrapping_mul(1_664_525))
                .wrapping_add(key[j])
                .wrapping_add(j as u32);
            i += 1;
            j += 1;
            if i >= N {
                mt[0] = mt[N - 1];
                i = 1;
            }
            if j >= key.len() {
                j = 0;
            }
        }
        for _ in 0..N - 1 {
            let prev = mt[i - 1] ^ (mt[i - 1] >> 30);
            mt[i] = (mt[i] ^ prev.wrapping_mul(1_566_083_941)).wrapping_sub(i as u32);
            i += 1;
            if i >= N {
                mt[0] = mt[N - 1];
                i = 1;
            }
        }
        mt[0] = 0x8000_0000; // MSB is 1, assuring a non-zero initial array
        rng
    }

    /// MT19937's `init_genrand(s)`.
    fn init_genrand(s: u32) -> Self {
        let mut state = [0u32; N];
        state[0] = s;
        for i in 1..N {
            let prev = state[i - 1] ^ (state[i - 1] >> 30);
            state[i] = 1_812_433_253u32.wrapping_mul(prev).wrapping_add(i as u32);
        }
        PyRandom { state, index: N }
    }

    /// Regenerates the 624 state words (MT19937's twist).
    fn twist(&mut self) {
        let mt = &mut self.state;
        for k in 0..N {
            let y = (mt[k] & UPPER_MASK) | (mt[(k + 1) % N] & LOWER_MASK);
            let mag = if y & 1 == 1 { MATRIX_A } else { 0 };
            mt[k] = mt[(k + M) % N] ^ (y >> 1) ^ mag;
        }
        self.index = 0;
    }

    /// The next raw 32-bit output (`genrand_uint32`; `getrandbits(32)` in Python).
    pub fn next_u32(&mut self) -> u32 {
        if self.index >= N {
            self.twist();
        }
        let mut y = self.state[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    /// `random()`: a float in `[0, 1)` with 53 random bits, from two draws.
    pub fn random(&mut self) -> f64 {
        let a = f64::from(self.next_u32() >> 5);
        let b = f64::from(self.next_u32() >> 6);
        (a * 67_108_864.0 + b) * (1.0 / 9_007_199_254_740_992.0)
    }

    /// `getrandbits(k)` for `k <= 64` (`k = 0` gives 0 and draws nothing).
    ///
    /// # Panics
    ///
    /// If `k > 64` (Python allows any `k`; nothing here needs more).
    pub fn getrandbits(&mut self, k: u32) -> u64 {
        assert!(k <= 64, "getrandbits({k}): at most 64 bits are supported");
        if k == 0 {
            return 0;
        }
        if k <= 32 {
            return u64::from(self.next_u32() >> (32 - k));
        }
        // Words little end first; the last (most significant) keeps only the bits left.
        let low = u64::from(self.next_u32());
        let rest = k - 32;
        let high = u64::from(self.next_u32() >> (32 - rest));
        low | (high << 32)
    }

    /// `_randbelow(n)`: uniform in `[0, n)` by rejection on `getrandbits(n.bit_length())`.
    ///
    /// # Panics
    ///
    /// If `n == 0`.
    pub fn randbelow(&mut self, n: u64) -> u64 {
        assert!(n > 0, "randbelow(0): empty range");
        let k = u64::BITS - n.leading_zeros(); // n.bit_length()
        loop {
            let r = self.getrandbits(k);
            if r < n {
                return r;
            }
        }
    }

    /// `randrange(start, stop)`: uniform in `[start, stop)`.
    ///
    /// # Panics
    ///
    /// If `stop <= start`.
    pub fn randrange(&mut self, start: i64, stop: i64) -> i64 {
        assert!(stop > start, "randrange({start}, {stop}): empty range");
        let width = (i128::from(stop) - i128::from(start)) as u64; // < 2**64
        (i128::from(start) + i128::from(self.randbelow(width))) as i64
    }

    /// `randrange(start, stop, step)`: uniform over `start, start + step, ...` short of `stop`
    /// (a negative `step` counts down).
    ///
    /// # Panics
    ///
    /// If `step == 0` or the range is empty.
    pub fn randrange_step(&mut self, start: i64, stop: i64, step: i64) -> i64 {
        assert!(step != 0, "randrange: zero step");
        if step == 1 {
            return self.randrange(start, stop);
        }
        let (width, istep) = (i128::from(stop) - i128::from(start), i128::from(step));
        let n = if istep > 0 {
            (width + istep - 1).div_euclid(istep)
        } else {
            // Python's floor division by a negative step.
            let num = width + istep + 1;
            let q = num / istep;
            if num % istep != 0 && ((num < 0) != (istep < 0)) {
                q - 1
            } else {
                q
            }
        };
        assert!(n > 0, "randrange({start}, {stop}, {step}): empty range");
        (i128::from(start) + istep * i128::from(self.randbelow(n as u64))) as i64
    }

    /// `randint(a, b)`: uniform in `[a, b]`, both ends included (`randrange(a, b + 1)`).
    ///
    /// # Panics
    ///
    /// If `b < a`, or `b == i64::MAX`.
    pub fn randint(&mut self, a: i64, b: i64) -> i64 {
        let stop = b.checked_add(1).expect("randint: b + 1 overflows i64");
        self.randrange(a, stop)
    }

    /// The index `choice(seq)` picks for a sequence of length `len`: `randbelow(len)`.
    ///
    /// # Panics
    ///
    /// If `len == 0` (Python raises `IndexError`).
    pub fn choice(&mut self, len: usize) -> usize {
        assert!(len > 0, "choice: cannot choose from an empty sequence");
        self.randbelow(len as u64) as usize
    }

    /// `choice(items)`: a reference to the element `choice` picks.
    ///
    /// # Panics
    ///
    /// If `items` is empty.
    pub fn choose<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.choice(items.len())]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mt19937_reference_output() {
        // The first output of MT19937 seeded with init_by_array({0x123, 0x234, 0x345, 0x456}),
        // from Matsumoto and Nishimura's mt19937ar.out.
        let mut rng = PyRandom::from_key(&[0x123, 0x234, 0x345, 0x456]);
        let first: Vec<u32> = (0..5).map(|_| rng.next_u32()).collect();
        assert_eq!(
            first,
            [
                1_067_595_299,
                955_945_823,
                477_289_528,
                4_107_218_783,
                4_228_976_476
            ]
        );
    }

    #[test]
    fn seeds_by_absolute_value_and_words() {
        let draw = |mut r: PyRandom| (0..4).map(|_| r.next_u32()).collect::<Vec<_>>();
        assert_eq!(draw(PyRandom::from_int(-42)), draw(PyRandom::new(42)));
        assert_eq!(draw(PyRandom::new(0)), draw(PyRandom::from_key(&[])));
        assert_eq!(
            draw(PyRandom::new(1 << 32)),
            draw(PyRandom::from_key(&[0, 1]))
        );
    }
}
