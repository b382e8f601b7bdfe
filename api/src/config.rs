//! The api tier's knobs. The CLI fills them from its layered configuration; tests build
//! them directly.

use std::time::Duration;

/// Limits and switches of the HTTP tier.
#[derive(Debug, Clone)]
pub struct ApiConfig {
    /// Require `Authorization: Bearer <key>` on `/v1/*`. Off for local development.
    pub auth: bool,
    /// How long one chat completion may take end to end before the api gives up (504 or
    /// an error event) and cancels the job.
    pub request_timeout: Duration,
    /// Largest accepted request body; larger bodies get 413.
    pub max_body_bytes: usize,
    /// Most messages accepted in one conversation.
    pub max_messages: usize,
    /// Most choices (`n`) one request may ask for.
    pub max_n: u32,
    /// Queued jobs (all tenants) above which new requests get 429.
    pub global_queue_limit: i64,
    /// Attempts a job gets before it fails for good (retries after runner loss).
    pub max_attempts: i32,
    /// Largest accepted `POST /v1/files` upload, in bytes.
    pub max_file_bytes: u64,
    /// Most lines an uploaded batch input file may have.
    pub max_file_lines: u64,
    /// The bearer token of `/admin/…` (tenant keys never work there).
    pub admin_token: Option<String>,
    /// Without a token, whether `/admin/…` is open to anyone who can connect: only for
    /// `fallow dev --no-auth` on a loopback address.
    pub admin_open: bool,
    /// Serve only requests whose `Host` and `Origin` are loopback names, IP literals or
    /// [`Self::allowed_hosts`] (`host_check.rs`, against DNS rebinding). The CLI turns it
    /// on for a loopback bind or when an allow-list is given.
    pub check_host: bool,
    /// Host names accepted besides loopback names and IP literals (`--allowed-host`);
    /// `*` accepts any.
    pub allowed_hosts: Vec<String>,
    /// How long `/metrics` reuses the queue and runner gauges it read from Postgres.
    pub gauge_ttl: Duration,
    /// The window of the per-tenant request and token limits: a minute, as their names say;
    /// tests shorten it.
    pub rate_window: Duration,
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            auth: false,
            request_timeout: Duration::from_secs(600),
            max_body_bytes: 8 * 1024 * 1024,
            max_messages: 2048,
            max_n: 16,
            global_queue_limit: 10_000,
            max_attempts: 3,
            max_file_bytes: 200 << 20,
            max_file_lines: 50_000,
            admin_token: None,
            admin_open: false,
            check_host: true,
            allowed_hosts: Vec::new(),
            gauge_ttl: Duration::from_secs(1),
            rate_window: Duration::from_secs(60),
        }
    }
}
