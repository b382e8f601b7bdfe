//! `fallow bench engine`: prefill tokens/s, decode tokens/s and aggregate tokens/s of the
//! engine alone at several concurrencies, and the process's peak RSS. With
//! `--json-schema FILE` each concurrency also runs under that schema (constrained
//! decoding), right after its unconstrained run, and the decode ratio is printed. With
//! `--loras 1,4,16` each concurrency also runs with that many different random LoRA
//! adapters (sequence i on adapter i mod N), and the aggregate ratio to the base is printed.

use crate::cli::BenchEngineArgs;
use crate::config::CudaFile;
use anyhow::Context;
use fallow_engine::llm::EngineRequest;
use fallow_engine::lora::LoraAdapter;
use fallow_engine::runtime::{self, LoadOptions, LoadedModel};
use fallow_protocol::job::{Constraint, Sampling};
use std::sync::Arc;
use std::time::Instant;

/// One measured round.
struct Round {
    prefill_tps: f64,
    decode_tps: f64,
    aggregate_tps: f64,
    ttft_ms: f64,
    /// Tokens generated (a grammar may end a sequence before `gen_tokens`).
    generated: usize,
    /// Process CPU time (all threads) per generated token: less sensitive than tokens/s to
    /// other load on the machine.
    cpu_ms_per_token: f64,
}

pub fn engine(args: BenchEngineArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.temperature.is_finite() && args.temperature >= 0.0,
        "--temperature must be 0 or more"
    );
    anyhow::ensure!(
        args.top_p > 0.0 && args.top_p <= 1.0,
        "--top-p must be in (0, 1]"
    );
    let max_conc = args.concurrency.iter().copied().max().unwrap_or(1);
    let options = LoadOptions {
        max_num_seqs: max_conc,
        max_batched_tokens: 2048,
        enable_prefix_cache: false,
        kv_cache_bytes: args.kv_cache_mib << 20,
        device: args.device,
        cuda: args.cuda.options(CudaFile::default())?,
        ..LoadOptions::default()
    };
    let constraint = match &args.json_schema {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            let schema = serde_json::from_str(&text)
                .with_context(|| format!("{} is not JSON", path.display()))?;
            let constraint = Constraint::JsonSchema {
                schema,
                strict: true,
            };
            fallow_protocol::grammar::check(&constraint)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            Some(constraint)
        }
        None => None,
    };
    let loading = Instant::now();
    let mut model = runtime::load(&args.model, &options)
        .with_context(|| format!("loading {}", args.model.display()))?;
    // Load time is part of what an operator waits for when a runner warms a model.
    println!("loaded in {:.2} s", loading.elapsed().as_secs_f64());
    println!(
        "{:>11} {:>11} {:>14} {:>14} {:>16} {:>10} {:>9} {:>12}",
        "concurrency",
        "constraint",
        "prefill tok/s",
        "decode tok/s",
        "aggregate tok/s",
        "TTFT ms",
        "generated",
        "CPU ms/tok"
    );
    let adapter_sets = match args.loras.iter().max() {
        Some(&most) => {
            let Some(config) = model.engine.preparer().adapter_base().cloned() else {
                anyhow::bail!("--loras: this backend serves no LoRA adapters");
            };
            let targets = super::bench_lora::targets(&args.lora_targets)?;
            let all = super::bench_lora::random_adapters(&config, most, args.lora_rank, &targets)?;
            args.loras.iter().map(|&n| all[..n].to_vec()).collect()
        }
        None => Vec::new(),
    };
    let mut next_id = 0u64;
    for &conc in &args.concurrency {
        let free = run_round(&mut model, &args, conc, None, &[], &mut next_id)?;
        print_round(conc, "none", &free);
        for adapters in adapter_sets.iter().filter(|set| !set.is_empty()) {
            let with = run_round(&mut model, &args, conc, None, adapters, &mut next_id)?;
            print_round(conc, &format!("lora x{}", adapters.len()), &with);
            println!(
                "{:>11} {} adapters/base: aggregate tok/s {:.3}, decode tok/s {:.3}",
                conc,
                adapters.len(),
                with.aggregate_tps / free.aggregate_tps.max(1e-9),
                with.decode_tps / free.decode_tps.max(1e-9)
            );
        }
        if let Some(constraint) = &constraint {
            let constrained =
                run_round(&mut model, &args, conc, Some(constraint), &[], &mut next_id)?;
            print_round(conc, "json", &constrained);
            println!(
                "{:>11} constrained/unconstrained: decode tok/s {:.3}, CPU per token {:.3}",
                conc,
                constrained.decode_tps / free.decode_tps.max(1e-9),
                constrained.cpu_ms_per_token / free.cpu_ms_per_token.max(1e-9)
            );
        }
    }
    println!("peak RSS: {:.1} MiB", peak_rss_mib());
    Ok(())
}

/// `conc` concurrent greedy sequences of `gen_tokens` each (EOS ignored), until all end;
/// sequence i runs `adapters[i mod N]` when adapters are given.
fn run_round(
    model: &mut LoadedModel,
    args: &BenchEngineArgs,
    conc: usize,
    constraint: Option<&Constraint>,
    adapters: &[Arc<LoraAdapter>],
    next_id: &mut u64,
) -> anyhow::Result<Round> {
    let vocab = model.frontend.tokenizer.vocab_size() as u32;
    let started = Instant::now();
    let cpu_started = process_cpu_seconds();
    for i in 0..conc {
        *next_id += 1;
        // Distinct prompts so nothing is served from the prefix cache.
        let prompt: Vec<u32> = (0..args.prompt_tokens)
            .map(|t| ((t * 7919 + i * 104_729 + 13) as u32) % vocab.max(1))
            .collect();
        let sampling = Sampling {
            max_tokens: Some(args.gen_tokens),
            temperature: args.temperature,
            top_p: args.top_p,
            seed: Some(i as u64),
            ignore_eos: true,
            constraint: constraint.cloned(),
            ..Sampling::default()
        };
        model
            .engine
            .add_request(EngineRequest {
                adapter: (!adapters.is_empty()).then(|| adapters[i % adapters.len()].clone()),
                id: *next_id,
                prompt,
                sampling,
                n: 1,
                priority: 0,
                resume: None,
            })
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    let mut first_token_at = None;
    let mut prefill_done_at = None;
    let mut generated = 0usize;
    while model.engine.has_work() {
        let outputs = model.engine.step().map_err(|e| anyhow::anyhow!("{e}"))?;
        let new: usize = outputs.iter().map(|o| o.token_ids.len()).sum();
        if new > 0 && first_token_at.is_none() {
            first_token_at = Some(started.elapsed());
        }
        generated += new;
        if prefill_done_at.is_none() && generated >= conc {
            prefill_done_at = Some(started.elapsed());
        }
    }
    let total = started.elapsed().as_secs_f64();
    let prefill = prefill_done_at.map(|d| d.as_secs_f64()).unwrap_or(total);
    let decode_time = (total - prefill).max(1e-9);
    let decode_tokens = generated.saturating_sub(conc);
    Ok(Round {
        prefill_tps: (conc * args.prompt_tokens) as f64 / prefill.max(1e-9),
        decode_tps: decode_tokens as f64 / decode_time,
        aggregate_tps: generated as f64 / total,
        ttft_ms: first_token_at.map(|d| d.as_secs_f64() * 1e3).unwrap_or(0.0),
        generated,
        cpu_ms_per_token: (process_cpu_seconds() - cpu_started) * 1e3 / generated.max(1) as f64,
    })
}

fn print_round(conc: usize, constraint: &str, round: &Round) {
    println!(
        "{:>11} {:>11} {:>14.1} {:>14.1} {:>16.1} {:>10.1} {:>9} {:>12.2}",
        conc,
        constraint,
        round.prefill_tps,
        round.decode_tps,
        round.aggregate_tps,
        round.ttft_ms,
        round.generated,
        round.cpu_ms_per_token
    );
}

/// User + system CPU seconds of this process so far (Linux; 0 elsewhere).
fn process_cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are the 12th and 13th.
    let rest = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let ticks: f64 = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|v| v.parse::<f64>().ok())
        .sum();
    ticks / 100.0
}

fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
        .unwrap_or(0.0)
}
