//! The worker's uplink: every step's events leave through one ordered, bounded queue, so
//! the engine keeps stepping while the control plane is out of reach (the api restarts, the
//! network drops). A task drains the queue in order: it appends each step's events (first
//! marking the jobs whose first tokens they carry `streamed`), retrying with backoff for up
//! to [`PATIENCE`]. The worker waits only when the queue is full.
//!
//! What the control plane refuses (jobs this runner no longer holds: their leases expired
//! during an outage and other runners continue them), and what could not be delivered in
//! time, comes back to the worker as [`News`], and later events of those jobs are dropped.
//! A report that must follow the events (a completion, a hand-back) waits for them: a
//! completion for its step's events, anything else for a [`Uplink::flush`].

use crate::control_plane::backoff::while_unavailable;
use crate::control_plane::{ControlPlane, PlaneError};
use fallow_protocol::job::JobEvent;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

/// How long a step's events are retried while the control plane is unreachable. Longer
/// than a lease: by then the jobs are continued elsewhere, and late events are refused.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// How many steps may wait in the queue; beyond that the worker waits (about a minute of
/// a busy engine's steps).
pub const CAPACITY: usize = 4096;

/// What the uplink tells the worker.
#[derive(Debug, PartialEq, Eq)]
pub enum News {
    /// The control plane no longer gives these jobs to this runner: drop them.
    Refused(Vec<Uuid>),
    /// These jobs' events could not be delivered within [`PATIENCE`]: drop them; their
    /// leases expire and other runners continue them from what reached their streams.
    Undelivered(Vec<Uuid>),
    /// The runner's token no longer admits it.
    Revoked,
}

/// Steps that queued up while an append was on its way leave together, in order, up to
/// about this many events: a slow round trip then costs one append, not one per step.
const COALESCE_EVENTS: usize = fallow_scheduler::runner_wire::MAX_EVENTS_PER_APPEND / 2;

/// One step's uplink, or several consecutive steps': the jobs whose first tokens they
/// carry, their events in order, and each job's stream cap.
struct Step {
    marks: Vec<(Uuid, i32)>,
    events: Vec<(Uuid, JobEvent)>,
    caps: HashMap<Uuid, usize>,
    sent: Vec<oneshot::Sender<()>>,
}

impl Step {
    /// Appends the next step. Its marks go ahead of the earlier steps' events, which is
    /// harmless: a job is marked `streamed` a step early at most.
    fn absorb(&mut self, next: Step) {
        self.marks.extend(next.marks);
        self.events.extend(next.events);
        self.caps.extend(next.caps);
        self.sent.extend(next.sent);
    }
}

enum Item {
    Step(Step),
    /// Answered once everything queued before it has been sent (or given up).
    Flush(oneshot::Sender<()>),
}

/// The worker's end of the uplink.
pub struct Uplink {
    items: mpsc::Sender<Item>,
}

/// Resolves once a step's events have left (or were given up).
pub type Sent = oneshot::Receiver<()>;

impl Uplink {
    /// Starts the uplink's task over `plane`; news comes on the receiver.
    pub fn start(plane: Arc<dyn ControlPlane>) -> (Uplink, mpsc::UnboundedReceiver<News>) {
        let (items, queue) = mpsc::channel(CAPACITY);
        let (news, news_rx) = mpsc::unbounded_channel();
        let sender = Sender {
            plane,
            news,
            abandoned: HashSet::new(),
        };
        tokio::spawn(sender.run(queue));
        (Uplink { items }, news_rx)
    }

    /// Queues a step: `marks` are marked streamed before `events` are appended, each
    /// job's stream capped by `caps`. Waits only while the queue is full.
    pub async fn send(
        &self,
        marks: Vec<(Uuid, i32)>,
        events: Vec<(Uuid, JobEvent)>,
        caps: HashMap<Uuid, usize>,
    ) -> Sent {
        let (sent, done) = oneshot::channel();
        let step = Step {
            marks,
            events,
            caps,
            sent: vec![sent],
        };
        // A closed uplink (revoked) answers at once: the receiver sees the sender dropped.
        let _ = self.items.send(Item::Step(step)).await;
        done
    }

    /// Waits until everything queued so far has left (or was given up).
    pub async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        if self.items.send(Item::Flush(tx)).await.is_ok() {
            let _ = rx.await;
        }
    }
}

struct Sender {
    plane: Arc<dyn ControlPlane>,
    news: mpsc::UnboundedSender<News>,
    /// Jobs refused or given up: their later events are not sent.
    abandoned: HashSet<Uuid>,
}

impl Sender {
    async fn run(mut self, mut queue: mpsc::Receiver<Item>) {
        let mut next = None;
        loop {
            let item = match next.take() {
                Some(item) => item,
                None => match queue.recv().await {
                    Some(item) => item,
                    None => return,
                },
            };
            match item {
                Item::Flush(done) => {
                    let _ = done.send(());
                }
                Item::Step(mut step) => {
                    while step.events.len() < COALESCE_EVENTS {
                        match queue.try_recv() {
                            Ok(Item::Step(later)) => step.absorb(later),
                            Ok(flush) => {
                                next = Some(flush);
                                break;
                            }
                            Err(_) => break,
                        }
                    }
                    if self.send_step(step).await.is_err() {
                        let _ = self.news.send(News::Revoked);
                        return; // the worker stops; what is queued is no longer its to send
                    }
                }
            }
        }
    }

    /// Sends one step (or several coalesced); `Err` once the runner is revoked.
    async fn send_step(&mut self, step: Step) -> Result<(), ()> {
        let Step {
            marks,
            mut events,
            caps,
            sent,
        } = step;
        events.retain(|(job, _)| !self.abandoned.contains(job));
        // The marks ride with the events: one round trip for a step, however many streams
        // it starts.
        let marks: Vec<(Uuid, i32)> = marks
            .into_iter()
            .filter(|(job, _)| !self.abandoned.contains(job))
            .collect();
        if !events.is_empty() || !marks.is_empty() {
            let cap = |job| caps.get(&job).copied();
            let plane = self.plane.clone();
            match while_unavailable(PATIENCE, || plane.append(&marks, &events, &cap)).await {
                Ok(refused) if refused.is_empty() => {}
                Ok(refused) => {
                    tracing::warn!(
                        ?refused,
                        "the control plane refused events of jobs this runner no longer holds"
                    );
                    self.abandon(&refused, News::Refused);
                }
                Err(PlaneError::Revoked(_)) => return Err(()),
                Err(e) => {
                    let jobs: Vec<Uuid> = distinct(events.iter().map(|(job, _)| *job));
                    tracing::error!(error = %e, ?jobs, "a step's events could not be delivered; dropping its jobs");
                    self.abandon(&jobs, News::Undelivered);
                }
            }
        }
        for sent in sent {
            let _ = sent.send(());
        }
        Ok(())
    }

    fn abandon(&mut self, jobs: &[Uuid], news: fn(Vec<Uuid>) -> News) {
        self.abandoned.extend(jobs.iter().copied());
        // Only recent jobs can still have events queued; an old set is forgotten.
        if self.abandoned.len() > 100_000 {
            self.abandoned.clear();
            self.abandoned.extend(jobs.iter().copied());
        }
        let _ = self.news.send(news(jobs.to_vec()));
    }
}

fn distinct(jobs: impl Iterator<Item = Uuid>) -> Vec<Uuid> {
    let mut seen = HashSet::new();
    jobs.filter(|job| seen.insert(*job)).collect()
}

#[cfg(test)]
#[path = "uplink_tests.rs"]
mod tests;
