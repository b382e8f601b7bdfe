//! Jobs a runner holds, and how engine outputs become job events. Each job keeps the text of
//! its choices so the final `Completion` can be stored without re-reading the stream, and
//! their token ids so a job handed back can be continued by another runner ([`Progress`]).
//! A job that continues an earlier attempt starts from that attempt's progress, so its
//! text, logprobs and usage stay those of one uninterrupted run. At each heartbeat a job
//! gives a [`Checkpoint`]: its progress, for the case where its runner dies and Redis lost
//! its stream.

use fallow_engine::llm::SeqOutput;
use fallow_protocol::job::{
    ChoiceProgress, ChoiceResult, Completion, FinishReason, JobEvent, Progress, Task, TokenLogprob,
    Usage,
};
use fallow_protocol::position::ChoicePosition;
use fallow_scheduler::queue::{Checkpoint, ClaimedJob, JobKind};
use std::collections::HashMap;
use uuid::Uuid;

/// One held job.
pub struct InFlight {
    pub job_id: Uuid,
    pub attempt: i32,
    pub kind: JobKind,
    /// The model (and so the engine) serving it.
    pub model: String,
    choices: Vec<ChoiceState>,
    usage: Usage,
    /// Whether the client reads tokens as they come (then a job that sent any is not retried).
    pub client_streams: bool,
    /// Whether any text reached the stream.
    pub streamed: bool,
    /// A token-id prompt as text (for `echo`), once the engine admitted the job.
    pub prompt_text: Option<String>,
    /// The prompt's token ids, once the engine admitted the job.
    prompt_ids: Option<Vec<u32>>,
    /// The progress this attempt started from (earlier attempts'), if any.
    earlier: Option<Progress>,
    /// Whether another runner could continue this job from its progress: a generation job
    /// whose choices need nothing the progress does not carry (hidden states).
    continuable: bool,
    /// Tokens generated so far over all choices, earlier attempts' included.
    generated: usize,
    /// The most tokens an earlier attempt is known to have generated.
    generated_before: usize,
    /// `generated` at the last checkpoint taken.
    checkpointed: usize,
    /// Counts the tokens this attempt generates again (see `telemetry::TOKENS_REGENERATED`).
    regenerated: metrics::Counter,
    /// How many entries its stream can need (`None`: unbounded by the request).
    stream_entries: Option<usize>,
    /// The runner slot this job occupies; dropping the job frees the slot.
    _slot: Option<tokio::sync::OwnedSemaphorePermit>,
    inter_token: metrics::Histogram,
}

#[derive(Default)]
struct ChoiceState {
    /// Every token generated so far (earlier attempts' included).
    token_ids: Vec<u32>,
    text: String,
    logprobs: Option<Vec<TokenLogprob>>,
    finish: Option<FinishReason>,
    matched_stop: Option<serde_json::Value>,
    /// The hidden state at the choice's last token, when the request asked for it.
    hidden_states: Option<Vec<f32>>,
    /// The experts of every position the choice ran, SGLang-encoded, when asked for.
    routed_experts: Option<String>,
    /// When this choice's previous token arrived.
    last_token_at: Option<std::time::Instant>,
}

impl InFlight {
    pub fn new(job: &ClaimedJob, slot: Option<tokio::sync::OwnedSemaphorePermit>) -> Self {
        let n = job.request.n.max(1) as usize;
        let wants_logprobs = job.request.sampling.logprobs;
        let earlier = job.request.progress.clone();
        let choices = match &earlier {
            Some(progress) => progress
                .choices
                .iter()
                .map(|c| ChoiceState {
                    token_ids: c.token_ids.clone(),
                    text: c.text.clone(),
                    logprobs: c.logprobs.clone(),
                    finish: c.finish,
                    matched_stop: c.matched_stop.clone(),
                    ..Default::default()
                })
                .collect(),
            None => (0..n)
                .map(|_| ChoiceState {
                    logprobs: wants_logprobs.then(Vec::new),
                    ..Default::default()
                })
                .collect(),
        };
        let generated = earlier.as_ref().map_or(0, Progress::generated);
        InFlight {
            job_id: job.id,
            attempt: job.attempt,
            kind: job.kind,
            model: job.request.model.clone(),
            choices,
            usage: earlier.as_ref().map(|p| p.usage).unwrap_or_default(),
            client_streams: job.request.stream,
            streamed: false,
            prompt_text: None,
            prompt_ids: None,
            earlier,
            continuable: job.request.task == Task::Generate
                && !job.request.sampling.return_hidden_states,
            stream_entries: fallow_scheduler::stream::entries_needed(
                job.request.n,
                job.request.sampling.max_tokens,
                job.attempt,
            ),
            generated,
            generated_before: job.generated_before as usize,
            checkpointed: generated,
            regenerated: super::telemetry::tokens_regenerated(&job.request.model),
            _slot: slot,
            inter_token: super::telemetry::inter_token_latency(&job.request.model),
        }
    }

    /// Folds one engine output into the job and returns the event to stream.
    pub fn absorb(&mut self, out: SeqOutput) -> JobEvent {
        self.usage = out.usage;
        // `choices` holds `n ≥ 1` entries by construction; the engine only emits indices < n.
        let slot = (out.index as usize).min(self.choices.len().saturating_sub(1));
        let choice = &mut self.choices[slot];
        if !out.token_ids.is_empty() {
            let now = std::time::Instant::now();
            if let Some(previous) = choice.last_token_at.replace(now) {
                self.inter_token
                    .record(now.duration_since(previous).as_secs_f64());
            }
        }
        let at = ChoicePosition::default().advanced(choice.token_ids.len(), choice.text.len());
        choice.token_ids.extend_from_slice(&out.token_ids);
        choice.text.push_str(&out.text);
        if let (Some(all), Some(new)) = (choice.logprobs.as_mut(), out.logprobs.as_ref()) {
            all.extend(new.iter().cloned());
        }
        if out.finish.is_some() {
            choice.finish = out.finish;
            choice.matched_stop = out.matched_stop.clone();
            choice.hidden_states = out.hidden_states;
            choice.routed_experts = out.routed_experts.as_deref().map(encode_routes);
        }
        if !out.text.is_empty() {
            self.streamed = true;
        }
        let again = self.generated_again(out.token_ids.len());
        if again > 0 {
            self.regenerated.increment(again as u64);
        }
        JobEvent::Delta {
            index: out.index,
            text: out.text,
            token_ids: out.token_ids,
            logprobs: out.logprobs,
            finish_reason: out.finish,
            usage: out.usage,
            at: Some(at),
        }
    }

    /// Counts `new` generated tokens and returns how many of them an earlier attempt had
    /// already generated (its progress lost, so they were generated again).
    fn generated_again(&mut self, new: usize) -> usize {
        let before = self.generated;
        self.generated += new;
        let lost_upto = self.generated_before;
        self.generated
            .min(lost_upto)
            .saturating_sub(before.max(self.earlier_tokens()))
    }

    /// Where this attempt has got to, for the heartbeat: the progress to continue from should
    /// the runner die and Redis lose the stream, when there is something new to record and
    /// a checkpoint could serve (not when a client reads the stream, which only the stream
    /// may continue). The prompt's ids stay out: the next runner tokenizes it again.
    pub fn checkpoint(&mut self) -> Checkpoint {
        let fresh = self.generated > self.checkpointed
            && !(self.client_streams && self.kind == JobKind::Interactive);
        let progress = if fresh { self.progress() } else { None };
        let progress = progress.map(|p| Progress {
            prompt_ids: Vec::new(),
            ..p
        });
        if progress.is_some() {
            self.checkpointed = self.generated;
        }
        Checkpoint {
            id: self.job_id,
            attempt: self.attempt,
            progress,
            generated: u32::try_from(self.generated).unwrap_or(u32::MAX),
        }
    }

    /// Whether this attempt continues earlier attempts' output.
    pub fn continues(&self) -> bool {
        self.earlier.is_some()
    }

    /// Tokens earlier attempts generated, which this one takes over.
    pub fn earlier_tokens(&self) -> usize {
        self.earlier.as_ref().map_or(0, Progress::generated)
    }

    /// Records the prompt's token ids once the engine admitted the job.
    pub fn admitted(&mut self, prompt_ids: Vec<u32>) {
        self.prompt_ids = Some(prompt_ids);
    }

    /// What another runner needs to continue this job: `None` when it cannot be continued
    /// (not a generation, or it asked for hidden states). Before the engine admitted it,
    /// that is the progress it started from, which may be none.
    pub fn progress(&self) -> Option<Progress> {
        if !self.continuable {
            return None;
        }
        let Some(prompt_ids) = &self.prompt_ids else {
            return self.earlier.clone();
        };
        Some(Progress {
            prompt_ids: prompt_ids.clone(),
            choices: self
                .choices
                .iter()
                .map(|c| ChoiceProgress {
                    token_ids: c.token_ids.clone(),
                    text: c.text.clone(),
                    logprobs: c.logprobs.clone(),
                    finish: c.finish,
                    matched_stop: c.matched_stop.clone(),
                })
                .collect(),
            usage: self.usage,
        })
    }

    pub fn is_finished(&self) -> bool {
        self.choices.iter().all(|c| c.finish.is_some())
    }

    pub fn completion(&self) -> Completion {
        let choices = self
            .choices
            .iter()
            .enumerate()
            .map(|(i, c)| ChoiceResult {
                index: i as u32,
                text: c.text.clone(),
                finish_reason: c.finish.unwrap_or(FinishReason::Abort),
                matched_stop: c.matched_stop.clone(),
                logprobs: c.logprobs.clone(),
                hidden_states: c.hidden_states.clone(),
                routed_experts: c.routed_experts.clone(),
            })
            .collect();
        Completion {
            choices,
            usage: self.usage,
            prompt_text: self.prompt_text.clone(),
            tokenized: None,
            embeddings: None,
        }
    }
}

/// All jobs a runner holds, by engine-local request id.
#[derive(Default)]
pub struct InFlightTable {
    next_id: u64,
    by_request: HashMap<u64, InFlight>,
    by_job: HashMap<Uuid, u64>,
}

impl InFlightTable {
    pub fn insert(&mut self, job: InFlight) -> u64 {
        self.next_id += 1;
        self.by_job.insert(job.job_id, self.next_id);
        self.by_request.insert(self.next_id, job);
        self.next_id
    }
    pub fn get_mut(&mut self, request: u64) -> Option<&mut InFlight> {
        self.by_request.get_mut(&request)
    }
    pub fn request_for(&self, job: Uuid) -> Option<u64> {
        self.by_job.get(&job).copied()
    }
    pub fn remove(&mut self, request: u64) -> Option<InFlight> {
        let job = self.by_request.remove(&request)?;
        self.by_job.remove(&job.job_id);
        Some(job)
    }
    /// `(id, attempt)` of every held job, for lease renewal.
    pub fn leases(&self) -> Vec<(Uuid, i32)> {
        self.by_request
            .values()
            .map(|j| (j.job_id, j.attempt))
            .collect()
    }
    /// Every held job's [`Checkpoint`], for the heartbeat.
    pub fn checkpoints(&mut self) -> Vec<Checkpoint> {
        self.by_request
            .values_mut()
            .map(InFlight::checkpoint)
            .collect()
    }
    /// The entries a held job's stream can need; `None` for an unbounded request or a job
    /// no longer held (its last entry).
    pub fn stream_entries(&self, job: Uuid) -> Option<usize> {
        let request = self.by_job.get(&job)?;
        self.by_request.get(request)?.stream_entries
    }
    pub fn requests(&self) -> Vec<u64> {
        self.by_request.keys().copied().collect()
    }
    pub fn contains(&self, request: u64) -> bool {
        self.by_request.contains_key(&request)
    }
    pub fn is_empty(&self) -> bool {
        self.by_request.is_empty()
    }
    pub fn len(&self) -> usize {
        self.by_request.len()
    }
    /// The models with jobs held: they may not be unloaded.
    pub fn busy_models(&self) -> std::collections::HashSet<String> {
        self.by_request.values().map(|j| j.model.clone()).collect()
    }
}

#[cfg(test)]
#[path = "in_flight_tests.rs"]
mod tests;

/// SGLang's `routed_experts` string: base64 of the ids as little-endian int32.
fn encode_routes(ids: &[u32]) -> String {
    use base64::Engine;
    let bytes: Vec<u8> = ids
        .iter()
        .flat_map(|&id| (id as i32).to_le_bytes())
        .collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}
