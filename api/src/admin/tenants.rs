//! `/admin/tenants` and `/admin/keys`: tenants and their limits, and API keys. A new key is
//! shown once, in the answer that creates it; afterwards only its prefix is ever shown, and
//! keys are revoked by id.

use super::auth::Admin;
use super::{parse_id, AdminList};
use crate::error::ApiError;
use crate::extract::ApiJson;
use crate::state::AppState;
use axum::extract::{Path, Query, State};
use axum::Json;
use fallow_scheduler::tenants::{self, KeyRecord, LimitsUpdate, RateLimits, Tenant};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize)]
pub struct TenantView {
    id: uuid::Uuid,
    name: String,
    max_active_jobs: i64,
    weight: f64,
    class: i32,
    #[serde(flatten)]
    rate: RateLimits,
}

impl From<Tenant> for TenantView {
    fn from(t: Tenant) -> Self {
        TenantView {
            id: t.id,
            name: t.name,
            max_active_jobs: t.max_active_jobs,
            weight: t.weight,
            class: t.class,
            rate: t.rate,
        }
    }
}

pub async fn list(
    State(state): State<AppState>,
    _admin: Admin,
) -> Result<Json<AdminList<TenantView>>, ApiError> {
    let tenants = tenants::list(state.queue().pool()).await?;
    Ok(Json(AdminList::new(
        tenants.into_iter().map(TenantView::from).collect(),
    )))
}

/// The limits to change; a limit left out keeps its value, 0 means unlimited.
#[derive(Debug, Deserialize)]
pub struct Limits {
    max_active_jobs: Option<i64>,
    requests_per_minute: Option<i64>,
    tokens_per_minute: Option<i64>,
    max_batch_queued_lines: Option<i64>,
    /// Fair-share weight, relative to other tenants.
    weight: Option<f64>,
    /// Served-first class within a band; higher first.
    class: Option<i32>,
}

impl Limits {
    /// The update, once every given limit is within its range.
    fn validate(self) -> Result<LimitsUpdate, ApiError> {
        let fields = [
            ("max_active_jobs", self.max_active_jobs),
            ("requests_per_minute", self.requests_per_minute),
            ("tokens_per_minute", self.tokens_per_minute),
            ("max_batch_queued_lines", self.max_batch_queued_lines),
        ];
        if fields.iter().all(|(_, v)| v.is_none()) && self.weight.is_none() && self.class.is_none()
        {
            return Err(ApiError::invalid(
                "max_active_jobs",
                "give at least one of max_active_jobs, requests_per_minute, tokens_per_minute, max_batch_queued_lines, weight, class",
            ));
        }
        for (name, value) in fields {
            if value.is_some_and(|v| v < 0) {
                return Err(ApiError::invalid(
                    name,
                    format!("{name} must be 0 (unlimited) or more"),
                ));
            }
        }
        if let Some(weight) = self.weight {
            if !(weight > 0.0 && weight <= tenants::MAX_WEIGHT) {
                return Err(ApiError::invalid(
                    "weight",
                    format!(
                        "weight must be more than 0 and at most {}",
                        tenants::MAX_WEIGHT
                    ),
                ));
            }
        }
        if matches!(self.class, Some(c) if !(0..=tenants::MAX_CLASS).contains(&c)) {
            return Err(ApiError::invalid(
                "class",
                format!("class must be from 0 to {}", tenants::MAX_CLASS),
            ));
        }
        Ok(LimitsUpdate {
            max_active_jobs: self.max_active_jobs,
            requests_per_minute: self.requests_per_minute,
            tokens_per_minute: self.tokens_per_minute,
            max_batch_queued_lines: self.max_batch_queued_lines,
            weight: self.weight,
            class: self.class,
        })
    }
}

pub async fn set_limits(
    State(state): State<AppState>,
    _admin: Admin,
    Path(name): Path<String>,
    ApiJson(limits): ApiJson<Limits>,
) -> Result<Json<TenantView>, ApiError> {
    let update = limits.validate()?;
    let tenant = tenants::set_limits(state.queue().pool(), &name, &update)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("No tenant named {name:?}.")))?;
    tracing::info!(tenant = %name, ?update, "tenant limits set by an operator");
    Ok(Json(TenantView::from(tenant)))
}

#[derive(Debug, Serialize)]
pub struct CreatedKey {
    tenant: String,
    /// The plaintext key: shown this once, never again.
    key: String,
}

/// Creates the tenant if needed, and a key for it.
pub async fn create_key(
    State(state): State<AppState>,
    _admin: Admin,
    Path(name): Path<String>,
) -> Result<Json<CreatedKey>, ApiError> {
    if name.is_empty() || name.len() > 200 {
        return Err(ApiError::invalid(
            "name",
            "a tenant name has 1 to 200 characters",
        ));
    }
    let key = tenants::create_key(state.queue().pool(), &name).await?;
    tracing::info!(tenant = %name, "API key created by an operator");
    Ok(Json(CreatedKey { tenant: name, key }))
}

#[derive(Debug, Deserialize)]
pub struct KeyFilter {
    tenant: Option<String>,
}

pub async fn list_keys(
    State(state): State<AppState>,
    _admin: Admin,
    Query(filter): Query<KeyFilter>,
) -> Result<Json<AdminList<KeyRecord>>, ApiError> {
    let keys = tenants::list_keys(state.queue().pool(), filter.tenant.as_deref()).await?;
    Ok(Json(AdminList::new(keys)))
}

pub async fn list_tenant_keys(
    State(state): State<AppState>,
    _admin: Admin,
    Path(name): Path<String>,
) -> Result<Json<AdminList<KeyRecord>>, ApiError> {
    let keys = tenants::list_keys(state.queue().pool(), Some(&name)).await?;
    Ok(Json(AdminList::new(keys)))
}

#[derive(Debug, Serialize)]
pub struct Revoked {
    id: uuid::Uuid,
    revoked: bool,
}

pub async fn revoke_key(
    State(state): State<AppState>,
    _admin: Admin,
    Path(id): Path<String>,
) -> Result<Json<Revoked>, ApiError> {
    let id = parse_id("key", &id)?;
    let revoked = tenants::revoke_key_id(state.queue().pool(), id).await?;
    if !revoked {
        return Err(ApiError::NotFound(format!(
            "No active key with id {id} (unknown or already revoked)."
        )));
    }
    tracing::info!(key = %id, "API key revoked by an operator");
    Ok(Json(Revoked { id, revoked }))
}
