//! The long-running service commands: `dev`, `api`, `scheduler`, `runner`, `migrate`.

use crate::cli::ServiceArgs;
use crate::config::{lora_settings, Settings, StoreSettings};
use crate::secrets::redact_url;
use anyhow::Context;
use fallow_api::{ApiConfig, AppState};
use fallow_engine::runtime::LoadOptions;
use fallow_runner::control_plane::{ControlPlane, Direct, Gateway};
use fallow_runner::worker::{self, ModelOffer, RunnerConfig, WarmPolicy};
use fallow_scheduler::batch::{worker as batch_worker, BatchConfig, BatchWorker};
use fallow_scheduler::clock::Clock;
use fallow_scheduler::maintenance::{self, MaintenanceConfig};
use fallow_scheduler::queue::Queue;
use fallow_scheduler::store::{LocalStore, ObjectStore, S3Store};
use fallow_scheduler::stream::TokenRelay;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

struct Connections {
    queue: Queue,
    relay: TokenRelay,
}

async fn connect(settings: &Settings) -> anyhow::Result<Connections> {
    let pool = fallow_scheduler::db::connect(&settings.database_url, None)
        .await
        .with_context(|| {
            format!(
                "connecting to Postgres at {} (--database-url)",
                redact_url(&settings.database_url)
            )
        })?;
    fallow_scheduler::db::ensure_migrated(&pool).await?;
    let relay = TokenRelay::connect(&settings.redis_url)
        .await
        .with_context(|| {
            format!(
                "connecting to Redis at {} (--redis-url)",
                redact_url(&settings.redis_url)
            )
        })?;
    Ok(Connections {
        queue: Queue::new(pool, Clock::system()),
        relay,
    })
}

/// A shutdown signal every task can wait on: Ctrl-C or SIGTERM.
fn shutdown_signal() -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        let ctrl_c = tokio::signal::ctrl_c();
        #[cfg(unix)]
        {
            let mut term =
                match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                    Ok(s) => s,
                    Err(_) => {
                        let _ = ctrl_c.await;
                        let _ = tx.send(true);
                        return;
                    }
                };
            tokio::select! { _ = ctrl_c => {}, _ = term.recv() => {} }
        }
        #[cfg(not(unix))]
        let _ = ctrl_c.await;
        tracing::info!("shutting down");
        let _ = tx.send(true);
    });
    rx
}

async fn wait(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|stopped| *stopped).await;
}

fn api_config(settings: &Settings, auth: bool) -> ApiConfig {
    ApiConfig {
        auth,
        request_timeout: Duration::from_secs(settings.request_timeout),
        rate_window: Duration::from_secs(settings.rate_limit_window),
        admin_token: settings.admin_token.clone(),
        // Open admin only where nothing but this machine can reach it and keys are off.
        admin_open: !auth && settings.listen.ip().is_loopback(),
        check_host: settings.check_host(),
        allowed_hosts: settings.allowed_hosts.clone(),
        ..ApiConfig::default()
    }
}

fn maintenance_config(settings: &Settings) -> MaintenanceConfig {
    MaintenanceConfig {
        reap_every: Duration::from_secs(2),
        prune_every: Duration::from_secs(600),
        retention: Duration::from_secs(7 * 24 * 3600),
        // The api gives up on a client after its request timeout: a job still queued a
        // minute past that has nobody waiting.
        abandoned_after: Duration::from_secs(settings.request_timeout.saturating_add(60)),
    }
}

async fn object_store(settings: &Settings) -> anyhow::Result<ObjectStore> {
    Ok(match &settings.store {
        StoreSettings::Local(dir) => {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("creating the store directory {}", dir.display()))?;
            ObjectStore::Local(LocalStore::new(dir.clone()))
        }
        StoreSettings::S3(config) => ObjectStore::S3(
            S3Store::connect(config.clone())
                .await
                .context("preparing the S3 store's staging directory")?,
        ),
    })
}

/// The batch worker: validates, expands and finalises batches with the api's codec.
fn batch_worker(conns: &Connections, store: ObjectStore, api: &ApiConfig) -> BatchWorker {
    let config = BatchConfig {
        max_lines: usize::try_from(api.max_file_lines).unwrap_or(usize::MAX),
        max_attempts: api.max_attempts,
        ..BatchConfig::default()
    };
    let codec = Arc::new(fallow_api::openai::batches::ChatBatchCodec::new(api));
    BatchWorker::new(conns.queue.clone(), store, codec, config).with_relay(conns.relay.clone())
}

/// The models this runner may serve, inspected (not loaded): a bad path or a broken file
/// stops the start here. Loading happens in the worker, within the memory budget.
fn model_offers(settings: &Settings) -> anyhow::Result<Vec<ModelOffer>> {
    let mut offers = Vec::new();
    for spec in settings.models_or_default() {
        let options = LoadOptions {
            kv_cache_bytes: settings.kv_cache_mb << 20,
            max_num_seqs: settings.slots.max(1),
            chat_template_file: settings.chat_template.clone(),
            max_model_len: settings.max_model_len,
            device: settings.device,
            tool_parser: spec.tool_parser.clone(),
            reasoning_parser: spec.reasoning_parser.clone(),
            memory_budget_bytes: settings.model_memory_bytes,
            cuda: settings.cuda.clone(),
            ..LoadOptions::default()
        };
        let policy = WarmPolicy {
            keep_alive: spec.keep_alive.unwrap_or(settings.keep_alive),
            min_warm: spec.min_warm,
        };
        let offer = ModelOffer::inspect(&spec.id, spec.path.clone(), options, policy)
            .with_context(|| format!("opening model {}", spec.path.display()))?;
        tracing::info!(model = %offer.id, bytes = offer.resident_bytes, device = %settings.device, "model offered");
        offers.push(offer);
    }
    Ok(offers)
}

fn runner_config(settings: &Settings, offers: &[ModelOffer]) -> anyhow::Result<RunnerConfig> {
    let lease = Duration::from_secs(settings.lease_seconds);
    let loras = lora_settings(
        &settings.loras,
        settings.lora_dir.clone(),
        settings.lora_memory_mb,
        offers,
    )?;
    Ok(RunnerConfig {
        slots: settings.slots.max(1),
        lease,
        heartbeat_every: lease / 3,
        owner_probe: settings.owner_probe.clone(),
        owner_grace: Duration::from_secs(settings.owner_grace_seconds),
        owner_every: settings.owner_every,
        shutdown_deadline: settings.shutdown_deadline,
        prepare_timeout: settings.prepare_timeout,
        lend_windows: settings.lend_windows.clone(),
        memory_budget: settings.model_memory_bytes,
        cold_claim_after: settings.cold_claim_after,
        pool: settings.pool.clone(),
        pool_max_share: settings.pool_max_share,
        panic_hook: settings.panic_hook.clone(),
        loras,
        ..RunnerConfig::default()
    })
}

pub async fn dev(args: ServiceArgs) -> anyhow::Result<()> {
    let settings = Settings::resolve(&args)?;
    let auth = settings.auth.unwrap_or(false);
    settings.check_exposure(auth)?;
    if !auth {
        tracing::warn!("authentication is off (dev default); use --auth to require API keys");
    }
    // The runner's engine metrics bind to whichever recorder exists when they are created,
    // so the api's Prometheus recorder must be installed before the runner starts.
    let _ = fallow_api::metrics::prometheus_handle();
    let models = tokio::task::block_in_place(|| model_offers(&settings))?;
    let conns = connect(&settings).await?;
    let stop = shutdown_signal();
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .with_context(|| format!("binding {}", settings.listen))?;
    // "Serving" means a request gets its model: the runner lists its models before it
    // loads them, and requests sent meanwhile wait in the queue.
    let registered = Arc::new(tokio::sync::Notify::new());
    let mut runner_settings = runner_config(&settings, &models)?;
    runner_settings.registered = Some(registered.clone());
    let mut runner = tokio::spawn(worker::run(
        Arc::new(Direct::new(conns.queue.clone(), conns.relay.clone())),
        models,
        runner_settings,
        wait(stop.clone()),
    ));
    tokio::select! {
        _ = registered.notified() => {}
        ended = &mut runner => {
            ended??;
            anyhow::bail!("the runner stopped before it registered");
        }
    }
    let maint = tokio::spawn(maintenance::run(
        conns.queue.clone(),
        conns.relay.clone(),
        maintenance_config(&settings),
        wait(stop.clone()),
    ));
    let store = object_store(&settings).await?;
    let config = api_config(&settings, auth);
    let batches = tokio::spawn(batch_worker::run(
        batch_worker(&conns, store.clone(), &config),
        wait(stop.clone()),
    ));
    let state = AppState::new(conns.queue, conns.relay, config).with_store(store);
    let metrics = metrics_listener(&settings, &state, &stop).await?;
    tracing::info!(listen = %settings.listen, "fallow dev serving");
    println!("Fallow is serving on http://{}", settings.listen);
    fallow_api::serve(listener, state, wait(stop)).await?;
    if let Some(metrics) = metrics {
        metrics.await??;
    }
    runner.await??;
    maint.await?;
    batches.await?;
    Ok(())
}

pub async fn api(args: ServiceArgs) -> anyhow::Result<()> {
    let settings = Settings::resolve(&args)?;
    let auth = settings.auth.unwrap_or(true);
    settings.check_exposure(auth)?;
    let conns = connect(&settings).await?;
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .with_context(|| format!("binding {}", settings.listen))?;
    let store = object_store(&settings).await?;
    let state =
        AppState::new(conns.queue, conns.relay, api_config(&settings, auth)).with_store(store);
    let stop = shutdown_signal();
    let metrics = metrics_listener(&settings, &state, &stop).await?;
    tracing::info!(listen = %settings.listen, auth, "fallow api serving");
    fallow_api::serve(listener, state, wait(stop)).await?;
    if let Some(metrics) = metrics {
        metrics.await??;
    }
    Ok(())
}

/// With `--metrics-listen`, `/metrics` (gauges included) on its own listener.
async fn metrics_listener(
    settings: &Settings,
    state: &AppState,
    stop: &watch::Receiver<bool>,
) -> anyhow::Result<Option<tokio::task::JoinHandle<std::io::Result<()>>>> {
    let Some(addr) = settings.metrics_listen else {
        return Ok(None);
    };
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding --metrics-listen {addr}"))?;
    Ok(Some(tokio::spawn(fallow_api::server::serve_metrics(
        listener,
        state.clone(),
        wait(stop.clone()),
    ))))
}

pub async fn scheduler(args: ServiceArgs) -> anyhow::Result<()> {
    let settings = Settings::resolve(&args)?;
    let conns = connect(&settings).await?;
    let store = object_store(&settings).await?;
    let stop = shutdown_signal();
    let worker = batch_worker(&conns, store, &api_config(&settings, false));
    tokio::join!(
        maintenance::run(
            conns.queue,
            conns.relay.clone(),
            maintenance_config(&settings),
            wait(stop.clone())
        ),
        batch_worker::run(worker, wait(stop)),
    );
    Ok(())
}

pub async fn runner(args: ServiceArgs) -> anyhow::Result<()> {
    let settings = Settings::resolve(&args)?;
    let stop = shutdown_signal();
    if let Some(addr) = settings.metrics_listen {
        // Bound (and the recorder installed) before the engines create their gauges.
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding --metrics-listen {addr}"))?;
        tracing::info!(%addr, "runner metrics on /metrics");
        let _ = fallow_api::metrics::prometheus_handle();
        tokio::spawn(fallow_api::metrics::serve_metrics(
            listener,
            wait(stop.clone()),
        ));
    }
    let models = tokio::task::block_in_place(|| model_offers(&settings))?;
    let plane: Arc<dyn ControlPlane> = match &settings.control_plane {
        Some(gateway) => {
            tracing::info!(url = %gateway.url, "reaching the control plane through the api's runner API");
            Arc::new(Gateway::new(&gateway.url, gateway.token.clone())?)
        }
        None => {
            let conns = connect(&settings).await?;
            Arc::new(Direct::new(conns.queue, conns.relay))
        }
    };
    let config = runner_config(&settings, &models)?;
    worker::run(plane, models, config, wait(stop)).await
}

pub async fn migrate(args: ServiceArgs) -> anyhow::Result<()> {
    let settings = Settings::resolve(&args)?;
    let pool = fallow_scheduler::db::connect(&settings.database_url, None)
        .await
        .with_context(|| {
            format!(
                "connecting to Postgres at {}",
                redact_url(&settings.database_url)
            )
        })?;
    // Up to date, it asks nothing of the role but reading `_sqlx_migrations`, so a
    // service's `ExecStartPre` may run it with the service's own least-privilege role.
    match fallow_scheduler::db::ensure_migrated(&pool).await? {
        0 => println!("the schema is up to date"),
        n => println!("migrations applied ({n} pending)"),
    }
    Ok(())
}
