//! A Responses job's events as server-sent events (`event: <type>`, `data: {…}`, `id:` the
//! sequence number). The stream is always built from the job's stream from its start, and
//! events up to `starting_after` are only counted, not sent: so a resumed stream on any api
//! process continues the numbering of the first. The optional [`CancelOnDrop`] travels in
//! the body (a foreground stream's client gone cancels its job; a background job runs on).

use super::builder::{ResponseBuilder, ResponseEvent};
use super::store;
use crate::cancel::CancelOnDrop;
use crate::follow::JobFollower;
use crate::sse::sse_events;
use axum::response::sse::Event;
use axum::response::Response;
use fallow_scheduler::stream::StreamEntry;
use futures::stream;
use sqlx::PgPool;
use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Instant;
use tracing::Instrument;
use uuid::Uuid;

/// Everything a response's SSE body owns while it is sent.
pub struct ResponseStream {
    pub follower: JobFollower,
    pub builder: ResponseBuilder,
    pub guard: Option<CancelOnDrop>,
    /// Events numbered up to this one are not sent (`starting_after`).
    pub starting_after: Option<u64>,
    /// Where to record the finished response (a stored response's id).
    pub store: Option<(PgPool, Uuid)>,
    pub started: Option<Instant>,
    pub span: tracing::Span,
}

impl ResponseStream {
    /// The events the client has not seen.
    fn unseen(&self, mut events: Vec<ResponseEvent>) -> Vec<ResponseEvent> {
        if let Some(after) = self.starting_after {
            events.retain(|e| e.sequence_number > after);
        }
        events
    }

    /// Time to first token, when this batch of entries brought the first text.
    fn observe(&self, had_text: bool) {
        if let Some(started) = self.started {
            if !had_text && self.builder.text_seen() {
                metrics::histogram!(crate::metrics::TTFT).record(started.elapsed().as_secs_f64());
            }
        }
    }

    /// Bookkeeping once the builder has ended: disarm the guard, record the answer.
    fn on_done(&mut self) {
        if let Some(guard) = self.guard.as_mut() {
            guard.disarm();
        }
        if let (Some(started), Some((reason, usage))) =
            (self.started.take(), self.builder.final_outcome())
        {
            let reason = crate::openai::response::finish_reason_str(reason);
            crate::metrics::record_success(reason, started.elapsed().as_secs_f64(), &usage);
        }
        let response = self.builder.response();
        if response.status == "in_progress" || response.status == "queued" {
            return;
        }
        if let Some((pool, id)) = self.store.take() {
            let Ok(value) = serde_json::to_value(response) else {
                return;
            };
            tokio::spawn(async move {
                if let Err(err) = store::finish(&pool, id, &value).await {
                    tracing::warn!(error = %err, "could not record the finished response");
                }
            });
        }
    }
}

/// The SSE response of `job`, starting with the `first` entries already read.
pub fn response_sse(mut job: ResponseStream, first: Vec<StreamEntry>) -> Response {
    let mut pending: VecDeque<ResponseEvent> = VecDeque::new();
    let mut events = job.builder.start();
    for entry in &first {
        events.extend(job.builder.on_entry(entry));
    }
    job.observe(false);
    pending.extend(job.unseen(events));
    if job.builder.ended_by_job() {
        job.on_done();
    }
    let body = stream::unfold((job, pending), |(mut job, mut pending)| {
        let span = job.span.clone();
        async move {
            loop {
                if let Some(event) = pending.pop_front() {
                    return Some((Ok::<_, Infallible>(to_event(event)), (job, pending)));
                }
                if job.builder.is_done() {
                    return None;
                }
                let had_text = job.builder.text_seen();
                let events = match job.follower.next_batch().await {
                    Ok(entries) => entries
                        .iter()
                        .flat_map(|e| job.builder.on_entry(e))
                        .collect(),
                    // The guard stays armed: a timed out or broken stream cancels its job.
                    Err(err) => job.builder.on_error(&err),
                };
                pending.extend(job.unseen(events));
                job.observe(had_text);
                if job.builder.ended_by_job() {
                    job.on_done();
                }
            }
        }
        .instrument(span)
    });
    sse_events(body)
}

fn to_event(event: ResponseEvent) -> Event {
    let data = serde_json::to_string(&event.data).unwrap_or_else(|err| {
        format!(r#"{{"type":"error","code":"server_error","message":"could not encode an event: {err}","param":null}}"#)
    });
    Event::default()
        .event(event.kind)
        .id(event.sequence_number.to_string())
        .data(data)
}
