//! The backend's kernels: CUDA C source compiled at run time with NVRTC (no `nvcc` at build
//! time) for the device's compute capability, loaded once per device per process; the PTX
//! is kept on disk ([`CudaOptions::kernel_cache`](super::CudaOptions)) so that later processes
//! skip NVRTC's seconds.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaFunction};
use cudarc::nvrtc::{CompileOptions, Ptx};

/// The kernel source (also compiled by the PTX test on machines without a GPU): the step's
/// row kernels and GEMV with the helpers all share, attention, the tensor-core GEMV, token
/// picking, the kernels that read GGUF block formats, their int8 tensor-core products, the
/// mixture-of-experts feed-forward's, and the LoRA deltas.
pub const SOURCE: &str = concat!(
    include_str!("kernels/kernels.cu"),
    include_str!("kernels/attention.cu"),
    include_str!("kernels/prefill_mma.cu"),
    include_str!("kernels/gemv_mma.cu"),
    include_str!("kernels/pick.cu"),
    include_str!("kernels/quant.cu"),
    include_str!("kernels/mmq.cu"),
    include_str!("kernels/moe.cu"),
    include_str!("kernels/lora.cu")
);

/// The values `#define NAME value` lines of [`SOURCE`] give `name` (tests check the constants
/// the Rust side plans with against the kernels').
#[cfg(test)]
pub(super) fn source_defines(name: &str) -> Vec<&'static str> {
    SOURCE
        .lines()
        .filter_map(|l| match l.split_whitespace().collect::<Vec<_>>()[..] {
            ["#define", n, value, ..] if n == name => Some(value),
            _ => None,
        })
        .collect()
}

/// Every kernel the backend launches, by name.
pub const NAMES: [&str; 115] = [
    "embed",
    "rms_norm_bf16",
    "add_rms_norm",
    "qkv_prepare",
    "paged_attention_1",
    "paged_attention_2",
    "paged_attention_4",
    "paged_attention_8",
    "paged_prefill_1",
    "paged_prefill_2",
    "paged_prefill_4",
    "paged_prefill_8",
    "paged_prefill_mma_1",
    "paged_prefill_mma_2",
    "paged_prefill_mma_4",
    "paged_prefill_mma_8",
    "gated_act",
    "add_bias_rows",
    "softcap",
    "gemv_bf16_w4u4",
    "gemv_bf16_gated_w4u4",
    "gemv_bf16_w4u8",
    "gemv_bf16_gated_w4u8",
    "gemv_bf16_w8u4",
    "gemv_bf16_gated_w8u4",
    "gemv_bf16_w8u8",
    "gemv_bf16_gated_w8u8",
    "gemv_bf16_w16u4",
    "gemv_bf16_gated_w16u4",
    "gemv_bf16_w16u8",
    "gemv_bf16_gated_w16u8",
    "gemv_bf16_w4u4p",
    "gemv_bf16_gated_w4u4p",
    "gemv_bf16_w4u8p",
    "gemv_bf16_gated_w4u8p",
    "gemv_bf16_w8u4p",
    "gemv_bf16_gated_w8u4p",
    "gemv_bf16_w8u8p",
    "gemv_bf16_gated_w8u8p",
    "gemv_bf16_w16u4p",
    "gemv_bf16_gated_w16u4p",
    "gemv_bf16_w16u8p",
    "gemv_bf16_gated_w16u8p",
    "gemv_bf16_w4u4r",
    "gemv_bf16_gated_w4u4r",
    "gemv_bf16_w4u8r",
    "gemv_bf16_gated_w4u8r",
    "gemv_bf16_w8u4r",
    "gemv_bf16_gated_w8u4r",
    "gemv_bf16_w8u8r",
    "gemv_bf16_gated_w8u8r",
    "gemv_bf16_w16u4r",
    "gemv_bf16_gated_w16u4r",
    "gemv_bf16_w16u8r",
    "gemv_bf16_gated_w16u8r",
    "gemv_mma_w4s2",
    "gemv_mma_w4s4",
    "gemv_mma_w8s2",
    "gemv_mma_w8s4",
    "gemv_mma_w4s2k",
    "gemv_mma_w4s4k",
    "gemv_mma_w8s2k",
    "gemv_mma_w8s4k",
    "mask_rows",
    "pick_rows",
    "gemv_q4_0",
    "gemv_q4_1",
    "gemv_q5_0",
    "gemv_q5_1",
    "gemv_q8_0",
    "gemv_q4_k",
    "gemv_q5_k",
    "gemv_q6_k",
    "gemv_q4_0_x8",
    "gemv_q4_1_x8",
    "gemv_q5_0_x8",
    "gemv_q5_1_x8",
    "gemv_q8_0_x8",
    "gemv_q4_k_x8",
    "gemv_q5_k_x8",
    "gemv_q6_k_x8",
    "dequant_q4_0",
    "dequant_q4_1",
    "dequant_q5_0",
    "dequant_q5_1",
    "dequant_q8_0",
    "dequant_q4_k",
    "dequant_q5_k",
    "dequant_q6_k",
    "mmq_q4_0",
    "mmq_q4_1",
    "mmq_q5_0",
    "mmq_q5_1",
    "mmq_q8_0",
    "mmq_q4_k",
    "mmq_q5_k",
    "mmq_q6_k",
    "mmq_sum",
    "moe_route",
    "moe_sort",
    "moe_gather",
    "moe_gemv_bf16",
    "moe_gemv_q4_0",
    "moe_gemv_q4_1",
    "moe_gemv_q5_0",
    "moe_gemv_q5_1",
    "moe_gemv_q8_0",
    "moe_gemv_q4_k",
    "moe_gemv_q5_k",
    "moe_gemv_q6_k",
    "moe_clamped_glu",
    "moe_expert_bias",
    "moe_combine",
    "lora_shrink",
    "lora_expand",
];

/// NVRTC's options besides the architecture.
const NVRTC_OPTIONS: [&str; 2] = ["--std=c++17", "-default-device"];

/// Compiles [`SOURCE`] to PTX for `arch` (e.g. `compute_90`).
pub fn compile_ptx(arch: &'static str) -> Result<Ptx, String> {
    compile_ptx_with(arch, &[])
}

/// [`compile_ptx`] with `extra` options after [`NVRTC_OPTIONS`].
fn compile_ptx_with(arch: &'static str, extra: &[&str]) -> Result<Ptx, String> {
    let options = CompileOptions {
        arch: Some(arch),
        options: NVRTC_OPTIONS
            .iter()
            .chain(extra)
            .map(|o| o.to_string())
            .collect(),
        ..CompileOptions::default()
    };
    cudarc::nvrtc::compile_ptx_with_opts(SOURCE, options).map_err(|e| format!("NVRTC: {e}"))
}

/// How PTX is made for an architecture: [`compile_ptx`], or in the tests of the cache, a
/// quicker compile of the same source.
type Compile = fn(&'static str) -> Result<Ptx, String>;

/// PTX for `arch`: from `cache` (a directory) when this source was compiled for it before
/// with this NVRTC, else compiled and stored there. NVRTC takes seconds for these kernels,
/// paid at every process start without the cache. A cached file that is not whole (no
/// `.entry` for some kernel) is compiled again; a cache that cannot be written is skipped.
pub fn ptx_for(arch: &'static str, cache: Option<&Path>) -> Result<Ptx, String> {
    cached_ptx(arch, cache, compile_ptx)
}

fn cached_ptx(arch: &'static str, cache: Option<&Path>, compile: Compile) -> Result<Ptx, String> {
    let Some(dir) = cache else {
        return compile(arch);
    };
    let file = dir.join(cache_file_name(arch));
    if let Ok(text) = std::fs::read_to_string(&file) {
        if is_whole_ptx(&text) {
            return Ok(Ptx::from_src(text));
        }
        tracing::warn!(file = %file.display(), "cached kernels incomplete; compiling them again");
    }
    compile_and_store(arch, Some(dir), compile)
}

/// Compiles [`SOURCE`] for `arch` and, with a `cache` directory, replaces its file there.
fn compile_and_store(
    arch: &'static str,
    cache: Option<&Path>,
    compile: Compile,
) -> Result<Ptx, String> {
    let ptx = compile(arch)?;
    if let Some(dir) = cache {
        let file = dir.join(cache_file_name(arch));
        if let Err(e) = store(&file, &ptx.to_src()) {
            tracing::debug!(file = %file.display(), error = %e, "kernel cache not written");
        }
    }
    Ok(ptx)
}

/// The cache file of this source for `arch`: keyed by the source, the options and NVRTC's
/// version, so that an upgrade of either compiles afresh.
fn cache_file_name(arch: &str) -> String {
    let version = nvrtc_version().unwrap_or_default();
    let key = [SOURCE, arch, &NVRTC_OPTIONS.join(" "), &version].join("\0");
    format!("kernels-{:016x}-{arch}.ptx", fnv1a(key.as_bytes()))
}

/// NVRTC's version, `major.minor`.
fn nvrtc_version() -> Option<String> {
    use cudarc::nvrtc::sys;
    if !nvrtc_available() {
        return None;
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two out-parameters; the library loads (checked above).
    let status = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
    (status == sys::nvrtcResult::NVRTC_SUCCESS).then(|| format!("{major}.{minor}"))
}

/// Whether `text` holds every kernel (a file cut short by a crash does not).
fn is_whole_ptx(text: &str) -> bool {
    NAMES
        .iter()
        .all(|name| text.contains(&format!(".entry {name}(")))
}

/// Writes `text` to `file` through a temporary name, so that no reader sees half a file.
fn store(file: &Path, text: &str) -> std::io::Result<()> {
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = file.with_extension(format!("tmp-{}", std::process::id()));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, file)
}

/// FNV-1a: a stable 64-bit hash (file names of compiled kernels).
pub(super) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    })
}

/// ptxas's resource report (`Used N registers`, spills) for every kernel, compiled to
/// machine code for `arch` (e.g. `sm_90`): what a GPU would run, checkable without one.
pub fn resource_report(arch: &str) -> Result<String, String> {
    use cudarc::nvrtc::result;
    let source = std::ffi::CString::new(SOURCE).map_err(|e| e.to_string())?;
    let prog = result::create_program(&source, None).map_err(|e| format!("NVRTC: {e}"))?;
    let options = [
        "--std=c++17".to_string(),
        "-default-device".to_string(),
        format!("--gpu-architecture={arch}"),
        "--ptxas-options=-v".to_string(),
    ];
    // SAFETY: `prog` was just created and is destroyed once, below.
    let compiled = unsafe { result::compile_program(prog, &options) };
    // SAFETY: as above.
    let log = unsafe { result::get_program_log(prog) }.map_err(|e| format!("NVRTC: {e}"));
    // SAFETY: as above; nothing uses `prog` after this.
    let _ = unsafe { result::destroy_program(prog) };
    let log: Vec<u8> = log?.into_iter().map(|c| c as u8).collect();
    let log = String::from_utf8_lossy(&log)
        .trim_end_matches('\0')
        .to_string();
    compiled.map_err(|e| format!("NVRTC ({arch}): {e}\n{log}"))?;
    Ok(log)
}

/// Whether NVRTC's library can be loaded here (the PTX test skips without it).
pub fn nvrtc_available() -> bool {
    // SAFETY: only probes dlopen; no NVRTC function is called.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// The loaded kernels of one device.
pub struct Kernels {
    functions: HashMap<&'static str, CudaFunction>,
    /// Each kernel's most threads per block as the driver compiled it for this GPU (its
    /// registers: a block needs threads × registers of the 64k an SM has).
    max_threads: HashMap<&'static str, u32>,
    /// Each kernel's parameter sizes in bytes, from its PTX ([`entry_parameters`]).
    parameters: HashMap<String, Vec<usize>>,
}

impl Kernels {
    /// The kernels for `ctx`'s device, compiled on first use and shared after that.
    pub fn for_device(ctx: &Arc<CudaContext>, disk: Option<&Path>) -> Result<Arc<Kernels>, String> {
        static CACHE: OnceLock<Mutex<HashMap<usize, Arc<Kernels>>>> = OnceLock::new();
        let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
        let mut cache = cache
            .lock()
            .map_err(|_| "kernel cache poisoned".to_string())?;
        if let Some(k) = cache.get(&ctx.ordinal()) {
            return Ok(Arc::clone(k));
        }
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| format!("compute capability: {e}"))?;
        let arch = arch_name(major, minor);
        let ptx = ptx_for(arch, disk)?;
        let mut parameters = entry_parameters(&ptx.to_src());
        let module = match ctx.load_module(ptx) {
            Ok(module) => module,
            // A cached file the driver rejects: compiled afresh, replacing it (and the
            // driver's verdict on that one is final).
            Err(e) => {
                tracing::warn!(error = %e, "cached kernels did not load; compiling them again");
                let ptx = compile_and_store(arch, disk, compile_ptx)?;
                parameters = entry_parameters(&ptx.to_src());
                ctx.load_module(ptx)
                    .map_err(|e| format!("loading kernels: {e}"))?
            }
        };
        let mut functions = HashMap::new();
        let mut max_threads = HashMap::new();
        for name in NAMES {
            let f = module
                .load_function(name)
                .map_err(|e| format!("kernel {name}: {e}"))?;
            let limit = f
                .max_threads_per_block()
                .map_err(|e| format!("kernel {name}: {e}"))?;
            max_threads.insert(name, u32::try_from(limit).unwrap_or(0));
            functions.insert(name, f);
        }
        let kernels = Arc::new(Kernels {
            functions,
            max_threads,
            parameters,
        });
        cache.insert(ctx.ordinal(), Arc::clone(&kernels));
        Ok(kernels)
    }

    pub fn get(&self, name: &str) -> &CudaFunction {
        // Every name in NAMES was loaded in `for_device`; a typo here is a programming error
        // caught by the first forward pass in any test.
        &self.functions[name]
    }

    /// The most threads a block of `name` may have on this device (0 for an unknown name).
    pub fn max_threads(&self, name: &str) -> u32 {
        self.max_threads.get(name).copied().unwrap_or(0)
    }

    /// The byte size of each of `name`'s parameters (empty for an unknown name).
    pub fn parameters(&self, name: &str) -> &[usize] {
        self.parameters.get(name).map_or(&[], Vec::as_slice)
    }
}

/// The byte size of each parameter of every kernel in `ptx` (the `.param` lines of its
/// `.entry`): what a launch must pass, in order. cuLaunchKernel copies each parameter's size
/// from the address it is given whatever the caller meant, so a launch that passes a 4-byte
/// value for an 8-byte parameter (or leaves one out) reads garbage without an error; the
/// launcher compares against this first.
pub fn entry_parameters(ptx: &str) -> HashMap<String, Vec<usize>> {
    ptx.split(".entry ")
        .skip(1)
        .filter_map(|body| {
            let (name, rest) = body.split_once('(')?;
            let declarations = rest.split(')').next().unwrap_or("");
            let sizes = declarations.lines().filter_map(parameter_size).collect();
            Some((name.trim().to_string(), sizes))
        })
        .collect()
}

/// The bytes of one `.param` declaration: `.param .u64 name` (8), `.param .f32 name` (4),
/// `.param .align 8 .b8 name[48]` (48).
fn parameter_size(line: &str) -> Option<usize> {
    let declaration = line.trim().strip_prefix(".param")?.trim();
    if declaration.starts_with(".align") {
        let count = declaration.split('[').nth(1)?.split(']').next()?;
        return count.parse().ok();
    }
    let kind = declaration.split_whitespace().next()?;
    let bits: usize = kind.get(2..)?.parse().ok()?;
    Some(bits / 8)
}

/// NVRTC's virtual architecture for a compute capability (PTX, JIT-compiled by the driver
/// for the exact chip). Newer chips than this list get the newest entry.
fn arch_name(major: i32, minor: i32) -> &'static str {
    match (major, minor) {
        (8, 0) => "compute_80",
        (8, 6) => "compute_86",
        (8, 7) => "compute_87",
        (8, 9) => "compute_89",
        (9, _) => "compute_90",
        (m, _) if m >= 10 => "compute_90",
        _ => "compute_80",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NVRTC's quickest compile: the same source's kernels, entries, parameters and inline
    /// assembly, without the optimisation that takes ~30 s per architecture (the backend's
    /// own compile, [`compile_ptx`], runs in the CUDA conformance suite, and ptxas's checks
    /// below compile to machine code at full optimisation).
    fn quick_compile(arch: &'static str) -> Result<Ptx, String> {
        compile_ptx_with(arch, &["--Ofast-compile=max"])
    }

    /// [`quick_compile`]'s PTX text for `arch`, compiled once for the tests that read it.
    fn quick_ptx(arch: &'static str) -> &'static str {
        static PTX: OnceLock<Mutex<HashMap<&'static str, &'static str>>> = OnceLock::new();
        let mut compiled = PTX
            .get_or_init(|| Mutex::new(HashMap::new()))
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        compiled.entry(arch).or_insert_with(|| {
            let ptx = quick_compile(arch).unwrap_or_else(|e| panic!("{arch}: {e}"));
            Box::leak(ptx.to_src().into_boxed_str())
        })
    }

    /// Every kernel compiles to PTX for the oldest and the newest target, without a GPU.
    #[test]
    fn every_kernel_compiles_to_ptx_with_nvrtc() {
        if !nvrtc_available() {
            fallow_protocol::testing::skip_for_want_of(
                "libnvrtc.so.13 (infra/test.sh installs the nvidia-cuda-nvrtc wheel and puts \
                 it on LD_LIBRARY_PATH)",
            );
            return;
        }
        for arch in ["compute_80", "compute_90"] {
            let text = quick_ptx(arch);
            for name in NAMES {
                assert!(
                    text.contains(&format!(".entry {name}(")),
                    "{arch}: kernel {name} missing from the PTX"
                );
            }
        }
    }

    /// Every kernel waits for the previous grid (`grid_dependency_sync`) when compiled for
    /// Hopper, where launches may start early ([`super::super::launch`]); before sm_90 the
    /// instruction does not exist and nothing of it is compiled.
    #[test]
    fn every_kernel_waits_for_its_predecessor_on_hopper_only() {
        if !nvrtc_available() {
            fallow_protocol::testing::skip_for_want_of("libnvrtc.so.13 (see the PTX test)");
            return;
        }
        // Before sm_90 nothing of it is compiled (a quick compile shows that as well).
        for instruction in ["griddepcontrol.wait", "griddepcontrol.launch_dependents"] {
            assert!(
                !quick_ptx("compute_80").contains(instruction),
                "compute_80: {instruction}"
            );
        }
        // On sm_90 every kernel's own body has both: the backend's compile inlines every call
        // (a quick one keeps grid_dependency_sync a function of its own).
        let text = compile_ptx("compute_90")
            .unwrap_or_else(|e| panic!("{e}"))
            .to_src();
        // PTX lists each kernel as `.entry name(` followed by its body, up to the next.
        for body in text.split(".entry ").skip(1) {
            let name = body.split('(').next().unwrap_or("?");
            assert!(body.contains("griddepcontrol.wait"), "kernel {name}");
            assert!(
                body.contains("griddepcontrol.launch_dependents"),
                "kernel {name}"
            );
        }
    }

    /// The second compilation of the same source is read from the cache, and a cached file
    /// cut short is compiled again.
    #[test]
    fn compiled_kernels_are_cached_on_disk_and_a_truncated_file_is_replaced() {
        if !nvrtc_available() {
            fallow_protocol::testing::skip_for_want_of("libnvrtc.so.13 (see the PTX test)");
            return;
        }
        let dir = std::env::temp_dir().join(format!("fallow-kernel-cache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let ptx = |dir: &Path| cached_ptx("compute_80", Some(dir), quick_compile);
        let first = ptx(&dir).unwrap_or_else(|e| panic!("{e}"));
        let file = dir.join(cache_file_name("compute_80"));
        let stored = std::fs::read_to_string(&file).expect("the PTX was stored");
        assert_eq!(stored, first.to_src());
        assert!(is_whole_ptx(&stored));

        // A marker only the cache has: the second call returns the file, not NVRTC's output.
        let marked = format!("// cached\n{stored}");
        std::fs::write(&file, &marked).expect("write");
        assert_eq!(ptx(&dir).expect("cached").to_src(), marked);

        std::fs::write(&file, &stored[..stored.len() / 2]).expect("truncate");
        let again = ptx(&dir).expect("recompiled");
        assert_eq!(again.to_src(), stored);
        assert_eq!(std::fs::read_to_string(&file).expect("rewritten"), stored);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The launcher's argument check reads each kernel's parameters from the PTX: pointers
    /// 8 bytes, ints and floats 4, a by-value struct its size.
    #[test]
    fn every_kernels_parameter_sizes_are_read_from_its_ptx() {
        assert_eq!(parameter_size("\t.param .u64 k_param_0,"), Some(8));
        assert_eq!(parameter_size(".param .f32 k_param_1"), Some(4));
        assert_eq!(
            parameter_size(".param .align 8 .b8 k_param_2[48]"),
            Some(48)
        );
        assert_eq!(parameter_size(".reg .b32 %r<4>;"), None);
        if !nvrtc_available() {
            fallow_protocol::testing::skip_for_want_of("libnvrtc.so.13 (see the PTX test)");
            return;
        }
        let parameters = entry_parameters(quick_ptx("compute_90"));
        for name in NAMES {
            let sizes = parameters
                .get(name)
                .unwrap_or_else(|| panic!("{name} missing"));
            assert!(!sizes.is_empty(), "{name}: no parameters read");
        }
        assert_eq!(parameters["embed"], [8, 8, 8, 4, 4]);
        // w, x, out, M, K, n, ldo, then the fused norm's x, post_w, next_w, out, done, eps, a
        // split end's inv, the input's scale, then the bytes of each row asked of L2 before
        // the wait and ahead of the loads, then (a plain product) the activation it writes
        // from paired gate and up rows, or -1.
        assert_eq!(
            parameters["gemv_bf16_w8u4"],
            [8, 8, 8, 4, 4, 4, 4, 8, 8, 8, 8, 8, 4, 8, 8, 4, 4, 4]
        );
        // The gated down projection: the activation after ldo, no pairing.
        assert_eq!(
            parameters["gemv_bf16_gated_w8u4"],
            [8, 8, 8, 4, 4, 4, 4, 4, 8, 8, 8, 8, 8, 4, 8, 8, 4, 4]
        );
        assert_eq!(parameters["gemv_q8_0"], [8, 8, 8, 4, 4, 4, 4]);
    }

    #[test]
    fn the_cache_key_changes_with_the_architecture() {
        assert_ne!(cache_file_name("compute_80"), cache_file_name("compute_90"));
        assert!(cache_file_name("compute_90").ends_with("-compute_90.ptx"));
    }

    /// What ptxas reported for one kernel.
    struct Resources {
        registers: u32,
        static_shared: u32,
        spills: bool,
    }

    /// ptxas's report (`resource_report`) by kernel: each kernel's lines follow its
    /// "Compiling entry function 'name'" line.
    fn resources_by_kernel(report: &str) -> HashMap<String, Resources> {
        let number_before = |line: &str, unit: &str| -> Option<u32> {
            let head = line.split(unit).next()?;
            head.rsplit(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        };
        let mut kernels = HashMap::new();
        let mut current: Option<String> = None;
        for line in report.lines() {
            if let Some(rest) = line.split("Compiling entry function '").nth(1) {
                let name = rest.split('\'').next().unwrap_or("?").to_string();
                kernels.insert(
                    name.clone(),
                    Resources {
                        registers: 0,
                        static_shared: 0,
                        spills: false,
                    },
                );
                current = Some(name);
                continue;
            }
            let Some(r) = current.as_ref().and_then(|name| kernels.get_mut(name)) else {
                continue;
            };
            if line.contains("spill stores") {
                r.spills |= !(line.contains(" 0 bytes spill stores")
                    && line.contains(" 0 bytes spill loads"));
            }
            if line.contains(" registers") {
                r.registers = number_before(line, " registers").unwrap_or(0);
                if line.contains(" bytes smem") {
                    r.static_shared = number_before(line, " bytes smem").unwrap_or(0);
                }
            }
        }
        kernels
    }

    /// Threads per block the backend launches `name` with, and the most dynamic shared
    /// memory it gives it (the numbers the launch code itself uses).
    fn launch_shape(name: &str) -> (u32, u32) {
        use super::super::forward::{
            ATTN_THREADS, ELEMENT_THREADS, HEAD_THREADS, PICK_THREADS, ROW_THREADS,
        };
        use super::super::gemm::{EXPAND_THREADS, QUANT_GEMV_WARPS};
        use super::super::lora::SHRINK_THREADS;
        use super::super::mmq::{MMQ_SUM_THREADS, MMQ_WARPS};
        use super::super::moe::{ROUTE_THREADS, SORT_THREADS};
        use super::super::prefill::PrefillKernel;
        use super::super::tune::gemv_tune::{GEMV_VARIANTS, RESIDENT_BYTES};
        if let Some(v) = GEMV_VARIANTS
            .iter()
            .find(|v| v.plain == name || v.gated == Some(name))
        {
            let dynamic = if v.resident { RESIDENT_BYTES } else { 0 };
            return ((v.warps * 32) as u32, dynamic as u32);
        }
        let threads = match name {
            "embed" | "rms_norm_bf16" | "add_rms_norm" => ROW_THREADS,
            "qkv_prepare" => HEAD_THREADS,
            "gated_act" | "add_bias_rows" | "softcap" | "mask_rows" | "moe_clamped_glu"
            | "moe_expert_bias" | "moe_combine" | "lora_expand" => ELEMENT_THREADS,
            "lora_shrink" => SHRINK_THREADS,
            "moe_route" | "moe_gather" => ROUTE_THREADS,
            "moe_sort" => SORT_THREADS,
            "pick_rows" => PICK_THREADS,
            _ if name.starts_with("paged_attention_") => ATTN_THREADS,
            _ if name.starts_with("paged_prefill_mma_") => PrefillKernel::TensorCores.threads(),
            _ if name.starts_with("paged_prefill_") => PrefillKernel::F32.threads(),
            _ if name.starts_with("gemv_q") || name.starts_with("moe_gemv_") => {
                (QUANT_GEMV_WARPS * 32) as u32
            }
            _ if name.starts_with("dequant_") => EXPAND_THREADS as u32,
            "mmq_sum" => MMQ_SUM_THREADS as u32,
            _ if name.starts_with("mmq_") => (MMQ_WARPS * 32) as u32,
            _ => panic!("no launch shape known for kernel {name}: add it here"),
        };
        (threads, 0)
    }

    /// One architecture's ptxas report, by kernel.
    type ArchReport = (&'static str, HashMap<String, Resources>);

    /// ptxas's report for sm_80 and sm_90 by kernel, compiled once for the tests that read
    /// it (the two at once: about a minute each); `None` without NVRTC.
    fn ptxas_reports() -> Option<&'static [ArchReport]> {
        static REPORTS: OnceLock<Option<Vec<ArchReport>>> = OnceLock::new();
        REPORTS
            .get_or_init(|| {
                nvrtc_available().then(|| {
                    std::thread::scope(|scope| {
                        let compiles: Vec<_> = ["sm_80", "sm_90"]
                            .into_iter()
                            .map(|arch| (arch, scope.spawn(move || resource_report(arch))))
                            .collect();
                        compiles
                            .into_iter()
                            .map(|(arch, compile)| {
                                let report = compile
                                    .join()
                                    .unwrap_or_else(|_| panic!("{arch}: the compile panicked"))
                                    .unwrap_or_else(|e| panic!("{e}"));
                                (arch, resources_by_kernel(&report))
                            })
                            .collect()
                    })
                })
            })
            .as_deref()
    }

    /// `check(arch, kernel, what ptxas reported)` for every kernel on sm_80 and sm_90.
    fn for_every_kernel(check: impl Fn(&str, &str, &Resources)) {
        let Some(reports) = ptxas_reports() else {
            fallow_protocol::testing::skip_for_want_of("libnvrtc.so.13 (see the PTX test)");
            return;
        };
        for (arch, kernels) in reports {
            for name in NAMES {
                let r = kernels
                    .get(name)
                    .unwrap_or_else(|| panic!("{arch}: ptxas did not report {name}"));
                check(arch, name, r);
            }
        }
    }

    /// Every kernel can launch with the block the backend gives it, on Ampere and Hopper:
    /// its registers (allocated 8 per thread at a time) for every thread of the block fit
    /// the 64k an SM has, and its shared memory (static and dynamic) fits the 48 KiB a block
    /// gets without opting in. A kernel over either limit fails every launch on the GPU.
    #[test]
    fn every_kernel_fits_the_block_it_is_launched_with_on_sm_80_and_sm_90() {
        for_every_kernel(|arch, name, r| {
            let (threads, dynamic) = launch_shape(name);
            assert!(r.registers > 0, "{arch}: no register count for {name}");
            let registers = r.registers.div_ceil(8) * 8 * threads;
            assert!(
                threads <= 1024 && registers <= 65536,
                "{arch}: {name} uses {} registers per thread: {threads} threads need \
                 {registers} of 65536",
                r.registers
            );
            assert!(
                r.static_shared + dynamic <= 48 * 1024,
                "{arch}: {name} takes {} bytes of shared memory and {dynamic} dynamic",
                r.static_shared
            );
        });
    }

    /// No kernel spills registers to local memory on Ampere or Hopper (ptxas, through
    /// NVRTC, reports it without a GPU): a spill in a hot loop costs more than any tuning.
    #[test]
    fn no_kernel_spills_registers_on_sm_80_or_sm_90() {
        for_every_kernel(|arch, name, r| assert!(!r.spills, "{arch}: {name} spills registers"));
    }
}
