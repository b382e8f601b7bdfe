//! How load-time tuning times a product on this GPU ([`super::gemv_tune`], [`super::mmq_tune`]):
//! the mean GPU time between two CUDA events of a few launches, each on another layer's
//! matrix so that the weights come from memory rather than from L2, after one untimed
//! launch that warms the kernel and its code up. The policy is the caller's
//! ([`TimingPolicy`]): tests on the emulated driver, whose times are the CPU's and choose
//! nothing worth choosing, ask for one timed launch (`quick-tuning`), since the tuning's path
//! is what is tested there and its launches were most of the emulated suite's time.

use std::sync::Arc;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaContext, CudaEvent, CudaStream};

use crate::backend::cuda::CudaError;

/// Launches timed per candidate and shape on a GPU, after the untimed one.
pub(in crate::backend::cuda) const TIMED_LAUNCHES: usize = 4;

/// How a candidate is timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimingPolicy {
    /// [`TIMED_LAUNCHES`] launches after an untimed one: what a GPU's choice needs.
    Measured,
    /// One timed launch, no warm-up: the path of the tuning, at the least cost.
    Quick,
}

pub(in crate::backend::cuda) struct LaunchTimer {
    stream: Arc<CudaStream>,
    start: CudaEvent,
    stop: CudaEvent,
    policy: TimingPolicy,
}

impl LaunchTimer {
    pub fn new(
        ctx: &Arc<CudaContext>,
        stream: &Arc<CudaStream>,
        policy: TimingPolicy,
    ) -> Result<Self, CudaError> {
        let event = || {
            ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(CudaError::driver)
        };
        Ok(LaunchTimer {
            stream: Arc::clone(stream),
            start: event()?,
            stop: event()?,
            policy,
        })
    }

    /// The mean milliseconds of `launch(i)` for i < [`TIMED_LAUNCHES`] (the caller's i-th
    /// layer's matrix), after an untimed `launch(TIMED_LAUNCHES)` (quick: `launch(0)` alone).
    pub fn mean_ms(
        &self,
        launch: &dyn Fn(usize) -> Result<(), CudaError>,
    ) -> Result<f32, CudaError> {
        let measured = self.policy == TimingPolicy::Measured;
        let timed = if measured { TIMED_LAUNCHES } else { 1 };
        if measured {
            launch(TIMED_LAUNCHES)?;
        }
        self.start.record(&self.stream).map_err(CudaError::driver)?;
        for i in 0..timed {
            launch(i)?;
        }
        self.stop.record(&self.stream).map_err(CudaError::driver)?;
        self.stop.synchronize().map_err(CudaError::driver)?;
        let ms = self
            .start
            .elapsed_ms(&self.stop)
            .map_err(CudaError::driver)?;
        Ok(ms / timed as f32)
    }
}
