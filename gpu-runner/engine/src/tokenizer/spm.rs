//! SentencePiece-style BPE over token scores (GGUF `tokenizer.ggml.model = "llama"`; Llama 2,
//! Gemma). GGUF stores no merges for these vocabularies, only a score per token, so this is a
//! port of llama.cpp's `llm_tokenizer_spm` algorithm: start from single characters and keep
//! merging the adjacent pair whose concatenation is the highest-scoring token (leftmost on
//! ties). What never becomes a token is written as `<0xXX>` byte tokens.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

/// The SentencePiece word symbol that stands for a space.
pub const SPACE_MARK: char = '\u{2581}';

/// Token lookup and scores of a SentencePiece vocabulary.
#[derive(Debug, Clone)]
pub struct SpmModel {
    token_to_id: HashMap<String, u32>,
    scores: Vec<f32>,
    byte_tokens: [Option<u32>; 256],
}

#[derive(Debug, Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

#[derive(Debug)]
struct Bigram {
    left: usize,
    right: usize,
    score: f32,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    /// Max-heap order: higher score first, then the leftmost pair.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl SpmModel {
    /// `scores` may be shorter than `tokens` (missing scores count as 0, as in llama.cpp).
    pub fn new(tokens: &[String], scores: &[f32]) -> Self {
        let token_to_id: HashMap<String, u32> = tokens
            .iter()
            .enumerate()
            .map(|(id, t)| (t.clone(), id as u32))
            .collect();
        let mut byte_tokens = [None; 256];
        for (b, slot) in byte_tokens.iter_mut().enumerate() {
            let hex = format!("<0x{b:02X}>");
            *slot = token_to_id.get(&hex).copied().or_else(|| {
                // Some vocabularies hold plain ASCII bytes as themselves instead.
                let byte = u8::try_from(b).ok().filter(u8::is_ascii)?;
                token_to_id.get(&char::from(byte).to_string()).copied()
            });
        }
        let mut scores = scores.to_vec();
        scores.resize(tokens.len(), 0.0);
        Self {
            token_to_id,
            scores,
            byte_tokens,
        }
    }

    /// Appends the tokens of `text` (spaces already written as [`SPACE_MARK`]) to `out`.
    pub fn encode(&self, text: &str, out: &mut Vec<u32>) {
        let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
        for (i, (start, c)) in text.char_indices().enumerate() {
            let len = c.len_utf8();
            let next = (start + len < text.len()).then_some(i + 1);
            symbols.push(Symbol {
                start,
                len,
                prev: i.checked_sub(1),
                next,
            });
        }
        let mut queue = BinaryHeap::new();
        for i in 1..symbols.len() {
            self.push_bigram(text, &symbols, i - 1, i, &mut queue);
        }
        while let Some(bigram) = queue.pop() {
            let (left, right) = (symbols[bigram.left], symbols[bigram.right]);
            // Stale entry: one side was merged into something else since it was queued.
            if left.len == 0 || right.len == 0 || left.len + right.len != bigram.size {
                continue;
            }
            symbols[bigram.left].len += right.len;
            symbols[bigram.right].len = 0;
            symbols[bigram.left].next = right.next;
            if let Some(next) = right.next {
                symbols[next].prev = Some(bigram.left);
            }
            if let Some(prev) = left.prev {
                self.push_bigram(text, &symbols, prev, bigram.left, &mut queue);
            }
            if let Some(next) = right.next {
                self.push_bigram(text, &symbols, bigram.left, next, &mut queue);
            }
        }
        let mut cursor = (!symbols.is_empty()).then_some(0);
        while let Some(i) = cursor {
            let s = symbols[i];
            self.emit(&text[s.start..s.start + s.len], out);
            cursor = s.next;
        }
    }

    fn push_bigram(
        &self,
        text: &str,
        symbols: &[Symbol],
        left: usize,
        right: usize,
        queue: &mut BinaryHeap<Bigram>,
    ) {
        let (l, r) = (symbols[left], symbols[right]);
        let size = l.len + r.len;
        let Some(&id) = self.token_to_id.get(&text[l.start..l.start + size]) else {
            return;
        };
        let score = self.scores.get(id as usize).copied().unwrap_or(0.0);
        queue.push(Bigram {
            left,
            right,
            score,
            size,
        });
    }

    /// A final symbol is a token, or (a character the vocabulary lacks) its UTF-8 bytes.
    fn emit(&self, piece: &str, out: &mut Vec<u32>) {
        if let Some(&id) = self.token_to_id.get(piece) {
            out.push(id);
            return;
        }
        out.extend(
            piece
                .bytes()
                .filter_map(|b| self.byte_tokens[usize::from(b)]),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toy() -> SpmModel {
        let mut tokens: Vec<String> = (0..=255u8).map(|b| format!("<0x{b:02X}>")).collect();
        let mut scores = vec![0.0f32; 256];
        for (t, s) in [
            ("▁", -1.0),
            ("h", -2.0),
            ("i", -2.0),
            ("hi", -1.5),
            ("▁hi", -0.5),
        ] {
            tokens.push(t.to_string());
            scores.push(s);
        }
        SpmModel::new(&tokens, &scores)
    }

    #[test]
    fn the_best_scoring_merges_win() {
        let mut out = Vec::new();
        toy().encode("▁hi", &mut out);
        assert_eq!(out, vec![260]);
    }

    #[test]
    fn characters_missing_from_the_vocabulary_fall_back_to_byte_tokens() {
        let mut out = Vec::new();
        toy().encode("é", &mut out);
        assert_eq!(out, vec![0xC3, 0xA9]);
    }

    #[test]
    fn empty_text_gives_no_tokens() {
        let mut out = Vec::new();
        toy().encode("", &mut out);
        assert!(out.is_empty());
    }
}
