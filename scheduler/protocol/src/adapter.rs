//! A LoRA adapter a request runs with over its base model, and the queue its job waits in.
//!
//! A job of an adapter is a job of its base: it runs on the base's warm engine. It waits in
//! a queue of its own, though, so that only runners able to serve the adapter claim it:
//! `BASE:NAME` for an adapter runners are configured with (`--lora NAME=PATH`), and
//! `BASE:@lora-dir` for one read by path (`lora_path`) from a runner's `--lora-dir`.

use serde::{Deserialize, Serialize};

/// The queue suffix of adapters read by path from a runner's `--lora-dir`. Adapter names
/// cannot hold `@`, so it never collides with one.
pub const LORA_DIR_QUEUE: &str = "@lora-dir";

/// The longest adapter name.
pub const MAX_ADAPTER_NAME: usize = 128;

/// Which adapter a request runs with.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AdapterRef {
    /// The adapter's name (for one read by path, the path).
    pub name: String,
    /// A path inside the runner's `--lora-dir` (SGLang's `lora_path`), relative and without
    /// `..`; `None`: an adapter the runner is configured with under `name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora_path: Option<String>,
}

impl AdapterRef {
    /// An adapter runners are configured with.
    pub fn named(name: impl Into<String>) -> Self {
        AdapterRef {
            name: name.into(),
            lora_path: None,
        }
    }

    /// An adapter read from `path` inside a runner's `--lora-dir`.
    pub fn at_path(path: impl Into<String>) -> Self {
        let path = path.into();
        AdapterRef {
            name: path.clone(),
            lora_path: Some(path),
        }
    }

    /// The queue of its jobs over `base`.
    pub fn queue(&self, base: &str) -> String {
        match self.lora_path {
            Some(_) => lora_dir_queue(base),
            None => adapter_queue(base, &self.name),
        }
    }
}

/// The queue (and model id) of adapter `name` over `base`: SGLang's `base:adapter`.
pub fn adapter_queue(base: &str, name: &str) -> String {
    format!("{base}:{name}")
}

/// The queue of `base`'s adapters read by path from a `--lora-dir`.
pub fn lora_dir_queue(base: &str) -> String {
    format!("{base}:{LORA_DIR_QUEUE}")
}

/// The base model of a queue: `BASE` of `BASE:NAME` when `NAME` is an adapter name or the
/// lora-dir suffix, else the queue itself (a base model's queue, whose id may hold `:`).
pub fn base_of(queue: &str) -> &str {
    match queue.rsplit_once(':') {
        Some((base, suffix))
            if !base.is_empty() && (suffix == LORA_DIR_QUEUE || is_adapter_name(suffix)) =>
        {
            base
        }
        _ => queue,
    }
}

/// Whether `name` may name an adapter: 1 to [`MAX_ADAPTER_NAME`] letters, digits, `.`, `_`
/// or `-`, not starting with `.`.
pub fn is_adapter_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_ADAPTER_NAME
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_named_adapter_waits_in_its_own_queue_and_a_path_in_the_lora_dir_queue() {
        assert_eq!(AdapterRef::named("sql").queue("smollm2"), "smollm2:sql");
        assert_eq!(
            AdapterRef::at_path("team/sql").queue("smollm2"),
            "smollm2:@lora-dir"
        );
    }

    #[test]
    fn the_base_of_a_queue_is_what_precedes_an_adapter_suffix() {
        assert_eq!(base_of("smollm2:sql"), "smollm2");
        assert_eq!(base_of("smollm2:@lora-dir"), "smollm2");
        assert_eq!(base_of("smollm2"), "smollm2");
        assert_eq!(base_of("org/model:v1:sql"), "org/model:v1");
        assert_eq!(base_of(":sql"), ":sql");
        assert_eq!(base_of("model:bad name"), "model:bad name");
    }

    #[test]
    fn adapter_names_are_plain_words() {
        assert!(is_adapter_name("sql-expert_v2.1"));
        for bad in [
            "",
            ".hidden",
            "a/b",
            "a:b",
            "a b",
            "@lora-dir",
            &"x".repeat(129),
        ] {
            assert!(!is_adapter_name(bad), "{bad:?}");
        }
    }
}
