//! Runner tokens: created once, known only by hash, unique by live name, revoked by id or
//! name; revoking one hands its runner's jobs back.

mod common;

use common::TestDb;
use fallow_scheduler::queue::JobState;
use fallow_scheduler::runners;
use fallow_scheduler::runners::tokens::{self, NewRunnerToken, TokenRef};
use std::time::Duration;

fn new(name: &str) -> NewRunnerToken {
    NewRunnerToken {
        name: name.into(),
        pool: Some("lab".into()),
        models: Some(vec!["smollm2".into()]),
    }
}

#[tokio::test]
async fn a_created_token_authenticates_with_what_it_allows() {
    let db = TestDb::new().await;
    let (record, secret) = tokens::create(&db.pool, &new("lab-1"))
        .await
        .unwrap()
        .expect("created");
    assert!(secret.starts_with(tokens::TOKEN_PREFIX));
    assert!(secret.starts_with(&record.prefix) && record.prefix.len() < secret.len());
    let found = tokens::authenticate(&db.pool, &secret)
        .await
        .unwrap()
        .expect("the token authenticates");
    assert_eq!(found, record);
    assert_eq!(found.pool.as_deref(), Some("lab"));
    assert_eq!(found.models, Some(vec!["smollm2".to_string()]));
    assert!(tokens::authenticate(&db.pool, "rt-fallow-nope")
        .await
        .unwrap()
        .is_none());
    db.drop().await;
}

#[tokio::test]
async fn tokens_are_stored_only_as_hashes() {
    let db = TestDb::new().await;
    let (_, secret) = tokens::create(&db.pool, &new("lab-1"))
        .await
        .unwrap()
        .expect("created");
    let stored: String = sqlx::query_scalar("SELECT row_to_json(t)::text FROM runner_tokens t")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(!stored.contains(&secret), "{stored}");
    assert!(stored.contains(&fallow_scheduler::credentials::hash(&secret)));
    db.drop().await;
}

#[tokio::test]
async fn a_live_name_is_taken_until_its_token_is_revoked() {
    let db = TestDb::new().await;
    let (first, first_secret) = tokens::create(&db.pool, &new("lab-1"))
        .await
        .unwrap()
        .expect("created");
    assert!(
        tokens::create(&db.pool, &new("lab-1"))
            .await
            .unwrap()
            .is_none(),
        "a second live token with the name"
    );
    let revoked = tokens::revoke(&db.pool, &TokenRef::Name("lab-1".into()))
        .await
        .unwrap()
        .expect("revoked by name");
    assert_eq!(revoked.id, first.id);
    assert!(revoked.revoked_at.is_some());
    assert!(
        tokens::authenticate(&db.pool, &first_secret)
            .await
            .unwrap()
            .is_none(),
        "a revoked token no longer authenticates"
    );
    let (second, _) = tokens::create(&db.pool, &new("lab-1"))
        .await
        .unwrap()
        .expect("the name is free again");
    assert!(tokens::revoke(&db.pool, &TokenRef::Id(first.id))
        .await
        .unwrap()
        .is_none());
    assert!(tokens::revoke(&db.pool, &TokenRef::Id(second.id))
        .await
        .unwrap()
        .is_some());
    let listed = tokens::list(&db.pool).await.unwrap();
    assert_eq!(
        listed.iter().map(|t| t.id).collect::<Vec<_>>(),
        vec![first.id, second.id]
    );
    assert!(listed.iter().all(|t| t.revoked_at.is_some()));
    db.drop().await;
}

#[tokio::test]
async fn revoking_a_token_hands_its_runners_jobs_back_without_using_an_attempt() {
    let db = TestDb::new().await;
    let queue = db.queue();
    let (token, _) = tokens::create(&db.pool, &new("lab-1"))
        .await
        .unwrap()
        .expect("created");
    let runner = common::register_runner(&db.pool, &["m"], &["m"]).await;
    assert!(tokens::bind_runner(&db.pool, token.id, runner)
        .await
        .unwrap());
    let mut one_shot = common::batch_job("m");
    one_shot.max_attempts = 1;
    let id = queue.enqueue(one_shot).await.unwrap();
    let held = queue
        .claim(runner, &common::models(&["m"]), 1, Duration::from_secs(300))
        .await
        .unwrap();
    assert_eq!(held.len(), 1);

    tokens::revoke(&db.pool, &TokenRef::Id(token.id))
        .await
        .unwrap()
        .expect("revoked");
    assert_eq!(
        queue.reap_expired().await.unwrap(),
        1,
        "the lease expired at once"
    );
    let job = queue.get(id).await.unwrap().expect("the job");
    assert_eq!(job.state, JobState::Queued, "{job:?}");
    assert_eq!(
        (job.attempt, job.max_attempts),
        (1, 2),
        "its only attempt is given back"
    );
    let state = runners::state(&db.pool, runner).await.unwrap();
    assert_eq!(state, Some(runners::RunnerState::Dead));
    db.drop().await;
}
