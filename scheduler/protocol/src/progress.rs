//! How far a generation job got: what a runner records when it hands a job back (the owner
//! returned, it shut down), and what the scheduler rebuilds from the job's stream when a
//! runner died without handing back. The next runner continues from it: it prefills the
//! prompt and these tokens and replays them through its sampler, grammar and stop matchers.

use serde::{Deserialize, Serialize};

use crate::job::{FinishReason, JobEvent, TokenLogprob, Usage};
use crate::position::StreamPositions;

/// A generation job's progress: enough for another runner to continue exactly where it
/// stopped.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    /// The prompt as the first attempt tokenized it: a template may render differently on
    /// another runner (dates), and the continuation must extend the same tokens. Empty when
    /// rebuilt from a stream (which does not carry it): the next runner tokenizes the
    /// prompt again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prompt_ids: Vec<u32>,
    /// One entry per choice, in index order.
    pub choices: Vec<ChoiceProgress>,
    /// Usage so far, over all choices.
    pub usage: Usage,
}

/// One choice's progress: the tokens generated so far and what the client has of them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChoiceProgress {
    /// Every token generated so far, including any whose text is still held back (a
    /// possible stop string, half a UTF-8 character).
    pub token_ids: Vec<u32>,
    /// The text sent so far.
    pub text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Vec<TokenLogprob>>,
    /// Set when the choice had finished: it is not run again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish: Option<FinishReason>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matched_stop: Option<serde_json::Value>,
}

impl Progress {
    /// Tokens generated so far, over all choices.
    pub fn generated(&self) -> usize {
        self.choices.iter().map(|c| c.token_ids.len()).sum()
    }

    /// Whether every choice had finished: there is nothing left to continue.
    pub fn finished(&self) -> bool {
        self.choices.iter().all(|c| c.finish.is_some())
    }

    /// The progress of a job with `n` choices, from its stream's events in order: the last
    /// attempt that started over, then every attempt that continued it. A choice's deltas
    /// after a hole in the stream are left out. `None` when the
    /// stream cannot tell (it does not begin with a start, as when it was trimmed; a delta
    /// carries text but no token ids; it ended), or nothing was generated. A stream rebuilt
    /// this way gives no `prompt_ids` and no `matched_stop` (deltas carry neither).
    pub fn from_events<'a>(
        n: usize,
        events: impl IntoIterator<Item = &'a JobEvent>,
    ) -> Option<Progress> {
        let mut progress: Option<Progress> = None;
        let mut positions = StreamPositions::new(n);
        let mut last_attempt = None;
        for event in events {
            match event {
                JobEvent::Started {
                    attempt, continues, ..
                } => {
                    // The same attempt's start again is an append its runner retried.
                    let again = last_attempt.replace(*attempt) == Some(*attempt);
                    if again {
                        continue;
                    }
                    if !continues || progress.is_none() {
                        if *continues {
                            return None; // what it continued was trimmed away
                        }
                        progress = Some(Progress {
                            choices: vec![ChoiceProgress::default(); n],
                            ..Progress::default()
                        });
                        positions.restart();
                    }
                }
                JobEvent::Delta {
                    index,
                    text,
                    token_ids,
                    logprobs,
                    finish_reason,
                    usage,
                    at,
                } => {
                    let progress = progress.as_mut()?;
                    let choice = progress.choices.get_mut(*index as usize)?;
                    if token_ids.is_empty() && !text.is_empty() {
                        return None; // written by a runner that did not record tokens
                    }
                    if !positions.admit(*index, *at, token_ids.len(), text.len()) {
                        // Entries are missing before it: the choice continues from the
                        // hole, as a reader of the stream stopped there too.
                        continue;
                    }
                    choice.token_ids.extend_from_slice(token_ids);
                    choice.text.push_str(text);
                    if let Some(new) = logprobs {
                        choice
                            .logprobs
                            .get_or_insert_with(Vec::new)
                            .extend(new.iter().cloned());
                    }
                    if finish_reason.is_some() {
                        choice.finish = *finish_reason;
                    }
                    progress.usage.prompt_tokens = usage.prompt_tokens;
                    progress.usage.cached_tokens = usage.cached_tokens;
                }
                JobEvent::Final { .. } | JobEvent::Error { .. } => return None,
            }
        }
        let mut progress = progress?;
        let generated = progress.generated();
        if generated == 0 || progress.finished() {
            return None;
        }
        // Counted from the tokens themselves: a delta's usage may already count tokens of
        // its step whose deltas never reached the stream.
        progress.usage.completion_tokens = u32::try_from(generated).ok()?;
        Some(progress)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn started(attempt: i32, continues: bool) -> JobEvent {
        JobEvent::Started {
            attempt,
            prompt_text: None,
            continues,
        }
    }

    fn delta(index: u32, text: &str, ids: &[u32]) -> JobEvent {
        JobEvent::Delta {
            index,
            text: text.into(),
            token_ids: ids.to_vec(),
            logprobs: None,
            finish_reason: None,
            usage: Usage {
                prompt_tokens: 9,
                completion_tokens: 99,
                cached_tokens: 0,
            },
            at: None,
        }
    }

    /// A delta that says where its choice stood: `tokens` and `bytes` before it.
    fn delta_at(index: u32, text: &str, ids: &[u32], tokens: u32, bytes: u64) -> JobEvent {
        let mut event = delta(index, text, ids);
        if let JobEvent::Delta { at, .. } = &mut event {
            *at = Some(crate::position::ChoicePosition { tokens, bytes });
        }
        event
    }

    #[test]
    fn a_choice_continues_from_before_a_hole_in_its_stream() {
        let events = [
            started(1, false),
            delta_at(0, "He", &[1], 0, 0),
            // Lost: delta_at(0, "ll", &[2], 1, 2).
            delta_at(0, "o", &[3], 2, 4),
            delta_at(1, "x", &[9], 0, 0),
        ];
        let p = Progress::from_events(2, &events).expect("progress");
        assert_eq!(p.choices[0].text, "He", "nothing after the hole");
        assert_eq!(p.choices[0].token_ids, [1]);
        assert_eq!(p.choices[1].text, "x", "the other choice is whole");
        assert_eq!(p.usage.completion_tokens, 2);
    }

    #[test]
    fn an_append_its_runner_retried_counts_once() {
        let events = [
            started(1, false),
            delta_at(0, "He", &[1], 0, 0),
            // Appends that timed out after they landed, sent again.
            started(1, false),
            delta_at(0, "llo", &[2], 1, 2),
            delta_at(0, "llo", &[2], 1, 2),
        ];
        let p = Progress::from_events(1, &events).expect("progress");
        assert_eq!(p.choices[0].text, "Hello");
        assert_eq!(p.choices[0].token_ids, [1, 2]);
    }

    #[test]
    fn a_stream_folds_into_each_choices_tokens_and_text() {
        let events = [
            started(1, false),
            delta(0, "He", &[1]),
            delta(1, "", &[7]),
            delta(0, "llo", &[2, 3]),
        ];
        let p = Progress::from_events(2, &events).expect("progress");
        assert_eq!(p.choices[0].token_ids, [1, 2, 3]);
        assert_eq!(p.choices[0].text, "Hello");
        assert_eq!(p.choices[1].token_ids, [7]);
        assert_eq!(p.choices[1].text, "", "held-back text stays held back");
        assert_eq!(p.usage.prompt_tokens, 9);
        assert_eq!(p.usage.completion_tokens, 4, "counted from the tokens");
        assert!(p.prompt_ids.is_empty());
    }

    #[test]
    fn a_continuing_attempt_extends_and_a_restart_starts_over() {
        let continued = [
            started(1, false),
            delta(0, "a", &[1]),
            started(2, true),
            delta(0, "b", &[2]),
        ];
        let p = Progress::from_events(1, &continued).expect("progress");
        assert_eq!(
            (p.choices[0].text.as_str(), p.choices[0].token_ids.len()),
            ("ab", 2)
        );

        let restarted = [
            started(1, false),
            delta(0, "a", &[1]),
            started(2, false),
            delta(0, "x", &[5]),
        ];
        let p = Progress::from_events(1, &restarted).expect("progress");
        assert_eq!(p.choices[0].text, "x");
    }

    #[test]
    fn a_stream_that_cannot_tell_gives_none() {
        let trimmed = [delta(0, "a", &[1])];
        assert_eq!(Progress::from_events(1, &trimmed), None);
        let orphan = [started(2, true), delta(0, "a", &[1])];
        assert_eq!(Progress::from_events(1, &orphan), None);
        let untracked = [started(1, false), delta(0, "a", &[])];
        assert_eq!(Progress::from_events(1, &untracked), None);
        let nothing = [started(1, false)];
        assert_eq!(Progress::from_events(1, &nothing), None);
        let out_of_range = [started(1, false), delta(3, "a", &[1])];
        assert_eq!(Progress::from_events(1, &out_of_range), None);
        let ended = [
            started(1, false),
            delta(0, "a", &[1]),
            JobEvent::Error {
                code: "x".into(),
                message: "y".into(),
            },
        ];
        assert_eq!(Progress::from_events(1, &ended), None);
    }
}
