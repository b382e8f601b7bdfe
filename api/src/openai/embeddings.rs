//! `POST /v1/embeddings`: OpenAI's request and response shapes.

use crate::error::ApiError;
use base64::Engine;
use fallow_protocol::job::{Completion, EmbeddingFormat};
use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct EmbeddingRequest {
    pub model: Option<String>,
    /// A string, a list of strings, a list of token ids or a list of token-id lists.
    pub input: Option<Value>,
    /// `float` (default) or `base64`.
    pub encoding_format: Option<String>,
    pub dimensions: Option<i64>,
    pub user: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct EmbeddingList {
    pub object: &'static str,
    pub data: Vec<Embedding>,
    pub model: String,
    pub usage: EmbeddingUsage,
}

#[derive(Debug, Serialize)]
pub struct Embedding {
    pub object: &'static str,
    pub index: usize,
    pub embedding: EmbeddingVector,
}

/// A vector as floats, or as base64 of its little-endian f32 bytes (what the SDKs ask for
/// by default, since it is a quarter of the size).
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum EmbeddingVector {
    Float(Vec<f32>),
    Base64(String),
}

#[derive(Debug, Serialize)]
pub struct EmbeddingUsage {
    pub prompt_tokens: u32,
    pub total_tokens: u32,
}

impl EmbeddingList {
    /// The answer of an embedding job: its vectors, cut and normalised again to
    /// `format.dimensions` if asked, as floats or base64.
    pub fn from_completion(
        model: String,
        format: EmbeddingFormat,
        completion: &Completion,
    ) -> Result<Self, ApiError> {
        let vectors = completion
            .embeddings
            .as_ref()
            .ok_or_else(|| ApiError::Internal("the runner answered without embeddings".into()))?;
        let data = vectors
            .iter()
            .enumerate()
            .map(|(index, vector)| Embedding {
                object: "embedding",
                index,
                embedding: encode(cut(vector, format.dimensions), format.base64),
            })
            .collect();
        let tokens = completion.usage.prompt_tokens;
        Ok(EmbeddingList {
            object: "list",
            data,
            model,
            usage: EmbeddingUsage {
                prompt_tokens: tokens,
                total_tokens: tokens,
            },
        })
    }
}

/// The first `dimensions` values, normalised to unit length again (Matryoshka truncation).
fn cut(vector: &[f32], dimensions: Option<u32>) -> Vec<f32> {
    let Some(keep) = dimensions.map(|d| d as usize).filter(|&d| d < vector.len()) else {
        return vector.to_vec();
    };
    let kept = &vector[..keep];
    let norm = kept.iter().map(|v| v * v).sum::<f32>().sqrt();
    if norm > 0.0 {
        kept.iter().map(|v| v / norm).collect()
    } else {
        kept.to_vec()
    }
}

fn encode(vector: Vec<f32>, base64: bool) -> EmbeddingVector {
    if !base64 {
        return EmbeddingVector::Float(vector);
    }
    let bytes: Vec<u8> = vector.iter().flat_map(|v| v.to_le_bytes()).collect();
    EmbeddingVector::Base64(base64::engine::general_purpose::STANDARD.encode(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_vector_is_unit_length_again_and_base64_holds_little_endian_floats() {
        let cut = cut(&[3.0, 4.0, 12.0], Some(2));
        assert_eq!(cut, vec![0.6, 0.8]);
        let EmbeddingVector::Base64(text) = encode(vec![1.0, -2.0], true) else {
            panic!("base64 asked");
        };
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text)
            .unwrap_or_default();
        assert_eq!(
            bytes,
            [1.0f32.to_le_bytes(), (-2.0f32).to_le_bytes()].concat()
        );
    }
}
