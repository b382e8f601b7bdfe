//! The tensor element types GGUF files carry, with ggml's numeric ids and block geometry.

/// Elements per K-quant super-block (ggml's `QK_K`).
pub const QK_K: usize = 256;
/// Elements per block of the legacy quant formats (ggml's `QK4_0`, `QK8_0`, …).
pub const QK: usize = 32;

/// The tensor element types we support (ggml's numbering in [`GgmlType::from_ggml_id`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q4K,
    Q5K,
    Q6K,
    /// gpt-oss's experts: E2M1 codes under a power-of-two scale (`mxfp4`).
    MXFP4,
}

impl GgmlType {
    /// Every supported type, for tests and diagnostics.
    pub const ALL: [GgmlType; 12] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
        GgmlType::MXFP4,
    ];

    /// From ggml's numeric type id; `None` for types we do not support.
    pub fn from_ggml_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            6 => GgmlType::Q5_0,
            7 => GgmlType::Q5_1,
            8 => GgmlType::Q8_0,
            12 => GgmlType::Q4K,
            13 => GgmlType::Q5K,
            14 => GgmlType::Q6K,
            30 => GgmlType::BF16,
            39 => GgmlType::MXFP4,
            _ => return None,
        })
    }

    /// ggml's numeric id of this type.
    pub fn ggml_id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 7,
            GgmlType::Q8_0 => 8,
            GgmlType::Q4K => 12,
            GgmlType::Q5K => 13,
            GgmlType::Q6K => 14,
            GgmlType::BF16 => 30,
            GgmlType::MXFP4 => 39,
        }
    }

    /// Elements per block (1 for float types, 32, or 256 for K-quants).
    pub fn block_elems(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q8_0
            | GgmlType::MXFP4 => QK,
            GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K => QK_K,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            GgmlType::Q4_0 => 2 + QK / 2,
            GgmlType::Q4_1 => 4 + QK / 2,
            GgmlType::Q5_0 => 2 + 4 + QK / 2,
            GgmlType::Q5_1 => 4 + 4 + QK / 2,
            GgmlType::Q8_0 => 2 + QK,
            // d, dmin, 12 bytes of 6-bit scales/mins, 4-bit quants
            GgmlType::Q4K => 4 + 12 + QK_K / 2,
            // … plus one high bit per element
            GgmlType::Q5K => 4 + 12 + QK_K / 8 + QK_K / 2,
            // low 4 bits, high 2 bits, 16 i8 scales, d
            GgmlType::Q6K => QK_K / 2 + QK_K / 4 + QK_K / 16 + 2,
            // the E8M0 scale, then two codes a byte
            GgmlType::MXFP4 => 1 + QK / 2,
        }
    }

    /// Bytes of one row of `cols` elements, or `None` if `cols` is not whole blocks.
    pub fn row_bytes(self, cols: usize) -> Option<usize> {
        if !cols.is_multiple_of(self.block_elems()) {
            return None;
        }
        (cols / self.block_elems()).checked_mul(self.block_bytes())
    }

    /// Lower-case ggml name, e.g. `q4_K`.
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "f32",
            GgmlType::F16 => "f16",
            GgmlType::BF16 => "bf16",
            GgmlType::Q4_0 => "q4_0",
            GgmlType::Q4_1 => "q4_1",
            GgmlType::Q5_0 => "q5_0",
            GgmlType::Q5_1 => "q5_1",
            GgmlType::Q8_0 => "q8_0",
            GgmlType::Q4K => "q4_K",
            GgmlType::Q5K => "q5_K",
            GgmlType::Q6K => "q6_K",
            GgmlType::MXFP4 => "mxfp4",
        }
    }
}
