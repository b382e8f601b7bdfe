//! Runner tokens: the one credential a runner on a lent machine holds. A token is
//! `rt-fallow-` plus 32 random alphanumerics, shown once when it is created; only its
//! SHA-256 is stored ([`crate::credentials`]). It names the pool its runner joins and the
//! models the runner may serve, and it is revoked by id or by name.
//!
//! The statements live in `runners/queries/*_token*.sql`.

use crate::{credentials, SchedulerError};
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

/// Every runner token starts with this, so a leaked one is easy to recognise.
pub const TOKEN_PREFIX: &str = "rt-fallow-";

/// A runner token as operators see it: never the token itself, only its first characters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct RunnerToken {
    pub id: Uuid,
    pub name: String,
    pub prefix: String,
    /// The pool its runner joins; `None`: the runner's own choice.
    pub pool: Option<String>,
    /// The models its runner may serve and claim; `None`: any.
    pub models: Option<Vec<String>>,
    /// The runner registered with it now, if any.
    pub runner_id: Option<Uuid>,
    pub created_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
}

/// What a new token allows.
#[derive(Debug, Clone, Default)]
pub struct NewRunnerToken {
    pub name: String,
    pub pool: Option<String>,
    pub models: Option<Vec<String>>,
}

/// Why a runner's offer does not fit its token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OfferRefused {
    #[error("the runner token allows pool {allowed:?}, and the runner asked for {asked:?}")]
    Pool { allowed: String, asked: String },
    #[error("the runner token does not allow model {0:?}")]
    Model(String),
}

impl RunnerToken {
    /// Whether the token lets its runner serve `model`: a model it lists, or a LoRA
    /// adapter's queue (`BASE:NAME`) over one.
    pub fn allows_model(&self, model: &str) -> bool {
        let base = fallow_protocol::adapter::base_of(model);
        self.models
            .as_ref()
            .is_none_or(|models| models.iter().any(|m| m == model || m == base))
    }

    /// Checks a registering runner's pool and models against the token; every model must
    /// be allowed, so a runner cannot advertise what its token does not cover.
    pub fn check_offer<'a>(
        &self,
        pool: &str,
        models: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), OfferRefused> {
        if let Some(allowed) = self.pool.as_deref().filter(|allowed| *allowed != pool) {
            return Err(OfferRefused::Pool {
                allowed: allowed.to_string(),
                asked: pool.to_string(),
            });
        }
        match models.into_iter().find(|model| !self.allows_model(model)) {
            Some(model) => Err(OfferRefused::Model(model.to_string())),
            None => Ok(()),
        }
    }
}

/// Creates a token; returns it as operators see it, and the plaintext (shown once). `None`
/// when a live token has that name already.
pub async fn create(
    pool: &PgPool,
    new: &NewRunnerToken,
) -> Result<Option<(RunnerToken, String)>, SchedulerError> {
    let secret = credentials::generate(TOKEN_PREFIX);
    let record: Option<RunnerToken> = sqlx::query_as(include_str!("queries/insert_token.sql"))
        .bind(Uuid::new_v4())
        .bind(&new.name)
        .bind(credentials::hash(&secret))
        .bind(credentials::shown(TOKEN_PREFIX, &secret))
        .bind(new.pool.as_deref())
        .bind(new.models.as_deref())
        .fetch_optional(pool)
        .await?;
    Ok(record.map(|record| (record, secret)))
}

/// The live token a runner presented, if it is one.
pub async fn authenticate(
    pool: &PgPool,
    secret: &str,
) -> Result<Option<RunnerToken>, SchedulerError> {
    Ok(sqlx::query_as(include_str!("queries/token_for_secret.sql"))
        .bind(credentials::hash(secret))
        .fetch_optional(pool)
        .await?)
}

/// The live token with this id.
pub async fn by_id(pool: &PgPool, id: Uuid) -> Result<Option<RunnerToken>, SchedulerError> {
    Ok(sqlx::query_as(include_str!("queries/token_by_id.sql"))
        .bind(id)
        .fetch_optional(pool)
        .await?)
}

/// Every token, revoked ones included, oldest first.
pub async fn list(pool: &PgPool) -> Result<Vec<RunnerToken>, SchedulerError> {
    Ok(sqlx::query_as(include_str!("queries/list_tokens.sql"))
        .fetch_all(pool)
        .await?)
}

/// Binds the token to a runner that just registered with it, marking that runner's
/// transport `gateway`. The runner bound before, if another, is marked dead and its jobs'
/// leases expire: one token, one runner at a time. False when the token was revoked
/// meanwhile.
pub async fn bind_runner(pool: &PgPool, token: Uuid, runner: Uuid) -> Result<bool, SchedulerError> {
    let bound: Option<Uuid> = sqlx::query_scalar(include_str!("queries/bind_token.sql"))
        .bind(token)
        .bind(runner)
        .fetch_optional(pool)
        .await?;
    Ok(bound.is_some())
}

/// Which token to revoke.
#[derive(Debug, Clone)]
pub enum TokenRef {
    Id(Uuid),
    Name(String),
}

impl TokenRef {
    /// A UUID is an id; anything else a name.
    pub fn parse(raw: &str) -> TokenRef {
        raw.parse()
            .map(TokenRef::Id)
            .unwrap_or_else(|_| TokenRef::Name(raw.to_string()))
    }
}

/// Revokes a live token; `None` when no live token matches. The runner bound to it is
/// marked dead and its jobs' leases expire at once.
pub async fn revoke(
    pool: &PgPool,
    which: &TokenRef,
) -> Result<Option<RunnerToken>, SchedulerError> {
    let (id, name) = match which {
        TokenRef::Id(id) => (Some(*id), None),
        TokenRef::Name(name) => (None, Some(name.as_str())),
    };
    Ok(sqlx::query_as(include_str!("queries/revoke_token.sql"))
        .bind(id)
        .bind(name)
        .fetch_optional(pool)
        .await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(pool: Option<&str>, models: Option<&[&str]>) -> RunnerToken {
        RunnerToken {
            id: Uuid::nil(),
            name: "lab-1".into(),
            prefix: "rt-fallow-abcd".into(),
            pool: pool.map(Into::into),
            models: models.map(|m| m.iter().map(|s| s.to_string()).collect()),
            runner_id: None,
            created_at: DateTime::<Utc>::MIN_UTC,
            revoked_at: None,
        }
    }

    #[test]
    fn a_token_without_limits_admits_any_pool_and_model() {
        let open = token(None, None);
        assert_eq!(open.check_offer("gpu-lab", ["smollm2", "gemma"]), Ok(()));
    }

    #[test]
    fn a_token_refuses_another_pool() {
        let pinned = token(Some("lab"), None);
        assert_eq!(pinned.check_offer("lab", ["smollm2"]), Ok(()));
        assert_eq!(
            pinned.check_offer("default", ["smollm2"]),
            Err(OfferRefused::Pool {
                allowed: "lab".into(),
                asked: "default".into()
            })
        );
    }

    #[test]
    fn a_token_refuses_a_model_it_does_not_list() {
        let listed = token(None, Some(&["smollm2"]));
        assert!(listed.allows_model("smollm2"));
        assert!(!listed.allows_model("gemma"));
        assert!(listed.allows_model("smollm2:sql") && listed.allows_model("smollm2:@lora-dir"));
        assert!(
            !listed.allows_model("gemma:sql"),
            "an adapter of a model it does not list"
        );
        assert_eq!(
            listed.check_offer("default", ["smollm2", "gemma"]),
            Err(OfferRefused::Model("gemma".into()))
        );
    }

    #[test]
    fn a_uuid_names_a_token_by_id_and_anything_else_by_name() {
        let id = Uuid::new_v4();
        assert!(matches!(TokenRef::parse(&id.to_string()), TokenRef::Id(x) if x == id));
        assert!(matches!(TokenRef::parse("lab-1"), TokenRef::Name(n) if n == "lab-1"));
    }
}
