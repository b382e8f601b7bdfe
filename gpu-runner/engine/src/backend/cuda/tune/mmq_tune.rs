//! Whether the int8 tensor-core products (mmq.cu) or the blocks expanded to bf16 for cuBLAS
//! serve each quantized matrix's batches of 9 to 64 token rows on this GPU. The tensor-core
//! product moves a fraction of the expansion's bytes (~0.56 per Q4_K weight against ~4.6),
//! but it applies every group's scales per token row on the CUDA cores and fills the GPU
//! only by splitting K into partial sums, while cuBLAS runs a tuned GEMM on the expansion:
//! which is faster depends on the GPU, the format, the shape and the batch. So, as the bf16
//! GEMVs are timed against cuBLAS ([`super::gemv_tune`]), once per backend when x is first
//! read as int8 (after [`super::mmq_check`]) each shape — `[rows, cols]` and the first part's
//! format — is timed both ways at each of [`MMQ_TUNED_ROWS`] token rows on the model's own
//! matrices, and the faster one serves it (the tensor-core product on a tie).
//! `mmq=always` ([`CudaDebug`](crate::backend::cuda::CudaDebug)) skips the timing and uses the
//! tensor-core products wherever their format passed the check, `mmq=never` never uses them.

use super::launch_timer::LaunchTimer;
use crate::backend::cuda::buffer::DeviceBuf;
use crate::backend::cuda::mmq::{MmqShape, MmqTiming, MMQ_MAX_ROWS, MMQ_TUNED_ROWS};
use crate::backend::cuda::weights::{DeviceMatrix, QuantPart, Storage};
use crate::backend::cuda::{CudaBackend, CudaError};
use crate::quant::GgmlType;

/// The matrices of one shape, in layer order, and the product they first appear as.
struct Group<'a> {
    what: &'static str,
    shape: (usize, usize, GgmlType),
    matrices: Vec<(&'a DeviceMatrix, &'a [QuantPart])>,
}

impl CudaBackend {
    /// The shapes timed ([`MmqTiming`]: mean ms both ways; empty before x is read as int8,
    /// or with `mmq=always|never` forcing the choice).
    pub fn mmq_timings(&self) -> Vec<MmqTiming> {
        self.gemm.mmq_choice.timings().to_vec()
    }

    /// Times the tensor-core products against the expansion on every quantized shape they
    /// take, once per backend (nothing when forced or when no matrix qualifies).
    pub(in crate::backend::cuda) fn tune_mmq(&mut self) -> Result<(), CudaError> {
        if !self.gemm.mmq_choice.needs_timing() {
            return Ok(());
        }
        let layers = &self.weights.layers;
        let products: [(&'static str, Vec<&DeviceMatrix>); 5] = [
            ("qkv", layers.iter().map(|l| &l.wqkv).collect()),
            ("o", layers.iter().map(|l| &l.wo).collect()),
            (
                "gate_up",
                layers.iter().filter_map(|l| l.ffn.gate_up()).collect(),
            ),
            ("down", layers.iter().filter_map(|l| l.ffn.down()).collect()),
            ("lm_head", self.weights.output.iter().collect()),
        ];
        let mut groups: Vec<Group> = Vec::new();
        for (what, matrices) in products {
            for m in matrices {
                let Storage::Quantized(parts) = &m.storage else {
                    continue;
                };
                let Some(first) = parts.first() else {
                    continue;
                };
                if !self.gemm.mmq_takes(parts, m) {
                    continue;
                }
                let shape = (m.rows, m.cols, first.dtype);
                match groups.iter_mut().find(|g| g.shape == shape) {
                    Some(group) => group.matrices.push((m, parts)),
                    None => groups.push(Group {
                        what,
                        shape,
                        matrices: vec![(m, parts)],
                    }),
                }
            }
        }
        let (rows, cols) = groups
            .iter()
            .fold((0, 0), |(r, c), g| (r.max(g.shape.0), c.max(g.shape.1)));
        let mut timed = Vec::new();
        let mut lines = Vec::new();
        if !groups.is_empty() {
            // Zeros: the time depends on shapes, not values.
            let x = DeviceBuf::<u16>::zeros(&self.stream, MMQ_MAX_ROWS * cols)?;
            let out = DeviceBuf::<f32>::zeros(&self.stream, MMQ_MAX_ROWS * rows)?;
            let timer = LaunchTimer::new(&self.ctx, &self.stream, self.timing_policy())?;
            let (x, out) = (x.ptr(), out.ptr());
            for group in &groups {
                let (rows, cols, format) = group.shape;
                let on = |i: usize| group.matrices[i % group.matrices.len()];
                for batch in MMQ_TUNED_ROWS {
                    let tensor_cores_ms = timer.mean_ms(&|i| {
                        let (w, parts) = on(i);
                        self.gemm.mmq(parts, w, x, batch, out)
                    })?;
                    let expanded_ms = timer.mean_ms(&|i| {
                        let (_, parts) = on(i);
                        self.gemm.expanded_product(parts, rows, cols, x, batch, out)
                    })?;
                    let timing = MmqTiming {
                        shape: MmqShape::of(rows, cols, format, batch),
                        tensor_cores_ms,
                        expanded_ms,
                    };
                    lines.push(format!(
                        "{} {rows}x{cols} {format:?} n={batch}: {} (int8 tensor cores {:.1} µs, \
                         expanded for cuBLAS {:.1} µs)",
                        group.what,
                        if timing.tensor_cores_win() {
                            "tensor cores"
                        } else {
                            "expanded"
                        },
                        tensor_cores_ms * 1e3,
                        expanded_ms * 1e3,
                    ));
                    timed.push(timing);
                }
            }
        }
        self.gemm.mmq_choice.set_timed(timed);
        if !lines.is_empty() {
            tracing::info!(
                choices = ?lines,
                "int8 tensor-core products timed against the expansion for cuBLAS on this GPU"
            );
        }
        Ok(())
    }
}
