//! The `fallow admin …` commands that talk to the admin API (`/admin/…`): their arguments,
//! and how each becomes one HTTP call whose answer is printed as a table (or as JSON with
//! `--json`). Every command takes `--url` and `--token`.

use super::admin_http::{AdminClient, Column};
use clap::{Args, Subcommand};
use reqwest::Method;
use serde_json::{json, Value};

/// How an admin command reaches the api.
#[derive(Args, Debug, Clone)]
pub struct AdminClientArgs {
    /// The api's base URL.
    #[arg(long, env = "FALLOW_URL", default_value = "http://127.0.0.1:8000")]
    pub url: String,
    /// The admin token (`--admin-token` of the api).
    #[arg(long, env = "FALLOW_ADMIN_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Print the API's JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Subcommand, Debug)]
pub enum AdminRemote {
    /// Runners: list, show, cordon, drain, resume, evict a model.
    Runners {
        #[command(subcommand)]
        command: RunnersCommand,
    },
    /// Queued and running jobs per model and priority.
    Queue {
        #[command(flatten)]
        client: AdminClientArgs,
    },
    /// Tenants and their limits.
    Tenants {
        #[command(subcommand)]
        command: TenantsCommand,
    },
    /// Job search and cancellation.
    Jobs {
        #[command(subcommand)]
        command: JobsCommand,
    },
    /// The credentials of runners on lent machines: create, list, revoke.
    RunnerTokens {
        #[command(subcommand)]
        command: RunnerTokensCommand,
    },
    /// LoRA adapters over the base models: load, unload, list.
    Loras {
        #[command(subcommand)]
        command: LorasCommand,
    },
}

#[derive(Subcommand, Debug)]
pub enum LorasCommand {
    /// Serves an adapter as BASE:NAME on every runner that holds BASE and has a --lora-dir.
    Load {
        /// The adapter's name.
        name: String,
        /// The base model's id.
        #[arg(long)]
        base: String,
        /// The PEFT adapter directory, relative to the runners' --lora-dir.
        #[arg(long)]
        path: String,
        #[command(flatten)]
        client: AdminClientArgs,
    },
    /// Stops serving a loaded adapter (running requests finish).
    Unload {
        /// The adapter's id, BASE:NAME.
        id: String,
        #[command(flatten)]
        client: AdminClientArgs,
    },
    /// Loaded adapters and the runners' own.
    List {
        #[command(flatten)]
        client: AdminClientArgs,
    },
}

#[derive(Subcommand, Debug)]
pub enum RunnersCommand {
    /// Every registered runner.
    List {
        #[command(flatten)]
        client: AdminClientArgs,
    },
    /// One runner in full.
    Show {
        id: String,
        #[command(flatten)]
        client: AdminClientArgs,
    },
    /// Claim nothing new; keep working on what it holds.
    Cordon {
        id: String,
        #[command(flatten)]
        client: AdminClientArgs,
    },
    /// Finish in-flight work, claim nothing new, then report `drained`.
    Drain {
        id: String,
        /// Hand back what is still in flight after this long (`30s`, `5m`): other runners
        /// continue those jobs from their progress.
        #[arg(long)]
        deadline: Option<String>,
        #[command(flatten)]
        client: AdminClientArgs,
    },
    /// Back to `active`.
    Resume {
        id: String,
        #[command(flatten)]
        client: AdminClientArgs,
    },
    /// Unloads a model from the runner (once its jobs are done); a later job loads it again.
    Evict {
        id: String,
        /// The model's id.
        #[arg(long)]
        model: String,
        #[command(flatten)]
        client: AdminClientArgs,
    },
}

#[derive(Subcommand, Debug)]
pub enum TenantsCommand {
    List {
        #[command(flatten)]
        client: AdminClientArgs,
    },
    /// Sets a tenant's limits; those not given keep their value, 0 means unlimited.
    Limits {
        name: String,
        /// Queued + running jobs the tenant may have at once.
        #[arg(long)]
        max_active_jobs: Option<i64>,
        /// Generation requests admitted per minute.
        #[arg(long)]
        requests_per_minute: Option<i64>,
        /// Tokens (prompt + max_tokens × n) admitted per minute.
        #[arg(long)]
        tokens_per_minute: Option<i64>,
        /// Lines of unfinished batches the tenant may have at once.
        #[arg(long)]
        max_batch_queued_lines: Option<i64>,
        /// Fair-share weight relative to other tenants (default 1; 2 gets twice the share).
        #[arg(long)]
        weight: Option<f64>,
        /// Served-first class within a band: a higher class goes first (default 0).
        #[arg(long)]
        class: Option<i32>,
        #[command(flatten)]
        client: AdminClientArgs,
    },
}

#[derive(Subcommand, Debug)]
pub enum JobsCommand {
    /// Jobs, newest first.
    List {
        /// queued, running, succeeded, failed or cancelled.
        #[arg(long)]
        state: Option<String>,
        #[arg(long)]
        model: Option<String>,
        /// The tenant's name.
        #[arg(long)]
        tenant: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: i64,
        #[command(flatten)]
        client: AdminClientArgs,
    },
    /// Cancels a job (queued: at once; running: within one engine step).
    Cancel {
        id: String,
        #[command(flatten)]
        client: AdminClientArgs,
    },
}

#[derive(Subcommand, Debug)]
pub enum RunnerTokensCommand {
    /// A new token, printed once: its runner needs only it and the api's URL.
    Create {
        /// A name to tell the token (and its machine) by.
        #[arg(long)]
        name: String,
        /// The pool its runner joins; unset: the runner's own `--pool`.
        #[arg(long)]
        pool: Option<String>,
        /// The models its runner may serve, comma-separated; unset: any.
        #[arg(long, value_delimiter = ',')]
        models: Option<Vec<String>>,
        #[command(flatten)]
        client: AdminClientArgs,
    },
    /// Every token (prefixes only), revoked ones included.
    List {
        #[command(flatten)]
        client: AdminClientArgs,
    },
    /// Revokes a token by its id or name: its runner is cut off at its next call.
    Revoke {
        /// The token's id or name.
        #[arg(value_name = "TOKEN")]
        which: String,
        #[command(flatten)]
        client: AdminClientArgs,
    },
}

/// `fallow admin keys list|revoke` (create lives in `cli.rs`: it also works on Postgres).
#[derive(Subcommand, Debug)]
pub enum KeysRemote {
    /// Keys (prefixes only), optionally of one tenant.
    List {
        #[arg(long)]
        tenant: Option<String>,
        #[command(flatten)]
        client: AdminClientArgs,
    },
    /// Revokes a key by its id.
    Revoke {
        id: String,
        #[command(flatten)]
        client: AdminClientArgs,
    },
}

const RUNNER_COLUMNS: &[Column] = &[
    Column::new("ID", "/id"),
    Column::new("HOST", "/host"),
    Column::new("POOL", "/pool"),
    Column::new("STATE", "/state"),
    Column::new("TRANSPORT", "/transport"),
    Column::new("TOKEN", "/token"),
    Column::new("SLOTS", "/slots"),
    Column::new("IN FLIGHT", "/in_flight"),
    Column::models("MODELS", "/models"),
    Column::models("WARM", "/warm"),
    Column::new("LAST HEARTBEAT", "/last_heartbeat"),
];

pub async fn run(command: AdminRemote) -> anyhow::Result<()> {
    match command {
        AdminRemote::Runners { command } => runners(command).await,
        AdminRemote::Queue { client } => {
            let columns = [
                Column::new("MODEL", "/model"),
                Column::new("PRIORITY", "/priority"),
                Column::new("QUEUED", "/queued"),
                Column::new("RUNNING", "/running"),
            ];
            list(&client, Method::GET, "/queue", &columns).await
        }
        AdminRemote::Tenants { command } => tenants(command).await,
        AdminRemote::Jobs { command } => jobs(command).await,
        AdminRemote::RunnerTokens { command } => runner_tokens(command).await,
        AdminRemote::Loras { command } => loras(command).await,
    }
}

async fn runners(command: RunnersCommand) -> anyhow::Result<()> {
    let (client, path) = match command {
        RunnersCommand::List { client } => {
            return list(&client, Method::GET, "/runners", RUNNER_COLUMNS).await
        }
        RunnersCommand::Show { id, client } => {
            let value = AdminClient::new(&client)?
                .call(Method::GET, &format!("/runners/{id}"), None)
                .await?;
            return print_one(&client, &value, RUNNER_COLUMNS);
        }
        RunnersCommand::Cordon { id, client } => (client, format!("/runners/{id}/cordon")),
        RunnersCommand::Drain {
            id,
            deadline,
            client,
        } => {
            let body = match deadline {
                Some(d) => {
                    let d = crate::config::parse_duration(&d)?
                        .ok_or_else(|| anyhow::anyhow!("--deadline {d:?}: give a duration"))?;
                    Some(serde_json::json!({ "deadline_seconds": d.as_secs_f64() }))
                }
                None => None,
            };
            let value = AdminClient::new(&client)?
                .call(Method::POST, &format!("/runners/{id}/drain"), body)
                .await?;
            return print_one(&client, &value, RUNNER_COLUMNS);
        }
        RunnersCommand::Resume { id, client } => (client, format!("/runners/{id}/resume")),
        RunnersCommand::Evict { id, model, client } => {
            let body = serde_json::json!({ "model": model });
            let value = AdminClient::new(&client)?
                .call(Method::POST, &format!("/runners/{id}/evict"), Some(body))
                .await?;
            return print_one(&client, &value, RUNNER_COLUMNS);
        }
    };
    let value = AdminClient::new(&client)?
        .call(Method::POST, &path, None)
        .await?;
    print_one(&client, &value, RUNNER_COLUMNS)
}

async fn tenants(command: TenantsCommand) -> anyhow::Result<()> {
    let columns = [
        Column::new("ID", "/id"),
        Column::new("NAME", "/name"),
        Column::new("MAX ACTIVE JOBS", "/max_active_jobs"),
        Column::new("WEIGHT", "/weight"),
        Column::new("CLASS", "/class"),
        Column::new("REQUESTS/MIN", "/requests_per_minute"),
        Column::new("TOKENS/MIN", "/tokens_per_minute"),
        Column::new("BATCH LINES", "/max_batch_queued_lines"),
    ];
    match command {
        TenantsCommand::List { client } => list(&client, Method::GET, "/tenants", &columns).await,
        TenantsCommand::Limits {
            name,
            max_active_jobs,
            requests_per_minute,
            tokens_per_minute,
            max_batch_queued_lines,
            weight,
            class,
            client,
        } => {
            // Only the limits given are sent; the api keeps the others.
            let mut body = serde_json::Map::new();
            for (field, value) in [
                ("max_active_jobs", max_active_jobs.map(|n| json!(n))),
                ("requests_per_minute", requests_per_minute.map(|n| json!(n))),
                ("tokens_per_minute", tokens_per_minute.map(|n| json!(n))),
                (
                    "max_batch_queued_lines",
                    max_batch_queued_lines.map(|n| json!(n)),
                ),
                ("weight", weight.map(|w| json!(w))),
                ("class", class.map(|c| json!(c))),
            ] {
                if let Some(value) = value {
                    body.insert(field.to_owned(), value);
                }
            }
            let body = serde_json::Value::Object(body);
            let path = format!("/tenants/{}/limits", encode(&name));
            let value = AdminClient::new(&client)?
                .call(Method::POST, &path, Some(body))
                .await?;
            print_one(&client, &value, &columns)
        }
    }
}

async fn jobs(command: JobsCommand) -> anyhow::Result<()> {
    match command {
        JobsCommand::List {
            state,
            model,
            tenant,
            limit,
            client,
        } => {
            let mut query = vec![format!("limit={limit}")];
            for (key, value) in [("state", state), ("model", model), ("tenant", tenant)] {
                if let Some(value) = value {
                    query.push(format!("{key}={}", encode(&value)));
                }
            }
            let columns = [
                Column::new("ID", "/id"),
                Column::new("TENANT", "/tenant"),
                Column::new("MODEL", "/model"),
                Column::new("KIND", "/kind"),
                Column::new("PRIORITY", "/priority"),
                Column::new("STATE", "/state"),
                Column::new("ATTEMPT", "/attempt"),
                Column::new("RUNNER", "/runner_id"),
                Column::new("CREATED", "/created_at"),
            ];
            let path = format!("/jobs?{}", query.join("&"));
            list(&client, Method::GET, &path, &columns).await
        }
        JobsCommand::Cancel { id, client } => {
            let value = AdminClient::new(&client)?
                .call(Method::POST, &format!("/jobs/{id}/cancel"), None)
                .await?;
            let columns = [
                Column::new("ID", "/id"),
                Column::new("CANCEL REQUESTED", "/cancel_requested"),
                Column::new("STATE", "/state"),
            ];
            print_one(&client, &value, &columns)
        }
    }
}

async fn runner_tokens(command: RunnerTokensCommand) -> anyhow::Result<()> {
    let columns = [
        Column::new("ID", "/id"),
        Column::new("NAME", "/name"),
        Column::new("PREFIX", "/prefix"),
        Column::new("POOL", "/pool"),
        Column::models("MODELS", "/models"),
        Column::new("CREATED", "/created_at"),
        Column::new("REVOKED", "/revoked_at"),
    ];
    match command {
        RunnerTokensCommand::Create {
            name,
            pool,
            models,
            client,
        } => {
            let body = json!({ "name": name, "pool": pool, "models": models });
            let value = AdminClient::new(&client)?
                .call(Method::POST, "/runner-tokens", Some(body))
                .await?;
            if client.json {
                println!("{}", serde_json::to_string_pretty(&value)?);
                return Ok(());
            }
            let token = value["token"].as_str().ok_or_else(|| {
                anyhow::anyhow!("the admin API answered without a token: {value}")
            })?;
            println!("{token}");
            eprintln!("Runner token {name:?} created. It is shown only once; store it now.");
            Ok(())
        }
        RunnerTokensCommand::List { client } => {
            list(&client, Method::GET, "/runner-tokens", &columns).await
        }
        RunnerTokensCommand::Revoke { which, client } => {
            let path = format!("/runner-tokens/{}/revoke", encode(&which));
            let value = AdminClient::new(&client)?
                .call(Method::POST, &path, None)
                .await?;
            print_one(&client, &value, &columns)
        }
    }
}

async fn loras(command: LorasCommand) -> anyhow::Result<()> {
    let columns = [
        Column::new("ID", "/id"),
        Column::new("BASE", "/base"),
        Column::new("SOURCE", "/source"),
        Column::new("PATH", "/path"),
        Column::new("SERVED", "/served"),
    ];
    match command {
        LorasCommand::Load {
            name,
            base,
            path,
            client,
        } => {
            let body = json!({ "name": name, "base": base, "path": path });
            let value = AdminClient::new(&client)?
                .call(Method::POST, "/loras", Some(body))
                .await?;
            print_one(&client, &value, &columns)
        }
        LorasCommand::Unload { id, client } => {
            let path = format!("/loras/{}/unload", encode(&id));
            let value = AdminClient::new(&client)?
                .call(Method::POST, &path, None)
                .await?;
            print_one(&client, &value, &columns)
        }
        LorasCommand::List { client } => list(&client, Method::GET, "/loras", &columns).await,
    }
}

/// `fallow admin keys list|revoke`.
pub async fn keys(command: KeysRemote) -> anyhow::Result<()> {
    let columns = [
        Column::new("ID", "/id"),
        Column::new("TENANT", "/tenant"),
        Column::new("PREFIX", "/prefix"),
        Column::new("CREATED", "/created_at"),
        Column::new("REVOKED", "/revoked_at"),
    ];
    match command {
        KeysRemote::List { tenant, client } => {
            let path = match tenant {
                Some(t) => format!("/keys?tenant={}", encode(&t)),
                None => "/keys".to_string(),
            };
            list(&client, Method::GET, &path, &columns).await
        }
        KeysRemote::Revoke { id, client } => {
            let value = AdminClient::new(&client)?
                .call(Method::POST, &format!("/keys/{id}/revoke"), None)
                .await?;
            let columns = [Column::new("ID", "/id"), Column::new("REVOKED", "/revoked")];
            print_one(&client, &value, &columns)
        }
    }
}

/// Creates a key over the admin API; prints it once.
pub async fn create_key(client: &AdminClientArgs, tenant: &str) -> anyhow::Result<()> {
    let path = format!("/tenants/{}/keys", encode(tenant));
    let value = AdminClient::new(client)?
        .call(Method::POST, &path, None)
        .await?;
    let key = value["key"]
        .as_str()
        .ok_or_else(|| anyhow::anyhow!("the admin API answered without a key: {value}"))?;
    println!("{key}");
    eprintln!("API key for tenant {tenant:?} created. It is shown only once; store it now.");
    Ok(())
}

async fn list(
    client: &AdminClientArgs,
    method: Method,
    path: &str,
    columns: &[Column],
) -> anyhow::Result<()> {
    let value = AdminClient::new(client)?.call(method, path, None).await?;
    if client.json {
        println!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(());
    }
    let rows = value["data"].as_array().cloned().unwrap_or_default();
    print!("{}", super::admin_http::table(columns, &rows));
    Ok(())
}

fn print_one(client: &AdminClientArgs, value: &Value, columns: &[Column]) -> anyhow::Result<()> {
    if client.json {
        println!("{}", serde_json::to_string_pretty(value)?);
    } else {
        print!(
            "{}",
            super::admin_http::table(columns, std::slice::from_ref(value))
        );
    }
    Ok(())
}

/// Percent-encodes a path segment or query value.
fn encode(raw: &str) -> String {
    raw.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
