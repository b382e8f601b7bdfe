//! `stop_regex`: a choice stops when its generated text matches one of the request's
//! regexes (SGLang's parameter), with `finish_reason: stop` and the pattern as
//! `matched_stop`.
//!
//! Unlike a stop string, a regex match cannot be foreseen (`a+b` may match a text of any
//! length), so text is never held back for it: the match is removed from the output as
//! far as it had not been streamed yet, i.e. from the token that completed it. Text that
//! was already released stays released, so streamed and non-streamed output agree.
//! Matches are looked for in the last [`WINDOW`] bytes, which bounds the cost per token.

use std::sync::Arc;

use regex::Regex;

/// How much recent text a match may span.
pub const WINDOW: usize = 4096;

/// Compiled `stop_regex` patterns, shared by the choices of a request.
#[derive(Debug, Clone, Default)]
pub struct StopRegexes {
    patterns: Arc<[Regex]>,
}

impl StopRegexes {
    /// Fails with the offending pattern's error.
    pub fn compile(patterns: &[String]) -> Result<Self, String> {
        let patterns = patterns
            .iter()
            .map(|p| Regex::new(p).map_err(|e| format!("stop_regex {p:?}: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(StopRegexes {
            patterns: patterns.into(),
        })
    }

    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }
}

/// One choice's recent text, searched for the patterns.
#[derive(Debug, Clone, Default)]
pub struct RegexStop {
    regexes: StopRegexes,
    /// The last released text (at most about [`WINDOW`] bytes).
    recent: String,
}

/// A match: keep this many bytes of the new text; the pattern that matched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegexMatch {
    pub keep: usize,
    pub pattern: String,
}

impl RegexStop {
    pub fn new(regexes: StopRegexes) -> Self {
        RegexStop {
            regexes,
            recent: String::new(),
        }
    }

    /// Adds newly released text; with `allow_match` (past `min_tokens`), reports the
    /// earliest match that reaches into it.
    pub fn push(&mut self, delta: &str, allow_match: bool) -> Option<RegexMatch> {
        if self.regexes.is_empty() || delta.is_empty() {
            return None;
        }
        let before = self.recent.len();
        self.recent.push_str(delta);
        let found = if allow_match {
            self.earliest_match_ending_after(before)
        } else {
            None
        };
        if found.is_none() && self.recent.len() > WINDOW {
            let mut cut = self.recent.len() - WINDOW;
            while !self.recent.is_char_boundary(cut) {
                cut += 1;
            }
            self.recent.replace_range(..cut, "");
        }
        found.map(|(start, index)| RegexMatch {
            keep: start.saturating_sub(before).min(delta.len()),
            pattern: self.regexes.patterns[index].as_str().to_string(),
        })
    }

    /// The earliest `(start, pattern index)` among matches that end in the new text (an
    /// empty match counts only if it is in the new text).
    fn earliest_match_ending_after(&self, before: usize) -> Option<(usize, usize)> {
        self.regexes
            .patterns
            .iter()
            .enumerate()
            .filter_map(|(index, re)| {
                re.find_iter(&self.recent)
                    .find(|m| m.end() > before || (m.is_empty() && m.start() >= before))
                    .map(|m| (m.start(), index))
            })
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stopper(patterns: &[&str]) -> RegexStop {
        let patterns: Vec<String> = patterns.iter().map(|p| p.to_string()).collect();
        RegexStop::new(StopRegexes::compile(&patterns).unwrap())
    }

    #[test]
    fn a_match_spanning_tokens_stops_and_drops_the_unstreamed_part() {
        let mut stop = stopper(&[r"END\d+"]);
        assert_eq!(stop.push("hello E", true), None);
        assert_eq!(stop.push("ND", true), None);
        let m = stop.push("42 more", true).unwrap();
        // "hello E" and "ND" were released; nothing of "42 more" is kept.
        assert_eq!(m.keep, 0);
        assert_eq!(m.pattern, r"END\d+");
    }

    #[test]
    fn text_before_a_match_in_the_same_delta_is_kept() {
        let mut stop = stopper(&["\n\n"]);
        let m = stop.push("answer: 4\n\nmore", true).unwrap();
        assert_eq!(m.keep, "answer: 4".len());
    }

    #[test]
    fn nothing_matches_before_min_tokens() {
        let mut stop = stopper(&["x"]);
        assert_eq!(stop.push("x", false), None);
        // The earlier x does not count later; a new one does.
        assert_eq!(stop.push("y", true), None);
        assert!(stop.push("x", true).is_some());
    }

    #[test]
    fn an_invalid_pattern_is_refused_by_name() {
        let err = StopRegexes::compile(&["(a".to_string()]).unwrap_err();
        assert!(err.contains("(a"), "{err}");
    }

    #[test]
    fn the_window_keeps_memory_bounded() {
        let mut stop = stopper(&["never-matches-zzz"]);
        for _ in 0..1000 {
            stop.push("0123456789", true);
        }
        assert!(stop.recent.len() <= WINDOW + 10);
    }
}
