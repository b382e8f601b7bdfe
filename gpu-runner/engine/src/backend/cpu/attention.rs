//! Causal attention of a step's new tokens over the paged KV cache. Each task is one
//! (sequence, KV head, run of tokens) and runs on the CPU worker team; it serves all query heads
//! sharing that KV head, so each cached K/V row is read once per group rather than once per
//! query head. Tasks write disjoint slices of a group-major output, so no locking is needed.
//!
//! Every new token attends to all cached positions of its sequence up to and including its
//! own (its K/V were written to the pool before this runs), optionally limited to a sliding
//! window, with grouped-query heads sharing a KV head. The per-task kernel is compiled per KV
//! element type (f16, f32) twice, plain and with AVX2+FMA+F16C enabled (picked at runtime), so
//! its dot products vectorise 8 wide.
//!
//! Over an f16 cache the queries and the attention weights are rounded to f16 as well, as
//! llama.cpp's non-flash attention does (its `K·q` and `V·softmax` products convert the f32
//! operand to f16). Measured against llama.cpp's f16-cache logits this is what makes f16
//! storage pay: f16 K/V alone moved us *further* from llama.cpp (teacher-forced log-prob
//! worst diff 0.41 → 0.64 on Gemma 3), all three roundings together moved us closer
//! (→ 0.25; SmolLM2 0.80 → 0.47).

use half::f16;

use super::kv_pool::{KvLayer, KvPool};
use super::ops::{dot, softcap, softmax, softmax_with_sink, weighted_sum};
use crate::backend::batch::BatchLayout;
use crate::backend::SeqSlice;
use crate::team;

/// Tokens per task: splits one long prefill across threads while keeping tasks coarse.
const TOKENS_PER_TASK: usize = 32;

/// Per-layer attention settings.
pub struct AttnParams<'a> {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub scale: f32,
    pub logit_softcap: Option<f32>,
    /// Attend only to the last `window` positions (sliding-window layers).
    pub window: Option<usize>,
    /// Per query head, a logit that joins the softmax's denominator and carries no value
    /// (gpt-oss's sinks): a head can attend to "nothing".
    pub sinks: Option<&'a [f32]>,
}

struct Task<'a> {
    seq: usize,
    /// The KV head; query heads `group · kv_head ..` share it.
    kv_head: usize,
    first_row: usize,
    out: &'a mut [f32],
}

/// Per-thread buffers, reused across the tasks a team thread runs.
#[derive(Default)]
struct TaskScratch {
    /// The group's query heads of one token, pre-scaled.
    q: Vec<f32>,
    /// `[group, positions]` attention scores, then weights.
    scores: Vec<f32>,
    /// KV slot offset of each attended position.
    offsets: Vec<usize>,
    /// Cached K or V rows widened to f32 ([`rows_per_pass`] at a time), shared by the
    /// group's query heads.
    rows: Vec<f32>,
}

/// What every task reads; `T` is the KV cache's element type.
struct Shared<'a, T> {
    q: &'a [f32],
    k: &'a [T],
    v: &'a [T],
    batch: &'a [SeqSlice<'a>],
    positions: &'a [usize],
    /// The pool `k`/`v` come from, for its layout.
    pool: &'a KvPool,
    p: &'a AttnParams<'a>,
    /// Round queries and attention weights to f16 as llama.cpp does when its cache is f16
    /// (its matrix products convert the f32 operand to the f16 operand's type).
    round_f16: bool,
}

impl<T> Shared<'_, T> {
    #[inline(always)]
    fn round(&self, x: f32) -> f32 {
        if self.round_f16 {
            f16::from_f32(x).to_f32()
        } else {
            x
        }
    }
}

/// Computes attention for every new token.
///
/// `q`: `[n_tokens, n_heads · head_dim]`, already rotated. `out_gm`: group-major
/// `[n_kv_heads, n_tokens, group · head_dim]` (see [`groups_to_rows`]).
pub fn paged_attention(
    q: &[f32],
    pool: &KvPool,
    layer: usize,
    batch: &[SeqSlice<'_>],
    layout: &BatchLayout,
    p: &AttnParams<'_>,
    out_gm: &mut [f32],
) {
    let n = layout.n_tokens();
    let width = p.n_heads / p.n_kv_heads * p.head_dim;
    let mut tasks = Vec::new();
    for (kv_head, mut rest) in out_gm.chunks_mut(n * width).enumerate() {
        for (seq, w) in layout.offsets.windows(2).enumerate() {
            let mut row = w[0];
            while row < w[1] {
                let rows = TOKENS_PER_TASK.min(w[1] - row);
                let (out, tail) = rest.split_at_mut(rows * width);
                rest = tail;
                tasks.push(Task {
                    seq,
                    kv_head,
                    first_row: row,
                    out,
                });
                row += rows;
            }
        }
    }
    // K/V are filled in per element type below.
    let base: Shared<'_, f32> = Shared {
        q,
        k: &[],
        v: &[],
        batch,
        positions: &layout.positions,
        pool,
        p,
        round_f16: false,
    };
    match pool.layer(layer) {
        KvLayer::F16 { k, v } => {
            let shared = Shared {
                round_f16: true,
                ..base.with_kv(k, v)
            };
            run_tasks(tasks, &shared, run_task_f16)
        }
        KvLayer::F32 { k, v } => run_tasks(tasks, &base.with_kv(k, v), run_task_f32),
    }
}

impl<'a, T> Shared<'a, T> {
    fn with_kv<U>(&self, k: &'a [U], v: &'a [U]) -> Shared<'a, U> {
        Shared {
            q: self.q,
            k,
            v,
            batch: self.batch,
            positions: self.positions,
            pool: self.pool,
            p: self.p,
            round_f16: self.round_f16,
        }
    }
}

type TaskFn<T> = fn(&Shared<'_, T>, &mut Task<'_>, &mut TaskScratch);

thread_local! {
    /// Each team thread's buffers, reused across steps.
    static SCRATCH: std::cell::RefCell<TaskScratch> = std::cell::RefCell::default();
}

fn run_tasks<T: Sync>(mut tasks: Vec<Task<'_>>, shared: &Shared<'_, T>, run: TaskFn<T>) {
    // Tasks were built in row order, and a later run of a prompt attends to more positions:
    // handing out the costliest first keeps one long task from finishing alone at the end.
    tasks.reverse();
    team::for_each_mut(&mut tasks, |task| {
        SCRATCH.with_borrow_mut(|scratch| run(shared, task, scratch))
    });
}

fn widen_f32(src: &[f32], dst: &mut [f32]) {
    dst.copy_from_slice(src);
}

fn widen_f16(src: &[f16], dst: &mut [f32]) {
    for (d, h) in dst.iter_mut().zip(src) {
        *d = h.to_f32();
    }
}

fn run_task_f32(s: &Shared<'_, f32>, task: &mut Task<'_>, scratch: &mut TaskScratch) {
    #[cfg(target_arch = "x86_64")]
    if super::simd::available() {
        // SAFETY: the CPU supports AVX2, FMA and F16C (checked just above).
        unsafe { run_task_f32_avx2(s, task, scratch) };
        return;
    }
    run_task_body(s, task, scratch, dot, weighted_sum, widen_f32);
}

fn run_task_f16(s: &Shared<'_, f16>, task: &mut Task<'_>, scratch: &mut TaskScratch) {
    #[cfg(target_arch = "x86_64")]
    if super::simd::available() {
        // SAFETY: the CPU supports AVX2, FMA and F16C (checked just above).
        unsafe { run_task_f16_avx2(s, task, scratch) };
        return;
    }
    run_task_body(s, task, scratch, dot, weighted_sum, widen_f16);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run_task_f32_avx2(s: &Shared<'_, f32>, task: &mut Task<'_>, scratch: &mut TaskScratch) {
    // SAFETY: this function only runs where AVX2, FMA and F16C are available.
    let dot = |a: &[f32], b: &[f32]| unsafe { super::simd::dot(a, b) };
    // SAFETY: as above.
    let weighted_sum =
        |o: &mut [f32], w: &[f32], rows: &[f32]| unsafe { super::simd::weighted_sum(o, w, rows) };
    run_task_body(s, task, scratch, dot, weighted_sum, widen_f32);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run_task_f16_avx2(s: &Shared<'_, f16>, task: &mut Task<'_>, scratch: &mut TaskScratch) {
    // SAFETY: this function only runs where AVX2, FMA and F16C are available.
    let dot = |a: &[f32], b: &[f32]| unsafe { super::simd::dot(a, b) };
    // SAFETY: as above.
    let weighted_sum =
        |o: &mut [f32], w: &[f32], rows: &[f32]| unsafe { super::simd::weighted_sum(o, w, rows) };
    // SAFETY: as above.
    let widen = |src: &[f16], dst: &mut [f32]| unsafe { super::simd::widen_f16(src, dst) };
    run_task_body(s, task, scratch, dot, weighted_sum, widen);
}

/// Fills `offsets` with the offset of KV head `kv_head`'s row for each cached position
/// `lo ..= hi` of a sequence (see [`KvPool::head_row_offset`]), walking the block table
/// block by block rather than dividing per position: within a block one head's rows are
/// adjacent, so each run is a contiguous stretch the prefetcher follows.
#[inline(always)]
fn slot_offsets(
    pool: &KvPool,
    table: &[u32],
    kv_head: usize,
    lo: usize,
    hi: usize,
    offsets: &mut Vec<usize>,
) {
    offsets.clear();
    let (block_size, hd) = (pool.block_size(), pool.head_dim());
    let mut j = lo;
    while j <= hi {
        let slot = j % block_size;
        let run = (block_size - slot).min(hi + 1 - j);
        let base = pool.head_row_offset(table[j / block_size] as usize, kv_head, slot);
        offsets.extend((0..run).map(|i| base + i * hd));
        j += run;
    }
}

/// The kernel, generic over the dot/weighted-sum/widen primitives so it is compiled once per
/// instruction set. Each cached K and V row is widened to f32 once and then serves every
/// query head of the group (rather than being converted once per head).
#[inline(always)]
fn run_task_body<T>(
    s: &Shared<'_, T>,
    task: &mut Task<'_>,
    scratch: &mut TaskScratch,
    dot: impl Fn(&[f32], &[f32]) -> f32,
    weighted_sum: impl Fn(&mut [f32], &[f32], &[f32]),
    widen: impl Fn(&[T], &mut [f32]),
) {
    let p = s.p;
    let hd = p.head_dim;
    let group = p.n_heads / p.n_kv_heads;
    let table = s.batch[task.seq].block_table;
    let q_dim = p.n_heads * hd;
    for (r, out) in task.out.chunks_exact_mut(group * hd).enumerate() {
        let t = task.first_row + r;
        let pos = s.positions[t];
        // The group's query heads are adjacent in q; scaling once saves a multiply per
        // attended position. llama.cpp rounds before scaling (power-of-two scales, so the
        // order rarely matters).
        let q_first = t * q_dim + task.kv_head * group * hd;
        scratch.q.clear();
        scratch.q.extend(
            s.q[q_first..][..group * hd]
                .iter()
                .map(|&x| s.round(x) * p.scale),
        );
        let lo = p.window.map_or(0, |w| (pos + 1).saturating_sub(w));
        let n_pos = pos + 1 - lo;
        slot_offsets(s.pool, table, task.kv_head, lo, pos, &mut scratch.offsets);
        let scores = &mut scratch.scores;
        scores.clear();
        scores.resize(group * n_pos, 0.0);
        let per_pass = rows_per_pass(hd);
        scratch.rows.resize(per_pass * hd, 0.0);
        let rows = &mut scratch.rows;
        for (c, offs) in scratch.offsets.chunks(per_pass).enumerate() {
            // By the next step the KV cache is mostly out of the caches (the weights stream
            // through them), and these passes waited on it: ask for the K rows a few
            // positions ahead, and for the V rows of these positions, which the weighted
            // sum reads right after the softmax.
            let ahead = &scratch.offsets[(c * per_pass + K_ROWS_AHEAD).min(n_pos)..];
            for (i, &off) in offs.iter().enumerate() {
                if let Some(&next) = ahead.get(i) {
                    prefetch_row(&s.k[next..][..hd]);
                }
                prefetch_row(&s.v[off..][..hd]);
            }
            widen_rows(s.k, offs, hd, rows, &widen);
            for (i, row) in rows.chunks_exact(hd).take(offs.len()).enumerate() {
                let j = c * per_pass + i;
                for (h, qh) in scratch.q.chunks_exact(hd).enumerate() {
                    scores[h * n_pos + j] = dot(qh, row);
                }
            }
        }
        for (h, head_scores) in scores.chunks_exact_mut(n_pos).enumerate() {
            if let Some(cap) = p.logit_softcap {
                softcap(head_scores, cap);
            }
            match p.sinks.and_then(|s| s.get(task.kv_head * group + h)) {
                Some(&sink) => softmax_with_sink(head_scores, sink),
                None => softmax(head_scores),
            }
            if s.round_f16 {
                head_scores.iter_mut().for_each(|w| *w = s.round(*w));
            }
        }
        out.fill(0.0);
        for (c, offs) in scratch.offsets.chunks(per_pass).enumerate() {
            widen_rows(s.v, offs, hd, rows, &widen);
            let (j0, n) = (c * per_pass, offs.len());
            for (h, out_h) in out.chunks_exact_mut(hd).enumerate() {
                weighted_sum(out_h, &scores[h * n_pos + j0..][..n], &rows[..n * hd]);
            }
        }
    }
}

/// Cached rows widened per pass: a pass first only streams rows in from the cache (many
/// loads in flight at once), then computes on them from L1. Doing both per row left the
/// arithmetic waiting on each row's load in turn. A pass's f32 rows are kept to 8 KiB so
/// they stay in L1 with everything else (32 rows of 64 dims; 32 rows of Gemma 3's 256 dims
/// filled the whole L1 and made the widening stores the hottest instructions).
fn rows_per_pass(head_dim: usize) -> usize {
    (8192 / 4 / head_dim.max(1)).clamp(4, 32)
}

/// Widens the `hd`-long rows at `offsets` of `src` into consecutive rows of `dst`.
#[inline(always)]
fn widen_rows<T>(
    src: &[T],
    offsets: &[usize],
    hd: usize,
    dst: &mut [f32],
    widen: &impl Fn(&[T], &mut [f32]),
) {
    for (&off, d) in offsets.iter().zip(dst.chunks_exact_mut(hd)) {
        widen(&src[off..][..hd], d);
    }
}

/// How far ahead of the row being widened the K rows are prefetched.
const K_ROWS_AHEAD: usize = 8;

/// Asks the cache for `row` (a hint: no effect on results, never faults).
#[inline(always)]
fn prefetch_row<T>(row: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let bytes = std::mem::size_of_val(row);
        let start = row.as_ptr().cast::<i8>();
        for line in (0..bytes).step_by(64) {
            // SAFETY: `start + line` lies inside `row`; prefetching never faults anyway.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(start.add(line)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = row;
}

/// Group-major `[n_kv_heads, n_tokens, group · head_dim]` → token-major
/// `[n_tokens, n_heads · head_dim]` (query head `h` belongs to group `h / group`).
pub fn groups_to_rows(
    gm: &[f32],
    n_kv_heads: usize,
    n_tokens: usize,
    width: usize,
    out: &mut [f32],
) {
    for g in 0..n_kv_heads {
        for t in 0..n_tokens {
            let src = &gm[(g * n_tokens + t) * width..][..width];
            out[(t * n_kv_heads + g) * width..][..width].copy_from_slice(src);
        }
    }
}
