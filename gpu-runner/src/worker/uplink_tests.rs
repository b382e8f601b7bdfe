//! The uplink against a control plane that only records appends (the uplink calls nothing
//! else): order, coalescing, and when a step counts as sent.

use super::*;
use crate::control_plane::{PlaneResult, StreamCaps};
use fallow_protocol::job::{Completion, Progress};
use fallow_scheduler::queue::{Checkpoint, ClaimScope, ClaimedJob, FailOutcome, LeaseRenewal};
use fallow_scheduler::runners::{RunnerInfo, RunnerState};
use futures::future::BoxFuture;
use futures::FutureExt;
use std::sync::Mutex;
use tokio::sync::Semaphore;

/// One append as the plane received it: its marks and its events.
type Append = (Vec<(Uuid, i32)>, Vec<(Uuid, JobEvent)>);

/// Records each append's marks and events; each append first waits for a permit, so a
/// test decides when the control plane answers.
struct Recorder {
    appends: Mutex<Vec<Append>>,
    answers: Semaphore,
}

impl Recorder {
    fn new() -> Arc<Recorder> {
        Arc::new(Recorder {
            appends: Mutex::new(Vec::new()),
            answers: Semaphore::new(0),
        })
    }

    fn appends(&self) -> Vec<Append> {
        self.appends.lock().unwrap().clone()
    }
}

fn started(attempt: i32) -> JobEvent {
    JobEvent::Started {
        attempt,
        prompt_text: None,
        continues: false,
    }
}

const UNUSED: &str = "the uplink only appends";

impl ControlPlane for Recorder {
    fn append<'a>(
        &'a self,
        streamed: &'a [(Uuid, i32)],
        events: &'a [(Uuid, JobEvent)],
        _caps: StreamCaps<'a>,
    ) -> BoxFuture<'a, PlaneResult<Vec<Uuid>>> {
        async move {
            self.answers.acquire().await.expect("open").forget();
            self.appends
                .lock()
                .unwrap()
                .push((streamed.to_vec(), events.to_vec()));
            Ok(Vec::new())
        }
        .boxed()
    }

    fn register<'a>(&'a self, _: &'a RunnerInfo) -> BoxFuture<'a, PlaneResult<Uuid>> {
        unreachable!("{UNUSED}")
    }
    fn register_as<'a>(&'a self, _: Uuid, _: &'a RunnerInfo) -> BoxFuture<'a, PlaneResult<()>> {
        unreachable!("{UNUSED}")
    }
    fn deregister(&self, _: Uuid) -> BoxFuture<'_, PlaneResult<()>> {
        unreachable!("{UNUSED}")
    }
    fn heartbeat(&self, _: Uuid, _: i32) -> BoxFuture<'_, PlaneResult<RunnerState>> {
        unreachable!("{UNUSED}")
    }
    fn state(&self, _: Uuid) -> BoxFuture<'_, PlaneResult<Option<RunnerState>>> {
        unreachable!("{UNUSED}")
    }
    fn report_state<'a>(
        &'a self,
        _: Uuid,
        _: &'a [RunnerState],
        _: RunnerState,
    ) -> BoxFuture<'a, PlaneResult<RunnerState>> {
        unreachable!("{UNUSED}")
    }
    fn set_warm<'a>(&'a self, _: Uuid, _: &'a [String]) -> BoxFuture<'a, PlaneResult<()>> {
        unreachable!("{UNUSED}")
    }
    fn drain_left(&self, _: Uuid) -> BoxFuture<'_, PlaneResult<Option<Duration>>> {
        unreachable!("{UNUSED}")
    }
    fn take_evictions(&self, _: Uuid) -> BoxFuture<'_, PlaneResult<Vec<String>>> {
        unreachable!("{UNUSED}")
    }
    fn warm_replicas(&self) -> BoxFuture<'_, PlaneResult<HashMap<String, i64>>> {
        unreachable!("{UNUSED}")
    }
    fn pool_turn(&self, _: Uuid, _: bool, _: f64) -> BoxFuture<'_, PlaneResult<bool>> {
        unreachable!("{UNUSED}")
    }
    fn state_hints(&self, _: Uuid) -> mpsc::Receiver<()> {
        unreachable!("{UNUSED}")
    }
    fn claim<'a>(
        &'a self,
        _: Uuid,
        _: &'a ClaimScope<'a>,
        _: i64,
        _: Duration,
    ) -> BoxFuture<'a, PlaneResult<Vec<ClaimedJob>>> {
        unreachable!("{UNUSED}")
    }
    fn wait_for_work(&self, _: Duration) -> BoxFuture<'_, ()> {
        unreachable!("{UNUSED}")
    }
    fn renew<'a>(
        &'a self,
        _: Uuid,
        _: &'a [Checkpoint],
        _: Duration,
    ) -> BoxFuture<'a, PlaneResult<LeaseRenewal>> {
        unreachable!("{UNUSED}")
    }
    fn complete<'a>(
        &'a self,
        _: Uuid,
        _: i32,
        _: &'a Completion,
    ) -> BoxFuture<'a, PlaneResult<bool>> {
        unreachable!("{UNUSED}")
    }
    fn fail<'a>(
        &'a self,
        _: Uuid,
        _: i32,
        _: &'a str,
        _: bool,
    ) -> BoxFuture<'a, PlaneResult<FailOutcome>> {
        unreachable!("{UNUSED}")
    }
    fn fail_and_continue<'a>(
        &'a self,
        _: Uuid,
        _: i32,
        _: &'a str,
        _: &'a Progress,
    ) -> BoxFuture<'a, PlaneResult<FailOutcome>> {
        unreachable!("{UNUSED}")
    }
    fn release<'a>(
        &'a self,
        _: Uuid,
        _: i32,
        _: Option<&'a Progress>,
    ) -> BoxFuture<'a, PlaneResult<FailOutcome>> {
        unreachable!("{UNUSED}")
    }
    fn mark_cancelled<'a>(
        &'a self,
        _: Uuid,
        _: i32,
        _: &'a Completion,
    ) -> BoxFuture<'a, PlaneResult<bool>> {
        unreachable!("{UNUSED}")
    }
    fn cancel_signals(&self) -> mpsc::Receiver<Uuid> {
        unreachable!("{UNUSED}")
    }
}

#[tokio::test]
async fn steps_queued_behind_a_slow_append_leave_together_in_order() {
    let plane = Recorder::new();
    let (uplink, _news) = Uplink::start(plane.clone());
    let jobs: Vec<Uuid> = (0..4).map(|_| Uuid::new_v4()).collect();

    // The first step's append is on its way (the plane has not answered) …
    let first = uplink
        .send(
            vec![(jobs[0], 1)],
            vec![(jobs[0], started(1))],
            HashMap::new(),
        )
        .await;
    tokio::task::yield_now().await;
    // … while three more steps queue up behind it.
    let mut later = Vec::new();
    for (i, job) in jobs.iter().enumerate().skip(1) {
        later.push(
            uplink
                .send(
                    vec![(*job, 1)],
                    vec![(*job, started(i as i32))],
                    HashMap::new(),
                )
                .await,
        );
    }
    plane.answers.add_permits(2);
    first.await.expect("the first step was sent");
    for sent in later {
        sent.await.expect("every later step was sent");
    }

    let appends = plane.appends();
    assert_eq!(
        appends.len(),
        2,
        "one append for the first step, one for the rest"
    );
    assert_eq!(appends[0].0, vec![(jobs[0], 1)]);
    let (marks, events) = &appends[1];
    assert_eq!(
        marks,
        &jobs[1..].iter().map(|job| (*job, 1)).collect::<Vec<_>>()
    );
    let order: Vec<Uuid> = events.iter().map(|(job, _)| *job).collect();
    assert_eq!(order, jobs[1..], "the later steps' events keep their order");
}

#[tokio::test]
async fn a_flush_waits_for_the_steps_before_it_and_not_for_those_after() {
    let plane = Recorder::new();
    let (uplink, _news) = Uplink::start(plane.clone());
    let (a, b) = (Uuid::new_v4(), Uuid::new_v4());

    let first = uplink
        .send(Vec::new(), vec![(a, started(1))], HashMap::new())
        .await;
    let uplink = Arc::new(uplink);
    let flushing = tokio::spawn({
        let uplink = uplink.clone();
        async move { uplink.flush().await }
    });
    tokio::task::yield_now().await;
    let after = uplink
        .send(Vec::new(), vec![(b, started(1))], HashMap::new())
        .await;

    plane.answers.add_permits(1);
    first.await.expect("sent");
    flushing
        .await
        .expect("the flush returns once the first step left");
    assert_eq!(
        plane.appends().len(),
        1,
        "the step after the flush is not yet sent"
    );
    plane.answers.add_permits(1);
    after.await.expect("sent");
    assert_eq!(plane.appends().len(), 2);
}
