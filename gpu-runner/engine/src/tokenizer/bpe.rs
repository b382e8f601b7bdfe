//! Byte-level BPE (GGUF `tokenizer.ggml.model = "gpt2"`) built on the `tokenizers` crate from
//! the vocabulary and merges stored in GGUF metadata. Special tokens are not registered here:
//! [`super::specials`] carves them out of the text first, exactly as llama.cpp does, so this
//! tokenizer only ever sees ordinary text.

use std::collections::HashSet;

use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{PreTokenizerWrapper, SplitDelimiterBehavior};

use super::error::TokenizerError;
use super::pretokenize::PreTokenization;

/// Builds the BPE tokenizer for ordinary text of a byte-level vocabulary.
pub fn build(
    tokens: &[String],
    merges: &[String],
    pre: &PreTokenization,
) -> Result<tokenizers::Tokenizer, TokenizerError> {
    // Later duplicates win, as in llama.cpp's `token_to_id[word] = i`.
    let vocab: Vocab = tokens
        .iter()
        .enumerate()
        .map(|(id, t)| (t.clone(), id as u32))
        .collect();
    let merges = usable_merges(merges, &vocab);
    let model = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(pre.ignore_merges)
        .build()
        .map_err(|e| TokenizerError::Backend(e.to_string()))?;

    let mut steps = Vec::with_capacity(pre.regexes.len() + 1);
    for regex in &pre.regexes {
        let split = Split::new(
            SplitPattern::Regex((*regex).to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| TokenizerError::Backend(format!("pre-tokenizer regex {regex:?}: {e}")))?;
        steps.push(PreTokenizerWrapper::Split(split));
    }
    // The words are already split; ByteLevel only maps their bytes to the BPE alphabet.
    steps.push(PreTokenizerWrapper::ByteLevel(ByteLevel::new(
        false, false, false,
    )));

    let mut tokenizer = tokenizers::Tokenizer::new(model);
    tokenizer.with_pre_tokenizer(Some(Sequence::new(steps)));
    Ok(tokenizer)
}

/// Parses `"left right"` merges, keeping the first occurrence of a pair (its rank is what
/// llama.cpp uses) and dropping merges whose parts or result are not tokens, which the
/// `tokenizers` crate would reject. Ranks are positions, so dropping keeps the order.
fn usable_merges(merges: &[String], vocab: &Vocab) -> Vec<(String, String)> {
    let mut seen = HashSet::with_capacity(merges.len());
    let mut out = Vec::with_capacity(merges.len());
    for merge in merges {
        // llama.cpp splits at the first space after the first byte (a space there is a char
        // boundary, since it is ASCII).
        let Some(pos) = merge.bytes().skip(1).position(|b| b == b' ').map(|p| p + 1) else {
            continue;
        };
        let (left, right) = (&merge[..pos], &merge[pos + 1..]);
        let joined = format!("{left}{right}");
        if !vocab.contains_key(left) || !vocab.contains_key(right) || !vocab.contains_key(&joined) {
            continue;
        }
        if seen.insert((left, right)) {
            out.push((left.to_string(), right.to_string()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toy() -> tokenizers::Tokenizer {
        let tokens: Vec<String> = ["a", "b", "ab", "Ġ", "Ġab", "1", "2"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let merges: Vec<String> = ["a b", "Ġ ab", "x y"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let pre = PreTokenization::for_pre(Some("smollm")).unwrap();
        build(&tokens, &merges, &pre).unwrap()
    }

    #[test]
    fn merges_apply_within_words_and_spaces_join_the_next_word() {
        let ids = toy()
            .encode_fast("ab ab", false)
            .unwrap()
            .get_ids()
            .to_vec();
        assert_eq!(ids, vec![2, 4]);
    }

    #[test]
    fn digits_are_split_one_by_one_for_smollm() {
        let ids = toy().encode_fast("12", false).unwrap().get_ids().to_vec();
        assert_eq!(ids, vec![5, 6]);
    }

    #[test]
    fn merges_with_unknown_parts_are_dropped_instead_of_failing() {
        let vocab: Vocab = [("a".to_string(), 0u32)].into_iter().collect();
        assert!(usable_merges(&["a b".to_string(), "nospace".to_string()], &vocab).is_empty());
    }
}
