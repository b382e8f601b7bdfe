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
use fallow_scheduler::tenants::{self, KeyRecord};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize)]
pub struct TenantView {
    id: uuid::Uuid,
    name: String,
    max_active_jobs: i64,
    weight: f64,
    class: i32,
}

impl From<tenants::Tenant> for TenantView {
    fn from(t: tenants::Tenant) -> Self {
        TenantView {
            id: t.id,
            name: t.name,
            max_active_jobs: t.max_active_jobs,
            weight: t.weight,
            class: t.class,
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

/// The limits to change; a field left out keeps its value.
#[derive(Debug, Deserialize)]
pub struct Limits {
    max_active_jobs: Option<i64>,
    /// Fair-share weight, relative to other tenants.
    weight: Option<f64>,
    /// Served-first class within a band; higher first.
    class: Option<i32>,
}

impl Limits {
    fn validate(&self) -> Result<(), ApiError> {
        if matches!(self.max_active_jobs, Some(n) if n < 0) {
            return Err(ApiError::invalid(
                "max_active_jobs",
                "max_active_jobs must be 0 or more",
            ));
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
        Ok(())
    }
}

pub async fn set_limits(
    State(state): State<AppState>,
    _admin: Admin,
    Path(name): Path<String>,
    ApiJson(limits): ApiJson<Limits>,
) -> Result<Json<TenantView>, ApiError> {
    limits.validate()?;
    let pool = state.queue().pool();
    let unknown = || ApiError::NotFound(format!("No tenant named {name:?}."));
    if let Some(max_active_jobs) = limits.max_active_jobs {
        if !tenants::set_max_active_jobs(pool, &name, max_active_jobs).await? {
            return Err(unknown());
        }
    }
    if limits.weight.is_some() || limits.class.is_some() {
        if !tenants::set_fair_share(pool, &name, limits.weight, limits.class).await? {
            return Err(unknown());
        }
    }
    tenants::list(pool)
        .await?
        .into_iter()
        .find(|t| t.name == name)
        .map(|t| Json(TenantView::from(t)))
        .ok_or_else(unknown)
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
