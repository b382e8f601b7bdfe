//! Arrangements for the batch and store tests: a local store in a temp
//! directory, a real S3-compatible server (moto) on a random port, and a codec standing in
//! for the api's (the api crate depends on this one, not the other way round).
#![allow(dead_code)]

use fallow_protocol::job::{ChatMessage, Completion, GenerateRequest, Role, Sampling};
use fallow_scheduler::batch::{BatchCodec, LineRequest};
use fallow_scheduler::store::{S3Config, S3Store};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use uuid::Uuid;

/// Batch jobs' priority band in these tests (the api uses `BATCH_PRIORITY_BASE`).
pub const BATCH_BASE: i32 = 100_000;

/// Accepts bodies with a string `model` and a `messages` array of `{role, content}`.
pub struct TestCodec;

impl BatchCodec for TestCodec {
    fn parse_body(
        &self,
        _endpoint: &str,
        body: Value,
        _models: &[fallow_scheduler::runners::ModelEntry],
    ) -> Result<LineRequest, (Option<String>, String)> {
        let model = body["model"]
            .as_str()
            .ok_or((Some("model".to_owned()), "`model` is required.".to_owned()))?;
        let messages = body["messages"]
            .as_array()
            .filter(|m| !m.is_empty())
            .ok_or((
                Some("messages".to_owned()),
                "`messages` is required.".to_owned(),
            ))?;
        let messages = messages
            .iter()
            .map(|m| ChatMessage {
                content: m["content"].as_str().map(str::to_owned),
                ..ChatMessage::text(Role::User, "")
            })
            .collect();
        Ok(LineRequest {
            request: GenerateRequest::chat(model, messages, Sampling::default()),
            priority: BATCH_BASE + body["priority"].as_i64().unwrap_or(0) as i32,
        })
    }
    fn response_body(
        &self,
        job: Uuid,
        created: i64,
        model: &str,
        _output: &fallow_protocol::job::OutputFormat,
        done: &Completion,
    ) -> Value {
        json!({"id": job.to_string(), "object": "chat.completion", "created": created,
               "model": model, "text": done.choices[0].text})
    }
    fn error_response(&self, code: &str, message: &str) -> (u16, Value) {
        (500, json!({"error": {"code": code, "message": message}}))
    }
}

/// [`TestCodec`], taking `0` to check each line, as a large body or a grammar to compile
/// would: the codec runs on the worker's thread.
pub struct SlowCodec(pub Duration);

impl BatchCodec for SlowCodec {
    fn parse_body(
        &self,
        endpoint: &str,
        body: Value,
        models: &[fallow_scheduler::runners::ModelEntry],
    ) -> Result<LineRequest, (Option<String>, String)> {
        std::thread::sleep(self.0);
        TestCodec.parse_body(endpoint, body, models)
    }
    fn response_body(
        &self,
        job: Uuid,
        created: i64,
        model: &str,
        output: &fallow_protocol::job::OutputFormat,
        done: &Completion,
    ) -> Value {
        TestCodec.response_body(job, created, model, output, done)
    }
    fn error_response(&self, code: &str, message: &str) -> (u16, Value) {
        TestCodec.error_response(code, message)
    }
}

/// One valid batch line.
pub fn line(custom_id: &str, model: &str) -> String {
    json!({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
           "body": {"model": model, "messages": [{"role": "user", "content": "hi"}]}})
    .to_string()
}

/// A moto S3 server on a random port, killed on drop.
pub struct Moto {
    child: Child,
    pub endpoint: String,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn moto_binary() -> Option<PathBuf> {
    if let Ok(path) = std::env::var("FALLOW_TEST_MOTO_SERVER") {
        return Some(PathBuf::from(path));
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/moto_server");
    if venv.exists() {
        return Some(venv);
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("moto_server"))
            .find(|p| p.exists())
    })
}

/// Starts moto, or returns `None` (skipping the test) when it is not installed — unless
/// `FALLOW_REQUIRE_S3` is set, as `infra/test.sh` does, or the run is CI's, where its
/// absence is a failure.
pub fn start_moto() -> Option<Moto> {
    let Some(binary) = moto_binary() else {
        assert!(
            std::env::var_os("FALLOW_REQUIRE_S3").is_none(),
            "moto_server not found (pip install 'moto[server]' into .venv)"
        );
        fallow_protocol::testing::skip_for_want_of(
            "moto_server (pip install 'moto[server]' into .venv)",
        );
        return None;
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    let child = Command::new(binary)
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("moto_server starts");
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "moto_server did not start");
        std::thread::sleep(Duration::from_millis(100));
    }
    Some(Moto {
        child,
        endpoint: format!("http://127.0.0.1:{port}"),
    })
}

/// An S3 store on moto with a fresh bucket.
pub async fn s3_store(moto: &Moto) -> S3Store {
    // moto accepts any credentials; the SDK insists on having some.
    std::env::set_var("AWS_ACCESS_KEY_ID", "test");
    std::env::set_var("AWS_SECRET_ACCESS_KEY", "test");
    let store = S3Store::connect(S3Config {
        bucket: format!("fallow-test-{}", Uuid::new_v4().simple()),
        prefix: "t/".into(),
        endpoint: Some(moto.endpoint.clone()),
        region: Some("us-east-1".into()),
        force_path_style: true,
    })
    .await
    .expect("staging directory");
    store.ensure_bucket().await.expect("bucket created");
    store
}
