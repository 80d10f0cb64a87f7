//! The ggml tensor types: ids, block sizes and byte sizes.

use std::fmt;

/// A ggml tensor element type, as stored in a GGUF tensor info.
///
/// Every type of ggml's `enum ggml_type` that can appear in a GGUF file is listed, so that the
/// reader can validate the byte range of every tensor, including the ones it cannot dequantise
/// (see [`GgmlType::can_dequantize`]). Ids that ggml removed (4, 5, 31-33, 36-38) are unknown.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GgmlType {
    /// 32-bit float (id 0).
    F32,
    /// 16-bit IEEE half float (id 1).
    F16,
    /// 4-bit, blocks of 32 with an f16 scale (id 2).
    Q4_0,
    /// 4-bit, blocks of 32 with f16 scale and min (id 3).
    Q4_1,
    /// 5-bit, blocks of 32 with an f16 scale (id 6).
    Q5_0,
    /// 5-bit, blocks of 32 with f16 scale and min (id 7).
    Q5_1,
    /// 8-bit, blocks of 32 with an f16 scale (id 8).
    Q8_0,
    /// 8-bit, blocks of 32 with f16 scale and sum (id 9).
    Q8_1,
    /// 2-bit k-quant, super-blocks of 256 (id 10).
    Q2_K,
    /// 3-bit k-quant, super-blocks of 256 (id 11).
    Q3_K,
    /// 4-bit k-quant, super-blocks of 256 (id 12).
    Q4_K,
    /// 5-bit k-quant, super-blocks of 256 (id 13).
    Q5_K,
    /// 6-bit k-quant, super-blocks of 256 (id 14).
    Q6_K,
    /// 8-bit k-quant with f32 scale, super-blocks of 256 (id 15).
    Q8_K,
    /// id 16 (not dequantised by this crate).
    IQ2_XXS,
    /// id 17 (not dequantised by this crate).
    IQ2_XS,
    /// id 18 (not dequantised by this crate).
    IQ3_XXS,
    /// id 19 (not dequantised by this crate).
    IQ1_S,
    /// id 20 (not dequantised by this crate).
    IQ4_NL,
    /// id 21 (not dequantised by this crate).
    IQ3_S,
    /// id 22 (not dequantised by this crate).
    IQ2_S,
    /// id 23 (not dequantised by this crate).
    IQ4_XS,
    /// 8-bit signed integer (id 24).
    I8,
    /// 16-bit signed integer (id 25).
    I16,
    /// 32-bit signed integer (id 26).
    I32,
    /// 64-bit signed integer (id 27).
    I64,
    /// 64-bit float (id 28).
    F64,
    /// id 29 (not dequantised by this crate).
    IQ1_M,
    /// bfloat16 (id 30).
    BF16,
    /// id 34 (not dequantised by this crate).
    TQ1_0,
    /// id 35 (not dequantised by this crate).
    TQ2_0,
    /// id 39 (not dequantised by this crate).
    MXFP4,
}

/// `(type, id, elements per block, bytes per block, name)` for every known type.
const TABLE: [(GgmlType, u32, usize, usize, &str); 32] = {
    use GgmlType::*;
    [
        (F32, 0, 1, 4, "F32"),
        (F16, 1, 1, 2, "F16"),
        (Q4_0, 2, 32, 18, "Q4_0"),
        (Q4_1, 3, 32, 20, "Q4_1"),
        (Q5_0, 6, 32, 22, "Q5_0"),
        (Q5_1, 7, 32, 24, "Q5_1"),
        (Q8_0, 8, 32, 34, "Q8_0"),
        (Q8_1, 9, 32, 36, "Q8_1"),
        (Q2_K, 10, 256, 84, "Q2_K"),
        (Q3_K, 11, 256, 110, "Q3_K"),
        (Q4_K, 12, 256, 144, "Q4_K"),
        (Q5_K, 13, 256, 176, "Q5_K"),
        (Q6_K, 14, 256, 210, "Q6_K"),
        (Q8_K, 15, 256, 292, "Q8_K"),
        (IQ2_XXS, 16, 256, 66, "IQ2_XXS"),
        (IQ2_XS, 17, 256, 74, "IQ2_XS"),
        (IQ3_XXS, 18, 256, 98, "IQ3_XXS"),
        (IQ1_S, 19, 256, 50, "IQ1_S"),
        (IQ4_NL, 20, 32, 18, "IQ4_NL"),
        (IQ3_S, 21, 256, 110, "IQ3_S"),
        (IQ2_S, 22, 256, 82, "IQ2_S"),
        (IQ4_XS, 23, 256, 136, "IQ4_XS"),
        (I8, 24, 1, 1, "I8"),
        (I16, 25, 1, 2, "I16"),
        (I32, 26, 1, 4, "I32"),
        (I64, 27, 1, 8, "I64"),
        (F64, 28, 1, 8, "F64"),
        (IQ1_M, 29, 256, 56, "IQ1_M"),
        (BF16, 30, 1, 2, "BF16"),
        (TQ1_0, 34, 256, 54, "TQ1_0"),
        (TQ2_0, 35, 256, 66, "TQ2_0"),
        (MXFP4, 39, 32, 17, "MXFP4"),
    ]
};

impl GgmlType {
    /// All known types, in id order.
    pub fn all() -> impl Iterator<Item = GgmlType> {
        TABLE.iter().map(|row| row.0)
    }

    /// The type with this ggml id, or `None` for an unknown or removed id.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        TABLE.iter().find(|row| row.1 == id).map(|row| row.0)
    }

    fn row(self) -> (GgmlType, u32, usize, usize, &'static str) {
        // Every variant has a row (checked by a test); the fallback keeps this panic-free.
        TABLE
            .iter()
            .copied()
            .find(|row| row.0 == self)
            .unwrap_or((self, u32::MAX, 1, 1, "?"))
    }

    /// The ggml id stored in GGUF files.
    pub fn id(self) -> u32 {
        self.row().1
    }

    /// Number of elements in one block (1 for plain types, 32 or 256 for quantised ones).
    pub fn block_size(self) -> usize {
        self.row().2
    }

    /// Number of bytes one block occupies.
    pub fn type_size(self) -> usize {
        self.row().3
    }

    /// ggml's name for the type, e.g. `"Q4_K"`.
    pub fn name(self) -> &'static str {
        self.row().4
    }

    /// Whether [`crate::dequantize`] supports this type.
    pub fn can_dequantize(self) -> bool {
        use GgmlType::*;
        matches!(
            self,
            F32 | F16
                | BF16
                | F64
                | I8
                | I16
                | I32
                | I64
                | Q4_0
                | Q4_1
                | Q5_0
                | Q5_1
                | Q8_0
                | Q8_1
                | Q2_K
                | Q3_K
                | Q4_K
                | Q5_K
                | Q6_K
                | Q8_K
        )
    }

    /// Bytes occupied by `n_elements` elements, or `None` if `n_elements` is not a multiple
    /// of the block size or the size overflows.
    pub fn bytes_for(self, n_elements: u64) -> Option<u64> {
        let block = self.block_size() as u64;
        if !n_elements.is_multiple_of(block) {
            return None;
        }
        (n_elements / block).checked_mul(self.type_size() as u64)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_consistent() {
        let mut seen = std::collections::HashSet::new();
        for t in GgmlType::all() {
            assert!(seen.insert(t.id()), "duplicate id {}", t.id());
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
            assert_ne!(t.name(), "?");
        }
        assert_eq!(seen.len(), 32);
        for removed in [4, 5, 31, 32, 33, 36, 37, 38, 40, u32::MAX] {
            assert_eq!(GgmlType::from_id(removed), None);
        }
        assert_eq!(GgmlType::Q4_K.bytes_for(512), Some(288));
        assert_eq!(GgmlType::Q4_K.bytes_for(100), None);
        assert_eq!(GgmlType::F32.bytes_for(u64::MAX), None);
    }
}
