//! What one claim costs at 100k queued jobs across 100 tenants, against the single-order
//! claim it replaced. A measurement, not a check: run it with
//! `cargo test -p fallow-scheduler --release --test claim_cost -- --ignored --nocapture`
//! and copy the figures into `docs/performance.md`.

mod common;

use chrono::Utc;
use common::*;
use fallow_scheduler::queue::NewJob;
use fallow_scheduler::tenants;
use std::time::{Duration, Instant};
use uuid::Uuid;

const TENANTS: usize = 100;
const JOBS: usize = 100_000;
const ROUNDS: usize = 25;

#[tokio::test]
#[ignore = "a benchmark: about a minute, prints the figures"]
async fn one_claim_at_100k_queued_jobs_across_100_tenants() {
    let db = TestDb::new().await;
    let queue = db.queue();
    for t in 0..TENANTS {
        let name = format!("tenant-{t}");
        tenants::create_key(&db.pool, &name).await.unwrap();
    }
    let tenant_ids: Vec<Uuid> = tenants::list(&db.pool)
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.id)
        .collect();
    for chunk in (0..JOBS).collect::<Vec<_>>().chunks(10_000) {
        let jobs: Vec<NewJob> = chunk
            .iter()
            .map(|&i| NewJob {
                tenant_id: Some(tenant_ids[i % TENANTS]),
                // Spread over the whole priority range, so the old claim's order is global.
                ..interactive_job_with_priority((i * 7919 % 2001) as i32 - 1000)
            })
            .collect();
        queue.enqueue_many(&jobs).await.unwrap();
    }
    sqlx::query("CREATE INDEX jobs_claim_idx ON jobs (state, model, priority, created_at, id)")
        .execute(&db.pool)
        .await
        .unwrap();
    sqlx::query("ANALYZE jobs").execute(&db.pool).await.unwrap();

    for limit in [1_i64, 8, 32] {
        let fair = median(
            time_rounds(|| async {
                queue
                    .claim(
                        Uuid::new_v4(),
                        &models(&["m"]),
                        limit,
                        Duration::from_secs(30),
                    )
                    .await
                    .unwrap()
                    .len()
            })
            .await,
        );
        let single = median(
            time_rounds(|| async {
                let now = Utc::now();
                sqlx::query(include_str!("claim_cost/single_order_claim.sql"))
                    .bind(vec!["m".to_string()])
                    .bind(now)
                    .bind(limit)
                    .bind(Uuid::new_v4())
                    .bind(now + chrono::Duration::seconds(30))
                    .bind(vec![true])
                    .bind(now)
                    .bind(10.0_f64)
                    .fetch_all(&db.pool)
                    .await
                    .unwrap()
                    .len()
            })
            .await,
        );
        println!(
            "claim of {limit:>2} at {JOBS} queued / {TENANTS} tenants: fair {:.2} ms, single-order {:.2} ms, ratio {:.1}",
            fair.as_secs_f64() * 1e3,
            single.as_secs_f64() * 1e3,
            fair.as_secs_f64() / single.as_secs_f64()
        );
    }
    db.drop().await;
}

fn interactive_job_with_priority(priority: i32) -> NewJob {
    job("m", fallow_scheduler::queue::JobKind::Interactive, priority)
}

async fn time_rounds<F, Fut>(mut claim: F) -> Vec<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = usize>,
{
    let mut times = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let started = Instant::now();
        assert!(claim().await > 0, "the claim found work");
        times.push(started.elapsed());
    }
    times
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}
