//! Fair share: claims split the fleet between tenants by weight and class, interactive work
//! first, and a tenant's `priority` orders only its own jobs.

mod common;

use common::*;
use fallow_scheduler::queue::{JobKind, NewJob, Queue};
use fallow_scheduler::tenants;
use sqlx::PgPool;
use std::time::Duration;
use uuid::Uuid;

const LEASE: Duration = Duration::from_secs(30);

/// Creates the tenant (through a key, as operators do) and returns its id.
async fn tenant(pool: &PgPool, name: &str) -> Uuid {
    tenants::create_key(pool, name).await.unwrap();
    tenants::list(pool)
        .await
        .unwrap()
        .into_iter()
        .find(|t| t.name == name)
        .unwrap()
        .id
}

fn job_of(tenant: Uuid, kind: JobKind, priority: i32) -> NewJob {
    NewJob {
        tenant_id: Some(tenant),
        ..job("m", kind, priority)
    }
}

fn jobs_of(tenant: Uuid, count: usize, priority: i32) -> Vec<NewJob> {
    (0..count)
        .map(|_| job_of(tenant, JobKind::Interactive, priority))
        .collect()
}

async fn claim(queue: &Queue, limit: i64) -> Vec<Uuid> {
    queue
        .claim(Uuid::new_v4(), &models(&["m"]), limit, LEASE)
        .await
        .unwrap()
        .into_iter()
        .map(|j| j.id)
        .collect()
}

#[tokio::test]
async fn one_job_of_a_second_tenant_is_claimed_next_behind_2000_of_the_first() {
    let db = TestDb::new().await;
    let queue = db.queue();
    let a = tenant(&db.pool, "a").await;
    let b = tenant(&db.pool, "b").await;
    queue.enqueue_many(&jobs_of(a, 2000, 0)).await.unwrap();
    assert_eq!(claim(&queue, 4).await.len(), 4, "a's first jobs run");
    queue.clock().advance(Duration::from_secs(1));
    let b_job = queue
        .enqueue(job_of(b, JobKind::Interactive, 0))
        .await
        .unwrap();

    assert_eq!(claim(&queue, 1).await, vec![b_job]);
    db.drop().await;
}

#[tokio::test]
async fn a_tenants_most_urgent_priority_does_not_overtake_another_tenant() {
    let db = TestDb::new().await;
    let queue = db.queue();
    let a = tenant(&db.pool, "a").await;
    let b = tenant(&db.pool, "b").await;
    queue.enqueue_many(&jobs_of(a, 10, 0)).await.unwrap();
    claim(&queue, 2).await;
    let b_job = queue
        .enqueue(job_of(b, JobKind::Interactive, 1000))
        .await
        .unwrap();
    queue.clock().advance(Duration::from_secs(1));
    queue.enqueue_many(&jobs_of(a, 10, -1000)).await.unwrap();

    assert_eq!(claim(&queue, 1).await, vec![b_job]);
    db.drop().await;
}

#[tokio::test]
async fn weights_of_3_to_1_split_claims_3_to_1() {
    let db = TestDb::new().await;
    let queue = db.queue();
    let a = tenant(&db.pool, "a").await;
    let b = tenant(&db.pool, "b").await;
    assert!(set_fair_share(&db.pool, "a", Some(3.0), None).await);
    let a_jobs = queue.enqueue_many(&jobs_of(a, 100, 0)).await.unwrap();
    queue.enqueue_many(&jobs_of(b, 100, 0)).await.unwrap();

    let mut claimed = Vec::new();
    for _ in 0..8 {
        claimed.extend(claim(&queue, 4).await);
    }
    let of_a = claimed.iter().filter(|id| a_jobs.contains(id)).count();
    assert_eq!(claimed.len(), 32);
    assert_eq!((of_a, claimed.len() - of_a), (24, 8));
    db.drop().await;
}

#[tokio::test]
async fn interactive_jobs_come_before_batch_jobs_of_every_tenant() {
    let db = TestDb::new().await;
    let queue = db.queue();
    let a = tenant(&db.pool, "a").await;
    let b = tenant(&db.pool, "b").await;
    // a is idle and of a higher class, and its batch jobs are older: b still goes first.
    set_fair_share(&db.pool, "a", Some(10.0), Some(5)).await;
    let a_batch: Vec<NewJob> = (0..5).map(|_| job_of(a, JobKind::Batch, 0)).collect();
    queue.enqueue_many(&a_batch).await.unwrap();
    queue.clock().advance(Duration::from_secs(1));
    let b_job = queue
        .enqueue(job_of(b, JobKind::Interactive, 0))
        .await
        .unwrap();

    assert_eq!(claim(&queue, 1).await, vec![b_job]);
    db.drop().await;
}

#[tokio::test]
async fn a_higher_class_is_served_first_within_a_band() {
    let db = TestDb::new().await;
    let queue = db.queue();
    let a = tenant(&db.pool, "a").await;
    let b = tenant(&db.pool, "b").await;
    set_fair_share(&db.pool, "a", None, Some(1)).await;
    queue.enqueue_many(&jobs_of(a, 10, 0)).await.unwrap();
    claim(&queue, 5).await;
    let b_job = queue
        .enqueue(job_of(b, JobKind::Interactive, 0))
        .await
        .unwrap();

    let next = claim(&queue, 5).await;
    assert_eq!(next.len(), 5);
    assert!(
        !next.contains(&b_job),
        "a's class keeps b waiting while a has work"
    );
    assert_eq!(claim(&queue, 5).await, vec![b_job]);
    db.drop().await;
}

#[tokio::test]
async fn a_tenants_own_priority_orders_its_own_jobs() {
    let db = TestDb::new().await;
    let queue = db.queue();
    let a = tenant(&db.pool, "a").await;
    let late = queue
        .enqueue(job_of(a, JobKind::Interactive, 5))
        .await
        .unwrap();
    queue.clock().advance(Duration::from_secs(1));
    let urgent = queue
        .enqueue(job_of(a, JobKind::Interactive, -3))
        .await
        .unwrap();
    queue.clock().advance(Duration::from_secs(1));
    let normal = queue
        .enqueue(job_of(a, JobKind::Interactive, 0))
        .await
        .unwrap();

    assert_eq!(claim(&queue, 3).await, vec![urgent, normal, late]);
    db.drop().await;
}

#[tokio::test]
async fn jobs_without_a_tenant_share_as_one_tenant() {
    let db = TestDb::new().await;
    let queue = db.queue();
    let b = tenant(&db.pool, "b").await;
    let anonymous: Vec<NewJob> = (0..50).map(|_| interactive_job("m")).collect();
    queue.enqueue_many(&anonymous).await.unwrap();
    claim(&queue, 3).await;
    let b_job = queue
        .enqueue(job_of(b, JobKind::Interactive, 0))
        .await
        .unwrap();

    assert_eq!(claim(&queue, 1).await, vec![b_job]);
    db.drop().await;
}

/// Sets a tenant's weight and class as the admin API does; false if the tenant is unknown.
async fn set_fair_share(
    pool: &sqlx::PgPool,
    tenant: &str,
    weight: Option<f64>,
    class: Option<i32>,
) -> bool {
    let update = tenants::LimitsUpdate {
        weight,
        class,
        ..tenants::LimitsUpdate::default()
    };
    tenants::set_limits(pool, tenant, &update)
        .await
        .unwrap()
        .is_some()
}
