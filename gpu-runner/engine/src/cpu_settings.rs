//! The CPU backend's process-wide settings: how many threads its worker team has, and which
//! row kernels it may use. Both are fixed for the life of the process (the team starts once,
//! and every matrix product asks for its kernels), so the edge sets them once with
//! [`configure`] before the first model loads; without it they are the defaults.

use std::str::FromStr;
use std::sync::OnceLock;

/// The CPU backend's settings.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuSettings {
    /// Threads of the worker team, the caller included; `None`: the CPUs available.
    pub threads: Option<usize>,
    /// The fastest row kernels allowed (slower ones are for comparisons).
    pub kernels: CpuKernels,
}

/// The fastest row-kernel set the CPU backend may use; it never uses one this CPU lacks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum CpuKernels {
    /// The portable kernels.
    Scalar,
    /// AVX2, not AVX-512 VNNI.
    Avx2,
    /// The best this CPU has.
    #[default]
    Best,
}

impl FromStr for CpuKernels {
    type Err = String;

    /// `FALLOW_CPU_KERNELS`'s value: `scalar`, `avx2` or `best`.
    fn from_str(value: &str) -> Result<Self, String> {
        match value.trim() {
            "scalar" => Ok(CpuKernels::Scalar),
            "avx2" => Ok(CpuKernels::Avx2),
            "best" | "" => Ok(CpuKernels::Best),
            other => Err(format!("{other:?}: expected scalar, avx2 or best")),
        }
    }
}

static SETTINGS: OnceLock<CpuSettings> = OnceLock::new();

/// Fixes the settings for this process; refused once they are fixed otherwise (set before,
/// or read with the defaults by a model that ran already).
pub fn configure(settings: CpuSettings) -> Result<(), String> {
    let fixed = *SETTINGS.get_or_init(|| settings);
    if fixed == settings {
        Ok(())
    } else {
        Err(format!(
            "the CPU settings are fixed at {fixed:?} already; {settings:?} comes too late"
        ))
    }
}

/// The settings in force (the defaults unless [`configure`]d first).
pub(crate) fn settings() -> CpuSettings {
    *SETTINGS.get_or_init(CpuSettings::default)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_caps_parse_and_order_from_slowest_to_best() {
        assert_eq!("scalar".parse(), Ok(CpuKernels::Scalar));
        assert_eq!("avx2".parse(), Ok(CpuKernels::Avx2));
        assert_eq!("best".parse(), Ok(CpuKernels::Best));
        assert!("vnni2".parse::<CpuKernels>().is_err());
        assert!(CpuKernels::Scalar < CpuKernels::Avx2 && CpuKernels::Avx2 < CpuKernels::Best);
    }

    #[test]
    fn the_settings_in_force_are_the_first_ones_and_a_different_later_set_is_refused() {
        // The test process reads the defaults (other tests' models ran with them).
        let current = settings();
        assert_eq!(configure(current), Ok(()));
        let other = CpuSettings {
            threads: Some(current.threads.unwrap_or(1) + 1),
            ..current
        };
        assert!(configure(other).is_err());
    }
}
