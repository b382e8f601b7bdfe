//! For tests of every crate: where the test services are (the tests' own edge, the one
//! place their variables are read), and what a test does when the machine lacks something
//! it needs (a fetched model, NVRTC, a C++ compiler). Outside CI it skips, saying why; in CI
//! (`CI=true`, which `.ci/run` sets) it fails, because `infra/test.sh` installs everything the
//! suite needs and a skip there would hide a broken install as a pass.

/// Whether every prerequisite of the suite must be present: `CI` is `true` or `1`.
pub fn prerequisites_required() -> bool {
    matches!(std::env::var("CI").as_deref(), Ok("true" | "1"))
}

/// Gives up on a test for want of `what`: prints `SKIPPED: what` and returns, or, where
/// [`prerequisites_required`], panics. Callers return right after.
#[track_caller]
pub fn skip_for_want_of(what: &str) {
    if prerequisites_required() {
        panic!("{what}: CI=true requires it (infra/test.sh installs it), so this is a failure, not a skip");
    }
    eprintln!("SKIPPED: {what}");
}

/// The Postgres the tests use: `FALLOW_TEST_DATABASE_URL`, or the local one.
pub fn test_database_url() -> String {
    std::env::var("FALLOW_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_string())
}

/// The Redis the tests use: `FALLOW_TEST_REDIS_URL`, or the local one.
pub fn test_redis_url() -> String {
    std::env::var("FALLOW_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}
