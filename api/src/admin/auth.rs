//! Who may use the admin API: a caller presenting the admin token
//! (`Authorization: Bearer <token>`, `--admin-token` / `FALLOW_ADMIN_TOKEN`). Without a
//! configured token the API is open only when `ApiConfig.admin_open` says so (`--no-auth`
//! on a loopback address), and even then a presented tenant key is refused: tenant keys
//! never grant admin rights, so a leaked tenant key cannot become an operator's.

use crate::error::ApiError;
use crate::state::AppState;
use axum::extract::FromRequestParts;
use axum::http::{header, request::Parts};
use fallow_scheduler::tenants;

/// Proof that the caller is an operator.
#[derive(Debug, Clone, Copy)]
pub struct Admin;

impl FromRequestParts<AppState> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let config = state.config();
        let presented = bearer(parts);
        if let (Some(token), Some(expected)) = (presented, config.admin_token.as_deref()) {
            if constant_time_eq(token.as_bytes(), expected.as_bytes()) {
                return Ok(Admin);
            }
        }
        match presented {
            None if config.admin_token.is_none() && config.admin_open => Ok(Admin),
            None => Err(ApiError::MissingApiKey),
            Some(key) => {
                let tenant = tenants::tenant_for_key(state.queue().pool(), key).await?;
                match tenant {
                    Some(_) => Err(ApiError::PermissionDenied(
                        "Tenant API keys cannot use the admin API; use the admin token.".into(),
                    )),
                    None => Err(ApiError::InvalidApiKey),
                }
            }
        }
    }
}

fn bearer(parts: &Parts) -> Option<&str> {
    let value = parts.headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Compares without an early exit, so the time taken says nothing about the token.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::constant_time_eq;

    #[test]
    fn tokens_match_only_when_equal() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
    }
}
