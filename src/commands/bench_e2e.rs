//! `fallow bench e2e`: the same workload through the engine in-process and through the full
//! stack (HTTP → Postgres → runner → Redis → SSE) twice, side by side: with a direct runner,
//! and with a gateway runner that reaches the control plane through the api's runner API.
//! The ratios are the price of the queue and of the gateway; fresh schemas keep the run
//! apart from real data.

use crate::cli::BenchE2eArgs;
use anyhow::Context;
use fallow_api::{ApiConfig, AppState};
use fallow_engine::llm::EngineRequest;
use fallow_engine::prompt::encode_chat;
use fallow_engine::runtime::{self, LoadOptions, LoadedModel};
use fallow_protocol::job::{ChatMessage, GenerateRequest, Role, Sampling};
use fallow_runner::control_plane::{ControlPlane, Direct, Gateway};
use fallow_runner::worker::{self, ModelOffer, RunnerConfig, WarmPolicy};
use fallow_scheduler::clock::Clock;
use fallow_scheduler::queue::Queue;
use fallow_scheduler::runners::tokens::{self, NewRunnerToken};
use fallow_scheduler::stream::TokenRelay;
use futures::StreamExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What one or more runs of a concurrency level measured.
#[derive(Default)]
struct Measured {
    tokens: usize,
    elapsed: Duration,
    ttfts: Vec<Duration>,
}

impl Measured {
    fn add(&mut self, other: Measured) {
        self.tokens += other.tokens;
        self.elapsed += other.elapsed;
        self.ttfts.extend(other.ttfts);
    }
    fn tokens_per_s(&self) -> f64 {
        self.tokens as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
    fn ttft_p50_ms(&self) -> f64 {
        let mut sorted = self.ttfts.clone();
        sorted.sort();
        sorted
            .get(sorted.len() / 2)
            .map(|d| d.as_secs_f64() * 1e3)
            .unwrap_or(0.0)
    }
}

pub async fn e2e(args: BenchE2eArgs) -> anyhow::Result<()> {
    let max_conc = args.concurrency.iter().copied().max().unwrap_or(1);
    let options = LoadOptions {
        max_num_seqs: max_conc,
        ..LoadOptions::default()
    };
    let load = || runtime::load(&args.model, &options);
    let mut in_process = tokio::task::block_in_place(load).context("loading the model")?;
    let model_id = runtime::model_id_for(&args.model);
    let offer = ModelOffer::inspect(
        &model_id,
        args.model.clone(),
        options.clone(),
        WarmPolicy::default(),
    )
    .context("opening the model")?;

    // Two stacks, each on a fresh schema: one whose runner reaches Postgres and Redis
    // directly, one whose runner goes through the api's runner API with a runner token.
    let direct = Stack::start(&args, &offer, Transport::Direct, max_conc).await?;
    let gateway = Stack::start(&args, &offer, Transport::Gateway, max_conc).await?;
    for stack in [&direct, &gateway] {
        wait_for_model(&stack.base, &model_id).await?;
    }

    println!(
        "schemas {} (direct), {} (gateway); {} generated tokens per request",
        direct.schema, gateway.schema, args.max_tokens
    );
    println!(
        "{:>11} {:>12} {:>12} {:>13} {:>7} {:>7} {:>16} {:>16} {:>17}",
        "concurrency",
        "engine tok/s",
        "direct tok/s",
        "gateway tok/s",
        "d/e",
        "g/d",
        "TTFT p50 eng ms",
        "TTFT p50 dir ms",
        "TTFT p50 gw ms"
    );
    for &conc in &args.concurrency {
        // Interleaved rounds, so machine noise hits every side alike.
        let mut engine = Measured::default();
        let (mut through_direct, mut through_gateway) = (Measured::default(), Measured::default());
        for _ in 0..args.rounds.max(1) {
            engine.add(tokio::task::block_in_place(|| {
                run_in_process(&mut in_process, conc, args.max_tokens)
            })?);
            through_direct
                .add(run_through_stack(&direct.base, &model_id, conc, args.max_tokens).await?);
            through_gateway
                .add(run_through_stack(&gateway.base, &model_id, conc, args.max_tokens).await?);
        }
        let ratio = |a: &Measured, b: &Measured| a.tokens_per_s() / b.tokens_per_s().max(1e-9);
        println!(
            "{:>11} {:>12.1} {:>12.1} {:>13.1} {:>6.2}x {:>6.2}x {:>16.1} {:>16.1} {:>17.1}",
            conc,
            engine.tokens_per_s(),
            through_direct.tokens_per_s(),
            through_gateway.tokens_per_s(),
            ratio(&through_direct, &engine),
            ratio(&through_gateway, &through_direct),
            engine.ttft_p50_ms(),
            through_direct.ttft_p50_ms(),
            through_gateway.ttft_p50_ms()
        );
    }
    gateway.stop().await;
    direct.stop().await;
    Ok(())
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Transport {
    Direct,
    Gateway,
}

/// An api and one runner on their own schema, in this process.
struct Stack {
    base: String,
    schema: String,
    stop_api: tokio::sync::watch::Sender<bool>,
    stop_runner: tokio::sync::watch::Sender<bool>,
    api: tokio::task::JoinHandle<std::io::Result<()>>,
    runner: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Stack {
    async fn start(
        args: &BenchE2eArgs,
        offer: &ModelOffer,
        transport: Transport,
        slots: usize,
    ) -> anyhow::Result<Stack> {
        let (pool, schema) = fallow_scheduler::db::fresh_schema(&args.database_url).await?;
        let queue = Queue::new(pool.clone(), Clock::system());
        let relay = TokenRelay::connect(&args.redis_url).await?;
        let (stop_api, api_stopped) = tokio::sync::watch::channel(false);
        let (stop_runner, runner_stopped) = tokio::sync::watch::channel(false);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let base = format!("http://{}", listener.local_addr()?);
        let state = AppState::new(
            queue.clone(),
            relay.clone(),
            ApiConfig {
                auth: false,
                ..ApiConfig::default()
            },
        );
        let api = tokio::spawn(fallow_api::serve(listener, state, stopped(api_stopped)));
        let plane: Arc<dyn ControlPlane> = match transport {
            Transport::Direct => Arc::new(Direct::new(queue, relay)),
            Transport::Gateway => {
                let new = NewRunnerToken {
                    name: "bench".into(),
                    pool: None,
                    models: None,
                };
                let (_, token) = tokens::create(&pool, &new)
                    .await?
                    .context("creating the bench's runner token")?;
                Arc::new(Gateway::new(&base, token)?)
            }
        };
        let runner = tokio::spawn(worker::run(
            plane,
            vec![offer.clone()],
            RunnerConfig {
                slots,
                ..RunnerConfig::default()
            },
            stopped(runner_stopped),
        ));
        Ok(Stack {
            base,
            schema,
            stop_api,
            stop_runner,
            api,
            runner,
        })
    }

    /// The runner first: a gateway runner deregisters through the api.
    async fn stop(self) {
        let _ = self.stop_runner.send(true);
        let _ = self.runner.await;
        let _ = self.stop_api.send(true);
        let _ = self.api.await;
    }
}

async fn stopped(mut rx: tokio::sync::watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

fn prompt_for(i: usize) -> String {
    format!("Request {i}: write a short poem about the sea.")
}

fn run_in_process(
    model: &mut LoadedModel,
    conc: usize,
    max_tokens: u32,
) -> anyhow::Result<Measured> {
    let started = Instant::now();
    for i in 0..conc {
        let request = GenerateRequest::chat(
            "",
            vec![ChatMessage::text(Role::User, prompt_for(i))],
            sampling(max_tokens),
        );
        let prompt = encode_chat(&model.frontend, &request).map_err(|(_, m)| anyhow::anyhow!(m))?;
        model
            .engine
            .add_request(EngineRequest {
                adapter: None,
                id: i as u64,
                prompt,
                sampling: request.sampling,
                n: 1,
                priority: 0,
                resume: None,
            })
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    let mut first = vec![None; conc];
    let mut tokens = 0usize;
    while model.engine.has_work() {
        for out in model.engine.step().map_err(|e| anyhow::anyhow!("{e}"))? {
            tokens += out.token_ids.len();
            let slot = &mut first[out.request_id as usize];
            if slot.is_none() && !out.token_ids.is_empty() {
                *slot = Some(started.elapsed());
            }
        }
    }
    Ok(Measured {
        tokens,
        elapsed: started.elapsed(),
        ttfts: first.into_iter().flatten().collect(),
    })
}

fn sampling(max_tokens: u32) -> Sampling {
    Sampling {
        max_tokens: Some(max_tokens),
        temperature: 0.0,
        ignore_eos: true,
        ..Sampling::default()
    }
}

async fn run_through_stack(
    base: &str,
    model: &str,
    conc: usize,
    max_tokens: u32,
) -> anyhow::Result<Measured> {
    let client = reqwest::Client::new();
    let started = Instant::now();
    let tasks: Vec<_> = (0..conc)
        .map(|i| {
            let client = client.clone();
            let body = serde_json::json!({
                "model": model, "stream": true, "max_tokens": max_tokens, "temperature": 0,
                "ignore_eos": true, "stream_options": {"include_usage": true},
                "messages": [{"role": "user", "content": prompt_for(i)}],
            });
            let url = format!("{base}/v1/chat/completions");
            tokio::spawn(async move { stream_one(client, url, body, started).await })
        })
        .collect();
    let mut tokens = 0usize;
    let mut ttfts = Vec::new();
    for t in tasks {
        let (n, ttft) = t.await??;
        tokens += n;
        ttfts.extend(ttft);
    }
    Ok(Measured {
        tokens,
        elapsed: started.elapsed(),
        ttfts,
    })
}

/// Streams one completion; returns (completion tokens, time to first content).
async fn stream_one(
    client: reqwest::Client,
    url: String,
    body: serde_json::Value,
    started: Instant,
) -> anyhow::Result<(usize, Option<Duration>)> {
    let response = client
        .post(url)
        .json(&body)
        .send()
        .await?
        .error_for_status()?;
    let mut bytes = response.bytes_stream();
    let mut buffer = String::new();
    let mut first = None;
    let mut tokens = 0usize;
    while let Some(chunk) = bytes.next().await {
        buffer.push_str(&String::from_utf8_lossy(&chunk?));
        while let Some(end) = buffer.find("\n\n") {
            let event: String = buffer.drain(..end + 2).collect();
            for data in event.lines().filter_map(|l| l.strip_prefix("data: ")) {
                if data == "[DONE]" {
                    continue;
                }
                let v: serde_json::Value = serde_json::from_str(data)?;
                let has_text = v["choices"][0]["delta"]["content"]
                    .as_str()
                    .is_some_and(|s| !s.is_empty());
                if has_text && first.is_none() {
                    first = Some(started.elapsed());
                }
                if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
                    tokens = n as usize;
                }
            }
        }
    }
    Ok((tokens, first))
}

async fn wait_for_model(base: &str, model: &str) -> anyhow::Result<()> {
    let client = reqwest::Client::new();
    for _ in 0..300 {
        if let Ok(r) = client.get(format!("{base}/v1/models")).send().await {
            if r.text().await.unwrap_or_default().contains(model) {
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    anyhow::bail!("the stack did not list {model} in time")
}
