//! The noisy-neighbour benchmark (`fallow bench neighbour`): one tenant's stream, its
//! inter-token latency measured alone and then while another tenant sends, one after
//! another, a request with a json_schema never seen before, a request with 300 `logit_bias`
//! entries, and an 8 MB prompt. Both through one model's engine host, as a runner runs
//! them; the ratio of the two p99s is the figure.

use super::engine_host::{EngineHost, HostCommand, HostEvent, HostOptions};
use fallow_engine::llm::LlmEngine;
use fallow_engine::runtime::ModelFrontend;
use fallow_protocol::job::{ChatMessage, Constraint, GenerateRequest, Role, Sampling};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// The stream's inter-token latency over one run.
#[derive(Debug, Clone, Copy)]
pub struct Latency {
    pub tokens: usize,
    pub p50: Duration,
    pub p99: Duration,
    /// The longest gap: a stall of one step that a percentile hides.
    pub max: Duration,
}

/// What one round measured.
#[derive(Debug, Clone, Copy)]
pub struct NeighbourRound {
    pub alone: Latency,
    pub noisy: Latency,
    /// Requests the neighbour sent while the stream ran.
    pub neighbour_requests: usize,
}

/// The stream's request id; the neighbour's count up from here.
const STREAM: u64 = 1;

/// Runs `rounds` rounds of a `tokens`-token stream, alone then beside the neighbour.
pub async fn noisy_neighbour(
    engine: LlmEngine,
    frontend: ModelFrontend,
    tokens: u32,
    rounds: usize,
) -> anyhow::Result<Vec<NeighbourRound>> {
    let (host, mut events) = EngineHost::spawn(engine, frontend, "bench", HostOptions::default())?;
    let mut next_id = STREAM + 1;
    let mut out = Vec::new();
    for _ in 0..rounds {
        let alone = stream(&host, &mut events, tokens, None).await?;
        let mut neighbour = Neighbour {
            next_id: &mut next_id,
            sent: 0,
        };
        let noisy = stream(&host, &mut events, tokens, Some(&mut neighbour)).await?;
        out.push(NeighbourRound {
            alone,
            noisy,
            neighbour_requests: neighbour.sent,
        });
    }
    Ok(out)
}

/// The other tenant: one request at a time, the next as soon as the last is admitted or
/// refused. Admitted ones are aborted at once: their preparation is the load under test.
struct Neighbour<'a> {
    next_id: &'a mut u64,
    sent: usize,
}

impl Neighbour<'_> {
    fn send_next(&mut self, host: &EngineHost) -> anyhow::Result<u64> {
        let id = *self.next_id;
        *self.next_id += 1;
        let request = match self.sent % 3 {
            0 => fresh_schema(id),
            1 => wide_logit_bias(),
            _ => huge_prompt(),
        };
        self.sent += 1;
        anyhow::ensure!(
            host.send(HostCommand::Add { id, request }),
            "the engine stopped"
        );
        Ok(id)
    }
}

/// Streams one request to its end (beside `neighbour`'s requests, if any) and returns the
/// gaps between its tokens.
async fn stream(
    host: &EngineHost,
    events: &mut mpsc::UnboundedReceiver<HostEvent>,
    tokens: u32,
    mut neighbour: Option<&mut Neighbour<'_>>,
) -> anyhow::Result<Latency> {
    let sampling = Sampling {
        max_tokens: Some(tokens),
        ignore_eos: true,
        ..Sampling::default()
    };
    let request = chat("Tell me about the history of the sea, at length.", sampling);
    anyhow::ensure!(
        host.send(HostCommand::Add {
            id: STREAM,
            request
        }),
        "the engine stopped"
    );
    let mut pending = match neighbour.as_mut() {
        Some(n) => Some(n.send_next(host)?),
        None => None,
    };
    let mut last: Option<Instant> = None;
    let mut gaps = Vec::new();
    loop {
        let event = events
            .recv()
            .await
            .ok_or_else(|| anyhow::anyhow!("the engine stopped"))?;
        match event {
            HostEvent::Step(outputs) => {
                let mine: Vec<_> = outputs.iter().filter(|o| o.request_id == STREAM).collect();
                if mine.iter().any(|o| !o.token_ids.is_empty()) {
                    let now = Instant::now();
                    if let Some(before) = last.replace(now) {
                        gaps.push(now - before);
                    }
                }
                if mine.iter().any(|o| o.finish.is_some()) {
                    break;
                }
            }
            HostEvent::Admitted { id, .. } | HostEvent::Rejected { id, .. }
                if Some(id) == pending =>
            {
                host.send(HostCommand::Abort { id });
                pending = match neighbour.as_mut() {
                    Some(n) => Some(n.send_next(host)?),
                    None => None,
                };
            }
            HostEvent::Rejected {
                id: STREAM,
                message,
                ..
            } => {
                anyhow::bail!("the stream was refused: {message}")
            }
            HostEvent::Failed { message } => anyhow::bail!("the engine failed: {message}"),
            _ => {}
        }
    }
    if let Some(id) = pending {
        host.send(HostCommand::Abort { id });
    }
    Ok(latency(gaps))
}

fn latency(mut gaps: Vec<Duration>) -> Latency {
    gaps.sort();
    let at = |q: f64| {
        let i = ((gaps.len() as f64 - 1.0) * q).round() as usize;
        gaps.get(i).copied().unwrap_or_default()
    };
    Latency {
        tokens: gaps.len() + 1,
        p50: at(0.50),
        p99: at(0.99),
        max: gaps.last().copied().unwrap_or_default(),
    }
}

fn chat(text: impl Into<String>, sampling: Sampling) -> Box<GenerateRequest> {
    Box::new(GenerateRequest::chat(
        "bench",
        vec![ChatMessage::text(Role::User, text)],
        sampling,
    ))
}

/// 8 MB of prompt: rendered and tokenized, then refused as longer than the context.
fn huge_prompt() -> Box<GenerateRequest> {
    chat("lorem ipsum dolor sit amet ".repeat(8 << 20 >> 5), short())
}

/// OpenAI's most `logit_bias` entries.
fn wide_logit_bias() -> Box<GenerateRequest> {
    let sampling = Sampling {
        logit_bias: (0..300u32).map(|t| (t + 1000, -5.0)).collect(),
        ..short()
    };
    chat("Say hello.", sampling)
}

/// A json_schema whose property name makes it new to the grammar cache.
fn fresh_schema(id: u64) -> Box<GenerateRequest> {
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            format!("field_{id}"): {"type": "string", "maxLength": 40},
            "items": {"type": "array", "items": {"type": "integer"}, "maxItems": 8},
        },
        "required": [format!("field_{id}"), "items"],
    });
    let sampling = Sampling {
        constraint: Some(Constraint::JsonSchema {
            schema,
            strict: true,
        }),
        ..short()
    };
    chat("Fill in the form.", sampling)
}

fn short() -> Sampling {
    Sampling {
        max_tokens: Some(4),
        ..Sampling::default()
    }
}
