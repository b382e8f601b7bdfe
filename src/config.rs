//! Layered configuration: defaults → `fallow.toml` → `FALLOW_*` environment variables →
//! flags. Clap already merges flags over environment variables; this module puts the file
//! and the defaults beneath them. Secrets (database passwords, the admin token) are never
//! printed; `secrets.rs` checks the admin token and masks URLs.

mod loras;

pub use loras::{lora_settings, LoraArg};

use crate::cli::{CudaArgs, ServiceArgs};
use anyhow::Context;
use fallow_api::parsers::reasoning::REASONING_PARSERS;
use fallow_api::parsers::tool_calls::TOOL_PARSERS;
use fallow_engine::backend::cuda::CudaOptions;
use fallow_engine::cpu_settings::{CpuKernels, CpuSettings};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// `fallow.toml`: every key optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub listen: Option<String>,
    pub database_url: Option<String>,
    pub redis_url: Option<String>,
    pub control_plane: Option<String>,
    pub runner_token_file: Option<PathBuf>,
    pub models: Option<Vec<String>>,
    pub loras: Option<Vec<String>>,
    pub lora_dir: Option<PathBuf>,
    pub lora_memory_mb: Option<u64>,
    pub auth: Option<bool>,
    pub slots: Option<usize>,
    pub device: Option<String>,
    pub cuda_weights: Option<String>,
    pub cuda_quant_x: Option<String>,
    pub cuda_split_norm: Option<bool>,
    pub kv_cache_mb: Option<usize>,
    pub max_model_len: Option<usize>,
    pub chat_template: Option<PathBuf>,
    pub request_timeout: Option<u64>,
    pub rate_limit_window: Option<u64>,
    pub lease_seconds: Option<u64>,
    pub store_dir: Option<PathBuf>,
    pub s3_bucket: Option<String>,
    pub s3_prefix: Option<String>,
    pub s3_endpoint: Option<String>,
    pub s3_region: Option<String>,
    pub s3_path_style: Option<bool>,
    pub admin_token: Option<String>,
    pub admin_token_file: Option<PathBuf>,
    pub allowed_hosts: Option<Vec<String>>,
    pub metrics_listen: Option<String>,
    pub owner_probe: Option<String>,
    pub owner_grace_seconds: Option<u64>,
    pub owner_every: Option<String>,
    pub shutdown_deadline: Option<String>,
    pub prepare_timeout: Option<String>,
    pub lend_windows: Option<String>,
    pub model_memory_mb: Option<u64>,
    pub keep_alive: Option<String>,
    pub cold_claim_after_ms: Option<u64>,
    pub pool: Option<String>,
    pub pool_max_share: Option<f64>,
}

/// How a gateway runner reaches the control plane: the api's URL and a runner token.
#[derive(Clone)]
pub struct ControlPlaneSettings {
    pub url: String,
    pub token: String,
}

impl std::fmt::Debug for ControlPlaneSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlaneSettings")
            .field("url", &self.url)
            .field("token", &"***")
            .finish()
    }
}

/// The gateway settings, if `--control-plane` is given: a runner token is then required, and
/// a database or Redis URL is refused, so a lent machine is never handed one by mistake.
fn control_plane(
    args: &ServiceArgs,
    file: &FileConfig,
) -> anyhow::Result<Option<ControlPlaneSettings>> {
    let token_file = args
        .runner_token_file
        .clone()
        .or(file.runner_token_file.clone());
    let Some(url) = args.control_plane.clone().or(file.control_plane.clone()) else {
        if args.runner_token.is_some() || token_file.is_some() {
            anyhow::bail!("a runner token is for --control-plane URL; give the api's URL too");
        }
        return Ok(None);
    };
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        anyhow::bail!("--control-plane {url:?}: give the api's http:// or https:// URL");
    }
    if args.database_url.is_some() || args.redis_url.is_some() {
        anyhow::bail!(
            "--control-plane runs the runner through the api's runner API: it takes no database or Redis URL (unset --database-url, --redis-url, FALLOW_DATABASE_URL and FALLOW_REDIS_URL)"
        );
    }
    let token = match (&args.runner_token, token_file) {
        (Some(token), _) => token.trim().to_string(),
        (None, Some(path)) => std::fs::read_to_string(&path)
            .with_context(|| format!("reading --runner-token-file {}", path.display()))?
            .trim()
            .to_string(),
        (None, None) => anyhow::bail!(
            "--control-plane needs a runner token: --runner-token-file PATH (or FALLOW_RUNNER_TOKEN); an operator creates one with `fallow admin runner-tokens create`"
        ),
    };
    if !token.starts_with(fallow_scheduler::runners::tokens::TOKEN_PREFIX) {
        anyhow::bail!(
            "the runner token does not start with {:?}: is it an API key or the admin token?",
            fallow_scheduler::runners::tokens::TOKEN_PREFIX
        );
    }
    Ok(Some(ControlPlaneSettings { url, token }))
}

/// Where batch files live: a local directory, or an S3 bucket.
#[derive(Debug, Clone)]
pub enum StoreSettings {
    Local(PathBuf),
    S3(fallow_scheduler::store::S3Config),
}

/// A model to serve, the id it is served under, and how it is kept warm.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSpec {
    pub id: String,
    pub path: PathBuf,
    /// `None` where the spec left it to the runner's default.
    pub keep_alive: Option<Option<Duration>>,
    pub min_warm: u32,
    /// Override the tool-call / reasoning syntax read off the chat template.
    pub tool_parser: Option<String>,
    pub reasoning_parser: Option<String>,
}

impl ModelSpec {
    /// `PATH` (id = the file or directory stem) or `ID=PATH`, then optional `;key=value`
    /// options: `keep_alive=DURATION` (or `forever`), `min_warm=N`.
    pub fn parse(spec: &str) -> anyhow::Result<ModelSpec> {
        let mut parts = spec.split(';');
        let target = parts.next().unwrap_or_default().trim();
        let (id, path) = match target.split_once('=') {
            Some((id, path)) if !id.is_empty() && !id.contains('/') => {
                (id.to_string(), PathBuf::from(path))
            }
            _ => {
                let path = PathBuf::from(target);
                (fallow_engine::runtime::model_id_for(&path), path)
            }
        };
        let mut spec_out = ModelSpec {
            id,
            path,
            keep_alive: None,
            min_warm: 0,
            tool_parser: None,
            reasoning_parser: None,
        };
        for option in parts.map(str::trim).filter(|o| !o.is_empty()) {
            match option.split_once('=') {
                Some(("keep_alive", value)) => {
                    spec_out.keep_alive =
                        Some(parse_duration(value).with_context(|| format!("model {spec:?}"))?);
                }
                Some(("min_warm", value)) => {
                    spec_out.min_warm = value.trim().parse().with_context(|| {
                        format!("model {spec:?}: min_warm={value:?} is not a count")
                    })?;
                }
                Some(("tool_parser", value)) => {
                    spec_out.tool_parser = Some(known(value, &TOOL_PARSERS, spec)?)
                }
                Some(("reasoning_parser", value)) => {
                    spec_out.reasoning_parser = Some(known(value, &REASONING_PARSERS, spec)?)
                }
                _ => anyhow::bail!(
                    "model {spec:?}: unknown option {option:?} (keep_alive=DURATION, min_warm=N, \
                     tool_parser=NAME, reasoning_parser=NAME)"
                ),
            }
        }
        Ok(spec_out)
    }
}

/// `value` if it is one of the `names` the api's parsers know.
fn known(value: &str, names: &[&str], spec: &str) -> anyhow::Result<String> {
    let value = value.trim();
    if names.contains(&value) {
        Ok(value.to_string())
    } else {
        anyhow::bail!("model {spec:?}: unknown parser {value:?} (one of {names:?})")
    }
}

/// A duration as operators write one (`keep_alive`, a drain's `--deadline`): `30s`, `5m`,
/// `1h`, `2d`, `250ms`, a bare number of seconds, or `forever` / `-1` (`None`).
pub fn parse_duration(value: &str) -> anyhow::Result<Option<Duration>> {
    let value = value.trim();
    if value == "forever" || value == "-1" {
        return Ok(None);
    }
    let split = value
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(value.len());
    let (number, unit) = value.split_at(split);
    let number: f64 = number
        .parse()
        .ok()
        .filter(|n: &f64| n.is_finite() && *n >= 0.0)
        .with_context(|| format!("duration {value:?}: expected e.g. 30s, 5m, 1h or forever"))?;
    let seconds = match unit {
        "ms" => number / 1000.0,
        "" | "s" => number,
        "m" => number * 60.0,
        "h" => number * 3600.0,
        "d" => number * 86400.0,
        _ => anyhow::bail!("duration {value:?}: unknown unit {unit:?} (ms, s, m, h, d)"),
    };
    Ok(Some(Duration::from_secs_f64(seconds)))
}

#[derive(Debug, Clone)]
pub struct Settings {
    pub listen: SocketAddr,
    pub database_url: String,
    pub redis_url: String,
    /// A gateway runner's way to the control plane; `None`: Postgres and Redis directly.
    pub control_plane: Option<ControlPlaneSettings>,
    pub models: Vec<ModelSpec>,
    /// LoRA adapters to serve over the models (bases checked once the models are known).
    pub loras: Vec<LoraArg>,
    pub lora_dir: Option<PathBuf>,
    pub lora_memory_mb: Option<u64>,
    /// `None` = the command's own default (dev: off, api: on).
    pub auth: Option<bool>,
    pub slots: usize,
    /// Where runners run their models.
    pub device: fallow_engine::runtime::Device,
    /// How CUDA runners run their models.
    pub cuda: CudaOptions,
    pub kv_cache_mb: usize,
    pub max_model_len: usize,
    pub chat_template: Option<PathBuf>,
    pub request_timeout: u64,
    /// Seconds of the tenants' rate-limit window (60).
    pub rate_limit_window: u64,
    pub lease_seconds: u64,
    pub store: StoreSettings,
    /// The admin API's token (a secret: never printed), checked against placeholders and
    /// the minimum length.
    pub admin_token: Option<String>,
    /// Host names the api answers to besides loopback names and IP literals.
    pub allowed_hosts: Vec<String>,
    /// `--no-auth-on-public-address`: serving without keys off loopback was asked for.
    pub no_auth_on_public_address: bool,
    /// Where `/metrics` is served on its own listener.
    pub metrics_listen: Option<SocketAddr>,
    /// The runner's owner probe, parsed (a bad spec fails at start-up).
    pub owner_probe: Option<fallow_runner::worker::OwnerProbe>,
    pub owner_grace_seconds: u64,
    /// How often the owner probe runs.
    pub owner_every: Duration,
    /// How long a runner lets in-flight jobs finish after SIGTERM before handing the rest
    /// back.
    pub shutdown_deadline: Duration,
    /// How long preparing one request may take on a runner.
    pub prepare_timeout: Duration,
    /// When the runner lends the machine (parsed: a bad spec fails at start-up).
    pub lend_windows: Option<fallow_runner::worker::LendingWindows>,
    /// Bytes the runner's resident models may take; `None`: no limit.
    pub model_memory_bytes: Option<u64>,
    /// Keep-alive of models whose spec names none; `None`: forever.
    pub keep_alive: Option<Duration>,
    pub cold_claim_after: Duration,
    pub pool: String,
    /// Checked to lie in (0, 1].
    pub pool_max_share: Option<f64>,
    /// The runner's test hook (`--test-engine-panic-marker`, debug builds only).
    pub panic_hook: fallow_runner::worker::PanicHook,
}

/// The runner's test hook: honoured by debug builds (what the test suite runs), refused by
/// release builds, so a served binary cannot be made to panic on purpose.
fn panic_hook(marker: Option<String>) -> anyhow::Result<fallow_runner::worker::PanicHook> {
    match marker.filter(|m| !m.is_empty()) {
        Some(_) if !cfg!(debug_assertions) => {
            anyhow::bail!("--test-engine-panic-marker is a test hook of debug builds only")
        }
        marker => Ok(fallow_runner::worker::PanicHook {
            marker: marker.map(Into::into),
        }),
    }
}

/// The local object store's directory when none is configured (git-ignored).
pub const DEFAULT_STORE_DIR: &str = "fallow-data/files";

pub const DEFAULT_MODEL: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

impl Settings {
    pub fn resolve(args: &ServiceArgs) -> anyhow::Result<Settings> {
        let file = load_file(args.config.as_deref())?;
        let store = store_settings(args, &file);
        let control_plane = control_plane(args, &file)?;
        let listen = args
            .listen
            .clone()
            .or(file.listen)
            .unwrap_or_else(|| "127.0.0.1:8000".to_string());
        let models = if !args.models.is_empty() {
            args.models.clone()
        } else {
            file.models.unwrap_or_default()
        };
        let auth = if args.auth {
            Some(true)
        } else if args.no_auth {
            Some(false)
        } else {
            env_bool("FALLOW_AUTH")?.or(file.auth)
        };
        Ok(Settings {
            listen: listen
                .parse()
                .with_context(|| format!("--listen {listen:?} is not ADDR:PORT"))?,
            control_plane,
            database_url: args
                .database_url
                .clone()
                .or(file.database_url)
                .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/postgres".to_string()),
            redis_url: args
                .redis_url
                .clone()
                .or(file.redis_url)
                .unwrap_or_else(|| "redis://127.0.0.1:6379/".to_string()),
            models: models
                .iter()
                .map(|m| ModelSpec::parse(m))
                .collect::<anyhow::Result<_>>()?,
            loras: if args.loras.is_empty() {
                file.loras.clone().unwrap_or_default()
            } else {
                args.loras.clone()
            }
            .iter()
            .map(|l| LoraArg::parse(l))
            .collect::<anyhow::Result<_>>()?,
            lora_dir: args.lora_dir.clone().or(file.lora_dir.clone()),
            lora_memory_mb: args.lora_memory_mb.or(file.lora_memory_mb),
            auth,
            slots: args.slots.or(file.slots).unwrap_or(16),
            device: match args.device.clone().or(file.device) {
                Some(d) => d
                    .parse()
                    .map_err(|e: String| anyhow::anyhow!("--device: {e}"))?,
                None => Default::default(),
            },
            cuda: args.cuda.options(CudaFile {
                weights: file.cuda_weights,
                quant_x: file.cuda_quant_x,
                split_norm: file.cuda_split_norm,
            })?,
            // 0: sized per device (the CPU's default pool; on CUDA, see `kv_pool_size`).
            kv_cache_mb: args.kv_cache_mb.or(file.kv_cache_mb).unwrap_or(0),
            max_model_len: args.max_model_len.or(file.max_model_len).unwrap_or(0),
            chat_template: args.chat_template.clone().or(file.chat_template),
            request_timeout: args.request_timeout.or(file.request_timeout).unwrap_or(600),
            rate_limit_window: args
                .rate_limit_window
                .or(file.rate_limit_window)
                .unwrap_or(60)
                .max(1),
            lease_seconds: args
                .lease_seconds
                .or(file.lease_seconds)
                .unwrap_or(30)
                .max(1),
            store,
            admin_token: admin_token(args, file.admin_token, file.admin_token_file)?,
            allowed_hosts: if args.allowed_hosts.is_empty() {
                file.allowed_hosts.unwrap_or_default()
            } else {
                args.allowed_hosts.clone()
            }
            .into_iter()
            .map(|h| h.trim().to_owned())
            .filter(|h| !h.is_empty())
            .collect(),
            no_auth_on_public_address: args.no_auth_on_public_address,
            metrics_listen: match args.metrics_listen.clone().or(file.metrics_listen) {
                Some(addr) => Some(
                    addr.parse()
                        .with_context(|| format!("--metrics-listen {addr:?} is not ADDR:PORT"))?,
                ),
                None => None,
            },
            owner_probe: args
                .owner_probe
                .clone()
                .or(file.owner_probe)
                .map(|spec| spec.parse())
                .transpose()?,
            owner_grace_seconds: args
                .owner_grace_seconds
                .or(file.owner_grace_seconds)
                .unwrap_or(60),
            owner_every: match args.owner_every.clone().or(file.owner_every) {
                Some(value) => parse_duration(&value)
                    .context("--owner-every")?
                    .filter(|every| !every.is_zero())
                    .context("--owner-every: a period, such as 500ms")?,
                None => fallow_runner::worker::DEFAULT_OWNER_EVERY,
            },
            shutdown_deadline: match args.shutdown_deadline.clone().or(file.shutdown_deadline) {
                Some(value) => parse_duration(&value)
                    .context("--shutdown-deadline")?
                    .context("--shutdown-deadline: give a duration, not forever")?,
                None => Duration::ZERO,
            },
            prepare_timeout: match args.prepare_timeout.clone().or(file.prepare_timeout) {
                Some(value) => parse_duration(&value)
                    .context("--prepare-timeout")?
                    .filter(|d| !d.is_zero())
                    .context("--prepare-timeout: give a duration above zero, not forever")?,
                None => fallow_runner::worker::DEFAULT_PREPARE_TIMEOUT,
            },
            lend_windows: args
                .lend_windows
                .clone()
                .or(file.lend_windows)
                .map(|spec| spec.parse())
                .transpose()?,
            model_memory_bytes: args
                .model_memory_mb
                .or(file.model_memory_mb)
                .filter(|mb| *mb > 0)
                .map(|mb| mb << 20),
            keep_alive: match args.keep_alive.clone().or(file.keep_alive) {
                Some(value) => parse_duration(&value).context("--keep-alive")?,
                None => None,
            },
            cold_claim_after: Duration::from_millis(
                args.cold_claim_after_ms
                    .or(file.cold_claim_after_ms)
                    .unwrap_or(2000),
            ),
            pool: args
                .pool
                .clone()
                .or(file.pool)
                .filter(|p| !p.is_empty())
                .unwrap_or_else(|| fallow_scheduler::runners::DEFAULT_POOL.to_string()),
            pool_max_share: match args.pool_max_share.or(file.pool_max_share) {
                Some(share) if share > 0.0 && share <= 1.0 => Some(share),
                Some(share) => {
                    anyhow::bail!("--pool-max-share {share} is not a share in (0, 1]")
                }
                None => None,
            },
            panic_hook: panic_hook(args.test_engine_panic_marker.clone())?,
        })
    }

    /// Refuses to serve without API keys on an address other machines can reach, unless
    /// `--no-auth-on-public-address` says that is meant.
    pub fn check_exposure(&self, auth: bool) -> anyhow::Result<()> {
        if auth || self.listen.ip().is_loopback() || self.no_auth_on_public_address {
            return Ok(());
        }
        anyhow::bail!(
            "refusing to serve without API keys on {}, which other machines can reach: anyone              there could use the models and the admin API. Listen on 127.0.0.1, add --auth, or              pass --no-auth-on-public-address if a firewall or an authenticating proxy guards              this address",
            self.listen
        )
    }

    /// Whether the api checks `Host` headers: on a loopback bind (where DNS rebinding is the
    /// threat), or wherever an allow-list was given.
    pub fn check_host(&self) -> bool {
        self.listen.ip().is_loopback() || !self.allowed_hosts.is_empty()
    }

    /// The models to serve, falling back to the default model when none was named.
    pub fn models_or_default(&self) -> Vec<ModelSpec> {
        if self.models.is_empty() {
            vec![ModelSpec {
                id: fallow_engine::runtime::model_id_for(Path::new(DEFAULT_MODEL)),
                path: PathBuf::from(DEFAULT_MODEL),
                keep_alive: None,
                min_warm: 0,
                tool_parser: None,
                reasoning_parser: None,
            }]
        } else {
            self.models.clone()
        }
    }
}

/// The admin token from the flag or variable, else `fallow.toml`'s `admin_token`, else the
/// token file (flag, variable or file key), checked.
fn admin_token(
    args: &ServiceArgs,
    file_token: Option<String>,
    file_token_file: Option<PathBuf>,
) -> anyhow::Result<Option<String>> {
    let token = match (&args.admin_token, &args.admin_token_file) {
        (Some(token), _) => Some(token.clone()),
        (None, Some(path)) => Some(crate::secrets::read_admin_token_file(path)?),
        (None, None) => match (file_token, file_token_file) {
            (Some(token), _) => Some(token),
            (None, Some(path)) => Some(crate::secrets::read_admin_token_file(&path)?),
            (None, None) => None,
        },
    };
    let token = token.filter(|t| !t.is_empty());
    if let Some(token) = &token {
        crate::secrets::check_admin_token(token)?;
    }
    Ok(token)
}

fn store_settings(args: &ServiceArgs, file: &FileConfig) -> StoreSettings {
    match args.s3_bucket.clone().or(file.s3_bucket.clone()) {
        Some(bucket) => StoreSettings::S3(fallow_scheduler::store::S3Config {
            bucket,
            prefix: args
                .s3_prefix
                .clone()
                .or(file.s3_prefix.clone())
                .unwrap_or_default(),
            endpoint: args.s3_endpoint.clone().or(file.s3_endpoint.clone()),
            region: args.s3_region.clone().or(file.s3_region.clone()),
            force_path_style: args.s3_path_style || file.s3_path_style.unwrap_or(false),
        }),
        None => StoreSettings::Local(
            args.store_dir
                .clone()
                .or(file.store_dir.clone())
                .unwrap_or_else(|| PathBuf::from(DEFAULT_STORE_DIR)),
        ),
    }
}

/// The CUDA keys of `fallow.toml`.
#[derive(Debug, Default)]
pub struct CudaFile {
    pub weights: Option<String>,
    pub quant_x: Option<String>,
    pub split_norm: Option<bool>,
}

impl CudaArgs {
    /// The CUDA backend's options: the environment's debug list and kernel cache
    /// ([`CudaOptions::from_vars`], over the process environment), the file's keys over the defaults, and the flags (or their
    /// variables) over both.
    pub fn options(&self, file: CudaFile) -> anyhow::Result<CudaOptions> {
        let mut options =
            CudaOptions::from_vars(&|name| std::env::var_os(name)).map_err(anyhow::Error::msg)?;
        if let Some(weights) = self.cuda_weights.clone().or(file.weights) {
            options.weights = weights
                .parse()
                .map_err(|e: String| anyhow::anyhow!("--cuda-weights: {e}"))?;
        }
        if let Some(x) = self.cuda_quant_x.clone().or(file.quant_x) {
            options.quant_x = x
                .parse()
                .map_err(|e: String| anyhow::anyhow!("--cuda-quant-x: {e}"))?;
        }
        options.split_norm = self.cuda_split_norm || file.split_norm.unwrap_or(false);
        if let Some(list) = &self.cuda_debug {
            options.debug = list
                .parse()
                .map_err(|e: String| anyhow::anyhow!("--cuda-debug: {e}"))?;
        }
        Ok(options)
    }
}

/// The CPU backend's settings from the process environment: `FALLOW_CPU_THREADS` (else
/// `RAYON_NUM_THREADS`, honoured as before) and `FALLOW_CPU_KERNELS` (`scalar`, `avx2`,
/// `best`). Read once here; `main` fixes them before any model loads.
pub fn cpu_settings() -> anyhow::Result<CpuSettings> {
    let threads = match std::env::var("FALLOW_CPU_THREADS") {
        Ok(v) => Some(
            v.trim()
                .parse::<usize>()
                .with_context(|| format!("FALLOW_CPU_THREADS={v:?} is not a thread count"))?,
        ),
        // Another tool's variable: used when it parses, as it always was.
        Err(_) => std::env::var("RAYON_NUM_THREADS")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok()),
    };
    let kernels = match std::env::var("FALLOW_CPU_KERNELS") {
        Ok(v) => v
            .parse()
            .map_err(|e: String| anyhow::anyhow!("FALLOW_CPU_KERNELS: {e}"))?,
        Err(_) => CpuKernels::default(),
    };
    Ok(CpuSettings { threads, kernels })
}

fn load_file(path: Option<&Path>) -> anyhow::Result<FileConfig> {
    let (path, required) = match path {
        Some(p) => (p.to_path_buf(), true),
        None => (PathBuf::from("fallow.toml"), false),
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => toml::from_str(&text).with_context(|| format!("parsing {}", path.display())),
        Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => {
            Ok(FileConfig::default())
        }
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

fn env_bool(name: &str) -> anyhow::Result<Option<bool>> {
    match std::env::var(name) {
        Ok(v) => match v.to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "on" => Ok(Some(true)),
            "0" | "false" | "no" | "off" => Ok(Some(false)),
            _ => anyhow::bail!("{name}={v:?} is not a boolean"),
        },
        Err(_) => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_spec_takes_its_id_from_the_file_stem() {
        let spec = ModelSpec::parse("models/SmolLM2-135M-Instruct.Q4_1.gguf").unwrap();
        assert_eq!(spec.id, "SmolLM2-135M-Instruct.Q4_1");
        assert_eq!((spec.keep_alive, spec.min_warm), (None, 0));
    }

    #[test]
    fn a_model_spec_can_name_its_id() {
        let spec = ModelSpec::parse("smol=models/a.gguf").unwrap();
        assert_eq!(spec.id, "smol");
        assert_eq!(spec.path, PathBuf::from("models/a.gguf"));
    }

    #[test]
    fn a_model_spec_carries_its_warm_policy() {
        let spec = ModelSpec::parse("smol=models/a.gguf;keep_alive=5m; min_warm=2").unwrap();
        assert_eq!(spec.path, PathBuf::from("models/a.gguf"));
        assert_eq!(spec.keep_alive, Some(Some(Duration::from_secs(300))));
        assert_eq!(spec.min_warm, 2);
        let parsers =
            ModelSpec::parse("q=/m/q.gguf;tool_parser=llama3_json;reasoning_parser=qwen3").unwrap();
        assert_eq!(parsers.tool_parser.as_deref(), Some("llama3_json"));
        assert_eq!(parsers.reasoning_parser.as_deref(), Some("qwen3"));
        assert!(ModelSpec::parse("q=/m/q.gguf;tool_parser=xml").is_err());
        let forever = ModelSpec::parse("models/a.gguf;keep_alive=forever").unwrap();
        assert_eq!(forever.keep_alive, Some(None));
        assert!(ModelSpec::parse("models/a.gguf;keepalive=5m").is_err());
        assert!(ModelSpec::parse("models/a.gguf;min_warm=-1").is_err());
    }

    #[test]
    fn keep_alive_durations_take_the_usual_units() {
        let secs = |v: &str| parse_duration(v).unwrap().map(|d| d.as_secs_f64());
        assert_eq!(secs("30s"), Some(30.0));
        assert_eq!(secs("1.5m"), Some(90.0));
        assert_eq!(secs("2h"), Some(7200.0));
        assert_eq!(secs("250ms"), Some(0.25));
        assert_eq!(secs("45"), Some(45.0));
        assert_eq!(secs("0"), Some(0.0));
        assert_eq!(secs("-1"), None);
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("5y").is_err());
    }

    #[test]
    fn flags_win_over_the_file_and_the_file_over_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("fallow.toml");
        std::fs::write(&file, "listen = \"127.0.0.1:9000\"\nslots = 3\n").unwrap();
        let args = ServiceArgs {
            config: Some(file),
            slots: Some(5),
            ..Default::default()
        };
        let s = Settings::resolve(&args).unwrap();
        assert_eq!(s.listen.port(), 9000);
        assert_eq!(s.slots, 5);
        assert_eq!(s.kv_cache_mb, 0, "automatic unless given");
    }

    #[test]
    fn the_owner_probe_runs_every_500ms_unless_told_and_never_continuously() {
        let every = |value: Option<&str>| {
            Settings::resolve(&ServiceArgs {
                owner_every: value.map(str::to_string),
                ..Default::default()
            })
            .map(|s| s.owner_every)
        };
        assert_eq!(every(None).unwrap(), Duration::from_millis(500));
        assert_eq!(every(Some("100ms")).unwrap(), Duration::from_millis(100));
        assert!(every(Some("0s")).is_err());
        assert!(every(Some("forever")).is_err());
    }

    fn no_auth_on(listen: &str) -> ServiceArgs {
        ServiceArgs {
            listen: Some(listen.into()),
            no_auth: true,
            ..Default::default()
        }
    }

    #[test]
    fn no_auth_off_loopback_refuses_to_start_unless_asked_for() {
        let public = Settings::resolve(&no_auth_on("0.0.0.0:8000")).unwrap();
        let err = public.check_exposure(false).unwrap_err().to_string();
        assert!(err.contains("--no-auth-on-public-address"), "{err}");
        assert!(
            public.check_exposure(true).is_ok(),
            "with keys it may serve anywhere"
        );
        let local = Settings::resolve(&no_auth_on("127.0.0.1:8000")).unwrap();
        assert!(local.check_exposure(false).is_ok());
        let asked = Settings::resolve(&ServiceArgs {
            no_auth_on_public_address: true,
            ..no_auth_on("0.0.0.0:8000")
        })
        .unwrap();
        assert!(asked.check_exposure(false).is_ok());
    }

    #[test]
    fn hosts_are_checked_on_loopback_or_with_an_allow_list() {
        let local = Settings::resolve(&no_auth_on("127.0.0.1:8000")).unwrap();
        assert!(local.check_host());
        let public = Settings::resolve(&no_auth_on("0.0.0.0:8000")).unwrap();
        assert!(
            !public.check_host(),
            "a public bind with keys works like vLLM's"
        );
        let listed = Settings::resolve(&ServiceArgs {
            allowed_hosts: vec!["fallow.internal".into()],
            ..no_auth_on("0.0.0.0:8000")
        })
        .unwrap();
        assert!(listed.check_host());
        assert_eq!(listed.allowed_hosts, ["fallow.internal"]);
    }

    #[test]
    fn a_placeholder_admin_token_is_refused_at_start() {
        let err = Settings::resolve(&ServiceArgs {
            admin_token: Some("CHANGE-ME".into()),
            ..Default::default()
        })
        .unwrap_err()
        .to_string();
        assert!(err.contains("placeholder"), "{err}");
    }

    #[test]
    fn the_admin_token_can_come_from_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("admin-token");
        std::fs::write(&path, "9d1e7c3b5a2f4e6d8c0b\n").unwrap();
        let s = Settings::resolve(&ServiceArgs {
            admin_token_file: Some(path.clone()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(s.admin_token.as_deref(), Some("9d1e7c3b5a2f4e6d8c0b"));
        let config = dir.path().join("fallow.toml");
        std::fs::write(&config, format!("admin_token_file = {:?}\n", path)).unwrap();
        let from_file = Settings::resolve(&ServiceArgs {
            config: Some(config),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(from_file.admin_token, s.admin_token);
    }
}
