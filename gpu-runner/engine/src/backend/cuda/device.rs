//! Finding a CUDA device: whether the driver library loads at all (the binary is built with
//! dynamic loading, so it runs on machines without CUDA), and what the device is.

use std::sync::Arc;

use cudarc::driver::CudaContext;

use super::CudaError;

/// The name the emulated CUDA driver gives its device (emulated_driver.cpp's
/// `cuDeviceGetName`): the kernels run on the CPU there (tests only).
pub const EMULATED_DEVICE: &str = "Fallow emulated GPU (CPU)";

/// Whether `ctx` is the emulated driver's device, whose launch times are the CPU's.
pub fn is_emulated(ctx: &CudaContext) -> bool {
    ctx.name().is_ok_and(|name| name == EMULATED_DEVICE)
}

/// What an operator (and the runner registry) wants to know about a device.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    pub compute_capability: (i32, i32),
    pub total_bytes: usize,
    pub free_bytes: usize,
}

impl std::fmt::Display for DeviceInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cuda:{} {} (sm_{}{}, {:.1} GiB, {:.1} GiB free)",
            self.ordinal,
            self.name,
            self.compute_capability.0,
            self.compute_capability.1,
            self.total_bytes as f64 / (1u64 << 30) as f64,
            self.free_bytes as f64 / (1u64 << 30) as f64
        )
    }
}

/// Whether `libcuda` can be loaded (false on machines without an NVIDIA driver).
pub fn driver_available() -> bool {
    // SAFETY: only probes dlopen; no driver function is called.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Opens device `ordinal`'s primary context, with an error that says why not instead of
/// cudarc's panic when there is no driver.
pub fn open(ordinal: usize) -> Result<Arc<CudaContext>, CudaError> {
    if !driver_available() {
        return Err(CudaError::NoDevice(
            "no NVIDIA driver (libcuda.so) on this machine".into(),
        ));
    }
    let count = CudaContext::device_count().map_err(CudaError::driver)?;
    if ordinal >= count.max(0) as usize {
        return Err(CudaError::NoDevice(format!(
            "CUDA device {ordinal} requested, {count} present"
        )));
    }
    let ctx = CudaContext::new(ordinal).map_err(CudaError::driver)?;
    // One stream per backend orders everything; per-buffer events would only add overhead.
    // SAFETY: the backend never shares a buffer between streams.
    unsafe { ctx.disable_event_tracking() };
    Ok(ctx)
}

/// Every CUDA device the driver reports; empty without a driver.
pub fn probe_all() -> Result<Vec<DeviceInfo>, CudaError> {
    if !driver_available() {
        return Ok(Vec::new());
    }
    let count = CudaContext::device_count().map_err(CudaError::driver)?;
    (0..count.max(0) as usize).map(probe).collect()
}

/// Describes device `ordinal`.
pub fn probe(ordinal: usize) -> Result<DeviceInfo, CudaError> {
    let ctx = open(ordinal)?;
    describe(&ctx)
}

pub fn describe(ctx: &Arc<CudaContext>) -> Result<DeviceInfo, CudaError> {
    let (free_bytes, total_bytes) = ctx.mem_get_info().map_err(CudaError::driver)?;
    Ok(DeviceInfo {
        ordinal: ctx.ordinal(),
        name: ctx.name().map_err(CudaError::driver)?,
        compute_capability: ctx.compute_capability().map_err(CudaError::driver)?,
        total_bytes,
        free_bytes,
    })
}
