//! The models runners serve right now, cached for about a second: `/v1/models` and the
//! model check of every chat request would otherwise each cost a Postgres query. The LoRA
//! adapters operators loaded join them as `BASE:NAME` over each base that a runner with a
//! `--lora-dir` serves.

use crate::error::ApiError;
use fallow_protocol::adapter::adapter_queue;
use fallow_scheduler::loras::{self, LoadedLora};
use fallow_scheduler::runners::{self, ModelEntry};
use sqlx::PgPool;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

const CACHE_TTL: Duration = Duration::from_secs(1);

pub struct ModelCatalog {
    pool: PgPool,
    /// A tokio mutex held across the refresh query, so a burst of requests after expiry
    /// costs one query, not one each.
    cache: Mutex<Option<(Instant, Arc<Vec<ModelEntry>>)>>,
}

impl ModelCatalog {
    pub fn new(pool: PgPool) -> Self {
        ModelCatalog {
            pool,
            cache: Mutex::new(None),
        }
    }

    /// Live models, deduplicated by id.
    pub async fn list(&self) -> Result<Arc<Vec<ModelEntry>>, ApiError> {
        let mut cache = self.cache.lock().await;
        if let Some((at, models)) = cache.as_ref() {
            if at.elapsed() < CACHE_TTL {
                return Ok(models.clone());
            }
        }
        let mut models = runners::live_models(&self.pool).await?;
        let loaded = loras::list(&self.pool).await?;
        models.extend(loaded_adapters(&models, loaded));
        let models = Arc::new(models);
        *cache = Some((Instant::now(), models.clone()));
        Ok(models)
    }

    /// Drops the cached list, so the next request reads the models again (an operator just
    /// changed them; other api processes see it within the cache's second).
    pub async fn forget(&self) {
        *self.cache.lock().await = None;
    }

    /// The live model with this id, or 404 `model_not_found`.
    pub async fn find(&self, id: &str) -> Result<ModelEntry, ApiError> {
        self.list()
            .await?
            .iter()
            .find(|m| m.id == id)
            .cloned()
            .ok_or_else(|| ApiError::ModelNotFound(id.to_owned()))
    }
}

/// The loaded adapters servable now, as entries: over a base some runner with a lora dir
/// serves, and not shadowing a runner's own adapter of the same id.
fn loaded_adapters(models: &[ModelEntry], loaded: Vec<LoadedLora>) -> Vec<ModelEntry> {
    loaded
        .into_iter()
        .filter_map(|lora| {
            let id = adapter_queue(&lora.base, &lora.name);
            let base = models
                .iter()
                .find(|m| m.id == lora.base && m.lora_dir && m.parent.is_none())?;
            if models.iter().any(|m| m.id == id) {
                return None;
            }
            Some(ModelEntry {
                id,
                created: lora.created_at.timestamp(),
                parent: Some(base.id.clone()),
                lora_dir: false,
                lora_path: Some(lora.path),
                ..base.clone()
            })
        })
        .collect()
}
