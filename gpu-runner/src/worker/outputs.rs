//! What the engines report, turned into the job's stream and its end: admissions, rejections,
//! a step's outputs (queued on the uplink as one append for all jobs; finished jobs
//! completed once their `Final` has left, fenced by `(id, attempt)`), tokenization answers,
//! and an engine's failure.

use super::completing::{self, RetryPolicy};
use super::engine_host::HostEvent;
use super::models::EngineKey;
use super::{telemetry, Worker};
use fallow_protocol::job::{Completion, JobEvent};
use fallow_scheduler::queue::JobKind;
use fallow_scheduler::runners::RunnerState;

impl Worker {
    pub(super) async fn on_engine_event(&mut self, engine: EngineKey, event: HostEvent) {
        if !self.models.is_current(&engine) {
            return; // an engine since unloaded; its jobs are gone
        }
        match event {
            HostEvent::Admitted {
                id,
                prompt_ids,
                prompt_text,
            } => {
                if let Some(job) = self.table.get_mut(id) {
                    let prompt_tokens = prompt_ids.len();
                    tracing::debug!(job_id = %job.job_id, prompt_tokens, continues = job.continues(), "job admitted to the engine");
                    job.prompt_text = prompt_text.clone();
                    job.admitted(prompt_ids);
                    if job.continues() {
                        telemetry::record_tokens_reused(&job.model, job.earlier_tokens());
                    }
                    let started = JobEvent::Started {
                        attempt: job.attempt,
                        prompt_text,
                        continues: job.continues(),
                    };
                    let job_id = job.job_id;
                    self.append(&[(job_id, started)]).await;
                }
            }
            HostEvent::Rejected { id, code, message } => {
                if let Some(job) = self.table.remove(id) {
                    self.append(&[(
                        job.job_id,
                        JobEvent::Error {
                            code,
                            message: message.clone(),
                        },
                    )])
                    .await;
                    self.fail_job(job.job_id, job.attempt, &message, false)
                        .await;
                }
            }
            HostEvent::Answered { id, completion } => self.on_answered(id, *completion).await,
            HostEvent::Step(outputs) => self.on_step(outputs).await,
            HostEvent::Failed { message } => {
                tracing::error!(%message, model = %engine.model, "engine failed");
                for id in self.table.requests() {
                    if self.table.get_mut(id).map(|j| j.model == engine.model) == Some(true) {
                        if let Some(job) = self.table.remove(id) {
                            self.end_with_error(job, "engine_error", &message, true)
                                .await;
                        }
                    }
                }
                self.models.engine_failed(&engine.model);
                self.models_changed().await;
            }
        }
    }

    pub(super) async fn on_step(&mut self, outputs: Vec<fallow_engine::llm::SeqOutput>) {
        let mut events = Vec::with_capacity(outputs.len() + 1);
        let mut finished = Vec::new();
        let mut first_tokens = Vec::new();
        for out in outputs {
            let request = out.request_id;
            let Some(job) = self.table.get_mut(request) else {
                continue; // aborted a step ago
            };
            let was_streamed = job.streamed;
            events.push((job.job_id, job.absorb(out)));
            if !was_streamed
                && job.streamed
                && job.client_streams
                && job.kind == JobKind::Interactive
            {
                first_tokens.push((job.job_id, job.attempt));
            }
            if job.is_finished() && !finished.contains(&request) {
                finished.push(request);
            }
        }
        let mut done = Vec::new();
        for request in finished {
            if let Some(job) = self.table.remove(request) {
                let completion = job.completion();
                telemetry::record_prefix_cache(&job.model, &completion.usage);
                events.push((
                    job.job_id,
                    JobEvent::Final {
                        completion: completion.clone(),
                    },
                ));
                done.push((job, completion));
            }
        }
        // The first tokens' `streamed` marks leave before the tokens do: once a client has
        // seen tokens, the reaper must not hand the job to another runner (the client would
        // see two attempts spliced).
        let sent = self.send_step(first_tokens, events).await;
        let finished_any = !done.is_empty();
        if finished_any {
            let plane = self.plane.clone();
            // Held (and their leases renewed) until the completions commit or are refused.
            let held: Vec<_> = done
                .iter()
                .map(|(job, _)| self.completing.hold(job.job_id, job.attempt))
                .collect();
            // Completing off the loop keeps the next step's tokens flowing; each completion
            // follows its `Final` into the stream.
            tokio::spawn(async move {
                let _ = sent.await;
                let commits = done.iter().map(|(job, completion)| {
                    let plane = plane.clone();
                    async move {
                        let commit = || plane.complete(job.job_id, job.attempt, completion);
                        let outcome =
                            completing::until_settled(RetryPolicy::default(), commit).await;
                        (job.job_id, outcome)
                    }
                });
                for (job_id, outcome) in futures::future::join_all(commits).await {
                    match outcome {
                        Ok(true) => tracing::debug!(%job_id, "job completed"),
                        Ok(false) => tracing::info!(%job_id, "stale completion ignored"),
                        Err(e) => {
                            tracing::error!(%job_id, error = %e, "completing failed for good")
                        }
                    }
                }
                drop(held);
                drop(done);
            });
        }
        if finished_any {
            self.models_changed().await; // idle models may now make room for others
        }
        if self.state.registry() == RunnerState::Draining && self.table.leases().is_empty() {
            self.reconcile().await; // drained: tell the operator now, not at the heartbeat
        }
    }

    /// A job answered without engine steps (tokenize, detokenize, embed): it ends at once,
    /// with one `Final`.
    pub(super) async fn on_answered(&mut self, id: u64, completion: Completion) {
        let Some(job) = self.table.remove(id) else {
            return;
        };
        let final_event = JobEvent::Final {
            completion: completion.clone(),
        };
        let sent = self.append(&[(job.job_id, final_event)]).await;
        let _ = sent.await; // the completion follows its `Final`
        match self
            .plane
            .complete(job.job_id, job.attempt, &completion)
            .await
        {
            Ok(_) => tracing::debug!(job_id = %job.job_id, "answered without engine steps"),
            Err(e) => tracing::warn!(job_id = %job.job_id, error = %e, "completing failed"),
        }
        self.models_changed().await;
    }
}
