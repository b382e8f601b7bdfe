//! Shared state of every handler: the scheduler handles, the configuration, the model
//! catalog cache and the metrics handle. Cheap to clone (one `Arc`).

use crate::catalog::ModelCatalog;
use crate::config::ApiConfig;
use fallow_scheduler::queue::Queue;
use fallow_scheduler::stream::TokenRelay;
use metrics_exporter_prometheus::PrometheusHandle;
use std::sync::Arc;

#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

struct Inner {
    queue: Queue,
    relay: TokenRelay,
    config: ApiConfig,
    catalog: ModelCatalog,
    metrics: Option<PrometheusHandle>,
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
            }),
        }
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
}
