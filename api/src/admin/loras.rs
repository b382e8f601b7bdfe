//! `/admin/loras`: the LoRA adapters served over the base models. An operator loads one by
//! path (relative to the runners' `--lora-dir`), and every runner that holds its base and
//! has a lora dir serves it as `BASE:NAME` from the next request on; unloading stops new
//! requests (running ones finish). The list also shows the adapters runners were given with
//! `--lora`, which only their runner's operator can change.

use super::auth::Admin;
use super::AdminList;
use crate::error::ApiError;
use crate::extract::ApiJson;
use crate::state::AppState;
use crate::validate::adapter::parse_lora_path;
use axum::extract::{Path, State};
use axum::Json;
use fallow_protocol::adapter::{adapter_queue, base_of, is_adapter_name};
use fallow_scheduler::loras;
use fallow_scheduler::runners;
use serde::{Deserialize, Serialize};

/// `POST /admin/loras`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadLora {
    name: String,
    base: String,
    path: String,
}

/// An adapter as operators see it.
#[derive(Debug, Serialize)]
pub struct LoraView {
    /// What clients ask for: `BASE:NAME`.
    id: String,
    base: String,
    name: String,
    /// `admin` (loaded here) or `runner` (a runner's own `--lora`).
    source: &'static str,
    /// Inside the runners' `--lora-dir` (loaded adapters only).
    path: Option<String>,
    /// Whether a live runner serves it now.
    served: bool,
}

pub async fn load(
    State(state): State<AppState>,
    _admin: Admin,
    ApiJson(body): ApiJson<LoadLora>,
) -> Result<Json<LoraView>, ApiError> {
    if !is_adapter_name(&body.name) {
        return Err(ApiError::invalid(
            "name",
            "an adapter name is 1 to 128 letters, digits, `.`, `_` and `-`, not starting with `.`",
        ));
    }
    if body.base.trim().is_empty() || body.base.chars().any(char::is_control) {
        return Err(ApiError::invalid(
            "base",
            "`base` is the id of a base model",
        ));
    }
    let path = parse_lora_path(Some(&serde_json::Value::String(body.path)))
        .map_err(|e| ApiError::invalid("path", e.to_string()))?
        .unwrap_or_default();
    let loaded = loras::load(state.queue().pool(), &body.base, &body.name, &path).await?;
    state.catalog().forget().await;
    tracing::info!(base = %loaded.base, name = %loaded.name, path = %loaded.path, "LoRA adapter loaded by an operator");
    let served = live(&state)
        .await?
        .iter()
        .any(|m| m.id == loaded.base && m.lora_dir);
    Ok(Json(LoraView {
        id: adapter_queue(&loaded.base, &loaded.name),
        base: loaded.base,
        name: loaded.name,
        source: "admin",
        path: Some(loaded.path),
        served,
    }))
}

/// `POST /admin/loras/{BASE:NAME}/unload`.
pub async fn unload(
    State(state): State<AppState>,
    _admin: Admin,
    Path(id): Path<String>,
) -> Result<Json<LoraView>, ApiError> {
    let base = base_of(&id);
    let name = id.strip_prefix(base).and_then(|r| r.strip_prefix(':'));
    let unloaded = match name {
        Some(name) => loras::unload(state.queue().pool(), base, name).await?,
        None => None,
    };
    let unloaded = unloaded.ok_or_else(|| {
        ApiError::NotFound(format!(
            "No LoRA adapter {id:?} was loaded through the admin API (a runner's own --lora \
             adapters are unloaded by restarting it without them)."
        ))
    })?;
    state.catalog().forget().await;
    tracing::info!(base = %unloaded.base, name = %unloaded.name, "LoRA adapter unloaded by an operator");
    Ok(Json(LoraView {
        id,
        base: unloaded.base,
        name: unloaded.name,
        source: "admin",
        path: Some(unloaded.path),
        served: false,
    }))
}

/// `GET /admin/loras`: loaded adapters, then the runners' own, each marked served or not.
pub async fn list(
    State(state): State<AppState>,
    _admin: Admin,
) -> Result<Json<AdminList<LoraView>>, ApiError> {
    let live = live(&state).await?;
    let loaded = loras::list(state.queue().pool()).await?;
    let mut views: Vec<LoraView> = loaded
        .into_iter()
        .map(|lora| LoraView {
            id: adapter_queue(&lora.base, &lora.name),
            served: live.iter().any(|m| m.id == lora.base && m.lora_dir),
            base: lora.base,
            name: lora.name,
            source: "admin",
            path: Some(lora.path),
        })
        .collect();
    views.extend(live.iter().filter_map(|m| {
        let base = m.parent.clone()?;
        let name = m.id.strip_prefix(&base)?.strip_prefix(':')?.to_owned();
        Some(LoraView {
            id: m.id.clone(),
            base,
            name,
            source: "runner",
            path: None,
            served: true,
        })
    }));
    Ok(Json(AdminList::new(views)))
}

/// The models live runners serve, read now (the catalog's copy may be a second old).
async fn live(state: &AppState) -> Result<Vec<runners::ModelEntry>, ApiError> {
    Ok(runners::live_models(state.queue().pool()).await?)
}
