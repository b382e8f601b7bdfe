//! `GET /runner/v1/notices`: what a gateway runner must hear of at once, pushed as
//! server-sent events: a cancellation of a job it holds, and an operator's change of its
//! state. A direct runner hears the same through Redis and Postgres `LISTEN`.

use super::auth::Runner;
use crate::error::ApiError;
use crate::state::AppState;
use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use fallow_scheduler::runner_wire::Notice;
use fallow_scheduler::runners;
use futures::Stream;
use std::convert::Infallible;
use std::time::Duration;

pub async fn notices(
    State(state): State<AppState>,
    runner: Runner,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let id = runner.id(&state).await?;
    let mut cancels = state.relay().cancel_signals();
    let mut hints = runners::state_hints(state.queue().pool().clone(), id);
    let queue = state.queue().clone();
    let closed = state.runner_api().closing.closed();
    let stream = async_stream_notices(move |send: NoticeSink| async move {
        tokio::pin!(closed);
        loop {
            let notice = tokio::select! {
                // The api is shutting down: the runner reconnects to another.
                () = &mut closed => return,
                Some(job) = cancels.recv() => {
                    // Every runner hears every cancel; this one is told only of its own jobs.
                    match queue.holder(job).await {
                        Ok(Some(holder)) if holder == id => Notice::Cancel { job },
                        _ => continue,
                    }
                }
                Some(()) = hints.recv() => Notice::State,
                else => return,
            };
            if !send.send(notice).await {
                return;
            }
        }
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(10))))
}

/// Where the notice loop sends; false once the runner hung up.
struct NoticeSink(tokio::sync::mpsc::Sender<Notice>);

impl NoticeSink {
    async fn send(&self, notice: Notice) -> bool {
        self.0.send(notice).await.is_ok()
    }
}

/// Runs `produce` on its own task and streams what it sends as events; the task ends when
/// the stream is dropped (the runner hung up) or `produce` returns.
fn async_stream_notices<F, Fut>(produce: F) -> impl Stream<Item = Result<Event, Infallible>>
where
    F: FnOnce(NoticeSink) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let task = tokio::spawn(produce(NoticeSink(tx)));
    let abort = task.abort_handle();
    let guard = AbortOnDrop(abort);
    futures::stream::unfold((rx, guard), |(mut rx, guard)| async move {
        let notice = rx.recv().await?;
        let event = Event::default()
            .json_data(&notice)
            .unwrap_or_else(|_| Event::default().comment("unserialisable notice"));
        Some((Ok(event), (rx, guard)))
    })
}

/// Ends the notice task with the stream.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
