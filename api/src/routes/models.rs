//! `GET /v1/models` and `GET /v1/models/{id}`: the models live runners serve, LoRA adapters
//! listed as `BASE:NAME` with their `parent`.

use crate::auth::Caller;
use crate::error::ApiError;
use crate::openai::models::{ModelCard, ModelList};
use crate::state::AppState;
use crate::validate::resolve;
use axum::extract::{Path, State};
use axum::Json;

pub async fn list_models(
    State(state): State<AppState>,
    _caller: Caller,
) -> Result<Json<ModelList>, ApiError> {
    let models = state.catalog().list().await?;
    Ok(Json(ModelList::new(
        models.iter().map(ModelCard::from).collect(),
    )))
}

/// Model ids may contain slashes (`org/name`), hence the wildcard path.
pub async fn get_model(
    State(state): State<AppState>,
    _caller: Caller,
    id: Result<Path<String>, axum::extract::rejection::PathRejection>,
) -> Result<Json<ModelCard>, ApiError> {
    let Path(id) = id.map_err(|err| ApiError::NotFound(format!("Invalid model path: {err}")))?;
    let models = state.catalog().list().await?;
    let (model, _) = resolve(&models, &id, None)?;
    Ok(Json(ModelCard::from(model)))
}
