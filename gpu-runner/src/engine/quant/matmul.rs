//! The matrix-product driver: quantizes activations once, then splits weight rows across
//! rayon's global pool, each chunk running a row kernel over tiles of tokens.
//!
//! Loop order (per chunk of rows): token tile → row → weight block → token. A chunk's rows
//! are a few KiB, so they stay in cache while every token tile streams past them, and each
//! weight block is unpacked once per tile rather than once per token (GEMM, not repeated GEMV).

use rayon::prelude::*;

use super::act::ActBlock;
use super::float::dot_f32;
use super::formats::WeightFormat;
use super::QMatrix;

/// Tokens per tile: the activation tile of the widest layer stays in L2 at this size.
pub(crate) const TOKEN_TILE: usize = 32;

/// `out`, shared by the row chunks: chunk `c` writes only `out[t * rows + r]` for its own
/// rows `r`, so no two threads write the same element and nothing reads it meanwhile.
struct SharedOut {
    ptr: *mut f32,
    len: usize,
}

// SAFETY: see the struct docs — writes are to disjoint indices, and `out` outlives the
// parallel loop (it is borrowed mutably for the whole call).
unsafe impl Sync for SharedOut {}

impl SharedOut {
    #[inline(always)]
    fn write(&self, i: usize, v: f32) {
        assert!(i < self.len);
        // SAFETY: in bounds (checked above) and disjoint per chunk (struct docs).
        unsafe { *self.ptr.add(i) = v }
    }
}

/// Weight bytes per chunk when several token tiles reuse them (about half an L2).
const TILED_CHUNK_BYTES: usize = 256 << 10;

/// Multiply-adds below which a chunk is not worth a task of its own.
const MIN_CHUNK_WORK: usize = 1 << 16;

/// Rows per parallel chunk: enough chunks to balance the pool, but each with enough work
/// to pay for its scheduling.
fn rows_per_chunk(rows: usize, cols: usize, n_tokens: usize) -> usize {
    let target_chunks = rayon::current_num_threads().max(1) * 4;
    let min_rows = MIN_CHUNK_WORK.div_ceil(cols.max(1) * n_tokens.max(1));
    rows.div_ceil(target_chunks).max(min_rows).max(1)
}

/// Runs `chunk(c)` for `c in 0..n_chunks` on rayon's global pool, or inline when there is
/// only one (a hand-off to the pool costs more than a small product).
fn for_each_chunk(n_chunks: usize, chunk: impl Fn(usize) + Sync + Send) {
    if n_chunks == 1 {
        chunk(0);
    } else {
        (0..n_chunks).into_par_iter().for_each(chunk);
    }
}

/// Activations of one token tile, block-major: `acts[b * tn + t]`.
struct Tile<A> {
    t0: usize,
    tn: usize,
    acts: Vec<A>,
}

fn quantize_tiles<A: ActBlock>(x: &[f32], n_tokens: usize, cols: usize) -> Vec<Tile<A>> {
    let nb = cols / A::ELEMS;
    let quantize_tile = |t0: usize| {
        let tn = TOKEN_TILE.min(n_tokens - t0);
        let mut acts = vec![A::default(); nb * tn];
        for t in 0..tn {
            let row = &x[(t0 + t) * cols..(t0 + t + 1) * cols];
            for (b, chunk) in row.chunks_exact(A::ELEMS).enumerate() {
                acts[b * tn + t] = A::quantize(chunk);
            }
        }
        Tile { t0, tn, acts }
    };
    if n_tokens <= TOKEN_TILE {
        vec![quantize_tile(0)]
    } else {
        (0..n_tokens)
            .step_by(TOKEN_TILE)
            .collect::<Vec<_>>()
            .into_par_iter()
            .map(quantize_tile)
            .collect()
    }
}

/// Quantized path for weight format `W`.
pub(crate) fn matmul_quantized<W: WeightFormat>(
    m: &QMatrix,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
) {
    let kernel = W::row_kernel();
    let tiles = quantize_tiles::<W::Act>(x, n_tokens, m.cols);
    let (rows, row_bytes, weights) = (m.rows, m.row_bytes(), m.bytes());
    let shared = SharedOut {
        ptr: out.as_mut_ptr(),
        len: out.len(),
    };
    let mut chunk = rows_per_chunk(rows, m.cols, n_tokens);
    if tiles.len() > 1 {
        // Several tiles pass over the chunk's rows: keep those rows cache-sized.
        chunk = chunk.min((TILED_CHUNK_BYTES / row_bytes.max(1)).max(1));
    }
    for_each_chunk(rows.div_ceil(chunk), |c| {
        let mut buf = [0f32; TOKEN_TILE];
        for tile in &tiles {
            for r in c * chunk..((c + 1) * chunk).min(rows) {
                kernel(
                    &weights[r * row_bytes..(r + 1) * row_bytes],
                    &tile.acts,
                    tile.tn,
                    &mut buf,
                );
                for (t, &v) in buf[..tile.tn].iter().enumerate() {
                    shared.write((tile.t0 + t) * rows + r, v);
                }
            }
        }
    });
}

/// Rows per chunk of the float path: their f32 copy (≤ 16 × cols floats) stays in L2
/// while every token passes over it.
const FLOAT_CHUNK_ROWS: usize = 16;

/// Float path (F32, F16, BF16): each chunk of rows is converted to f32 once, then dotted
/// with every token.
pub(crate) fn matmul_float(m: &QMatrix, x: &[f32], n_tokens: usize, out: &mut [f32]) {
    let (rows, cols) = (m.rows, m.cols);
    let shared = SharedOut {
        ptr: out.as_mut_ptr(),
        len: out.len(),
    };
    let chunk = rows_per_chunk(rows, cols, n_tokens).min(FLOAT_CHUNK_ROWS);
    for_each_chunk(rows.div_ceil(chunk), |c| {
        let chunk_rows = c * chunk..((c + 1) * chunk).min(rows);
        let row_bytes = m.row_bytes();
        let bytes = &m.bytes()[chunk_rows.start * row_bytes..chunk_rows.end * row_bytes];
        let mut w = vec![0f32; chunk_rows.len() * cols];
        super::dequantize(m.dtype, bytes, &mut w);
        for t in 0..n_tokens {
            let xt = &x[t * cols..(t + 1) * cols];
            for (i, r) in chunk_rows.clone().enumerate() {
                shared.write(t * rows + r, dot_f32(&w[i * cols..(i + 1) * cols], xt));
            }
        }
    });
}
