//! A backend's [`CudaOptions`] carried out: at load and whenever they change, in one place,
//! which re-times what the change affects and drops the captured graphs once (they hold
//! the launches the old options made).

use super::gemm::GEMV_MAX_ROWS;
use super::l2_prefetch::L2Prefetch;
use super::tune::gemv_tune::{GemvChoice, TUNED_ROWS};
use super::tune::launch_timer::TimingPolicy;
use super::{CudaBackend, CudaError, CudaOptions, PrefillKernel, QuantX};

impl CudaBackend {
    /// The options this backend runs with.
    pub fn options(&self) -> &CudaOptions {
        &self.options
    }

    /// Runs with `options` from the next step on. The weights' storage and the kernel cache
    /// are fixed at load: a change of storage is refused, a change of cache ignored.
    pub fn set_options(&mut self, options: CudaOptions) -> Result<(), CudaError> {
        if options.weights != self.options.weights {
            return Err(CudaError::Failure(format!(
                "the weights are stored as {:?} since load; {:?} needs a new backend",
                self.options.weights, options.weights
            )));
        }
        let previous = std::mem::replace(&mut self.options, options);
        self.apply_options(Some(&previous))
    }

    /// [`CudaBackend::set_options`] with the current options as `change` leaves them, e.g.
    /// `cuda.update_options(|o| o.debug.fused_norm = false)`.
    pub fn update_options(
        &mut self,
        change: impl FnOnce(&mut CudaOptions),
    ) -> Result<(), CudaError> {
        let mut options = self.options.clone();
        change(&mut options);
        self.set_options(options)
    }

    /// Carries `self.options` out; `previous` (none at load) says what was already done, so
    /// that only a changed GEMV choice is timed again and only a changed x or int8 product
    /// choice is checked and timed again.
    pub(super) fn apply_options(
        &mut self,
        previous: Option<&CudaOptions>,
    ) -> Result<(), CudaError> {
        let options = self.options.clone();
        let debug = &options.debug;
        self.profiler.set_enabled(debug.profile);
        self.step_clock.set_enabled(debug.step_clock);
        // A profile times each launch on its own: overlapping launches would blur it, and
        // graphs would hide them.
        self.launcher
            .set_early_start(debug.early_start && !debug.profile);
        self.graphs.set_enabled(debug.graphs && !debug.profile);
        self.gemm.l2_prefetch = if debug.l2_prefetch {
            self.device_l2
        } else {
            L2Prefetch::default()
        };
        self.gemm
            .set_gemv_max_rows(debug.gemv_max_rows.unwrap_or(GEMV_MAX_ROWS));
        self.prefill = PrefillKernel::choose(self.config.head_dim, debug.prefill)
            .map_err(CudaError::Failure)?;
        let gemv_changed = previous.is_none_or(|p| {
            (&p.debug.gemv, p.debug.tensor_gemv, p.debug.gemv_cublas)
                != (&debug.gemv, debug.tensor_gemv, debug.gemv_cublas)
        });
        if gemv_changed {
            self.gemm.gemv_choice = GemvChoice::from_setting(debug.gemv.as_deref())
                .map_err(CudaError::Failure)?
                .with_tensor_cores(debug.tensor_gemv)
                .with_cublas(debug.gemv_cublas);
            self.tune_gemv()?;
        }
        let mmq_changed = previous.is_none_or(|p| p.debug.mmq != debug.mmq);
        if mmq_changed {
            self.gemm.mmq_choice.set_mode(debug.mmq);
        }
        self.gemm.quant_x = options.quant_x;
        let x_changed = mmq_changed || previous.is_none_or(|p| p.quant_x != options.quant_x);
        if x_changed && options.quant_x == QuantX::Int8 {
            // Int8 x first checks the formats' tensor-core products on this GPU, then times
            // them against the expansion for cuBLAS, once per backend and mode.
            self.check_mmq()?;
            self.tune_mmq()?;
        }
        self.graphs.clear();
        Ok(())
    }

    /// How load-time tuning times its candidates (`quick-tuning`).
    pub(super) fn timing_policy(&self) -> TimingPolicy {
        if self.options.debug.quick_tuning {
            TimingPolicy::Quick
        } else {
            TimingPolicy::Measured
        }
    }

    /// How many decode-step graphs this backend has captured (a capture that fails leaves
    /// its steps eager, silently but for a warning: tests check that graphs were replayed).
    pub fn graphs_captured(&self) -> usize {
        self.graphs.captured()
    }

    /// Whether launches start early: as the options ask, where the device has early starts.
    pub fn early_start(&self) -> bool {
        self.launcher.early_start()
    }

    /// The kernel prompt-run attention uses ([`CudaDebug::prefill`](super::CudaDebug)).
    pub fn prefill_kernel(&self) -> PrefillKernel {
        self.prefill
    }

    /// The bf16 GEMV variants left out at load because their product disagreed with the
    /// default variant's on this GPU ([`gemv_check`](super::tune::gemv_check)); empty where
    /// every kernel computes what it should (the GPU conformance suite asserts so).
    pub fn gemv_variants_rejected(&self) -> Vec<&'static str> {
        self.gemm.gemv_choice.rejected()
    }

    /// Has cuBLAS serve every decode-sized product through `product`'s matrices (`qkv`, `o`,
    /// `gate_up`, `down`, `lm_head`; where bf16), as timing does for products cuBLAS
    /// multiplies faster than a GEMV: the step then runs them unfused. Tests compare the two.
    pub fn decode_through_cublas(&mut self, product: &str) -> Result<(), CudaError> {
        let layer = self.weights.layers.first();
        let w = match product {
            "qkv" => layer.map(|l| &l.wqkv),
            "o" => layer.map(|l| &l.wo),
            "gate_up" => layer.and_then(|l| l.ffn.gate_up()),
            "down" => layer.and_then(|l| l.ffn.down()),
            "lm_head" => Some(self.weights.lm_head()),
            _ => None,
        }
        .ok_or_else(|| CudaError::Failure(format!("no product {product:?}")))?;
        for batch in TUNED_ROWS {
            self.gemm.gemv_choice.record_cublas(w.rows, w.cols, batch);
        }
        self.graphs.clear();
        Ok(())
    }
}
