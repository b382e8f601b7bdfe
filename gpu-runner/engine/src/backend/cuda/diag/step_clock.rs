//! How a step's wall time divides between the GPU and the host. With
//! `FALLOW_CUDA_DEBUG=step-clock` each step's work on the stream (its inputs' upload through its
//! last launch) is bracketed by two CUDA events, and the host clock reads the step's time in
//! the backend and the gap since the previous step returned (the engine's own work: sampling
//! bookkeeping, scheduling, building the next batch); when the backend is dropped a table per
//! step shape goes to stderr. Unlike the profile ([`super::profile`]) it leaves graphs and
//! early starts on: the steps as they are served. The share of the wall time the GPU is busy
//! bounds what kernel work alone can win at batch 1. Off, it costs one branch per step.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaContext, CudaEvent, CudaStream};

use crate::backend::cuda::CudaError;

/// A gap between steps longer than this is the engine waiting for work, not doing it.
const IDLE_GAP: Duration = Duration::from_millis(100);

/// One step shape's sums, in milliseconds.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct Clocked {
    steps: u64,
    gpu_ms: f64,
    backend_ms: f64,
    /// Gaps before the shape's steps (those under [`IDLE_GAP`]) and how many.
    between_ms: f64,
    gaps: u64,
}

#[derive(Default)]
pub struct StepClock {
    enabled: bool,
    /// Before the step's upload and after its last launch.
    events: Option<[CudaEvent; 2]>,
    started: Option<Instant>,
    gap: Option<Duration>,
    last_return: Option<Instant>,
    totals: BTreeMap<String, Clocked>,
}

impl StepClock {
    /// Off, or on ([`CudaDebug`](crate::backend::cuda::CudaDebug) asks).
    pub fn set_enabled(&mut self, enabled: bool) {
        self.enabled = enabled;
    }

    /// A step starts: the host clock reads, and the stream is marked before its upload.
    pub fn start(
        &mut self,
        ctx: &Arc<CudaContext>,
        stream: &Arc<CudaStream>,
    ) -> Result<(), CudaError> {
        if !self.enabled {
            return Ok(());
        }
        let now = Instant::now();
        self.started = Some(now);
        self.gap = self.last_return.map(|r| now.duration_since(r));
        if self.events.is_none() {
            let event = || {
                ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                    .map_err(CudaError::driver)
            };
            self.events = Some([event()?, event()?]);
        }
        if let Some([before, _]) = &self.events {
            before.record(stream).map_err(CudaError::driver)?;
        }
        Ok(())
    }

    /// The step's launches are all on the stream.
    pub fn launched(&mut self, stream: &Arc<CudaStream>) -> Result<(), CudaError> {
        if let (true, Some([_, after])) = (self.enabled, &self.events) {
            after.record(stream).map_err(CudaError::driver)?;
        }
        Ok(())
    }

    /// The step has returned its outputs (the stream is synchronised); `shape` names it
    /// (built only when the clock is on).
    pub fn end_step(&mut self, shape: impl FnOnce() -> String) -> Result<(), CudaError> {
        let (true, Some(started), Some([before, after])) =
            (self.enabled, self.started.take(), &self.events)
        else {
            return Ok(());
        };
        let gpu_ms = f64::from(before.elapsed_ms(after).map_err(CudaError::driver)?);
        let now = Instant::now();
        let t = self.totals.entry(shape()).or_default();
        t.steps += 1;
        t.gpu_ms += gpu_ms;
        t.backend_ms += now.duration_since(started).as_secs_f64() * 1e3;
        if let Some(gap) = self.gap.take().filter(|g| *g < IDLE_GAP) {
            t.between_ms += gap.as_secs_f64() * 1e3;
            t.gaps += 1;
        }
        self.last_return = Some(now);
        Ok(())
    }
}

impl Drop for StepClock {
    fn drop(&mut self) {
        if self.enabled && !self.totals.is_empty() {
            eprintln!("{}", report(&self.totals));
        }
    }
}

/// The name of a step of `tokens` rows (padding included), `decode` of them single tokens.
pub fn step_shape(tokens: usize, decode: usize) -> String {
    let kind = match decode {
        0 => "prompt",
        d if d == tokens => "decode",
        _ => "prompt+decode",
    };
    format!("{kind} n={tokens}")
}

fn report(totals: &BTreeMap<String, Clocked>) -> String {
    let mut out = format!(
        "CUDA step clock (FALLOW_CUDA_DEBUG=step-clock), mean ms per step\n{:<24} {:>7} {:>9} {:>11} {:>9} {:>9}\n",
        "step", "steps", "GPU", "in backend", "between", "GPU busy"
    );
    for (shape, t) in totals {
        let steps = t.steps.max(1) as f64;
        let between = t.between_ms / t.gaps.max(1) as f64;
        let wall = t.backend_ms / steps + between;
        out.push_str(&format!(
            "{:<24} {:>7} {:>9.3} {:>11.3} {:>9.3} {:>8.1}%\n",
            shape,
            t.steps,
            t.gpu_ms / steps,
            t.backend_ms / steps,
            between,
            100.0 * (t.gpu_ms / steps) / wall.max(1e-12)
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_named_by_their_rows_and_whether_all_are_decodes() {
        assert_eq!(step_shape(8, 8), "decode n=8");
        assert_eq!(step_shape(40, 1), "prompt+decode n=40");
        assert_eq!(step_shape(32, 0), "prompt n=32");
    }

    #[test]
    fn the_report_gives_each_shapes_mean_times_and_the_share_the_gpu_is_busy() {
        let mut totals = BTreeMap::new();
        totals.insert(
            "decode n=1".to_string(),
            Clocked {
                steps: 100,
                gpu_ms: 500.0,
                backend_ms: 540.0,
                between_ms: 60.0,
                gaps: 99,
            },
        );
        let text = report(&totals);
        let row = text.lines().nth(2).expect("a row");
        // 5 ms of GPU in 5.4 ms in the backend plus 0.606 ms between steps: 83.2 % busy.
        assert!(row.starts_with("decode n=1"), "{text}");
        for figure in ["100", "5.000", "5.400", "0.606", "83.2%"] {
            assert!(row.contains(figure), "{figure} in {row}");
        }
    }
}
