//! Shared state of every handler: the scheduler handles, the configuration, the model
//! catalog cache and the metrics handle. Cheap to clone (one `Arc`).

use crate::catalog::ModelCatalog;
use crate::config::ApiConfig;
use fallow_scheduler::queue::Queue;
use fallow_scheduler::store::ObjectStore;
use fallow_scheduler::stream::TokenRelay;
use metrics_exporter_prometheus::PrometheusHandle;
use std::sync::Arc;

#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
    /// Where file contents live; `None` turns the Files and Batches endpoints off.
    store: Option<ObjectStore>,
}

struct Inner {
    queue: Queue,
    relay: TokenRelay,
    config: ApiConfig,
    catalog: ModelCatalog,
    metrics: Option<PrometheusHandle>,
    runner_api: crate::runner_api::RunnerApiState,
}

impl AppState {
    pub fn new(queue: Queue, relay: TokenRelay, config: ApiConfig) -> Self {
        let catalog = ModelCatalog::new(queue.pool().clone());
        AppState {
            inner: Arc::new(Inner {
                queue,
                relay,
                config,
                catalog,
                metrics: crate::metrics::prometheus_handle(),
                runner_api: Default::default(),
            }),
            store: None,
        }
    }
    /// Turns on the Files and Batches endpoints, storing file contents in `store`.
    pub fn with_store(mut self, store: ObjectStore) -> Self {
        self.store = Some(store);
        self
    }
    pub fn store(&self) -> Option<&ObjectStore> {
        self.store.as_ref()
    }
    pub fn queue(&self) -> &Queue {
        &self.inner.queue
    }
    pub fn relay(&self) -> &TokenRelay {
        &self.inner.relay
    }
    pub fn config(&self) -> &ApiConfig {
        &self.inner.config
    }
    pub fn catalog(&self) -> &ModelCatalog {
        &self.inner.catalog
    }
    pub fn metrics(&self) -> Option<&PrometheusHandle> {
        self.inner.metrics.as_ref()
    }
    pub fn runner_api(&self) -> &crate::runner_api::RunnerApiState {
        &self.inner.runner_api
    }
}
