//! The `Host` check that stops DNS rebinding.
//! A page on `evil.example` can make its own name resolve to `127.0.0.1` and then read a
//! local server as if it were same-origin.
//! The browser still sends `Host: evil.example`, so a server that answers only to its own
//! names is out of the page's reach.
//!
//! When the check is on ([`ApiConfig::check_host`]), a request is served only when its
//! `Host` (or HTTP/2 authority) is a loopback name, an IP literal, or one of
//! [`ApiConfig::allowed_hosts`].
//! An `Origin` header, which browsers add to cross-origin requests, must pass the same
//! rule: this also stops a page from sending body-less POSTs (`…/cancel`, `…/drain`) to a
//! local server.
//! Anything else gets a 403 in the OpenAI envelope.
//!
//! IP literals always pass: a rebinding attack needs a name the attacker controls, and a
//! browser that sends `Host: 10.0.0.5` really connected to `10.0.0.5`.
//! This keeps health probes and scrapers that address a pod by its IP working.

use crate::config::ApiConfig;
use crate::error::ApiError;
use crate::state::AppState;
use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::net::IpAddr;

/// The middleware: refuses requests whose `Host` or `Origin` names a foreign host.
pub async fn enforce(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let config = state.config();
    if config.check_host {
        if let Err(refusal) = check(config, &request) {
            return refusal.into_response();
        }
    }
    next.run(request).await
}

fn check(config: &ApiConfig, request: &Request) -> Result<(), ApiError> {
    let headers = request.headers();
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .or_else(|| request.uri().authority().map(|a| a.as_str()));
    // No browser omits `Host`; an HTTP/1.0 probe may, and it is no rebinding attack.
    if let Some(host) = host {
        if !host_allowed(config, host) {
            return Err(ApiError::PermissionDenied(format!(
                "The Host header `{host}` is not allowed: this server answers to loopback names \
                 and its --allowed-host names only."
            )));
        }
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = String::from_utf8_lossy(origin.as_bytes());
        let allowed = origin_authority(&origin).is_some_and(|a| host_allowed(config, a));
        if !allowed {
            return Err(ApiError::PermissionDenied(format!(
                "Requests from the web origin `{origin}` are not allowed: this server answers \
                 to loopback names and its --allowed-host names only."
            )));
        }
    }
    Ok(())
}

/// Whether `authority` (`name`, `name:port`, `[v6]:port`) may address this server.
pub fn host_allowed(config: &ApiConfig, authority: &str) -> bool {
    let name = strip_port(authority.trim());
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.eq_ignore_ascii_case("localhost") || is_ip_literal(name) {
        return true;
    }
    config.allowed_hosts.iter().any(|allowed| {
        let allowed = allowed.trim();
        allowed == "*"
            || allowed.eq_ignore_ascii_case(name)
            || allowed.eq_ignore_ascii_case(authority.trim())
    })
}

/// `name:port` → `name`; `[::1]:8000` → `::1`; a bare IPv6 address is left whole.
fn strip_port(authority: &str) -> &str {
    if let Some(rest) = authority.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match authority.rsplit_once(':') {
        Some((name, port)) if !name.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => {
            name
        }
        _ => authority,
    }
}

fn is_ip_literal(name: &str) -> bool {
    name.parse::<IpAddr>().is_ok()
}

/// `scheme://authority[/…]` → `authority`; `null` and other opaque origins → `None`.
fn origin_authority(origin: &str) -> Option<&str> {
    let (_, rest) = origin.trim().split_once("://")?;
    let authority = rest.split('/').next().unwrap_or(rest);
    (!authority.is_empty()).then_some(authority)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(allowed: &[&str]) -> ApiConfig {
        ApiConfig {
            allowed_hosts: allowed.iter().map(|s| s.to_string()).collect(),
            ..ApiConfig::default()
        }
    }

    #[test]
    fn loopback_names_and_ip_literals_pass_with_any_port() {
        let c = config(&[]);
        for host in [
            "localhost",
            "LOCALHOST:8000",
            "localhost.:8000",
            "127.0.0.1",
            "127.0.0.1:8000",
            "[::1]:8000",
            "[::1]",
            "10.0.0.5:8000",
        ] {
            assert!(host_allowed(&c, host), "{host} should pass");
        }
    }

    #[test]
    fn a_foreign_name_is_refused_unless_allowed() {
        assert!(!host_allowed(&config(&[]), "evil.example:8000"));
        assert!(!host_allowed(&config(&[]), "localhost.evil.example"));
        assert!(host_allowed(
            &config(&["Fallow.internal"]),
            "fallow.internal:8000"
        ));
        assert!(host_allowed(
            &config(&["fallow.internal:8443"]),
            "fallow.internal:8443"
        ));
        assert!(!host_allowed(&config(&["fallow.internal"]), "evil.example"));
        assert!(host_allowed(&config(&["*"]), "anything.example"));
    }

    #[test]
    fn origins_are_reduced_to_their_authority() {
        assert_eq!(
            origin_authority("http://localhost:8000"),
            Some("localhost:8000")
        );
        assert_eq!(
            origin_authority("https://evil.example"),
            Some("evil.example")
        );
        assert_eq!(origin_authority("null"), None);
    }
}
