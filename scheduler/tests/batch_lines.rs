//! Checking batch input lines: every kind of bad line is reported with its line number.

mod batch_support;

use batch_support::{line, TestCodec};
use fallow_scheduler::batch::lines::LineReader;

/// (valid custom ids, (line, code) of each error)
async fn check(input: &[u8], max_line_bytes: usize) -> (Vec<String>, Vec<(u64, String)>) {
    let codec = TestCodec;
    let mut reader = LineReader::new(input, "/v1/chat/completions", &codec, max_line_bytes);
    let (mut ok, mut errors) = (Vec::new(), Vec::new());
    while let Some(next) = reader.next().await.unwrap() {
        match next {
            Ok(valid) => ok.push(valid.custom_id),
            Err(e) => errors.push((e.line.unwrap(), e.code)),
        }
    }
    (ok, errors)
}

#[tokio::test]
async fn valid_lines_pass_and_blank_lines_are_skipped_but_counted() {
    let input = format!("{}\n\n{}\r\n", line("a", "m"), line("b", "m"));
    let (ok, errors) = check(input.as_bytes(), 1 << 20).await;
    assert_eq!(ok, ["a", "b"]);
    assert!(errors.is_empty());
}

#[tokio::test]
async fn every_kind_of_bad_line_is_reported_with_its_line_number() {
    let wrong_url = line("c", "m").replace("/v1/chat/completions", "/v1/embeddings");
    let wrong_method = line("d", "m").replace("POST", "GET");
    let no_body = r#"{"custom_id":"e","method":"POST","url":"/v1/chat/completions"}"#;
    let bad_body = line("f", "m").replace(r#""model":"m""#, r#""model":7"#);
    let mut input = Vec::new();
    for l in [
        line("a", "m"),
        "{not json".to_owned(),
        line("a", "m"),
        wrong_url,
        wrong_method,
        no_body.to_owned(),
        bad_body,
        "[1,2]".to_owned(),
    ] {
        input.extend_from_slice(l.as_bytes());
        input.push(b'\n');
    }
    input.extend_from_slice(b"\xff\xfe not utf-8\n");
    input.extend_from_slice(format!("{}\n", "x".repeat(300)).as_bytes());
    let (ok, errors) = check(&input, 250).await;
    assert_eq!(ok, ["a"]);
    let codes: Vec<(u64, &str)> = errors.iter().map(|(l, c)| (*l, c.as_str())).collect();
    assert_eq!(
        codes,
        [
            (2, "invalid_json_line"),
            (3, "duplicate_custom_id"),
            (4, "mismatched_url"),
            (5, "invalid_method"),
            (6, "missing_required_parameter"),
            (7, "invalid_request"),
            (8, "invalid_json_line"),
            (9, "invalid_encoding"),
            (10, "line_too_long"),
        ]
    );
}

#[tokio::test]
async fn a_last_line_without_newline_is_read() {
    let (ok, _) = check(line("z", "m").as_bytes(), 1 << 20).await;
    assert_eq!(ok, ["z"]);
}
