//! [`IncrementalDecoder`]: turns generated token ids into text one token at a time, for
//! streaming. A character can span several tokens (byte-fallback `<0xF0>` tokens, byte-level
//! BPE pieces of an emoji), so bytes are held back until they form whole UTF-8 characters;
//! text is never emitted and later taken back.

use super::codec::Tokenizer;

/// Streaming detokenizer state for one sequence.
#[derive(Debug, Clone, Default)]
pub struct IncrementalDecoder {
    skip_special: bool,
    /// Strip the SentencePiece dummy-prefix space from the first piece shown.
    strip_leading_space: bool,
    shown_any: bool,
    /// Bytes of a character not yet complete.
    pending: Vec<u8>,
}

impl IncrementalDecoder {
    /// A decoder for text that continues a prompt (generated tokens): every token's text is
    /// shown as is, including a leading space.
    pub fn new(skip_special: bool) -> Self {
        Self {
            skip_special,
            ..Self::default()
        }
    }

    /// A decoder for a sequence decoded from its very start; matches
    /// [`Tokenizer::decode`], which drops the SentencePiece dummy-prefix space.
    pub fn at_sequence_start(skip_special: bool, tokenizer: &Tokenizer) -> Self {
        Self {
            skip_special,
            strip_leading_space: tokenizer.add_space_prefix(),
            ..Self::default()
        }
    }

    /// Adds one token and returns the text it completes (possibly empty).
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> String {
        if self.skip_special && tokenizer.is_special(id) {
            return String::new();
        }
        let mut piece = tokenizer.piece(id);
        if piece.is_empty() {
            return String::new();
        }
        if self.strip_leading_space && !self.shown_any && piece[0] == b' ' {
            piece = &piece[1..];
        }
        self.shown_any = true;
        self.pending.extend_from_slice(piece);
        self.take_complete()
    }

    /// Ends the sequence: bytes of an unfinished character come out as U+FFFD.
    pub fn finish(&mut self) -> String {
        let rest = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        rest
    }

    /// Whether bytes of an unfinished character are held back.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Emits all complete characters; bytes that can never start a valid character become
    /// U+FFFD, a valid but unfinished character at the end stays pending.
    fn take_complete(&mut self) -> String {
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(text) => {
                    out.push_str(text);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    // `valid` is valid UTF-8 by construction.
                    out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                    match e.error_len() {
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &after[bad..];
                        }
                        None => {
                            rest = after;
                            break;
                        }
                    }
                }
            }
        }
        let keep = rest.len();
        let drop = self.pending.len() - keep;
        self.pending.drain(..drop);
        out
    }
}
