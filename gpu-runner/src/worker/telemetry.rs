//! The runner's own Prometheus metrics, named after vLLM's (`vllm:` → `fallow:`). They go
//! to the process-global `metrics` recorder: in `fallow dev` the api's `/metrics` renders
//! them next to its own; a standalone runner records them for whichever exporter its
//! embedding program installed (none by default).
//!
//! Engine gauges are per model (`model_name`): a sequence count and the KV cache usage,
//! published by the engine thread after every step. Inter-token latency and queue time are
//! per model histograms, recorded as jobs are claimed and their tokens arrive. Model loads
//! (seconds, resident bytes) and unloads (with the reason) are recorded by `models.rs`, LoRA
//! adapter loads and the adapters held by `adapters.rs`. Prefix-cache counters are in tokens, as
//! vLLM's are: `queries` counts prompt tokens, `hits` those served from cached blocks.

use fallow_engine::llm::EngineStats;
use fallow_protocol::job::Usage;
use metrics::{Counter, Gauge};

pub const KV_CACHE_USAGE: &str = "fallow:kv_cache_usage_perc";
pub const ENGINE_RUNNING: &str = "fallow:engine_num_requests_running";
pub const ENGINE_WAITING: &str = "fallow:engine_num_requests_waiting";
pub const PREEMPTIONS: &str = "fallow:num_preemptions_total";
pub const PREFIX_QUERIES: &str = "fallow:prefix_cache_queries_total";
pub const PREFIX_HITS: &str = "fallow:prefix_cache_hits_total";
/// Time between consecutive tokens of one choice, as the runner receives them from its engine.
pub const INTER_TOKEN_LATENCY: &str = "fallow:inter_token_latency_seconds";
/// Time from a request's creation to its first claim by a runner.
pub const QUEUE_TIME: &str = "fallow:request_queue_time_seconds";
/// A cold start's cost, per model (vLLM has no such metric; the name follows ours).
pub const MODEL_LOAD_SECONDS: &str = "fallow:model_load_seconds";
/// Models unloaded, per model and reason (`budget`, `keep_alive`, `operator`, `yield`).
pub const MODEL_EVICTIONS: &str = "fallow:model_evictions_total";
/// Memory a resident model takes (weights + KV pool); 0 once unloaded.
pub const MODEL_RESIDENT_BYTES: &str = "fallow:model_resident_bytes";
/// Jobs handed back with their progress, so another runner continues them, per model and
/// reason (`runner_yielded`, `runner_shutdown`, `runner_drained`).
pub const CONTINUATIONS: &str = "fallow:continuations_total";
/// From the owner probe's verdict to the jobs handed back, the models unloaded and
/// `yielded` reported: how long the owner waits for the machine.
pub const HANDOVER_SECONDS: &str = "fallow:handover_seconds";
/// Generated tokens a continuation took over instead of generating them again.
pub const CONTINUATION_TOKENS_REUSED: &str = "fallow:continuation_tokens_reused_total";
/// Tokens generated a second time because an earlier attempt's progress was lost: those an
/// earlier attempt is known (from its checkpoints) to have generated beyond the progress the
/// continuation started from. 0 for every graceful hand-back.
pub const TOKENS_REGENERATED: &str = "fallow:tokens_regenerated_total";
/// LoRA adapters read from disk, per adapter (`BASE:NAME`): a request's adapter that was
/// not in memory.
pub const LORA_LOADS: &str = "fallow:lora_loads_total";
/// LoRA adapters held in memory now.
pub const LORA_ACTIVE: &str = "fallow:lora_active";

/// One model's engine gauges, resolved once so a step publishes without allocating.
pub struct EngineGauges {
    kv_usage: Gauge,
    running: Gauge,
    waiting: Gauge,
    preemptions: Counter,
}

impl EngineGauges {
    pub fn new(model: &str) -> Self {
        let model = model.to_string();
        EngineGauges {
            kv_usage: metrics::gauge!(KV_CACHE_USAGE, "model_name" => model.clone()),
            running: metrics::gauge!(ENGINE_RUNNING, "model_name" => model.clone()),
            waiting: metrics::gauge!(ENGINE_WAITING, "model_name" => model.clone()),
            preemptions: metrics::counter!(PREEMPTIONS, "model_name" => model),
        }
    }

    pub fn publish(&self, stats: &EngineStats) {
        // vLLM reports a fraction (1 = full), not a percentage, despite the name.
        self.kv_usage
            .set(f64::from(stats.kv_usage_percent / 100.0).clamp(0.0, 1.0));
        self.running.set(stats.running as f64);
        self.waiting.set(stats.waiting as f64);
        self.preemptions.absolute(stats.preemptions);
    }
}

/// Creates `model`'s counters and histograms at 0 when the runner offers it, so `/metrics`
/// lists them before its first job.
pub fn register_model(model: &str) {
    let name = model.to_string();
    drop(inter_token_latency(model));
    drop(metrics::histogram!(QUEUE_TIME, "model_name" => name.clone()));
    drop(metrics::histogram!(MODEL_LOAD_SECONDS, "model_name" => name.clone()));
    drop(metrics::histogram!(HANDOVER_SECONDS));
    for counter in [
        PREEMPTIONS,
        PREFIX_QUERIES,
        PREFIX_HITS,
        CONTINUATION_TOKENS_REUSED,
        TOKENS_REGENERATED,
    ] {
        metrics::counter!(counter, "model_name" => name.clone()).increment(0);
    }
    for reason in ["runner_yielded", "runner_shutdown", "runner_drained"] {
        metrics::counter!(CONTINUATIONS, "model_name" => name.clone(), "reason" => reason)
            .increment(0);
    }
}

/// Records how long a yield took to hand the machine over.
pub fn record_handover(seconds: f64) {
    metrics::histogram!(HANDOVER_SECONDS).record(seconds);
}

/// Records a job handed back with its progress.
pub fn record_continuation(model: &str, reason: &str) {
    metrics::counter!(CONTINUATIONS, "model_name" => model.to_string(), "reason" => reason.to_string())
        .increment(1);
}

/// Records the generated tokens a continuing attempt took over.
pub fn record_tokens_reused(model: &str, tokens: usize) {
    metrics::counter!(CONTINUATION_TOKENS_REUSED, "model_name" => model.to_string())
        .increment(tokens as u64);
}

/// The counter of `model`'s tokens generated again.
pub fn tokens_regenerated(model: &str) -> Counter {
    metrics::counter!(TOKENS_REGENERATED, "model_name" => model.to_string())
}

/// The inter-token latency histogram of `model`'s jobs.
pub fn inter_token_latency(model: &str) -> metrics::Histogram {
    metrics::histogram!(INTER_TOKEN_LATENCY, "model_name" => model.to_string())
}

/// Records how long a job waited in the queue before its first claim.
pub fn record_queue_time(model: &str, seconds: f64) {
    metrics::histogram!(QUEUE_TIME, "model_name" => model.to_string()).record(seconds.max(0.0));
}

/// Records a finished model load.
pub fn record_model_load(model: &str, seconds: f64, resident_bytes: u64) {
    metrics::histogram!(MODEL_LOAD_SECONDS, "model_name" => model.to_string()).record(seconds);
    metrics::gauge!(MODEL_RESIDENT_BYTES, "model_name" => model.to_string())
        .set(resident_bytes as f64);
}

/// Records that a model was unloaded, and why.
pub fn record_model_unload(model: &str, reason: &'static str) {
    metrics::counter!(MODEL_EVICTIONS, "model_name" => model.to_string(), "reason" => reason)
        .increment(1);
    metrics::gauge!(MODEL_RESIDENT_BYTES, "model_name" => model.to_string()).set(0.0);
}

/// Counts an adapter read from disk.
pub fn record_lora_load(adapter: &str) {
    metrics::counter!(LORA_LOADS, "model_name" => adapter.to_string()).increment(1);
}

/// Publishes how many adapters are held in memory.
pub fn set_lora_active(count: usize) {
    metrics::gauge!(LORA_ACTIVE).set(count as f64);
}

/// Counts one finished job's prompt against the prefix cache.
pub fn record_prefix_cache(model: &str, usage: &Usage) {
    let model = model.to_string();
    metrics::counter!(PREFIX_QUERIES, "model_name" => model.clone())
        .increment(u64::from(usage.prompt_tokens));
    metrics::counter!(PREFIX_HITS, "model_name" => model).increment(u64::from(usage.cached_tokens));
}
