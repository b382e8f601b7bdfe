//! `GET /v1/models` response shapes (vLLM's, which add `max_model_len`).

use serde::Serialize;

#[derive(Debug, Serialize)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<ModelCard>,
}

#[derive(Debug, Serialize)]
pub struct ModelCard {
    pub id: String,
    pub object: &'static str,
    pub created: i64,
    pub owned_by: String,
    pub max_model_len: u32,
    /// `chat` (chat, completions, responses) or `embedding` (`/v1/embeddings`).
    pub kind: fallow_scheduler::runners::ModelKind,
    /// An embedding model's vector length.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dimensions: Option<u32>,
    /// A LoRA adapter's base model (vLLM's `parent`); `null` for a base model.
    pub parent: Option<String>,
}

impl From<&fallow_scheduler::runners::ModelEntry> for ModelCard {
    fn from(entry: &fallow_scheduler::runners::ModelEntry) -> Self {
        ModelCard {
            id: entry.id.clone(),
            object: "model",
            created: entry.created,
            owned_by: entry.owned_by.clone(),
            max_model_len: entry.context_length,
            kind: entry.kind,
            dimensions: entry.dimensions,
            parent: entry.parent.clone(),
        }
    }
}

impl ModelList {
    pub fn new(data: Vec<ModelCard>) -> Self {
        ModelList {
            object: "list",
            data,
        }
    }
}
