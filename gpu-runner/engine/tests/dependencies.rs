//! The engine's boundary as a compiler fact: its dependency tree holds no database, queue,
//! stream, cloud or HTTP client, and none of Fallow's service crates. What it shares with
//! them comes through `fallow-protocol` alone.

use std::path::Path;
use std::process::Command;

/// Crates whose presence would mean the engine can reach jobs, Postgres, Redis, S3 or HTTP.
fn forbidden(name: &str) -> bool {
    const EXACT: [&str; 6] = [
        "fallow-api",
        "fallow-scheduler",
        "fallow-runner",
        "axum",
        "hyper",
        "reqwest",
    ];
    const PREFIXES: [&str; 3] = ["sqlx", "redis", "aws-"];
    EXACT.contains(&name) || PREFIXES.iter().any(|p| name.starts_with(p))
}

/// Package names of `cargo tree -p PACKAGE` over normal, build and dev edges.
fn dependency_names(package: &str) -> Vec<String> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml");
    let output = Command::new(env!("CARGO"))
        .args(["tree", "--locked", "--offline", "-p", package])
        .args([
            "-e",
            "normal,build,dev",
            "--prefix",
            "none",
            "--format",
            "{p}",
        ])
        .arg("--manifest-path")
        .arg(&manifest)
        .output()
        .expect("cargo runs");
    assert!(
        output.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

#[test]
fn the_engine_depends_on_no_database_queue_cloud_or_http_crate() {
    let names = dependency_names("fallow-engine");
    assert!(
        names.iter().any(|n| n == "fallow-protocol"),
        "the tree should list the engine's vocabulary crate: {names:?}"
    );
    let reached: Vec<&String> = names.iter().filter(|n| forbidden(n)).collect();
    assert!(reached.is_empty(), "fallow-engine depends on {reached:?}");
}

#[test]
fn the_shared_vocabulary_depends_on_no_database_queue_cloud_or_http_crate() {
    let names = dependency_names("fallow-protocol");
    let reached: Vec<&String> = names.iter().filter(|n| forbidden(n)).collect();
    assert!(reached.is_empty(), "fallow-protocol depends on {reached:?}");
}

#[test]
fn the_check_would_catch_the_scheduler() {
    // The runner reaches sqlx, redis and the AWS SDK through the scheduler: the same check
    // over its tree must find them, or the two tests above prove nothing.
    let names = dependency_names("fallow-runner");
    for wanted in ["fallow-scheduler", "sqlx", "redis", "aws-sdk-s3"] {
        assert!(
            names.iter().any(|n| n == wanted && forbidden(n)),
            "{wanted} should be in fallow-runner's tree and forbidden in the engine's"
        );
    }
}
