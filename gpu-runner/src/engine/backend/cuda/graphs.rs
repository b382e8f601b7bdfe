//! CUDA graphs for decode steps. A decode step of a few sequences is a few hundred small
//! launches whose CPU-side cost rivals the GPU work; replaying a captured graph costs one.
//! A graph bakes in every launch's arguments, so it is keyed by what shapes them (tokens,
//! whether rows return logits or greedy tokens, block-table width) and only steps whose
//! indices all live in the fixed-layout step buffer qualify: one token per sequence, the
//! same output kind for all, few enough tokens for the GEMV path. Other steps run eagerly.

use std::collections::HashMap;

use cudarc::driver::CudaGraph;

use super::CudaError;
use crate::engine::backend::{LogitsMode, SeqSlice};

/// What a captured decode step depends on besides the data in its buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GraphKey {
    pub tokens: usize,
    pub greedy: bool,
    /// Block-table row width, rounded up to a power of two so that growing sequences
    /// re-capture only at doublings.
    pub table_width: usize,
}

/// A captured graph, owned by one backend.
struct OwnedGraph(CudaGraph);

// SAFETY: a graph and its executable are plain driver handles. The backend that owns them
// uses them from one thread at a time (it is `Send`, not `Sync`), and `CudaGraph::launch`
// binds the context to the calling thread first.
unsafe impl Send for OwnedGraph {}

pub struct DecodeGraphs {
    enabled: bool,
    graphs: HashMap<GraphKey, OwnedGraph>,
}

impl DecodeGraphs {
    pub fn new(enabled: bool) -> Self {
        DecodeGraphs {
            enabled,
            graphs: HashMap::new(),
        }
    }

    pub fn set_enabled(&mut self, enabled: bool) {
        self.enabled = enabled;
        self.graphs.clear();
    }

    /// The key of `batch` if it is a decode step a graph can replay.
    pub fn key_for(
        &self,
        batch: &[SeqSlice<'_>],
        block_size: usize,
        gemv_max_rows: usize,
    ) -> Option<GraphKey> {
        let first = batch.first()?;
        let uniform = |s: &SeqSlice<'_>| s.tokens.len() == 1 && s.logits == first.logits;
        if !self.enabled
            || batch.len() > gemv_max_rows
            || !matches!(first.logits, LogitsMode::Last | LogitsMode::Argmax)
            || !batch.iter().all(uniform)
        {
            return None;
        }
        let longest = batch
            .iter()
            .map(|s| (s.start_pos + 1).div_ceil(block_size))
            .max()?;
        Some(GraphKey {
            tokens: batch.len(),
            greedy: first.logits == LogitsMode::Argmax,
            table_width: longest.next_power_of_two().max(16),
        })
    }

    pub fn contains(&self, key: &GraphKey) -> bool {
        self.graphs.contains_key(key)
    }

    pub fn insert(&mut self, key: GraphKey, graph: CudaGraph) {
        self.graphs.insert(key, OwnedGraph(graph));
    }

    pub fn launch(&self, key: &GraphKey) -> Result<(), CudaError> {
        match self.graphs.get(key) {
            Some(g) => {
                g.0.launch()
                    .map_err(|e| CudaError::Driver(format!("graph launch: {e}")))
            }
            None => Err(CudaError::Failure(format!("no graph for {key:?}"))),
        }
    }

    /// Forgets every graph (buffers they point into have moved).
    pub fn clear(&mut self) {
        self.graphs.clear();
    }
}
