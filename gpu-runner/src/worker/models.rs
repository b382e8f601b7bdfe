//! The models this runner holds warm: one engine thread per loaded model, loads on demand
//! within the memory budget, and unloads (least recently used to make room, `keep_alive`,
//! an operator's eviction, the owner's return).
//!
//! Decisions come from the pure [`Residency`]; this module carries them out. Loads run on
//! the blocking pool and report back through a channel the worker selects on, so a load
//! never stalls the models already serving. Each load gets a generation: events of an
//! engine that was since unloaded (or a load that finished after its model was dropped) are
//! recognised and ignored. What the claim loop may claim is published here after every
//! change: jobs of warm models, and jobs of cold models this runner could make room for.

use super::engine_host::{EngineHost, HostEvent, HostOptions};
use super::offer::{LoadedOffer, ModelOffer};
use super::residency::Residency;
use super::telemetry;
use fallow_protocol::job::GenerateRequest;
use fallow_scheduler::runners::ModelEntry;
use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

/// After a failed load, the model is not claimed cold for this long.
const FAILED_LOAD_BACKOFF: Duration = Duration::from_secs(60);

/// Which engine an event came from: the model and the load that started it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineKey {
    pub model: String,
    pub generation: u64,
}

/// What the claim loop may claim now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClaimModels {
    /// Loaded or loading here.
    pub warm: Vec<String>,
    /// Not resident, but a job for them could be served after loading them.
    pub cold: Vec<String>,
}

/// A finished load, as the blocking pool reports it.
pub struct LoadDone {
    key: EngineKey,
    result: Result<LoadedOffer, String>,
    seconds: f64,
}

/// A job waiting for its model's load: its engine-local id and request.
pub type Waiting = (u64, Box<GenerateRequest>);

/// What a newly claimed job's model needs.
pub enum Admission {
    /// Loaded: send the job to this engine.
    Ready,
    /// Loading (perhaps just started): the job waits for it.
    Waiting,
    /// Not enough idle memory to load it now: hand the job back.
    NoRoom,
}

/// What became of a finished load.
pub enum Loaded {
    /// The engine runs; send it these waiting jobs.
    Ready(Vec<Waiting>),
    /// It failed; these waiting jobs must go back to the queue.
    Failed {
        waiting: Vec<Waiting>,
        error: String,
    },
    /// The model was dropped while it loaded (the runner yielded): nothing to do.
    Stale,
}

struct Hosted {
    host: EngineHost,
    generation: u64,
}

pub struct Models {
    /// In the operator's order, which is the preload order.
    offers: Vec<ModelOffer>,
    residency: Residency,
    hosts: HashMap<String, Hosted>,
    /// Generation of each load in progress.
    loading: HashMap<String, u64>,
    waiting: HashMap<String, Vec<Waiting>>,
    /// Models to load when idle memory allows, in order (start-up, return from a yield).
    preload: VecDeque<String>,
    /// Unload once idle (an operator asked); claimed no more meanwhile.
    evict_when_idle: BTreeSet<String>,
    failed_until: HashMap<String, Instant>,
    /// Warm replicas per model across live runners, as last read (for `min_warm`).
    replicas: HashMap<String, i64>,
    next_generation: u64,
    events: mpsc::UnboundedSender<(EngineKey, HostEvent)>,
    loads: mpsc::UnboundedSender<LoadDone>,
    scope: watch::Sender<ClaimModels>,
    host_options: HostOptions,
}

impl Models {
    pub fn new(
        offers: Vec<ModelOffer>,
        budget: Option<u64>,
        events: mpsc::UnboundedSender<(EngineKey, HostEvent)>,
        loads: mpsc::UnboundedSender<LoadDone>,
    ) -> (Models, watch::Receiver<ClaimModels>) {
        let (scope, scope_rx) = watch::channel(ClaimModels::default());
        if let Some(budget) = budget {
            for offer in offers.iter().filter(|o| o.resident_bytes > budget) {
                tracing::warn!(
                    model = %offer.id,
                    bytes = offer.resident_bytes,
                    budget,
                    "this model alone exceeds the memory budget: this runner will never load it"
                );
            }
        }
        let models = Models {
            offers,
            residency: Residency::new(budget),
            hosts: HashMap::new(),
            loading: HashMap::new(),
            waiting: HashMap::new(),
            preload: VecDeque::new(),
            evict_when_idle: BTreeSet::new(),
            failed_until: HashMap::new(),
            replicas: HashMap::new(),
            next_generation: 0,
            events,
            loads,
            scope,
            host_options: HostOptions::default(),
        };
        (models, scope_rx)
    }

    /// How every engine this runner starts behaves (preparation budget, test hook).
    pub fn with_host_options(self, host_options: HostOptions) -> Self {
        Models {
            host_options,
            ..self
        }
    }

    /// Every model this runner may serve, as `/v1/models` lists them, each generative
    /// model followed by the LoRA adapters served over it.
    pub fn entries(&self, created: i64) -> Vec<ModelEntry> {
        self.offers
            .iter()
            .flat_map(|o| match o.embedding {
                Some(_) => vec![o.entry(created)],
                None => self.host_options.adapters.entries(o.entry(created)),
            })
            .collect()
    }

    /// Resident models (loaded or loading) and their adapters' queues, for the registry's
    /// `warm`.
    pub fn warm(&self) -> Vec<String> {
        self.with_adapter_queues(self.residency.models())
    }

    /// `models`, each followed by the queues of the adapters served over it: a job of an
    /// adapter is a job of its base's engine.
    fn with_adapter_queues(&self, models: Vec<String>) -> Vec<String> {
        let adapters = &self.host_options.adapters;
        models
            .into_iter()
            .flat_map(|m| {
                let queues = adapters.queues(&m);
                std::iter::once(m).chain(queues)
            })
            .collect()
    }

    pub fn wants_replica_counts(&self) -> bool {
        self.offers.iter().any(|o| o.min_warm > 0)
    }

    pub fn set_replicas(&mut self, replicas: HashMap<String, i64>) {
        self.replicas = replicas;
    }

    /// The engine serving `model`, if loaded.
    pub fn host(&self, model: &str) -> Option<&EngineHost> {
        self.hosts.get(model).map(|h| &h.host)
    }

    /// Whether an event comes from the engine now serving its model.
    pub fn is_current(&self, key: &EngineKey) -> bool {
        self.hosts
            .get(&key.model)
            .is_some_and(|h| h.generation == key.generation)
    }

    fn offer(&self, model: &str) -> Option<&ModelOffer> {
        self.offers.iter().find(|o| o.id == model)
    }

    /// The runner is needed to keep `model`'s minimum of warm replicas.
    fn pinned(&self, model: &str) -> bool {
        self.offer(model).is_some_and(|o| {
            o.min_warm > 0
                && self.replicas.get(model).copied().unwrap_or(0) <= i64::from(o.min_warm)
        })
    }

    /// Loads every model, in order, that fits without evicting anything; returns the first
    /// failure. Used at start, before the runner registers, so a model that cannot load
    /// stops the runner there.
    pub async fn preload_now(&mut self) -> anyhow::Result<()> {
        for offer in self.offers.clone() {
            if !self.residency.fits(offer.resident_bytes) {
                tracing::info!(model = %offer.id, "not preloaded: the memory budget is full");
                continue;
            }
            let started = Instant::now();
            let to_load = offer.clone();
            let loaded = tokio::task::spawn_blocking(move || to_load.load())
                .await?
                .map_err(|e| anyhow::anyhow!("loading model {}: {e}", offer.path.display()))?;
            let generation = self.begin(&offer.id, offer.resident_bytes);
            let done = LoadDone {
                key: EngineKey {
                    model: offer.id.clone(),
                    generation,
                },
                result: Ok(loaded),
                seconds: started.elapsed().as_secs_f64(),
            };
            if let Loaded::Failed { error, .. } = self.finish_load(done) {
                anyhow::bail!("starting model {}: {error}", offer.id);
            }
        }
        Ok(())
    }

    /// Queues every model for loading in the background, as at start (after a yield).
    pub fn preload_later(&mut self) {
        self.preload = self.offers.iter().map(|o| o.id.clone()).collect();
    }

    /// A job for `model` was claimed (and is held under `id`): is its engine ready, or must
    /// it wait for a load (started here, evicting idle models if needed)?
    pub fn admit(
        &mut self,
        id: u64,
        request: &GenerateRequest,
        busy: &HashSet<String>,
    ) -> Admission {
        let model = request.model.as_str();
        self.residency.touch(model, Instant::now());
        if self.hosts.contains_key(model) {
            return Admission::Ready;
        }
        if !self.loading.contains_key(model) && !self.start_load(model, busy) {
            return Admission::NoRoom;
        }
        self.waiting
            .entry(model.to_string())
            .or_default()
            .push((id, Box::new(request.clone())));
        Admission::Waiting
    }

    /// Starts loading `model` after evicting what its room needs; false if there is no room
    /// (or it is not offered).
    fn start_load(&mut self, model: &str, busy: &HashSet<String>) -> bool {
        let Some(offer) = self.offer(model).cloned() else {
            return false;
        };
        let Some(victims) = self.residency.room_for(
            offer.resident_bytes,
            |m| busy.contains(m),
            |m| self.pinned(m),
        ) else {
            return false;
        };
        for victim in victims {
            self.unload(&victim, "budget");
        }
        let generation = self.begin(model, offer.resident_bytes);
        let key = EngineKey {
            model: model.to_string(),
            generation,
        };
        let loads = self.loads.clone();
        tracing::info!(model, "loading model");
        tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            let result = offer.load();
            let seconds = started.elapsed().as_secs_f64();
            let _ = loads.send(LoadDone {
                key,
                result,
                seconds,
            });
        });
        true
    }

    fn begin(&mut self, model: &str, bytes: u64) -> u64 {
        self.next_generation += 1;
        self.loading.insert(model.to_string(), self.next_generation);
        self.residency.begin_load(model, bytes, Instant::now());
        self.next_generation
    }

    /// A load finished: start its engine thread, or report the failure.
    pub fn finish_load(&mut self, done: LoadDone) -> Loaded {
        let LoadDone {
            key,
            result,
            seconds,
        } = done;
        if self.loading.get(&key.model) != Some(&key.generation) {
            return Loaded::Stale;
        }
        self.loading.remove(&key.model);
        let waiting = self.waiting.remove(&key.model).unwrap_or_default();
        let started = result.and_then(|loaded| {
            let bytes = loaded.resident_bytes();
            let spawned = match loaded {
                LoadedOffer::Generative(loaded) => EngineHost::spawn(
                    loaded.engine,
                    loaded.frontend,
                    &key.model,
                    self.host_options.clone(),
                ),
                LoadedOffer::Embedding { model, .. } => {
                    super::embed_host::spawn(*model, &key.model)
                }
            };
            let (host, mut events) =
                spawned.map_err(|e| format!("starting the engine thread: {e}"))?;
            let tx = self.events.clone();
            let tagged = key.clone();
            tokio::spawn(async move {
                while let Some(event) = events.recv().await {
                    if tx.send((tagged.clone(), event)).is_err() {
                        return;
                    }
                }
            });
            Ok((host, bytes))
        });
        match started {
            Ok((host, bytes)) => {
                tracing::info!(model = %key.model, seconds, bytes, "model loaded");
                telemetry::record_model_load(&key.model, seconds, bytes);
                self.residency
                    .finish_load(&key.model, bytes, Instant::now());
                if let Some(offer) = self.offers.iter_mut().find(|o| o.id == key.model) {
                    offer.resident_bytes = bytes; // the real figure, for the next decision
                }
                self.hosts.insert(
                    key.model,
                    Hosted {
                        host,
                        generation: key.generation,
                    },
                );
                Loaded::Ready(waiting)
            }
            Err(error) => {
                tracing::error!(model = %key.model, %error, "loading the model failed");
                self.residency.remove(&key.model);
                self.failed_until
                    .insert(key.model, Instant::now() + FAILED_LOAD_BACKOFF);
                Loaded::Failed { waiting, error }
            }
        }
    }

    /// Unloads `model`: its engine thread ends and frees its memory once the host is
    /// dropped. Only for models without jobs (or whose jobs were already handed back).
    pub fn unload(&mut self, model: &str, reason: &'static str) {
        let was_resident = self.residency.is_resident(model);
        self.hosts.remove(model);
        self.loading.remove(model);
        self.waiting.remove(model);
        self.residency.remove(model);
        self.evict_when_idle.remove(model);
        if was_resident {
            tracing::info!(model, reason, "model unloaded");
            telemetry::record_model_unload(model, reason);
        }
    }

    /// Unloads everything (the owner needs the device back); nothing is preloaded until
    /// [`preload_later`](Self::preload_later).
    pub fn unload_all(&mut self, reason: &'static str) {
        self.preload.clear();
        for model in self.residency.models() {
            self.unload(&model, reason);
        }
    }

    /// The engine of `model` failed and its thread ended: forget it (the next job loads it
    /// again).
    pub fn engine_failed(&mut self, model: &str) {
        self.unload(model, "engine_failed");
    }

    /// An operator asked to unload `model`: at once if idle, else when its jobs are done.
    pub fn request_evict(&mut self, model: &str, busy: &HashSet<String>) {
        if !self.residency.is_resident(model) {
            return;
        }
        if busy.contains(model) || self.residency.is_loading(model) {
            self.evict_when_idle.insert(model.to_string());
        } else {
            self.unload(model, "operator");
        }
    }

    /// Periodic upkeep: finishes deferred evictions, expires idle models past their
    /// keep-alive, and starts a background load (a preload, or a model short of its
    /// minimum of warm replicas) when idle memory allows. Returns whether anything changed.
    pub fn tick(&mut self, busy: &HashSet<String>) -> bool {
        let before = self.residency.models();
        let now = Instant::now();
        let deferred: Vec<String> = self
            .evict_when_idle
            .iter()
            .filter(|m| !busy.contains(*m) && !self.residency.is_loading(m))
            .cloned()
            .collect();
        for model in deferred {
            self.unload(&model, "operator");
        }
        let expired = self.residency.expired(
            now,
            |m| self.offer(m).and_then(|o| o.keep_alive),
            |m| busy.contains(m),
            |m| self.pinned(m),
        );
        for model in expired {
            self.unload(&model, "keep_alive");
        }
        if !self.residency.any_loading() {
            self.load_in_background(busy);
        }
        before != self.residency.models()
    }

    fn load_in_background(&mut self, busy: &HashSet<String>) {
        while let Some(model) = self.preload.pop_front() {
            let fits = self
                .offer(&model)
                .is_some_and(|o| self.residency.fits(o.resident_bytes));
            if !self.residency.is_resident(&model) && fits && self.start_load(&model, busy) {
                return;
            }
        }
        let short: Option<String> = self
            .offers
            .iter()
            .filter(|o| o.min_warm > 0 && !self.residency.is_resident(&o.id))
            .filter(|o| self.replicas.get(&o.id).copied().unwrap_or(0) < i64::from(o.min_warm))
            .filter(|o| !self.recently_failed(&o.id))
            .map(|o| o.id.clone())
            .next();
        if let Some(model) = short {
            if self.start_load(&model, busy) {
                tracing::info!(model, "loading to keep the minimum of warm replicas");
            }
        }
    }

    fn recently_failed(&self, model: &str) -> bool {
        self.failed_until
            .get(model)
            .is_some_and(|until| Instant::now() < *until)
    }

    /// Publishes what the claim loop may claim, given the models with jobs now.
    pub fn publish_scope(&self, busy: &HashSet<String>) {
        let warm: Vec<String> = self
            .residency
            .models()
            .into_iter()
            .filter(|m| !self.evict_when_idle.contains(m))
            .collect();
        let cold: Vec<String> = self
            .offers
            .iter()
            .filter(|o| !self.residency.is_resident(&o.id) && !self.recently_failed(&o.id))
            .filter(|o| {
                self.residency
                    .room_for(o.resident_bytes, |m| busy.contains(m), |m| self.pinned(m))
                    .is_some()
            })
            .map(|o| o.id.clone())
            .collect();
        let scope = ClaimModels {
            warm: self.with_adapter_queues(warm),
            cold: self.with_adapter_queues(cold),
        };
        self.scope.send_if_modified(|current| {
            let changed = *current != scope;
            if changed {
                *current = scope;
            }
            changed
        });
    }
}
