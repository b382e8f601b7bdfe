//! [`Tokenizer`]: text ↔ token ids for one model, with the same ids llama.cpp produces.
//! Built from GGUF vocabulary metadata (here) or from Hugging Face files
//! ([`super::hf_files`]). Special tokens written in the text are always parsed as specials,
//! because chat templates emit them as text.

use super::bpe;
use super::error::TokenizerError;
use super::pretokenize::PreTokenization;
use super::specials::{Fragment, SpecialSplitter};
use super::spm::{SpmModel, SPACE_MARK};
use super::table::{PieceStyle, TokenKind, TokenTable};
use super::vocab::GgufVocab;

/// Token texts that end generation, as llama.cpp's end-of-generation list detects them.
pub(super) const END_OF_GENERATION_TEXTS: [&str; 7] = [
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
];

/// Harmony (gpt-oss) ends a turn with `<|return|>` (an answer) or `<|call|>` (a tool call);
/// its `<|end|>` only ends one message of the turn, such as the reasoning before the answer.
const HARMONY_TURN_ENDS: [&str; 2] = ["<|return|>", "<|call|>"];

/// In a harmony vocabulary (one that has both turn ends), those end generation and
/// `<|end|>` does not, although it ends the turns of other vocabularies (Phi-3), as
/// llama.cpp decides too. Returns harmony's `<|end|>`, which ends only a message.
fn harmony_turn_ends(table: &TokenTable, eos_ids: &mut Vec<u32>) -> Option<u32> {
    let ends: Vec<u32> = HARMONY_TURN_ENDS
        .iter()
        .filter_map(|text| table.find(text))
        .collect();
    if ends.len() < HARMONY_TURN_ENDS.len() {
        return None;
    }
    eos_ids.extend(ends);
    let end = table.find("<|end|>")?;
    eos_ids.retain(|&id| id != end);
    Some(end)
}

/// How ordinary (non-special) text becomes ids.
pub(super) enum TextEncoder {
    /// Byte-level BPE from GGUF; special tokens are split out by [`SpecialSplitter`] first.
    Bpe(Box<tokenizers::Tokenizer>),
    /// SentencePiece-style BPE from GGUF, likewise behind the splitter.
    Spm(Box<SpmModel>),
    /// A complete `tokenizer.json`, whose added-token matching handles specials itself.
    Hf(Box<tokenizers::Tokenizer>),
}

/// Everything a tokenizer is made of; the constructors fill it in.
pub(super) struct Parts {
    pub encoder: TextEncoder,
    pub table: TokenTable,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    /// Extra end-of-generation ids besides `eos` (eot, eom, ...).
    pub extra_eog: Vec<u32>,
    pub add_bos: bool,
    pub add_space_prefix: bool,
    pub chat_template: Option<String>,
}

/// A model's tokenizer.
pub struct Tokenizer {
    encoder: TextEncoder,
    specials: SpecialSplitter,
    table: TokenTable,
    bos: Option<u32>,
    eos: Option<u32>,
    eos_ids: Vec<u32>,
    /// A token that ends a message within a turn, never generation (harmony's `<|end|>`).
    message_end: Option<u32>,
    add_bos: bool,
    add_space_prefix: bool,
    chat_template: Option<String>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.table.len())
            .field("bos", &self.bos)
            .field("eos_ids", &self.eos_ids)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Builds the tokenizer described by GGUF `tokenizer.ggml.*` metadata.
    pub fn from_gguf_vocab(vocab: &GgufVocab) -> Result<Self, TokenizerError> {
        let n = vocab.tokens.len();
        if n == 0 {
            return Err(TokenizerError::InvalidVocab("no tokens".into()));
        }
        let texts: Vec<String> = vocab
            .tokens
            .iter()
            .enumerate()
            .map(|(i, t)| {
                if t.is_empty() {
                    format!("[EMPTY_{i}]")
                } else {
                    t.clone()
                }
            })
            .collect();
        let kinds = gguf_kinds(vocab, &texts)?;
        let in_range = |id: Option<u32>| id.filter(|&i| (i as usize) < n);
        let (encoder, style, default_bos, default_prefix) = match vocab.model.as_str() {
            "gpt2" => {
                let pre = PreTokenization::for_pre(vocab.pre.as_deref())?;
                // llama.cpp turns BOS on by default only for the Llama 3 family.
                let bos = pre.ignore_merges;
                let encoder = TextEncoder::Bpe(Box::new(bpe::build(&texts, &vocab.merges, &pre)?));
                (encoder, PieceStyle::ByteLevel, bos, false)
            }
            "llama" => {
                let scores = vocab.scores.as_deref().unwrap_or(&[]);
                let encoder = TextEncoder::Spm(Box::new(SpmModel::new(&texts, scores)));
                (encoder, PieceStyle::SentencePiece, true, true)
            }
            other => return Err(TokenizerError::UnsupportedModel(other.to_string())),
        };
        Ok(Self::from_parts(Parts {
            encoder,
            table: TokenTable::new(texts, kinds, style),
            bos: in_range(vocab.bos_id),
            eos: in_range(vocab.eos_id),
            extra_eog: vocab
                .eot_ids
                .iter()
                .copied()
                .filter(|&i| (i as usize) < n)
                .collect(),
            add_bos: vocab.add_bos.unwrap_or(default_bos),
            add_space_prefix: vocab.add_space_prefix.unwrap_or(default_prefix),
            chat_template: None,
        }))
    }

    pub(super) fn from_parts(parts: Parts) -> Self {
        let specials = match parts.encoder {
            TextEncoder::Hf(_) => SpecialSplitter::default(),
            _ => SpecialSplitter::new(parts.table.matched_in_text()),
        };
        let mut eos_ids: Vec<u32> = parts.eos.into_iter().chain(parts.extra_eog).collect();
        for text in END_OF_GENERATION_TEXTS {
            eos_ids.extend(parts.table.find(text));
        }
        let message_end = harmony_turn_ends(&parts.table, &mut eos_ids);
        let mut seen = std::collections::HashSet::new();
        eos_ids.retain(|id| seen.insert(*id));
        Self {
            encoder: parts.encoder,
            specials,
            table: parts.table,
            bos: parts.bos,
            eos: parts.eos,
            eos_ids,
            message_end,
            add_bos: parts.add_bos,
            add_space_prefix: parts.add_space_prefix,
            chat_template: parts.chat_template,
        }
    }

    /// Token ids of `text`, with special tokens in the text parsed as specials. `add_bos`
    /// prepends the BOS token (if the vocabulary has one).
    pub fn encode(&self, text: &str, add_bos: bool) -> Result<Vec<u32>, TokenizerError> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_bos {
            out.extend(self.bos);
        }
        match &self.encoder {
            TextEncoder::Hf(hf) => out.extend_from_slice(hf_encode(hf, text)?.as_slice()),
            TextEncoder::Bpe(hf) => {
                for fragment in self.specials.split(text) {
                    match fragment {
                        Fragment::Special(id) => out.push(id),
                        Fragment::Text(r) => out.extend(hf_encode(hf, &text[r])?),
                    }
                }
            }
            TextEncoder::Spm(spm) => self.encode_spm(spm, text, &mut out),
        }
        Ok(out)
    }

    /// llama.cpp's SentencePiece path: spaces become `▁`, and a text piece at the start or
    /// right after a special token gets a leading space when the vocabulary asks for it.
    fn encode_spm(&self, spm: &SpmModel, text: &str, out: &mut Vec<u32>) {
        let mut after_special = true;
        let mut piece = String::new();
        for fragment in self.specials.split(text) {
            match fragment {
                Fragment::Special(id) => {
                    out.push(id);
                    after_special = true;
                }
                Fragment::Text(r) => {
                    piece.clear();
                    if self.add_space_prefix && after_special {
                        piece.push(SPACE_MARK);
                    }
                    for c in text[r].chars() {
                        piece.push(if c == ' ' { SPACE_MARK } else { c });
                    }
                    spm.encode(&piece, out);
                    after_special = false;
                }
            }
        }
    }

    /// Tokens of a rendered chat prompt: BOS is added when the model wants one by default,
    /// unless the template already wrote it at the start.
    pub fn encode_prompt(&self, prompt: &str) -> Result<Vec<u32>, TokenizerError> {
        let bos_text = self.bos_text();
        let has_bos = !bos_text.is_empty() && prompt.starts_with(&bos_text);
        self.encode(prompt, self.add_bos && !has_bos)
    }

    /// The text of a token sequence decoded from its start. Invalid UTF-8 (a sequence cut
    /// inside a character) becomes U+FFFD.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> String {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            if skip_special && self.is_special(id) {
                continue;
            }
            let piece = self.piece(id);
            // SentencePiece writes a space before the first word; decoding from the start
            // takes it back, from the first piece shown (as Hugging Face's decoders do).
            let strip = bytes.is_empty() && self.add_space_prefix && piece.first() == Some(&b' ');
            bytes.extend_from_slice(if strip { &piece[1..] } else { piece });
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The raw bytes a token stands for (for logprobs `bytes`); may be part of a character.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        self.piece(id).to_vec()
    }

    /// Borrowed [`Self::token_bytes`], for hot paths.
    pub fn piece(&self, id: u32) -> &[u8] {
        self.table.piece(id)
    }

    /// A token as text (invalid UTF-8 of partial characters becomes U+FFFD).
    pub fn token_text(&self, id: u32) -> String {
        String::from_utf8_lossy(self.piece(id)).into_owned()
    }

    /// The vocabulary entry of a token, as stored (`"Ġhello"`, `"▁hello"`, `"<0x0A>"`).
    pub fn vocab_entry(&self, id: u32) -> Option<&str> {
        self.table.text(id)
    }

    /// Control and unknown tokens (hidden by `skip_special`).
    pub fn is_special(&self, id: u32) -> bool {
        self.table.kind(id).is_some_and(TokenKind::is_special)
    }

    pub fn vocab_size(&self) -> usize {
        self.table.len()
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// All ids that end generation: EOS, EOT/EOM, and end-of-turn tokens such as
    /// `<|im_end|>` and `<end_of_turn>` when the vocabulary has them.
    pub fn eos_ids(&self) -> Vec<u32> {
        self.eos_ids.clone()
    }

    /// Whether `id` ends only a message within a turn (harmony's `<|end|>`): a model's
    /// configuration that lists it as an end of generation is overruled.
    pub fn ends_only_a_message(&self, id: u32) -> bool {
        self.message_end == Some(id)
    }

    pub fn is_eos(&self, id: u32) -> bool {
        self.eos_ids.contains(&id)
    }

    /// BOS as text for chat templates (`bos_token`); empty without one.
    pub fn bos_text(&self) -> String {
        self.bos.map(|id| self.token_text(id)).unwrap_or_default()
    }

    /// EOS as text for chat templates (`eos_token`); empty without one.
    pub fn eos_text(&self) -> String {
        self.eos.map(|id| self.token_text(id)).unwrap_or_default()
    }

    /// Whether prompts get BOS prepended by default (GGUF `add_bos_token`).
    pub fn add_bos_by_default(&self) -> bool {
        self.add_bos && self.bos.is_some()
    }

    /// Whether the vocabulary writes a space before the first word (SentencePiece
    /// `add_dummy_prefix`); decoding from the start of a sequence takes it back.
    pub fn add_space_prefix(&self) -> bool {
        self.add_space_prefix
    }

    /// The chat template that came with the tokenizer files, if any.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }
}

fn hf_encode(hf: &tokenizers::Tokenizer, text: &str) -> Result<Vec<u32>, TokenizerError> {
    if text.is_empty() {
        return Ok(Vec::new());
    }
    hf.encode_fast(text, false)
        .map(|e| e.get_ids().to_vec())
        .map_err(|e| TokenizerError::Backend(e.to_string()))
}

/// Token kinds from GGUF token types; end-of-generation texts are forced to control tokens,
/// as llama.cpp does for vocabularies that mislabel them.
fn gguf_kinds(vocab: &GgufVocab, texts: &[String]) -> Result<Vec<TokenKind>, TokenizerError> {
    let mut kinds = match &vocab.token_types {
        Some(types) if types.len() != texts.len() => {
            return Err(TokenizerError::InvalidVocab(format!(
                "{} token types for {} tokens",
                types.len(),
                texts.len()
            )))
        }
        Some(types) => types.iter().map(|&t| TokenKind::from_gguf(t)).collect(),
        None => vec![TokenKind::Normal; texts.len()],
    };
    for (kind, text) in kinds.iter_mut().zip(texts) {
        if END_OF_GENERATION_TEXTS.contains(&text.as_str()) {
            *kind = TokenKind::Control;
        }
    }
    Ok(kinds)
}
