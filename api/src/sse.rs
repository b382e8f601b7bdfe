//! Server-sent events for chat streams: each [`Frame`] becomes one SSE event (`id:` = the
//! Redis entry id, `data:` = the chunk or error JSON, or `[DONE]`), and the stream of a job
//! is driven by a [`JobFollower`] feeding a [`ChunkBuilder`]. The optional [`CancelOnDrop`]
//! travels inside the body stream, so dropping the body (client gone) cancels the job.

use crate::cancel::CancelOnDrop;
use crate::chunks::{ChunkBuilder, Frame, Payload};
use crate::follow::JobFollower;
use axum::http::HeaderValue;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use fallow_scheduler::stream::StreamEntry;
use futures::stream::{self, Stream};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Instant;
use tracing::Instrument;

/// Everything a job's SSE body owns while it is being sent.
pub struct JobStream {
    pub follower: JobFollower,
    pub builder: ChunkBuilder,
    pub guard: Option<CancelOnDrop>,
    /// When the request arrived, for latency metrics (`None` on a resumed stream).
    pub started: Option<Instant>,
    /// The request's span (request id, job id), re-entered while the body is produced.
    pub span: tracing::Span,
}

/// The SSE response of a job stream, starting with the `first` entries already read, with
/// keep-alive comments so idle connections (and vanished clients) are noticed.
pub fn sse_response(mut job: JobStream, first: Vec<StreamEntry>) -> Response {
    let had_content = job.builder.content_sent();
    let pending: VecDeque<Frame> = first.iter().flat_map(|e| job.builder.on_entry(e)).collect();
    job.observe(had_content);
    sse_events(frames(job, pending))
}

/// An SSE response of `events`, with keep-alive comments, unbuffered by reverse proxies.
pub fn sse_events(
    events: impl Stream<Item = Result<Event, Infallible>> + Send + 'static,
) -> Response {
    let mut response = Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response();
    // Reverse proxies (nginx) would otherwise buffer the stream and defeat it.
    response
        .headers_mut()
        .insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}

fn frames(
    job: JobStream,
    pending: VecDeque<Frame>,
) -> impl Stream<Item = Result<Event, Infallible>> + Send {
    let state = (job, pending);
    stream::unfold(state, |(mut job, mut pending)| {
        let span = job.span.clone();
        async move {
            loop {
                if let Some(frame) = pending.pop_front() {
                    return Some((Ok(to_event(frame)), (job, pending)));
                }
                if job.builder.is_done() {
                    return None;
                }
                let had_content = job.builder.content_sent();
                let frames = match job.follower.next_batch().await {
                    Ok(entries) => entries
                        .iter()
                        .flat_map(|e| job.builder.on_entry(e))
                        .collect(),
                    // The guard stays armed: a timed out or broken stream cancels its job.
                    Err(err) => job.builder.on_error(err),
                };
                job.observe(had_content);
                pending.extend(frames);
            }
        }
        .instrument(span)
    })
}

impl JobStream {
    /// Metrics and guard bookkeeping after a batch of entries.
    fn observe(&mut self, had_content: bool) {
        if let Some(started) = self.started {
            if !had_content && self.builder.content_sent() {
                metrics::histogram!(crate::metrics::TTFT).record(started.elapsed().as_secs_f64());
            }
        }
        if self.builder.is_done() && self.builder.ended_normally() {
            if let Some(guard) = self.guard.as_mut() {
                guard.disarm();
            }
            if let (Some(started), Some((reason, usage))) =
                (self.started, self.builder.final_outcome())
            {
                let reason = crate::openai::response::finish_reason_str(reason);
                crate::metrics::record_success(reason, started.elapsed().as_secs_f64(), &usage);
            }
        }
    }
}

/// One frame as an SSE event.
pub fn to_event(frame: Frame) -> Event {
    let data = match frame.payload {
        Payload::Done => return Event::default().data("[DONE]"),
        Payload::Chunk(chunk) => serde_json::to_string(&chunk),
        Payload::Error(err) => {
            let envelope = err.status_and_body().1;
            metrics::counter!(crate::metrics::REQUEST_ERRORS, "type" => envelope.error.kind)
                .increment(1);
            serde_json::to_string(&envelope)
        }
    };
    let data = data.unwrap_or_else(|err| {
        format!(r#"{{"error":{{"message":"could not encode a chunk: {err}","type":"server_error","param":null,"code":null}}}}"#)
    });
    let event = Event::default().data(data);
    match frame.id {
        // Redis ids are `<ms>-<seq>`; anything else (never expected) is left out rather
        // than risking the newline panic of `Event::id`.
        Some(id) if !id.is_empty() && id.bytes().all(|b| b.is_ascii_graphic()) => event.id(id),
        _ => event,
    }
}
