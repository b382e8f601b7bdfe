//! The models runners serve right now, cached for about a second: `/v1/models` and the
//! model check of every chat request would otherwise each cost a Postgres query.

use crate::error::ApiError;
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
        let models = Arc::new(runners::live_models(&self.pool).await?);
        *cache = Some((Instant::now(), models.clone()));
        Ok(models)
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
