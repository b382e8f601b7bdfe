//! Tenants, API keys and the runner registry.

mod common;

use common::TestDb;
use fallow_scheduler::runners::{self, RunnerInfo, RunnerState};
use fallow_scheduler::tenants;
use std::time::Duration;

#[tokio::test]
async fn a_created_key_finds_its_tenant() {
    let db = TestDb::new().await;
    let key = tenants::create_key(&db.pool, "acme").await.unwrap();
    assert!(key.starts_with("sk-fallow-"));
    assert_eq!(key.len(), "sk-fallow-".len() + 32);

    let tenant = tenants::tenant_for_key(&db.pool, &key)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(tenant.name, "acme");
    assert_eq!(tenant.max_active_jobs, 64);

    let second = tenants::create_key(&db.pool, "acme").await.unwrap();
    assert_ne!(key, second);
    let same = tenants::tenant_for_key(&db.pool, &second)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        same.id, tenant.id,
        "a second key belongs to the same tenant"
    );
    db.drop().await;
}

#[tokio::test]
async fn an_unknown_key_finds_no_tenant() {
    let db = TestDb::new().await;
    tenants::create_key(&db.pool, "acme").await.unwrap();
    let none = tenants::tenant_for_key(&db.pool, "sk-fallow-nope")
        .await
        .unwrap();
    assert!(none.is_none());
    db.drop().await;
}

#[tokio::test]
async fn a_revoked_key_finds_no_tenant() {
    let db = TestDb::new().await;
    let key = tenants::create_key(&db.pool, "acme").await.unwrap();
    assert!(tenants::revoke_key(&db.pool, &key).await.unwrap());
    assert!(tenants::tenant_for_key(&db.pool, &key)
        .await
        .unwrap()
        .is_none());
    assert!(!tenants::revoke_key(&db.pool, &key).await.unwrap());
    db.drop().await;
}

#[tokio::test]
async fn keys_are_stored_only_as_hashes() {
    let db = TestDb::new().await;
    let key = tenants::create_key(&db.pool, "acme").await.unwrap();
    let (hash, prefix): (String, String) = sqlx::query_as("SELECT key_hash, prefix FROM api_keys")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(hash, tenants::hash_key(&key));
    assert!(key.starts_with(&prefix) && prefix.len() < key.len());
    db.drop().await;
}

fn info(models: &[&str]) -> RunnerInfo {
    common::runner_info(models, models)
}

#[tokio::test]
async fn live_models_lists_each_model_of_live_runners_once() {
    let db = TestDb::new().await;
    let a = runners::register(&db.pool, &info(&["smol", "qwen"]))
        .await
        .unwrap();
    let b = runners::register(&db.pool, &info(&["smol"])).await.unwrap();
    let cordoned = runners::register(&db.pool, &info(&["gemma"]))
        .await
        .unwrap();
    let stale = runners::register(&db.pool, &info(&["llama"]))
        .await
        .unwrap();
    runners::set_state(&db.pool, cordoned, RunnerState::Cordoned)
        .await
        .unwrap();
    sqlx::query("UPDATE runners SET last_heartbeat = now() - interval '1 minute' WHERE id = $1")
        .bind(stale)
        .execute(&db.pool)
        .await
        .unwrap();
    runners::heartbeat(&db.pool, a, 2).await.unwrap();

    let ids: Vec<String> = runners::live_models(&db.pool)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.id)
        .collect();
    assert_eq!(ids, vec!["qwen", "smol"]);

    runners::deregister(&db.pool, a).await.unwrap();
    runners::deregister(&db.pool, b).await.unwrap();
    assert!(runners::live_models(&db.pool).await.unwrap().is_empty());
    db.drop().await;
}

#[tokio::test]
async fn a_heartbeat_records_in_flight_jobs() {
    let db = TestDb::new().await;
    let id = runners::register(&db.pool, &info(&["smol"])).await.unwrap();
    runners::heartbeat(&db.pool, id, 3).await.unwrap();
    let record = runners::get(&db.pool, id).await.unwrap().unwrap();
    assert_eq!(record.in_flight, 3);
    assert_eq!(record.state, "active");
    assert_eq!(record.models, info(&["smol"]).models);

    runners::deregister(&db.pool, id).await.unwrap();
    assert!(
        runners::heartbeat(&db.pool, id, 0).await.is_err(),
        "a deregistered runner is unknown"
    );
    // An unknown state no longer reaches the database: it is refused where it is parsed.
    assert!("bogus".parse::<RunnerState>().is_err());
    db.drop().await;
}

#[tokio::test]
async fn every_runner_state_round_trips_through_the_text_column() {
    let db = TestDb::new().await;
    let id = runners::register(&db.pool, &info(&["smol"])).await.unwrap();
    for state in RunnerState::ALL {
        assert!(runners::set_state(&db.pool, id, state).await.unwrap());
        // The column holds the lowercase word the migrations' CHECK allows...
        let stored: String = sqlx::query_scalar("SELECT state FROM runners WHERE id = $1")
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
        assert_eq!(stored, state.as_str());
        // ...it reads back as the same state, and the operators' JSON shows that word.
        assert_eq!(runners::state(&db.pool, id).await.unwrap(), Some(state));
        let record = runners::get(&db.pool, id).await.unwrap().unwrap();
        assert_eq!(record.state, state);
        let json = serde_json::to_value(&record).unwrap();
        assert_eq!(json["state"], state.as_str());
    }
    db.drop().await;
}

#[tokio::test]
async fn a_drain_with_a_deadline_tells_the_runner_how_long_it_has_left() {
    let db = TestDb::new().await;
    let id = runners::register(&db.pool, &info(&["smol"])).await.unwrap();
    assert_eq!(runners::drain_left(&db.pool, id).await.unwrap(), None);

    assert!(runners::drain(&db.pool, id, Some(Duration::from_secs(30)))
        .await
        .unwrap());
    let left = runners::drain_left(&db.pool, id).await.unwrap().unwrap();
    assert!(
        left > Duration::from_secs(25) && left <= Duration::from_secs(30),
        "{left:?}"
    );

    assert!(runners::drain(&db.pool, id, Some(Duration::ZERO))
        .await
        .unwrap());
    let left = runners::drain_left(&db.pool, id).await.unwrap().unwrap();
    assert!(
        left < Duration::from_secs(1),
        "a deadline now has nothing left"
    );

    assert!(runners::drain(&db.pool, id, None).await.unwrap());
    assert_eq!(
        runners::drain_left(&db.pool, id).await.unwrap(),
        None,
        "no deadline"
    );
    runners::drain(&db.pool, id, Some(Duration::from_secs(30)))
        .await
        .unwrap();
    assert!(runners::set_state(&db.pool, id, RunnerState::Active)
        .await
        .unwrap());
    assert_eq!(
        runners::drain_left(&db.pool, id).await.unwrap(),
        None,
        "resuming clears it"
    );
    db.drop().await;
}
