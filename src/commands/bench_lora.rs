//! Random LoRA adapters for a model: `fallow bench random-lora` writes one as a PEFT
//! directory, and `fallow bench engine --loras N` runs N of them over the model.

use crate::cli::BenchRandomLoraArgs;
use anyhow::Context;
use fallow_engine::lora::random::RandomAdapter;
use fallow_engine::lora::{peft, LoraAdapter, Target};
use fallow_engine::model::ModelConfig;
use std::sync::Arc;

pub fn random_lora(args: BenchRandomLoraArgs) -> anyhow::Result<()> {
    let artifacts = fallow_engine::model::open(&args.model)
        .with_context(|| format!("opening {}", args.model.display()))?;
    let adapter = RandomAdapter {
        rank: args.rank,
        targets: targets(&args.targets)?,
        seed: args.seed,
        strength: args.strength,
    };
    anyhow::ensure!(args.rank > 0, "--rank must be at least 1");
    adapter
        .write(&args.out, &artifacts.config)
        .with_context(|| format!("writing {}", args.out.display()))?;
    println!("{}", args.out.display());
    Ok(())
}

/// `count` different random adapters (seeds 1..=count) for `config`, each read back
/// through the PEFT loader as a served adapter would be.
pub fn random_adapters(
    config: &ModelConfig,
    count: usize,
    rank: usize,
    targets: &[Target],
) -> anyhow::Result<Vec<Arc<LoraAdapter>>> {
    let dir = std::env::temp_dir().join(format!("fallow-bench-loras-{}", std::process::id()));
    let adapters = (1..=count)
        .map(|seed| {
            let path = dir.join(seed.to_string());
            RandomAdapter {
                rank,
                targets: targets.to_vec(),
                seed: seed as u64,
                strength: 1.0,
            }
            .write(&path, config)?;
            Ok(Arc::new(peft::load(
                &path,
                &format!("random-{seed}"),
                config,
            )?))
        })
        .collect::<anyhow::Result<Vec<_>>>();
    let _ = std::fs::remove_dir_all(&dir);
    adapters
}

/// Target module names (`q` or `q_proj`) as the engine's targets.
pub fn targets(names: &[String]) -> anyhow::Result<Vec<Target>> {
    names
        .iter()
        .map(|name| {
            Target::parse(name.trim()).with_context(|| {
                format!("unknown target module {name:?} (q, k, v, o, gate, up, down)")
            })
        })
        .collect()
}
