//! Where each choice of a job stands in its stream, so that a reader can tell a delta that
//! follows on from one after missing entries (Redis lost some, or a trim). Every delta says
//! where its choice stood before it ([`ChoicePosition`]); a reader admits it only when that
//! is where the reader's own count stands. A choice with a hole is then read no further:
//! its final record brings the rest in one piece, or a continuation picks up from the last
//! admitted delta, which is where its progress was rebuilt from.

use serde::{Deserialize, Serialize};

/// A choice's tokens and text bytes so far, over every attempt.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChoicePosition {
    pub tokens: u32,
    pub bytes: u64,
}

impl ChoicePosition {
    /// The position after `tokens` more tokens and `bytes` more text.
    pub fn advanced(self, tokens: usize, bytes: usize) -> Self {
        ChoicePosition {
            tokens: self
                .tokens
                .saturating_add(u32::try_from(tokens).unwrap_or(u32::MAX)),
            bytes: self
                .bytes
                .saturating_add(u64::try_from(bytes).unwrap_or(u64::MAX)),
        }
    }
}

/// A stream reader's count, per choice.
#[derive(Debug, Clone, Default)]
pub struct StreamPositions {
    choices: Vec<ChoicePosition>,
}

impl StreamPositions {
    pub fn new(n: usize) -> Self {
        StreamPositions {
            choices: vec![ChoicePosition::default(); n],
        }
    }

    /// Whether the delta of choice `index` that stood at `at` and carries `tokens` and
    /// `bytes` follows on from what was read; if so it is counted. A delta without a
    /// position (written before deltas had one) is taken on trust.
    pub fn admit(
        &mut self,
        index: u32,
        at: Option<ChoicePosition>,
        tokens: usize,
        bytes: usize,
    ) -> bool {
        let Some(position) = self.choices.get_mut(index as usize) else {
            return false;
        };
        if at.is_some_and(|at| at != *position) {
            return false;
        }
        *position = position.advanced(tokens, bytes);
        true
    }

    /// An attempt starts over: nothing of an earlier one counts.
    pub fn restart(&mut self) {
        self.choices.fill(ChoicePosition::default());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(tokens: u32, bytes: u64) -> Option<ChoicePosition> {
        Some(ChoicePosition { tokens, bytes })
    }

    #[test]
    fn deltas_that_follow_on_are_admitted_and_counted() {
        let mut read = StreamPositions::new(2);
        assert!(read.admit(0, at(0, 0), 2, 5));
        assert!(read.admit(1, at(0, 0), 1, 1));
        assert!(
            read.admit(0, at(2, 5), 1, 0),
            "a held-back token has no text"
        );
        assert!(read.admit(0, at(3, 5), 1, 3));
    }

    #[test]
    fn a_delta_after_a_hole_is_refused_and_so_is_the_rest_of_that_choice() {
        let mut read = StreamPositions::new(2);
        assert!(read.admit(0, at(0, 0), 2, 5));
        // The delta at (2, 5) was lost.
        assert!(!read.admit(0, at(3, 8), 1, 2));
        assert!(!read.admit(0, at(4, 10), 1, 2));
        assert!(read.admit(1, at(0, 0), 1, 1), "the other choice reads on");
    }

    #[test]
    fn a_continuation_from_the_last_admitted_delta_is_read_again() {
        let mut read = StreamPositions::new(1);
        assert!(read.admit(0, at(0, 0), 2, 5));
        assert!(!read.admit(0, at(3, 8), 1, 2));
        // The next attempt continued from the progress rebuilt up to the hole.
        assert!(read.admit(0, at(2, 5), 1, 3));
    }

    #[test]
    fn deltas_without_a_position_are_taken_on_trust_and_unknown_choices_refused() {
        let mut read = StreamPositions::new(1);
        assert!(read.admit(0, None, 2, 5));
        assert!(read.admit(0, at(2, 5), 1, 1));
        assert!(!read.admit(1, None, 1, 1));
    }

    #[test]
    fn an_attempt_that_starts_over_is_read_from_zero() {
        let mut read = StreamPositions::new(1);
        assert!(read.admit(0, at(0, 0), 2, 5));
        read.restart();
        assert!(read.admit(0, at(0, 0), 1, 1));
    }
}
