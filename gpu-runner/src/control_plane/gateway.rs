//! The gateway transport: every call goes to the api tier's runner API over HTTP, with a
//! runner token. The runner holds no database, Redis or admin credential, and needs only
//! outbound connections to the api, so it can run behind NAT on a machine its owner lends.
//!
//! A claim is a long poll that the api wakes on `NOTIFY`. Cancellations and operators'
//! state changes arrive on one server-sent event stream (`/notices`), reconnected with
//! backoff. A step's events are tried once, with a short time limit: the worker's uplink
//! retries them in order while the api is unreachable. Reports the fence refuses
//! (`lease_not_held`) read as a stale report, as they do for a direct runner.

use super::backoff::{while_unavailable, Backoff};
use super::{ControlPlane, PlaneError, PlaneResult, StreamCaps};
use fallow_protocol::job::{Completion, JobEvent, Progress};
use fallow_scheduler::error::describe;
use fallow_scheduler::queue::{Checkpoint, ClaimScope, ClaimedJob, FailOutcome, LeaseRenewal};
use fallow_scheduler::runner_wire as wire;
use fallow_scheduler::runners::{RunnerInfo, RunnerState};
use futures::future::BoxFuture;
use futures::FutureExt;
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use uuid::Uuid;

/// How long one try at appending a step's events may take: a connection that stopped
/// forwarding is given up, and the uplink tries again on a fresh one.
const APPEND_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a claim waits at the api for work before it answers with none.
const CLAIM_WAIT: Duration = Duration::from_secs(5);

/// A call's own time limit, on top of any wait it asks the api for.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The header in which the runner names itself once registered.
const RUNNER_HEADER: &str = "x-fallow-runner";

/// Where the runner API is, and the token it takes.
#[derive(Clone)]
pub struct Gateway {
    inner: Arc<Inner>,
}

struct Inner {
    http: reqwest::Client,
    /// The api's URL with the runner API's path, without a trailing slash.
    base: String,
    token: String,
    runner_id: Mutex<Option<Uuid>>,
    /// Handed out once each; fed by the notice stream.
    cancels: Mutex<Option<mpsc::Receiver<Uuid>>>,
    cancels_tx: mpsc::Sender<Uuid>,
}

impl Gateway {
    /// A transport to the api at `url` (e.g. `https://fallow.example.com`).
    pub fn new(url: &str, token: String) -> Result<Self, PlaneError> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| PlaneError::Refused(format!("building the HTTP client: {e}")))?;
        let (cancels_tx, cancels) = mpsc::channel(1024);
        Ok(Gateway {
            inner: Arc::new(Inner {
                http,
                base: format!("{}{}", url.trim_end_matches('/'), wire::BASE_PATH),
                token,
                runner_id: Mutex::new(None),
                cancels: Mutex::new(Some(cancels)),
                cancels_tx,
            }),
        })
    }

    fn runner_id(&self) -> Option<Uuid> {
        *self
            .inner
            .runner_id
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        let mut request = self
            .inner
            .http
            .request(method, format!("{}{path}", self.inner.base))
            .bearer_auth(&self.inner.token);
        if let Some(id) = self.runner_id() {
            request = request.header(RUNNER_HEADER, id.to_string());
        }
        request
    }

    /// One call: `body` as JSON (or none), the answer as `T`; `wait` is how long the api
    /// may hold it on top of the usual time limit.
    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&(impl Serialize + Sync)>,
        wait: Duration,
    ) -> PlaneResult<T> {
        self.call_within(method, path, body, CALL_TIMEOUT + wait)
            .await
    }

    /// One call that must be answered within `limit`.
    async fn call_within<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&(impl Serialize + Sync)>,
        limit: Duration,
    ) -> PlaneResult<T> {
        let mut request = self.request(method, path).timeout(limit);
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request.send().await.map_err(|e| unavailable(path, &e))?;
        let status = response.status();
        if status.is_success() {
            return response
                .json()
                .await
                .map_err(|e| unavailable(&format!("{path}: reading the answer"), &e));
        }
        let text = response.text().await.unwrap_or_default();
        Err(self.refusal(path, status, &text))
    }

    /// A call's refusal, by status and the error envelope's `code`.
    fn refusal(&self, path: &str, status: StatusCode, body: &str) -> PlaneError {
        let envelope: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
        let code = envelope["error"]["code"].as_str().unwrap_or_default();
        let message = envelope["error"]["message"].as_str().unwrap_or(body);
        match (status, code) {
            (StatusCode::CONFLICT, "runner_not_registered") => {
                PlaneError::UnknownRunner(self.runner_id().unwrap_or_default())
            }
            (StatusCode::CONFLICT, "lease_not_held") => PlaneError::Fenced,
            (StatusCode::UNAUTHORIZED, _) | (StatusCode::CONFLICT, "runner_replaced") => {
                PlaneError::Revoked(format!("{path}: {message}"))
            }
            (s, _) if s.is_server_error() || s == StatusCode::TOO_MANY_REQUESTS => {
                PlaneError::Unavailable(format!("{path}: {status}: {message}"))
            }
            _ => PlaneError::Refused(format!("{path}: {status}: {message}")),
        }
    }

    async fn post<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &(impl Serialize + Sync),
    ) -> PlaneResult<T> {
        self.call(Method::POST, path, Some(body), Duration::ZERO)
            .await
    }

    /// A report on one job (`/jobs/{id}/{end}`); a refusal by the fence reads as `stale`,
    /// as a stale report does for a direct runner.
    async fn report<T: DeserializeOwned, R>(
        &self,
        job: Uuid,
        end: &str,
        body: &(impl Serialize + Sync),
        pick: impl FnOnce(T) -> R,
        stale: R,
    ) -> PlaneResult<R> {
        let answer = self.post::<T>(&format!("/jobs/{job}/{end}"), body).await;
        match answer {
            Err(PlaneError::Fenced) => Ok(stale),
            other => other.map(pick),
        }
    }

    async fn fail_with(
        &self,
        job: Uuid,
        attempt: i32,
        error: &str,
        retryable: bool,
        progress: Option<&Progress>,
    ) -> PlaneResult<FailOutcome> {
        let body = wire::Fail {
            attempt,
            error: error.to_string(),
            retryable,
            progress: progress.cloned(),
        };
        let pick = |o: wire::Outcome| o.outcome;
        self.report(job, "fail", &body, pick, FailOutcome::Stale)
            .await
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> PlaneResult<T> {
        self.call(Method::GET, path, None::<&()>, Duration::ZERO)
            .await
    }

    /// Reads the notice stream until it ends, then connects again with backoff, for as long
    /// as the transport lives.
    async fn follow_notices(self, states: mpsc::Sender<()>) {
        let mut backoff = Backoff::default();
        loop {
            match self.notices_once(&states).await {
                Ok(()) => backoff.reset(),
                Err(e) => tracing::warn!(error = %e, "the runner API's notice stream failed"),
            }
            if states.is_closed() && self.inner.cancels_tx.is_closed() {
                return;
            }
            // Whatever was missed meanwhile: the state is read again, and heartbeats
            // report cancellations too.
            let _ = states.try_send(());
            tokio::time::sleep(backoff.delay()).await;
        }
    }

    async fn notices_once(&self, states: &mpsc::Sender<()>) -> PlaneResult<()> {
        let mut response = self
            .request(Method::GET, "/notices")
            .send()
            .await
            .map_err(|e| unavailable("/notices", &e))?;
        if !response.status().is_success() {
            let status = response.status();
            let text = response.text().await.unwrap_or_default();
            return Err(self.refusal("/notices", status, &text));
        }
        let mut buffer = String::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| unavailable("/notices", &e))?
        {
            buffer.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(end) = buffer.find("\n\n") {
                let event: String = buffer.drain(..end + 2).collect();
                for data in event.lines().filter_map(|l| l.strip_prefix("data:")) {
                    match serde_json::from_str::<wire::Notice>(data.trim()) {
                        Ok(wire::Notice::Cancel { job }) => {
                            let _ = self.inner.cancels_tx.send(job).await;
                        }
                        Ok(wire::Notice::State) => {
                            let _ = states.try_send(());
                        }
                        Err(e) => tracing::warn!(error = %e, "an unreadable notice"),
                    }
                }
            }
        }
        Ok(())
    }
}

/// A failed request, with every cause: reqwest's own message hides why (a certificate
/// that is not trusted, a refused connection).
fn unavailable(path: &str, error: &reqwest::Error) -> PlaneError {
    PlaneError::Unavailable(format!("{path}: {}", describe(error)))
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

impl ControlPlane for Gateway {
    fn register<'a>(&'a self, info: &'a RunnerInfo) -> BoxFuture<'a, PlaneResult<Uuid>> {
        async move {
            let body = wire::Register {
                info: info.clone(),
                id: None,
            };
            let registered: wire::Registered = self.post("/register", &body).await?;
            *self
                .inner
                .runner_id
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = Some(registered.runner_id);
            Ok(registered.runner_id)
        }
        .boxed()
    }

    fn register_as<'a>(&'a self, id: Uuid, info: &'a RunnerInfo) -> BoxFuture<'a, PlaneResult<()>> {
        async move {
            let body = wire::Register {
                info: info.clone(),
                id: Some(id),
            };
            let registered: wire::Registered = self.post("/register", &body).await?;
            if registered.runner_id != id {
                // The token was bound elsewhere meanwhile: this runner is no longer its.
                return Err(PlaneError::Refused(format!(
                    "registered again as {} instead of {id}",
                    registered.runner_id
                )));
            }
            Ok(())
        }
        .boxed()
    }

    fn deregister(&self, _id: Uuid) -> BoxFuture<'_, PlaneResult<()>> {
        async move {
            let _: serde_json::Value = self.post("/deregister", &serde_json::json!({})).await?;
            Ok(())
        }
        .boxed()
    }

    fn heartbeat(&self, _id: Uuid, in_flight: i32) -> BoxFuture<'_, PlaneResult<RunnerState>> {
        async move {
            let state: wire::StateIs = self
                .post("/heartbeat", &wire::Heartbeat { in_flight })
                .await?;
            state
                .state
                .ok_or_else(|| PlaneError::UnknownRunner(self.runner_id().unwrap_or_default()))
        }
        .boxed()
    }

    fn state(&self, _id: Uuid) -> BoxFuture<'_, PlaneResult<Option<RunnerState>>> {
        async move { Ok(self.get::<wire::StateIs>("/state").await?.state) }.boxed()
    }

    fn report_state<'a>(
        &'a self,
        _id: Uuid,
        from: &'a [RunnerState],
        to: RunnerState,
    ) -> BoxFuture<'a, PlaneResult<RunnerState>> {
        async move {
            let body = wire::ReportState {
                from: from.to_vec(),
                to,
            };
            let state: wire::StateIs = self.post("/state", &body).await?;
            state
                .state
                .ok_or_else(|| PlaneError::UnknownRunner(self.runner_id().unwrap_or_default()))
        }
        .boxed()
    }

    fn set_warm<'a>(&'a self, _id: Uuid, warm: &'a [String]) -> BoxFuture<'a, PlaneResult<()>> {
        async move {
            let body = wire::Warm {
                warm: warm.to_vec(),
            };
            let _: wire::Warm = self.post("/warm", &body).await?;
            Ok(())
        }
        .boxed()
    }

    fn drain_left(&self, _id: Uuid) -> BoxFuture<'_, PlaneResult<Option<Duration>>> {
        async move {
            let left: wire::DrainLeft = self.get("/drain").await?;
            Ok(left.left_ms.map(Duration::from_millis))
        }
        .boxed()
    }

    fn take_evictions(&self, _id: Uuid) -> BoxFuture<'_, PlaneResult<Vec<String>>> {
        async move {
            let taken: wire::Evictions = self.post("/evictions", &serde_json::json!({})).await?;
            Ok(taken.models)
        }
        .boxed()
    }

    fn warm_replicas(&self) -> BoxFuture<'_, PlaneResult<HashMap<String, i64>>> {
        async move { Ok(self.get::<wire::Replicas>("/warm-replicas").await?.replicas) }.boxed()
    }

    fn pool_turn(
        &self,
        _id: Uuid,
        owner_idle: bool,
        max_share: f64,
    ) -> BoxFuture<'_, PlaneResult<bool>> {
        async move {
            let body = wire::PoolTurnAsked {
                owner_idle,
                max_share,
            };
            Ok(self.post::<wire::PoolTurn>("/pool-turn", &body).await?.turn)
        }
        .boxed()
    }

    fn state_hints(&self, _id: Uuid) -> mpsc::Receiver<()> {
        let (states, hints) = mpsc::channel(16);
        tokio::spawn(self.clone().follow_notices(states));
        hints
    }

    fn claim<'a>(
        &'a self,
        _id: Uuid,
        scope: &'a ClaimScope<'a>,
        limit: i64,
        lease: Duration,
    ) -> BoxFuture<'a, PlaneResult<Vec<ClaimedJob>>> {
        async move {
            let mut body = wire::Claim {
                warm: scope.warm.to_vec(),
                cold: scope.cold.to_vec(),
                cold_after_ms: millis(scope.cold_after),
                limit,
                lease_ms: millis(lease),
                wait_ms: millis(CLAIM_WAIT),
                claim_id: Some(Uuid::new_v4()),
                again: false,
            };
            // A lost answer is asked for again under the same claim id, which gets the jobs
            // it claimed, for as long as their leases last.
            let ask = || {
                let this = body.clone();
                body.again = true;
                async move {
                    self.call::<wire::Claimed>(Method::POST, "/claim", Some(&this), CLAIM_WAIT)
                        .await
                }
                .boxed()
            };
            Ok(while_unavailable(lease, ask).await?.jobs)
        }
        .boxed()
    }

    fn wait_for_work(&self, _timeout: Duration) -> BoxFuture<'_, ()> {
        // The claim itself waited at the api for work.
        async {}.boxed()
    }

    fn renew<'a>(
        &'a self,
        _id: Uuid,
        held: &'a [Checkpoint],
        lease: Duration,
    ) -> BoxFuture<'a, PlaneResult<LeaseRenewal>> {
        async move {
            let body = wire::Renew {
                held: held.to_vec(),
                lease_ms: millis(lease),
            };
            self.post("/renew", &body).await
        }
        .boxed()
    }

    fn complete<'a>(
        &'a self,
        job: Uuid,
        attempt: i32,
        completion: &'a Completion,
    ) -> BoxFuture<'a, PlaneResult<bool>> {
        async move {
            let body = wire::Complete {
                attempt,
                completion: completion.clone(),
            };
            let pick = |c: wire::Committed| c.committed;
            self.report(job, "complete", &body, pick, false).await
        }
        .boxed()
    }

    fn fail<'a>(
        &'a self,
        job: Uuid,
        attempt: i32,
        error: &'a str,
        retryable: bool,
    ) -> BoxFuture<'a, PlaneResult<FailOutcome>> {
        async move { self.fail_with(job, attempt, error, retryable, None).await }.boxed()
    }

    fn fail_and_continue<'a>(
        &'a self,
        job: Uuid,
        attempt: i32,
        error: &'a str,
        progress: &'a Progress,
    ) -> BoxFuture<'a, PlaneResult<FailOutcome>> {
        async move {
            self.fail_with(job, attempt, error, true, Some(progress))
                .await
        }
        .boxed()
    }

    fn release<'a>(
        &'a self,
        job: Uuid,
        attempt: i32,
        progress: Option<&'a Progress>,
    ) -> BoxFuture<'a, PlaneResult<FailOutcome>> {
        async move {
            let body = wire::Release {
                attempt,
                progress: progress.cloned(),
            };
            let pick = |o: wire::Outcome| o.outcome;
            self.report(job, "release", &body, pick, FailOutcome::Stale)
                .await
        }
        .boxed()
    }

    fn mark_cancelled<'a>(
        &'a self,
        job: Uuid,
        attempt: i32,
        partial: &'a Completion,
    ) -> BoxFuture<'a, PlaneResult<bool>> {
        async move {
            let body = wire::Cancelled {
                attempt,
                partial: partial.clone(),
            };
            let pick = |c: wire::Committed| c.committed;
            self.report(job, "cancelled", &body, pick, false).await
        }
        .boxed()
    }

    fn append<'a>(
        &'a self,
        streamed: &'a [(Uuid, i32)],
        events: &'a [(Uuid, JobEvent)],
        caps: StreamCaps<'a>,
    ) -> BoxFuture<'a, PlaneResult<Vec<Uuid>>> {
        async move {
            let body = wire::Append {
                streamed: streamed
                    .iter()
                    .map(|&(job, attempt)| wire::JobAttempt { job, attempt })
                    .collect(),
                events: events
                    .iter()
                    .map(|(job, event)| wire::StepEvent {
                        job: *job,
                        event: event.clone(),
                        cap: caps(*job),
                    })
                    .collect(),
            };
            let answer: wire::Appended = self
                .call_within(Method::POST, "/events", Some(&body), APPEND_TIMEOUT)
                .await?;
            Ok(answer.refused)
        }
        .boxed()
    }

    fn cancel_signals(&self) -> mpsc::Receiver<Uuid> {
        self.inner
            .cancels
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .unwrap_or_else(|| mpsc::channel(1).1)
    }
}
