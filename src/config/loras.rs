//! The runner's LoRA settings: `--lora NAME=PATH[;base=MODEL]` (repeatable, `loras` in
//! `fallow.toml`), `--lora-dir` and `--lora-memory-mb`. An adapter's base defaults to the
//! runner's one generative model; with several, the spec must name it.

use anyhow::Context;
use fallow_runner::worker::{LoraSettings, LoraSpec, ModelOffer, DEFAULT_LORA_MEMORY_BYTES};
use std::path::PathBuf;

/// An adapter as the operator wrote it, its base not yet checked against the models.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraArg {
    pub name: String,
    pub path: PathBuf,
    pub base: Option<String>,
}

impl LoraArg {
    /// `NAME=PATH`, then optionally `;base=MODEL`.
    pub fn parse(spec: &str) -> anyhow::Result<LoraArg> {
        let mut parts = spec.split(';');
        let target = parts.next().unwrap_or_default().trim();
        let Some((name, path)) = target
            .split_once('=')
            .filter(|(n, p)| !n.is_empty() && !p.is_empty())
        else {
            anyhow::bail!("--lora {spec:?}: give NAME=PATH (a PEFT adapter directory)");
        };
        let mut arg = LoraArg {
            name: name.trim().to_string(),
            path: PathBuf::from(path.trim()),
            base: None,
        };
        for option in parts.map(str::trim).filter(|o| !o.is_empty()) {
            match option.split_once('=') {
                Some(("base", model)) if !model.trim().is_empty() => {
                    arg.base = Some(model.trim().to_string())
                }
                _ => anyhow::bail!("--lora {spec:?}: unknown option {option:?} (base=MODEL)"),
            }
        }
        Ok(arg)
    }
}

/// The runner's LoRA settings, each adapter's base checked against the models it offers.
pub fn lora_settings(
    loras: &[LoraArg],
    dir: Option<PathBuf>,
    memory_mb: Option<u64>,
    offers: &[ModelOffer],
) -> anyhow::Result<LoraSettings> {
    let generative: Vec<&str> = offers
        .iter()
        .filter(|o| o.embedding.is_none())
        .map(|o| o.id.as_str())
        .collect();
    let mut adapters = Vec::with_capacity(loras.len());
    for lora in loras {
        let base = match (&lora.base, generative.as_slice()) {
            (Some(base), models) if models.contains(&base.as_str()) => base.clone(),
            (Some(base), models) => anyhow::bail!(
                "--lora {}: base={base} is not a generative model this runner serves ({})",
                lora.name,
                models.join(", ")
            ),
            (None, [only]) => only.to_string(),
            (None, models) => anyhow::bail!(
                "--lora {}: this runner serves {} generative models; name the adapter's with ;base=MODEL",
                lora.name,
                models.len()
            ),
        };
        if adapters
            .iter()
            .any(|a: &LoraSpec| a.base == base && a.name == lora.name)
        {
            anyhow::bail!("--lora {}: named twice over {base}", lora.name);
        }
        adapters.push(LoraSpec {
            name: lora.name.clone(),
            path: lora.path.clone(),
            base,
        });
    }
    let memory_bytes = match memory_mb {
        Some(0) => anyhow::bail!("--lora-memory-mb 0 leaves no room for any adapter"),
        Some(mb) => mb
            .checked_mul(1 << 20)
            .context("--lora-memory-mb is too large")?,
        None => DEFAULT_LORA_MEMORY_BYTES,
    };
    Ok(LoraSettings {
        adapters,
        dir,
        memory_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lora_spec_is_a_name_a_path_and_maybe_a_base() {
        let arg = LoraArg::parse("sql=/loras/sql;base=smollm2").unwrap();
        assert_eq!(
            arg,
            LoraArg {
                name: "sql".into(),
                path: PathBuf::from("/loras/sql"),
                base: Some("smollm2".into())
            }
        );
        assert_eq!(LoraArg::parse("sql=/loras/sql").unwrap().base, None);
        for bad in [
            "sql",
            "=/loras/sql",
            "sql=",
            "sql=/x;rank=8",
            "sql=/x;base=",
        ] {
            assert!(LoraArg::parse(bad).is_err(), "{bad:?}");
        }
    }
}
