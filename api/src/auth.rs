//! Bearer-key authentication. A key maps to a tenant (`tenants::tenant_for_key`, which
//! compares hashes); with `ApiConfig.auth` off every caller is anonymous.

use crate::error::ApiError;
use crate::state::AppState;
use axum::extract::FromRequestParts;
use axum::http::{header, request::Parts};
use fallow_scheduler::tenants::{self, Tenant};

/// Who is calling: a tenant, or nobody when authentication is off.
#[derive(Debug, Clone)]
pub struct Caller {
    pub tenant: Option<Tenant>,
}

impl Caller {
    pub fn tenant_id(&self) -> Option<uuid::Uuid> {
        self.tenant.as_ref().map(|t| t.id)
    }

    /// Whether this caller may see a job owned by `owner`. Without authentication
    /// everything is visible (single-user development set-up).
    pub fn may_see(&self, owner: Option<uuid::Uuid>) -> bool {
        match &self.tenant {
            None => true,
            Some(t) => owner == Some(t.id),
        }
    }
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        if !state.config().auth {
            return Ok(Caller { tenant: None });
        }
        let key = bearer_key(parts).ok_or(ApiError::MissingApiKey)?;
        let tenant = tenants::tenant_for_key(state.queue().pool(), key)
            .await?
            .ok_or(ApiError::InvalidApiKey)?;
        Ok(Caller {
            tenant: Some(tenant),
        })
    }
}

/// The key of an `Authorization: Bearer <key>` header (scheme case-insensitive).
pub(crate) fn bearer_key(parts: &Parts) -> Option<&str> {
    let value = parts
        .headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .trim();
    let (scheme, key) = value.split_once(' ')?;
    let key = key.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !key.is_empty()).then_some(key)
}
