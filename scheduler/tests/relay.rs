//! The Redis token relay against a real Redis (`FALLOW_TEST_REDIS_URL` or 127.0.0.1:6379).
//! Every test uses fresh job ids, so the tests run in parallel without sharing keys.

mod common;

use common::completion;
use fallow_protocol::job::{JobEvent, Usage};
use fallow_scheduler::stream::{entries_needed, stream_key, RelayConfig, TokenRelay};
use fallow_scheduler::SchedulerError;
use std::time::{Duration, Instant};
use uuid::Uuid;

fn redis_url() -> String {
    fallow_protocol::testing::test_redis_url()
}

async fn relay() -> TokenRelay {
    TokenRelay::connect(&redis_url())
        .await
        .expect("a test Redis")
}

fn delta(text: &str) -> JobEvent {
    JobEvent::Delta {
        index: 0,
        text: text.to_string(),
        token_ids: Vec::new(),
        logprobs: None,
        finish_reason: None,
        usage: Usage::default(),
        at: None,
    }
}

/// Stream ids are `<ms>-<seq>`; compare them numerically.
fn parse_id(id: &str) -> (u64, u64) {
    let (ms, seq) = id.split_once('-').expect("stream id has a dash");
    (ms.parse().unwrap(), seq.parse().unwrap())
}

#[tokio::test]
async fn appended_events_read_back_in_order_with_increasing_ids() {
    let relay = relay().await;
    let (job, other) = (Uuid::new_v4(), Uuid::new_v4());
    relay
        .append(&[
            (
                job,
                JobEvent::Started {
                    attempt: 1,
                    prompt_text: None,
                    continues: false,
                },
            ),
            (other, delta("elsewhere")),
            (job, delta("Hel")),
            (job, delta("lo")),
        ])
        .await
        .unwrap();
    relay
        .append(&[(
            job,
            JobEvent::Final {
                completion: completion("Hello"),
            },
        )])
        .await
        .unwrap();

    let entries = relay.read_after(job, "0", Duration::ZERO).await.unwrap();
    let events: Vec<JobEvent> = entries.iter().map(|e| e.event.clone()).collect();
    assert_eq!(
        events,
        vec![
            JobEvent::Started {
                attempt: 1,
                prompt_text: None,
                continues: false,
            },
            delta("Hel"),
            delta("lo"),
            JobEvent::Final {
                completion: completion("Hello")
            },
        ]
    );
    let ids: Vec<(u64, u64)> = entries.iter().map(|e| parse_id(&e.id)).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids increase: {ids:?}");

    let rest = relay
        .read_after(job, &entries[1].id, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(rest.len(), 2, "resuming after an id skips what was read");
    assert_eq!(rest[0].id, entries[2].id);
}

#[tokio::test]
async fn read_after_blocks_until_an_event_arrives() {
    let relay = relay().await;
    let job = Uuid::new_v4();
    let writer = relay.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        writer.append(&[(job, delta("late"))]).await.unwrap();
    });

    let started = Instant::now();
    let entries = relay
        .read_after(job, "0", Duration::from_secs(5))
        .await
        .unwrap();
    let waited = started.elapsed();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].event, delta("late"));
    assert!(
        waited >= Duration::from_millis(250),
        "it waited for the event: {waited:?}"
    );
    assert!(
        waited < Duration::from_secs(4),
        "it woke on the event: {waited:?}"
    );
}

#[tokio::test]
async fn read_after_returns_nothing_when_the_wait_times_out() {
    let relay = relay().await;
    let started = Instant::now();
    let entries = relay
        .read_after(Uuid::new_v4(), "0", Duration::from_millis(200))
        .await
        .unwrap();
    assert!(entries.is_empty());
    assert!(started.elapsed() >= Duration::from_millis(150));
}

#[tokio::test]
async fn a_blocked_reader_does_not_hold_up_appends() {
    let relay = relay().await;
    let idle_job = Uuid::new_v4();
    let reader = relay.clone();
    let blocked = tokio::spawn(async move {
        reader
            .read_after(idle_job, "$", Duration::from_secs(3))
            .await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;

    let started = Instant::now();
    relay.append(&[(Uuid::new_v4(), delta("x"))]).await.unwrap();
    relay.ping().await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "append waited on a blocked read"
    );
    blocked.abort();
}

#[tokio::test]
async fn streams_expire_after_the_configured_ttl() {
    let config = RelayConfig {
        ttl: Duration::from_secs(120),
        ..RelayConfig::default()
    };
    let relay = TokenRelay::connect_with(&redis_url(), config)
        .await
        .unwrap();
    let job = Uuid::new_v4();
    relay.append(&[(job, delta("x"))]).await.unwrap();

    let client = redis::Client::open(redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let ttl: i64 = redis::cmd("TTL")
        .arg(stream_key(job))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!((100..=120).contains(&ttl), "ttl {ttl}");
}

#[tokio::test]
async fn a_job_whose_request_needs_more_entries_than_the_cap_keeps_its_whole_stream() {
    let config = RelayConfig {
        max_len: 10,
        ..RelayConfig::default()
    };
    let relay = TokenRelay::connect_with(&redis_url(), config)
        .await
        .unwrap();
    let (long, capped) = (Uuid::new_v4(), Uuid::new_v4());
    let needed = entries_needed(1, Some(600), 1);
    assert_eq!(
        needed,
        Some(610),
        "601 deltas, a start and room for the end"
    );
    for _ in 0..6 {
        let step: Vec<(Uuid, JobEvent)> = (0..100).map(|_| (long, delta("x"))).collect();
        relay.append_capped(&step, |_| needed).await.unwrap();
        let step: Vec<(Uuid, JobEvent)> = (0..100).map(|_| (capped, delta("x"))).collect();
        relay.append(&step).await.unwrap();
    }
    assert_eq!(
        relay.read_all(long).await.unwrap().len(),
        600,
        "nothing trimmed"
    );
    let kept = relay.read_all(capped).await.unwrap().len();
    assert!(
        kept < 600,
        "a stream over the plain cap is trimmed ({kept} kept)"
    );
}

#[tokio::test]
async fn cancel_signals_reach_subscribers() {
    let relay = relay().await;
    let mut signals = relay.cancel_signals();
    let job = Uuid::new_v4();

    // The subscription starts in the background; publish until it is heard.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        relay.signal_cancel(job).await.unwrap();
        match tokio::time::timeout(Duration::from_millis(100), signals.recv()).await {
            // Other tests may cancel other jobs on the same channel meanwhile.
            Ok(Some(id)) if id == job => break,
            Ok(Some(_)) => continue,
            Ok(None) => panic!("signal channel closed"),
            Err(_) => assert!(Instant::now() < deadline, "no cancel signal within 5 s"),
        }
    }
}

#[tokio::test]
async fn an_unreachable_redis_is_an_error_not_a_panic() {
    let config = RelayConfig {
        response_timeout: Duration::from_millis(300),
        ..RelayConfig::default()
    };
    // Port 1 is never a Redis.
    let relay = TokenRelay::connect_with("redis://127.0.0.1:1", config)
        .await
        .unwrap();
    assert!(matches!(relay.ping().await, Err(SchedulerError::Redis(_))));
    assert!(matches!(
        relay.append(&[(Uuid::new_v4(), delta("x"))]).await,
        Err(SchedulerError::Redis(_))
    ));
    assert!(matches!(
        relay
            .read_after(Uuid::new_v4(), "0", Duration::from_millis(10))
            .await,
        Err(SchedulerError::Redis(_))
    ));
    assert!(matches!(
        relay.signal_cancel(Uuid::new_v4()).await,
        Err(SchedulerError::Redis(_))
    ));
}

#[tokio::test]
async fn a_malformed_redis_url_is_an_error() {
    assert!(TokenRelay::connect("not a url").await.is_err());
}

/// A private `redis-server` on a free port, killed on drop.
struct PrivateRedis {
    child: std::process::Child,
    port: u16,
}

impl PrivateRedis {
    fn start(port: u16) -> Option<PrivateRedis> {
        let child = std::process::Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(std::process::Stdio::null())
            .spawn()
            .ok()?;
        Some(PrivateRedis { child, port })
    }
    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
    async fn wait_ready(&self) {
        let client = redis::Client::open(self.url()).unwrap();
        for _ in 0..100 {
            if let Ok(mut conn) = client.get_multiplexed_async_connection().await {
                let pong: Result<String, _> = redis::cmd("PING").query_async(&mut conn).await;
                if pong.is_ok() {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("private redis-server did not start");
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Retries `f` until it succeeds or 5 s pass.
async fn eventually<T, F, Fut>(mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, SchedulerError>>,
{
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match f().await {
            Ok(v) => return v,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("still failing after 5 s: {e}"),
        }
    }
}

#[tokio::test]
async fn the_relay_works_again_after_redis_restarts() {
    let port = free_port();
    let Some(redis) = PrivateRedis::start(port) else {
        fallow_protocol::testing::skip_for_want_of("redis-server (infra/services.sh installs it)");
        return;
    };
    redis.wait_ready().await;
    let relay = relay_at(&redis.url()).await;
    let mut signals = relay.cancel_signals();
    let job = Uuid::new_v4();
    relay.append(&[(job, delta("a"))]).await.unwrap();
    assert_eq!(
        relay
            .read_after(job, "0", Duration::ZERO)
            .await
            .unwrap()
            .len(),
        1
    );

    drop(redis);
    assert!(matches!(relay.ping().await, Err(SchedulerError::Redis(_))));
    assert!(relay.append(&[(job, delta("b"))]).await.is_err());
    assert!(relay.read_after(job, "0", Duration::ZERO).await.is_err());

    let redis = PrivateRedis::start(port).unwrap();
    redis.wait_ready().await;
    eventually(|| relay.ping()).await;
    let events = [(job, delta("c"))];
    eventually(|| relay.append(&events)).await;
    // The restarted Redis kept nothing; the new entry is all there is.
    let entries = eventually(|| relay.read_after(job, "0", Duration::from_millis(10))).await;
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].event, delta("c"));

    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        relay.signal_cancel(job).await.unwrap();
        if let Ok(Some(id)) = tokio::time::timeout(Duration::from_millis(100), signals.recv()).await
        {
            assert_eq!(id, job);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the cancel subscription did not come back"
        );
    }
}

async fn relay_at(url: &str) -> TokenRelay {
    TokenRelay::connect(url).await.unwrap()
}
