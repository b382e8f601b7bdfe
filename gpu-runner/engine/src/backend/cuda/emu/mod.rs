//! The CUDA kernels run on the CPU, for tests on machines without a GPU. The kernel sources
//! ([`super::kernels::SOURCE`]) are compiled unchanged as C++ with `emulator.hpp` (thread and block indices, barriers, warp
//! shuffles, shared memory; see its header) into a shared library, and each kernel is called
//! with a grid and an argument list as `cuLaunchKernel` would be, on host buffers.
//!
//! Every buffer argument is copied into its own mapping that ends at a guard page (and copied
//! back after the launch), so a kernel that reads or writes past a buffer's end crashes the
//! test with the kernel's name instead of reading a neighbour's memory; and the library is
//! built with an alignment check, so a vector load or store at an address not aligned to its
//! type (a "misaligned address" fault on a GPU, unnoticed on x86) stops the test too.
//!
//! This checks a kernel's arithmetic and indexing against a plain reference. It also fails a
//! launch on what is undefined on a GPU but would pass here by chance: arguments whose sizes
//! differ from the kernel's parameters (each is read from an 8-byte slot), a thread that never
//! waits for the previous kernel (`grid_dependency_sync`), a warp-wide operation after lanes
//! of the warp returned, threads of a block meeting at different `__syncthreads`; and it
//! varies the order in which it runs threads (every other block in reverse) and blocks
//! (every other launch last to first), and fills dynamic shared memory with NaNs before each
//! block, so that a missing barrier, a dependence on block order or a read of shared memory
//! the block did not write shows as a wrong result. It says nothing of speed or memory
//! coalescing, nor of races no order it tries exposes. The GPU conformance suite
//! (`tests/cuda_conformance.rs`) is the real check.

#[cfg(test)]
mod kernel_tests;

use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use super::kernels::{fnv1a, NAMES, SOURCE};

const PRELUDE: &str = include_str!("emulator.hpp");
const DRIVER: &str = include_str!("emulated_driver.cpp");

/// One by-value kernel argument, as the backend's `launch!` passes them.
#[derive(Clone, Copy, Debug)]
pub enum Arg {
    /// A raw address (0 for a null pointer).
    Ptr(u64),
    /// A host buffer standing for a device buffer: `bytes` at `ptr`.
    Buf {
        ptr: u64,
        bytes: usize,
    },
    I32(i32),
    F32(f32),
    I64(i64),
}

impl Arg {
    /// A host buffer standing for a device buffer.
    pub fn buf<T>(v: &mut [T]) -> Arg {
        Arg::Buf {
            ptr: v.as_mut_ptr() as u64,
            bytes: std::mem::size_of_val(v),
        }
    }

    /// Bytes of the kernel parameter this argument stands for.
    fn size(self) -> usize {
        match self {
            Arg::Ptr(_) | Arg::Buf { .. } | Arg::I64(_) => 8,
            Arg::I32(_) | Arg::F32(_) => 4,
        }
    }

    fn bits(self) -> u64 {
        match self {
            Arg::Ptr(p) | Arg::Buf { ptr: p, .. } => p,
            Arg::I32(v) => v as u32 as u64,
            Arg::F32(v) => v.to_bits() as u64,
            Arg::I64(v) => v as u64,
        }
    }
}

/// A copy of a buffer in a mapping whose next page is inaccessible, the copy's last byte
/// right before it.
struct Guarded {
    base: *mut libc::c_void,
    map_len: usize,
    data: *mut u8,
    bytes: usize,
}

impl Guarded {
    fn copy_of(src: u64, bytes: usize) -> Guarded {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
        let body = bytes.next_multiple_of(page).max(page);
        let map_len = body + page;
        // SAFETY: a fresh private anonymous mapping; checked below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert!(base != libc::MAP_FAILED, "mmap of a guarded buffer failed");
        // SAFETY: the last page is inside the mapping just made.
        let guarded =
            unsafe { libc::mprotect(base.cast::<u8>().add(body).cast(), page, libc::PROT_NONE) };
        assert_eq!(guarded, 0, "mprotect of the guard page failed");
        // Flush against the guard page: `body` is page-aligned, so the copy stays aligned to
        // the largest power of two dividing its size (at least its element's alignment, and
        // 16 for the buffers kernels read 16 bytes at a time).
        let start = body - bytes;
        // SAFETY: `start + bytes <= body`: inside the accessible part of the mapping.
        let data = unsafe { base.cast::<u8>().add(start) };
        if bytes > 0 {
            // SAFETY: `src` is a live buffer of `bytes` (from `Arg::buf`), `data` has room.
            unsafe { std::ptr::copy_nonoverlapping(src as *const u8, data, bytes) };
        }
        Guarded {
            base,
            map_len,
            data,
            bytes,
        }
    }

    fn copy_back(&self, dst: u64) {
        if self.bytes > 0 {
            // SAFETY: as in `copy_of`, the other way.
            unsafe { std::ptr::copy_nonoverlapping(self.data, dst as *mut u8, self.bytes) };
        }
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `copy_of`, unmapped once.
        unsafe { libc::munmap(self.base, self.map_len) };
    }
}

/// The kernel running now, for the crash message (the emulator runs one launch at a time).
static RUNNING: std::sync::Mutex<[u8; 64]> = std::sync::Mutex::new([0; 64]);

/// Reports a guard-page hit (or the alignment check's trap) with the kernel's name, then dies.
extern "C" fn on_fault(_: libc::c_int) {
    let name = RUNNING.try_lock().map(|n| *n).unwrap_or([b'?'; 64]);
    let len = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    let prefix: &[u8] = if len == 0 {
        b"\nfatal signal outside any emulated CUDA kernel"
    } else {
        b"\nemulated CUDA kernel failed (memory outside its buffers, or a vector at a misaligned address): "
    };
    // SAFETY: write(2) and _exit(2) are async-signal-safe; the buffers are live.
    unsafe {
        libc::write(2, prefix.as_ptr().cast(), prefix.len());
        libc::write(2, name.as_ptr().cast(), len);
        libc::write(2, b"\n".as_ptr().cast(), 1);
        libc::_exit(139);
    }
}

type LaunchFn = unsafe extern "C" fn(*const u32, *const u32, *const *mut c_void) -> i32;
type ParamsFn = unsafe extern "C" fn(*mut u32, i32) -> i32;

pub struct Emulator {
    kernels: HashMap<&'static str, LaunchFn>,
    /// Each kernel's parameter sizes in bytes, as its C++ signature declares them.
    parameters: HashMap<&'static str, Vec<usize>>,
}

// SAFETY: the library's launch functions serialise themselves (a mutex in `emu::run`).
unsafe impl Sync for Emulator {}
unsafe impl Send for Emulator {}

impl Emulator {
    /// The emulated kernels, built on first use; `None` (with the reason printed, for the
    /// test to skip) where no C++ compiler is found. A compiler that rejects the kernels
    /// fails the test.
    pub fn get() -> Option<&'static Emulator> {
        static EMULATOR: OnceLock<Result<Option<Emulator>, String>> = OnceLock::new();
        match EMULATOR.get_or_init(build) {
            Ok(Some(e)) => Some(e),
            Ok(None) => None,
            Err(why) => panic!("kernel emulator: {why}"),
        }
    }

    /// Runs kernel `name` over `grid` blocks of `threads` threads.
    pub fn launch(&self, name: &str, grid: (u32, u32, u32), threads: u32, args: &[Arg]) {
        let f = self
            .kernels
            .get(name)
            .unwrap_or_else(|| panic!("kernel {name} is not in kernels::NAMES"));
        // Each argument is read at the parameter's size from an 8-byte slot: a list that does
        // not match the signature would read neighbours or garbage rather than fail.
        let sizes: Vec<usize> = args.iter().map(|a| a.size()).collect();
        assert_eq!(
            sizes, self.parameters[name],
            "kernel {name}: the arguments' sizes differ from its parameters'"
        );
        // One launch at a time (the C++ side runs them so anyway): the crash message names
        // the right kernel.
        static LAUNCH: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one = LAUNCH
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Ok(mut running) = RUNNING.lock() {
            *running = [0; 64];
            let n = name.len().min(63);
            running[..n].copy_from_slice(&name.as_bytes()[..n]);
        }
        let guarded: Vec<Option<Guarded>> = args
            .iter()
            .map(|a| match *a {
                Arg::Buf { ptr, bytes } => Some(Guarded::copy_of(ptr, bytes)),
                _ => None,
            })
            .collect();
        let mut values: Vec<u64> = args
            .iter()
            .zip(&guarded)
            .map(|(a, g)| g.as_ref().map_or(a.bits(), |g| g.data as u64))
            .collect();
        let pointers: Vec<*mut c_void> = values
            .iter_mut()
            .map(|v| v as *mut u64 as *mut c_void)
            .collect();
        let grid = [grid.0, grid.1, grid.2];
        let block = [threads, 1, 1];
        // SAFETY: `f` was resolved from the library built from the kernel sources; the caller
        // passes the kernel's argument list, every buffer a guarded copy of a live host buffer
        // (the same contract as a device launch; past its end is a guard page).
        let rc = unsafe { f(grid.as_ptr(), block.as_ptr(), pointers.as_ptr()) };
        assert_ne!(
            rc, 2,
            "kernel {name}: a thread did not call grid_dependency_sync(), so with an early \
             start it could read or write before the previous kernel finished"
        );
        assert_ne!(
            rc, 3,
            "kernel {name}: a warp-wide operation (full-mask shuffle, __syncwarp, mma) ran \
             after lanes of its warp had returned; on a GPU that is undefined"
        );
        assert_ne!(
            rc, 4,
            "kernel {name}: threads of a block met at different __syncthreads (a barrier in \
             code only some of the block's threads take); on a GPU that is undefined"
        );
        assert_eq!(
            rc, 0,
            "kernel {name}: bad launch shape {grid:?} x {threads}"
        );
        for (a, g) in args.iter().zip(&guarded) {
            if let (Arg::Buf { ptr, .. }, Some(g)) = (a, g) {
                g.copy_back(*ptr);
            }
        }
        if let Ok(mut running) = RUNNING.lock() {
            *running = [0; 64];
        }
    }
}

/// Compiles the kernel sources with the prelude into a shared library (cached by content in the
/// temporary directory) and resolves one launcher per kernel; `None` without a compiler.
fn build() -> Result<Option<Emulator>, String> {
    let source = kernels_source();
    let Some(compiler) = compiler() else {
        return Ok(None);
    };
    let dir = build_dir()?;
    let hash = build_hash(&source, &compiler);
    let lib = dir.join(format!("kernels-{hash:016x}.so"));
    if !lib.exists() {
        compile(&compiler, &source, &lib, &[])?;
    }
    let path = CString::new(lib.to_string_lossy().as_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: loading a library we just built; it has no initialisers beyond the C++ runtime.
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        return Err(format!("dlopen {} failed", lib.display()));
    }
    // SAFETY: installs a handler for faults, which in this test process only the guard
    // pages of emulated launches raise on purpose.
    unsafe {
        let handler: extern "C" fn(libc::c_int) = on_fault;
        libc::signal(libc::SIGSEGV, handler as libc::sighandler_t);
        libc::signal(libc::SIGBUS, handler as libc::sighandler_t);
        // The alignment check traps (an illegal instruction): name the kernel too.
        libc::signal(libc::SIGILL, handler as libc::sighandler_t);
    }
    let mut kernels = HashMap::new();
    let mut parameters = HashMap::new();
    for name in NAMES {
        let symbol = CString::new(format!("fallow_emu_{name}")).map_err(|e| e.to_string())?;
        // SAFETY: `handle` is a live library handle (never closed).
        let f = unsafe { libc::dlsym(handle, symbol.as_ptr()) };
        if f.is_null() {
            return Err(format!("{} has no launcher for {name}", lib.display()));
        }
        // SAFETY: FALLOW_EMU_EXPORT defines every launcher with exactly this signature.
        kernels.insert(name, unsafe {
            std::mem::transmute::<*mut c_void, LaunchFn>(f)
        });
        let symbol =
            CString::new(format!("fallow_emu_params_{name}")).map_err(|e| e.to_string())?;
        // SAFETY: as above.
        let p = unsafe { libc::dlsym(handle, symbol.as_ptr()) };
        if p.is_null() {
            return Err(format!(
                "{} has no parameter list for {name}",
                lib.display()
            ));
        }
        // SAFETY: FALLOW_EMU_EXPORT defines it with exactly this signature.
        let params = unsafe { std::mem::transmute::<*mut c_void, ParamsFn>(p) };
        let mut sizes = [0u32; 64];
        // SAFETY: `sizes` has room for the 64 it may write.
        let count = unsafe { params(sizes.as_mut_ptr(), sizes.len() as i32) } as usize;
        parameters.insert(
            name,
            sizes[..count.min(64)].iter().map(|&s| s as usize).collect(),
        );
    }
    Ok(Some(Emulator {
        kernels,
        parameters,
    }))
}

/// How the libraries are compiled. For this machine's vector units (the libraries are built
/// where they run), but with no multiply-add contracted into an FMA, so that a kernel rounds
/// as its source says (the GPU build contracts as nvcc does; the kernels spell out the
/// roundings that matter, `__fadd_rn` / `__fmaf_rn`). The alignment check (UBSan's, trapping:
/// no runtime library needed) stops a kernel that reads or writes a vector type at an address
/// not aligned to it — on a GPU a "misaligned address" fault, on x86 silently fine.
const FLAGS: [&str; 10] = [
    "-std=c++20",
    "-O2",
    "-march=native",
    "-ffp-contract=off",
    "-shared",
    "-fPIC",
    "-pthread",
    "-w",
    "-fsanitize=alignment",
    "-fsanitize-undefined-trap-on-error",
];

/// A built library's cache key: its source, the compiler, the flags and the CPU's features
/// (`-march=native`: a library built on another CPU may use instructions this one lacks).
fn build_hash(source: &str, compiler: &str) -> u64 {
    let cpu = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let features = cpu
        .lines()
        .find(|l| l.starts_with("flags") || l.starts_with("Features"))
        .unwrap_or_default();
    fnv1a(source.as_bytes())
        ^ fnv1a(compiler.as_bytes()).rotate_left(1)
        ^ fnv1a(FLAGS.concat().as_bytes()).rotate_left(2)
        ^ fnv1a(features.as_bytes()).rotate_left(3)
}

/// The prelude, the kernels and one exported launcher per kernel.
fn kernels_source() -> String {
    let mut source = String::from("#line 1 \"emulator.hpp\"\n");
    source.push_str(PRELUDE);
    source.push_str(
        "\n#line 1 \"kernels (kernels.cu + attention.cu + prefill_mma.cu + gemv_mma.cu + pick.cu + quant.cu)\"\n",
    );
    source.push_str(SOURCE);
    source.push('\n');
    for name in NAMES {
        source.push_str(&format!("FALLOW_EMU_EXPORT({name})\n"));
    }
    source
}

/// The C++ compiler (`CXX`, else `g++`); `None`, with the reason printed, where there is none.
fn compiler() -> Option<String> {
    let compiler = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
    if Command::new(&compiler).arg("--version").output().is_err() {
        fallow_protocol::testing::skip_for_want_of(&format!(
            "a C++ compiler ({compiler}) to emulate the CUDA kernels with"
        ));
        return None;
    }
    Some(compiler)
}

/// Where the built libraries are cached (by the hash of their source).
fn build_dir() -> Result<PathBuf, String> {
    let dir = std::env::temp_dir().join("fallow-kernel-emulator");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(dir)
}

/// Loads the emulated CUDA driver (`emulated_driver.cpp` over the kernels) as this process's
/// `libcuda.so`, and its cuBLAS part as `libcublas.so`, so that the CUDA backend runs whole on
/// the CPU: cudarc opens the driver by those names, and the dynamic loader answers with a
/// library already loaded under that name. Call it before anything opens the CUDA driver,
/// and only in a process without a real one (its name would be taken). Returns `false` where
/// no C++ compiler is found; loading it twice is harmless.
pub fn install_driver() -> Result<bool, String> {
    static INSTALLED: OnceLock<Result<bool, String>> = OnceLock::new();
    INSTALLED.get_or_init(load_driver).clone()
}

fn load_driver() -> Result<bool, String> {
    let Some(libraries) = driver_libraries()? else {
        return Ok(false);
    };
    for lib in &libraries {
        let path = CString::new(lib.to_string_lossy().as_bytes()).map_err(|e| e.to_string())?;
        // SAFETY: a library built from our sources; global, so that the cuBLAS name's
        // dependency resolves to the driver already loaded.
        let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
        if handle.is_null() {
            return Err(format!("dlopen {} failed", lib.display()));
        }
    }
    Ok(true)
}

/// The emulated driver's two files, `libcuda.so` and its cuBLAS name
/// `libcublas.so`, built if they are not (cached by source); `None` without a C++ compiler.
/// A process that starts with both in `LD_PRELOAD` runs the CUDA backend on them (the CLI's
/// tests do so with the `fallow` binary).
pub fn driver_libraries() -> Result<Option<[PathBuf; 2]>, String> {
    let mut source = kernels_source();
    source.push_str("\n#line 1 \"emulated_driver.cpp\"\n");
    source.push_str(DRIVER);
    source.push('\n');
    for name in NAMES {
        source.push_str(&format!("FALLOW_EMU_REGISTER({name})\n"));
    }
    let Some(compiler) = compiler() else {
        return Ok(None);
    };
    let hash = build_hash(&source, &compiler);
    let dir = build_dir()?.join(format!("driver-{hash:016x}"));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let driver = dir.join("libcuda.so");
    if !driver.exists() {
        compile(&compiler, &source, &driver, &["-Wl,-soname,libcuda.so"])?;
    }
    // cuBLAS's name for the same library: an empty one that needs the driver, so that a
    // lookup in it finds the driver's `cublas*` functions (one copy of the driver's state).
    let blas = dir.join("libcublas.so");
    if !blas.exists() {
        let needs = driver.to_string_lossy().into_owned();
        compile(
            &compiler,
            "// cuBLAS's name for the emulated CUDA driver\n",
            &blas,
            &["-Wl,-soname,libcublas.so", "-Wl,--no-as-needed", &needs],
        )?;
    }
    Ok(Some([driver, blas]))
}

fn compile(compiler: &str, source: &str, lib: &Path, extra: &[&str]) -> Result<(), String> {
    let dir = lib.parent().unwrap_or(Path::new("."));
    let unique = format!("{}-{:?}", std::process::id(), std::thread::current().id());
    let cpp = dir.join(format!("build-{unique}.cpp"));
    let tmp = dir.join(format!("build-{unique}.so"));
    std::fs::write(&cpp, source).map_err(|e| format!("{}: {e}", cpp.display()))?;
    let out = Command::new(compiler)
        .args(FLAGS)
        .arg("-o")
        .arg(&tmp)
        .arg(&cpp)
        .args(extra)
        .output()
        .map_err(|e| format!("running {compiler}: {e}"))?;
    let _ = std::fs::remove_file(&cpp);
    if !out.status.success() {
        return Err(format!(
            "{compiler} failed to build {}:\n{}",
            lib.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    // Renamed into place so that concurrent test processes never load a half-written file.
    std::fs::rename(&tmp, lib).map_err(|e| format!("{}: {e}", lib.display()))
}
