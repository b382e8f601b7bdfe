//! Where a step's GPU time goes, per kernel and matrix product: with `FALLOW_CUDA_DEBUG=profile`
//! each launch is bracketed by CUDA events (graphs are off, launches eager) and, when the
//! backend is dropped, a table goes to stderr: calls, total and mean time, share, and for
//! the matrix products the weight bytes streamed per second, the figure to hold against
//! the memory bandwidth. Off, it costs one branch per launch.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaContext, CudaEvent, CudaStream};

use crate::backend::cuda::CudaError;

/// One timed launch of a step, resolved once the stream has finished it.
struct Pending {
    label: String,
    bytes: u64,
}

#[derive(Default, Clone, Copy)]
struct Total {
    calls: u64,
    ms: f64,
    bytes: u64,
}

#[derive(Default)]
pub struct Profiler {
    enabled: bool,
    /// Two events per pending launch, reused across steps.
    events: Vec<CudaEvent>,
    pending: Vec<Pending>,
    totals: HashMap<String, Total>,
}

impl Profiler {
    /// Off, or on ([`CudaDebug`](crate::backend::cuda::CudaDebug) asks).
    pub fn set_enabled(&mut self, enabled: bool) {
        self.enabled = enabled;
    }

    /// Marks the start of a launch; `None` when profiling is off.
    pub fn start(
        &mut self,
        ctx: &Arc<CudaContext>,
        stream: &Arc<CudaStream>,
    ) -> Result<Option<usize>, CudaError> {
        if !self.enabled {
            return Ok(None);
        }
        let i = self.pending.len();
        while self.events.len() < 2 * (i + 1) {
            let e = ctx
                .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(CudaError::driver)?;
            self.events.push(e);
        }
        self.events[2 * i]
            .record(stream)
            .map_err(CudaError::driver)?;
        self.pending.push(Pending {
            label: String::new(),
            bytes: 0,
        });
        Ok(Some(i))
    }

    /// Marks the end of the launch `start` returned, under `label` (built only when
    /// profiling), which streamed `bytes` of weights (0 for a kernel).
    pub fn stop(
        &mut self,
        started: Option<usize>,
        stream: &Arc<CudaStream>,
        label: impl FnOnce() -> String,
        bytes: u64,
    ) -> Result<(), CudaError> {
        let Some(i) = started else { return Ok(()) };
        self.events[2 * i + 1]
            .record(stream)
            .map_err(CudaError::driver)?;
        self.pending[i] = Pending {
            label: label(),
            bytes,
        };
        Ok(())
    }

    /// Adds the finished step's launches to the totals (the stream has been synchronised).
    pub fn end_step(&mut self) -> Result<(), CudaError> {
        for (i, p) in self.pending.drain(..).enumerate() {
            let ms = self.events[2 * i]
                .elapsed_ms(&self.events[2 * i + 1])
                .map_err(CudaError::driver)?;
            let t = self.totals.entry(p.label).or_default();
            t.calls += 1;
            t.ms += f64::from(ms);
            t.bytes += p.bytes;
        }
        Ok(())
    }

    /// The table, costliest first.
    pub fn report(&self) -> String {
        report(&self.totals)
    }
}

impl Drop for Profiler {
    fn drop(&mut self) {
        if self.enabled && !self.totals.is_empty() {
            eprintln!("{}", self.report());
        }
    }
}

fn report(totals: &HashMap<String, Total>) -> String {
    let all: f64 = totals.values().map(|t| t.ms).sum();
    let mut rows: Vec<(&String, &Total)> = totals.iter().collect();
    rows.sort_by(|a, b| b.1.ms.total_cmp(&a.1.ms).then(a.0.cmp(b.0)));
    let mut out = format!(
        "CUDA profile (FALLOW_CUDA_DEBUG=profile), {all:.1} ms of GPU time\n{:<40} {:>8} {:>10} {:>10} {:>7} {:>9}\n",
        "launch", "calls", "total ms", "mean µs", "share", "GB/s"
    );
    for (label, t) in rows {
        let bandwidth = if t.bytes > 0 && t.ms > 0.0 {
            format!("{:.0}", t.bytes as f64 / (t.ms * 1e-3) / 1e9)
        } else {
            "-".into()
        };
        out.push_str(&format!(
            "{:<40} {:>8} {:>10.2} {:>10.1} {:>6.1}% {:>9}\n",
            label,
            t.calls,
            t.ms,
            t.ms * 1e3 / t.calls.max(1) as f64,
            100.0 * t.ms / all.max(1e-12),
            bandwidth
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_lists_the_costliest_launches_first_with_their_bandwidth() {
        let mut totals = HashMap::new();
        totals.insert(
            "gemm down n=1".to_string(),
            Total {
                calls: 10,
                ms: 3.0,
                bytes: 12_000_000_000,
            },
        );
        totals.insert(
            "paged_attention n=1".to_string(),
            Total {
                calls: 10,
                ms: 1.0,
                bytes: 0,
            },
        );
        let text = report(&totals);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].contains("4.0 ms of GPU time"), "{text}");
        assert!(lines[2].starts_with("gemm down n=1"), "{text}");
        // 12 GB in 3 ms: 4000 GB/s; 3 ms over 10 calls: 300 µs; 75 % of the time.
        assert!(
            lines[2].contains("4000") && lines[2].contains("300.0"),
            "{text}"
        );
        assert!(lines[2].contains("75.0%"), "{text}");
        assert!(lines[3].starts_with("paged_attention") && lines[3].ends_with('-'));
    }
}
