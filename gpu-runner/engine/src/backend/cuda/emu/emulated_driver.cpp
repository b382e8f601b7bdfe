// A CUDA driver (and the one cuBLAS call the backend makes) for machines without a GPU: the
// part of the driver API the backend and cudarc call, over the emulated kernels (emulator.hpp),
// so that the whole CUDA backend — its launches, buffers, graphs, cuBLAS products — runs on
// the CPU in tests (see emulator.rs, `install_driver`). Compiled after the kernels and their
// FALLOW_EMU_EXPORTs; each kernel is registered by name at the end (FALLOW_EMU_REGISTER).
//
// The model: one device ("sm_90", early starts on), device memory is host memory, and every
// stream runs what is queued on it at once, in order, on the calling thread — except while a
// stream is captured, when launches, copies, memsets and GEMMs are recorded into the graph
// and run on each `cuGraphLaunch`. A launch copies its arguments as the driver does (a graph
// keeps the values of capture time). What the real driver refuses, this refuses with the
// same error: arguments of the wrong count, a block over 1024 threads or over 48 KiB of
// dynamic shared memory, a copy or memset outside every allocation, a synchronous call
// (allocation, blocking copy, synchronise) on a stream being captured, a kernel the module's
// PTX does not define. Every allocation ends against an inaccessible page, so a kernel that
// reads or writes past a buffer's end (or a vector at a misaligned address) crashes
// with the kernel's name. Also checked, as in the emulator's unit tests: every thread waits
// for the previous launch, warp-wide operations run with the whole warp, a block's threads
// meet at the same barriers. Errors are printed to stderr with the kernel's name, since the
// driver API can only return a code.

#include <array>
#include <chrono>
#include <csignal>
#include <thread>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <unordered_map>
#include <sys/mman.h>
#include <unistd.h>

namespace emu_driver {

enum : int {
    SUCCESS = 0,
    INVALID_VALUE = 1,
    OUT_OF_MEMORY = 2,
    NOT_INITIALIZED = 3,
    INVALID_DEVICE = 101,
    INVALID_IMAGE = 200,
    INVALID_CONTEXT = 201,
    INVALID_HANDLE = 400,
    NOT_FOUND = 500,
    ILLEGAL_ADDRESS = 700,
    LAUNCH_OUT_OF_RESOURCES = 701,
    LAUNCH_FAILED = 719,
    NOT_SUPPORTED = 801,
    STREAM_CAPTURE_UNSUPPORTED = 900,
    STREAM_CAPTURE_INVALIDATED = 901,
    STREAM_CAPTURE_WRONG_THREAD = 908,
};

using Launcher = int (*)(const unsigned*, const unsigned*, void**);
using Params = int (*)(unsigned*, int);

struct Kernel {
    const char* name;
    Launcher launch;
    std::vector<unsigned> sizes;
};

// Kernels by name, filled by FALLOW_EMU_REGISTER at load.
inline std::unordered_map<std::string, Kernel>& registry() {
    static std::unordered_map<std::string, Kernel> kernels;
    return kernels;
}

struct Registration {
    Registration(const char* name, Launcher launch, Params params) {
        unsigned sizes[64];
        int n = params(sizes, 64);
        registry()[name] = Kernel{name, launch, std::vector<unsigned>(sizes, sizes + (n < 64 ? n : 64))};
    }
};

// The device's memory: a quarter of this machine's (at most 64 GiB), so
// that a backend sizing its KV pool from free memory (and zeroing it) fits in the machine.
inline size_t total_bytes() {
    static const size_t total = [] {
        size_t ram = (size_t)sysconf(_SC_PHYS_PAGES) * (size_t)sysconf(_SC_PAGESIZE);
        size_t quarter = ram / 4, cap = size_t(64) << 30;
        return quarter == 0 || quarter > cap ? cap : quarter;
    }();
    return total;
}
constexpr unsigned MULTIPROCESSORS = 132;

struct Allocation {
    void* map;
    size_t map_len;
    size_t bytes;
};

std::mutex lock;  // the driver's tables (kernels run under the emulator's own lock)
std::map<uintptr_t, Allocation> allocations;  // by start address
size_t allocated = 0;
char running[96] = {0};

using Op = std::function<int()>;

struct Graph {
    std::vector<Op> ops;
};

struct Stream {
    Graph* capture = nullptr;  // recording into this graph
    bool invalidated = false;  // a capture broken by a synchronous call
    int mode = 0;              // the capture's CUstreamCaptureMode: global, thread-local, relaxed
    std::thread::id owner;     // the thread that began the capture
};

Stream legacy_stream;
std::vector<Stream*> streams;  // every created stream (the legacy one cannot be captured)

Stream* stream_of(void* s) { return s ? static_cast<Stream*>(s) : &legacy_stream; }

struct Event {
    std::chrono::steady_clock::time_point at{};
};

struct Module {
    std::string ptx;
};

inline void report(const char* what) { std::fprintf(stderr, "emulated CUDA driver: %s\n", what); }


// Whether [p, p + n) lies inside one allocation.
inline bool device_range(uintptr_t p, size_t n) {
    std::lock_guard<std::mutex> g(lock);
    auto it = allocations.upper_bound(p);
    if (it == allocations.begin()) return false;
    --it;
    return p >= it->first && p + n <= it->first + it->second.bytes;
}

// Queues `op` on stream `s`: recorded while the stream is captured, run now otherwise.
inline int enqueue(void* s, Op op) {
    Stream* st = stream_of(s);
    if (st->capture) {
        st->capture->ops.push_back(std::move(op));
        return SUCCESS;
    }
    return op();
}

// A capture that a synchronous call on this thread would break, as on a GPU: any capture in
// global mode, this thread's in thread-local mode, none in relaxed mode.
inline bool forbids(const Stream* s) {
    if (!s->capture) return false;
    return s->mode == 0 || (s->mode == 1 && s->owner == std::this_thread::get_id());
}

inline bool any_capture() {
    std::lock_guard<std::mutex> g(lock);
    for (Stream* s : streams)
        if (forbids(s)) return true;
    return false;
}

inline void break_captures() {
    std::lock_guard<std::mutex> g(lock);
    for (Stream* s : streams)
        if (forbids(s)) s->invalidated = true;
}

// A synchronous call: refused while a capture it would break is in progress (the caller
// then breaks it, as the driver does).
inline int synchronous() {
    if (!any_capture()) return SUCCESS;
    report("a synchronous call (allocation, blocking copy, synchronize) during a stream capture");
    return STREAM_CAPTURE_UNSUPPORTED;
}

std::map<uintptr_t, size_t> pinned;  // page-locked host memory, by start address

// Whether [p, p + n) lies in page-locked host memory (the only host memory a captured copy
// may use: a graph cannot copy from pageable memory).
inline bool pinned_range(const void* ptr, size_t n) {
    std::lock_guard<std::mutex> g(lock);
    uintptr_t p = (uintptr_t)ptr;
    auto it = pinned.upper_bound(p);
    if (it == pinned.begin()) return false;
    --it;
    return p >= it->first && p + n <= it->first + it->second;
}

// A copy between the device and host memory at `host` queued on `s`: refused while the stream
// is captured unless the host memory is page-locked, as the driver does.
inline int host_copy(void* s, const void* host, size_t n, Op op) {
    Stream* st = stream_of(s);
    if (st->capture && !pinned_range(host, n)) {
        report("a copy from or to pageable host memory during a stream capture");
        st->invalidated = true;
        return STREAM_CAPTURE_UNSUPPORTED;
    }
    return enqueue(s, std::move(op));
}

extern "C" void on_fault(int) {
    const char* prefix = running[0] ? "\nemulated CUDA kernel failed (memory outside its buffers, or a vector at a misaligned address): "
                                    : "\nfatal signal outside any emulated CUDA kernel";
    (void)!write(2, prefix, std::strlen(prefix));
    (void)!write(2, running, std::strlen(running));
    (void)!write(2, "\n", 1);
    _exit(139);
}

inline int launch(const Kernel& k, const unsigned grid[3], const unsigned block[3],
                  unsigned shared, void* stream, void** params) {
    unsigned threads = block[0] * block[1] * block[2];
    char why[256];
    if (threads == 0 || threads > 1024 || grid[0] == 0 || grid[1] == 0 || grid[2] == 0) {
        std::snprintf(why, sizeof why, "kernel %s: launch shape (%u,%u,%u) x (%u,%u,%u)", k.name,
                      grid[0], grid[1], grid[2], block[0], block[1], block[2]);
        report(why);
        return INVALID_VALUE;
    }
    if (shared > sizeof(emu::Worker::dynamic_buffer)) {
        std::snprintf(why, sizeof why, "kernel %s: %u bytes of dynamic shared memory", k.name, shared);
        report(why);
        return INVALID_VALUE;
    }
    if (!params && !k.sizes.empty()) return INVALID_VALUE;
    // The driver copies the arguments at the launch (a graph keeps these values).
    std::vector<uint64_t> values(k.sizes.size(), 0);
    for (size_t i = 0; i < k.sizes.size(); i++) std::memcpy(&values[i], params[i], k.sizes[i]);
    std::array<unsigned, 3> g{grid[0], grid[1], grid[2]}, b{block[0], block[1], block[2]};
    const Kernel* kernel = &k;
    return enqueue(stream, [kernel, g, b, values]() mutable {
        std::vector<void*> pointers(values.size());
        for (size_t i = 0; i < values.size(); i++) pointers[i] = &values[i];
        std::snprintf(running, sizeof running, "%s", kernel->name);
        int rc = kernel->launch(g.data(), b.data(), pointers.data());
        running[0] = 0;
        const char* what = nullptr;
        switch (rc) {
            case 0: return (int)SUCCESS;
            case 2: what = "a thread did not call grid_dependency_sync()"; break;
            case 3: what = "a warp-wide operation ran after lanes of its warp had returned"; break;
            case 4: what = "threads of a block met at different __syncthreads"; break;
            default: what = "bad launch shape"; break;
        }
        char why[256];
        std::snprintf(why, sizeof why, "kernel %s: %s", kernel->name, what);
        report(why);
        return (int)LAUNCH_FAILED;
    });
}

// A mapping whose last page is inaccessible, the allocation flush against it (rounded to
// 16 bytes, which the kernels' vector loads need).
inline int allocate(uint64_t* dptr, size_t bytes) {
    if (!dptr) return INVALID_VALUE;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t rounded = (bytes + 15) / 16 * 16;
    size_t body = (rounded + page - 1) / page * page;
    if (body == 0) body = page;
    {
        std::lock_guard<std::mutex> g(lock);
        if (allocated + bytes > total_bytes()) return OUT_OF_MEMORY;
    }
    void* map = mmap(nullptr, body + page, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (map == MAP_FAILED) return OUT_OF_MEMORY;
    mprotect((char*)map + body, page, PROT_NONE);
    uintptr_t start = (uintptr_t)map + body - rounded;
    std::lock_guard<std::mutex> g(lock);
    allocations[start] = Allocation{map, body + page, bytes};
    allocated += bytes;
    *dptr = start;
    return SUCCESS;
}

inline int release(uint64_t dptr) {
    std::lock_guard<std::mutex> g(lock);
    auto it = allocations.find((uintptr_t)dptr);
    if (it == allocations.end()) return dptr ? INVALID_VALUE : SUCCESS;
    munmap(it->second.map, it->second.map_len);
    allocated -= it->second.bytes;
    allocations.erase(it);
    return SUCCESS;
}

inline int copy(void* dst, const void* src, size_t n, bool dst_device, bool src_device) {
    if (n == 0) return SUCCESS;
    if ((dst_device && !device_range((uintptr_t)dst, n)) ||
        (src_device && !device_range((uintptr_t)src, n))) {
        report("a copy outside every device allocation");
        return INVALID_VALUE;
    }
    std::memmove(dst, src, n);
    return SUCCESS;
}

inline int memset8(uint64_t dst, unsigned char value, size_t n) {
    if (n == 0) return SUCCESS;
    if (!device_range((uintptr_t)dst, n)) {
        report("a memset outside every device allocation");
        return INVALID_VALUE;
    }
    std::memset((void*)dst, value, n);
    return SUCCESS;
}

inline float to_float(const void* p, size_t i, int type) {
    switch (type) {
        case 0: return static_cast<const float*>(p)[i];  // CUDA_R_32F
        case 14: return bf16_to_f32(static_cast<const bf16*>(p)[i]);  // CUDA_R_16BF
        default: return NAN;
    }
}

inline void store(void* p, size_t i, int type, float v) {
    if (type == 0) {
        static_cast<float*>(p)[i] = v;
    } else {  // bf16, as the kernels round
        static_cast<bf16*>(p)[i] = f32_to_bf16(v);
    }
}

}  // namespace emu_driver

#define FALLOW_EMU_REGISTER(name) \
    static emu_driver::Registration fallow_emu_registration_##name{#name, &fallow_emu_##name, &fallow_emu_params_##name};

using namespace emu_driver;

struct CUlaunchConfig_emu {
    unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    void* hStream;
    void* attrs;
    unsigned numAttrs;
};

extern "C" {

int cuInit(unsigned) {
    static bool once = [] {
        std::signal(SIGSEGV, on_fault);
        std::signal(SIGBUS, on_fault);
        std::signal(SIGILL, on_fault);  // the alignment check's trap
        return true;
    }();
    (void)once;
    return SUCCESS;
}
int cuDriverGetVersion(int* v) {
    *v = 13000;
    return SUCCESS;
}
int cuDeviceGetCount(int* n) {
    *n = 1;
    return SUCCESS;
}
int cuDeviceGet(int* d, int ordinal) {
    if (ordinal != 0) return INVALID_DEVICE;
    *d = 0;
    return SUCCESS;
}
int cuDeviceGetName(char* name, int len, int) {
    std::snprintf(name, (size_t)len, "Fallow emulated GPU (CPU)");
    return SUCCESS;
}
int cuDeviceTotalMem_v2(size_t* bytes, int) {
    *bytes = total_bytes();
    return SUCCESS;
}
int cuDeviceGetAttribute(int* v, int attribute, int) {
    switch (attribute) {
        case 1: *v = 1024; break;             // max threads per block
        case 8: *v = 48 * 1024; break;        // shared memory per block
        case 10: *v = 32; break;              // warp size
        case 16: *v = MULTIPROCESSORS; break;  // multiprocessors
        case 38: *v = 50 << 20; break;         // L2 bytes (an H100's)
        case 39: *v = 2048; break;             // threads per multiprocessor
        case 75: *v = 9; break;               // compute capability
        case 76: *v = 0; break;
        case 97: *v = 227 * 1024; break;      // shared memory per block, opted in
        case 115: *v = 0; break;              // memory pools: plain cuMemAlloc
        default: *v = 0; break;
    }
    return SUCCESS;
}
int cuDeviceGetUuid_v2(unsigned char* uuid, int) {
    std::memset(uuid, 0, 16);
    return SUCCESS;
}
int cuDevicePrimaryCtxRetain(void** ctx, int) {
    static int context;
    *ctx = &context;
    return SUCCESS;
}
int cuDevicePrimaryCtxRelease_v2(int) { return SUCCESS; }
int cuCtxSetCurrent(void*) { return SUCCESS; }
int cuCtxGetCurrent(void** ctx) { return cuDevicePrimaryCtxRetain(ctx, 0); }
int cuCtxGetDevice(int* d) {
    *d = 0;
    return SUCCESS;
}
int cuCtxSynchronize() {
    if (any_capture()) {
        break_captures();
        return synchronous();
    }
    return SUCCESS;
}
int cuCtxSetLimit(int, size_t) { return SUCCESS; }
int cuCtxGetStreamPriorityRange(int* least, int* greatest) {
    *least = 0;
    *greatest = -5;
    return SUCCESS;
}

int cuGetErrorString(int e, const char** s) {
    static char text[64];
    std::snprintf(text, sizeof text, "emulated CUDA error %d", e);
    *s = text;
    return SUCCESS;
}
int cuGetErrorName(int e, const char** s) {
    switch (e) {
        case SUCCESS: *s = "CUDA_SUCCESS"; break;
        case INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; break;
        case OUT_OF_MEMORY: *s = "CUDA_ERROR_OUT_OF_MEMORY"; break;
        case NOT_FOUND: *s = "CUDA_ERROR_NOT_FOUND"; break;
        case INVALID_HANDLE: *s = "CUDA_ERROR_INVALID_HANDLE"; break;
        case LAUNCH_FAILED: *s = "CUDA_ERROR_LAUNCH_FAILED"; break;
        case STREAM_CAPTURE_UNSUPPORTED: *s = "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"; break;
        case STREAM_CAPTURE_INVALIDATED: *s = "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"; break;
        default: *s = "CUDA_ERROR_UNKNOWN"; break;
    }
    return SUCCESS;
}

int cuMemGetInfo_v2(size_t* free_bytes, size_t* total) {
    std::lock_guard<std::mutex> g(lock);
    *free_bytes = total_bytes() - allocated;
    *total = total_bytes();
    return SUCCESS;
}
int cuMemAlloc_v2(uint64_t* dptr, size_t bytes) {
    if (int rc = synchronous()) {
        break_captures();
        return rc;
    }
    return allocate(dptr, bytes);
}
// (A real driver captures a stream-ordered allocation as a graph node; this device reports
// no memory pools, so cudarc never asks, and an unexpected caller is told plainly.)
int cuMemAllocAsync(uint64_t* dptr, size_t bytes, void* stream) {
    if (stream_of(stream)->capture) {
        report("an allocation inside a captured graph");
        return STREAM_CAPTURE_UNSUPPORTED;
    }
    return allocate(dptr, bytes);
}
int cuMemFree_v2(uint64_t dptr) {
    if (int rc = synchronous()) {
        break_captures();
        return rc;
    }
    return release(dptr);
}
int cuMemFreeAsync(uint64_t dptr, void* stream) {
    if (stream_of(stream)->capture) return STREAM_CAPTURE_UNSUPPORTED;
    return release(dptr);
}
int cuMemHostAlloc(void** p, size_t bytes, unsigned) {
    *p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096 + 4096);
    if (!*p) return OUT_OF_MEMORY;
    std::lock_guard<std::mutex> g(lock);
    pinned[(uintptr_t)*p] = bytes;
    return SUCCESS;
}
int cuMemAllocHost_v2(void** p, size_t bytes) { return cuMemHostAlloc(p, bytes, 0); }
int cuMemFreeHost(void* p) {
    {
        std::lock_guard<std::mutex> g(lock);
        pinned.erase((uintptr_t)p);
    }
    std::free(p);
    return SUCCESS;
}

int cuMemcpyHtoD_v2(uint64_t dst, const void* src, size_t n) {
    if (int rc = synchronous()) {
        break_captures();
        return rc;
    }
    return copy((void*)dst, src, n, true, false);
}
int cuMemcpyDtoH_v2(void* dst, uint64_t src, size_t n) {
    if (int rc = synchronous()) {
        break_captures();
        return rc;
    }
    return copy(dst, (const void*)src, n, false, true);
}
int cuMemcpyDtoD_v2(uint64_t dst, uint64_t src, size_t n) {
    return copy((void*)dst, (const void*)src, n, true, true);
}
int cuMemcpyHtoDAsync_v2(uint64_t dst, const void* src, size_t n, void* stream) {
    return host_copy(stream, src, n, [=] { return copy((void*)dst, src, n, true, false); });
}
int cuMemcpyDtoHAsync_v2(void* dst, uint64_t src, size_t n, void* stream) {
    return host_copy(stream, dst, n, [=] { return copy(dst, (const void*)src, n, false, true); });
}
int cuMemcpyDtoDAsync_v2(uint64_t dst, uint64_t src, size_t n, void* stream) {
    return enqueue(stream, [=] { return copy((void*)dst, (const void*)src, n, true, true); });
}
int cuMemsetD8_v2(uint64_t dst, unsigned char v, size_t n) {
    if (int rc = synchronous()) {
        break_captures();
        return rc;
    }
    return memset8(dst, v, n);
}
int cuMemsetD8Async(uint64_t dst, unsigned char v, size_t n, void* stream) {
    return enqueue(stream, [=] { return memset8(dst, v, n); });
}

int cuStreamCreate(void** s, unsigned) {
    auto* st = new Stream();
    std::lock_guard<std::mutex> g(lock);
    streams.push_back(st);
    *s = st;
    return SUCCESS;
}
int cuStreamCreateWithPriority(void** s, unsigned flags, int) { return cuStreamCreate(s, flags); }
int cuStreamDestroy_v2(void* s) {
    std::lock_guard<std::mutex> g(lock);
    for (size_t i = 0; i < streams.size(); i++)
        if (streams[i] == s) {
            streams.erase(streams.begin() + (long)i);
            delete static_cast<Stream*>(s);
            return SUCCESS;
        }
    return INVALID_HANDLE;
}
int cuStreamSynchronize(void* s) {
    if (stream_of(s)->capture) {
        stream_of(s)->invalidated = true;
        report("a stream synchronised while it is captured");
        return STREAM_CAPTURE_UNSUPPORTED;
    }
    return SUCCESS;
}
int cuStreamQuery(void*) { return SUCCESS; }
int cuStreamWaitEvent(void*, void*, unsigned) { return SUCCESS; }
int cuStreamBeginCapture_v2(void* s, int mode) {
    Stream* st = stream_of(s);
    if (st == &legacy_stream) return STREAM_CAPTURE_UNSUPPORTED;
    if (st->capture || mode < 0 || mode > 2) return INVALID_VALUE;
    std::lock_guard<std::mutex> g(lock);
    st->capture = new Graph();
    st->invalidated = false;
    st->mode = mode;
    st->owner = std::this_thread::get_id();
    return SUCCESS;
}
int cuStreamEndCapture(void* s, void** graph) {
    Stream* st = stream_of(s);
    if (!st->capture) return INVALID_VALUE;
    if (st->owner != std::this_thread::get_id() && st->mode != 2)
        return STREAM_CAPTURE_WRONG_THREAD;
    Graph* g;
    {
        std::lock_guard<std::mutex> guard(lock);
        g = st->capture;
        st->capture = nullptr;
    }
    if (st->invalidated) {
        delete g;
        *graph = nullptr;
        return STREAM_CAPTURE_INVALIDATED;
    }
    *graph = g;
    return SUCCESS;
}
int cuStreamIsCapturing(void* s, int* status) {
    Stream* st = stream_of(s);
    *status = st->capture ? (st->invalidated ? 2 : 1) : 0;
    return SUCCESS;
}

int cuGraphInstantiateWithFlags(void** exec, void* graph, unsigned long long) {
    if (!graph) return INVALID_VALUE;
    *exec = new Graph(*static_cast<Graph*>(graph));
    return SUCCESS;
}
int cuGraphUpload(void*, void*) { return SUCCESS; }
int cuGraphLaunch(void* exec, void* stream) {
    if (!exec) return INVALID_HANDLE;
    Graph* g = static_cast<Graph*>(exec);
    if (stream_of(stream)->capture) return STREAM_CAPTURE_UNSUPPORTED;
    for (Op& op : g->ops)
        if (int rc = op()) return rc;
    return SUCCESS;
}
int cuGraphExecDestroy(void* exec) {
    delete static_cast<Graph*>(exec);
    return SUCCESS;
}
int cuGraphDestroy(void* graph) {
    delete static_cast<Graph*>(graph);
    return SUCCESS;
}

int cuEventCreate(void** e, unsigned) {
    *e = new Event();
    return SUCCESS;
}
int cuEventDestroy_v2(void* e) {
    delete static_cast<Event*>(e);
    return SUCCESS;
}
int cuEventRecord(void* e, void* stream) {
    auto* ev = static_cast<Event*>(e);
    return enqueue(stream, [ev] {
        ev->at = std::chrono::steady_clock::now();
        return (int)SUCCESS;
    });
}
int cuEventSynchronize(void*) { return SUCCESS; }
int cuEventQuery(void*) { return SUCCESS; }
int cuEventElapsedTime_v2(float* ms, void* start, void* end) {
    auto d = static_cast<Event*>(end)->at - static_cast<Event*>(start)->at;
    *ms = std::chrono::duration<float, std::milli>(d).count();
    return SUCCESS;
}
int cuEventElapsedTime(float* ms, void* start, void* end) { return cuEventElapsedTime_v2(ms, start, end); }

int cuModuleLoadData(void** module, const void* image) {
    if (!image) return INVALID_VALUE;
    *module = new Module{std::string(static_cast<const char*>(image))};
    return SUCCESS;
}
int cuModuleUnload(void* module) {
    delete static_cast<Module*>(module);
    return SUCCESS;
}
// A kernel the module's PTX defines (`.entry name(`) and the emulator has.
int cuModuleGetFunction(void** f, void* module, const char* name) {
    const std::string& ptx = static_cast<Module*>(module)->ptx;
    std::string entry = std::string(".entry ") + name + "(";
    if (ptx.find(entry) == std::string::npos) return NOT_FOUND;
    auto it = registry().find(name);
    if (it == registry().end()) return NOT_FOUND;
    *f = &it->second;
    return SUCCESS;
}
int cuFuncGetAttribute(int* v, int attribute, void*) {
    switch (attribute) {
        case 0: *v = 1024; break;  // max threads per block (the register fit is ptxas's test)
        default: *v = 0; break;
    }
    return SUCCESS;
}
int cuFuncSetAttribute(void*, int, int) { return SUCCESS; }
int cuFuncSetCacheConfig(void*, int) { return SUCCESS; }

int cuLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   unsigned bz, unsigned shared, void* stream, void** params, void** extra) {
    if (!f || extra) return INVALID_VALUE;
    unsigned grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
    return launch(*static_cast<Kernel*>(f), grid, block, shared, stream, params);
}
int cuLaunchKernelEx(const CUlaunchConfig_emu* c, void* f, void** params, void** extra) {
    if (!f || !c || extra) return INVALID_VALUE;
    unsigned grid[3] = {c->gridDimX, c->gridDimY, c->gridDimZ};
    unsigned block[3] = {c->blockDimX, c->blockDimY, c->blockDimZ};
    return launch(*static_cast<Kernel*>(f), grid, block, c->sharedMemBytes, c->hStream, params);
}

// cuBLAS: a handle is the stream it runs on.
typedef float float8 __attribute__((vector_size(32)));

// Rows of op(A) a pass of the emulated GEMM takes together, and columns of op(B).
constexpr int ROW_TILE = 2, COL_TILE = 4;
// (dot_rows dispatches 1 to 4 columns; a pass takes a whole tile or the one row left.)
static_assert(ROW_TILE == 2 && COL_TILE == 4, "the dispatch below covers these tiles");

// The dot products of ROWS rows with COLS columns (`kp` floats each, one after another from
// `rows` and from `cols`), kp a multiple of 8: eight products in flight per pair, their lanes
// summed in order at the end. Each vector loaded serves ROWS or COLS products (one row
// against four columns was bound by its loads); every pair's sum is the same as alone.
extern "C++" template <int ROWS, int COLS>
inline void dot_tile(const float* rows, const float* cols, size_t kp, float (*sums)[COL_TILE]) {
    float8 acc[ROWS][COLS] = {};
    for (size_t p = 0; p < kp; p += 8) {
        float8 x[ROWS];
        for (int r = 0; r < ROWS; r++) std::memcpy(&x[r], rows + (size_t)r * kp + p, sizeof x[r]);
        for (int c = 0; c < COLS; c++) {
            float8 y;
            std::memcpy(&y, cols + (size_t)c * kp + p, sizeof y);
            for (int r = 0; r < ROWS; r++) acc[r][c] += x[r] * y;
        }
    }
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < COLS; c++) {
            float sum = 0;
            for (int l = 0; l < 8; l++) sum += acc[r][c][l];
            sums[r][c] = sum;
        }
}

// dot_tile for 1 to COL_TILE columns.
extern "C++" template <int ROWS>
inline void dot_rows(const float* rows, const float* cols, size_t kp, int n, float (*sums)[COL_TILE]) {
    switch (n) {
        case 1: dot_tile<ROWS, 1>(rows, cols, kp, sums); break;
        case 2: dot_tile<ROWS, 2>(rows, cols, kp, sums); break;
        case 3: dot_tile<ROWS, 3>(rows, cols, kp, sums); break;
        default: dot_tile<ROWS, 4>(rows, cols, kp, sums); break;
    }
}

struct BlasHandle {
    void* stream = nullptr;
};
int cublasCreate_v2(void** h) {
    *h = new BlasHandle();
    return 0;
}
int cublasDestroy_v2(void* h) {
    delete static_cast<BlasHandle*>(h);
    return 0;
}
int cublasSetStream_v2(void* h, void* stream) {
    static_cast<BlasHandle*>(h)->stream = stream;
    return 0;
}
int cublasSetWorkspace_v2(void*, void*, size_t) { return 0; }
int cublasSetMathMode(void*, int) { return 0; }
// Column-major C = alpha·op(A)·op(B) + beta·C, f32 accumulation, A and B bf16 or f32, C bf16
// or f32 (what the backend asks for: bf16 in, f32 out); scalars read at the call, as in
// host pointer mode.
int cublasGemmEx(void* h, int transa, int transb, int m, int n, int k, const void* alpha,
                 const void* A, int atype, int lda, const void* B, int btype, int ldb,
                 const void* beta, void* C, int ctype, int ldc, int compute, int) {
    auto ok = [](int t) { return t == 0 || t == 14; };
    if (!ok(atype) || !ok(btype) || !ok(ctype) || compute != 68 || transa > 1 || transb > 1 ||
        m < 0 || n < 0 || k < 0)
        return 7;  // CUBLAS_STATUS_INVALID_VALUE
    float a = *static_cast<const float*>(alpha), b = *static_cast<const float*>(beta);
    return enqueue(static_cast<BlasHandle*>(h)->stream, [=] {
        // op(B)'s columns as f32 once, op(A)'s rows two at a time as they are needed (an LM
        // head's rows as f32 would be hundreds of MB per call), each pair against four columns
        // at a time, eight products in flight per row and column (the order of cuBLAS's sums
        // is its own too); rows are shared out over the machine's cores.
        size_t kp = ((size_t)k + 7) / 8 * 8;  // zero-padded to whole vectors
        std::vector<float> bcols((size_t)n * kp, 0.0f);
        for (int j = 0; j < n; j++)
            for (int p = 0; p < k; p++)
                bcols[(size_t)j * kp + p] =
                    to_float(B, transb ? (size_t)p * ldb + j : (size_t)j * ldb + p, btype);
        auto rows = [&](int from, int to) {
            std::vector<float> arows(ROW_TILE * kp, 0.0f);
            for (int i0 = from; i0 < to; i0 += ROW_TILE) {
                int tile = to - i0 < ROW_TILE ? to - i0 : ROW_TILE;
                for (int r = 0; r < tile; r++) {
                    int i = i0 + r;
                    float* arow = &arows[(size_t)r * kp];
                    if (transa && atype == 14) {  // the backend's case: bf16 rows, one after another
                        const bf16* src = static_cast<const bf16*>(A) + (size_t)i * lda;
                        for (int p = 0; p < k; p++) arow[p] = bf16_to_f32(src[p]);
                    } else {
                        for (int p = 0; p < k; p++)
                            arow[p] = to_float(A, transa ? (size_t)i * lda + p : (size_t)p * lda + i, atype);
                    }
                }
                for (int j0 = 0; j0 < n; j0 += COL_TILE) {
                    int cols = n - j0 < COL_TILE ? n - j0 : COL_TILE;
                    const float* b0 = &bcols[(size_t)j0 * kp];
                    float sums[ROW_TILE][COL_TILE];
                    if (tile == ROW_TILE)
                        dot_rows<ROW_TILE>(arows.data(), b0, kp, cols, sums);
                    else
                        dot_rows<1>(arows.data(), b0, kp, cols, sums);
                    for (int r = 0; r < tile; r++)
                        for (int c = 0; c < cols; c++) {
                            size_t ci = (size_t)(j0 + c) * ldc + i0 + r;
                            float prior = b == 0 ? 0 : b * to_float(C, ci, ctype);
                            store(C, ci, ctype, a * sums[r][c] + prior);
                        }
                }
            }
        };
        unsigned cores = std::thread::hardware_concurrency();
        int parts = (int)(cores == 0 ? 1 : cores > 8 ? 8 : cores);
        std::vector<std::thread> workers;
        for (int t = 1; t < parts; t++)
            workers.emplace_back(rows, (int)((long)m * t / parts), (int)((long)m * (t + 1) / parts));
        rows(0, (int)((long)m / parts));
        for (auto& w : workers) w.join();
        return 0;
    });
}

}  // extern "C"
