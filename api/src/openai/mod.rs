//! OpenAI's wire format, and nothing else: request types are lenient (aliases, string or
//! array content, unknown fields kept for a debug log) so that any OpenAI-style client is
//! understood; response types serialise exactly the shapes OpenAI's SDKs parse.
//! Conversion into the scheduler's validated types happens in [`crate::validate`].

#[cfg(test)]
mod batch_hostile_tests;
pub mod batches;
pub mod completions;
pub mod embeddings;
pub mod files;
pub mod models;
pub mod request;
pub mod response;
pub mod responses;
pub mod tokenize;
