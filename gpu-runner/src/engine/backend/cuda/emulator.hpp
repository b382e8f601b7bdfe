// Runs Fallow's CUDA kernels (the .cu sources, unchanged) on the CPU, so that their arithmetic
// is tested on machines without a GPU; see emulator.rs. Only what the kernels use is provided.
//
// Model: one block at a time; each of its threads is a fiber (its own stack, switched by
// hand on x86-64, by ucontext elsewhere) on the calling OS thread, so `__shared__` can be a
// function-static variable (shared by the block's threads, reused by the next block).
// `__syncthreads` is a barrier over the block's fibers and a warp shuffle exchanges values
// through a per-warp slot array behind one warp barrier; a fiber waiting at a barrier
// switches straight to the next one, round robin. A thread that returns from the kernel
// leaves both barriers, as an exited GPU thread stops counting at `__syncthreads`. Device
// pointers are host pointers. Launches are serialised (the state is global). Fibers rather
// than OS threads: a warp shuffle is a barrier, and a fiber switch costs nanoseconds.

#define FALLOW_EMULATOR 1

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
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
    unsigned char* stack = nullptr;  // STACK_BYTES, left uninitialised (from `stacks`)
    uint3 tid{};
    bool done = false;
#if defined(__x86_64__)
    void* sp = nullptr;
#else
    ucontext_t ctx{};
#endif
};

inline uint3 thread_idx{}, block_idx{};
inline dim3 block_dim{}, grid_dim{};
inline unsigned linear = 0;
inline std::vector<Fiber>* fibers = nullptr;
inline Barrier block_barrier;
inline std::vector<Barrier> warp_barriers;
// Each thread's shuffle operand, in two halves that alternate from one warp-wide exchange
// to the next (see `exchange`).
inline std::vector<uint64_t> lanes;
// Threads of the running block, how many have not returned yet, and whether they run in
// reverse order (see `run`).
inline unsigned block_threads = 0, live = 0;
inline bool reverse_order = false;
// Each thread's mma operands (A's 4 registers, then B's 2), for warp_mma.
inline std::vector<uint32_t> mma_operands;
// Which threads of the running block have called grid_dependency_sync (see kernels.cu).
inline std::vector<uint8_t> synced;
// Set when a warp-wide operation (a full-mask shuffle, __syncwarp, mma.sync) ran after some
// lanes of its warp had exited: on a GPU it reads lanes that are gone (undefined), or hangs.
inline bool partial_warp = false;
// The source line of the __syncthreads the running block's threads are meeting at (-1 before
// the first arrives), and whether two threads met at different ones: CUDA requires every
// thread of a block to reach the same __syncthreads (in code the whole block takes).
inline int barrier_line = -1;
inline bool mixed_barriers = false;
// A kernel's dynamic shared memory (`extern __shared__`): one buffer as large as a block may
// ask for without opting in (48 KiB), shared by the running block's threads. Filled with NaN
// bits before each block, as a GPU's is not left over from the previous block: a kernel
// that reads what it did not stage reads NaNs, not the last block's values.
alignas(16) inline unsigned char dynamic_buffer[48 * 1024];
inline std::function<void()> kernel_body;
#if defined(__x86_64__)
inline void* scheduler_sp = nullptr;
#else
inline ucontext_t scheduler_ctx;
#endif

// Leaves fiber `from` for fiber `to` (which runs from where it last left, or from its start).
inline void switch_fiber(Fiber& from, Fiber& to) {
#if defined(__x86_64__)
    fallow_emu_switch(&from.sp, to.sp);
#else
    swapcontext(&from.ctx, &to.ctx);
#endif
}

inline void to_scheduler() {
#if defined(__x86_64__)
    fallow_emu_switch(&(*fibers)[linear].sp, scheduler_sp);
#else
    swapcontext(&(*fibers)[linear].ctx, &scheduler_ctx);
#endif
}

// The thread after `t` in the block's running order (cyclic), whether or not it has returned.
inline unsigned after(unsigned t) {
    if (reverse_order) return t == 0 ? block_threads - 1 : t - 1;
    return t + 1 == block_threads ? 0 : t + 1;
}

// Runs the next thread that has not returned, in the block's order: what a scheduler looping
// over the threads would resume next, without the detour through it. Back to the scheduler
// once every thread has returned.
inline void yield() {
    unsigned from = linear, t = after(from);
    while ((*fibers)[t].done && t != from) t = after(t);
    if (t == from) {
        if ((*fibers)[from].done) to_scheduler();
        return;  // the only thread left: its barrier is complete
    }
    linear = t;
    thread_idx = (*fibers)[t].tid;
    switch_fiber((*fibers)[from], (*fibers)[t]);
}

inline void wait(Barrier& b) {
    unsigned gen = b.generation;
    b.arrive();
    while (b.generation == gen) yield();
}

// A fiber's life: the kernel for the current block, then out of the barriers.
inline void fiber_main() {
    kernel_body();
    block_barrier.drop();
    warp_barriers[linear / 32].drop();
    (*fibers)[linear].done = true;
    live--;
    for (;;) yield();
}

// Fiber stacks, reused from launch to launch.
inline std::vector<std::unique_ptr<unsigned char[]>> stacks;

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
inline void resume(Fiber& f) { fallow_emu_switch(&scheduler_sp, f.sp); }
#else
inline void start(Fiber& f) {
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack;
    f.ctx.uc_stack.ss_size = STACK_BYTES;
    f.ctx.uc_link = nullptr;
    makecontext(&f.ctx, fiber_main, 0);
}
inline void resume(Fiber& f) { swapcontext(&scheduler_ctx, &f.ctx); }
#endif

// Every lane of this thread's warp is still running (the warp-wide operations' contract).
inline void whole_warp() {
    unsigned warp = linear / 32, threads = block_threads;
    unsigned width = threads - warp * 32 < 32 ? threads - warp * 32 : 32;
    if (warp_barriers[warp].expected != width) partial_warp = true;
}

inline void syncthreads(int line) {
    if (block_barrier.arrived == 0) {
        barrier_line = line;
    } else if (barrier_line != line) {
        mixed_barriers = true;
    }
    wait(block_barrier);
}
inline void syncwarp() {
    whole_warp();
    wait(warp_barriers[linear / 32]);
}

// Value of lane `src(lane)` of this thread's warp.
template <class T, class Src>
T exchange(T v, Src src) {
    static_assert(sizeof(T) <= 8, "shuffle of a wide type");
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    unsigned warp = linear / 32, lane = linear % 32;
    whole_warp();
    // One barrier: every lane writes, then reads once all have written. The halves alternate
    // with the warp barrier's generation (the same for every lane on entry), so a lane that
    // runs ahead writes its next operand into the other half; it can come back to this half
    // only after another warp barrier, which every lane reaches after its read.
    uint64_t* half = &lanes[(warp_barriers[warp].generation & 1) * block_threads];
    half[linear] = bits;
    wait(warp_barriers[warp]);
    unsigned from = src(lane);
    uint64_t got = from < 32 && warp * 32 + from < block_threads ? half[warp * 32 + from] : bits;
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

// One warp's mma: every lane's fragments (A's 4 registers, B's 2) published, then each of this
// lane's 4 results D[row][col] = product(all, row, col, C[row][col]) from all of them (`all`:
// 6 words per lane), written back once every lane has read.
template <class T, class Product>
void warp_mma(T d[4], const unsigned a[4], const unsigned b[2], Product product) {
    unsigned warp = linear / 32, lane = linear % 32;
    whole_warp();
    uint32_t* mine = &mma_operands[linear * 6];
    for (int i = 0; i < 4; i++) mine[i] = a[i];
    mine[4] = b[0];
    mine[5] = b[1];
    wait(warp_barriers[warp]);
    const uint32_t* all = &mma_operands[warp * 32 * 6];
    T out[4];
    for (int i = 0; i < 4; i++)
        out[i] = product(all, lane / 4 + (i >= 2 ? 8 : 0), 2 * (lane % 4) + (i % 2), d[i]);
    wait(warp_barriers[warp]);
    for (int i = 0; i < 4; i++) d[i] = out[i];
}

// One warp's m16n8k16 product, D += A·B, from every lane's fragments as the PTX ISA lays
// them out (see mma_bf16_16816 in prefill_mma.cu): A[r][c] is in lane 4·(r % 8) + (c % 8) / 2,
// register (r >= 8) + 2·(c >= 8), half c % 2; B[k][n] in lane 4·n + (k % 8) / 2, register
// k >= 8, half k % 2; this lane's d[i] is D[g + 8·(i >= 2)][2q + i % 2] (lane 4g + q).
inline void mma_bf16_16816(float d[4], const unsigned a[4], const unsigned b[2]) {
    warp_mma(d, a, b, [](const uint32_t* all, unsigned row, unsigned col, float sum) {
        for (unsigned k = 0; k < 16; k++) {
            float x = bf16_half(all[(4 * (row % 8) + (k % 8) / 2) * 6 + (row >= 8) + 2 * (k >= 8)],
                                k % 2);
            float y = bf16_half(all[(4 * col + (k % 8) / 2) * 6 + 4 + (k >= 8)], k % 2);
            sum += x * y;  // exact product; the hardware's summation order is its own
        }
        return sum;
    });
}

// One warp's m16n8k32 product of signed bytes, D += A·B in s32 (see mma_s8_16832 in
// mmq.cu): A[r][c] is in lane 4·(r % 8) + (c % 16) / 4, register (r >= 8) + 2·(c >= 16), byte
// c % 4; B[k][n] in lane 4·n + (k % 16) / 4, register k >= 16, byte k % 4; d as above.
inline void mma_s8_16832(int d[4], const unsigned a[4], const unsigned b[2]) {
    auto byte = [](uint32_t word, unsigned i) { return (int)(signed char)(word >> (8 * i)); };
    warp_mma(d, a, b, [&](const uint32_t* all, unsigned row, unsigned col, int sum) {
        for (unsigned k = 0; k < 32; k++) {
            int x = byte(all[(4 * (row % 8) + (k % 16) / 4) * 6 + (row >= 8) + 2 * (k >= 16)], k % 4);
            int y = byte(all[(4 * col + (k % 16) / 4) * 6 + 4 + (k >= 16)], k % 4);
            sum += x * y;
        }
        return sum;
    });
}

inline int run(dim3 grid, dim3 block, std::function<void()> body) {
    static std::mutex one_launch;
    std::lock_guard<std::mutex> guard(one_launch);
    unsigned threads = block.x * block.y * block.z;
    if (threads == 0 || threads > 1024) return 1;
    std::vector<Fiber> pool(threads);
    while (stacks.size() < threads) stacks.emplace_back(new unsigned char[STACK_BYTES]);
    for (unsigned t = 0; t < threads; t++) {
        pool[t].stack = stacks[t].get();
        pool[t].tid = {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
    }
    fibers = &pool;
    kernel_body = std::move(body);
    lanes.assign(2 * (size_t)threads, 0);
    block_threads = threads;
    mma_operands.assign(threads * 6, 0);
    block_dim = block;
    grid_dim = grid;
    // Blocks run one after another; every other launch runs them last to first, so that a
    // kernel whose result depends on its blocks' order (not on a last-block counter) fails
    // one way or the other.
    static unsigned launches = 0;
    bool backwards = launches++ % 2 == 1;
    size_t blocks = (size_t)grid.x * grid.y * grid.z;
    for (size_t k = 0; k < blocks; k++) {
        size_t b = backwards ? blocks - 1 - k : k;
        unsigned x = (unsigned)(b % grid.x), y = (unsigned)(b / grid.x % grid.y);
        unsigned z = (unsigned)(b / ((size_t)grid.x * grid.y));
        block_idx = {x, y, z};
        block_barrier = Barrier{threads};
        warp_barriers.clear();
        for (unsigned w = 0; w * 32 < threads; w++)
            warp_barriers.push_back(Barrier{threads - w * 32 < 32 ? threads - w * 32 : 32});
        for (auto& f : pool) {
            f.done = false;
            start(f);
        }
        synced.assign(threads, 0);
        partial_warp = false;
        mixed_barriers = false;
        barrier_line = -1;
        std::memset(dynamic_buffer, 0xff, sizeof dynamic_buffer);
        live = threads;
        // Between two barriers the fibers run one after another, so a read of shared
        // memory another thread writes without a barrier between sees the write only
        // when the writer ran first: every other block runs its threads in reverse
        // order, so that such a race shows as a wrong result in one order or the other.
        // The threads pass control to one another (`yield`); the last to return comes back.
        reverse_order = (x + y + z) % 2 == 1;
        linear = reverse_order ? threads - 1 : 0;
        thread_idx = pool[linear].tid;
        resume(pool[linear]);
        for (uint8_t s : synced)
            if (!s) {
                fibers = nullptr;
                return 2;  // a thread that could race an early-started launch
            }
        if (partial_warp) {
            fibers = nullptr;
            return 3;
        }
        if (mixed_barriers) {
            fibers = nullptr;
            return 4;
        }
    }
    fibers = nullptr;
    return 0;
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
#define __shared__ static
#define threadIdx emu::thread_idx
#define blockIdx emu::block_idx
#define blockDim emu::block_dim
#define gridDim emu::grid_dim
#define warpSize 32

namespace emu {
inline void* dynamic_shared() { return dynamic_buffer; }
}  // namespace emu

#define __syncthreads() emu::syncthreads(__LINE__)
// One block at a time, one OS thread: every write is already visible to the next block.
inline void __threadfence() {}
// Launches run one after another here: only whether every thread calls it is checked.
inline void grid_dependency_sync() { emu::synced[emu::linear] = 1; }
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
    int old = *p;
    if (v > old) *p = v;
    return old;  // fibers never run at once: no other thread can interleave
}
inline unsigned atomicAdd(unsigned* p, unsigned v) {
    return std::atomic_ref<unsigned>(*p).fetch_add(v);
}
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
    return std::atomic_ref<unsigned long long>(*p).fetch_add(v);
}
