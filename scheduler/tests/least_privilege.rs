//! Least-privilege database roles (docs/deploy.md): a service whose role may not create
//! objects starts on a schema `fallow migrate` brought up to date, is told to run it when
//! the schema is behind, and a direct runner's documented grants cover what it does.

mod common;

use common::*;
use fallow_scheduler::db;
use fallow_scheduler::queue::{Checkpoint, Queue};
use fallow_scheduler::runners::{self, RunnerState};
use fallow_scheduler::SchedulerError;
use sqlx::postgres::PgConnectOptions;
use sqlx::{Executor, PgPool};
use std::str::FromStr;
use std::time::Duration;

const LEASE: Duration = Duration::from_secs(30);

/// A login role of its own for one test, dropped with [`Role::drop`].
struct Role {
    name: String,
    /// The test database's URL, logging in as this role.
    url: String,
}

impl Role {
    async fn create(owner: &PgPool, schema: &str, grants: &str) -> Role {
        let name = format!("r_{}", uuid::Uuid::new_v4().simple());
        owner
            .execute(format!("CREATE ROLE {name} LOGIN").as_str())
            .await
            .unwrap();
        // USAGE only: no CREATE on the schema.
        owner
            .execute(format!("GRANT USAGE ON SCHEMA {schema} TO {name}").as_str())
            .await
            .unwrap();
        for grant in grants.split(';').map(str::trim).filter(|g| !g.is_empty()) {
            owner
                .execute(format!("{grant} TO {name}").as_str())
                .await
                .unwrap();
        }
        let base = fallow_protocol::testing::test_database_url();
        let options = PgConnectOptions::from_str(&base).unwrap();
        let url = format!(
            "postgres://{name}@{}:{}/{}",
            options.get_host(),
            options.get_port(),
            options.get_database().unwrap_or("postgres")
        );
        Role { name, url }
    }

    async fn connect(&self, schema: &str) -> PgPool {
        db::connect(&self.url, Some(schema)).await.unwrap()
    }

    /// After the test schema is dropped, which takes the role's grants with it.
    async fn drop(self, superuser: &PgPool) {
        superuser
            .execute(format!("DROP ROLE IF EXISTS {}", self.name).as_str())
            .await
            .unwrap();
    }
}

/// The api's and the scheduler's role in docs/deploy.md, less `CREATE`.
const APP_GRANTS: &str = "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema}";

/// A direct runner's role in docs/deploy.md.
const RUNNER_GRANTS: &str = "GRANT SELECT, INSERT, UPDATE, DELETE ON runners;
    GRANT SELECT, UPDATE ON jobs;
    GRANT SELECT (id, weight, class) ON tenants;
    GRANT SELECT ON _sqlx_migrations";

/// Drops the test's schema, then its role (whose grants went with the schema).
async fn clean_up(db: TestDb, role: Role, pool: PgPool) {
    pool.close().await;
    let superuser = db::connect(&fallow_protocol::testing::test_database_url(), None)
        .await
        .unwrap();
    db.drop().await;
    role.drop(&superuser).await;
}

#[tokio::test]
async fn a_role_without_create_starts_on_a_schema_that_is_up_to_date() {
    let db = TestDb::new().await;
    let grants = APP_GRANTS.replace("{schema}", &db.schema);
    let role = Role::create(&db.pool, &db.schema, &grants).await;
    let pool = role.connect(&db.schema).await;

    db::ensure_migrated(&pool)
        .await
        .expect("nothing to apply, so no CREATE needed");
    // And it works as the api: a key and a job.
    fallow_scheduler::tenants::create_key(&pool, "acme")
        .await
        .unwrap();
    Queue::new(pool.clone(), fallow_scheduler::clock::Clock::system())
        .enqueue(interactive_job("m"))
        .await
        .unwrap();

    clean_up(db, role, pool).await;
}

#[tokio::test]
async fn a_role_without_create_is_told_to_run_fallow_migrate_when_the_schema_is_behind() {
    let db = TestDb::new().await;
    let grants = APP_GRANTS.replace("{schema}", &db.schema);
    let role = Role::create(&db.pool, &db.schema, &grants).await;
    // As if this binary were one migration newer than the schema.
    db.pool
        .execute("DELETE FROM _sqlx_migrations WHERE version = (SELECT max(version) FROM _sqlx_migrations)")
        .await
        .unwrap();
    let pool = role.connect(&db.schema).await;

    let err = db::ensure_migrated(&pool).await.unwrap_err();
    assert!(
        matches!(err, SchedulerError::MigrationsPending { pending: 1, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("run `fallow migrate`"), "{err}");

    clean_up(db, role, pool).await;
}

#[tokio::test]
async fn a_direct_runner_does_its_whole_round_with_the_documented_grants() {
    let db = TestDb::new().await;
    let role = Role::create(&db.pool, &db.schema, RUNNER_GRANTS).await;
    let enqueued = db.queue().enqueue(interactive_job("m")).await.unwrap();
    let pool = role.connect(&db.schema).await;
    db::ensure_migrated(&pool).await.unwrap();
    let queue = Queue::new(pool.clone(), fallow_scheduler::clock::Clock::system());

    let me = runners::register(&pool, &runner_info(&["m"], &[]))
        .await
        .unwrap();
    runners::set_warm(&pool, me, &models(&["m"])).await.unwrap();
    assert_eq!(
        runners::heartbeat(&pool, me, 0).await.unwrap(),
        RunnerState::Active
    );
    runners::take_evictions(&pool, me).await.unwrap();
    runners::pool_turn(&pool, me, true, 1.0).await.unwrap();
    let claimed = queue.claim(me, &models(&["m"]), 4, LEASE).await.unwrap();
    assert_eq!(claimed.len(), 1);
    let job = &claimed[0];
    assert_eq!(job.id, enqueued);
    queue
        .mark_all_streamed(&[(job.id, job.attempt)], None)
        .await
        .unwrap();
    let checkpoint = Checkpoint {
        id: job.id,
        attempt: job.attempt,
        progress: None,
        generated: 1,
    };
    queue
        .renew_with_checkpoints(me, &[checkpoint], LEASE)
        .await
        .unwrap();
    assert!(queue
        .complete(job.id, job.attempt, &completion("hello"))
        .await
        .unwrap());
    runners::report_state(&pool, me, &[RunnerState::Active], RunnerState::Draining)
        .await
        .unwrap();
    runners::deregister(&pool, me).await.unwrap();

    // And nothing beyond its grants: it may not read keys or insert jobs.
    assert!(fallow_scheduler::tenants::create_key(&pool, "mallory")
        .await
        .is_err());
    assert!(queue.enqueue(interactive_job("m")).await.is_err());

    clean_up(db, role, pool).await;
}
