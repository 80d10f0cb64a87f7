//! How AdamW keeps its moments and the master weights of bf16/f16 parameters
//! ([`AdamWPrecision`]), and the bit arithmetic of the split master.
//!
//! Bytes of optimizer state per parameter beyond the parameter itself:
//!
//! | precision     | f32 param | bf16 param                    | f16 param       |
//! |---------------|-----------|-------------------------------|-----------------|
//! | `F32Master`   | 8 (m, v)  | 12 (m, v, f32 master)         | 12              |
//! | `SplitMaster` | 8         | 10 (m, v, 16-bit low half)    | 12 (f32 master) |
//! | `ParamDtype`  | 8         | 4 (m, v in bf16, no master)   | 4               |
//!
//! **The split master.** An f32 master `w` is its bf16 rounding `hi` (the parameter itself) plus
//! the 16 bits `lo = bits(w) - bits(hi) << 16`, a signed difference of the bit patterns. It fits
//! 16 bits exactly when `hi` rounds half away from zero (ties to even would give some `hi` one
//! value too many among its preimages), so both master modes write a bf16 parameter as
//! [`round_bf16`]: `SplitMaster` then reproduces `F32Master` bit for bit, at 2 bytes per
//! parameter instead of 4. The rounding differs from round-to-nearest-even only on exact ties.

use half::bf16;

/// Where AdamW keeps its state (module docs for the bytes). All three give the same updates for
/// f32 parameters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AdamWPrecision {
    /// f32 moments; bf16/f16 parameters also keep an f32 master copy: the update is applied to
    /// the master and the parameter receives its rounding, so updates smaller than a bf16 ulp
    /// add up.
    #[default]
    F32Master,
    /// As `F32Master`, bit for bit, with a bf16 parameter's master kept as the parameter plus a
    /// 16-bit low half (2 bytes instead of 4). f16 parameters keep an f32 master.
    SplitMaster,
    /// PyTorch's `AdamW` on a low-precision parameter (transformers' `adamw_torch`): the moments
    /// in the parameter's dtype, no master; each element's update is computed in f32 and rounded
    /// into the parameter and the moments (as torch's fused kernel), so updates smaller than
    /// half a bf16 ulp are lost.
    ParamDtype,
}

/// `x` rounded to bf16 half away from zero (NaN stays NaN). The rounding of the master modes.
#[inline(always)]
pub(crate) fn round_bf16(x: f32) -> bf16 {
    if x.is_nan() {
        return bf16::from_f32(x);
    }
    // Sign and magnitude: adding half of the dropped range rounds the magnitude half up; a
    // carry into the exponent is the right next binade (or infinity past the largest finite).
    bf16::from_bits((x.to_bits().wrapping_add(0x8000) >> 16) as u16)
}

/// The master `w` as its bf16 rounding and the low half, as `(hi, lo)`; `lo` holds 16 bits in a
/// bf16 container (its value as a number is meaningless).
#[inline(always)]
pub(crate) fn split(w: f32) -> (bf16, bf16) {
    let hi = round_bf16(w);
    let lo = w.to_bits().wrapping_sub(u32::from(hi.to_bits()) << 16) as u16;
    (hi, bf16::from_bits(lo))
}

/// The master whose [`split`] is `(hi, lo)`.
#[inline(always)]
pub(crate) fn join(hi: bf16, lo: bf16) -> f32 {
    let low = lo.to_bits() as i16 as i32 as u32;
    f32::from_bits((u32::from(hi.to_bits()) << 16).wrapping_add(low))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every f32 with the same upper half and a spread of low halves, around ties, zero,
    /// binade edges, signs and the largest finite values: `join(split(w)) == w` bit for bit,
    /// and `hi` is within half a bf16 ulp of `w`.
    #[test]
    fn split_join_round_trips() {
        let uppers: [u32; 9] = [
            0x0000, 0x0001, 0x3F7F, 0x3F80, 0x3FFF, 0x7F7E, 0x8000, 0xBF80, 0xC123,
        ];
        let lows: [u32; 10] = [
            0x0000, 0x0001, 0x7FFE, 0x7FFF, 0x8000, 0x8001, 0xFFFE, 0xFFFF, 0x1234, 0xC000,
        ];
        for &u in &uppers {
            for &l in &lows {
                let w = f32::from_bits((u << 16) | l);
                let (hi, lo) = split(w);
                assert_eq!(
                    join(hi, lo).to_bits(),
                    w.to_bits(),
                    "{w:e} ({u:#x}, {l:#x})"
                );
                let err = (hi.to_f32() as f64 - w as f64).abs();
                let ulp = (f32::from_bits(((u & 0x7FFF) + 1) << 16) as f64
                    - f32::from_bits((u & 0x7FFF) << 16) as f64)
                    .abs();
                assert!(err <= ulp / 2.0, "{w:e}: hi {hi} off by {err:e}");
            }
        }
    }

    /// Half away from zero: ties go up in magnitude; otherwise the nearest, as
    /// round-to-nearest-even.
    #[test]
    fn rounds_half_away_from_zero() {
        let tie_even = f32::from_bits(0x3F80_8000); // between 1.0 (even) and the next bf16
        assert_eq!(round_bf16(tie_even).to_bits(), 0x3F81);
        assert_eq!(bf16::from_f32(tie_even).to_bits(), 0x3F80);
        assert_eq!(round_bf16(-tie_even).to_bits(), 0xBF81);
        for bits in [
            0x3F80_7FFFu32,
            0x3F80_8001,
            0x4049_0FDB,
            0xC2F6_E979,
            0x0000_0001,
        ] {
            let x = f32::from_bits(bits);
            assert_eq!(round_bf16(x), bf16::from_f32(x), "{x:e}");
        }
        assert!(round_bf16(f32::NAN).is_nan());
        assert_eq!(round_bf16(f32::INFINITY), bf16::INFINITY);
    }
}
