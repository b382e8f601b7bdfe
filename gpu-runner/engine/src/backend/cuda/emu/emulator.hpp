// Runs Fallow's CUDA kernels (the .cu sources, unchanged) on the CPU, so that their arithmetic
// is tested on machines without a GPU; see emulator.rs. Only what the kernels use is provided.
//
// Model: a launch's blocks are shared out over a few OS threads (the machine's cores, at most
// 8; FALLOW_EMU_THREADS), each running one block at a time; each of a block's threads is a
// fiber (its own stack, switched by hand on x86-64, by ucontext elsewhere) on that OS thread,
// so `__shared__` can be a function-static thread-local variable (shared by the block's
// threads, reused by the OS thread's next block). `__syncthreads` is a barrier over the
// block's fibers and a warp shuffle exchanges values through a per-warp slot array behind one
// warp barrier; a fiber waiting at a barrier switches straight to the next one, round robin.
// A thread that returns from the kernel leaves both barriers, as an exited GPU thread stops
// counting at `__syncthreads`. Device pointers are host pointers. Launches are serialised.
// Fibers rather than OS threads within a block: a warp shuffle is a barrier, and a fiber
// switch costs nanoseconds.

#define FALLOW_EMULATOR 1

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>
#if !defined(__x86_64__)
#include <ucontext.h>
#endif

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};
struct uint3 {
    unsigned x, y, z;
};
struct alignas(8) uint2 {
    unsigned x, y;
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(8) float2 {
    float x, y;
};

#if defined(__x86_64__)
// Saves the callee-saved registers, MXCSR and the x87 control word on the current stack,
// stores the stack pointer in *from and resumes the context whose stack pointer is `to`.
extern "C" void fallow_emu_switch(void** from, void* to);
asm(R"(
    .text
    .globl fallow_emu_switch
    .type fallow_emu_switch, @function
fallow_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size fallow_emu_switch, .-fallow_emu_switch
)");
#endif

namespace emu {

// A fiber's stack: its size, and its alignment, so that a fiber finds its OS thread's state
// at the base of its own stack (`me`).
constexpr std::size_t STACK_BYTES = 64 * 1024;

struct Barrier {
    unsigned expected = 0, arrived = 0, generation = 0;
    void arrive() {
        if (++arrived == expected) {
            arrived = 0;
            generation++;
        }
    }
    void drop() {
        expected--;
        if (expected > 0 && arrived == expected) {
            arrived = 0;
            generation++;
        }
    }
};

struct Fiber {
    unsigned char* stack = nullptr;  // STACK_BYTES, aligned to them, left uninitialised
    uint3 tid{};
    bool done = false;
#if defined(__x86_64__)
    void* sp = nullptr;
#else
    ucontext_t ctx{};
#endif
};

// A warp's mma operands as plain matrices, A[16][K] and B[K][8], decoded from its lanes'
// fragments once per mma (by the first of its lanes past the barrier; see warp_mma) rather
// than by each lane.
template <class T, int K>
struct MmaMatrices {
    unsigned decoded_at = 0;  // the warp barrier's generation they were decoded at (0: never)
    T a[16][K];
    T b[K][8];
};

struct StackFree {
    void operator()(unsigned char* p) const { std::free(p); }
};

// One OS thread's emulator: the block it runs (one at a time), its threads as fibers, their
// barriers and shuffle slots, its dynamic shared memory. A launch's blocks are shared out
// over several OS threads (see `run`), each with its own Worker; `__shared__` variables are
// `static thread_local` for the same reason.
struct Worker {
    uint3 thread_idx{}, block_idx{};
    dim3 block_dim{}, grid_dim{};
    // The running thread (its index in the block) and the block's threads in that order.
    unsigned linear = 0;
    std::vector<Fiber> fibers;
    Barrier block_barrier;
    std::vector<Barrier> warp_barriers;
    // Each thread's shuffle operand, in two halves that alternate from one warp-wide
    // exchange to the next (see `exchange`).
    std::vector<uint64_t> lanes;
    // Threads of the running block, how many have not returned yet, and whether they run in
    // reverse order (see `run_block`).
    unsigned block_threads = 0, live = 0;
    bool reverse_order = false;
    // Each thread's mma operands (A's 4 registers, then B's 2), and each warp's decoded, for
    // warp_mma.
    std::vector<uint32_t> mma_operands;
    std::vector<MmaMatrices<float, 16>> mma_bf16;
    std::vector<MmaMatrices<int, 32>> mma_s8;
    // Which threads of the running block have called grid_dependency_sync (see kernels.cu).
    std::vector<uint8_t> synced;
    // Set when a warp-wide operation (a full-mask shuffle, __syncwarp, mma.sync) ran after
    // some lanes of its warp had exited: on a GPU it reads lanes that are gone (undefined),
    // or hangs.
    bool partial_warp = false;
    // The source line of the __syncthreads the running block's threads are meeting at (-1
    // before the first arrives), and whether two threads met at different ones: CUDA
    // requires every thread of a block to reach the same __syncthreads (in code the whole
    // block takes).
    int barrier_line = -1;
    bool mixed_barriers = false;
    const std::function<void()>* kernel_body = nullptr;
    std::vector<std::unique_ptr<unsigned char, StackFree>> stacks;  // reused launch to launch
#if defined(__x86_64__)
    void* scheduler_sp = nullptr;
#else
    ucontext_t scheduler_ctx;
#endif
    // A kernel's dynamic shared memory (`extern __shared__`): one buffer as large as a block
    // may ask for without opting in (48 KiB), shared by the running block's threads. Filled
    // with NaN bits before each block, as a GPU's is not left over from the previous block: a
    // kernel that reads what it did not stage reads NaNs, not the last block's values.
    alignas(16) unsigned char dynamic_buffer[48 * 1024];
};

// The running fiber's Worker, whose address each fiber stack holds at its base: found from
// the stack pointer in two instructions. (A thread-local variable would do, but in this
// library, loaded with dlopen, nearly every read of one calls __tls_get_addr: that was a
// fifth of the emulator's time. The initial-exec model cannot take the library's shared
// memory arrays.) Only for code that runs on a fiber: the kernels and what they call.
inline Worker& me() {
    uintptr_t base = (uintptr_t)__builtin_frame_address(0) & ~(uintptr_t)(STACK_BYTES - 1);
    return **(Worker**)base;
}

// Leaves fiber `from` for fiber `to` (which runs from where it last left, or from its start).
inline void switch_fiber(Fiber& from, Fiber& to) {
#if defined(__x86_64__)
    fallow_emu_switch(&from.sp, to.sp);
#else
    swapcontext(&from.ctx, &to.ctx);
#endif
}

inline void to_scheduler(Worker& w) {
#if defined(__x86_64__)
    fallow_emu_switch(&w.fibers[w.linear].sp, w.scheduler_sp);
#else
    swapcontext(&w.fibers[w.linear].ctx, &w.scheduler_ctx);
#endif
}

// The thread after `t` in the block's running order (cyclic), whether or not it has returned.
inline unsigned after(const Worker& w, unsigned t) {
    if (w.reverse_order) return t == 0 ? w.block_threads - 1 : t - 1;
    return t + 1 == w.block_threads ? 0 : t + 1;
}

// Runs the next thread that has not returned, in the block's order: what a scheduler looping
// over the threads would resume next, without the detour through it. Back to the scheduler
// once every thread has returned.
inline void yield(Worker& w) {
    unsigned from = w.linear, t = after(w, from);
    while (w.fibers[t].done && t != from) t = after(w, t);
    if (t == from) {
        if (w.fibers[from].done) to_scheduler(w);
        return;  // the only thread left: its barrier is complete
    }
    w.linear = t;
    w.thread_idx = w.fibers[t].tid;
    switch_fiber(w.fibers[from], w.fibers[t]);
}

inline void wait(Worker& w, Barrier& b) {
    unsigned gen = b.generation;
    b.arrive();
    while (b.generation == gen) yield(w);
}

// A fiber's life: the kernel for the current block, then out of the barriers.
inline void fiber_main() {
    Worker& w = me();
    (*w.kernel_body)();
    w.block_barrier.drop();
    w.warp_barriers[w.linear / 32].drop();
    w.fibers[w.linear].done = true;
    w.live--;
    for (;;) yield(w);
}

#if defined(__x86_64__)
inline void start(Fiber& f) {
    uintptr_t top = (uintptr_t)(f.stack + STACK_BYTES) & ~(uintptr_t)15;
    auto* sp = (uint64_t*)(top - 72);
    sp[0] = 0x1F80 | ((uint64_t)0x037F << 32);  // default MXCSR, x87 control word
    for (int i = 1; i <= 6; i++) sp[i] = 0;      // r15 r14 r13 r12 rbx rbp
    sp[7] = (uint64_t)(void (*)()) & fiber_main;  // "returned" to by the first switch
    sp[8] = 0;
    f.sp = sp;
}
inline void resume(Worker& w, Fiber& f) { fallow_emu_switch(&w.scheduler_sp, f.sp); }
#else
inline void start(Fiber& f) {
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack;
    f.ctx.uc_stack.ss_size = STACK_BYTES;
    f.ctx.uc_link = nullptr;
    makecontext(&f.ctx, fiber_main, 0);
}
inline void resume(Worker& w, Fiber& f) { swapcontext(&w.scheduler_ctx, &f.ctx); }
#endif

// Every lane of this thread's warp is still running (the warp-wide operations' contract).
inline void whole_warp(Worker& w) {
    unsigned warp = w.linear / 32, threads = w.block_threads;
    unsigned width = threads - warp * 32 < 32 ? threads - warp * 32 : 32;
    if (w.warp_barriers[warp].expected != width) w.partial_warp = true;
}

inline void syncthreads(int line) {
    Worker& w = me();
    if (w.block_barrier.arrived == 0) {
        w.barrier_line = line;
    } else if (w.barrier_line != line) {
        w.mixed_barriers = true;
    }
    wait(w, w.block_barrier);
}
inline void syncwarp() {
    Worker& w = me();
    whole_warp(w);
    wait(w, w.warp_barriers[w.linear / 32]);
}

// Value of lane `src(lane)` of this thread's warp.
template <class T, class Src>
T exchange(T v, Src src) {
    static_assert(sizeof(T) <= 8, "shuffle of a wide type");
    Worker& w = me();
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    unsigned warp = w.linear / 32, lane = w.linear % 32, threads = w.block_threads;
    whole_warp(w);
    // One barrier: every lane writes, then reads once all have written. The halves alternate
    // with the warp barrier's generation (the same for every lane on entry), so a lane that
    // runs ahead writes its next operand into the other half; it can come back to this half
    // only after another warp barrier, which every lane reaches after its read.
    uint64_t* half = &w.lanes[(w.warp_barriers[warp].generation & 1) * threads];
    half[w.linear] = bits;
    wait(w, w.warp_barriers[warp]);
    unsigned from = src(lane);
    uint64_t got = from < 32 && warp * 32 + from < threads ? half[warp * 32 + from] : bits;
    T r;
    std::memcpy(&r, &got, sizeof(T));
    return r;
}

inline float bf16_half(uint32_t word, unsigned high) {
    uint32_t bits = (high ? word >> 16 : word & 0xffffu) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

// One warp's mma: every lane's fragments (A's 4 registers, B's 2) published, decoded once into
// the warp's `matrices`, then each of this lane's 4 results D[row][col] = its C plus
// A[row][k]·B[k][col] added in k order, written back once every lane has read. Both shapes
// lay out their fragments alike (PTX ISA, "Matrix Fragments for mma"), with E = K / 8
// elements per register (`element(word, i)`, the i-th, lowest bits first): A[r][k] is in lane
// 4·(r % 8) + (k % 4E) / E, register (r >= 8) + 2·(k >= 4E); B[k][n] in lane 4·n + (k % 4E) / E,
// register k >= 4E (after A's four); this lane's d[i] is D[g + 8·(i >= 2)][2q + i % 2] (lane
// 4g + q). The hardware's summation order is its own.
template <class T, int K, class Element>
void warp_mma(T d[4], const unsigned a[4], const unsigned b[2],
              std::vector<MmaMatrices<T, K>> Worker::*matrices, Element element) {
    constexpr unsigned E = K / 8;
    Worker& w = me();
    unsigned warp = w.linear / 32, lane = w.linear % 32;
    whole_warp(w);
    uint32_t* mine = &w.mma_operands[w.linear * 6];
    for (int i = 0; i < 4; i++) mine[i] = a[i];
    mine[4] = b[0];
    mine[5] = b[1];
    Barrier& barrier = w.warp_barriers[warp];
    wait(w, barrier);
    MmaMatrices<T, K>& m = (w.*matrices)[warp];
    if (m.decoded_at != barrier.generation) {
        const uint32_t* all = &w.mma_operands[warp * 32 * 6];
        for (unsigned r = 0; r < 16; r++)
            for (unsigned k = 0; k < K; k++)
                m.a[r][k] = element(all[(4 * (r % 8) + (k % (4 * E)) / E) * 6 + (r >= 8) + 2 * (k >= 4 * E)], k % E);
        for (unsigned k = 0; k < K; k++)
            for (unsigned c = 0; c < 8; c++)
                m.b[k][c] = element(all[(4 * c + (k % (4 * E)) / E) * 6 + 4 + (k >= 4 * E)], k % E);
        m.decoded_at = barrier.generation;
    }
    T out[4];
    for (int i = 0; i < 4; i++) {
        unsigned row = lane / 4 + (i >= 2 ? 8 : 0), col = 2 * (lane % 4) + (i % 2);
        T sum = d[i];
        for (int k = 0; k < K; k++) sum += m.a[row][k] * m.b[k][col];  // exact products
        out[i] = sum;
    }
    wait(w, barrier);
    for (int i = 0; i < 4; i++) d[i] = out[i];
}

// One warp's m16n8k16 product of bf16 pairs, D += A·B in f32 (see mma_bf16_16816 in
// prefill_mma.cu).
inline void mma_bf16_16816(float d[4], const unsigned a[4], const unsigned b[2]) {
    warp_mma(d, a, b, &Worker::mma_bf16, bf16_half);
}

// One warp's m16n8k32 product of signed bytes, D += A·B in s32 (see mma_s8_16832 in mmq.cu).
inline void mma_s8_16832(int d[4], const unsigned a[4], const unsigned b[2]) {
    warp_mma(d, a, b, &Worker::mma_s8, [](uint32_t word, unsigned i) { return (int)(signed char)(word >> (8 * i)); });
}

// A launch's blocks, handed out one at a time to the OS threads that run them. Every other
// launch hands them out last to first, so that a kernel whose result depends on its blocks'
// order (not on a last-block counter) fails one way or the other.
struct Launch {
    dim3 grid, block;
    const std::function<void()>* body;
    size_t blocks;
    bool backwards;
    std::atomic<size_t> next{0};
    std::atomic<int> failure{0};  // the first failed block's code (see `run_block`)
};

// Runs block `b` of the launch `w` is set up for (`run_blocks`): 0, or 2 when a thread did
// not call grid_dependency_sync (it could race an early-started launch), 3 when a warp-wide
// operation ran without its whole warp, 4 when threads met at different __syncthreads.
inline int run_block(Worker& w, size_t b) {
    unsigned threads = w.block_threads, warps = (threads + 31) / 32;
    unsigned x = (unsigned)(b % w.grid_dim.x), y = (unsigned)(b / w.grid_dim.x % w.grid_dim.y);
    unsigned z = (unsigned)(b / ((size_t)w.grid_dim.x * w.grid_dim.y));
    w.block_idx = {x, y, z};
    w.block_barrier = Barrier{threads};
    for (unsigned i = 0; i < warps; i++) {
        w.warp_barriers[i] = Barrier{threads - i * 32 < 32 ? threads - i * 32 : 32};
        // (The barriers' generations start again from 0: so must the decoded operands'.)
        w.mma_bf16[i].decoded_at = w.mma_s8[i].decoded_at = 0;
    }
    for (Fiber& f : w.fibers) {
        f.done = false;
        start(f);
    }
    std::fill(w.synced.begin(), w.synced.end(), 0);
    w.partial_warp = false;
    w.mixed_barriers = false;
    w.barrier_line = -1;
    std::memset(w.dynamic_buffer, 0xff, sizeof w.dynamic_buffer);
    w.live = threads;
    // Between two barriers the fibers run one after another, so a read of shared
    // memory another thread writes without a barrier between sees the write only
    // when the writer ran first: every other block runs its threads in reverse
    // order, so that such a race shows as a wrong result in one order or the other.
    // The threads pass control to one another (`yield`); the last to return comes back.
    w.reverse_order = (x + y + z) % 2 == 1;
    w.linear = w.reverse_order ? threads - 1 : 0;
    w.thread_idx = w.fibers[w.linear].tid;
    resume(w, w.fibers[w.linear]);
    for (uint8_t s : w.synced)
        if (!s) return 2;
    if (w.partial_warp) return 3;
    if (w.mixed_barriers) return 4;
    return 0;
}

// This OS thread's Worker (made at its first launch, kept for the next).
inline Worker& worker() {
    static thread_local std::unique_ptr<Worker> w(new Worker());
    return *w;
}

// Runs blocks of `launch` on this OS thread until none is left or one has failed.
inline void run_blocks(Launch& launch) {
    Worker& w = worker();
    dim3 block = launch.block;
    unsigned threads = block.x * block.y * block.z, warps = (threads + 31) / 32;
    while (w.stacks.size() < threads) {
        auto* stack = (unsigned char*)std::aligned_alloc(STACK_BYTES, STACK_BYTES);
        if (!stack) std::abort();
        *(Worker**)stack = &w;  // what `me` reads (the stack grows down from its other end)
        w.stacks.emplace_back(stack);
    }
    w.fibers.assign(threads, Fiber{});
    for (unsigned t = 0; t < threads; t++) {
        w.fibers[t].stack = w.stacks[t].get();
        w.fibers[t].tid = {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
    }
    w.warp_barriers.assign(warps, Barrier{});
    w.lanes.assign(2 * (size_t)threads, 0);
    w.mma_operands.assign(threads * 6, 0);
    w.mma_bf16.resize(warps);
    w.mma_s8.resize(warps);
    w.synced.assign(threads, 0);
    w.kernel_body = launch.body;
    w.block_threads = threads;
    w.block_dim = block;
    w.grid_dim = launch.grid;
    while (launch.failure.load(std::memory_order_relaxed) == 0) {
        size_t k = launch.next.fetch_add(1);
        if (k >= launch.blocks) break;
        int rc = run_block(w, launch.backwards ? launch.blocks - 1 - k : k);
        if (rc != 0) {
            int none = 0;
            launch.failure.compare_exchange_strong(none, rc);
        }
    }
}

// The OS threads that run a launch's blocks beside the launching one, started as a launch
// first needs them and kept, waiting, for the next (never stopped: the process ends them).
class Helpers {
  public:
    // Runs `run_blocks(*launch)` on `count` helpers; `wait` returns once they are done.
    void start(Launch* launch, unsigned count) {
        std::lock_guard<std::mutex> g(m_);
        while (started_ < count) {
            std::thread([this, index = started_] { serve(index); }).detach();
            started_++;
        }
        launch_ = launch;
        wanted_ = count;
        finished_ = 0;
        epoch_++;
        wake_.notify_all();
    }
    void wait() {
        std::unique_lock<std::mutex> g(m_);
        done_.wait(g, [this] { return finished_ == wanted_; });
    }

  private:
    void serve(unsigned index) {
        unsigned seen = 0;
        for (;;) {
            Launch* launch;
            {
                std::unique_lock<std::mutex> g(m_);
                wake_.wait(g, [&] { return epoch_ != seen && index < wanted_; });
                seen = epoch_;
                launch = launch_;
            }
            run_blocks(*launch);
            std::lock_guard<std::mutex> g(m_);
            if (++finished_ == wanted_) done_.notify_all();
        }
    }
    std::mutex m_;
    std::condition_variable wake_, done_;
    Launch* launch_ = nullptr;
    unsigned started_ = 0, wanted_ = 0, finished_ = 0, epoch_ = 0;
};

// How many OS threads run a launch's blocks: FALLOW_EMU_THREADS, else the machine's cores
// (at most 8). 1 runs every block on the launching thread, one after another.
inline unsigned block_runners() {
    static const unsigned n = [] {
        const char* set = std::getenv("FALLOW_EMU_THREADS");
        long v = set ? std::strtol(set, nullptr, 10) : 0;
        if (v <= 0) v = (long)std::thread::hardware_concurrency();
        return (unsigned)(v < 1 ? 1 : v > 8 ? 8 : v);
    }();
    return n;
}

// Threads a launch needs in all (blocks × their threads) before its blocks are shared out:
// below it, waking the helpers costs more than they save.
constexpr size_t SHARED_LAUNCH_THREADS = 1024;

// Runs a launch: its blocks on up to block_runners() OS threads (each running one block at
// a time, its threads as fibers), one launch at a time. Returns 0, 1 for a block of no or
// over 1024 threads, or a failed block's code (`run_block`).
inline int run(dim3 grid, dim3 block, std::function<void()> body) {
    static std::mutex one_launch;
    std::lock_guard<std::mutex> guard(one_launch);
    unsigned threads = block.x * block.y * block.z;
    if (threads == 0 || threads > 1024) return 1;
    static unsigned launches = 0;
    Launch launch;
    launch.grid = grid;
    launch.block = block;
    launch.body = &body;
    launch.blocks = (size_t)grid.x * grid.y * grid.z;
    launch.backwards = launches++ % 2 == 1;
    size_t helpers = 0;
    if (launch.blocks > 1 && launch.blocks * threads >= SHARED_LAUNCH_THREADS)
        helpers = std::min<size_t>(block_runners() - 1, launch.blocks - 1);
    static Helpers* pool = new Helpers();  // never destroyed: its threads never return
    if (helpers > 0) pool->start(&launch, (unsigned)helpers);
    run_blocks(launch);
    if (helpers > 0) pool->wait();
    return launch.failure.load();
}

// Calls `k` with the arguments `args` points to, as cuLaunchKernel's kernelParams do.
template <class... A, std::size_t... I>
void call(void (*k)(A...), void** args, std::index_sequence<I...>) {
    k(*static_cast<std::decay_t<A>*>(args[I])...);
}

template <class... A>
int launch(void (*k)(A...), const unsigned* grid, const unsigned* block, void** args) {
    return run(dim3{grid[0], grid[1], grid[2]}, dim3{block[0], block[1], block[2]},
               [k, args] { call(k, args, std::index_sequence_for<A...>{}); });
}

// The byte size of each of a kernel's parameters (up to `cap` of them); returns how many it
// has. The Rust side checks every launch's argument list against it.
template <class... A>
int parameter_sizes(void (*)(A...), unsigned* out, int cap) {
    const unsigned sizes[] = {(unsigned)sizeof(std::decay_t<A>)..., 0u};
    int n = (int)sizeof...(A);
    for (int i = 0; i < n && i < cap; i++) out[i] = sizes[i];
    return n;
}

}  // namespace emu

#define FALLOW_EMU_EXPORT(name)                                                       \
    extern "C" int fallow_emu_##name(const unsigned* grid, const unsigned* block,   \
                                     void** args) {                                 \
        return emu::launch(&name, grid, block, args);                              \
    }                                                                               \
    extern "C" int fallow_emu_params_##name(unsigned* sizes, int cap) {             \
        return emu::parameter_sizes(&name, sizes, cap);                            \
    }

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
// Each OS thread running blocks has its own (see emu::Worker).
#define __shared__ static thread_local
#define threadIdx emu::me().thread_idx
#define blockIdx emu::me().block_idx
#define blockDim emu::me().block_dim
#define gridDim emu::me().grid_dim
#define warpSize 32

namespace emu {
inline void* dynamic_shared() { return me().dynamic_buffer; }
}  // namespace emu

#define __syncthreads() emu::syncthreads(__LINE__)
// Blocks run on several OS threads: a block's writes before the fence are seen by any
// block that sees its writes after it (the last-block counters' contract).
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
// Launches run one after another here: only whether every thread calls it is checked.
inline void grid_dependency_sync() {
    emu::Worker& w = emu::me();
    w.synced[w.linear] = 1;
}
// A GPU's bulk prefetch wants a 16-byte-aligned start and size, within memory: a misaligned
// one traps here (the alignment check's illegal instruction), and every page of the range is
// read, so that one past the buffers meets their guard page.
inline void l2_prefetch(const void* p, unsigned int bytes) {
    if ((uintptr_t)p % 16 != 0 || bytes % 16 != 0) __builtin_trap();
    const volatile unsigned char* b = (const volatile unsigned char*)p;
    for (unsigned int i = 0; i < bytes; i += 4096) (void)b[i];
    if (bytes > 0) (void)b[bytes - 1];
}
inline void __syncwarp(unsigned = 0xffffffffu) { emu::syncwarp(); }
inline void mma_bf16_16816(float d[4], const unsigned a[4], const unsigned b[2]) {
    emu::mma_bf16_16816(d, a, b);
}
inline void mma_s8_16832(int d[4], const unsigned a[4], const unsigned b[2]) {
    emu::mma_s8_16832(d, a, b);
}

template <class T>
T __shfl_xor_sync(unsigned, T v, int mask) {
    return emu::exchange(v, [mask](unsigned lane) { return lane ^ (unsigned)mask; });
}
template <class T>
T __shfl_sync(unsigned, T v, int src) {
    return emu::exchange(v, [src](unsigned) { return (unsigned)src & 31u; });
}
template <class T>
T __shfl_down_sync(unsigned, T v, unsigned delta) {
    return emu::exchange(v, [delta](unsigned lane) { return lane + delta < 32 ? lane + delta : lane; });
}

template <class T>
T __shfl_up_sync(unsigned, T v, unsigned delta) {
    return emu::exchange(v, [delta](unsigned lane) { return lane >= delta ? lane - delta : lane; });
}

inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }

template <class T>
T __ldg(const T* p) {
    return *p;
}

namespace emu {
template <class To, class From>
To bits_as(From v) {
    static_assert(sizeof(To) == sizeof(From), "same width");
    To r;
    std::memcpy(&r, &v, sizeof(To));
    return r;
}
}  // namespace emu
inline float __int_as_float(int i) { return emu::bits_as<float>(i); }
inline float __uint_as_float(unsigned i) { return emu::bits_as<float>(i); }
inline unsigned __float_as_uint(float f) { return emu::bits_as<unsigned>(f); }
inline int __float_as_int(float f) { return emu::bits_as<int>(f); }
// Byte n of the result is byte (s >> 4n) & 7 of the 8 bytes of (y:x), x's least significant
// first (selector values 0..7 only: the kernels never ask for prmt's sign replication).
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    unsigned long long both = (unsigned long long)y << 32 | x;
    unsigned r = 0;
    for (int n = 0; n < 4; n++) r |= (unsigned)(both >> (8 * ((s >> (4 * n)) & 7)) & 0xff) << (8 * n);
    return r;
}
// The four signed bytes of a times those of b, summed with c (sm_61+: one instruction).
inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; i++)
        c += (int)(signed char)(a >> (8 * i)) * (int)(signed char)(b >> (8 * i));
    return c;
}
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
// Rounded arithmetic the compiler may not contract into an FMA (on the GPU; the emulator's
// build contracts nothing), and the explicit FMA.
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }

inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }

inline float atomicAdd(float* p, float v) { return std::atomic_ref<float>(*p).fetch_add(v); }
inline int atomicAdd(int* p, int v) { return std::atomic_ref<int>(*p).fetch_add(v); }
inline int atomicMax(int* p, int v) {
    std::atomic_ref<int> a(*p);
    int old = a.load();
    while (v > old && !a.compare_exchange_weak(old, v)) {
    }
    return old;
}
inline unsigned atomicAdd(unsigned* p, unsigned v) {
    return std::atomic_ref<unsigned>(*p).fetch_add(v);
}
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
    return std::atomic_ref<unsigned long long>(*p).fetch_add(v);
}
