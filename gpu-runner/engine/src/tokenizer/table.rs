//! Per-token facts every tokenizer shares: the vocabulary text, the token's kind (llama.cpp's
//! token types) and the raw bytes it stands for. Decoding is concatenating those bytes, which
//! is what llama.cpp's `token_to_piece` does, so it is precomputed once per vocabulary.

use super::byte_level;
use super::spm::SPACE_MARK;

/// llama.cpp's token types (GGUF `tokenizer.ggml.token_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    Normal,
    Unknown,
    /// Special tokens such as `<|im_start|>`; hidden when decoding with `skip_special`.
    Control,
    /// Added tokens that are ordinary text (always shown) but matched whole in input text.
    UserDefined,
    Unused,
    /// `<0xXX>` byte-fallback tokens of SentencePiece vocabularies.
    Byte,
    Undefined,
}

impl TokenKind {
    pub fn from_gguf(token_type: i32) -> Self {
        match token_type {
            1 => Self::Normal,
            2 => Self::Unknown,
            3 => Self::Control,
            4 => Self::UserDefined,
            5 => Self::Unused,
            6 => Self::Byte,
            _ => Self::Undefined,
        }
    }

    /// Hidden when decoding with `skip_special` (llama.cpp: control and unknown).
    pub fn is_special(self) -> bool {
        matches!(self, Self::Control | Self::Unknown)
    }

    /// Found as whole tokens in input text before ordinary tokenization.
    pub fn is_matched_in_text(self) -> bool {
        matches!(self, Self::Control | Self::UserDefined | Self::Unknown)
    }
}

/// How ordinary vocabulary entries spell their bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PieceStyle {
    /// GPT-2 byte-level alphabet (`Ġ` for space).
    ByteLevel,
    /// SentencePiece: `▁` for space, `<0xXX>` byte tokens.
    SentencePiece,
}

/// Text, kind and bytes of every token id.
#[derive(Debug, Clone)]
pub struct TokenTable {
    texts: Vec<String>,
    kinds: Vec<TokenKind>,
    pieces: Vec<Vec<u8>>,
}

impl TokenTable {
    pub fn new(texts: Vec<String>, kinds: Vec<TokenKind>, style: PieceStyle) -> Self {
        let pieces = texts
            .iter()
            .zip(&kinds)
            .map(|(text, kind)| piece_bytes(text, *kind, style))
            .collect();
        Self {
            texts,
            kinds,
            pieces,
        }
    }

    pub fn len(&self) -> usize {
        self.texts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.texts.is_empty()
    }

    pub fn text(&self, id: u32) -> Option<&str> {
        self.texts.get(id as usize).map(String::as_str)
    }

    pub fn kind(&self, id: u32) -> Option<TokenKind> {
        self.kinds.get(id as usize).copied()
    }

    /// The bytes of a token; empty for ids outside the vocabulary.
    pub fn piece(&self, id: u32) -> &[u8] {
        self.pieces.get(id as usize).map_or(&[], Vec::as_slice)
    }

    /// `(id, text)` of all tokens that input text may contain verbatim.
    pub fn matched_in_text(&self) -> impl Iterator<Item = (u32, String)> + '_ {
        self.kinds
            .iter()
            .enumerate()
            .filter(|(_, k)| k.is_matched_in_text())
            .map(|(id, _)| (id as u32, self.texts[id].clone()))
    }

    /// The first id whose text is `text`.
    pub fn find(&self, text: &str) -> Option<u32> {
        self.texts.iter().position(|t| t == text).map(|i| i as u32)
    }
}

/// What a token decodes to, following llama.cpp's `token_to_piece(special = true)`.
fn piece_bytes(text: &str, kind: TokenKind, style: PieceStyle) -> Vec<u8> {
    match kind {
        TokenKind::Control | TokenKind::Unknown | TokenKind::UserDefined => {
            text.as_bytes().to_vec()
        }
        TokenKind::Normal => match style {
            PieceStyle::ByteLevel => byte_level::decode_token(text),
            PieceStyle::SentencePiece => text.replace(SPACE_MARK, " ").into_bytes(),
        },
        TokenKind::Byte => parse_byte_token(text).map(|b| vec![b]).unwrap_or_default(),
        TokenKind::Unused | TokenKind::Undefined => Vec::new(),
    }
}

/// `<0x0A>` → `0x0A`.
pub fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_follow_the_vocabulary_style() {
        let table = TokenTable::new(
            vec![
                "▁hello".into(),
                "<0x0A>".into(),
                "<s>".into(),
                "<unused0>".into(),
            ],
            vec![
                TokenKind::Normal,
                TokenKind::Byte,
                TokenKind::Control,
                TokenKind::Unused,
            ],
            PieceStyle::SentencePiece,
        );
        assert_eq!(table.piece(0), b" hello");
        assert_eq!(table.piece(1), b"\n");
        assert_eq!(table.piece(2), b"<s>");
        assert_eq!(table.piece(3), b"");
        assert_eq!(table.piece(99), b"");
    }

    #[test]
    fn byte_tokens_parse_only_their_exact_form() {
        assert_eq!(parse_byte_token("<0xFF>"), Some(0xFF));
        assert_eq!(parse_byte_token("<0xF>"), None);
        assert_eq!(parse_byte_token("0x41"), None);
    }
}
