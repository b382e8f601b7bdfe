//! Splitting text around special tokens written out in it (`<|im_start|>`, `<start_of_turn>`,
//! user-defined tokens), before the ordinary tokenizer sees the rest. Chat templates emit
//! special tokens as text, so the engine must recognise them exactly as llama.cpp does with
//! `parse_special = true`: longest tokens first, each one carving every occurrence out of the
//! text pieces the longer ones left.

use std::ops::Range;

/// A piece of text to tokenize normally, or a special token found in the text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fragment {
    Text(Range<usize>),
    Special(u32),
}

/// The special tokens of a vocabulary, ready to be found in text.
#[derive(Debug, Clone, Default)]
pub struct SpecialSplitter {
    /// `(id, text)`, longest text first (ties by id, so the order is deterministic).
    tokens: Vec<(u32, String)>,
    trie: Trie,
}

impl SpecialSplitter {
    pub fn new(specials: impl IntoIterator<Item = (u32, String)>) -> Self {
        let mut tokens: Vec<(u32, String)> = specials
            .into_iter()
            .filter(|(_, t)| !t.is_empty())
            .collect();
        tokens.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.0.cmp(&b.0)));
        let mut trie = Trie::default();
        for (rank, (_, text)) in tokens.iter().enumerate() {
            trie.insert(text.as_bytes(), rank);
        }
        Self { tokens, trie }
    }

    /// Splits `text` into ordinary text pieces and special tokens, in order.
    pub fn split(&self, text: &str) -> Vec<Fragment> {
        let mut fragments = vec![Fragment::Text(0..text.len())];
        if text.is_empty() {
            return Vec::new();
        }
        // Only tokens that occur somewhere in the text can occur in a piece of it; finding
        // them first keeps vocabularies with thousands of specials cheap.
        for rank in self.trie.ranks_present_in(text.as_bytes()) {
            let needle = self.tokens[rank].1.as_str();
            let id = self.tokens[rank].0;
            fragments = carve(text, fragments, needle, id);
        }
        fragments
    }
}

/// Replaces every occurrence of `needle` inside the text fragments by the special token `id`.
fn carve(text: &str, fragments: Vec<Fragment>, needle: &str, id: u32) -> Vec<Fragment> {
    let mut out = Vec::with_capacity(fragments.len() + 2);
    for fragment in fragments {
        let Fragment::Text(range) = fragment else {
            out.push(fragment);
            continue;
        };
        let mut start = range.start;
        while let Some(found) = text[start..range.end].find(needle) {
            let at = start + found;
            if at > start {
                out.push(Fragment::Text(start..at));
            }
            out.push(Fragment::Special(id));
            start = at + needle.len();
        }
        if start < range.end {
            out.push(Fragment::Text(start..range.end));
        }
    }
    out
}

/// A byte trie over the special token texts, used to find which of them occur in a text.
#[derive(Debug, Clone, Default)]
struct Trie {
    nodes: Vec<TrieNode>,
}

#[derive(Debug, Clone, Default)]
struct TrieNode {
    children: Vec<(u8, usize)>,
    rank: Option<usize>,
}

impl Trie {
    fn insert(&mut self, key: &[u8], rank: usize) {
        if self.nodes.is_empty() {
            self.nodes.push(TrieNode::default());
        }
        let mut node = 0;
        for &b in key {
            node = match self.nodes[node].children.iter().find(|(c, _)| *c == b) {
                Some(&(_, child)) => child,
                None => {
                    self.nodes.push(TrieNode::default());
                    let child = self.nodes.len() - 1;
                    self.nodes[node].children.push((b, child));
                    child
                }
            };
        }
        self.nodes[node].rank.get_or_insert(rank);
    }

    /// The ranks of all keys occurring anywhere in `text`, ascending.
    fn ranks_present_in(&self, text: &[u8]) -> Vec<usize> {
        let mut present = Vec::new();
        if self.nodes.is_empty() {
            return present;
        }
        for start in 0..text.len() {
            let mut node = 0;
            for &b in &text[start..] {
                match self.nodes[node].children.iter().find(|(c, _)| *c == b) {
                    Some(&(_, child)) => node = child,
                    None => break,
                }
                if let Some(rank) = self.nodes[node].rank {
                    present.push(rank);
                }
            }
        }
        present.sort_unstable();
        present.dedup();
        present
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn splitter() -> SpecialSplitter {
        SpecialSplitter::new([
            (1, "<|im_start|>".to_string()),
            (2, "<|im_end|>".to_string()),
            (3, "<s>".to_string()),
        ])
    }

    #[test]
    fn specials_are_cut_out_of_the_text_in_order() {
        let text = "<|im_start|>user\nhi<|im_end|>\n";
        assert_eq!(
            splitter().split(text),
            vec![
                Fragment::Special(1),
                Fragment::Text(12..19),
                Fragment::Special(2),
                Fragment::Text(29..30),
            ]
        );
    }

    #[test]
    fn text_without_specials_is_one_fragment() {
        assert_eq!(
            splitter().split("plain <text>"),
            vec![Fragment::Text(0..12)]
        );
        assert!(splitter().split("").is_empty());
    }

    #[test]
    fn longer_specials_win_over_shorter_ones_inside_them() {
        let s = SpecialSplitter::new([(7, "<a>".to_string()), (8, "<a><a>".to_string())]);
        assert_eq!(
            s.split("<a><a><a>"),
            vec![Fragment::Special(8), Fragment::Special(7)]
        );
    }
}
