//! What the engine's integration tests share: finding the real models.

use std::path::PathBuf;

/// `models/<name>` in the repository, or `None` after saying it is missing (a failure under
/// `CI=true`, see `fallow_protocol::testing::skip_for_want_of`).
pub fn model_file(name: &str) -> Option<PathBuf> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models")
        .join(name);
    if path.exists() {
        Some(path)
    } else {
        fallow_protocol::testing::skip_for_want_of(&format!(
            "{} (scripts/fetch-models.sh, with --gemma for Gemma, --minilm for all-MiniLM-L6-v2)",
            path.display()
        ));
        None
    }
}
