//! CUDA graphs for decode steps. A decode step is a few hundred small launches whose
//! CPU-side cost rivals the GPU work; replaying a captured graph costs one. A graph bakes in
//! every launch's arguments, so a step replays one only if its indices fit the graph's
//! fixed-layout step buffer: one token per sequence, the same output kind for all, at most
//! [`MAX_GRAPH_TOKENS`] sequences. Steps are padded up to a bucket of sizes (1, 2, 4, 8, then
//! multiples of 8) with dummy tokens, so that 64 batch sizes need 11 graphs; other steps run
//! eagerly.
//!
//! A key is captured the second time it is seen (the first, eager run lets cuBLAS pick and
//! set up its kernels outside a capture); a key whose capture fails runs eagerly from then on.

use std::collections::{HashMap, HashSet};

use cudarc::driver::CudaGraph;

use super::CudaError;
use crate::backend::{LogitsMode, SeqSlice};

/// The largest decode step replayed from a graph.
pub const MAX_GRAPH_TOKENS: usize = 64;

/// What a captured decode step depends on besides the data in its buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GraphKey {
    /// Token rows, padding included.
    pub tokens: usize,
    /// Rows return a picked token (greedy or drawn) rather than logits.
    pub picks: bool,
    /// Some picks draw under a grammar mask: the graph ends with the LM head, and the masks
    /// (which arrive while it runs) and the picks are launched after it.
    pub masked: bool,
    /// Block-table row width, rounded up to a power of two so that growing sequences
    /// re-capture only at doublings.
    pub table_width: usize,
}

/// The graph size a decode step of `sequences` is padded to.
pub fn bucket(sequences: usize) -> usize {
    if sequences <= 8 {
        sequences.next_power_of_two()
    } else {
        sequences.next_multiple_of(8)
    }
}

/// A captured graph, owned by one backend.
struct OwnedGraph(CudaGraph);

// SAFETY: a graph and its executable are plain driver handles. The backend that owns them
// uses them from one thread at a time (it is `Send`, not `Sync`), and `CudaGraph::launch`
// binds the context to the calling thread first.
unsafe impl Send for OwnedGraph {}

/// What to do with a step that has a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replay {
    /// Replay the captured graph.
    Launch,
    /// Capture it now, then replay it.
    Capture,
    /// Run it eagerly (first sighting, or its capture failed).
    Eager,
}

pub struct DecodeGraphs {
    enabled: bool,
    graphs: HashMap<GraphKey, OwnedGraph>,
    seen: HashSet<GraphKey>,
    refused: HashSet<GraphKey>,
    /// Graphs captured so far (tests check that replays happened at all).
    captured: usize,
}

impl DecodeGraphs {
    pub fn new(enabled: bool) -> Self {
        DecodeGraphs {
            enabled,
            graphs: HashMap::new(),
            seen: HashSet::new(),
            refused: HashSet::new(),
            captured: 0,
        }
    }

    pub fn set_enabled(&mut self, enabled: bool) {
        self.enabled = enabled;
        self.clear();
    }

    /// The key of `batch` if it is a decode step a graph can replay.
    pub fn key_for(&self, batch: &[SeqSlice<'_>], block_size: usize) -> Option<GraphKey> {
        let first = batch.first()?;
        // Picks draw with per-row parameters from the step buffer: greedy and sampled rows
        // share a graph.
        let kind = |m: LogitsMode| match m {
            LogitsMode::Last => Some(false),
            LogitsMode::Argmax | LogitsMode::Draw(_) | LogitsMode::DrawMasked(_) => Some(true),
            LogitsMode::None | LogitsMode::All => None,
        };
        let picks = kind(first.logits)?;
        let uniform = |s: &SeqSlice<'_>| s.tokens.len() == 1 && kind(s.logits) == Some(picks);
        if !self.enabled || batch.len() > MAX_GRAPH_TOKENS || !batch.iter().all(uniform) {
            return None;
        }
        let longest = batch
            .iter()
            .map(|s| (s.start_pos + 1).div_ceil(block_size))
            .max()?;
        Some(GraphKey {
            tokens: bucket(batch.len()),
            picks,
            masked: batch
                .iter()
                .any(|s| matches!(s.logits, LogitsMode::DrawMasked(_))),
            table_width: longest.next_power_of_two().max(16),
        })
    }

    /// What to do with a step of `key` (and notes that it was seen).
    pub fn plan(&mut self, key: &GraphKey) -> Replay {
        if self.graphs.contains_key(key) {
            Replay::Launch
        } else if self.refused.contains(key) || self.seen.insert(*key) {
            Replay::Eager
        } else {
            Replay::Capture
        }
    }

    pub fn insert(&mut self, key: GraphKey, graph: CudaGraph) {
        self.graphs.insert(key, OwnedGraph(graph));
        self.captured += 1;
    }

    /// How many graphs were captured since the backend was made.
    pub fn captured(&self) -> usize {
        self.captured
    }

    /// `key`'s capture failed: its steps run eagerly from now on.
    pub fn refuse(&mut self, key: GraphKey) {
        self.refused.insert(key);
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
        self.seen.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(
        tables: &[Vec<u32>],
        positions: &[usize],
        mode: LogitsMode,
    ) -> Vec<SeqSlice<'static>> {
        static TOKEN: [u32; 1] = [3];
        positions
            .iter()
            .zip(tables)
            .map(|(&p, t)| SeqSlice {
                adapter: None,
                tokens: &TOKEN,
                start_pos: p,
                block_table: Box::leak(t.clone().into_boxed_slice()),
                logits: mode,
            })
            .collect()
    }

    #[test]
    fn decode_steps_pad_to_a_few_bucket_sizes() {
        let sizes: Vec<usize> = (1..=MAX_GRAPH_TOKENS).map(bucket).collect();
        let mut distinct = sizes.clone();
        distinct.dedup();
        assert_eq!(distinct, vec![1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]);
        assert!((1..=MAX_GRAPH_TOKENS).all(|n| bucket(n) >= n));
    }

    #[test]
    fn only_uniform_decode_steps_up_to_the_largest_bucket_have_a_key() {
        let graphs = DecodeGraphs::new(true);
        let tables = vec![vec![0u32; 4]; 65];
        let positions = vec![5usize; 65];
        let key = graphs
            .key_for(
                &decode(&tables[..9], &positions[..9], LogitsMode::Argmax),
                4,
            )
            .expect("nine greedy decodes");
        assert_eq!(
            key,
            GraphKey {
                tokens: 16,
                picks: true,
                masked: false,
                table_width: 16
            }
        );
        assert!(graphs
            .key_for(&decode(&tables, &positions, LogitsMode::Argmax), 4)
            .is_none());
        let mut mixed = decode(&tables[..3], &positions[..3], LogitsMode::Last);
        mixed[1].logits = LogitsMode::Argmax;
        assert!(graphs.key_for(&mixed, 4).is_none(), "mixed output kinds");
        let mut picks = decode(&tables[..3], &positions[..3], LogitsMode::Argmax);
        picks[2].logits = LogitsMode::Draw(crate::sampler::TokenDraw {
            temperature: 0.7,
            u: 0.5,
            ..crate::sampler::TokenDraw::GREEDY
        });
        assert!(
            graphs
                .key_for(&picks, 4)
                .is_some_and(|k| k.picks && !k.masked),
            "greedy and drawn rows share a graph"
        );
        picks[1].logits = LogitsMode::DrawMasked(crate::sampler::TokenDraw::GREEDY);
        assert!(
            graphs
                .key_for(&picks, 4)
                .is_some_and(|k| k.picks && k.masked),
            "a masked draw makes a graph of its own, which leaves the picks out"
        );
        assert!(DecodeGraphs::new(false)
            .key_for(&decode(&tables[..2], &positions[..2], LogitsMode::Last), 4)
            .is_none());
    }

    #[test]
    fn a_key_is_captured_on_its_second_step_and_never_after_a_refusal() {
        let mut graphs = DecodeGraphs::new(true);
        let key = GraphKey {
            tokens: 8,
            picks: false,
            masked: false,
            table_width: 16,
        };
        assert_eq!(graphs.plan(&key), Replay::Eager);
        assert_eq!(graphs.plan(&key), Replay::Capture);
        graphs.refuse(key);
        assert_eq!(graphs.plan(&key), Replay::Eager);
        assert_eq!(graphs.plan(&key), Replay::Eager);
    }
}
