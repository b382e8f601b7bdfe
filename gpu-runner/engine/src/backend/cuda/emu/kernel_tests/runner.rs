//! Where the kernel tests' launches run. By default on the [`Emulator`] (the kernels compiled
//! as C++, every buffer against a guard page, the checks `emulator.rs` lists). With
//! `FALLOW_KERNEL_TESTS=driver` they go through the CUDA driver API the way the backend
//! launches its kernels (NVRTC's PTX, [`Launcher`], device buffers copied in and out): on a
//! GPU where its driver is present, so that each kernel meets its plain reference on the
//! hardware, not only in the emulator (gpu-check.sh runs them so, and a kernel the GPU
//! computes wrongly is named by its own test rather than by a drift in a model's logits);
//! elsewhere on the emulated driver, which checks this path's copies and launches on
//! machines without one (the test command runs them so). In a process that takes the
//! emulated driver nothing else may open the CUDA driver: run only these tests with it
//! (`cargo test -p fallow-runner --lib cuda::kernel_tests`).

use std::sync::{Arc, OnceLock};

use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{CudaStream, LaunchConfig};

use crate::backend::cuda::buffer::DeviceBuf;
use crate::backend::cuda::emu::{self, Arg, Emulator};
use crate::backend::cuda::kernels::{self, Kernels};
use crate::backend::cuda::launch::{KernelArgs, Launcher};
use crate::backend::cuda::{device, CudaError, CudaOptions};

/// The dynamic shared memory a block may have without opting in to more: what the
/// emulator gives every block, and the most the backend's launches ask for (static and
/// dynamic together; `kernels.rs` checks each kernel's fit).
const DYNAMIC_SHARED_BYTES: u32 = 48 * 1024;

/// Runs a test's kernel launches.
pub(in crate::backend::cuda) enum Runner {
    Emulator(&'static Emulator),
    Driver(DriverRunner),
}

impl Runner {
    /// The runner `FALLOW_KERNEL_TESTS` asks for (`emulator`, the default, or `driver`),
    /// made once per process; `None` (the test passes, skipped, with the reason printed)
    /// where it cannot run here: no C++ compiler for the emulator, or neither a driver nor
    /// NVRTC and a compiler for the emulated one.
    pub(in crate::backend::cuda) fn get() -> Option<&'static Runner> {
        static RUNNER: OnceLock<Option<Runner>> = OnceLock::new();
        RUNNER
            .get_or_init(|| match std::env::var("FALLOW_KERNEL_TESTS").as_deref() {
                Err(_) | Ok("" | "emulator") => Emulator::get().map(Runner::Emulator),
                Ok("driver") => DriverRunner::open().map(Runner::Driver),
                Ok(other) => {
                    panic!("FALLOW_KERNEL_TESTS={other}: expected `emulator` or `driver`")
                }
            })
            .as_ref()
    }

    /// Runs kernel `name` over `grid` blocks of `threads` threads on `args` (host buffers
    /// stand for device ones: read by the kernel, and what it wrote copied back); panics
    /// with the kernel's name where the launch or the kernel fails.
    pub(in crate::backend::cuda) fn launch(
        &self,
        name: &str,
        grid: (u32, u32, u32),
        threads: u32,
        args: &[Arg],
    ) {
        match self {
            Runner::Emulator(emulator) => emulator.launch(name, grid, threads, args),
            Runner::Driver(driver) => driver
                .launch(name, grid, threads, args)
                .unwrap_or_else(|e| panic!("kernel {name} on {}: {e}", driver.device)),
        }
    }
}

/// Kernel launches through the CUDA driver API, on one stream of device 0.
pub(in crate::backend::cuda) struct DriverRunner {
    stream: Arc<CudaStream>,
    kernels: Arc<Kernels>,
    launcher: Launcher,
    /// What the launches run on, for messages.
    device: String,
}

/// A by-value argument as the launch passes it (each borrowed by [`KernelArgs`]).
enum Value {
    Address(u64),
    I32(i32),
    F32(f32),
    I64(i64),
}

impl DriverRunner {
    /// Device 0 of the GPU's driver, or where there is none the emulated driver (installed
    /// into this process); `None`, with the reason printed, where neither can run.
    fn open() -> Option<DriverRunner> {
        let device = if device::driver_available() {
            "the GPU"
        } else if !kernels::nvrtc_available() {
            fallow_protocol::testing::skip_for_want_of(
                "NVRTC for the emulated driver's PTX (no NVIDIA driver)",
            );
            return None;
        } else {
            match emu::install_driver() {
                Ok(true) => "the emulated driver",
                Ok(false) => {
                    fallow_protocol::testing::skip_for_want_of(
                        "a C++ compiler to emulate a CUDA driver (no NVIDIA driver)",
                    );
                    return None;
                }
                Err(e) => panic!("emulated CUDA driver: {e}"),
            }
        };
        match Self::on_device_0() {
            Ok(runner) => {
                eprintln!(
                    "kernel tests through the CUDA driver API on {device}: {}",
                    runner.device
                );
                Some(runner)
            }
            Err(e) => panic!("kernel tests on {device}: {e}"),
        }
    }

    fn on_device_0() -> Result<DriverRunner, CudaError> {
        let ctx = device::open(0)?;
        let info = device::describe(&ctx)?;
        let stream = ctx.new_stream().map_err(CudaError::driver)?;
        // The suite's edge: where its process keeps compiled kernels.
        let cache = CudaOptions::kernel_cache_from_vars(&|name| std::env::var_os(name));
        let kernels = Kernels::for_device(&ctx, cache.as_deref()).map_err(CudaError::Failure)?;
        let (major, _) = ctx.compute_capability().map_err(CudaError::driver)?;
        let launcher = Launcher::new(Arc::clone(&kernels), Arc::clone(&stream), major);
        Ok(DriverRunner {
            stream,
            kernels,
            launcher,
            device: info.to_string(),
        })
    }

    fn launch(
        &self,
        name: &str,
        grid: (u32, u32, u32),
        threads: u32,
        args: &[Arg],
    ) -> Result<(), CudaError> {
        let mut buffers = Vec::new();
        let mut values = Vec::with_capacity(args.len());
        for arg in args {
            values.push(match *arg {
                Arg::Buf { ptr, bytes } => {
                    // SAFETY: `Arg::buf` made it from a live slice of `bytes` the test holds.
                    let host = unsafe { std::slice::from_raw_parts(ptr as *const u8, bytes) };
                    let buffer = DeviceBuf::from_host(&self.stream, host)?;
                    let address = buffer.ptr();
                    buffers.push((ptr, bytes, buffer));
                    Value::Address(address)
                }
                Arg::Ptr(0) => Value::Address(0),
                Arg::Ptr(p) => {
                    return Err(CudaError::Failure(format!(
                        "argument {p:#x} is a raw host address; pass buffers as Arg::buf"
                    )))
                }
                Arg::I32(v) => Value::I32(v),
                Arg::F32(v) => Value::F32(v),
                Arg::I64(v) => Value::I64(v),
            });
        }
        let mut kernel_args = KernelArgs::new();
        for value in &values {
            match value {
                Value::Address(v) => kernel_args.arg(v),
                Value::I32(v) => kernel_args.arg(v),
                Value::F32(v) => kernel_args.arg(v),
                Value::I64(v) => kernel_args.arg(v),
            };
        }
        let cfg = LaunchConfig {
            grid_dim: grid,
            block_dim: (threads, 1, 1),
            shared_mem_bytes: self.dynamic_shared_bytes(name)?,
        };
        // SAFETY: the argument list is the test's, checked against the kernel's parameters
        // by the launcher; every address is a device copy of the buffer the test sized for
        // this launch, as the emulator's contract has it.
        unsafe { self.launcher.launch(name, cfg, &mut kernel_args) }?;
        self.stream.synchronize().map_err(CudaError::driver)?;
        for (ptr, bytes, buffer) in buffers.iter().filter(|(_, bytes, _)| *bytes > 0) {
            let back = buffer.read(&self.stream, *bytes)?;
            // SAFETY: as above; the test's slice is not otherwise touched during the launch.
            let host = unsafe { std::slice::from_raw_parts_mut(*ptr as *mut u8, *bytes) };
            host.copy_from_slice(&back[..*bytes]);
        }
        Ok(())
    }

    /// As much dynamic shared memory as the emulator gives a block, less the kernel's
    /// static shared memory (which counts against the same 48 KiB).
    fn dynamic_shared_bytes(&self, name: &str) -> Result<u32, CudaError> {
        let fixed = self
            .kernels
            .get(name)
            .get_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)
            .map_err(CudaError::driver)?;
        Ok(DYNAMIC_SHARED_BYTES.saturating_sub(u32::try_from(fixed).unwrap_or(0)))
    }
}
