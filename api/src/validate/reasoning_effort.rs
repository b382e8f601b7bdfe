//! `reasoning_effort` for a model that writes harmony (gpt-oss). Its template writes the
//! effort into the system message as `Reasoning: …`, and harmony knows three: `low`,
//! `medium` and `high`. OpenAI's other efforts (`none`, `minimal`, `xhigh`) become the
//! nearest of those, rather than words the model was never trained on; anything else is
//! refused.

use crate::error::ApiError;

/// The harmony effort for a client's `reasoning_effort`.
pub(super) fn harmony_effort(effort: &str) -> Result<&'static str, ApiError> {
    match effort {
        "none" | "minimal" | "low" => Ok("low"),
        "medium" => Ok("medium"),
        "high" | "xhigh" => Ok("high"),
        other => Err(ApiError::invalid(
            "reasoning_effort",
            format!(
                "`reasoning_effort` must be `none`, `minimal`, `low`, `medium`, `high` or \
                 `xhigh` for this model (harmony reasons at `low`, `medium` or `high`), got \
                 `{other}`."
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::harmony_effort;

    #[test]
    fn openai_efforts_map_to_the_nearest_of_harmonys_three() {
        for (asked, written) in [
            ("none", "low"),
            ("minimal", "low"),
            ("low", "low"),
            ("medium", "medium"),
            ("high", "high"),
            ("xhigh", "high"),
        ] {
            assert_eq!(harmony_effort(asked).ok(), Some(written), "{asked}");
        }
    }

    #[test]
    fn an_unknown_effort_is_refused_naming_the_parameter() {
        let err = harmony_effort("extreme").err().map(|e| format!("{e:?}"));
        let err = err.unwrap_or_default();
        assert!(
            err.contains("reasoning_effort") && err.contains("extreme"),
            "{err}"
        );
    }
}
