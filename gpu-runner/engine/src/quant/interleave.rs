//! The interleaved weight layout: [`TILE_ROWS`] rows stored together, block by block, so
//! that one 256-bit vector holds four consecutive quant bytes of each of 8 rows (one i32
//! lane per row). A kernel then multiplies all 8 rows by the same four activation bytes
//! (broadcast) and accumulates each row's dot product in its own lane: no horizontal sums,
//! and the per-block float work (scales, offsets) is done once for 8 rows instead of once
//! per row. Measured on the 2-vCPU Zen 4 machine for a 1536×576 Q4_1 matrix and 16 tokens,
//! this took the kernel from ~27 to ~108 GMAC/s per core. llama.cpp repacks some formats
//! the same way (its `ggml_gemm_q4_0_8x8_q8_0`).
//!
//! The layout is a pure rearrangement of ggml's bytes, field by field: a *tile block* (8
//! rows × one block) holds each field of the block format in turn, with the 8 rows' copies
//! of it interleaved in units of 2 bytes (f16 scales: `d[8]` loads as one vector), 1 byte
//! (MXFP4's E8M0 scales) or 4 bytes (everything else: quants, packed scales, fifth/high
//! bits). So a tile block has exactly
//! the bytes of the 8 blocks it replaces, and, for example, Q4_0's 16 nibble bytes become 4
//! vectors whose low nibbles are quants `4c..4c+4` and high nibbles quants `16+4c..` of every
//! row. The one change of value: Q8_0's quants are stored +128 (unsigned, for `vpdpbusd`).
//! A matrix's tiles follow each other, and within a tile its blocks in column order, so a
//! tile is one contiguous strip of `TILE_ROWS` rows.

use super::ggml_type::GgmlType;

/// Rows per tile: one i32 lane each in a 256-bit vector.
pub(crate) const TILE_ROWS: usize = 8;

/// One field of a block format: where it lies in the ggml block, and the unit its rows'
/// copies are interleaved in.
#[derive(Clone, Copy)]
struct Field {
    at: usize,
    len: usize,
    unit: usize,
    /// XORed into every byte (Q8_0's sign flip to unsigned), undone when rebuilding.
    flip: u8,
}

const fn field(at: usize, len: usize, unit: usize) -> Field {
    Field {
        at,
        len,
        unit,
        flip: 0,
    }
}

/// The fields of `dtype`'s block in the order the tile block stores them (each format's
/// kernel reads them at the resulting offsets).
fn fields(dtype: GgmlType) -> Option<&'static [Field]> {
    const Q4_0: [Field; 2] = [field(0, 2, 2), field(2, 16, 4)];
    const Q4_1: [Field; 3] = [field(0, 2, 2), field(2, 2, 2), field(4, 16, 4)];
    const Q5_0: [Field; 3] = [field(0, 2, 2), field(2, 4, 4), field(6, 16, 4)];
    const Q5_1: [Field; 4] = [
        field(0, 2, 2),
        field(2, 2, 2),
        field(4, 4, 4),
        field(8, 16, 4),
    ];
    const Q8_0: [Field; 2] = [
        field(0, 2, 2),
        Field {
            flip: 0x80,
            ..field(2, 32, 4)
        },
    ];
    const Q4K: [Field; 4] = [
        field(0, 2, 2),
        field(2, 2, 2),
        field(4, 12, 4),
        field(16, 128, 4),
    ];
    const Q5K: [Field; 5] = [
        field(0, 2, 2),
        field(2, 2, 2),
        field(4, 12, 4),
        field(16, 32, 4),
        field(48, 128, 4),
    ];
    // d, scales, low nibbles, high bits.
    const Q6K: [Field; 4] = [
        field(208, 2, 2),
        field(192, 16, 4),
        field(0, 128, 4),
        field(128, 64, 4),
    ];
    // The E8M0 scale byte, then the codes as Q4_0's.
    const MXFP4: [Field; 2] = [field(0, 1, 1), field(1, 16, 4)];
    Some(match dtype {
        GgmlType::MXFP4 => &MXFP4,
        GgmlType::Q4_0 => &Q4_0,
        GgmlType::Q4_1 => &Q4_1,
        GgmlType::Q5_0 => &Q5_0,
        GgmlType::Q5_1 => &Q5_1,
        GgmlType::Q8_0 => &Q8_0,
        GgmlType::Q4K => &Q4K,
        GgmlType::Q5K => &Q5K,
        GgmlType::Q6K => &Q6K,
        _ => return None,
    })
}

/// Whether `dtype` has an interleaved layout at all (the CPU decides whether to use it).
pub(crate) fn supports(dtype: GgmlType) -> bool {
    fields(dtype).is_some()
}

/// Bytes of one tile (`TILE_ROWS` rows of `cols` columns); the same as the rows it holds.
pub(crate) fn tile_bytes(dtype: GgmlType, cols: usize) -> usize {
    TILE_ROWS * cols / dtype.block_elems() * dtype.block_bytes()
}

/// Calls `f(tile offset, row, row offset, unit length, flip)` for every unit of the rows
/// `rows` of one tile block, the row offsets relative to that row's block.
fn for_each_unit(
    fields: &[Field],
    rows: std::ops::Range<usize>,
    mut f: impl FnMut(usize, usize, usize, usize, u8),
) {
    let mut field_at = 0;
    for fl in fields {
        for u in 0..fl.len / fl.unit {
            for r in rows.clone() {
                let tile_at = field_at + (u * TILE_ROWS + r) * fl.unit;
                f(tile_at, r, fl.at + u * fl.unit, fl.unit, fl.flip);
            }
        }
        field_at += TILE_ROWS * fl.len;
    }
}

/// Writes the tile of `TILE_ROWS` rows in `rows` (row-major ggml blocks of `dtype`, each
/// row `row_bytes` long) into `out` (as long as `rows`) in the interleaved layout.
///
/// # Panics
/// If `dtype` has no interleaved layout, `rows` is not `TILE_ROWS` whole rows, or `out`
/// is not its length.
pub(crate) fn write_tile(dtype: GgmlType, rows: &[u8], row_bytes: usize, out: &mut [u8]) {
    let fields = fields(dtype).expect("write_tile: format without an interleaved layout");
    assert_eq!(
        rows.len(),
        TILE_ROWS * row_bytes,
        "write_tile: not one tile"
    );
    assert_eq!(out.len(), rows.len(), "write_tile: output of another size");
    let bb = dtype.block_bytes();
    for (b, tb) in out.chunks_exact_mut(TILE_ROWS * bb).enumerate() {
        for_each_unit(fields, 0..TILE_ROWS, |tile_at, r, at, len, flip| {
            let src = &rows[r * row_bytes + b * bb + at..][..len];
            for (d, s) in tb[tile_at..tile_at + len].iter_mut().zip(src) {
                *d = s ^ flip;
            }
        });
    }
}

/// Rebuilds row `r` of a tile block by block in ggml's layout, handing each block to `f`
/// with its index: the inverse of [`write_tile`].
pub(crate) fn for_each_row_block(
    dtype: GgmlType,
    tile: &[u8],
    r: usize,
    mut f: impl FnMut(usize, &[u8]),
) {
    let fields = fields(dtype).expect("for_each_row_block: format without an interleaved layout");
    let bb = dtype.block_bytes();
    let mut block = [0u8; 256];
    let block = &mut block[..bb];
    for (b, tb) in tile.chunks_exact(TILE_ROWS * bb).enumerate() {
        // Only this row's units: it runs per token for embedding lookups.
        for_each_unit(fields, r..r + 1, |tile_at, _, at, len, flip| {
            for (d, s) in block[at..at + len].iter_mut().zip(&tb[tile_at..]) {
                *d = s ^ flip;
            }
        });
        f(b, block);
    }
}
