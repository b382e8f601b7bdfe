//! The detection rule and the directory reading, on hand-written directories.

use std::fs;
use std::path::Path;

use super::layout::{Layout, Network};
use super::{EmbeddingModel, Pooling};

fn write(dir: &Path, name: &str, text: &str) {
    let path = dir.join(name);
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).expect("create dir");
    }
    fs::write(path, text).expect("write file");
}

const QWEN3: &str =
    r#"{"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "hidden_size": 64}"#;
const BERT: &str = r#"{"model_type": "bert", "architectures": ["BertModel"], "hidden_size": 8}"#;
const POOLING_MEAN: &str = r#"{"word_embedding_dimension": 8, "pooling_mode_mean_tokens": true}"#;

#[test]
fn a_bert_encoder_is_detected_and_a_chat_decoder_is_not() {
    let bert = tempfile::tempdir().expect("tempdir");
    write(bert.path(), "config.json", BERT);
    assert!(EmbeddingModel::detect(bert.path()));
    assert!(!EmbeddingModel::detect(&bert.path().join("config.json")));

    let chat = tempfile::tempdir().expect("tempdir");
    write(chat.path(), "config.json", QWEN3);
    assert!(!EmbeddingModel::detect(chat.path()));

    let reranker = tempfile::tempdir().expect("tempdir");
    write(
        reranker.path(),
        "config.json",
        r#"{"model_type": "bert", "architectures": ["BertForSequenceClassification"]}"#,
    );
    assert!(!EmbeddingModel::detect(reranker.path()));
}

#[test]
fn a_decoder_is_detected_by_a_pooling_module_or_the_is_embedding_marker() {
    let st = tempfile::tempdir().expect("tempdir");
    write(st.path(), "config.json", QWEN3);
    write(
        st.path(),
        "modules.json",
        r#"[{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]"#,
    );
    assert!(EmbeddingModel::detect(st.path()));

    let marked = tempfile::tempdir().expect("tempdir");
    write(
        marked.path(),
        "config.json",
        r#"{"model_type": "qwen3", "is_embedding": true, "hidden_size": 64}"#,
    );
    assert!(EmbeddingModel::detect(marked.path()));
    let layout = Layout::read(marked.path()).expect("layout");
    assert_eq!(layout.network, Network::Decoder);
    assert_eq!(layout.pooling, Pooling::LastToken);
    assert!(layout.normalize);
}

#[test]
fn sentence_transformers_files_set_pooling_normalisation_limit_and_matryoshka() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), "config.json", BERT);
    write(
        dir.path(),
        "modules.json",
        r#"[{"path": "", "type": "sentence_transformers.models.Transformer"},
            {"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]"#,
    );
    write(dir.path(), "1_Pooling/config.json", POOLING_MEAN);
    write(
        dir.path(),
        "sentence_bert_config.json",
        r#"{"max_seq_length": 256}"#,
    );
    write(
        dir.path(),
        "config_sentence_transformers.json",
        r#"{"matryoshka_dimensions": [8, 2, 4, 4]}"#,
    );
    let layout = Layout::read(dir.path()).expect("layout");
    assert_eq!(layout.network, Network::Bert);
    assert_eq!(layout.pooling, Pooling::Mean);
    assert!(layout.normalize);
    assert_eq!(layout.max_seq_length, Some(256));
    assert_eq!(layout.matryoshka, [2, 4, 8]);
}

#[test]
fn modules_that_would_change_the_vectors_unseen_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), "config.json", BERT);
    write(
        dir.path(),
        "modules.json",
        r#"[{"path": "", "type": "sentence_transformers.models.Transformer"},
            {"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"path": "2_Dense", "type": "sentence_transformers.models.Dense"}]"#,
    );
    write(dir.path(), "1_Pooling/config.json", POOLING_MEAN);
    let err = Layout::read(dir.path()).expect_err("a Dense module");
    assert!(err.to_string().contains("Dense"), "{err}");

    write(
        dir.path(),
        "modules.json",
        r#"[{"path": "../elsewhere", "type": "sentence_transformers.models.Transformer"}]"#,
    );
    assert!(Layout::read(dir.path()).is_err());
}

#[test]
fn a_pooling_width_other_than_the_hidden_size_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), "config.json", BERT);
    write(
        dir.path(),
        "1_Pooling/config.json",
        r#"{"word_embedding_dimension": 9, "pooling_mode_cls_token": true}"#,
    );
    assert!(Layout::read(dir.path()).is_err());
}

#[test]
fn the_model_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<EmbeddingModel>();
}
