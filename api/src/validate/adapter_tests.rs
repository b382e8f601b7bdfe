use super::*;
use crate::error::ApiError;
use serde_json::json;

fn base(id: &str, lora_dir: bool) -> ModelEntry {
    ModelEntry {
        id: id.into(),
        context_length: 2048,
        owned_by: "fallow".into(),
        created: 0,
        tool_parser: Some("hermes".into()),
        reasoning_parser: None,
        kind: ModelKind::Chat,
        dimensions: None,
        matryoshka_dimensions: Vec::new(),
        parent: None,
        lora_dir,
        lora_path: None,
    }
}

fn adapter(base_entry: &ModelEntry, name: &str) -> ModelEntry {
    ModelEntry {
        id: format!("{}:{name}", base_entry.id),
        parent: Some(base_entry.id.clone()),
        lora_dir: false,
        ..base_entry.clone()
    }
}

fn fleet() -> Vec<ModelEntry> {
    let (smol, gemma) = (base("smollm2", true), base("gemma3", false));
    vec![
        adapter(&smol, "sql"),
        adapter(&smol, "shared"),
        adapter(&gemma, "shared"),
        smol,
        gemma,
    ]
}

fn served(base: &str, adapter: Option<AdapterRef>) -> ServedModel {
    ServedModel {
        base: base.into(),
        adapter,
    }
}

fn param(err: ApiError) -> (u16, Option<String>) {
    let (status, body) = err.status_and_body();
    (status.as_u16(), body.error.param)
}

#[test]
fn a_base_model_runs_without_an_adapter() {
    let models = fleet();
    let (entry, got) = resolve(&models, "smollm2", None).unwrap();
    assert_eq!(
        (entry.id.as_str(), got),
        ("smollm2", served("smollm2", None))
    );
}

#[test]
fn base_colon_name_and_a_unique_bare_name_both_name_the_adapter_over_its_base() {
    let models = fleet();
    let want = served("smollm2", Some(AdapterRef::named("sql")));
    for asked in ["smollm2:sql", "sql"] {
        let (entry, got) = resolve(&models, asked, None).unwrap();
        assert_eq!(got, want, "{asked}");
        assert_eq!(
            entry.tool_parser.as_deref(),
            Some("hermes"),
            "the base's syntax"
        );
    }
    let mut request = GenerateRequest::chat("smollm2:sql", Vec::new(), Default::default());
    want.apply(&mut request);
    assert_eq!(
        (request.model.as_str(), request.queue_model().as_str()),
        ("smollm2", "smollm2:sql")
    );
}

#[test]
fn an_unknown_adapter_is_404_and_an_ambiguous_bare_name_is_400() {
    let models = fleet();
    for unknown in ["smollm2:nope", "nope", "other:sql"] {
        let err = resolve(&models, unknown, None).unwrap_err();
        assert_eq!(param(err), (404, Some("model".into())), "{unknown}");
    }
    let err = resolve(&models, "shared", None).unwrap_err();
    assert!(err.to_string().contains("gemma3:shared"), "{err}");
    assert_eq!(param(err), (400, Some("model".into())));
}

#[test]
fn a_lora_path_runs_over_a_base_whose_runners_have_a_lora_dir() {
    let models = fleet();
    let (_, got) = resolve(&models, "smollm2", Some(&json!("team/sql-v2"))).unwrap();
    assert_eq!(
        got,
        served("smollm2", Some(AdapterRef::at_path("team/sql-v2")))
    );
    assert_eq!(
        got.adapter.unwrap().queue("smollm2"),
        "smollm2:@lora-dir",
        "any runner with a lora dir may claim it"
    );
    let (_, none) = resolve(&models, "smollm2", Some(&Value::Null)).unwrap();
    assert_eq!(none.adapter, None, "null asks for nothing");
}

#[test]
fn a_lora_path_outside_the_lora_dir_or_without_one_is_400() {
    let models = fleet();
    for bad in [
        json!("/etc/passwd"),
        json!("../secrets"),
        json!("a/../../b"),
        json!(""),
        json!("a\\..\\b"),
        json!(3),
        json!("x".repeat(1025)),
    ] {
        let err = resolve(&models, "smollm2", Some(&bad)).unwrap_err();
        assert_eq!(param(err), (400, Some("lora_path".into())), "{bad}");
    }
    let err = resolve(&models, "gemma3", Some(&json!("a"))).unwrap_err();
    assert!(err.to_string().contains("--lora-dir"), "{err}");
    let err = resolve(&models, "smollm2:sql", Some(&json!("a"))).unwrap_err();
    assert_eq!(param(err), (400, Some("lora_path".into())), "two adapters");
}

#[test]
fn with_no_runner_up_the_adapter_is_read_from_the_name() {
    assert_eq!(
        resolve_unseen("smollm2:sql", None).unwrap(),
        served("smollm2", Some(AdapterRef::named("sql")))
    );
    assert_eq!(
        resolve_unseen("smollm2", None).unwrap(),
        served("smollm2", None)
    );
    assert_eq!(
        resolve_unseen("smollm2", Some(&json!("a/b"))).unwrap(),
        served("smollm2", Some(AdapterRef::at_path("a/b")))
    );
    assert!(resolve_unseen("smollm2", Some(&json!("../b"))).is_err());
}

#[test]
fn an_adapter_an_operator_loaded_is_read_by_path_from_the_lora_dir() {
    let mut models = fleet();
    let loaded = ModelEntry {
        lora_path: Some("team/ops".into()),
        ..adapter(&models[3], "ops")
    };
    models.push(loaded);
    let (_, got) = resolve(&models, "smollm2:ops", None).unwrap();
    let adapter = got.adapter.unwrap();
    assert_eq!(
        (adapter.name.as_str(), adapter.lora_path.as_deref()),
        ("ops", Some("team/ops"))
    );
    assert_eq!(adapter.queue("smollm2"), "smollm2:@lora-dir");
}
