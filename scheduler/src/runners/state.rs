//! The states a runner's registry row can be in, as one type instead of strings checked at
//! run time: a misspelt state is a compile error, not a failed update.
//!
//! The column stays `text` with a `CHECK` (see `migrations/0003_runner_drained.sql`): the
//! enum reads and writes the same lowercase words, and so does its JSON, so the admin API
//! and the dashboard see exactly what they saw when the state was a string.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Who may set which state is described in `runners.rs`: the operator sets `Active`
/// (resume), `Cordoned` and `Draining`; the runner moves `Draining → Drained` and
/// `Active ⇄ Yielded`; the maintenance loop sets `Dead`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, sqlx::Type)]
#[serde(rename_all = "lowercase")]
#[sqlx(type_name = "text", rename_all = "lowercase")]
pub enum RunnerState {
    /// Claims work (while its owner lends the machine).
    Active,
    /// Taken out by the operator: finishes what it holds, claims nothing new.
    Cordoned,
    /// The operator asked it to finish its work and stop claiming; it reports `Drained`.
    Draining,
    /// A drain with nothing left in flight: safe to stop.
    Drained,
    /// Its owner (or its pool's share) has the machine back for now.
    Yielded,
    /// Silent for longer than [`LIVENESS_WINDOW`](super::LIVENESS_WINDOW); its jobs were
    /// requeued. A heartbeat makes it `Active` again.
    Dead,
}

impl RunnerState {
    /// Every state, in the order operators read them (the `fallow:runners` gauge).
    pub const ALL: [RunnerState; 6] = [
        RunnerState::Active,
        RunnerState::Cordoned,
        RunnerState::Draining,
        RunnerState::Drained,
        RunnerState::Yielded,
        RunnerState::Dead,
    ];

    /// The word stored in `runners.state` and shown in JSON.
    pub const fn as_str(self) -> &'static str {
        match self {
            RunnerState::Active => "active",
            RunnerState::Cordoned => "cordoned",
            RunnerState::Draining => "draining",
            RunnerState::Drained => "drained",
            RunnerState::Yielded => "yielded",
            RunnerState::Dead => "dead",
        }
    }
}

impl fmt::Display for RunnerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A word that names no runner state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownRunnerState(pub String);

impl fmt::Display for UnknownRunnerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown runner state {:?}; expected one of ", self.0)?;
        for (i, state) in RunnerState::ALL.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            write!(f, "{sep}{state}")?;
        }
        Ok(())
    }
}

impl std::error::Error for UnknownRunnerState {}

impl FromStr for RunnerState {
    type Err = UnknownRunnerState;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        RunnerState::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| UnknownRunnerState(s.to_owned()))
    }
}

/// Compares with the stored word, so code and tests that hold a state as text (a log line,
/// a JSON value) can check it without parsing first.
impl PartialEq<str> for RunnerState {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for RunnerState {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_round_trips_through_its_word_and_its_json() {
        for state in RunnerState::ALL {
            let word = state.as_str();
            assert_eq!(state.to_string(), word);
            assert_eq!(word.parse::<RunnerState>(), Ok(state));
            let json = serde_json::to_value(state).unwrap();
            assert_eq!(json, serde_json::Value::String(word.to_owned()));
            assert_eq!(serde_json::from_value::<RunnerState>(json).unwrap(), state);
        }
        let words: Vec<&str> = RunnerState::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(
            words,
            ["active", "cordoned", "draining", "drained", "yielded", "dead"],
            "the words the migrations' CHECK allows"
        );
    }

    #[test]
    fn an_unknown_word_is_refused() {
        for word in ["bogus", "", "Active", "ACTIVE", " active", "dead "] {
            let err = word.parse::<RunnerState>().unwrap_err();
            assert_eq!(err, UnknownRunnerState(word.to_owned()));
            assert_eq!(
                err.to_string(),
                format!(
                    "unknown runner state {word:?}; expected one of active, cordoned, \
                     draining, drained, yielded, dead"
                )
            );
        }
        assert!(serde_json::from_str::<RunnerState>("\"bogus\"").is_err());
    }
}
