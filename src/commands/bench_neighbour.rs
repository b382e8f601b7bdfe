//! `fallow bench neighbour`: does one tenant's crafted input slow another tenant's stream?
//! One stream's inter-token latency alone, then while a neighbour sends 8 MB prompts,
//! 300-entry logit_bias and fresh json_schemas through the same model's engine host
//! (`fallow_runner::worker::noisy_neighbour`). Prints each round and the p99 ratio.

use crate::cli::BenchNeighbourArgs;
use anyhow::Context;
use fallow_engine::runtime::{self, LoadOptions};
use std::time::Duration;

pub async fn neighbour(args: BenchNeighbourArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.rounds > 0, "--rounds must be at least 1");
    let options = LoadOptions {
        max_num_seqs: 8,
        ..LoadOptions::default()
    };
    let path = args.model.clone();
    let model = tokio::task::spawn_blocking(move || runtime::load(&path, &options))
        .await?
        .with_context(|| format!("loading {}", args.model.display()))?;
    let rounds = fallow_runner::worker::noisy_neighbour(
        model.engine,
        model.frontend,
        args.tokens,
        args.rounds,
    )
    .await?;
    println!(
        "model {}  stream of {} tokens",
        args.model.display(),
        args.tokens
    );
    println!("round  alone p50/p99/max ms  noisy p50/p99/max ms  neighbour requests  p99 ratio");
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mut ratios = Vec::new();
    for (i, r) in rounds.iter().enumerate() {
        let ratio = ms(r.noisy.p99) / ms(r.alone.p99).max(1e-9);
        ratios.push(ratio);
        println!(
            "{:>5}  {:>6.1} / {:>6.1} / {:>7.1}  {:>6.1} / {:>6.1} / {:>7.1}  {:>18}  {:>9.2}",
            i + 1,
            ms(r.alone.p50),
            ms(r.alone.p99),
            ms(r.alone.max),
            ms(r.noisy.p50),
            ms(r.noisy.p99),
            ms(r.noisy.max),
            r.neighbour_requests,
            ratio
        );
    }
    ratios.sort_by(f64::total_cmp);
    println!(
        "median p99 ratio (noisy / alone): {:.2}",
        ratios[ratios.len() / 2]
    );
    Ok(())
}
