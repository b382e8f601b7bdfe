//! How the backend launches its own kernels: `cuLaunchKernelEx` on the backend's stream,
//! with programmatic dependent launch ("early start") where the device has it (sm_90 and
//! newer). A decode step of one sequence is a few hundred short kernels; launched plainly,
//! each waits for the one before it to drain completely, and the GPU idles in every gap.
//! With an early start the next kernel's blocks take the SMs the previous kernel's last blocks
//! free, request what they can ahead (the GEMV's first weight tile) and wait in
//! `grid_dependency_sync()` (kernels.cu) until the previous grid's writes are visible. Every
//! kernel calls that first in every thread; the emulator tests check it. CUDA graphs capture
//! the dependency as a programmatic edge. `FALLOW_CUDA_DEBUG=no-early-start` launches plainly.

use std::ffi::c_void;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cudarc::driver::sys::{
    self, CUlaunchAttribute, CUlaunchAttributeID, CUlaunchAttributeValue, CUlaunchConfig,
};
use cudarc::driver::{CudaStream, DeviceRepr, LaunchConfig};

use super::kernels::Kernels;
use super::params::KernelParams;
use super::CudaError;

/// The by-value arguments of one launch, each borrowed until the launch
/// (`cuLaunchKernelEx` reads them through these addresses).
pub struct KernelArgs<'a> {
    params: Vec<*mut c_void>,
    /// Each argument's size in bytes (checked against the kernel's parameters).
    sizes: Vec<usize>,
    _values: PhantomData<&'a ()>,
}

impl<'a> KernelArgs<'a> {
    pub fn new() -> Self {
        KernelArgs {
            params: Vec::with_capacity(24),
            sizes: Vec::with_capacity(24),
            _values: PhantomData,
        }
    }

    /// Each argument's size in bytes, in order.
    #[cfg(test)]
    pub fn sizes(&self) -> &[usize] {
        &self.sizes
    }

    /// Appends an argument: a device address (`u64`), an `i32`, an `f32`, ….
    pub fn arg<T: DeviceRepr>(&mut self, value: &'a T) -> &mut Self {
        self.params.push(value as *const T as *mut c_void);
        self.sizes.push(std::mem::size_of::<T>());
        self
    }
}

/// Launches kernels of one device on one stream. Clones share the early-start switch.
#[derive(Clone)]
pub struct Launcher {
    kernels: Arc<Kernels>,
    stream: Arc<CudaStream>,
    early_start: Arc<AtomicBool>,
    /// Compute capability's major number.
    major: i32,
}

impl Launcher {
    /// With early starts where a device of compute capability `major` has them.
    pub fn new(kernels: Arc<Kernels>, stream: Arc<CudaStream>, major: i32) -> Self {
        Launcher {
            kernels,
            stream,
            early_start: Arc::new(AtomicBool::new(supports_early_start(major))),
            major,
        }
    }

    pub fn early_start(&self) -> bool {
        self.early_start.load(Ordering::Relaxed)
    }

    /// Turns early starts off (or back on: only where the device has them), for this
    /// launcher and its clones.
    pub fn set_early_start(&self, enabled: bool) {
        let on = enabled && supports_early_start(self.major);
        self.early_start.store(on, Ordering::Relaxed);
    }

    /// Whether a block of `threads` threads of kernel `name` can launch on this device (the
    /// driver's compile of it leaves registers for that many).
    pub fn fits(&self, name: &str, threads: u32) -> bool {
        threads <= self.kernels.max_threads(name)
    }

    /// Launches kernel `name` with `params`, its parameter struct ([`super::params`]).
    ///
    /// # Safety
    /// As [`Launcher::launch`]: every address in `params` points to device memory the kernel
    /// may read or write as sized for this launch.
    pub unsafe fn launch_params<P: KernelParams>(
        &self,
        name: &str,
        cfg: LaunchConfig,
        params: &P,
    ) -> Result<(), CudaError> {
        let mut args = KernelArgs::new();
        params.push(&mut args);
        // SAFETY: the caller's contract; the struct mirrors the kernel's signature.
        unsafe { self.launch(name, cfg, &mut args) }
    }

    /// Launches kernel `name` (one of [`super::kernels::NAMES`]) with `args`. A driver that
    /// refuses an early start gets the launch again without it, and no early starts after.
    ///
    /// # Safety
    /// `args` is the kernel's parameter list, in order and by type, and every address in it
    /// points to device memory the kernel may read or write as sized for this launch.
    pub unsafe fn launch(
        &self,
        name: &str,
        cfg: LaunchConfig,
        args: &mut KernelArgs<'_>,
    ) -> Result<(), CudaError> {
        let parameters = self.kernels.parameters(name);
        if args.sizes != parameters {
            return Err(CudaError::Failure(format!(
                "kernel {name}: launched with arguments of {:?} bytes, but it takes {parameters:?}",
                args.sizes
            )));
        }
        let threads = cfg.block_dim.0 * cfg.block_dim.1 * cfg.block_dim.2;
        if !self.fits(name, threads) {
            return Err(CudaError::Failure(format!(
                "kernel {name}: blocks of {threads} threads, but this GPU's compile of it \
                 allows at most {} (registers per thread × threads exceed the SM's)",
                self.kernels.max_threads(name)
            )));
        }
        let early = self.early_start();
        // SAFETY: the caller's contract, passed on.
        let launched = unsafe { self.launch_with(name, cfg, args, early) };
        match launched {
            Err(e) if early => {
                tracing::warn!(kernel = name, error = %e, "early-start launch refused; launching plainly from now on");
                self.set_early_start(false);
                // SAFETY: as above.
                unsafe { self.launch_with(name, cfg, args, false) }
            }
            other => other,
        }
    }

    /// # Safety
    /// As [`Launcher::launch`].
    unsafe fn launch_with(
        &self,
        name: &str,
        cfg: LaunchConfig,
        args: &mut KernelArgs<'_>,
        early_start: bool,
    ) -> Result<(), CudaError> {
        let function = self.kernels.get(name).cu_function();
        let mut attributes = launch_attributes(early_start);
        let config = CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: self.stream.cu_stream(),
            attrs: attributes.as_mut_ptr(),
            numAttrs: attributes.len() as u32,
        };
        self.stream
            .context()
            .bind_to_thread()
            .map_err(CudaError::driver)?;
        // SAFETY: `config` and `attributes` live across the call; the caller vouches for the
        // parameter list, which `cuLaunchKernelEx` copies before returning.
        unsafe {
            sys::cuLaunchKernelEx(
                &config,
                function,
                args.params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
        .map_err(|e| CudaError::Failure(format!("kernel {name}: {e}")))
    }
}

/// Programmatic dependent launch came with Hopper (sm_90).
pub fn supports_early_start(major: i32) -> bool {
    major >= 9
}

/// The attributes of one launch: with `early_start`, "may overlap the previous kernel on the
/// stream" (`CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`).
fn launch_attributes(early_start: bool) -> Vec<CUlaunchAttribute> {
    if !early_start {
        return Vec::new();
    }
    // SAFETY: an all-zero attribute value is a valid (plain data) union.
    let mut value: CUlaunchAttributeValue = unsafe { std::mem::zeroed() };
    value.programmaticStreamSerializationAllowed = 1;
    vec![CUlaunchAttribute {
        id: CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
        pad: [0; 4],
        value,
    }]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_args_record_each_arguments_size_for_the_launchers_check() {
        let (address, count, scale) = (7u64, 3i32, 0.5f32);
        let mut args = KernelArgs::new();
        args.arg(&address).arg(&count).arg(&scale);
        assert_eq!(args.sizes, [8, 4, 4]);
        assert_eq!(args.params.len(), 3);
    }

    #[test]
    fn early_start_is_on_from_hopper() {
        assert!(!supports_early_start(8), "Ampere has no PDL");
        assert!(supports_early_start(9));
        assert!(supports_early_start(10));
    }

    #[test]
    fn an_early_start_launch_carries_the_programmatic_serialization_attribute() {
        assert!(launch_attributes(false).is_empty());
        let attributes = launch_attributes(true);
        assert_eq!(attributes.len(), 1);
        assert_eq!(
            attributes[0].id,
            CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        );
        // SAFETY: the field this attribute id selects.
        assert_eq!(
            unsafe { attributes[0].value.programmaticStreamSerializationAllowed },
            1
        );
    }
}
