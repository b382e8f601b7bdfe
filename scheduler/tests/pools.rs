//! Pools: at most a share of a pool's runners is lent at once, the oldest runners with idle
//! owners first.

mod common;

use common::*;
use fallow_scheduler::runners::{self, RunnerInfo, RunnerState};
use uuid::Uuid;

async fn member(db: &TestDb, pool: &str) -> Uuid {
    let info = RunnerInfo {
        pool: pool.into(),
        ..runner_info(&["m"], &["m"])
    };
    runners::register(&db.pool, &info).await.unwrap()
}

async fn turn(db: &TestDb, runner: Uuid, owner_idle: bool, share: f64) -> bool {
    runners::pool_turn(&db.pool, runner, owner_idle, share)
        .await
        .unwrap()
}

#[tokio::test]
async fn half_of_a_pool_of_three_lends_one_runner_the_oldest_first() {
    let db = TestDb::new().await;
    let first = member(&db, "office").await;
    let second = member(&db, "office").await;
    let third = member(&db, "office").await;
    member(&db, "elsewhere").await;

    assert!(turn(&db, first, true, 0.5).await);
    assert!(!turn(&db, second, true, 0.5).await);
    assert!(!turn(&db, third, true, 0.5).await);
    db.drop().await;
}

#[tokio::test]
async fn a_runner_whose_owner_returns_gives_its_place_to_the_next() {
    let db = TestDb::new().await;
    let first = member(&db, "office").await;
    let second = member(&db, "office").await;
    assert!(turn(&db, first, true, 0.5).await);
    assert!(!turn(&db, second, true, 0.5).await);

    assert!(!turn(&db, first, false, 0.5).await, "its owner is back");
    assert!(turn(&db, second, true, 0.5).await);
    db.drop().await;
}

#[tokio::test]
async fn runners_out_of_service_are_not_counted_in_their_pool() {
    let db = TestDb::new().await;
    let cordoned = member(&db, "office").await;
    let a = member(&db, "office").await;
    let b = member(&db, "office").await;
    runners::set_state(&db.pool, cordoned, RunnerState::Cordoned)
        .await
        .unwrap();
    assert!(turn(&db, a, true, 0.5).await, "half of two is one");
    assert!(!turn(&db, b, true, 0.5).await);
    db.drop().await;
}

#[tokio::test]
async fn a_whole_pool_may_be_lent_and_an_unknown_runner_never_is() {
    let db = TestDb::new().await;
    let a = member(&db, "office").await;
    let b = member(&db, "office").await;
    assert!(turn(&db, a, true, 1.0).await);
    assert!(turn(&db, b, true, 1.0).await);
    assert!(!turn(&db, Uuid::new_v4(), true, 1.0).await);
    db.drop().await;
}
