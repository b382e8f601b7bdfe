//! Finding fixed markers (`<tool_call>`, `</think>`, …) in text that arrives in arbitrary
//! pieces. A marker split across two deltas must be found all the same, so the text that
//! could still become a marker is held back until the next character decides.

/// What one character did to the watch.
#[derive(Debug, PartialEq, Eq)]
pub enum Watch {
    /// No marker (yet); `released` text is certainly not part of one.
    Text,
    /// The marker with this index into the watched list just completed.
    Matched(usize),
}

/// Holds the longest tail of the text seen that is a prefix of a watched marker.
#[derive(Debug, Default)]
pub struct MarkerWatch {
    pending: String,
}

impl MarkerWatch {
    /// Feeds one character; text that can no longer start a marker is appended to
    /// `released`.
    pub fn push(&mut self, c: char, markers: &[&str], released: &mut String) -> Watch {
        self.pending.push(c);
        if let Some(i) = markers.iter().position(|m| *m == self.pending) {
            self.pending.clear();
            return Watch::Matched(i);
        }
        // Keep the longest suffix that may still grow into a marker; release the rest.
        let keep_from = self
            .pending
            .char_indices()
            .map(|(at, _)| at)
            .find(|&at| {
                let tail = &self.pending[at..];
                markers.iter().any(|m| m.starts_with(tail))
            })
            .unwrap_or(self.pending.len());
        released.push_str(&self.pending[..keep_from]);
        self.pending.drain(..keep_from);
        Watch::Text
    }

    /// The held text, at the end of the output (it never became a marker).
    pub fn take(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }

    /// Whether text is being held back.
    pub fn is_holding(&self) -> bool {
        !self.pending.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(text: &str, markers: &[&str]) -> (String, Vec<usize>) {
        let mut watch = MarkerWatch::default();
        let mut out = String::new();
        let mut hits = Vec::new();
        for c in text.chars() {
            if let Watch::Matched(i) = watch.push(c, markers, &mut out) {
                hits.push(i);
                out.push('|');
            }
        }
        out.push_str(&watch.take());
        (out, hits)
    }

    #[test]
    fn a_marker_is_found_and_removed_from_the_text() {
        assert_eq!(run("ab<x>cd", &["<x>"]), ("ab|cd".to_string(), vec![0]));
    }

    #[test]
    fn a_false_start_is_released_as_text() {
        assert_eq!(run("a<<x>b<y", &["<x>"]), ("a<|b<y".to_string(), vec![0]));
    }

    #[test]
    fn several_markers_are_told_apart() {
        assert_eq!(run("</t><t>", &["<t>", "</t>"]).1, vec![1, 0]);
    }
}
