//! ggml's tensor block formats, kept quantized in memory: dequantisation, and matrix
//! products of quantized weights with f32 activations.
//!
//! - [`ggml_type`]: the types, their ids and block geometry.
//! - `float`, `legacy`, `kquants`, `mxfp4`: per-format layouts, dequantisation, scalar dot
//!   products.
//! - `act`: quantisation of activations into the dot-product block types (Q8_0, Q8_1, Q8_K).
//! - `quantize` (+ `kquants_quantize`): weight matrices quantized into block formats
//!   ([`QMatrix::quantized`]).
//! - `formats` + `matmul`: the row kernels and the parallel, tiled driver; `float_gemm`:
//!   the float path's blocked x86_64 kernel;
//!   `x86_rows`: x86_64 SIMD row kernels for every format, compiled for AVX2 (`avx2`) and
//!   for AVX-512 VNNI (`vnni`), picked at runtime (portable code elsewhere).
//! - `interleave` + `x86_tiles` (and `x86_ktiles` for the K-quants): the layout that stores
//!   8 rows together ([`Layout::Interleaved`]) and its kernels, several times faster than the
//!   row kernels where the CPU has them ([`QMatrix::use_cpu_layout`]).
//!
//! **Invariant:** a [`QMatrix`] built by [`QMatrix::new`] has `cols` a whole number of blocks
//! and exactly `rows × row_bytes` bytes, so kernels index its rows without further checks;
//! an interleaved one also has `rows` a whole number of tiles.

mod act;
#[cfg(target_arch = "x86_64")]
mod avx2;
mod float;
#[cfg(target_arch = "x86_64")]
mod float_gemm;
mod formats;
pub mod ggml_type;
mod interleave;
pub(crate) mod kquants;
pub(crate) mod kquants_quantize;
pub(crate) mod legacy;
mod legacy_quantize;
mod matmul;
pub(crate) mod mxfp4;
pub(crate) mod quantize;
#[cfg(test)]
pub(crate) mod tests;
#[cfg(target_arch = "x86_64")]
mod vnni;
#[cfg(target_arch = "x86_64")]
mod x86_ktiles;
#[cfg(target_arch = "x86_64")]
mod x86_rows;
#[cfg(target_arch = "x86_64")]
mod x86_tiles;

use std::sync::Arc;

pub use ggml_type::GgmlType;

/// Why a quantized matrix could not be built.
#[derive(Debug, thiserror::Error)]
pub enum QuantError {
    #[error("{dtype:?} rows must be a multiple of {block} elements, got {cols} columns")]
    PartialBlock {
        dtype: GgmlType,
        cols: usize,
        block: usize,
    },
    #[error("{dtype:?} matrix {rows}×{cols} needs {expected} bytes, got {got}")]
    WrongSize {
        dtype: GgmlType,
        rows: usize,
        cols: usize,
        expected: usize,
        got: usize,
    },
    #[error("{0:?} is not a block format: nothing quantizes to it")]
    NoQuantizer(GgmlType),
}

/// A 2-D weight `[rows, cols]` (ggml's ne = [cols, rows]) whose rows are stored in `dtype`.
/// `data` borrows the mmapped file (or owned bytes for converted tensors).
pub struct QMatrix {
    pub dtype: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub data: TensorBytes,
    /// How the rows are arranged in `data`.
    pub(crate) layout: Layout,
    /// How products round their input (block formats only).
    pub(crate) activations: Activations,
}

/// How a block-format matrix's products treat their f32 input.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Activations {
    /// Rounded to the format's 8-bit activation blocks, then integer dot products: ggml's
    /// arithmetic, and the fast one.
    #[default]
    Quantized,
    /// Kept in f32: each chunk of rows is dequantised and multiplied in floating point, as
    /// the float types are. For weights whose reference engine multiplies its own
    /// dequantisation (transformers on MXFP4 checkpoints, see `model::mxfp4`).
    F32,
}

/// How a matrix's rows are arranged in its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Layout {
    /// ggml's: one row after another.
    Rows,
    /// Groups of 8 rows stored block by block (see `interleave`), for the tile kernels.
    Interleaved,
}

/// One product of [`QMatrix::matmul_grouped`]: `out = mat · x`, `x` holding `n_tokens`
/// rows of `mat.cols`.
pub struct MatJob<'a> {
    pub mat: &'a QMatrix,
    pub x: &'a [f32],
    pub n_tokens: usize,
    pub out: &'a mut [f32],
}

/// Bytes of a tensor: a range of a shared mmap, or owned.
pub enum TensorBytes {
    Mapped {
        map: Arc<memmap2::Mmap>,
        offset: usize,
        len: usize,
    },
    Owned(Vec<u8>),
}

impl TensorBytes {
    pub fn as_slice(&self) -> &[u8] {
        match self {
            // An out-of-range view (a caller bug) reads as empty, which `QMatrix::new` then
            // reports as a size mismatch instead of panicking.
            TensorBytes::Mapped { map, offset, len } => offset
                .checked_add(*len)
                .and_then(|end| map.get(*offset..end))
                .unwrap_or(&[]),
            TensorBytes::Owned(v) => v,
        }
    }

    /// Hands the pages behind `len` bytes from `offset` back to the kernel (a no-op for
    /// owned bytes): for a mapped tensor that was copied elsewhere and will not be read here
    /// again, so that both copies are never resident together. Best effort.
    fn release(&self, offset: usize, len: usize) {
        if len == 0 {
            return;
        }
        if let TensorBytes::Mapped {
            map, offset: at, ..
        } = self
        {
            // SAFETY: the map is a read-only file mapping that nothing ever writes, so
            // dropping its pages loses nothing: any later read faults them back in from the
            // file. (The range is widened down to a page boundary, which at worst drops a
            // neighbouring tensor's page the same harmless way.)
            let _ = unsafe {
                map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, at + offset, len)
            };
        }
    }
}

impl std::fmt::Debug for QMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "QMatrix({:?}, {}×{})", self.dtype, self.rows, self.cols)
    }
}

impl QMatrix {
    /// A matrix over `data`, checked to hold exactly `rows` whole-block rows of `cols`.
    pub fn new(
        dtype: GgmlType,
        rows: usize,
        cols: usize,
        data: TensorBytes,
    ) -> Result<Self, QuantError> {
        let block = dtype.block_elems();
        let row_bytes =
            dtype
                .row_bytes(cols)
                .ok_or(QuantError::PartialBlock { dtype, cols, block })?;
        let expected = row_bytes.checked_mul(rows);
        let got = data.as_slice().len();
        if expected != Some(got) {
            let expected = expected.unwrap_or(usize::MAX);
            return Err(QuantError::WrongSize {
                dtype,
                rows,
                cols,
                expected,
                got,
            });
        }
        Ok(QMatrix {
            dtype,
            rows,
            cols,
            data,
            layout: Layout::Rows,
            activations: Activations::Quantized,
        })
    }

    /// This matrix, its products keeping their input in f32 ([`Activations::F32`]), which
    /// read its rows as ggml lays them out.
    ///
    /// # Panics
    /// On a matrix already interleaved by [`QMatrix::use_cpu_layout`] (a caller bug: choose
    /// the route at load, before the layout).
    pub fn with_f32_activations(mut self) -> Self {
        assert_eq!(self.layout, Layout::Rows, "f32 activations read rows");
        self.activations = Activations::F32;
        self
    }

    /// How this matrix's products treat their input.
    pub fn activations(&self) -> Activations {
        self.activations
    }

    /// Whether products take the float path: float types, and [`Activations::F32`].
    fn multiplies_in_f32(&self) -> bool {
        self.dtype.block_elems() == 1 || self.activations == Activations::F32
    }

    /// Rearranges the matrix into the layout this CPU's kernels read fastest: interleaved
    /// where a tile kernel exists for its format (and its rows fill whole tiles), else
    /// unchanged. A mapped matrix becomes owned; the mapped pages it was read from are
    /// handed back to the kernel as it goes, so loading never holds both copies (peak
    /// memory stays that of one copy plus a few MiB).
    pub fn use_cpu_layout(&mut self) {
        let empty = QMatrix {
            dtype: GgmlType::F32,
            rows: 0,
            cols: 0,
            data: TensorBytes::Owned(Vec::new()),
            layout: Layout::Rows,
            activations: Activations::Quantized,
        };
        *self = std::mem::replace(self, empty).into_cpu_layout();
    }

    fn into_cpu_layout(self) -> QMatrix {
        if self.layout != Layout::Rows
            || self.activations != Activations::Quantized
            || self.cols == 0
            || !self.rows.is_multiple_of(interleave::TILE_ROWS)
            || !interleave::supports(self.dtype)
            || !formats::has_tile_kernel(self.dtype)
        {
            return self;
        }
        let (dtype, row_bytes) = (self.dtype, self.row_bytes());
        let tile_bytes = interleave::tile_bytes(dtype, self.cols);
        let mut out = vec![0u8; self.bytes().len()];
        // About 4 MiB of source per release of its pages; its tiles are repacked in parallel
        // on the worker team (one thread managed ~0.9 GB/s: seconds for a big model).
        let run = ((4 << 20) / tile_bytes).max(1) * tile_bytes;
        for (i, (src, dst)) in self
            .bytes()
            .chunks(run)
            .zip(out.chunks_mut(run))
            .enumerate()
        {
            let mut tiles: Vec<(&[u8], &mut [u8])> = src
                .chunks_exact(tile_bytes)
                .zip(dst.chunks_exact_mut(tile_bytes))
                .collect();
            crate::team::for_each_mut(&mut tiles, |(rows, tile)| {
                interleave::write_tile(dtype, rows, row_bytes, tile)
            });
            self.data.release(i * run, src.len());
        }
        QMatrix {
            dtype: self.dtype,
            rows: self.rows,
            cols: self.cols,
            data: TensorBytes::Owned(out),
            layout: Layout::Interleaved,
            activations: self.activations,
        }
    }

    /// Cuts a row-major matrix into `parts` matrices of `rows / parts` consecutive rows
    /// each: the experts of a stacked 3-D expert tensor, or the gate and up halves of a
    /// fused one. Mapped bytes stay views into the same map; nothing is copied.
    pub fn split_rows(self, parts: usize) -> Result<Vec<QMatrix>, QuantError> {
        let wrong = |m: &QMatrix| QuantError::WrongSize {
            dtype: m.dtype,
            rows: m.rows,
            cols: m.cols,
            expected: parts,
            got: m.rows,
        };
        if parts == 0 || !self.rows.is_multiple_of(parts) || self.layout != Layout::Rows {
            return Err(wrong(&self));
        }
        let rows = self.rows / parts;
        let len = rows * self.row_bytes();
        (0..parts)
            .map(|i| {
                let data = match &self.data {
                    TensorBytes::Mapped { map, offset, .. } => TensorBytes::Mapped {
                        map: Arc::clone(map),
                        offset: offset + i * len,
                        len,
                    },
                    TensorBytes::Owned(v) => TensorBytes::Owned(v[i * len..][..len].to_vec()),
                };
                let mut part = QMatrix::new(self.dtype, rows, self.cols, data)?;
                part.activations = self.activations;
                Ok(part)
            })
            .collect()
    }

    /// An owned f32 matrix (e.g. a tensor converted at load time).
    pub fn from_f32(rows: usize, cols: usize, values: &[f32]) -> Result<Self, QuantError> {
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        QMatrix::new(GgmlType::F32, rows, cols, TensorBytes::Owned(bytes))
    }

    /// All the matrix bytes, row after row.
    pub fn bytes(&self) -> &[u8] {
        self.data.as_slice()
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.cols / self.dtype.block_elems() * self.dtype.block_bytes()
    }

    /// `out[t * rows + r] = Σ_c W[r, c] · x[t * cols + c]` for `n_tokens` activation rows.
    /// Activations are quantized once per call to the dot type matching `dtype`; work is split
    /// over the engine's worker team.
    ///
    /// # Panics
    /// If `x` is not `n_tokens × cols` or `out` not `n_tokens × rows` (a caller bug).
    pub fn matmul(&self, x: &[f32], n_tokens: usize, out: &mut [f32]) {
        QMatrix::matmul_many(&[self], x, n_tokens, &mut [out]);
    }

    /// [`QMatrix::matmul`] of several matrices with the same input (`outs[i] = mats[i] · x`),
    /// as one operation when they share a format: the input is quantized once and all
    /// their rows are split over the team together (fewer, fuller hand-offs per layer).
    ///
    /// # Panics
    /// As [`QMatrix::matmul`], for every matrix and its output.
    pub fn matmul_many(mats: &[&QMatrix], x: &[f32], n_tokens: usize, outs: &mut [&mut [f32]]) {
        assert_eq!(mats.len(), outs.len(), "matmul: one output per matrix");
        let mut jobs: Vec<MatJob<'_>> = mats
            .iter()
            .zip(outs.iter_mut())
            .map(|(mat, out)| MatJob {
                mat,
                x,
                n_tokens,
                out,
            })
            .collect();
        QMatrix::matmul_grouped(&mut jobs);
    }

    /// Several products, each with its own input (a mixture-of-experts layer's experts over
    /// their own tokens), the products of each format as one operation: every distinct
    /// input is quantized once and all their rows are split over the team together.
    ///
    /// # Panics
    /// As [`QMatrix::matmul`], for every product.
    pub fn matmul_grouped(jobs: &mut [MatJob<'_>]) {
        for j in jobs.iter() {
            assert_eq!(
                j.x.len(),
                j.n_tokens * j.mat.cols,
                "matmul: x must be n_tokens × cols"
            );
            assert_eq!(
                j.out.len(),
                j.n_tokens * j.mat.rows,
                "matmul: out must be n_tokens × rows"
            );
            assert_eq!(
                j.mat.bytes().len(),
                j.mat.rows * j.mat.row_bytes(),
                "matmul: malformed QMatrix"
            );
        }
        let mut dtypes: Vec<GgmlType> = Vec::new();
        for j in jobs.iter_mut().filter(|j| j.n_tokens > 0) {
            if j.mat.multiplies_in_f32() {
                matmul::matmul_float(j.mat, j.x, j.n_tokens, j.out);
            } else if !dtypes.contains(&j.mat.dtype) {
                dtypes.push(j.mat.dtype);
            }
        }
        use formats as f;
        for dtype in dtypes {
            let mut same: Vec<MatJob<'_>> = jobs
                .iter_mut()
                .filter(|j| j.mat.dtype == dtype && j.n_tokens > 0 && !j.mat.multiplies_in_f32())
                .map(|j| MatJob {
                    mat: j.mat,
                    x: j.x,
                    n_tokens: j.n_tokens,
                    out: &mut *j.out,
                })
                .collect();
            match dtype {
                // Taken by the float path above.
                GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => {}
                GgmlType::Q4_0 => matmul::matmul_quantized::<f::Q4_0>(&mut same),
                GgmlType::Q4_1 => matmul::matmul_quantized::<f::Q4_1>(&mut same),
                GgmlType::Q5_0 => matmul::matmul_quantized::<f::Q5_0>(&mut same),
                GgmlType::Q5_1 => matmul::matmul_quantized::<f::Q5_1>(&mut same),
                GgmlType::Q8_0 => matmul::matmul_quantized::<f::Q8_0>(&mut same),
                GgmlType::Q4K => matmul::matmul_quantized::<f::Q4K>(&mut same),
                GgmlType::Q5K => matmul::matmul_quantized::<f::Q5K>(&mut same),
                GgmlType::Q6K => matmul::matmul_quantized::<f::Q6K>(&mut same),
                GgmlType::MXFP4 => matmul::matmul_quantized::<f::MXFP4>(&mut same),
            }
        }
    }

    /// Dequantises row `r` into `out` (len `cols`), e.g. for embedding lookups.
    ///
    /// # Panics
    /// If `r >= rows` or `out.len() != cols` (a caller bug: validate token ids first).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        assert!(
            r < self.rows,
            "dequantize_row: row {r} out of {} rows",
            self.rows
        );
        assert_eq!(
            out.len(),
            self.cols,
            "dequantize_row: out must be cols long"
        );
        let rb = self.row_bytes();
        match self.layout {
            Layout::Rows => dequantize(self.dtype, &self.bytes()[r * rb..(r + 1) * rb], out),
            Layout::Interleaved => {
                let tile_rows = interleave::TILE_ROWS;
                let tile = &self.bytes()[r / tile_rows * tile_rows * rb..][..tile_rows * rb];
                let elems = self.dtype.block_elems();
                interleave::for_each_row_block(self.dtype, tile, r % tile_rows, |b, block| {
                    dequantize(self.dtype, block, &mut out[b * elems..(b + 1) * elems])
                });
            }
        }
    }

    /// The whole matrix as f32, row-major.
    pub fn dequantize_all(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        for (r, row) in out.chunks_exact_mut(self.cols.max(1)).enumerate() {
            self.dequantize_row(r, row);
        }
        out
    }
}

/// Dequantises whole blocks of `dtype` from `bytes` into `out`, stopping at whichever runs
/// out first (callers size both to match).
pub fn dequantize(dtype: GgmlType, bytes: &[u8], out: &mut [f32]) {
    let block_fn: fn(&[u8], &mut [f32]) = match dtype {
        GgmlType::F32 => return float::dequantize_f32(bytes, out),
        GgmlType::F16 => return float::dequantize_f16(bytes, out),
        GgmlType::BF16 => return float::dequantize_bf16(bytes, out),
        GgmlType::Q4_0 => legacy::dequantize_q4_0,
        GgmlType::Q4_1 => legacy::dequantize_q4_1,
        GgmlType::Q5_0 => legacy::dequantize_q5_0,
        GgmlType::Q5_1 => legacy::dequantize_q5_1,
        GgmlType::Q8_0 => legacy::dequantize_q8_0,
        GgmlType::Q4K => kquants::dequantize_q4_k,
        GgmlType::Q5K => kquants::dequantize_q5_k,
        GgmlType::Q6K => kquants::dequantize_q6_k,
        GgmlType::MXFP4 => return mxfp4::dequantize_mxfp4_blocks(bytes, out),
    };
    let elems = dtype.block_elems();
    for (block, o) in bytes
        .chunks_exact(dtype.block_bytes())
        .zip(out.chunks_exact_mut(elems))
    {
        block_fn(block, o);
    }
}
