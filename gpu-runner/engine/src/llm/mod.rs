//! The engine loop: `step()` = schedule → run → postprocess, nano-vllm style.
//!
//! - **schedule**: the [`Batcher`] picks decodes, prefill chunks and admissions under one
//!   token budget and allocates their KV blocks.
//! - **run**: one [`Backend::forward`] over every scheduled slice.
//! - **postprocess**: per sequence that got logits: sample ([`Sampler`], under the
//!   sequence's grammar mask if it has one — [`crate::grammar`]; several sampled
//!   sequences draw in parallel on the worker team, see `sampling`), detokenize
//!   incrementally, check stop tokens / stop strings / length ([`crate::stop`]),
//!   emit a [`SeqOutput`], and free a finished sequence's blocks at once.
//!
//! Grammar masks need no logits, so the masks of a step's constrained sequences are
//! computed in parallel on another thread while the backend runs the forward pass.
//!
//! A request with `n > 1` runs one sequence per choice. With the prefix cache on, choices
//! 1.. are held back until choice 0 has produced a token, by which time its prompt's full
//! blocks are in the cache and the others reuse them instead of recomputing the prompt.
//!
//! A request may continue an earlier attempt's progress ([`Resume`]): its finished choices
//! are not run again and the others go on from their tokens (see `resume`).

mod choice;
mod error;
mod masks;
mod output;
mod postprocess;
use postprocess::Row;
mod prepare;
mod request;
mod resume;
mod sampling;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::backend::{Backend, LogitsMode, SeqSlice, StepOutput};
use crate::batcher::{Batcher, BatcherConfig, ScheduledStep, SeqId};
use crate::grammar::{GrammarSlot, SeqGrammar};
use crate::kv::hash::{namespace_root, private_namespace};
use crate::kv::BlockManager;
use crate::sampler::{Sampler, SeqSampler};
use crate::stop::{StopConditions, StopMatcher};
use crate::stop_regex::RegexStop;
use crate::tokenizer::{IncrementalDecoder, Tokenizer};

use choice::Choice;
pub use error::EngineError;
use masks::StepGrammar;
pub use output::{EngineStats, SeqOutput};
pub use prepare::{Prepared, Preparer};
pub use request::{EngineRequest, Resume, ResumeChoice, MAX_CHOICES};
use request::{Limits, RequestState};

/// Engine knobs that do not come from the backend (block size and count do).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineConfig {
    pub max_num_seqs: usize,
    pub max_batched_tokens: usize,
    pub enable_prefix_cache: bool,
}

/// A model behind a backend, serving many requests with continuous batching.
pub struct LlmEngine {
    backend: Box<dyn Backend>,
    tokenizer: Arc<Tokenizer>,
    config: EngineConfig,
    batcher: Batcher,
    sampler: Sampler,
    requests: HashMap<u64, RequestState>,
    choices: HashMap<SeqId, Choice>,
    /// The grammar compiler, built in the background from the first request on; shared
    /// with the [`Preparer`]s, which compile off the engine thread.
    grammars: Arc<Mutex<GrammarSlot>>,
    eos_ids: Vec<u32>,
    next_seq: SeqId,
    next_arrival: u64,
}

impl LlmEngine {
    pub fn new(backend: Box<dyn Backend>, tokenizer: Arc<Tokenizer>, config: EngineConfig) -> Self {
        let blocks = BlockManager::new(
            backend.num_blocks(),
            backend.block_size(),
            config.enable_prefix_cache,
        );
        let batcher = Batcher::new(
            BatcherConfig {
                max_num_seqs: config.max_num_seqs.max(1),
                max_batched_tokens: config.max_batched_tokens.max(1),
            },
            blocks,
        );
        let eos_ids = tokenizer.eos_ids();
        LlmEngine {
            backend,
            tokenizer,
            config,
            batcher,
            sampler: Sampler::new(),
            requests: HashMap::new(),
            choices: HashMap::new(),
            grammars: Arc::default(),
            eos_ids,
            next_seq: 0,
            next_arrival: 0,
        }
    }

    pub fn config(&self) -> EngineConfig {
        self.config
    }

    /// Adds end-of-generation ids the tokenizer does not know about (e.g. from an HF
    /// `generation_config.json`), except one the tokenizer knows ends only a message.
    pub fn add_eos_ids(&mut self, ids: &[u32]) {
        for &id in ids {
            if !self.eos_ids.contains(&id) && !self.tokenizer.ends_only_a_message(id) {
                self.eos_ids.push(id);
            }
        }
    }

    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    /// The model's context length, in tokens.
    pub fn context_length(&self) -> usize {
        self.backend.config().context_length
    }

    fn limits(&self) -> Limits {
        let blocks = self.batcher.block_manager();
        Limits {
            vocab_size: self.backend.config().vocab_size,
            context_length: self.backend.config().context_length,
            pool_tokens: blocks.num_blocks() * blocks.block_size(),
        }
    }

    /// Checks and queues a request; its outputs come from later [`LlmEngine::step`]s.
    pub fn add_request(&mut self, request: EngineRequest) -> Result<(), EngineError> {
        let prepared = self.preparer().prepare(request)?;
        self.add_prepared(prepared)
    }

    /// A handle that prepares requests for this engine on any thread (see [`Preparer`]).
    /// Take it once the engine's end-of-generation ids are final.
    pub fn preparer(&self) -> Preparer {
        Preparer::new(
            self.tokenizer.clone(),
            self.eos_ids.clone().into(),
            self.grammars.clone(),
            self.limits(),
            self.backend
                .serves_adapters()
                .then(|| Arc::new(self.backend.config().clone())),
        )
    }

    /// Queues a request a [`Preparer`] of this engine prepared.
    pub fn add_prepared(&mut self, prepared: Prepared) -> Result<(), EngineError> {
        let Prepared {
            request,
            max_tokens,
            stop_regexes,
            stop_strings,
            grammar,
        } = prepared;
        if self.requests.contains_key(&request.id) {
            return Err(EngineError::DuplicateRequest(request.id));
        }
        if let Some(adapter) = &request.adapter {
            if !self.backend.serves_adapters() {
                return Err(EngineError::InvalidRequest(
                    "this model's backend serves no LoRA adapters".into(),
                ));
            }
            if !adapter.fits(self.backend.config()) {
                return Err(EngineError::InvalidRequest(format!(
                    "the LoRA adapter `{}` was built for a model of another shape",
                    adapter.name
                )));
            }
        }
        if request.sampling.return_hidden_states && self.backend.hidden_rows().is_none() {
            return Err(EngineError::InvalidRequest(
                "`return_hidden_states` is served by the CPU backend only; this model runs on \
                 CUDA"
                    .into(),
            ));
        }
        if request.sampling.return_routed_experts && self.backend.routed_experts().is_none() {
            return Err(EngineError::InvalidRequest(
                "`return_routed_experts` needs a mixture-of-experts model; this one is dense"
                    .into(),
            ));
        }
        // Any request starts the vocabulary build, so that a later constrained one finds
        // it done (without waiting here if a preparer is compiling meanwhile).
        if let Ok(mut slot) = self.grammars.try_lock() {
            slot.start(&self.tokenizer, &self.eos_ids);
        }
        let arrival = self.next_arrival;
        self.next_arrival += 1;
        let mut state = RequestState {
            usage: fallow_protocol::job::Usage {
                prompt_tokens: request.prompt.len() as u32,
                ..Default::default()
            },
            prompt: request.prompt,
            sampling: Arc::new(request.sampling),
            priority: request.priority,
            arrival,
            max_tokens,
            live: Vec::new(),
            pending: Vec::new(),
            first_token_seen: false,
            grammar,
            stop_regexes,
            stop_strings,
            adapter: request.adapter,
        };
        self.start_choices(request.id, request.n, request.resume.as_ref(), &mut state)?;
        self.requests.insert(request.id, state);
        Ok(())
    }

    /// Starts a new request's choices: all of them, or only choice 0 while the others wait
    /// for its prompt to be in the prefix cache. A choice an earlier attempt finished is
    /// not started. On failure, the choices already started are dropped.
    fn start_choices(
        &mut self,
        request_id: u64,
        n: u32,
        resume: Option<&Resume>,
        state: &mut RequestState,
    ) -> Result<(), EngineError> {
        // Resumed choices have different sequences and no choice 0 to wait for: they all
        // start now, sharing what the prefix cache has.
        let hold_back = self.config.enable_prefix_cache && n > 1 && !resume::has_progress(resume);
        let first_wave = if hold_back { 1 } else { n };
        state.pending = (first_wave..n).rev().collect();
        for index in 0..first_wave {
            let (tokens, finished) = resume::progress(resume, index);
            // As if uninterrupted: the usage counts what the earlier attempt generated.
            state.usage.completion_tokens += tokens.len() as u32;
            if finished {
                continue;
            }
            if let Err(e) = self.start_choice(request_id, index, state, tokens) {
                for seq in state.live.drain(..) {
                    self.batcher.abort(seq);
                    self.choices.remove(&seq);
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// Puts one choice of a request into the batcher, continuing from the tokens an
    /// earlier attempt `generated` for it (none for a fresh choice).
    fn start_choice(
        &mut self,
        request_id: u64,
        index: u32,
        state: &mut RequestState,
        generated: &[u32],
    ) -> Result<(), EngineError> {
        let params = &state.sampling;
        let mut choice = Choice {
            request_id,
            index,
            sampler: SeqSampler::new(params.clone(), index, &state.prompt, &self.eos_ids),
            decoder: IncrementalDecoder::new(params.skip_special_tokens),
            matcher: StopMatcher::shared(state.stop_strings.clone()),
            regex_stop: RegexStop::new(state.stop_regexes.clone()),
            conditions: StopConditions::new(params, &self.eos_ids, state.max_tokens),
            grammar: state.grammar.clone(),
            want_logprobs: params.logprobs,
            keep_stop: params.no_stop_trim,
            want_hidden: params.return_hidden_states,
            hidden: Vec::new(),
            want_routes: params.return_routed_experts,
            routes: Vec::new(),
            adapter: state.adapter.clone(),
        };
        let want_routes = choice.want_routes;
        choice.replay(&self.tokenizer, generated)?;
        let seq = self.next_seq;
        self.next_seq += 1;
        // Generated tokens count against max_tokens: a resumed choice has the same bound.
        let max_len = state.prompt.len() + state.max_tokens - 1;
        let mut tokens = Vec::with_capacity(state.prompt.len() + generated.len());
        tokens.extend_from_slice(&state.prompt);
        tokens.extend_from_slice(generated);
        let namespace = if want_routes {
            // Every position must run for its routes to be known: no shared prefix.
            Some(private_namespace(seq))
        } else {
            state.adapter.as_ref().map(|a| namespace_root(a.id()))
        };
        self.batcher
            .add_in(
                seq,
                tokens,
                max_len,
                state.priority,
                state.arrival,
                namespace,
            )
            .map_err(|e| EngineError::ContextLengthExceeded(e.to_string()))?;
        self.choices.insert(seq, choice);
        state.live.push(seq);
        Ok(())
    }

    /// A fresh grammar state for `constraint` (waiting for the grammar vocabulary if it is
    /// still being built).
    /// Drops a request and frees its blocks now. Unknown ids are ignored (it may have
    /// finished already).
    pub fn abort(&mut self, id: u64) {
        if let Some(state) = self.requests.remove(&id) {
            for seq in state.live {
                self.batcher.abort(seq);
                self.choices.remove(&seq);
            }
        }
    }

    pub fn has_work(&self) -> bool {
        self.batcher.has_work()
    }

    pub fn stats(&self) -> EngineStats {
        let blocks = self.batcher.block_manager();
        let pending: usize = self.requests.values().map(|r| r.pending.len()).sum();
        EngineStats {
            running: self.batcher.num_running(),
            waiting: self.batcher.num_waiting() + pending,
            free_blocks: blocks.num_free_blocks(),
            total_blocks: blocks.num_blocks(),
            kv_usage_percent: blocks.usage() * 100.0,
            requests: self.requests.len(),
            preemptions: self.batcher.total_preemptions(),
        }
    }

    /// One engine iteration. Returns the new output of every choice that sampled a token.
    pub fn step(&mut self) -> Result<Vec<SeqOutput>, EngineError> {
        let step = self.batcher.schedule();
        if step.is_empty() {
            return Ok(Vec::new());
        }
        let (modes, result) = self.run(&step)?;
        self.batcher.complete_step(&step);
        self.keep_hidden_states(&step, &modes)?;
        self.keep_routes(&step)?;
        let vocab = self.backend.config().vocab_size;
        let mut logits_rows = result.logits.chunks_exact(vocab);
        let mut picked = result.picked.iter();
        let mut rows = Vec::with_capacity(step.seqs.len());
        for (entry, mode) in step.seqs.iter().zip(modes) {
            let row = match mode {
                LogitsMode::Last => logits_rows.next().map(Row::Logits),
                LogitsMode::Argmax | LogitsMode::Draw(_) | LogitsMode::DrawMasked(_) => {
                    picked.next().map(Row::Picked)
                }
                LogitsMode::None | LogitsMode::All => continue,
            };
            let row = row.ok_or_else(|| {
                EngineError::Internal(format!("no output row for sequence {}", entry.seq_id))
            })?;
            rows.push((entry.seq_id, row));
        }
        let drawn = self.sample_rows(&rows);
        let mut outputs = Vec::new();
        for ((seq, row), drawn) in rows.iter().zip(drawn) {
            if let Some(out) = self.postprocess(*seq, row, drawn)? {
                outputs.push(out);
            }
        }
        self.release_held_back_choices()?;
        Ok(outputs)
    }

    /// Copies the hidden state of each sequence's last output row into its choice, for the
    /// choices that asked for it (`return_hidden_states`).
    fn keep_hidden_states(
        &mut self,
        step: &ScheduledStep,
        modes: &[LogitsMode],
    ) -> Result<(), EngineError> {
        if !self.choices.values().any(|c| c.want_hidden) {
            return Ok(());
        }
        let hidden = self.backend.config().hidden;
        let rows = self.backend.hidden_rows().unwrap_or_default();
        let mut next_row = 0;
        for (entry, mode) in step.seqs.iter().zip(modes) {
            next_row += match mode {
                LogitsMode::None => continue,
                LogitsMode::All => entry.end - entry.start,
                _ => 1,
            };
            let Some(choice) = self.choices.get_mut(&entry.seq_id) else {
                continue;
            };
            if !choice.want_hidden {
                continue;
            }
            let row = rows
                .get((next_row - 1) * hidden..next_row * hidden)
                .ok_or_else(|| {
                    EngineError::Internal("the backend kept too few hidden rows".into())
                })?;
            choice.hidden.clear();
            choice.hidden.extend_from_slice(row);
        }
        Ok(())
    }

    /// Copies the step's expert choices of each position into the choices that asked for
    /// them (`return_routed_experts`).
    fn keep_routes(&mut self, step: &ScheduledStep) -> Result<(), EngineError> {
        if !self.choices.values().any(|c| c.want_routes) {
            return Ok(());
        }
        let Some(moe) = &self.backend.config().moe else {
            return Ok(());
        };
        let width = moe.routed_layers() * moe.top_k;
        let routes = self.backend.routed_experts().unwrap_or_default();
        let mut row = 0;
        for entry in &step.seqs {
            let rows = row..row + entry.num_tokens();
            row = rows.end;
            let Some(choice) = self.choices.get_mut(&entry.seq_id) else {
                continue;
            };
            if !choice.want_routes {
                continue;
            }
            let got = routes
                .get(rows.start * width..rows.end * width)
                .ok_or_else(|| EngineError::Internal("the backend kept too few routes".into()))?;
            if choice.routes.len() < entry.end * width {
                choice.routes.resize(entry.end * width, 0);
            }
            choice.routes[entry.start * width..entry.end * width].copy_from_slice(got);
        }
        Ok(())
    }

    /// Runs the backend over the scheduled slices and checks the output's shape. Sequences
    /// whose sampling is a plain argmax ask the backend for their token only, and, when the
    /// backend draws itself, so do sampled ones whose draw needs only the raw logits and
    /// constrained ones whose draw needs only those and their grammar's mask.
    fn run(&mut self, step: &ScheduledStep) -> Result<(Vec<LogitsMode>, StepOutput), EngineError> {
        let draws = self.backend.draws_on_device();
        let modes: Vec<LogitsMode> = step
            .seqs
            .iter()
            .map(|entry| match self.choices.get_mut(&entry.seq_id) {
                _ if !entry.wants_logits => LogitsMode::None,
                Some(c) if c.sampler.only_needs_argmax() => LogitsMode::Argmax,
                Some(c) if draws && c.grammar.is_some() => c
                    .sampler
                    .remote_draw_under_mask()
                    .map_or(LogitsMode::Last, LogitsMode::DrawMasked),
                Some(c) if draws => c
                    .sampler
                    .remote_draw()
                    .map_or(LogitsMode::Last, LogitsMode::Draw),
                _ => LogitsMode::Last,
            })
            .collect();
        // Held here, not borrowed from the choices, which the grammars borrow mutably below.
        let adapters: Vec<_> = step
            .seqs
            .iter()
            .map(|entry| {
                let choice = self.choices.get(&entry.seq_id);
                choice.and_then(|c| c.adapter.clone())
            })
            .collect();
        let mut slices = Vec::with_capacity(step.seqs.len());
        for ((entry, &mode), adapter) in step.seqs.iter().zip(&modes).zip(&adapters) {
            let missing =
                || EngineError::Internal(format!("scheduled unknown sequence {}", entry.seq_id));
            let tokens = self.batcher.tokens(entry.seq_id).ok_or_else(missing)?;
            let block_table = self.batcher.block_table(entry.seq_id).ok_or_else(missing)?;
            slices.push(SeqSlice {
                tokens: &tokens[entry.start..entry.end],
                start_pos: entry.start,
                block_table,
                logits: mode,
                adapter: adapter.as_deref(),
            });
        }
        // The grammars whose masks the step needs, in batch order (the backend takes the
        // `DrawMasked` ones in that order).
        let mut grammars: Vec<StepGrammar<'_>> = Vec::new();
        let masked = modes.iter().any(|m| matches!(m, LogitsMode::DrawMasked(_)));
        if masked || self.requests.values().any(|r| r.grammar.is_some()) {
            let mut by_seq: HashMap<SeqId, &mut SeqGrammar> = self
                .choices
                .iter_mut()
                .filter_map(|(seq, choice)| choice.grammar.as_mut().map(|g| (*seq, g)))
                .collect();
            for (entry, mode) in step.seqs.iter().zip(&modes) {
                let on_device = match mode {
                    LogitsMode::Last => false,
                    LogitsMode::DrawMasked(_) => true,
                    _ => continue,
                };
                if let Some(grammar) = by_seq.remove(&entry.seq_id) {
                    grammars.push(StepGrammar { grammar, on_device });
                }
            }
        }
        let backend = &mut self.backend;
        let out = masks::overlapped(grammars, |masks| backend.forward_step(&slices, masks))?;
        let rows = modes.iter().filter(|&&m| m == LogitsMode::Last).count();
        let picked = modes.iter().filter(|m| m.picks_token()).count();
        let expected = rows * self.backend.config().vocab_size;
        if out.logits.len() != expected || out.picked.len() != picked {
            return Err(EngineError::Internal(format!(
                "backend returned {} logits and {} tokens, expected {rows} rows = {expected} \
                 and {picked} tokens",
                out.logits.len(),
                out.picked.len()
            )));
        }
        Ok((modes, out))
    }

    /// Adds the held-back choices of requests whose choice 0 has produced a token.
    fn release_held_back_choices(&mut self) -> Result<(), EngineError> {
        let ready: Vec<u64> = self
            .requests
            .iter()
            .filter(|(_, r)| r.first_token_seen && !r.pending.is_empty())
            .map(|(&id, _)| id)
            .collect();
        for id in ready {
            let Some(mut state) = self.requests.remove(&id) else {
                continue;
            };
            let mut result = Ok(());
            while let Some(index) = state.pending.pop() {
                result = self.start_choice(id, index, &mut state, &[]);
                if result.is_err() {
                    break;
                }
            }
            self.requests.insert(id, state);
            result?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
