//! The `fallow` binary keeps its secrets and refuses unsafe starts: `--no-auth` off
//! loopback, placeholder admin tokens, passwords in `--help` or in error messages. Each
//! case fails before any service is needed (a dead Postgres port stands in for one).

use std::path::Path;
use std::process::{Command, Output};

const PASSWORD: &str = "hunter2-do-not-print";

/// Runs `fallow ARGS` in `dir` (so no `fallow.toml` of the checkout is read), with none of
/// the caller's `FALLOW_*` settings.
fn fallow(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_fallow"));
    command.current_dir(dir).args(args);
    for (name, _) in std::env::vars() {
        if name.starts_with("FALLOW_") {
            command.env_remove(name);
        }
    }
    command.envs(env.iter().copied());
    command.output().expect("fallow runs")
}

fn printed(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn dead_database() -> String {
    format!("postgres://fallow:{PASSWORD}@127.0.0.1:1/fallow")
}

#[test]
fn no_auth_on_a_public_address_refuses_to_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = fallow(
        dir.path(),
        &["api", "--no-auth", "--listen", "0.0.0.0:0"],
        &[],
    );
    assert!(!out.status.success());
    let text = printed(&out);
    assert!(text.contains("--no-auth-on-public-address"), "{text}");
}

#[test]
fn fallow_dev_on_a_public_address_refuses_to_start_without_keys() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = fallow(dir.path(), &["dev", "--listen", "0.0.0.0:0"], &[]);
    assert!(!out.status.success());
    assert!(printed(&out).contains("--no-auth-on-public-address"));
}

#[test]
fn a_placeholder_admin_token_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = fallow(
        dir.path(),
        &["api", "--listen", "127.0.0.1:0"],
        &[("FALLOW_ADMIN_TOKEN", "CHANGE-ME")],
    );
    assert!(!out.status.success());
    let text = printed(&out);
    assert!(text.contains("placeholder"), "{text}");
}

#[test]
fn the_admin_token_file_is_read_and_checked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let short = dir.path().join("short-token");
    std::fs::write(&short, "k3Jx9q\n").expect("write");
    let out = fallow(
        dir.path(),
        &["api", "--admin-token-file", short.to_str().expect("utf-8")],
        &[],
    );
    let text = printed(&out);
    assert!(!out.status.success());
    assert!(text.contains("at least 16"), "{text}");
    assert!(
        !text.contains("k3Jx9q"),
        "the token is never printed: {text}"
    );

    // A good token gets past the check, to the (dead) database, whose password stays hidden.
    let good = dir.path().join("token");
    std::fs::write(&good, "9d1e7c3b5a2f4e6d8c0b7a6f\n").expect("write");
    let out = fallow(
        dir.path(),
        &[
            "api",
            "--admin-token-file",
            good.to_str().expect("utf-8"),
            "--database-url",
            &dead_database(),
        ],
        &[],
    );
    let text = printed(&out);
    assert!(!out.status.success());
    assert!(text.contains("connecting to Postgres at"), "{text}");
    assert!(text.contains("fallow:***@127.0.0.1:1"), "{text}");
    assert!(!text.contains(PASSWORD), "{text}");
}

#[test]
fn help_does_not_print_a_password_set_in_the_environment() {
    let dir = tempfile::tempdir().expect("tempdir");
    let secret_env = [
        ("FALLOW_DATABASE_URL", dead_database()),
        (
            "FALLOW_REDIS_URL",
            format!("redis://:{PASSWORD}@127.0.0.1:1/"),
        ),
        ("FALLOW_ADMIN_TOKEN", format!("{PASSWORD}-admin")),
    ];
    let env: Vec<(&str, &str)> = secret_env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    for command in ["api", "dev", "runner", "migrate"] {
        let out = fallow(dir.path(), &[command, "--help"], &env);
        let text = printed(&out);
        assert!(out.status.success(), "{text}");
        assert!(text.contains("--database-url"), "{text}");
        assert!(
            !text.contains(PASSWORD),
            "`fallow {command} --help`: {text}"
        );
    }
}
