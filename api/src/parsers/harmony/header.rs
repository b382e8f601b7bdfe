//! A harmony message header: what comes between `<|start|>` (or a bare `<|channel|>`) and
//! `<|message|>`, e.g. `assistant<|channel|>analysis` or
//! `<|channel|>commentary to=functions.get_weather <|constrain|>json`. The recipient may
//! also stand before the channel (`assistant to=functions.get_weather<|channel|>commentary
//! json`), as gpt-oss's chat template writes earlier calls.

use super::{CHANNEL, CONSTRAIN};

/// The longest header read as one: a model that never writes `<|message|>` has not written
/// a header, and its text is given back as content.
pub const MAX_HEADER: usize = 256;

/// What a header says about the message after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// Who writes the message: the word after `<|start|>` (`None` for a bare channel, which
    /// continues the assistant's turn).
    pub author: Option<String>,
    /// `analysis`, `commentary`, `final`, … (`None` when the header names none).
    pub channel: Option<String>,
    /// The `to=` recipient, as written (`functions.get_weather`).
    pub recipient: Option<String>,
}

impl Header {
    /// Reads a header's text (without its `<|message|>`).
    pub fn parse(raw: &str) -> Header {
        let channel = raw.rfind(CHANNEL).and_then(|at| {
            words(&raw[at + CHANNEL.len()..])
                .next()
                .filter(|w| !w.starts_with("to="))
                .map(str::to_owned)
        });
        let recipient = words(raw)
            .find_map(|w| w.strip_prefix("to="))
            .filter(|r| !r.is_empty())
            .map(str::to_owned);
        let author = raw
            .strip_prefix(super::START)
            .and_then(|rest| words(rest).next())
            .filter(|w| !w.starts_with("to="))
            .map(str::to_owned);
        Header {
            author,
            channel,
            recipient,
        }
    }

    /// The function a message of the assistant addressed to `functions.NAME` calls; any
    /// other recipient (a built-in tool such as `browser.search`) is named as written. A
    /// message by anyone else (a tool's answer the model went on to imagine) calls nothing.
    pub fn function(&self) -> Option<&str> {
        if self.author.as_deref().is_some_and(|a| a != "assistant") {
            return None;
        }
        self.recipient
            .as_deref()
            .map(|r| r.strip_prefix("functions.").unwrap_or(r))
    }
}

/// Whether `raw`, a header still being read, may yet become one.
pub fn may_continue(raw: &str) -> bool {
    raw.len() <= MAX_HEADER && !raw.contains('\n')
}

/// The words of a header: its special tokens separate words as whitespace does.
fn words(raw: &str) -> impl Iterator<Item = &str> {
    raw.split(CHANNEL)
        .flat_map(|part| part.split(CONSTRAIN))
        .flat_map(|part| part.split(super::START))
        .flat_map(str::split_whitespace)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(author: Option<&str>, channel: Option<&str>, recipient: Option<&str>) -> Header {
        Header {
            author: author.map(str::to_owned),
            channel: channel.map(str::to_owned),
            recipient: recipient.map(str::to_owned),
        }
    }

    #[test]
    fn the_channel_and_the_recipient_are_read_wherever_the_recipient_stands() {
        assert_eq!(
            Header::parse("<|channel|>analysis"),
            header(None, Some("analysis"), None)
        );
        assert_eq!(
            Header::parse("<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"),
            header(
                Some("assistant"),
                Some("commentary"),
                Some("functions.get_weather")
            )
        );
        assert_eq!(
            Header::parse("<|start|>assistant to=functions.f<|channel|>commentary json"),
            header(Some("assistant"), Some("commentary"), Some("functions.f"))
        );
    }

    #[test]
    fn a_header_without_a_channel_has_none_and_a_bare_recipient_is_kept() {
        let parsed = Header::parse("<|start|>assistant to=browser.search");
        assert_eq!(
            parsed,
            header(Some("assistant"), None, Some("browser.search"))
        );
        assert_eq!(parsed.function(), Some("browser.search"));
        assert_eq!(
            Header::parse("<|channel|>commentary to=functions.f").function(),
            Some("f")
        );
    }

    #[test]
    fn a_message_written_by_a_tool_calls_nothing() {
        let answer =
            Header::parse("<|start|>functions.get_weather to=assistant<|channel|>commentary");
        assert_eq!(answer.author.as_deref(), Some("functions.get_weather"));
        assert_eq!(answer.function(), None);
    }
}
