//! Secrets at the edge: the admin token (from a flag, a variable, `fallow.toml` or a file),
//! checked before anything serves with it, and URLs with their passwords masked before
//! they reach a log line or an error message.

use anyhow::Context;
use std::path::Path;

/// The shortest admin token accepted. 16 characters of `openssl rand -hex` are 64 bits.
pub const MIN_ADMIN_TOKEN_CHARS: usize = 16;

/// Words that templates and tutorials put where a real token belongs, compared without
/// case and punctuation: a token that equals one, or contains one of the `…me` phrases,
/// is a placeholder someone forgot to replace.
const PLACEHOLDERS: &[&str] = &[
    "changeme",
    "secret",
    "password",
    "admin",
    "admintoken",
    "token",
    "test",
    "example",
    "default",
    "fallow",
];
const PLACEHOLDER_PHRASES: &[&str] = &["changeme", "replaceme", "placeholder", "yourtoken"];

/// Refuses a placeholder or a token shorter than [`MIN_ADMIN_TOKEN_CHARS`]. The message
/// never repeats the token.
pub fn check_admin_token(token: &str) -> anyhow::Result<()> {
    let folded: String = token
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect();
    let placeholder = PLACEHOLDERS.contains(&folded.as_str())
        || PLACEHOLDER_PHRASES.iter().any(|p| folded.contains(p))
        || token.chars().all(|c| token.starts_with(c));
    if placeholder {
        anyhow::bail!(
            "the admin token is a placeholder; generate one, e.g. `openssl rand -hex 24`, \
             and pass it with --admin-token-file or FALLOW_ADMIN_TOKEN"
        );
    }
    let chars = token.chars().count();
    if chars < MIN_ADMIN_TOKEN_CHARS {
        anyhow::bail!(
            "the admin token has {chars} characters; at least {MIN_ADMIN_TOKEN_CHARS} are \
             required (e.g. `openssl rand -hex 24`)"
        );
    }
    Ok(())
}

/// The admin token stored in `path`, surrounding whitespace (a final newline) trimmed.
pub fn read_admin_token_file(path: &Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading --admin-token-file {}", path.display()))?;
    let token = text.trim();
    if token.is_empty() {
        anyhow::bail!("--admin-token-file {} is empty", path.display());
    }
    Ok(token.to_owned())
}

/// `scheme://user:password@host/…` with the password (and a `password=` query parameter)
/// replaced by `***`, for logs and messages. Text that is no URL comes back unchanged.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _password)) => format!("{user}:***@{host}"),
            None => format!("{userinfo}@{host}"),
        },
        None => authority.to_owned(),
    };
    format!("{scheme}://{authority}{}", redact_query(tail))
}

/// Masks `password=` (and `pass=`) parameters of a URL's path-and-query.
fn redact_query(tail: &str) -> String {
    let Some((path, query)) = tail.split_once('?') else {
        return tail.to_owned();
    };
    let params: Vec<String> = query
        .split('&')
        .map(|param| match param.split_once('=') {
            Some((key, _)) if ["password", "pass"].contains(&key.to_ascii_lowercase().as_str()) => {
                format!("{key}=***")
            }
            _ => param.to_owned(),
        })
        .collect();
    format!("{path}?{}", params.join("&"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_refused_whatever_their_case() {
        for token in [
            "CHANGE-ME",
            "changeme",
            "Change_Me",
            "secret",
            "PASSWORD",
            "admin",
            "CHANGE-ME-long-random-string",
            "replace-me-with-a-real-token",
            "aaaaaaaaaaaaaaaaaaaaaaaa",
        ] {
            let err = check_admin_token(token).expect_err(token).to_string();
            assert!(err.contains("placeholder"), "{token}: {err}");
        }
    }

    #[test]
    fn a_short_token_is_refused_naming_the_minimum() {
        let err = check_admin_token("k3Jx9q").unwrap_err().to_string();
        assert!(err.contains("at least 16"), "{err}");
        assert!(
            !err.contains("k3Jx9q"),
            "the message never repeats the token"
        );
    }

    #[test]
    fn a_generated_token_is_accepted() {
        assert!(check_admin_token("3f9c1a7e5b2d4c6e8a0b1c2d3e4f5a6b").is_ok());
        assert!(check_admin_token("admin-secret-for-tests").is_ok());
    }

    #[test]
    fn a_token_file_is_read_and_trimmed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "  3f9c1a7e5b2d4c6e8a0b\n").unwrap();
        assert_eq!(
            read_admin_token_file(&path).unwrap(),
            "3f9c1a7e5b2d4c6e8a0b"
        );
        std::fs::write(&path, "\n").unwrap();
        assert!(read_admin_token_file(&path).is_err());
    }

    #[test]
    fn a_url_password_is_masked() {
        assert_eq!(
            redact_url("postgres://fallow:hunter2@db:5432/fallow"),
            "postgres://fallow:***@db:5432/fallow"
        );
        assert_eq!(
            redact_url("redis://:hunter2@cache:6379/0"),
            "redis://:***@cache:6379/0"
        );
        assert_eq!(
            redact_url("postgres://db/fallow?user=f&password=hunter2"),
            "postgres://db/fallow?user=f&password=***"
        );
        assert_eq!(
            redact_url("postgres://postgres@127.0.0.1:5432/postgres"),
            "postgres://postgres@127.0.0.1:5432/postgres"
        );
        assert_eq!(redact_url("not a url"), "not a url");
    }
}
