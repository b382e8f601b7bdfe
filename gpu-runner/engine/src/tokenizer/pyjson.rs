//! JSON text written the way Python's `json.dumps` writes it, for the `tojson` filter of chat
//! templates. Models were trained on prompts rendered by Python, so tool schemas must come out
//! byte-for-byte the same: `", "` and `": "` separators, `indent` with `","` separators, no
//! HTML escaping (minijinja's own `tojson` escapes `<`, `>`, `&`, `'`), insertion order kept.

use serde_json::Value;
use std::fmt::Write;

/// `json.dumps` keyword arguments.
#[derive(Debug, Clone)]
pub struct DumpOptions {
    /// `None` writes everything on one line; `Some(unit)` puts items on their own lines.
    pub indent: Option<String>,
    pub item_separator: String,
    pub key_separator: String,
    pub ensure_ascii: bool,
    pub sort_keys: bool,
}

impl Default for DumpOptions {
    /// Hugging Face's `tojson` default: `json.dumps(x, ensure_ascii=False)`.
    fn default() -> Self {
        Self {
            indent: None,
            item_separator: ", ".into(),
            key_separator: ": ".into(),
            ensure_ascii: false,
            sort_keys: false,
        }
    }
}

impl DumpOptions {
    /// Sets `indent` as Python does: an integer counts spaces, a string is used as is, and the
    /// item separator loses its trailing space (unless separators are given explicitly later).
    pub fn with_indent(mut self, unit: String) -> Self {
        self.indent = Some(unit);
        self.item_separator = ",".into();
        self
    }
}

/// `json.dumps(value, **options)`.
pub fn dumps(value: &Value, options: &DumpOptions) -> String {
    let mut out = String::new();
    write_value(&mut out, value, options, 0);
    out
}

fn write_value(out: &mut String, value: &Value, o: &DumpOptions, depth: usize) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => write_number(out, n),
        Value::String(s) => write_string(out, s, o.ensure_ascii),
        Value::Array(items) => {
            if items.is_empty() {
                out.push_str("[]");
                return;
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                separate(out, o, depth + 1, i == 0);
                write_value(out, item, o, depth + 1);
            }
            close(out, o, depth, ']');
        }
        Value::Object(map) => {
            if map.is_empty() {
                out.push_str("{}");
                return;
            }
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            if o.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            out.push('{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                separate(out, o, depth + 1, i == 0);
                write_string(out, key, o.ensure_ascii);
                out.push_str(&o.key_separator);
                write_value(out, item, o, depth + 1);
            }
            close(out, o, depth, '}');
        }
    }
}

/// Before an item: the item separator (not before the first), then newline and indent.
fn separate(out: &mut String, o: &DumpOptions, depth: usize, first: bool) {
    match &o.indent {
        Some(unit) => {
            if !first {
                out.push_str(&o.item_separator);
            }
            out.push('\n');
            out.push_str(&unit.repeat(depth));
        }
        None if !first => out.push_str(&o.item_separator),
        None => {}
    }
}

fn close(out: &mut String, o: &DumpOptions, depth: usize, bracket: char) {
    if let Some(unit) = &o.indent {
        out.push('\n');
        out.push_str(&unit.repeat(depth));
    }
    out.push(bracket);
}

/// Integers as is; floats like Python's `repr` (`1.0`, `1e+20`, `1.5e-07`).
fn write_number(out: &mut String, n: &serde_json::Number) {
    let Some(f) = n.as_f64().filter(|_| n.is_f64()) else {
        out.push_str(&n.to_string());
        return;
    };
    let magnitude = f.abs();
    if magnitude != 0.0 && !(1e-4..1e16).contains(&magnitude) {
        let formatted = format!("{f:e}");
        let (mantissa, exponent) = formatted.split_once('e').unwrap_or((&formatted, "0"));
        let (sign, digits) = match exponent.strip_prefix('-') {
            Some(d) => ('-', d),
            None => ('+', exponent),
        };
        let _ = write!(out, "{mantissa}e{sign}{digits:0>2}");
    } else {
        let formatted = f.to_string();
        out.push_str(&formatted);
        if !formatted.contains('.') {
            out.push_str(".0");
        }
    }
}

fn write_string(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0C}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && (c as u32) > 0x7E) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn default_output_matches_python_json_dumps() {
        let v = json!({"name": "get_weather", "args": [1, 2.5, true, null], "html": "<a&b>"});
        assert_eq!(
            dumps(&v, &DumpOptions::default()),
            r#"{"name": "get_weather", "args": [1, 2.5, true, null], "html": "<a&b>"}"#
        );
    }

    #[test]
    fn indent_puts_items_on_lines_without_trailing_spaces() {
        let v = json!({"a": [1, {}], "b": "x"});
        let o = DumpOptions::default().with_indent("  ".into());
        assert_eq!(
            dumps(&v, &o),
            "{\n  \"a\": [\n    1,\n    {}\n  ],\n  \"b\": \"x\"\n}"
        );
    }

    #[test]
    fn strings_escape_like_python() {
        let v = json!("é\u{1F600}\n\"\u{01}");
        assert_eq!(
            dumps(&v, &DumpOptions::default()),
            "\"é\u{1F600}\\n\\\"\\u0001\""
        );
        let ascii = DumpOptions {
            ensure_ascii: true,
            ..DumpOptions::default()
        };
        assert_eq!(
            dumps(&json!("é\u{1F600}"), &ascii),
            r#""\u00e9\ud83d\ude00""#
        );
    }

    #[test]
    fn floats_are_written_like_python_repr() {
        assert_eq!(dumps(&json!(1.0), &DumpOptions::default()), "1.0");
        assert_eq!(dumps(&json!(1e20), &DumpOptions::default()), "1e+20");
        assert_eq!(dumps(&json!(1.5e-7), &DumpOptions::default()), "1.5e-07");
    }
}
