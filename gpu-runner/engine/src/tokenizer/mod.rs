//! Tokenization and chat templates.
//!
//! - [`Tokenizer`] ([`codec`]): text ↔ ids with the ids llama.cpp produces, from GGUF
//!   vocabularies (byte-level BPE [`bpe`] with [`pretokenize`] regexes, SentencePiece
//!   [`spm`]) or Hugging Face `tokenizer.json` files ([`hf_files`]). Special tokens in the
//!   text are found by [`specials`]; per-token bytes live in [`table`].
//! - [`IncrementalDecoder`] ([`incremental`]): streaming detokenization that never emits
//!   half a UTF-8 character.
//! - [`ChatTemplate`] ([`template`]): Hugging Face-compatible Jinja chat templates on
//!   minijinja, with Python-style `tojson` ([`pyjson`]); [`GEMMA_CHAT_TEMPLATE`] for Gemma
//!   models whose files carry none.
//! - [`OutputSyntax`] ([`template_syntax`]): the tool-call and reasoning syntax a template
//!   reveals (`harmony` for gpt-oss), published so the api can parse the model's output.
//! - [`vocab`]: the `tokenizer.ggml.*` metadata as plain data.

pub mod bpe;
pub mod byte_level;
pub mod codec;
pub mod error;
pub mod hf_files;
pub mod incremental;
pub mod pretokenize;
pub mod pyjson;
pub mod specials;
pub mod spm;
pub mod table;
pub mod template;
pub mod template_syntax;
pub mod vocab;

#[cfg(test)]
mod codec_tests;
#[cfg(test)]
mod fixture_tests;
#[cfg(test)]
mod gemma_tests;
#[cfg(test)]
mod harmony_tests;
#[cfg(test)]
mod hf_files_tests;
#[cfg(test)]
mod template_hostile_tests;
#[cfg(test)]
mod template_tests;
#[cfg(test)]
pub(crate) mod test_gguf;
#[cfg(test)]
mod tests;

pub use codec::Tokenizer;
pub use error::TokenizerError;
pub use incremental::IncrementalDecoder;
pub use template::{ChatTemplate, TemplateError};
pub use template_syntax::OutputSyntax;
pub use vocab::GgufVocab;

/// The Gemma turn format (`<start_of_turn>user\n…<end_of_turn>\n<start_of_turn>model\n`,
/// system text folded into the first turn), for Gemma models that ship no template.
pub const GEMMA_CHAT_TEMPLATE: &str = include_str!("gemma_chat_template.jinja");
