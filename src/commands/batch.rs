//! `fallow batch submit|status|results`: a small client of the HTTP Batch API. Uploads and
//! downloads stream, so a 200 MB file is never held in memory here either.

use crate::cli::ClientArgs;
use anyhow::{bail, Context};
use futures::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::Value;
use std::path::Path;
use std::time::Duration;
use tokio::io::AsyncWriteExt;

/// Statuses after which a batch never changes.
const FINAL: [&str; 4] = ["completed", "failed", "expired", "cancelled"];

struct Client {
    http: reqwest::Client,
    base: String,
    key: Option<String>,
}

impl Client {
    fn new(args: &ClientArgs) -> anyhow::Result<Client> {
        Ok(Client {
            http: reqwest::Client::builder().build()?,
            base: format!("{}/v1", args.url.trim_end_matches('/')),
            key: args.api_key.clone(),
        })
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let builder = self.http.request(method, format!("{}{path}", self.base));
        match &self.key {
            Some(key) => builder.bearer_auth(key),
            None => builder,
        }
    }

    /// Sends and returns the response, turning an API error into its message.
    async fn send(&self, builder: reqwest::RequestBuilder) -> anyhow::Result<reqwest::Response> {
        let response = builder
            .send()
            .await
            .context("reaching the Fallow API (--url)")?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        let message = body["error"]["message"]
            .as_str()
            .unwrap_or("no error message");
        bail!("the API answered {status}: {message}")
    }

    async fn json(&self, builder: reqwest::RequestBuilder) -> anyhow::Result<Value> {
        Ok(self.send(builder).await?.json().await?)
    }

    async fn batch(&self, id: &str) -> anyhow::Result<Value> {
        self.json(self.request(reqwest::Method::GET, &format!("/batches/{id}")))
            .await
    }
}

pub async fn submit(args: &ClientArgs, file: &Path, wait: bool) -> anyhow::Result<()> {
    let client = Client::new(args)?;
    let handle = tokio::fs::File::open(file)
        .await
        .with_context(|| format!("opening {}", file.display()))?;
    let len = handle.metadata().await?.len();
    let name = file
        .file_name()
        .map_or("batch.jsonl".into(), |n| n.to_string_lossy().into_owned());
    let body = reqwest::Body::wrap_stream(tokio_util::io::ReaderStream::new(handle));
    let part = reqwest::multipart::Part::stream_with_length(body, len).file_name(name);
    let form = reqwest::multipart::Form::new()
        .text("purpose", "batch")
        .part("file", part);
    let uploaded = client
        .json(
            client
                .request(reqwest::Method::POST, "/files")
                .multipart(form),
        )
        .await?;
    let file_id = uploaded["id"]
        .as_str()
        .context("upload answered no file id")?;
    let batch = client
        .json(
            client
                .request(reqwest::Method::POST, "/batches")
                .json(&serde_json::json!({
                    "input_file_id": file_id,
                    "endpoint": "/v1/chat/completions",
                    "completion_window": "24h",
                })),
        )
        .await?;
    let id = batch["id"]
        .as_str()
        .context("create answered no batch id")?
        .to_owned();
    if !wait {
        println!("{id}");
        return Ok(());
    }
    eprintln!("batch {id} submitted");
    let done = follow(&client, &id).await?;
    println!("{}", serde_json::to_string_pretty(&done)?);
    if done["status"] != "completed" {
        bail!("batch {id} ended {}", done["status"]);
    }
    Ok(())
}

/// Polls the batch with a progress bar until it reaches a final status.
async fn follow(client: &Client, id: &str) -> anyhow::Result<Value> {
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg:>12} [{bar:40}] {pos}/{len} ({eta})")?
            .progress_chars("=> "),
    );
    loop {
        let batch = client.batch(id).await?;
        let counts = &batch["request_counts"];
        let total = counts["total"].as_u64().unwrap_or(0);
        let finished =
            counts["completed"].as_u64().unwrap_or(0) + counts["failed"].as_u64().unwrap_or(0);
        let status = batch["status"].as_str().unwrap_or("unknown").to_owned();
        bar.set_length(total);
        bar.set_position(finished);
        bar.set_message(status.clone());
        if FINAL.contains(&status.as_str()) {
            bar.finish();
            return Ok(batch);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

pub async fn status(args: &ClientArgs, id: &str) -> anyhow::Result<()> {
    let client = Client::new(args)?;
    let batch = client.batch(id).await?;
    println!("{}", serde_json::to_string_pretty(&batch)?);
    Ok(())
}

pub async fn results(args: &ClientArgs, id: &str, output: Option<&Path>) -> anyhow::Result<()> {
    let client = Client::new(args)?;
    let batch = client.batch(id).await?;
    let status = batch["status"].as_str().unwrap_or("unknown");
    if !FINAL.contains(&status) {
        bail!("batch {id} is still {status}; its results are not ready");
    }
    let mut sink: Box<dyn tokio::io::AsyncWrite + Unpin> = match output {
        Some(path) => Box::new(
            tokio::fs::File::create(path)
                .await
                .with_context(|| format!("creating {}", path.display()))?,
        ),
        None => Box::new(tokio::io::stdout()),
    };
    for field in ["output_file_id", "error_file_id"] {
        let Some(file) = batch[field].as_str() else {
            continue;
        };
        let response = client
            .send(client.request(reqwest::Method::GET, &format!("/files/{file}/content")))
            .await?;
        let mut stream = response.bytes_stream();
        while let Some(chunk) = stream.next().await {
            sink.write_all(&chunk?).await?;
        }
    }
    sink.flush().await?;
    Ok(())
}
