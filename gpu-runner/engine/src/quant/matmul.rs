//! The matrix-product driver: quantizes activations once (for one matrix or several that
//! share the input), then splits weight rows across
//! the CPU worker team ([`crate::team`]), each chunk running a row kernel over
//! tiles of tokens.
//!
//! Loop order (per chunk of rows): token tile → row → weight block → token. A chunk's rows
//! are a few KiB, so they stay in cache while every token tile streams past them, and each
//! weight block is unpacked once per tile rather than once per token (GEMM, not repeated GEMV).

use super::act::ActBlock;
use super::float::dot_f32;
use super::formats::WeightFormat;
use super::interleave::TILE_ROWS;
use super::{Layout, MatJob, QMatrix};
use crate::team;

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

    /// Writes `vals` to `i ..` (one chunk's adjacent rows of one token).
    #[inline(always)]
    fn write_run(&self, i: usize, vals: &[f32]) {
        assert!(i + vals.len() <= self.len);
        // SAFETY: in bounds (checked above) and disjoint per chunk (struct docs).
        unsafe { std::ptr::copy_nonoverlapping(vals.as_ptr(), self.ptr.add(i), vals.len()) }
    }
}

/// Weight bytes per chunk when several token tiles reuse them (about half an L2).
const TILED_CHUNK_BYTES: usize = 256 << 10;

/// Multiply-adds below which a chunk is not worth a task of its own.
const MIN_CHUNK_WORK: usize = 1 << 16;

/// Rows per parallel chunk: enough chunks to balance the pool, but each with enough work
/// to pay for its scheduling.
fn rows_per_chunk(rows: usize, cols: usize, n_tokens: usize) -> usize {
    let target_chunks = team::team_size().max(1) * 4;
    let min_rows = MIN_CHUNK_WORK.div_ceil(cols.max(1) * n_tokens.max(1));
    rows.div_ceil(target_chunks).max(min_rows).max(1)
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
        team::map(n_tokens.div_ceil(TOKEN_TILE), |i| {
            quantize_tile(i * TOKEN_TILE)
        })
    }
}

/// Quantized path for weight format `W` over products with their own inputs (a
/// mixture-of-experts layer's experts, each over its tokens): every distinct input is
/// quantized once, and the row chunks of all products go to the team as one operation.
pub(crate) fn matmul_quantized<W: WeightFormat>(jobs: &mut [MatJob<'_>]) {
    let kernel = W::row_kernel();
    let tile_kernel = W::tile_kernel();
    // Inputs shared by several products (Q, K and V) are quantized once.
    let mut inputs: Vec<(&[f32], usize, usize)> = Vec::new();
    let input_of: Vec<usize> = jobs
        .iter()
        .map(|j| {
            let same = |&(x, n, cols): &(&[f32], usize, usize)| {
                std::ptr::eq(x, j.x) && n == j.n_tokens && cols == j.mat.cols
            };
            inputs.iter().position(same).unwrap_or_else(|| {
                inputs.push((j.x, j.n_tokens, j.mat.cols));
                inputs.len() - 1
            })
        })
        .collect();
    let tiles: Vec<Vec<Tile<W::Act>>> = inputs
        .iter()
        .map(|&(x, n, cols)| quantize_tiles::<W::Act>(x, n, cols))
        .collect();
    let total_rows: usize = jobs.iter().map(|j| j.mat.rows).sum();
    // (product, first row, end row) of every chunk.
    let mut chunks = Vec::new();
    for (i, j) in jobs.iter().enumerate() {
        let m = j.mat;
        let mut chunk = rows_per_chunk(total_rows, m.cols, j.n_tokens);
        if tiles[input_of[i]].len() > 1 {
            // Several tiles pass over the chunk's rows: keep those rows cache-sized.
            chunk = chunk.min((TILED_CHUNK_BYTES / m.row_bytes().max(1)).max(1));
        }
        if m.layout == Layout::Interleaved {
            chunk = chunk.next_multiple_of(TILE_ROWS);
        }
        chunks.extend(
            (0..m.rows)
                .step_by(chunk)
                .map(|r0| (i, r0, (r0 + chunk).min(m.rows))),
        );
    }
    let shared: Vec<SharedOut> = jobs
        .iter_mut()
        .map(|j| SharedOut {
            ptr: j.out.as_mut_ptr(),
            len: j.out.len(),
        })
        .collect();
    let mats: Vec<&QMatrix> = jobs.iter().map(|j| j.mat).collect();
    team::for_each(chunks.len(), |c| {
        let (i, r0, r1) = chunks[c];
        let (m, out, tiles) = (mats[i], &shared[i], &tiles[input_of[i]]);
        let (rows, row_bytes, weights) = (m.rows, m.row_bytes(), m.bytes());
        if m.layout == Layout::Interleaved {
            let tile_kernel = tile_kernel.expect("interleaved matrix without a tile kernel");
            let mut buf = [0f32; TOKEN_TILE * TILE_ROWS];
            for tile in tiles {
                for r in (r0..r1).step_by(TILE_ROWS) {
                    let strip = &weights[r * row_bytes..(r + TILE_ROWS) * row_bytes];
                    tile_kernel(strip, &tile.acts, tile.tn, &mut buf);
                    for (t, vals) in buf.chunks_exact(TILE_ROWS).take(tile.tn).enumerate() {
                        out.write_run((tile.t0 + t) * rows + r, vals);
                    }
                }
            }
            return;
        }
        let mut buf = [0f32; TOKEN_TILE];
        for tile in tiles {
            for r in r0..r1 {
                kernel(
                    &weights[r * row_bytes..(r + 1) * row_bytes],
                    &tile.acts,
                    tile.tn,
                    &mut buf,
                );
                for (t, &v) in buf[..tile.tn].iter().enumerate() {
                    out.write((tile.t0 + t) * rows + r, v);
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
    team::for_each(rows.div_ceil(chunk), |c| {
        let chunk_rows = c * chunk..((c + 1) * chunk).min(rows);
        let row_bytes = m.row_bytes();
        let bytes = &m.bytes()[chunk_rows.start * row_bytes..chunk_rows.end * row_bytes];
        let mut w = vec![0f32; chunk_rows.len() * cols];
        super::dequantize(m.dtype, bytes, &mut w);
        #[cfg(target_arch = "x86_64")]
        if super::formats::has_avx2() {
            let r0 = chunk_rows.start;
            super::float_gemm::dot_block(&w, chunk_rows.len(), x, n_tokens, cols, |t, i, v| {
                shared.write(t * rows + r0 + i, v)
            });
            return;
        }
        for t in 0..n_tokens {
            let xt = &x[t * cols..(t + 1) * cols];
            for (i, r) in chunk_rows.clone().enumerate() {
                shared.write(t * rows + r, dot_f32(&w[i * cols..(i + 1) * cols], xt));
            }
        }
    });
}
