//! The CPU backend's worker team: persistent threads that split each operation of a step
//! (a matrix product, attention) into tasks, with the calling thread taking tasks too.
//!
//! Why not rayon: the engine thread is not a rayon worker, so every `par_iter` from it
//! injects a job, wakes a sleeping worker through the OS and blocks on a latch — two futex
//! round trips per operation. A decode step of a 30-layer model runs ~250 operations of a
//! few microseconds each, so those hand-offs cost as much as the arithmetic. Here the
//! workers spin between operations (and park only after [`SPIN_ROUNDS`] idle rounds), and
//! handing out an operation is one atomic store.
//!
//! Protocol: the caller publishes a job (a task count and a borrowed closure) under a new
//! epoch in `state` (epoch in the high 32 bits, next task index in the low 32). Threads
//! claim task indices by compare-and-swap on `state`, so a claim succeeds only while that
//! epoch's job is live; the caller returns once `done` reaches the task count, so the
//! borrowed closure outlives every call into it. Publishing first closes `state` (index
//! [`CLOSED`]) and only then replaces the count and the closure: a thread that read the old
//! epoch's `state` but the new count cannot win its compare-and-swap, because `state` has
//! changed since.

use std::cell::Cell;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread;

/// Idle polls of `state` before a worker parks: long enough to bridge the gap between two
/// operations of a step (norms, sampling), short enough not to burn a core while idle.
const SPIN_ROUNDS: u32 = 1 << 16;

/// The task index of a `state` whose job is being replaced: claimers wait for it to open.
const CLOSED: u64 = 0xFFFF_FFFF;

type Task<'a> = dyn Fn(usize) + Sync + 'a;

/// A published job: the caller's closure, with its lifetime erased (see the module docs
/// for why it is only called while alive).
struct Job {
    f: *const Task<'static>,
}

struct Shared {
    /// Epoch (high 32 bits) and next unclaimed task (low 32 bits).
    state: AtomicU64,
    n_tasks: AtomicUsize,
    job: AtomicPtr<Job>,
    /// Tasks of the current epoch finished (including panicked ones).
    done: AtomicUsize,
    panicked: AtomicBool,
    /// Parking: workers wait on `wake` once they stop spinning.
    sleepers: AtomicUsize,
    park: Mutex<()>,
    wake: Condvar,
}

/// The process's team, sized once (see [`team_size`]).
pub(crate) struct Team {
    shared: Arc<Shared>,
    size: usize,
    /// One caller at a time: a second engine thread waits for the first's operation.
    dispatch: Mutex<()>,
}

thread_local! {
    /// Set while this thread runs team tasks: a nested `for_each` runs inline.
    static IN_TEAM: Cell<bool> = const { Cell::new(false) };
}

/// Threads the team uses (the caller included): [`CpuSettings::threads`], else the CPUs
/// available to the process.
///
/// [`CpuSettings::threads`]: crate::cpu_settings::CpuSettings::threads
pub(crate) fn team_size() -> usize {
    team().size
}

fn configured_size() -> usize {
    crate::cpu_settings::settings()
        .threads
        .filter(|&n| n > 0)
        .unwrap_or_else(|| thread::available_parallelism().map_or(1, |n| n.get()))
}

fn team() -> &'static Team {
    static TEAM: OnceLock<Team> = OnceLock::new();
    TEAM.get_or_init(|| Team::start(configured_size()))
}

/// Runs `f(i)` for every `i in 0..n_tasks` on the team, returning when all have run.
/// Tasks are handed out dynamically, so uneven tasks balance. A panic in a task is
/// re-raised here after the others finish.
pub(crate) fn for_each(n_tasks: usize, f: impl Fn(usize) + Sync) {
    let team = team();
    if n_tasks <= 1 || team.size == 1 || IN_TEAM.get() {
        (0..n_tasks).for_each(f);
        return;
    }
    team.run(n_tasks, &f);
}

/// Runs `f` on every item of `items` on the team, each item exactly once.
pub(crate) fn for_each_mut<T: Send>(items: &mut [T], f: impl Fn(&mut T) + Sync) {
    struct Items<T>(*mut T);
    // SAFETY: every index is claimed by exactly one task (see `for_each`), so the `&mut`
    // handed out below are disjoint; `T: Send` lets them move to another thread.
    unsafe impl<T: Send> Sync for Items<T> {}
    let base = Items(items.as_mut_ptr());
    let base = &base;
    for_each(items.len(), |i| {
        // SAFETY: `i < items.len()` and no other task gets index `i` (see above); `items`
        // stays mutably borrowed until `for_each` returns.
        f(unsafe { &mut *base.0.add(i) })
    });
}

/// `(0..n).map(f)` computed on the team, in order.
pub(crate) fn map<T: Send>(n: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let mut slots: Vec<(usize, Option<T>)> = (0..n).map(|i| (i, None)).collect();
    for_each_mut(&mut slots, |(i, slot)| *slot = Some(f(*i)));
    slots.into_iter().filter_map(|(_, v)| v).collect()
}

impl Team {
    fn start(size: usize) -> Team {
        let shared = Arc::new(Shared {
            state: AtomicU64::new(0),
            n_tasks: AtomicUsize::new(0),
            job: AtomicPtr::new(std::ptr::null_mut()),
            done: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            park: Mutex::new(()),
            wake: Condvar::new(),
        });
        let mut started = 1;
        for i in 1..size {
            let s = Arc::clone(&shared);
            let spawned = thread::Builder::new()
                .name(format!("fallow-cpu-{i}"))
                .spawn(move || worker(&s));
            if spawned.is_err() {
                break; // run with the threads we have
            }
            started += 1;
        }
        Team {
            shared,
            size: started,
            dispatch: Mutex::new(()),
        }
    }

    fn run(&self, n_tasks: usize, f: &Task<'_>) {
        let _one_caller = self.dispatch.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        // SAFETY (lifetime erasure): the pointer is dereferenced only by a thread holding a
        // claimed task of this epoch, and this function returns only after every task of
        // the epoch is done, so `f` and `job` outlive all uses.
        let f: *const Task<'static> = unsafe { std::mem::transmute(f as *const Task<'_>) };
        let mut job = Job { f };
        let epoch = ((s.state.load(Ordering::Relaxed) >> 32) + 1) & 0xFFFF_FFFF;
        s.state.store(epoch << 32 | CLOSED, Ordering::SeqCst);
        s.n_tasks.store(n_tasks, Ordering::Release);
        s.done.store(0, Ordering::Relaxed);
        s.job.store(&mut job, Ordering::Release);
        s.state.store(epoch << 32, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = s.park.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        IN_TEAM.set(true);
        while claim_and_run(s, epoch as u32) {}
        IN_TEAM.set(false);
        while s.done.load(Ordering::Acquire) < n_tasks {
            std::hint::spin_loop();
        }
        s.job.store(std::ptr::null_mut(), Ordering::Relaxed);
        if s.panicked.swap(false, Ordering::Relaxed) {
            panic!("a CPU worker task panicked");
        }
    }
}

/// Claims one task of `epoch` and runs it; false when the epoch has none left.
fn claim_and_run(s: &Shared, epoch: u32) -> bool {
    loop {
        let cur = s.state.load(Ordering::Acquire);
        if (cur >> 32) as u32 != epoch {
            return false;
        }
        if cur & 0xFFFF_FFFF == CLOSED {
            // The caller is between closing and opening this epoch.
            std::hint::spin_loop();
            continue;
        }
        // Acquire: seeing this epoch's count means seeing the close that preceded it, so
        // a stale `cur` (an older epoch's) fails the compare-and-swap below.
        let idx = (cur & 0xFFFF_FFFF) as usize;
        if idx >= s.n_tasks.load(Ordering::Acquire) {
            return false;
        }
        let job = s.job.load(Ordering::Acquire);
        if s.state
            .compare_exchange_weak(cur, cur + 1, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            continue;
        }
        // SAFETY: the claim succeeded while `state` still held this (open) epoch with task
        // `idx` unclaimed, so the caller has not returned, and `job` — read after `cur`,
        // whose opening store followed the job's — is this epoch's job (a newer job would
        // have been stored only after `state` changed, failing the claim).
        let f = unsafe { &*(*job).f };
        if panic::catch_unwind(AssertUnwindSafe(|| f(idx))).is_err() {
            s.panicked.store(true, Ordering::Relaxed);
        }
        s.done.fetch_add(1, Ordering::Release);
        return true;
    }
}

fn worker(s: &Shared) {
    IN_TEAM.set(true);
    let mut seen = 0u32;
    loop {
        let epoch = wait_for_epoch(s, seen);
        seen = epoch;
        while claim_and_run(s, epoch) {}
    }
}

/// Spins, then parks, until `state` carries an epoch other than `seen`.
fn wait_for_epoch(s: &Shared, seen: u32) -> u32 {
    let current = || (s.state.load(Ordering::Acquire) >> 32) as u32;
    for _ in 0..SPIN_ROUNDS {
        let e = current();
        if e != seen {
            return e;
        }
        std::hint::spin_loop();
    }
    let mut guard = s.park.lock().unwrap_or_else(|e| e.into_inner());
    s.sleepers.fetch_add(1, Ordering::SeqCst);
    loop {
        let e = (s.state.load(Ordering::SeqCst) >> 32) as u32;
        if e != seen {
            s.sleepers.fetch_sub(1, Ordering::SeqCst);
            return e;
        }
        guard = s.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_runs_exactly_once() {
        for n in [0, 1, 2, 7, 1000] {
            let counts: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            for_each(n, |i| {
                counts[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(
                counts.iter().all(|c| c.load(Ordering::Relaxed) == 1),
                "n={n}"
            );
        }
    }

    #[test]
    fn back_to_back_jobs_never_run_a_task_twice_or_skip_one() {
        // Many short jobs in a row exercise the hand-over between epochs, where a worker
        // still looking at the previous job meets the next one being published.
        for round in 0..20_000usize {
            let n = 1 + round % 5;
            let counts: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            for_each(n, |i| {
                counts[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(
                counts.iter().all(|c| c.load(Ordering::Relaxed) == 1),
                "round {round}"
            );
        }
    }

    #[test]
    fn concurrent_callers_each_get_all_their_tasks_run() {
        thread::scope(|scope| {
            for caller in 0..4usize {
                scope.spawn(move || {
                    for round in 0..200 {
                        let sum = AtomicUsize::new(0);
                        let n = 3 + (caller + round) % 17;
                        for_each(n, |i| {
                            sum.fetch_add(i + 1, Ordering::Relaxed);
                        });
                        assert_eq!(sum.load(Ordering::Relaxed), n * (n + 1) / 2);
                    }
                });
            }
        });
    }

    #[test]
    fn map_keeps_order_and_for_each_mut_reaches_every_item() {
        assert_eq!(
            map(100, |i| i * i),
            (0..100).map(|i| i * i).collect::<Vec<_>>()
        );
        let mut items = vec![1u64; 333];
        for_each_mut(&mut items, |x| *x *= 3);
        assert!(items.iter().all(|&x| x == 3));
    }

    #[test]
    fn nested_calls_run_inline_instead_of_deadlocking() {
        let total = AtomicUsize::new(0);
        for_each(4, |_| {
            for_each(3, |_| {
                total.fetch_add(1, Ordering::Relaxed);
            });
        });
        assert_eq!(total.load(Ordering::Relaxed), 12);
    }

    #[test]
    fn a_panicking_task_is_reported_to_the_caller_and_the_team_keeps_working() {
        let caught = panic::catch_unwind(|| {
            for_each(8, |i| {
                if i == 5 {
                    panic!("task 5 fails");
                }
            })
        });
        assert!(caught.is_err());
        let ran = AtomicUsize::new(0);
        for_each(8, |_| {
            ran.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(ran.load(Ordering::Relaxed), 8);
    }
}
