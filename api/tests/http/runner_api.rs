//! The runner API's claim, as a gateway runner on a lossy network sees it: a claim asked
//! again under the same claim id gets the same jobs back, and claims nothing more.

use crate::support::*;
use fallow_scheduler::runners::tokens::{self, NewRunnerToken};
use serde_json::{json, Value};
use uuid::Uuid;

#[tokio::test]
async fn a_claim_asked_again_with_its_id_gets_the_same_jobs_and_claims_no_more() {
    let app = spawn_app().await;
    let new = NewRunnerToken {
        name: "lab".into(),
        pool: None,
        models: None,
    };
    let (_, token) = tokens::create(app.queue.pool(), &new)
        .await
        .expect("postgres")
        .expect("created");
    let info = json!({"host": "lab", "devices": {}, "slots": 4, "warm": [MODEL], "models": [
        {"id": MODEL, "context_length": CONTEXT, "owned_by": "fallow", "created": 0}]});
    let registered: Value = app
        .client
        .post(app.url("/runner/v1/register"))
        .bearer_auth(&token)
        .json(&json!({ "info": info }))
        .send()
        .await
        .expect("register")
        .json()
        .await
        .expect("json");
    let runner = registered["runner_id"]
        .as_str()
        .expect("runner id")
        .to_string();
    // Two requests waiting for a runner.
    for _ in 0..2 {
        let (client, url) = (app.client.clone(), app.url("/v1/chat/completions"));
        tokio::spawn(async move { client.post(url).json(&chat_body()).send().await });
    }
    let claim = |claim_id: Uuid, again: bool| {
        let body = json!({"warm": [MODEL], "limit": 1, "lease_ms": 30_000, "wait_ms": 5_000,
                          "claim_id": claim_id, "again": again});
        let request = app
            .client
            .post(app.url("/runner/v1/claim"))
            .bearer_auth(&token)
            .header("x-fallow-runner", &runner)
            .json(&body);
        async move {
            let answer: Value = request
                .send()
                .await
                .expect("claim")
                .json()
                .await
                .expect("json");
            answer["jobs"]
                .as_array()
                .expect("jobs")
                .iter()
                .map(|job| {
                    (
                        job["id"].as_str().map(String::from),
                        job["attempt"].as_i64(),
                    )
                })
                .collect::<Vec<_>>()
        }
    };

    let (first, second) = (Uuid::new_v4(), Uuid::new_v4());
    let claimed = claim(first, false).await;
    assert_eq!(claimed.len(), 1, "{claimed:?}");
    assert_eq!(
        claim(first, true).await,
        claimed,
        "asked again: the same job, same attempt"
    );
    let other = claim(second, false).await;
    assert_eq!(other.len(), 1, "{other:?}");
    assert_ne!(other, claimed, "a new claim takes the other job");
    assert_eq!(
        claim(first, true).await,
        claimed,
        "the first answer is kept for the lease"
    );

    let id: Uuid = claimed[0].0.as_deref().expect("id").parse().expect("uuid");
    let job = app.job(id).await;
    assert_eq!(
        (job.attempt, job.runner_id.map(|r| r.to_string())),
        (1, Some(runner))
    );
}
