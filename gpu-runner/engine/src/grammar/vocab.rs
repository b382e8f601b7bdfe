//! The model's vocabulary as llguidance's token environment: a [`TokTrie`] of every token's
//! bytes (what our detokenizer emits for it), so a grammar over text becomes a mask over
//! token ids.
//!
//! Special tokens (control and unknown) are entered as `0xFF` + their text, llguidance's
//! convention: they never match grammar text, and the end-of-generation ones are allowed
//! exactly when the grammar accepts. Both tokenizer families fit: byte-level BPE pieces and
//! SentencePiece pieces (`▁` → space, `<0xXX>` → the byte) are already bytes in
//! [`Tokenizer::piece`].

use std::sync::Arc;

use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use crate::tokenizer::Tokenizer;

/// Our tokenizer behind llguidance's [`TokenizerEnv`].
pub(super) struct ModelTokEnv {
    trie: TokTrie,
    tokenizer: Arc<Tokenizer>,
    /// Whether [`Tokenizer::encode`] of a text fragment is how the model would tokenize it
    /// mid-sequence (not so when SentencePiece prepends its dummy-prefix space), which
    /// lets llguidance force the canonical tokens of text the grammar leaves no choice in.
    canonical: bool,
}

impl ModelTokEnv {
    /// `eos_ids` end generation; the grammar allows them when it accepts. Empty `eos_ids`
    /// fall back to the tokenizer's EOS (or token 0).
    pub(super) fn build(tokenizer: Arc<Tokenizer>, eos_ids: &[u32]) -> TokEnv {
        let n = tokenizer.vocab_size();
        let words: Vec<Vec<u8>> = (0..n as u32).map(|id| token_word(&tokenizer, id)).collect();
        let eos: Vec<TokenId> = eos_ids
            .iter()
            .copied()
            .filter(|&id| (id as usize) < n)
            .chain(tokenizer.eos_id())
            .collect();
        let first = eos.first().copied().unwrap_or(0);
        let mut info = TokRxInfo::new(n as u32, first);
        info.tok_bos = tokenizer.bos_id();
        let trie =
            TokTrie::from(&info, &words).with_eos_tokens(if eos.is_empty() { &[0] } else { &eos });
        let canonical = !tokenizer.add_space_prefix();
        Arc::new(ModelTokEnv {
            trie,
            tokenizer,
            canonical,
        })
    }
}

/// The bytes one token stands for in the trie.
fn token_word(tokenizer: &Tokenizer, id: u32) -> Vec<u8> {
    if tokenizer.is_special(id) {
        let text = tokenizer.vocab_entry(id).unwrap_or_default();
        let mut word = Vec::with_capacity(text.len() + 1);
        word.push(TokTrie::SPECIAL_TOKEN_MARKER);
        word.extend_from_slice(text.as_bytes());
        word
    } else {
        tokenizer.piece(id).to_vec()
    }
}

impl TokenizerEnv for ModelTokEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        if self.canonical {
            if let Ok(text) = std::str::from_utf8(s) {
                if let Ok(ids) = self.tokenizer.encode(text, false) {
                    return ids;
                }
            }
        }
        self.trie.greedy_tokenize(s)
    }

    fn tokenize_is_canonical(&self) -> bool {
        self.canonical
    }
}
