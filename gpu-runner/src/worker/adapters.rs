//! The LoRA adapters this runner serves over its base models: those the operator named
//! (`--lora NAME=PATH;base=MODEL`, a PEFT directory or a llama.cpp `.gguf`), and those
//! requests name by path (`lora_path`) inside its `--lora-dir`. An adapter is read on first
//! use, on a preparation thread, so the engine's steps never wait for it, and kept within
//! `--lora-memory-mb`, least recently used out first, never one that a running sequence
//! holds (see `lora_budget.rs`).
//!
//! What it tells the rest of the runner: the adapter queues it claims for a base, and the
//! adapter entries `/v1/models` lists with their `parent`.

use super::lora_budget::LoraBudget;
use super::telemetry;
use fallow_engine::lora::{peft, LoraAdapter, LoraPrecision};
use fallow_engine::model::ModelConfig;
use fallow_protocol::adapter::{adapter_queue, is_adapter_name, lora_dir_queue, AdapterRef};
use fallow_scheduler::runners::ModelEntry;
use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

/// The adapter memory a runner keeps when the operator names none.
pub const DEFAULT_LORA_MEMORY_BYTES: u64 = 1 << 30;

/// An adapter the operator named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraSpec {
    pub name: String,
    pub path: PathBuf,
    /// The id of the base model it runs over.
    pub base: String,
}

/// How a runner serves adapters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraSettings {
    pub adapters: Vec<LoraSpec>,
    /// Where `lora_path` adapters are read from; `None`: `lora_path` is not served.
    pub dir: Option<PathBuf>,
    pub memory_bytes: u64,
}

impl Default for LoraSettings {
    fn default() -> Self {
        LoraSettings {
            adapters: Vec::new(),
            dir: None,
            memory_bytes: DEFAULT_LORA_MEMORY_BYTES,
        }
    }
}

/// Why an adapter cannot be served: every case is the request's, told back to its client.
#[derive(Debug, thiserror::Error)]
pub enum AdapterError {
    #[error("this runner has no LoRA adapter `{0}`")]
    Unknown(String),
    #[error("`lora_path` {0:?} is not served: this runner has no --lora-dir")]
    NoDir(String),
    #[error("`lora_path` {0:?} must be a relative path inside the runner's --lora-dir")]
    Outside(String),
    #[error("`lora_path` {0:?}: the runner's --lora-dir holds no adapter there")]
    Missing(String),
    #[error("the LoRA adapter `{name}` could not be loaded: {why}")]
    Load { name: String, why: String },
}

impl AdapterError {
    /// The job error code the api maps to a status: 404 for a name nobody serves, 400 else.
    pub fn code(&self) -> &'static str {
        match self {
            AdapterError::Unknown(_) => "model_not_found",
            _ => "invalid_request",
        }
    }
}

/// The runner's adapters, shared by the preparation threads of all its models.
#[derive(Debug)]
pub struct Adapters {
    settings: LoraSettings,
    cache: Mutex<Cache>,
}

#[derive(Debug)]
struct Cache {
    budget: LoraBudget,
    loaded: HashMap<String, Arc<LoraAdapter>>,
}

impl Adapters {
    /// Checks what the operator named: each adapter directory exists and reads as a PEFT
    /// adapter, each name is a plain word, and the lora dir exists (made absolute, so the
    /// sandbox check compares real paths).
    pub fn new(mut settings: LoraSettings) -> anyhow::Result<Adapters> {
        for spec in &settings.adapters {
            anyhow::ensure!(
                is_adapter_name(&spec.name),
                "--lora {}: an adapter name is letters, digits, `.`, `_` and `-`",
                spec.name
            );
            if spec.path.extension().is_some_and(|e| e == "gguf") {
                anyhow::ensure!(
                    spec.path.is_file(),
                    "--lora {}: no GGUF adapter at {}",
                    spec.name,
                    spec.path.display()
                );
                continue;
            }
            let config = spec.path.join("adapter_config.json");
            let text = std::fs::read_to_string(&config).map_err(|e| {
                anyhow::anyhow!("--lora {}: reading {}: {e}", spec.name, config.display())
            })?;
            let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
                anyhow::anyhow!(
                    "--lora {}: {} is not JSON: {e}",
                    spec.name,
                    config.display()
                )
            })?;
            peft::parse_config(&json).map_err(|e| anyhow::anyhow!("--lora {}: {e}", spec.name))?;
        }
        if let Some(dir) = &settings.dir {
            let real = dir
                .canonicalize()
                .map_err(|e| anyhow::anyhow!("--lora-dir {}: {e}", dir.display()))?;
            anyhow::ensure!(
                real.is_dir(),
                "--lora-dir {} is not a directory",
                dir.display()
            );
            settings.dir = Some(real);
        }
        telemetry::set_lora_active(0);
        Ok(Adapters::unchecked(settings))
    }

    /// No adapters: requests naming one are refused.
    pub fn none() -> Adapters {
        Adapters::unchecked(LoraSettings::default())
    }

    fn unchecked(settings: LoraSettings) -> Adapters {
        let budget = LoraBudget::new(settings.memory_bytes);
        Adapters {
            settings,
            cache: Mutex::new(Cache {
                budget,
                loaded: HashMap::new(),
            }),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.settings.adapters.is_empty() && self.settings.dir.is_none()
    }

    /// The queues of `base`'s adapters: a job there runs on `base`'s engine.
    pub fn queues(&self, base: &str) -> Vec<String> {
        let named = self
            .settings
            .adapters
            .iter()
            .filter(|a| a.base == base)
            .map(|a| adapter_queue(base, &a.name));
        named
            .chain(self.settings.dir.as_ref().map(|_| lora_dir_queue(base)))
            .collect()
    }

    /// `base`'s entry as `/v1/models` lists it (marked if `lora_path` is served over it),
    /// followed by an entry per named adapter over it.
    pub fn entries(&self, mut base: ModelEntry) -> Vec<ModelEntry> {
        base.lora_dir = self.settings.dir.is_some();
        let adapters: Vec<ModelEntry> = self
            .settings
            .adapters
            .iter()
            .filter(|a| a.base == base.id)
            .map(|a| ModelEntry {
                id: adapter_queue(&base.id, &a.name),
                parent: Some(base.id.clone()),
                lora_dir: false,
                ..base.clone()
            })
            .collect();
        std::iter::once(base).chain(adapters).collect()
    }

    /// The adapter `wanted` over `base`, read now if it is not in memory. Kept in memory
    /// within the budget; one that does not fit (every other adapter busy) is served
    /// uncached, rather than refused.
    pub fn get(
        &self,
        base: &str,
        wanted: &AdapterRef,
        config: &ModelConfig,
    ) -> Result<Arc<LoraAdapter>, AdapterError> {
        let key = cache_key(base, wanted);
        if let Some(adapter) = self.cached(&key) {
            return Ok(adapter);
        }
        let dir = self.locate(base, wanted)?;
        let name = adapter_queue(base, &wanted.name);
        let adapter = fallow_engine::lora::load(&dir, &name, config, LoraPrecision::default())
            .map(Arc::new)
            .map_err(|e| AdapterError::Load {
                name: wanted.name.clone(),
                why: e.to_string(),
            })?;
        telemetry::record_lora_load(&name);
        let mut cache = self.lock();
        if let Some(raced) = cache.loaded.get(&key) {
            return Ok(raced.clone()); // another thread read it meanwhile
        }
        let Cache { budget, loaded } = &mut *cache;
        let in_use = |k: &str| loaded.get(k).is_some_and(|a| Arc::strong_count(a) > 1);
        match budget.admit(&key, adapter.bytes() as u64, in_use) {
            Some(victims) => {
                for victim in victims {
                    loaded.remove(&victim);
                }
                loaded.insert(key, adapter.clone());
            }
            None => tracing::warn!(
                adapter = %name,
                bytes = adapter.bytes(),
                "the LoRA memory budget is taken by adapters in use: serving this one uncached"
            ),
        }
        telemetry::set_lora_active(loaded.len());
        Ok(adapter)
    }

    fn cached(&self, key: &str) -> Option<Arc<LoraAdapter>> {
        let mut cache = self.lock();
        let adapter = cache.loaded.get(key).cloned()?;
        cache.budget.touch(key);
        Some(adapter)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Where `wanted`'s files are: the operator's directory for a named adapter, or the
    /// path inside the lora dir, refused if it leads outside (`..`, an absolute path, or a
    /// symbolic link out).
    fn locate(&self, base: &str, wanted: &AdapterRef) -> Result<PathBuf, AdapterError> {
        let Some(path) = &wanted.lora_path else {
            return self
                .settings
                .adapters
                .iter()
                .find(|a| a.base == base && a.name == wanted.name)
                .map(|a| a.path.clone())
                .ok_or_else(|| AdapterError::Unknown(adapter_queue(base, &wanted.name)));
        };
        let Some(dir) = &self.settings.dir else {
            return Err(AdapterError::NoDir(path.clone()));
        };
        match inside(dir, path) {
            Inside::Found(found) => Ok(found),
            Inside::Missing => Err(AdapterError::Missing(path.clone())),
            Inside::Outside => Err(AdapterError::Outside(path.clone())),
        }
    }
}

/// What an adapter is cached under: its queue, and for one read by path, the path.
fn cache_key(base: &str, wanted: &AdapterRef) -> String {
    match &wanted.lora_path {
        Some(path) => format!("{}/{path}", lora_dir_queue(base)),
        None => adapter_queue(base, &wanted.name),
    }
}

/// Where a `lora_path` leads.
#[derive(Debug, PartialEq, Eq)]
enum Inside {
    /// Inside the lora dir once every link is followed.
    Found(PathBuf),
    Missing,
    /// Out of it: absolute, through `..`, or through a link.
    Outside,
}

/// Where `relative` leads from `dir` (a real, canonical path).
fn inside(dir: &Path, relative: &str) -> Inside {
    let plain = Path::new(relative)
        .components()
        .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
    if relative.is_empty() || !plain {
        return Inside::Outside;
    }
    match dir.join(relative).canonicalize() {
        Ok(real) if real.starts_with(dir) => Inside::Found(real),
        Ok(_) => Inside::Outside,
        Err(_) => Inside::Missing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lora_path_is_read_only_from_inside_the_lora_dir() {
        let root = std::env::temp_dir().join(format!("fallow-lora-dir-{}", std::process::id()));
        let dir = root.join("loras");
        std::fs::create_dir_all(dir.join("team/sql")).unwrap();
        std::fs::create_dir_all(root.join("secret")).unwrap();
        std::os::unix::fs::symlink(root.join("secret"), dir.join("escape")).unwrap();
        let dir = dir.canonicalize().unwrap();
        assert_eq!(
            inside(&dir, "team/sql"),
            Inside::Found(dir.join("team/sql"))
        );
        assert_eq!(
            inside(&dir, "./team/sql"),
            Inside::Found(dir.join("team/sql"))
        );
        for bad in ["", "../secret", "team/../../secret", "/etc", "escape"] {
            assert_eq!(inside(&dir, bad), Inside::Outside, "{bad:?}");
        }
        assert_eq!(inside(&dir, "missing"), Inside::Missing);
        std::fs::remove_dir_all(root).unwrap();
    }
}
