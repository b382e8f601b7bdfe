//! Every setting of the CUDA backend in one value, [`CudaOptions`], parsed once at the edge
//! (the CLI's flags and `FALLOW_*` variables, or a test) and handed to
//! [`CudaBackend::new`](super::CudaBackend::new) and
//! [`CudaBackend::set_options`](super::CudaBackend::set_options). The backend itself reads no
//! environment.
//!
//! User-facing settings are fields of their own (`--cuda-weights`, `--cuda-quant-x`,
//! `--cuda-split-norm`, `FALLOW_KERNEL_CACHE`). Diagnostics and A/B switches are one list,
//! [`CudaDebug`], written `FALLOW_CUDA_DEBUG=name,name=value,…`; `docs/cuda.md` has the table.

use std::ffi::OsString;
use std::path::PathBuf;
use std::str::FromStr;

use super::attention_split::{DEFAULT_MIN_PARTITION, KEYS_PER_ITERATION};
use super::tune::gemv_tune::parse_pick;
use super::weights::{CudaWeights, QuantX};

/// The CUDA backend's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct CudaOptions {
    /// How the model's matrices are stored on the device (`--cuda-weights`); fixed at load.
    pub weights: CudaWeights,
    /// How quantized products of up to 64 token rows read x (`--cuda-quant-x`).
    pub quant_x: QuantX,
    /// Split decode sub-block ends with the next product (`--cuda-split-norm`): within bf16
    /// rounding of the whole ends, not the same bits.
    pub split_norm: bool,
    /// Where compiled kernels are kept between processes; `None`: nowhere.
    pub kernel_cache: Option<PathBuf>,
    /// Diagnostics and A/B switches (`FALLOW_CUDA_DEBUG`).
    pub debug: CudaDebug,
}

impl Default for CudaOptions {
    /// The defaults, with no kernel cache on disk.
    fn default() -> Self {
        CudaOptions {
            weights: CudaWeights::Bf16,
            quant_x: QuantX::Bf16,
            split_norm: false,
            kernel_cache: None,
            debug: CudaDebug::default(),
        }
    }
}

/// Whether the int8 tensor-core products serve the products with x as int8 that their
/// format's check allows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum MmqMode {
    /// Those timed faster than the expansion for cuBLAS on this GPU.
    #[default]
    Timed,
    /// Every one.
    Always,
    /// None.
    Never,
}

/// Which kernel serves prompt-run attention.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PrefillChoice {
    /// The tensor cores where the head size fits them, else f32.
    #[default]
    Auto,
    /// The tensor cores (a model whose heads do not fit them is refused).
    TensorCores,
    /// The f32 kernel.
    F32,
}

/// Diagnostics and A/B switches: each either changes nothing a step computes (timing,
/// launch order, fusions proven to give the same bits) or picks between paths the
/// conformance suite compares. The defaults are what a user runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaDebug {
    /// `profile`: time every launch with CUDA events (graphs and early starts off) and print
    /// each kernel's GPU time when the model is dropped.
    pub profile: bool,
    /// `step-clock`: GPU time against host time per step shape, graphs on.
    pub step_clock: bool,
    /// `no-graphs`: decode steps launched eagerly instead of replayed from CUDA graphs.
    pub graphs: bool,
    /// `no-early-start`: no programmatic dependent launch (it exists from sm_90).
    pub early_start: bool,
    /// `no-l2-prefetch`: no weight or KV rows asked into L2 before a kernel's wait.
    pub l2_prefetch: bool,
    /// `no-fused-norm`: `add_rms_norm` launches instead of the GEMVs' last blocks.
    pub fused_norm: bool,
    /// `no-fused-rope`: `qkv_prepare` launches instead of the attention blocks.
    pub fused_rope: bool,
    /// `no-fused-glu`: the down GEMV activates `[gate | up]` instead of the gate/up GEMV.
    pub fused_glu: bool,
    /// `no-split-attention`: decode attention one block per head, never split over keys.
    pub split_attention: bool,
    /// `split-min-keys=N`: the fewest keys a decode attention is split over.
    pub split_min_keys: usize,
    /// `no-tensor-gemv`: the GEMV timing chooses among CUDA-core variants only.
    pub tensor_gemv: bool,
    /// `no-gemv-cublas`: no decode-sized product is timed against, or given to, cuBLAS.
    pub gemv_cublas: bool,
    /// `gemv=VARIANT[:L2]`: one GEMV variant for every decode-sized product, not timed.
    pub gemv: Option<String>,
    /// `gemv-max-rows=N`: products of at most N token rows go through a GEMV (0: cuBLAS).
    pub gemv_max_rows: Option<usize>,
    /// `mmq=timed|always|never`.
    pub mmq: MmqMode,
    /// `prefill=auto|mma|f32`.
    pub prefill: PrefillChoice,
    /// `quick-tuning`: the load-time tuning times each candidate by one launch, with no
    /// warm-up (tests on the emulated driver, whose times are the CPU's and choose nothing).
    pub quick_tuning: bool,
}

impl Default for CudaDebug {
    fn default() -> Self {
        CudaDebug {
            profile: false,
            step_clock: false,
            graphs: true,
            early_start: true,
            l2_prefetch: true,
            fused_norm: true,
            fused_rope: true,
            fused_glu: true,
            split_attention: true,
            split_min_keys: DEFAULT_MIN_PARTITION,
            tensor_gemv: true,
            gemv_cublas: true,
            gemv: None,
            gemv_max_rows: None,
            mmq: MmqMode::Timed,
            prefill: PrefillChoice::Auto,
            quick_tuning: false,
        }
    }
}

/// The names [`CudaDebug`] takes, for error messages and `docs/cuda.md`.
pub const DEBUG_NAMES: &str = "profile, step-clock, no-graphs, no-early-start, no-l2-prefetch, \
     no-fused-norm, no-fused-rope, no-fused-glu, no-split-attention, split-min-keys=N, \
     no-tensor-gemv, no-gemv-cublas, gemv=VARIANT[:L2], gemv-max-rows=N, \
     mmq=timed|always|never, prefill=auto|mma|f32, quick-tuning";

impl FromStr for CudaDebug {
    type Err = String;

    /// A comma-separated list of names (`no-graphs`) and `name=value` settings; empty
    /// entries are skipped, an unknown name is an error naming the known ones.
    fn from_str(list: &str) -> Result<Self, String> {
        let mut debug = CudaDebug::default();
        for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (name, value) = match entry.split_once('=') {
                Some((name, value)) => (name.trim(), Some(value.trim())),
                None => (entry, None),
            };
            let flag = |on: &mut bool| match value {
                None => {
                    *on = !name.starts_with("no-");
                    Ok(())
                }
                Some(_) => Err(format!("FALLOW_CUDA_DEBUG: {name} takes no value")),
            };
            let value_of = || {
                value.ok_or_else(|| format!("FALLOW_CUDA_DEBUG: {name} needs a value ({name}=…)"))
            };
            match name {
                "profile" => flag(&mut debug.profile)?,
                "step-clock" => flag(&mut debug.step_clock)?,
                "no-graphs" => flag(&mut debug.graphs)?,
                "no-early-start" => flag(&mut debug.early_start)?,
                "no-l2-prefetch" => flag(&mut debug.l2_prefetch)?,
                "no-fused-norm" => flag(&mut debug.fused_norm)?,
                "no-fused-rope" => flag(&mut debug.fused_rope)?,
                "no-fused-glu" => flag(&mut debug.fused_glu)?,
                "no-split-attention" => flag(&mut debug.split_attention)?,
                "no-tensor-gemv" => flag(&mut debug.tensor_gemv)?,
                "no-gemv-cublas" => flag(&mut debug.gemv_cublas)?,
                "quick-tuning" => flag(&mut debug.quick_tuning)?,
                "split-min-keys" => debug.split_min_keys = split_min_keys(value_of()?)?,
                "gemv" => {
                    let variant = value_of()?;
                    debug.gemv = match variant {
                        "auto" => None,
                        _ => {
                            parse_pick(variant).map_err(|e| format!("FALLOW_CUDA_DEBUG: {e}"))?;
                            Some(variant.to_string())
                        }
                    };
                }
                "gemv-max-rows" => {
                    let rows = value_of()?;
                    debug.gemv_max_rows = Some(rows.parse().map_err(|_| {
                        format!("FALLOW_CUDA_DEBUG: gemv-max-rows={rows} is not a row count")
                    })?);
                }
                "mmq" => {
                    debug.mmq = match value_of()? {
                        "timed" => MmqMode::Timed,
                        "always" => MmqMode::Always,
                        "never" => MmqMode::Never,
                        other => {
                            return Err(format!(
                                "FALLOW_CUDA_DEBUG: mmq={other}: expected timed, always or never"
                            ))
                        }
                    }
                }
                "prefill" => {
                    debug.prefill = match value_of()? {
                        "auto" => PrefillChoice::Auto,
                        "mma" => PrefillChoice::TensorCores,
                        "f32" => PrefillChoice::F32,
                        other => {
                            return Err(format!(
                                "FALLOW_CUDA_DEBUG: prefill={other}: expected auto, mma or f32"
                            ))
                        }
                    }
                }
                _ => {
                    return Err(format!(
                        "FALLOW_CUDA_DEBUG: unknown name {name:?} (known: {DEBUG_NAMES})"
                    ))
                }
            }
        }
        Ok(debug)
    }
}

/// A decode attention split's fewest keys: a positive multiple of the keys a split block
/// takes per iteration.
fn split_min_keys(value: &str) -> Result<usize, String> {
    match value.parse::<usize>() {
        Ok(keys) if keys > 0 && keys % KEYS_PER_ITERATION == 0 => Ok(keys),
        _ => Err(format!(
            "FALLOW_CUDA_DEBUG: split-min-keys={value}: expected a positive multiple of \
             {KEYS_PER_ITERATION} (keys per split attention block)"
        )),
    }
}

/// Variables that once set CUDA options one by one, and what replaces each: one set by an
/// old script is refused rather than silently ignored.
const RETIRED: [(&str, &str); 14] = [
    ("FALLOW_CUDA_PROFILE", "FALLOW_CUDA_DEBUG=profile"),
    ("FALLOW_CUDA_STEP_CLOCK", "FALLOW_CUDA_DEBUG=step-clock"),
    ("FALLOW_CUDA_GRAPHS", "FALLOW_CUDA_DEBUG=no-graphs"),
    (
        "FALLOW_CUDA_EARLY_START",
        "FALLOW_CUDA_DEBUG=no-early-start",
    ),
    (
        "FALLOW_CUDA_L2_PREFETCH",
        "FALLOW_CUDA_DEBUG=no-l2-prefetch",
    ),
    ("FALLOW_CUDA_FUSED_NORM", "FALLOW_CUDA_DEBUG=no-fused-norm"),
    ("FALLOW_CUDA_FUSED_ROPE", "FALLOW_CUDA_DEBUG=no-fused-rope"),
    ("FALLOW_CUDA_FUSED_GLU", "FALLOW_CUDA_DEBUG=no-fused-glu"),
    (
        "FALLOW_CUDA_SPLIT_MIN_KEYS",
        "FALLOW_CUDA_DEBUG=split-min-keys=N",
    ),
    (
        "FALLOW_CUDA_TENSOR_GEMV",
        "FALLOW_CUDA_DEBUG=no-tensor-gemv",
    ),
    (
        "FALLOW_CUDA_GEMV_CUBLAS",
        "FALLOW_CUDA_DEBUG=no-gemv-cublas",
    ),
    ("FALLOW_CUDA_GEMV", "FALLOW_CUDA_DEBUG=gemv=VARIANT"),
    (
        "FALLOW_CUDA_MMQ",
        "FALLOW_CUDA_DEBUG=mmq=timed|always|never",
    ),
    (
        "FALLOW_CUDA_PREFILL",
        "FALLOW_CUDA_DEBUG=prefill=auto|mma|f32",
    ),
];

/// A process's variables as the edge reads them: the value of a name, if set.
pub type Vars<'a> = &'a dyn Fn(&str) -> Option<OsString>;

impl CudaOptions {
    /// The defaults with what the process's variables `var` add beyond the flags: the debug
    /// list (`FALLOW_CUDA_DEBUG`) and the kernel cache (`FALLOW_KERNEL_CACHE`). A retired
    /// variable is an error naming its replacement. The flags (`--cuda-weights`,
    /// `--cuda-quant-x`, `--cuda-split-norm`, each with its `FALLOW_CUDA_*` variable) are the
    /// CLI's to fill in. The edge passes `std::env::var_os`; nothing here reads the
    /// environment itself.
    pub fn from_vars(var: Vars<'_>) -> Result<CudaOptions, String> {
        if let Some((old, new)) = RETIRED.iter().find(|(old, _)| var(old).is_some()) {
            return Err(format!("{old} is no longer read: use {new}"));
        }
        let debug = match var("FALLOW_CUDA_DEBUG") {
            Some(list) => list
                .to_str()
                .ok_or("FALLOW_CUDA_DEBUG is not UTF-8")?
                .parse()?,
            None => CudaDebug::default(),
        };
        Ok(CudaOptions {
            kernel_cache: Self::kernel_cache_from_vars(var),
            debug,
            ..CudaOptions::default()
        })
    }

    /// Where compiled kernels are kept: `FALLOW_KERNEL_CACHE` (`off` for nowhere), else
    /// `$XDG_CACHE_HOME/fallow/kernels`, else `~/.cache/fallow/kernels`.
    pub fn kernel_cache_from_vars(var: Vars<'_>) -> Option<PathBuf> {
        match var("FALLOW_KERNEL_CACHE") {
            Some(v) if v == "off" => None,
            Some(v) if !v.is_empty() => Some(PathBuf::from(v)),
            _ => var("XDG_CACHE_HOME")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
                .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".cache")))
                .map(|base| base.join("fallow").join("kernels")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_debug_list_is_the_defaults() {
        assert_eq!("".parse::<CudaDebug>(), Ok(CudaDebug::default()));
        assert_eq!(" , ".parse::<CudaDebug>(), Ok(CudaDebug::default()));
    }

    #[test]
    fn a_debug_list_turns_each_named_switch() {
        let debug: CudaDebug = "profile, no-graphs,no-fused-glu,split-min-keys=256,gemv=w8u4:2048,mmq=always,prefill=f32"
            .parse()
            .expect("a valid list");
        assert!(debug.profile && !debug.graphs && !debug.fused_glu);
        assert!(debug.fused_norm && debug.fused_rope && debug.early_start);
        assert_eq!(debug.split_min_keys, 256);
        assert_eq!(debug.gemv.as_deref(), Some("w8u4:2048"));
        assert_eq!(debug.mmq, MmqMode::Always);
        assert_eq!(debug.prefill, PrefillChoice::F32);
    }

    #[test]
    fn a_bad_debug_entry_is_refused_with_what_is_known() {
        let unknown = "no-graph".parse::<CudaDebug>().unwrap_err();
        assert!(
            unknown.contains("no-graph") && unknown.contains("no-graphs"),
            "{unknown}"
        );
        assert!("split-min-keys=3".parse::<CudaDebug>().is_err());
        assert!("split-min-keys".parse::<CudaDebug>().is_err());
        assert!("no-graphs=1".parse::<CudaDebug>().is_err());
        assert!("gemv=w9z9".parse::<CudaDebug>().is_err());
        assert!("mmq=1".parse::<CudaDebug>().is_err());
        assert!("prefill=fast".parse::<CudaDebug>().is_err());
    }

    #[test]
    fn the_fewest_keys_per_split_is_a_positive_multiple_of_an_iteration() {
        let keys = |v: &str| format!("split-min-keys={v}").parse::<CudaDebug>();
        assert_eq!(CudaDebug::default().split_min_keys, DEFAULT_MIN_PARTITION);
        assert_eq!(keys("256").map(|d| d.split_min_keys), Ok(256));
        assert_eq!(keys(" 32 ").map(|d| d.split_min_keys), Ok(32));
        for bad in ["0", "48", "-64", "many", ""] {
            let err = keys(bad).unwrap_err();
            assert!(err.contains("split-min-keys"), "{err}");
        }
    }

    /// `vars` as a process's variables.
    fn from(vars: &[(&str, &str)]) -> Result<CudaOptions, String> {
        let lookup = |name: &str| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| OsString::from(v))
        };
        CudaOptions::from_vars(&lookup)
    }

    #[test]
    fn the_variables_give_the_debug_list_and_the_kernel_cache() {
        let o = from(&[("FALLOW_CUDA_DEBUG", "no-graphs"), ("HOME", "/h")]).expect("valid");
        assert!(!o.debug.graphs);
        assert_eq!(
            o.kernel_cache,
            Some(PathBuf::from("/h/.cache/fallow/kernels"))
        );
        let o = from(&[("XDG_CACHE_HOME", "/x"), ("HOME", "/h")]).expect("valid");
        assert_eq!(o.kernel_cache, Some(PathBuf::from("/x/fallow/kernels")));
        let o = from(&[("FALLOW_KERNEL_CACHE", "/k"), ("HOME", "/h")]).expect("valid");
        assert_eq!(o.kernel_cache, Some(PathBuf::from("/k")));
        assert_eq!(
            from(&[("FALLOW_KERNEL_CACHE", "off")])
                .expect("valid")
                .kernel_cache,
            None
        );
        assert_eq!(from(&[]), Ok(CudaOptions::default()));
    }

    #[test]
    fn a_retired_variable_is_refused_with_its_replacement() {
        let err = from(&[("FALLOW_CUDA_GRAPHS", "0")]).unwrap_err();
        assert_eq!(
            err,
            "FALLOW_CUDA_GRAPHS is no longer read: use FALLOW_CUDA_DEBUG=no-graphs"
        );
        assert!(from(&[("FALLOW_CUDA_DEBUG", "no-graph")]).is_err());
    }

    #[test]
    fn gemv_auto_leaves_the_variant_to_timing() {
        let debug: CudaDebug = "gemv=w8u4,gemv=auto".parse().expect("valid");
        assert_eq!(debug.gemv, None);
    }
}
