//! `/admin/runner-tokens`: the credentials of runners on lent machines. A new token is shown
//! once, in the answer that creates it; afterwards only its prefix is shown. A token is
//! revoked by id or by name.

use super::auth::Admin;
use super::AdminList;
use crate::error::ApiError;
use crate::extract::ApiJson;
use crate::state::AppState;
use axum::extract::{Path, State};
use axum::Json;
use fallow_scheduler::runners::tokens::{self, NewRunnerToken, RunnerToken, TokenRef};
use serde::{Deserialize, Serialize};

/// Characters at most in a token's name, its pool and each model id.
const MAX_NAME_CHARS: usize = 200;
/// Models at most that one token lists.
const MAX_MODELS: usize = 256;

/// `POST /admin/runner-tokens`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateToken {
    name: String,
    pool: Option<String>,
    models: Option<Vec<String>>,
}

impl CreateToken {
    fn validate(self) -> Result<NewRunnerToken, ApiError> {
        check_name("name", &self.name)?;
        if let Some(pool) = &self.pool {
            check_name("pool", pool)?;
        }
        if let Some(models) = &self.models {
            if models.is_empty() || models.len() > MAX_MODELS {
                return Err(ApiError::invalid(
                    "models",
                    format!("list 1 to {MAX_MODELS} models, or leave `models` out to allow any"),
                ));
            }
            for (i, model) in models.iter().enumerate() {
                check_name(&format!("models[{i}]"), model)?;
            }
        }
        Ok(NewRunnerToken {
            name: self.name,
            pool: self.pool,
            models: self.models,
        })
    }
}

fn check_name(param: &str, value: &str) -> Result<(), ApiError> {
    let chars = value.chars().count();
    if chars == 0 || chars > MAX_NAME_CHARS || value.chars().any(char::is_control) {
        return Err(ApiError::invalid(
            param,
            format!(
                "`{param}` has 1 to {MAX_NAME_CHARS} characters, none of them a control character"
            ),
        ));
    }
    Ok(())
}

/// A new token: the record, and the plaintext shown this once.
#[derive(Debug, Serialize)]
pub struct CreatedToken {
    #[serde(flatten)]
    record: RunnerToken,
    token: String,
}

pub async fn create(
    State(state): State<AppState>,
    _admin: Admin,
    ApiJson(body): ApiJson<CreateToken>,
) -> Result<Json<CreatedToken>, ApiError> {
    let new = body.validate()?;
    let (record, token) = tokens::create(state.queue().pool(), &new)
        .await?
        .ok_or_else(|| ApiError::Conflict {
            message: format!(
                "A live runner token is named {:?} already; revoke it first, or pick another name.",
                new.name
            ),
            code: "runner_token_exists",
        })?;
    tracing::info!(token = %record.name, pool = ?record.pool, "runner token created by an operator");
    Ok(Json(CreatedToken { record, token }))
}

pub async fn list(
    State(state): State<AppState>,
    _admin: Admin,
) -> Result<Json<AdminList<RunnerToken>>, ApiError> {
    Ok(Json(AdminList::new(
        tokens::list(state.queue().pool()).await?,
    )))
}

/// `POST /admin/runner-tokens/{id or name}/revoke`.
pub async fn revoke(
    State(state): State<AppState>,
    _admin: Admin,
    Path(which): Path<String>,
) -> Result<Json<RunnerToken>, ApiError> {
    let record = tokens::revoke(state.queue().pool(), &TokenRef::parse(&which))
        .await?
        .ok_or_else(|| {
            ApiError::NotFound(format!(
                "No live runner token with id or name {which:?} (unknown or already revoked)."
            ))
        })?;
    // At once through this process; through the others within their cache's second.
    state.runner_api().tokens.clear();
    tracing::info!(token = %record.name, "runner token revoked by an operator");
    Ok(Json(record))
}
