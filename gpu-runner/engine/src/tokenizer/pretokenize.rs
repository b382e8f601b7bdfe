//! Which regular expressions split text into words before byte-level BPE, chosen by the
//! GGUF `tokenizer.ggml.pre` name. The table follows llama.cpp's `llm_tokenizer_bpe`, because
//! token ids must equal the ones llama.cpp (and the model's training tokenizer) produce.
//! The expressions are applied in order, each splitting the pieces left by the previous one,
//! and text between matches is kept as its own piece.

use super::error::TokenizerError;

/// How a byte-level BPE vocabulary pre-tokenizes text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreTokenization {
    pub regexes: Vec<&'static str>,
    /// Llama 3 style: a word that is already a whole token skips the merges.
    pub ignore_merges: bool,
}

const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";

const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

// Cased-letter ranges. Characters that Unicode normalization would rewrite (U+1F7D, U+1FBE,
// U+1FD3, U+1FDB, U+2126 Ohm, U+212A Kelvin) are escaped so the ranges survive copy and paste.
const DEEPSEEK_LLM_LETTERS: &str = r"\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-\x{1F7D}ᾀ-ᾴᾶ-ᾼ\x{1FBE}ῂ-ῄῆ-ῌῐ-\x{1FD3}ῖ-\x{1FDB}ῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\x{2126}ℨ\x{212A}-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+";

const DEEPSEEK3: &str = r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##;

const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

const O200K: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

const SEED_CODER: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+";

const BAILINGMOE: &str = r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+";

const BLOOM: &str = r" ?[^(\s|.,!?…。，、।۔،)]+";

impl PreTokenization {
    /// The pre-tokenization for a `tokenizer.ggml.pre` value; a missing value means llama.cpp's
    /// "default" (old conversions that predate the key).
    pub fn for_pre(pre: Option<&str>) -> Result<Self, TokenizerError> {
        let plain = |regexes: Vec<&'static str>| Self {
            regexes,
            ignore_merges: false,
        };
        let name = pre.unwrap_or("default");
        Ok(match name {
            "default" => plain(vec![
                r"[\p{P}\$\+<=>\^~\|]+",
                GPT2,
                r"\p{N}+",
                "[0-9][0-9][0-9]",
            ]),
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "tekken" => Self {
                regexes: vec![if name == "tekken" { TEKKEN } else { LLAMA3 }],
                ignore_merges: true,
            },
            "dbrx" | "smaug-bpe" | "chatglm-bpe" => plain(vec![LLAMA3]),
            "qwen2" | "stablelm2" | "megrez" | "grok-2" => plain(vec![QWEN2]),
            "gpt-4o" | "llama4" | "minimax-m2" => plain(vec![O200K]),
            "seed-coder" => plain(vec![SEED_CODER]),
            "bailingmoe" | "bailingmoe2" | "llada-moe" => plain(vec![BAILINGMOE]),
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone"
            | "minerva-7b" => plain(vec![r"\p{N}", GPT2]),
            "gpt-2" | "gpt2" | "phi-2" | "mpt" | "olmo" | "jais" | "jina-es" | "jina-de"
            | "gigachat" | "jina-v1-en" | "jina-v2-es" | "jina-v2-de" | "jina-v2-code"
            | "roberta-bpe" | "exaone4" => plain(vec![GPT2]),
            "falcon" => plain(vec![r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]"]),
            "deepseek-llm" => plain(vec![
                r"[\r\n]",
                DEEPSEEK_LLM_LETTERS,
                r"\s?[!-/:-~！-／：-～‘-‟　-。]+",
                r"\s+$",
                r"[一-龥ࠀ-一가-퟿]+",
                r"\p{N}+",
            ]),
            "deepseek-coder" => plain(vec![
                r"[\r\n]",
                r"\s?\p{L}+",
                r"\s?\p{P}+",
                r"[一-龥ࠀ-一가-퟿]+",
                r"\p{N}",
            ]),
            "deepseek-v3" => plain(vec![r"\p{N}{1,3}", r"[一-龥぀-ゟ゠-ヿ]+", DEEPSEEK3]),
            "poro-chat" | "bloom" | "gpt3-finnish" => plain(vec![BLOOM]),
            "viking" => plain(vec![BLOOM, r"\p{N}"]),
            other => return Err(TokenizerError::UnknownPreTokenizer(other.to_string())),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
    use tokenizers::SplitDelimiterBehavior;

    #[test]
    fn smollm_isolates_digits_before_the_gpt2_split() {
        let p = PreTokenization::for_pre(Some("smollm")).unwrap();
        assert_eq!(p.regexes, vec![r"\p{N}", GPT2]);
        assert!(!p.ignore_merges);
    }

    #[test]
    fn llama3_ignores_merges_for_whole_words() {
        assert!(
            PreTokenization::for_pre(Some("llama-bpe"))
                .unwrap()
                .ignore_merges
        );
    }

    #[test]
    fn a_missing_pre_name_means_the_default_split() {
        assert_eq!(PreTokenization::for_pre(None).unwrap().regexes.len(), 4);
    }

    #[test]
    fn every_known_pre_name_has_regexes_that_compile() {
        let names = [
            "default",
            "llama-bpe",
            "tekken",
            "dbrx",
            "qwen2",
            "gpt-4o",
            "seed-coder",
            "bailingmoe",
            "smollm",
            "gpt-2",
            "falcon",
            "deepseek-llm",
            "deepseek-coder",
            "deepseek-v3",
            "bloom",
            "viking",
        ];
        for name in names {
            for regex in PreTokenization::for_pre(Some(name)).unwrap().regexes {
                let pattern = SplitPattern::Regex(regex.to_string());
                let split = Split::new(pattern, SplitDelimiterBehavior::Isolated, false);
                assert!(split.is_ok(), "{name}: {regex}");
            }
        }
    }

    #[test]
    fn an_unknown_pre_name_is_an_error() {
        assert!(matches!(
            PreTokenization::for_pre(Some("nonsense")),
            Err(TokenizerError::UnknownPreTokenizer(_))
        ));
    }
}
