//! SGLang's `ebnf` parameter takes llama.cpp's GBNF; the engine speaks llguidance's Lark.
//! This converts one to the other: `name ::= body` rules become `name: body`, `root` is the
//! start rule, character classes and `.` become regex terminals, strings are re-quoted as
//! JSON (Lark's string syntax), and `*`, `+`, `?`, `|`, groups and `{m,n}` carry over as they
//! are. Rule names are lower-cased (Lark's rules are lower case).
//!
//! A grammar that already looks like Lark (`start:` rules, no `::=`) is passed through
//! unchanged, so clients that send llguidance grammars in `ebnf` keep working.

use std::fmt::Write;

/// Converts a GBNF grammar to Lark, or explains where it is malformed.
pub fn gbnf_to_lark(gbnf: &str) -> Result<String, String> {
    if !gbnf.contains("::=") {
        return Ok(gbnf.to_string());
    }
    let tokens = tokenize(gbnf)?;
    let mut out = String::new();
    let mut has_root = false;
    let mut i = 0;
    while i < tokens.len() {
        let (Tok::Name(name), Some(Tok::Define)) = (&tokens[i], tokens.get(i + 1)) else {
            return Err(format!(
                "expected a rule `name ::= ...`, found {}",
                tokens[i].describe()
            ));
        };
        has_root |= name == "root";
        let _ = write!(out, "{}:", rule_name(name));
        i += 2;
        let start = i;
        while i < tokens.len() && !is_rule_start(&tokens, i) {
            if tokens[i] == Tok::Define {
                return Err(format!("unexpected `::=` in rule `{name}`"));
            }
            out.push(' ');
            out.push_str(&tokens[i].to_lark());
            i += 1;
        }
        if i == start {
            return Err(format!("rule `{name}` has an empty body"));
        }
        out.push('\n');
    }
    if !has_root {
        return Err("the grammar has no `root` rule".into());
    }
    let _ = writeln!(out, "start: {}", rule_name("root"));
    Ok(out)
}

fn is_rule_start(tokens: &[Tok], i: usize) -> bool {
    matches!(
        (&tokens[i], tokens.get(i + 1)),
        (Tok::Name(_), Some(Tok::Define))
    )
}

/// Lark rule names are lower case; a prefix keeps GBNF names such as `start` or ones
/// starting with a digit from clashing with Lark's own.
fn rule_name(name: &str) -> String {
    format!("g_{}", name.to_ascii_lowercase().replace('-', "_"))
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Name(String),
    Define,
    /// The decoded text of a `"..."` literal.
    Literal(String),
    /// A character class: negated, and its items as inclusive ranges.
    Class(bool, Vec<(char, char)>),
    Any,
    /// `|`, `(`, `)`, `*`, `+`, `?`, or a `{m,n}` repetition, verbatim.
    Op(String),
}

impl Tok {
    fn describe(&self) -> String {
        match self {
            Tok::Name(n) => format!("`{n}`"),
            Tok::Define => "`::=`".into(),
            Tok::Literal(s) => format!("{s:?}"),
            Tok::Class(..) => "a character class".into(),
            Tok::Any => "`.`".into(),
            Tok::Op(op) => format!("`{op}`"),
        }
    }

    fn to_lark(&self) -> String {
        match self {
            Tok::Name(n) => rule_name(n),
            Tok::Define => "::=".into(),
            Tok::Literal(s) => serde_json::Value::from(s.as_str()).to_string(),
            Tok::Class(negated, ranges) => {
                let mut rx = String::from("/[");
                if *negated {
                    rx.push('^');
                }
                for &(lo, hi) in ranges {
                    push_class_char(&mut rx, lo);
                    if hi != lo {
                        rx.push('-');
                        push_class_char(&mut rx, hi);
                    }
                }
                rx.push_str("]/");
                rx
            }
            Tok::Any => "/(?s:.)/".into(),
            Tok::Op(op) => op.clone(),
        }
    }
}

/// Writes a character for a regex class: ASCII letters and digits as they are, everything
/// else as `\x{..}`, which needs no thought about what is special where.
fn push_class_char(rx: &mut String, c: char) {
    if c.is_ascii_alphanumeric() {
        rx.push(c);
    } else {
        let _ = write!(rx, "\\x{{{:x}}}", c as u32);
    }
}

fn tokenize(src: &str) -> Result<Vec<Tok>, String> {
    let chars: Vec<char> = src.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            _ if c.is_whitespace() => i += 1,
            '#' => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            ':' if chars.get(i + 1) == Some(&':') && chars.get(i + 2) == Some(&'=') => {
                tokens.push(Tok::Define);
                i += 3;
            }
            '"' => {
                let (text, next) = literal(&chars, i + 1)?;
                tokens.push(Tok::Literal(text));
                i = next;
            }
            '[' => {
                let (tok, next) = class(&chars, i + 1)?;
                tokens.push(tok);
                i = next;
            }
            '.' => {
                tokens.push(Tok::Any);
                i += 1;
            }
            '|' | '(' | ')' | '*' | '+' | '?' => {
                tokens.push(Tok::Op(c.to_string()));
                i += 1;
            }
            '{' => {
                let end = chars[i..]
                    .iter()
                    .position(|&c| c == '}')
                    .ok_or("unclosed `{` repetition")?;
                let body: String = chars[i + 1..i + end].iter().collect();
                let body: String = body.chars().filter(|c| !c.is_whitespace()).collect();
                let valid = !body.is_empty()
                    && body.chars().all(|c| c.is_ascii_digit() || c == ',')
                    && body.matches(',').count() <= 1
                    && !body.starts_with(',');
                if !valid {
                    return Err(format!("invalid repetition `{{{body}}}`"));
                }
                tokens.push(Tok::Op(format!("{{{body}}}")));
                i += end + 1;
            }
            _ if c.is_ascii_alphanumeric() || c == '-' || c == '_' => {
                let start = i;
                while i < chars.len()
                    && (chars[i].is_ascii_alphanumeric() || chars[i] == '-' || chars[i] == '_')
                {
                    i += 1;
                }
                tokens.push(Tok::Name(chars[start..i].iter().collect()));
            }
            _ => return Err(format!("unexpected character {c:?}")),
        }
    }
    Ok(tokens)
}

/// A `"..."` literal starting after the quote; returns its text and the index after it.
fn literal(chars: &[char], mut i: usize) -> Result<(String, usize), String> {
    let mut text = String::new();
    loop {
        match chars.get(i) {
            None => return Err("unterminated string literal".into()),
            Some('"') => return Ok((text, i + 1)),
            Some('\\') => {
                let (c, next) = escape(chars, i + 1)?;
                text.push(c);
                i = next;
            }
            Some(&c) => {
                text.push(c);
                i += 1;
            }
        }
    }
}

/// A `[...]` class starting after the bracket; returns it and the index after it.
fn class(chars: &[char], mut i: usize) -> Result<(Tok, usize), String> {
    let negated = chars.get(i) == Some(&'^');
    if negated {
        i += 1;
    }
    let mut ranges = Vec::new();
    loop {
        let lo = match chars.get(i) {
            None => return Err("unterminated character class".into()),
            Some(']') => return Ok((Tok::Class(negated, ranges), i + 1)),
            Some(_) => class_char(chars, &mut i)?,
        };
        if chars.get(i) == Some(&'-') && chars.get(i + 1).is_some_and(|&c| c != ']') {
            i += 1;
            let hi = class_char(chars, &mut i)?;
            if hi < lo {
                return Err(format!("invalid range {lo:?}-{hi:?} in a character class"));
            }
            ranges.push((lo, hi));
        } else {
            ranges.push((lo, lo));
        }
    }
}

fn class_char(chars: &[char], i: &mut usize) -> Result<char, String> {
    match chars.get(*i) {
        Some('\\') => {
            let (c, next) = escape(chars, *i + 1)?;
            *i = next;
            Ok(c)
        }
        Some(&c) => {
            *i += 1;
            Ok(c)
        }
        None => Err("unterminated character class".into()),
    }
}

/// The character an escape (after the backslash) stands for, and the index after it.
fn escape(chars: &[char], i: usize) -> Result<(char, usize), String> {
    let hex = |len: usize| -> Result<(char, usize), String> {
        let digits: String = chars
            .get(i + 1..i + 1 + len)
            .unwrap_or(&[])
            .iter()
            .collect();
        u32::from_str_radix(&digits, 16)
            .ok()
            .filter(|_| digits.len() == len)
            .and_then(char::from_u32)
            .map(|c| (c, i + 1 + len))
            .ok_or_else(|| format!("invalid escape `\\{}{digits}`", chars[i]))
    };
    match chars.get(i) {
        Some('n') => Ok(('\n', i + 1)),
        Some('t') => Ok(('\t', i + 1)),
        Some('r') => Ok(('\r', i + 1)),
        Some('x') => hex(2),
        Some('u') => hex(4),
        Some('U') => hex(8),
        Some(&c) => Ok((c, i + 1)),
        None => Err("a trailing backslash".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gbnf_grammar_becomes_lark_with_root_as_start() {
        let lark = gbnf_to_lark(
            "root ::= answer (\",\" ws answer)*\n\
             # a comment\n\
             answer ::= \"yes\" | \"no\" | [0-9]{1,3}\n\
             ws ::= [ \\t\\n]*\n",
        )
        .unwrap();
        assert_eq!(
            lark,
            "g_root: g_answer ( \",\" g_ws g_answer ) *\n\
             g_answer: \"yes\" | \"no\" | /[0-9]/ {1,3}\n\
             g_ws: /[\\x{20}\\x{9}\\x{a}]/ *\n\
             start: g_root\n"
        );
    }

    #[test]
    fn strings_are_requoted_and_classes_may_be_negated() {
        let lark = gbnf_to_lark("root ::= \"say \\\"hi\\\"\" [^\"\\\\] .").unwrap();
        assert!(
            lark.starts_with(r#"g_root: "say \"hi\"" /[^\x{22}\x{5c}]/ /(?s:.)/"#),
            "{lark}"
        );
    }

    #[test]
    fn a_grammar_without_root_is_refused() {
        assert!(gbnf_to_lark("item ::= \"x\"").unwrap_err().contains("root"));
    }

    #[test]
    fn malformed_grammars_say_what_is_wrong() {
        assert!(gbnf_to_lark("root ::= \"open")
            .unwrap_err()
            .contains("unterminated"));
        assert!(gbnf_to_lark("root ::= [a-")
            .unwrap_err()
            .contains("unterminated"));
        assert!(gbnf_to_lark("root ::= \"a\" ::= \"b\"").is_err());
    }

    #[test]
    fn lark_is_passed_through() {
        let lark = "start: \"a\" | \"b\"";
        assert_eq!(gbnf_to_lark(lark).unwrap(), lark);
    }

    /// llama.cpp's `grammars/json.gbnf`, as clients copy it.
    const LLAMA_CPP_JSON: &str = r#"
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
"#;

    #[test]
    fn llama_cpps_json_grammar_converts_and_compiles() {
        let lark = gbnf_to_lark(LLAMA_CPP_JSON).unwrap();
        let constraint = fallow_protocol::job::Constraint::Lark {
            grammar: lark.clone(),
        };
        assert_eq!(
            fallow_protocol::grammar::check(&constraint),
            Ok(()),
            "{lark}"
        );
    }
}
