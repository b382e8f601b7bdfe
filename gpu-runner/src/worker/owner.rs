//! Watching the GPU's owner. A runner lends a machine that belongs to someone else; the
//! moment the owner needs it back, the runner must step aside. What "the owner is active"
//! means differs per machine, so it is a pluggable probe:
//!
//! - `file:/path` — the owner is active while the file exists (tests, or a hook the owner's
//!   own tooling touches);
//! - `command:CMD` — `sh -c CMD` exits 0 while the owner is active (any site-specific check);
//! - `nvidia-smi[:PERCENT]` — a compute process that is not this runner's, or GPU utilisation
//!   above PERCENT (default 10) while this runner has no process on the GPU.
//!
//! [`watch`] polls the probe (every ~500 ms) and publishes a debounced verdict: `true` as soon
//! as the owner is seen, `false` only after the owner has been idle for the grace period, so
//! a runner does not flap back in between two bursts of the owner's work. A probe that fails
//! counts as "owner active": when in doubt, the owner wins. Outside the lending windows
//! ([`super::lending`]) the owner counts as active too.

use std::path::PathBuf;

use super::lending::LendingWindows;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::process::Command;
use tokio::sync::watch;

/// How long one probe command may take before it counts as failed.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnerProbe {
    File(PathBuf),
    Command(String),
    NvidiaSmi { busy_percent: u32 },
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid owner probe {spec:?}: {reason} (expected file:/PATH, command:CMD or nvidia-smi[:PERCENT])")]
pub struct ProbeSpecError {
    spec: String,
    reason: &'static str,
}

impl std::str::FromStr for OwnerProbe {
    type Err = ProbeSpecError;
    fn from_str(spec: &str) -> Result<Self, ProbeSpecError> {
        let error = |reason| ProbeSpecError {
            spec: spec.to_string(),
            reason,
        };
        let (kind, arg) = match spec.split_once(':') {
            Some((kind, arg)) => (kind, Some(arg)),
            None => (spec, None),
        };
        match (kind, arg) {
            ("file", Some(path)) if !path.is_empty() => Ok(OwnerProbe::File(path.into())),
            ("command", Some(cmd)) if !cmd.trim().is_empty() => {
                Ok(OwnerProbe::Command(cmd.to_string()))
            }
            ("nvidia-smi", None) => Ok(OwnerProbe::NvidiaSmi { busy_percent: 10 }),
            ("nvidia-smi", Some(pct)) => match pct.parse::<u32>() {
                Ok(p) if p <= 100 => Ok(OwnerProbe::NvidiaSmi { busy_percent: p }),
                _ => Err(error(
                    "the utilisation threshold must be a percentage 0-100",
                )),
            },
            ("file" | "command", _) => Err(error("missing the path or command after ':'")),
            _ => Err(error("unknown probe kind")),
        }
    }
}

impl OwnerProbe {
    /// Whether the probe can run on this machine (`nvidia-smi` needs the binary).
    pub fn available(&self) -> bool {
        match self {
            OwnerProbe::NvidiaSmi { .. } => find_in_path("nvidia-smi").is_some(),
            _ => true,
        }
    }

    /// One look: is the owner active now?
    pub async fn owner_active(&self) -> Result<bool, String> {
        match self {
            OwnerProbe::File(path) => Ok(tokio::fs::try_exists(path).await.unwrap_or(true)),
            OwnerProbe::Command(cmd) => {
                let status = run(Command::new("sh").arg("-c").arg(cmd)).await?;
                Ok(status.0)
            }
            OwnerProbe::NvidiaSmi { busy_percent } => nvidia_smi_busy(*busy_percent).await,
        }
    }
}

/// Runs a command quietly with a timeout; returns (exited 0, stdout).
async fn run(command: &mut Command) -> Result<(bool, String), String> {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    let output = tokio::time::timeout(PROBE_TIMEOUT, command.output())
        .await
        .map_err(|_| format!("probe took longer than {PROBE_TIMEOUT:?}"))?
        .map_err(|e| format!("probe could not run: {e}"))?;
    Ok((
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
    ))
}

async fn nvidia_smi_busy(busy_percent: u32) -> Result<bool, String> {
    let (ok, apps) = run(Command::new("nvidia-smi")
        .args(["--query-compute-apps=pid", "--format=csv,noheader,nounits"]))
    .await?;
    if !ok {
        return Err("nvidia-smi --query-compute-apps failed".into());
    }
    match gpu_processes(&apps, std::process::id()) {
        GpuProcesses::Foreign => return Ok(true),
        // The load is ours; utilisation says nothing about the owner.
        GpuProcesses::OnlyOurs => return Ok(false),
        GpuProcesses::None => {}
    }
    let (ok, util) = run(Command::new("nvidia-smi").args([
        "--query-gpu=utilization.gpu",
        "--format=csv,noheader,nounits",
    ]))
    .await?;
    if !ok {
        return Err("nvidia-smi --query-gpu failed".into());
    }
    Ok(utilisation_above(&util, busy_percent))
}

#[derive(Debug, PartialEq, Eq)]
enum GpuProcesses {
    None,
    OnlyOurs,
    Foreign,
}

/// Reads `--query-compute-apps=pid` output (one pid a line; `[N/A]` lines are skipped).
fn gpu_processes(apps: &str, me: u32) -> GpuProcesses {
    let pids: Vec<u32> = apps.lines().filter_map(|l| l.trim().parse().ok()).collect();
    if pids.iter().any(|&pid| pid != me) {
        GpuProcesses::Foreign
    } else if pids.is_empty() {
        GpuProcesses::None
    } else {
        GpuProcesses::OnlyOurs
    }
}

/// Reads `--query-gpu=utilization.gpu` output (one percentage per GPU a line).
fn utilisation_above(util: &str, busy_percent: u32) -> bool {
    util.lines()
        .filter_map(|l| l.trim().parse::<u32>().ok())
        .any(|u| u > busy_percent)
}

fn find_in_path(binary: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(binary))
        .find(|p| p.is_file())
}

/// The debounced verdict: active at once, idle only after `grace` without activity. It
/// starts as "active" until the first look, so nothing is claimed before the probe has
/// spoken; a first look that finds the owner idle returns at once.
#[derive(Debug)]
pub struct OwnerDebounce {
    grace: Duration,
    active: bool,
    last_seen: Option<Instant>,
}

impl OwnerDebounce {
    pub fn new(grace: Duration) -> Self {
        OwnerDebounce {
            grace,
            active: true,
            last_seen: None,
        }
    }

    /// Folds in one probe result; returns the new verdict when it changed.
    pub fn observe(&mut self, seen_active: bool, now: Instant) -> Option<bool> {
        if seen_active {
            self.last_seen = Some(now);
            if !self.active {
                self.active = true;
                return Some(true);
            }
            return None;
        }
        let idle_long_enough = self
            .last_seen
            .is_none_or(|seen| now.saturating_duration_since(seen) >= self.grace);
        if self.active && idle_long_enough {
            self.active = false;
            return Some(false);
        }
        None
    }
}

/// Polls `probe` every `every` and publishes the debounced verdict (initially `true`: see
/// [`OwnerDebounce`]) until the receiver is dropped. Outside the lending `windows` the owner
/// counts as active whatever the probe says; without a probe only the windows decide.
pub fn watch(
    probe: Option<OwnerProbe>,
    windows: Option<LendingWindows>,
    every: Duration,
    grace: Duration,
) -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(true);
    tokio::spawn(async move {
        let mut debounce = OwnerDebounce::new(grace);
        let mut tick = tokio::time::interval(every.max(Duration::from_millis(10)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tx.closed() => return,
                _ = tick.tick() => {}
            }
            let lent = windows
                .as_ref()
                .is_none_or(|w| w.contains(chrono::Utc::now()));
            let seen = !lent || match &probe {
                Some(probe) => probe.owner_active().await.unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "owner probe failed; assuming the owner is active");
                    true
                }),
                None => false,
            };
            if let Some(active) = debounce.observe(seen, Instant::now()) {
                tracing::info!(owner_active = active, "owner activity changed");
                if tx.send(active).is_err() {
                    return;
                }
            }
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_specs_parse_into_their_kinds() {
        assert_eq!(
            "file:/tmp/owner".parse::<OwnerProbe>().unwrap(),
            OwnerProbe::File("/tmp/owner".into())
        );
        assert_eq!(
            "command:test -e /x".parse::<OwnerProbe>().unwrap(),
            OwnerProbe::Command("test -e /x".into())
        );
        assert_eq!(
            "nvidia-smi".parse::<OwnerProbe>().unwrap(),
            OwnerProbe::NvidiaSmi { busy_percent: 10 }
        );
        assert_eq!(
            "nvidia-smi:50".parse::<OwnerProbe>().unwrap(),
            OwnerProbe::NvidiaSmi { busy_percent: 50 }
        );
    }

    #[test]
    fn bad_probe_specs_are_rejected_with_the_reason() {
        for bad in ["", "file:", "command: ", "nvidia-smi:150", "nvml", "nope:x"] {
            let err = bad.parse::<OwnerProbe>().unwrap_err();
            assert!(
                err.to_string().contains("expected file:/PATH"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn the_owner_counts_as_active_at_once_and_idle_only_after_the_grace_period() {
        let start = Instant::now();
        let grace = Duration::from_secs(3);
        let mut d = OwnerDebounce::new(grace);
        assert_eq!(
            d.observe(false, start),
            Some(false),
            "idle at the first look"
        );
        assert_eq!(d.observe(false, start), None);
        assert_eq!(
            d.observe(true, start + Duration::from_millis(500)),
            Some(true)
        );
        assert_eq!(d.observe(true, start + Duration::from_secs(1)), None);
        assert_eq!(d.observe(false, start + Duration::from_secs(2)), None);
        assert_eq!(d.observe(false, start + Duration::from_secs(3)), None);
        assert_eq!(
            d.observe(false, start + Duration::from_secs(4)),
            Some(false)
        );
        assert_eq!(d.observe(false, start + Duration::from_secs(5)), None);
    }

    #[test]
    fn nvidia_smi_output_tells_foreign_processes_and_utilisation() {
        assert_eq!(gpu_processes("", 42), GpuProcesses::None);
        assert_eq!(gpu_processes("42\n", 42), GpuProcesses::OnlyOurs);
        assert_eq!(gpu_processes("42\n 4711\n", 42), GpuProcesses::Foreign);
        assert_eq!(gpu_processes("[N/A]\n", 42), GpuProcesses::None);
        assert!(utilisation_above("3\n57\n", 10));
        assert!(!utilisation_above("0\n10\n", 10));
        assert!(!utilisation_above("[N/A]\n", 10));
    }

    #[tokio::test]
    async fn the_file_probe_follows_the_file_and_the_command_probe_its_exit_status() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("owner");
        let probe = OwnerProbe::File(path.clone());
        assert!(!probe.owner_active().await.unwrap());
        std::fs::write(&path, b"").unwrap();
        assert!(probe.owner_active().await.unwrap());

        let cmd = OwnerProbe::Command(format!("test -e {}", path.display()));
        assert!(cmd.owner_active().await.unwrap());
        std::fs::remove_file(&path).unwrap();
        assert!(!cmd.owner_active().await.unwrap());
    }
}
