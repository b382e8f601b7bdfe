//! The command line. Service flags fall back to `FALLOW_*` environment variables, then to
//! `fallow.toml`, then to defaults (see `config.rs`).

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    name = "fallow",
    version,
    about = "OpenAI-compatible chat completions on idle GPUs"
)]
pub struct Cli {
    /// More logging (debug for Fallow's crates).
    #[arg(short, long, global = true)]
    pub verbose: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// api + scheduler maintenance + one runner, in one process.
    Dev(ServiceArgs),
    /// The HTTP tier only.
    Api(ServiceArgs),
    /// Maintenance loops only (lease reaper, pruning, the batch worker).
    Scheduler(ServiceArgs),
    /// A runner only: claims jobs for its models and runs them.
    Runner(ServiceArgs),
    /// Applies database migrations.
    Migrate(ServiceArgs),
    /// Administration.
    Admin {
        #[command(subcommand)]
        command: AdminCommand,
    },
    /// Generates from a prompt with the engine alone (no services), streaming to stdout.
    Generate(GenerateArgs),
    /// Interactive multi-turn chat in the terminal with the engine alone.
    Chat(ChatArgs),
    /// OpenAI-style batches over the HTTP API.
    Batch {
        #[command(subcommand)]
        command: BatchCommand,
    },
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        command: BenchCommand,
    },
}

/// How a model runs on CUDA (`docs/cuda.md`); ignored on the CPU.
#[derive(Args, Debug, Clone, Default)]
pub struct CudaArgs {
    /// How CUDA stores a model's matrices: bf16 (default), quantized (a GGUF's blocks, read
    /// by dequantizing kernels), q8_0 (those, and float matrices quantized to Q8_0 at load)
    /// or q4_k (as q8_0, with Q4_K where rows are whole 256-element super-blocks).
    #[arg(long, env = "FALLOW_CUDA_WEIGHTS")]
    pub cuda_weights: Option<String>,
    /// How quantized matrices' products of up to 64 token rows read x: bf16 (default) or
    /// int8 (rounded per group of 32: integer dot products and the int8 tensor cores).
    #[arg(long, env = "FALLOW_CUDA_QUANT_X")]
    pub cuda_quant_x: Option<String>,
    /// Split decode steps' sub-block ends with the next product (models without
    /// post-norms): no norm launch, within bf16 rounding of the whole ends.
    #[arg(long, env = "FALLOW_CUDA_SPLIT_NORM")]
    pub cuda_split_norm: bool,
    /// Diagnostics and A/B switches, comma separated (`profile`, `no-graphs`, …; the list
    /// is in docs/cuda.md). Replaces `FALLOW_CUDA_DEBUG`.
    #[arg(long)]
    pub cuda_debug: Option<String>,
}

#[derive(Args, Debug, Clone, Default)]
pub struct ServiceArgs {
    /// Config file (default: ./fallow.toml when present).
    #[arg(long, env = "FALLOW_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address to serve HTTP on.
    #[arg(long, env = "FALLOW_LISTEN")]
    pub listen: Option<String>,
    /// Postgres URL. Its password is never printed (`--help` hides the variable's value).
    #[arg(long, env = "FALLOW_DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// Redis URL. Its password is never printed.
    #[arg(long, env = "FALLOW_REDIS_URL", hide_env_values = true)]
    pub redis_url: Option<String>,
    /// A runner on a lent machine: the api's URL. The runner reaches the control plane
    /// through the api's runner API with a runner token, and holds no database or Redis URL.
    #[arg(long, env = "FALLOW_CONTROL_PLANE")]
    pub control_plane: Option<String>,
    /// The runner token, with --control-plane. Prefer --runner-token-file: a flag shows in
    /// `ps`.
    #[arg(
        long,
        env = "FALLOW_RUNNER_TOKEN",
        hide_env_values = true,
        conflicts_with = "runner_token_file"
    )]
    pub runner_token: Option<String>,
    /// A file holding the runner token (mode 0600), with --control-plane.
    #[arg(long, env = "FALLOW_RUNNER_TOKEN_FILE")]
    pub runner_token_file: Option<PathBuf>,
    /// A model to serve: a GGUF file or an HF directory, optionally `id=PATH`, optionally
    /// followed by `;keep_alive=DURATION`, `;min_warm=N`, `;tool_parser=NAME` and
    /// `;reasoning_parser=NAME`. Repeatable.
    #[arg(long = "model", env = "FALLOW_MODELS", value_delimiter = ',')]
    pub models: Vec<String>,
    /// A LoRA adapter to serve over a model: `NAME=PATH` (a PEFT adapter directory),
    /// optionally followed by `;base=MODEL` (needed when the runner serves several models).
    /// Clients ask for `MODEL:NAME`. Repeatable.
    #[arg(long = "lora", env = "FALLOW_LORAS", value_delimiter = ',')]
    pub loras: Vec<String>,
    /// A directory whose adapters requests may name by `lora_path` (a path inside it).
    #[arg(long, env = "FALLOW_LORA_DIR")]
    pub lora_dir: Option<PathBuf>,
    /// Memory (MiB) the runner's LoRA adapters may take (default 1024); the least recently
    /// used idle adapter leaves first.
    #[arg(long, env = "FALLOW_LORA_MEMORY_MB")]
    pub lora_memory_mb: Option<u64>,
    /// Require API keys.
    #[arg(long, overrides_with = "no_auth")]
    pub auth: bool,
    /// Accept requests without API keys (on a loopback address only, unless
    /// --no-auth-on-public-address).
    #[arg(long)]
    pub no_auth: bool,
    /// Allow serving without API keys on an address other machines can reach (behind a
    /// firewall or an authenticating proxy).
    #[arg(long)]
    pub no_auth_on_public_address: bool,
    /// A Host name the api answers to besides loopback names and IP addresses (checked on
    /// a loopback bind, or whenever one is given, against DNS rebinding); `*` for any.
    /// Repeatable.
    #[arg(
        long = "allowed-host",
        env = "FALLOW_ALLOWED_HOSTS",
        value_delimiter = ','
    )]
    pub allowed_hosts: Vec<String>,
    /// Jobs a runner holds at once.
    #[arg(long, env = "FALLOW_SLOTS")]
    pub slots: Option<usize>,
    /// Where runners run their models: cpu, cuda, cuda:N or auto.
    #[arg(long, env = "FALLOW_DEVICE")]
    pub device: Option<String>,
    #[command(flatten)]
    pub cuda: CudaArgs,
    /// KV cache per model, in MiB. Unset or 0: automatic (512 MiB on the CPU; on CUDA room
    /// for every slot at the model's full context, within --model-memory-mb after the
    /// weights and within the device memory free at load).
    #[arg(long, env = "FALLOW_KV_CACHE_MB")]
    pub kv_cache_mb: Option<usize>,
    /// Caps every model's context length.
    #[arg(long, env = "FALLOW_MAX_MODEL_LEN")]
    pub max_model_len: Option<usize>,
    /// A chat template file overriding the models' own.
    #[arg(long, env = "FALLOW_CHAT_TEMPLATE")]
    pub chat_template: Option<PathBuf>,
    /// Seconds a runner's claim on a job lasts without a heartbeat (heartbeats come at a third
    /// of it).
    #[arg(long, env = "FALLOW_LEASE_SECONDS")]
    pub lease_seconds: Option<u64>,
    /// Serve Prometheus `/metrics` on this address too, without the Host check (`api`,
    /// `dev`: the main listener keeps it for the dashboard; `runner`: its engine gauges).
    #[arg(long, env = "FALLOW_METRICS_LISTEN")]
    pub metrics_listen: Option<String>,
    /// Seconds the api waits for a completion before giving up.
    #[arg(long, env = "FALLOW_REQUEST_TIMEOUT")]
    pub request_timeout: Option<u64>,
    /// Seconds of the tenants' rate-limit window: 60, as "per minute" says; tests shorten it.
    #[arg(long, env = "FALLOW_RATE_LIMIT_WINDOW")]
    pub rate_limit_window: Option<u64>,
    /// Directory of the local object store (batch files), when no S3 bucket is set.
    #[arg(long, env = "FALLOW_STORE_DIR")]
    pub store_dir: Option<PathBuf>,
    /// Store batch files in this S3 bucket (credentials from the usual AWS environment).
    #[arg(long, env = "FALLOW_S3_BUCKET")]
    pub s3_bucket: Option<String>,
    /// Key prefix inside the bucket.
    #[arg(long, env = "FALLOW_S3_PREFIX")]
    pub s3_prefix: Option<String>,
    /// An S3-compatible endpoint (MinIO, Ceph …), e.g. http://127.0.0.1:9000.
    #[arg(long, env = "FALLOW_S3_ENDPOINT")]
    pub s3_endpoint: Option<String>,
    #[arg(long, env = "FALLOW_S3_REGION")]
    pub s3_region: Option<String>,
    /// Path-style addressing (http://host/bucket/key), needed by most S3-compatible servers.
    #[arg(long, env = "FALLOW_S3_PATH_STYLE")]
    pub s3_path_style: bool,
    /// The admin API's bearer token (`/admin/…`), at least 16 characters. Without one the
    /// admin API is open only under --no-auth on a loopback address.
    #[arg(long, env = "FALLOW_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// A file holding the admin token (surrounding whitespace trimmed), instead of
    /// --admin-token.
    #[arg(long, env = "FALLOW_ADMIN_TOKEN_FILE", conflicts_with = "admin_token")]
    pub admin_token_file: Option<PathBuf>,
    /// Yield the GPU to its owner: `file:/PATH` (owner active while it exists),
    /// `command:CMD` (exit status 0 = owner active) or `nvidia-smi[:PERCENT]`.
    #[arg(long, env = "FALLOW_OWNER_PROBE")]
    pub owner_probe: Option<String>,
    /// Seconds the owner must have been idle before a yielded runner returns.
    #[arg(long, env = "FALLOW_OWNER_GRACE_SECONDS")]
    pub owner_grace_seconds: Option<u64>,
    /// How often the owner probe runs (`500ms`, the default; `100ms`, `2s`).
    #[arg(long, env = "FALLOW_OWNER_EVERY")]
    pub owner_every: Option<String>,
    /// On SIGTERM, let in-flight jobs finish for this long (`20s`, `1m`) before handing the
    /// rest back; other runners continue those from their progress. Default 0: at once.
    #[arg(long, env = "FALLOW_SHUTDOWN_DEADLINE")]
    pub shutdown_deadline: Option<String>,
    /// How long preparing one request may take (rendering and tokenizing its prompt,
    /// compiling its grammar), e.g. `30s`; past it the request is refused with
    /// `preparation_timeout`. Default 30s.
    #[arg(long, env = "FALLOW_PREPARE_TIMEOUT")]
    pub prepare_timeout: Option<String>,
    /// When the machine is lent, in UTC, e.g. "mon-fri 19:00-07:00; sat-sun 00:00-24:00";
    /// outside these windows the runner yields as if the owner were active.
    #[arg(long, env = "FALLOW_LEND_WINDOWS")]
    pub lend_windows: Option<String>,
    /// Memory (MiB) a runner's resident models may take, weights and KV caches together.
    /// Models load when a job needs them and the least recently used idle ones are unloaded
    /// to make room. Unset or 0: no limit, every model is loaded at start.
    #[arg(long, env = "FALLOW_MODEL_MEMORY_MB")]
    pub model_memory_mb: Option<u64>,
    /// How long a model stays loaded without work, e.g. 30s, 5m, 1h, or `forever` (the
    /// default); a model's own `;keep_alive=` wins.
    #[arg(long, env = "FALLOW_KEEP_ALIVE")]
    pub keep_alive: Option<String>,
    /// Milliseconds a job waits for a runner that has its model loaded before a runner that
    /// would have to load it takes it (default 2000).
    #[arg(long, env = "FALLOW_COLD_CLAIM_AFTER_MS")]
    pub cold_claim_after_ms: Option<u64>,
    /// The group of runners this one belongs to (e.g. one office's workstations).
    #[arg(long, env = "FALLOW_POOL")]
    pub pool: Option<String>,
    /// At most this share (0–1) of the pool's runners is lent at once, e.g. 0.5; the others
    /// yield as if their owners were active. Every runner of a pool should be given the same.
    #[arg(long, env = "FALLOW_POOL_MAX_SHARE")]
    pub pool_max_share: Option<f64>,
    /// Test hook (debug builds only): an engine thread panics at the step after admitting a
    /// request whose input contains this text.
    #[arg(long, hide = true)]
    pub test_engine_panic_marker: Option<String>,
}

#[derive(Subcommand, Debug)]
pub enum BatchCommand {
    /// Uploads a JSONL file and creates a batch; with --wait, follows it to the end.
    Submit {
        file: PathBuf,
        #[arg(long)]
        wait: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Prints a batch object.
    Status {
        id: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Downloads a batch's results: the output file's lines, then the error file's.
    Results {
        id: String,
        /// Write here instead of stdout.
        #[arg(short, long)]
        output: Option<PathBuf>,
        #[command(flatten)]
        client: ClientArgs,
    },
}

/// How a client command reaches the HTTP API.
#[derive(Args, Debug, Clone)]
pub struct ClientArgs {
    #[arg(long, env = "FALLOW_URL", default_value = "http://127.0.0.1:8000")]
    pub url: String,
    #[arg(long, env = "FALLOW_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
}

#[derive(Subcommand, Debug)]
pub enum AdminCommand {
    /// API keys.
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
    /// Runners, queue, tenants and jobs over the admin API (see `commands/admin_cli.rs`).
    #[command(flatten)]
    Remote(crate::commands::admin_cli::AdminRemote),
}

#[derive(Subcommand, Debug)]
pub enum KeysCommand {
    /// Creates a key for a tenant (creating the tenant if needed) and prints it once.
    /// Talks to Postgres directly, or to the admin API with --url.
    Create {
        #[arg(long)]
        tenant: String,
        /// The api's base URL: create the key over the admin API instead of in Postgres.
        #[arg(long)]
        url: Option<String>,
        /// The admin token (with --url).
        #[arg(long, env = "FALLOW_ADMIN_TOKEN", hide_env_values = true)]
        token: Option<String>,
        // Boxed: the service flags dwarf every other admin command's arguments.
        #[command(flatten)]
        service: Box<ServiceArgs>,
    },
    #[command(flatten)]
    Remote(crate::commands::admin_cli::KeysRemote),
}

#[derive(Args, Debug, Clone)]
pub struct SamplingArgs {
    #[arg(long, default_value_t = 256)]
    pub max_tokens: u32,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    #[arg(long)]
    pub seed: Option<u64>,
}

#[derive(Args, Debug, Clone)]
pub struct GenerateArgs {
    #[arg(long)]
    pub model: PathBuf,
    #[arg(long)]
    pub prompt: String,
    /// Wrap the prompt as a user message in the model's chat template.
    #[arg(long)]
    pub chat: bool,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[arg(long)]
    pub chat_template: Option<PathBuf>,
    /// Where the model runs: cpu, cuda, cuda:N, or auto (a GPU when one is usable).
    #[arg(long, default_value = "cpu")]
    pub device: fallow_engine::runtime::Device,
    #[command(flatten)]
    pub cuda: CudaArgs,
}

#[derive(Args, Debug, Clone)]
pub struct ChatArgs {
    #[arg(long)]
    pub model: PathBuf,
    #[arg(long)]
    pub system: Option<String>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[arg(long)]
    pub chat_template: Option<PathBuf>,
    /// Where the model runs: cpu, cuda, cuda:N, or auto (a GPU when one is usable).
    #[arg(long, default_value = "cpu")]
    pub device: fallow_engine::runtime::Device,
    #[command(flatten)]
    pub cuda: CudaArgs,
}

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// The engine alone: prefill, decode and aggregate tokens/s, peak RSS.
    Engine(BenchEngineArgs),
    /// The full stack against the engine in-process: tokens/s, TTFT and their ratio.
    E2e(BenchE2eArgs),
    /// One stream's inter-token latency alone and beside a tenant sending 8 MB prompts,
    /// 300-entry logit_bias and fresh json_schemas.
    Neighbour(BenchNeighbourArgs),
    /// Writes a random PEFT LoRA adapter for a model (for benchmarks and tests).
    RandomLora(BenchRandomLoraArgs),
}

#[derive(Args, Debug, Clone)]
pub struct BenchRandomLoraArgs {
    /// The base model (a GGUF file or an HF directory).
    #[arg(long, default_value = "models/SmolLM2-135M-Instruct.Q4_1.gguf")]
    pub model: PathBuf,
    /// The adapter directory to write.
    #[arg(long)]
    pub out: PathBuf,
    #[arg(long, default_value_t = 8)]
    pub rank: usize,
    /// Target modules, comma separated: q, k, v, o, gate, up, down.
    #[arg(long, value_delimiter = ',', default_value = "q,k,v,o,gate,up,down")]
    pub targets: Vec<String>,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// How far the adapter moves the model's outputs; 0 writes B = 0, an adapter that
    /// changes nothing.
    #[arg(long, default_value_t = 1.0)]
    pub strength: f32,
}

#[derive(Args, Debug, Clone)]
pub struct BenchNeighbourArgs {
    #[arg(long, default_value = "models/SmolLM2-135M-Instruct.Q4_1.gguf")]
    pub model: PathBuf,
    /// Tokens the measured stream generates.
    #[arg(long, default_value_t = 512)]
    pub tokens: u32,
    /// Rounds, each the stream alone then beside the neighbour.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
}

#[derive(Args, Debug, Clone)]
pub struct BenchE2eArgs {
    #[arg(long, default_value = "models/SmolLM2-135M-Instruct.Q4_1.gguf")]
    pub model: PathBuf,
    #[arg(
        long,
        env = "FALLOW_DATABASE_URL",
        hide_env_values = true,
        default_value = "postgres://postgres@127.0.0.1:5432/postgres"
    )]
    pub database_url: String,
    #[arg(
        long,
        env = "FALLOW_REDIS_URL",
        hide_env_values = true,
        default_value = "redis://127.0.0.1:6379/"
    )]
    pub redis_url: String,
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    pub concurrency: Vec<usize>,
    #[arg(long, default_value_t = 64)]
    pub max_tokens: u32,
    /// Runs per concurrency level, alternating in-process and full stack.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
}

#[derive(Args, Debug, Clone)]
pub struct BenchEngineArgs {
    #[arg(long)]
    pub model: PathBuf,
    /// Concurrent sequences to measure, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16")]
    pub concurrency: Vec<usize>,
    /// Prompt tokens per sequence.
    #[arg(long, default_value_t = 128)]
    pub prompt_tokens: usize,
    /// Generated tokens per sequence.
    #[arg(long, default_value_t = 128)]
    pub gen_tokens: u32,
    /// MiB given to the KV cache (it is allocated up front, so it counts in peak RSS; 0 on
    /// CUDA: sized from free device memory).
    #[arg(long, default_value_t = 1024)]
    pub kv_cache_mib: usize,
    /// Where the model runs: cpu, cuda, cuda:N, or auto (a GPU when one is usable).
    #[arg(long, default_value = "cpu")]
    pub device: fallow_engine::runtime::Device,
    #[command(flatten)]
    pub cuda: CudaArgs,
    /// Also run every concurrency under this JSON schema (constrained decoding) and print
    /// the constrained/unconstrained decode ratio.
    #[arg(long)]
    pub json_schema: Option<PathBuf>,
    /// Sampling temperature (0: greedy, the llama.cpp comparison's setting). Above 0 every
    /// sequence samples over the whole vocabulary each step, with a fixed seed per sequence.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Nucleus sampling mass (with `--temperature` above 0).
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Also run every concurrency with this many different random LoRA adapters, comma
    /// separated (sequence i runs adapter i mod N), and print each against the base alone.
    #[arg(long, value_delimiter = ',')]
    pub loras: Vec<usize>,
    /// The rank of the benchmark's adapters.
    #[arg(long, default_value_t = 8)]
    pub lora_rank: usize,
    /// The benchmark adapters' target modules.
    #[arg(long, value_delimiter = ',', default_value = "q,k,v,o,gate,up,down")]
    pub lora_targets: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::CommandFactory;

    #[test]
    fn every_command_line_is_well_formed() {
        // clap checks a command's arguments only when it is used; this checks them all.
        Cli::command().debug_assert();
    }
}
