//! What a chat template tells about the model's output syntax: how it writes tool calls and
//! whether it reasons in `<think>` blocks, or speaks harmony (gpt-oss), whose channels carry
//! both. The api parses the output by these names (runners publish them with their models);
//! a model's configuration may override them.

/// The parser name of OpenAI's harmony format, for tool calls and reasoning alike.
pub const HARMONY: &str = "harmony";

/// The marker only harmony templates write: every message names its channel.
const HARMONY_CHANNEL: &str = "<|channel|>";

/// The output syntaxes a template reveals; `None` where it reveals nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutputSyntax {
    /// `hermes`, `llama3_json`, `mistral` or `harmony`.
    pub tool_parser: Option<String>,
    /// `qwen3` (the model opens `<think>` itself), `deepseek_r1` (the generation prompt
    /// already opened it) or `harmony` (the `analysis` channel).
    pub reasoning_parser: Option<String>,
}

impl OutputSyntax {
    /// Reads the syntaxes off a template's source.
    pub fn detect(template: &str) -> Self {
        if template.contains(HARMONY_CHANNEL) {
            // Harmony (gpt-oss): reasoning and calls are messages on channels, read by one
            // parser that the api knows under this name for both roles.
            return OutputSyntax {
                tool_parser: Some(HARMONY.to_owned()),
                reasoning_parser: Some(HARMONY.to_owned()),
            };
        }
        OutputSyntax {
            tool_parser: tool_parser(template).map(str::to_owned),
            reasoning_parser: reasoning_parser(template).map(str::to_owned),
        }
    }

    /// This syntax with configured names taking precedence over detected ones.
    pub fn overridden(self, tool_parser: Option<&str>, reasoning_parser: Option<&str>) -> Self {
        OutputSyntax {
            tool_parser: tool_parser.map(str::to_owned).or(self.tool_parser),
            reasoning_parser: reasoning_parser
                .map(str::to_owned)
                .or(self.reasoning_parser),
        }
    }
}

fn tool_parser(template: &str) -> Option<&'static str> {
    if template.contains("<tool_call>") {
        Some("hermes")
    } else if template.contains("[TOOL_CALLS]") {
        Some("mistral")
    } else if template.contains("<|python_tag|>")
        || template.contains("\"parameters\": dictionary of argument name")
    {
        Some("llama3_json")
    } else {
        None
    }
}

fn reasoning_parser(template: &str) -> Option<&'static str> {
    if !template.contains("<think>") && !template.contains("</think>") {
        return None;
    }
    // The generation prompt: what follows the last `add_generation_prompt` test up to the
    // end of its block. A prompt that opens `<think>` without closing it leaves the model
    // inside the reasoning (DeepSeek-R1, Qwen3 thinking-only); one that writes an empty
    // block (Qwen3 with `enable_thinking: false`) or none lets the model open it.
    let prompt = template
        .rfind("add_generation_prompt")
        .map(|at| &template[at..])
        .map(|tail| tail.find("endif").map_or(tail, |end| &tail[..end]))
        .unwrap_or_default();
    if prompt.contains("<think>") && !prompt.contains("</think>") {
        Some("deepseek_r1")
    } else {
        Some("qwen3")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QWEN3: &str = r#"{%- if tools %}<tools>{% for tool in tools %}{{ tool | tojson }}{% endfor %}</tools> For each function call, return a json object within <tool_call></tool_call> XML tags{%- endif %}
{%- for message in messages %}{%- if message.role == "assistant" and reasoning_content %}{{ '<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' }}{%- endif %}{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"#;

    const DEEPSEEK_R1: &str = r#"{% for message in messages %}{% if message['role'] == 'assistant' %}{% set content = message['content'].split('</think>')[-1] %}{{'<｜Assistant｜>' + content}}{% endif %}{% endfor %}{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜><think>\n'}}{% endif %}"#;

    const LLAMA31: &str = r#"{{- "Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}." }}{%- if tool_call.function.name in builtin_tools %}{{- '<|python_tag|>' }}{% endif %}{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}"#;

    const MISTRAL: &str = r#"{%- for message in messages %}{%- if message.tool_calls %}{{- "[TOOL_CALLS][" }}{%- endif %}{%- endfor %}"#;

    const PLAIN: &str = r#"{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"#;

    fn names(template: &str) -> (Option<String>, Option<String>) {
        let syntax = OutputSyntax::detect(template);
        (syntax.tool_parser, syntax.reasoning_parser)
    }

    fn some(a: &str, b: Option<&str>) -> (Option<String>, Option<String>) {
        (Some(a.to_owned()), b.map(str::to_owned))
    }

    #[test]
    fn a_qwen3_template_uses_hermes_calls_and_lets_the_model_open_think() {
        assert_eq!(names(QWEN3), some("hermes", Some("qwen3")));
    }

    #[test]
    fn a_generation_prompt_that_opens_think_means_the_output_starts_inside_it() {
        assert_eq!(names(DEEPSEEK_R1), (None, Some("deepseek_r1".into())));
    }

    #[test]
    fn llama_and_mistral_templates_are_recognised() {
        assert_eq!(names(LLAMA31), some("llama3_json", None));
        assert_eq!(names(MISTRAL), some("mistral", None));
    }

    #[test]
    fn a_harmony_template_uses_harmony_for_calls_and_reasoning() {
        let gpt_oss = r#"{{- "<|start|>assistant<|channel|>final<|message|>" + message.content + "<|end|>" }}{%- if add_generation_prompt -%}<|start|>assistant{%- endif -%}"#;
        assert_eq!(names(gpt_oss), some("harmony", Some("harmony")));
    }

    #[test]
    fn a_plain_template_reveals_nothing_and_configuration_wins() {
        assert_eq!(names(PLAIN), (None, None));
        let overridden = OutputSyntax::detect(QWEN3).overridden(Some("llama3_json"), None);
        assert_eq!(overridden.tool_parser.as_deref(), Some("llama3_json"));
        assert_eq!(overridden.reasoning_parser.as_deref(), Some("qwen3"));
    }
}
