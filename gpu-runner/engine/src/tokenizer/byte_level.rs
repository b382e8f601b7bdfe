//! The GPT-2 byte-level alphabet: every byte is written as one printable unicode character so
//! that byte-level BPE vocabularies can be stored as text. Needed to turn a vocabulary entry
//! such as `"Ġhello"` back into the bytes `b" hello"`.

use std::sync::LazyLock;

/// All alphabet characters are below this code point (the shifted bytes end at U+0143).
const CHAR_LIMIT: usize = 0x200;

struct Alphabet {
    byte_to_char: [char; 256],
    /// Indexed by code point; `None` for characters outside the alphabet.
    char_to_byte: [Option<u8>; CHAR_LIMIT],
}

static ALPHABET: LazyLock<Alphabet> = LazyLock::new(build_alphabet);

/// Printable bytes map to themselves; the rest are shifted to U+0100 onwards, in byte order.
fn build_alphabet() -> Alphabet {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut byte_to_char = ['\0'; 256];
    let mut char_to_byte = [None; CHAR_LIMIT];
    let mut shifted = 0u32;
    for b in 0..=255u8 {
        let code = if printable(b) {
            u32::from(b)
        } else {
            shifted += 1;
            0x100 + shifted - 1
        };
        // Every code here is below 0x200, so it is a valid scalar value.
        let c = char::from_u32(code).unwrap_or('\0');
        byte_to_char[usize::from(b)] = c;
        char_to_byte[code as usize] = Some(b);
    }
    Alphabet {
        byte_to_char,
        char_to_byte,
    }
}

/// The alphabet character standing for `byte`.
pub fn byte_to_char(byte: u8) -> char {
    ALPHABET.byte_to_char[usize::from(byte)]
}

/// The byte a character of the alphabet stands for, `None` for other characters.
pub fn char_to_byte(c: char) -> Option<u8> {
    ALPHABET.char_to_byte.get(c as usize).copied().flatten()
}

/// Decodes a byte-level vocabulary entry to raw bytes. Characters outside the alphabet (which
/// a well-formed vocabulary does not contain) are kept as their own UTF-8 bytes.
pub fn decode_token(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for c in text.chars() {
        match char_to_byte(c) {
            Some(b) => out.push(b),
            None => out.extend_from_slice(c.encode_utf8(&mut [0u8; 4]).as_bytes()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_round_trips_through_the_alphabet() {
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(byte_to_char(b)), Some(b));
        }
    }

    #[test]
    fn space_and_newline_use_the_gpt2_characters() {
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        assert_eq!(decode_token("Ġhello"), b" hello");
    }
}
