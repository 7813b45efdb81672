// A CPU emulation of the CUDA execution model, for running the bundled kernels host-free.
//
// Each CUDA thread of a block is a fiber (ucontext) on one OS thread. A fiber runs until it
// reaches __syncthreads(), a warp collective or its end; the scheduler releases a barrier
// when every live thread of the block (or all 32 lanes of the warp) has reached it, and
// reports a deadlock when nothing can be released. Blocks run one after another.
//
// The PTX instructions the kernels use (cp.async, ldmatrix, mma.sync m16n8k16, cvt) are
// implemented from the PTX ISA's own description of their operands and fragment layouts,
// so what is checked is the kernels' index arithmetic, pipeline order and predication
// against the documented instruction semantics. The kernel sources call these functions
// where ARBITER_HOST_EMULATION is defined, instead of their inline asm.
//
// Checks that fail the launch (a message on stderr, exit status 3):
//   * a shared-memory address outside the dynamic allocation or misaligned for its access;
//   * a cp.async source or destination not 16-byte aligned;
//   * a warp collective that not all 32 lanes of a warp reach together;
//   * a deadlock (threads waiting at barriers that can never be released), or a
//     __syncthreads() that some threads of the block have exited without reaching;
//   * a data race on dynamic shared memory, as far as cp.async and ldmatrix touch it: a
//     16-byte chunk written by one thread and read or written by another between the same
//     two __syncthreads(), or read while a cp.async to it is still in flight (issued, not
//     yet retired by its thread's wait_group); copies a thread never waited for land when
//     it exits. Plain loads and stores are left to the ThreadSanitizer build (below);
//   * a block larger than the kernel's __launch_bounds__ (the launcher is told the bound);
//   * a store into the slack around a buffer (canary bytes, checked after the launch).
// Every buffer sits between two inaccessible guard regions of 64 MiB plus its own size,
// its end 16-byte aligned right before the second, so an access that lands in either
// crashes (SIGSEGV); one that jumps further may land in other memory. Dynamic shared
// memory starts poisoned with 0xFF bytes (NaN in every float format); static __shared__
// arrays are plain static storage, zero in the first block and left as the last block
// left them.
//
// It also counts the ldmatrix phases (one 8x8 matrix: eight 16-byte rows) whose rows fall
// in the same shared-memory bank at different addresses, which the hardware serialises.
//
// Built with -fsanitize=thread -DEMU_TSAN, every fiber is a ThreadSanitizer fiber, and the
// only happens-before edges between the threads of a block are its __syncthreads(): then
// ThreadSanitizer reports plain loads and stores (static __shared__ arrays included) that
// race inside one barrier interval, and races between them and cp.async / ldmatrix, whose
// accesses are told to it as the issuing thread's. Blocks are ordered one after another,
// as their shared memory and stacks are their own, so a race between two blocks on global
// memory is not reported; the emulator's own bookkeeping is not checked.
#pragma once

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#ifdef EMU_TSAN
#include <sanitizer/tsan_interface.h>
extern "C" void AnnotateIgnoreReadsBegin(const char* file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char* file, int line);
extern "C" void AnnotateIgnoreWritesBegin(const char* file, int line);
extern "C" void AnnotateIgnoreWritesEnd(const char* file, int line);
extern "C" void __tsan_read_range(void* addr, unsigned long size);
extern "C" void __tsan_write_range(void* addr, unsigned long size);
#endif

#include <algorithm>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};

struct __attribute__((aligned(16))) float4 {
    float x, y, z, w;
};

namespace emu {

[[noreturn]] inline void fail(const char* fmt, ...) {
    va_list args;
    va_start(args, fmt);
    fputs("emulator: ", stderr);
    vfprintf(stderr, fmt, args);
    fputc('\n', stderr);
    va_end(args);
    fflush(stderr);
    _exit(3);
}

enum class Wait { none, block, warp };

struct Copy {
    unsigned char* dst;
    const unsigned char* src;
    int src_bytes;
    unsigned thread;
};

// Who last wrote and read a 16-byte chunk of dynamic shared memory, and in which barrier
// interval (0: never; kMany: several threads read it).
struct Shadow {
    unsigned long long write_epoch = 0, read_epoch = 0;
    unsigned writer = 0, reader = 0;
    unsigned in_flight = 0, flight_owner = 0;  // cp.async copies issued, not yet landed
};
constexpr unsigned kMany = ~0u;

struct Thread;
typedef void (*Resolve)(Thread* const* lanes);

struct Thread {
    ucontext_t context;
    void* stack = nullptr;
    void* tsan_fiber = nullptr;
    bool started = false;  // its fiber exists and parks between blocks
    dim3 idx;
    unsigned linear = 0;
    Wait wait = Wait::none;
    bool done = false;
    // the warp collective this lane waits in: its name, how to resolve it, its operands
    const char* collective = nullptr;
    Resolve resolve = nullptr;
    const void* in[4] = {};
    void* out = nullptr;
    // cp.async groups: the open one, then committed ones, oldest first
    std::vector<Copy> open_group;
    std::vector<std::vector<Copy>> committed;
};

enum class Order { forward, reverse, shuffled };

struct Launch {
    dim3 grid, block, block_idx;
    unsigned char* smem = nullptr;
    size_t smem_bytes = 0;
    std::vector<Thread> threads;
    Thread* current = nullptr;
    ucontext_t scheduler;
    void (*entry)() = nullptr;
    Order order = Order::forward;
    unsigned seed = 0;
    bool eager_copies = false;
    unsigned long long barriers = 0;  // every __syncthreads released so far, all blocks
    unsigned long long ldmatrix_phases = 0, ldmatrix_conflicted = 0;
    std::vector<Shadow> shadow;
    unsigned launch_bound = 0;  // the kernel's __launch_bounds__ maximum, 0 if none
    struct Guarded {
        unsigned char* body;
        size_t body_bytes;
        unsigned char* data;
        size_t bytes;
        std::string what;
    };
    std::vector<Guarded> buffers;
};

inline Launch g;

// ThreadSanitizer's view (EMU_TSAN builds; no-ops otherwise). The sync objects: the start
// and end of a block, and two for barriers in turn: a thread may arrive at barrier k+1,
// releasing what it did since k, before another has woken from k, and the one waking
// must not acquire that.
struct Tsan {
    void* scheduler = nullptr;
    char block_start = 0, block_end = 0, barrier[2] = {};
};
inline Tsan tsan;

// The emulator's own bookkeeping, shared across fibers without ordering: not the kernel's
// accesses, so ThreadSanitizer ignores it.
struct Internal {
#ifdef EMU_TSAN
    Internal() {
        AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
        AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
    }
    ~Internal() {
        AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
        AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
    }
#endif
};

// What a thread's cp.async or ldmatrix touches, told to ThreadSanitizer as that thread's
// access (the bytes themselves are moved by the emulator's bookkeeping, which it ignores).
inline void tsan_reads([[maybe_unused]] const void* p, [[maybe_unused]] size_t bytes) {
#ifdef EMU_TSAN
    __tsan_read_range(const_cast<void*>(p), bytes);
#endif
}

inline void tsan_writes([[maybe_unused]] void* p, [[maybe_unused]] size_t bytes) {
#ifdef EMU_TSAN
    __tsan_write_range(p, bytes);
#endif
}

// Inside an Internal scope: an access that is the kernel's after all.
struct Visible {
#ifdef EMU_TSAN
    Visible() {
        AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
        AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
    }
    ~Visible() {
        AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
        AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
    }
#endif
};

// Always inlined: a function entered on one fiber and left on another would unbalance
// ThreadSanitizer's shadow call stacks.
__attribute__((always_inline)) inline void tsan_switch([[maybe_unused]] void* fiber) {
#ifdef EMU_TSAN
    __tsan_switch_to_fiber(fiber, __tsan_switch_to_fiber_no_sync);
#endif
}

inline void tsan_release([[maybe_unused]] void* what) {
#ifdef EMU_TSAN
    __tsan_release(what);
#endif
}

inline void tsan_acquire([[maybe_unused]] void* what) {
#ifdef EMU_TSAN
    __tsan_acquire(what);
#endif
}

constexpr size_t kStackBytes = 256 * 1024;

inline size_t page_size() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }

constexpr unsigned char kCanary = 0xa5;

constexpr size_t kGuardBytes = size_t(64) << 20;

// `bytes` of memory between two inaccessible guard regions (reserved address space, never
// backed), the end 16-byte aligned right before the second; the slack around the bytes
// holds canary bytes (see check_canaries).
inline unsigned char* guarded_alloc(size_t bytes, std::string what) {
    const size_t page = page_size();
    const size_t padded = (bytes + 15) / 16 * 16;
    const size_t body = std::max(page, (padded + page - 1) / page * page);
    const size_t guard = (kGuardBytes + body + page - 1) / page * page;
    void* base = mmap(nullptr, guard + body + guard, PROT_NONE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) fail("reserving %zu bytes of address space failed", 2 * guard + body);
    unsigned char* start = static_cast<unsigned char*>(base) + guard;
    if (mprotect(start, body, PROT_READ | PROT_WRITE) != 0) fail("mprotect of a buffer failed");
    memset(start, kCanary, body);
    unsigned char* data = start + body - padded;
    g.buffers.push_back({start, body, data, bytes, std::move(what)});
    return data;
}

inline void check_canaries() {
    for (const Launch::Guarded& b : g.buffers) {
        for (size_t i = 0; i < b.body_bytes; ++i) {
            const unsigned char* p = b.body + i;
            if (p >= b.data && p < b.data + b.bytes) continue;
            if (*p != kCanary)
                fail("a store landed outside %s: at byte offset %lld from its start (it holds "
                     "%zu bytes)", b.what.c_str(), static_cast<long long>(p - b.data), b.bytes);
        }
    }
}

// ---- the scheduler ----------------------------------------------------------------------

inline void yield() {
    tsan_switch(tsan.scheduler);
    swapcontext(&g.current->context, &g.scheduler);
}

inline void land_pending_copies();

// One fiber per thread index for the whole grid: it runs the kernel once per block and
// parks in between. It never returns (a return would be booked on the scheduler's shadow
// call stack), and reusing it is much cheaper under ThreadSanitizer than a fresh one.
inline void fiber_main() {
    for (;;) {
        tsan_acquire(&tsan.block_start);
        g.entry();
        {
            Internal internal;
            land_pending_copies();  // the hardware lands them even when nobody waits
            g.current->done = true;
        }
        tsan_release(&tsan.block_end);
        yield();  // parked until the next block
    }
}

inline std::vector<unsigned> schedule_order(unsigned n, unsigned block_serial) {
    std::vector<unsigned> order(n);
    for (unsigned i = 0; i < n; ++i) order[i] = i;
    if (g.order == Order::reverse) std::reverse(order.begin(), order.end());
    if (g.order == Order::shuffled) {
        std::mt19937 rng(g.seed * 7919u + block_serial);
        std::shuffle(order.begin(), order.end(), rng);
    }
    return order;
}

inline bool release_warps(unsigned n) {
    bool released = false;
    for (unsigned first = 0; first < n; first += 32) {
        const unsigned last = std::min(n, first + 32);
        unsigned waiting = 0;
        for (unsigned i = first; i < last; ++i)
            if (g.threads[i].wait == Wait::warp) ++waiting;
        if (waiting == 0) continue;
        bool all_here = true;
        for (unsigned i = first; i < last; ++i)
            if (g.threads[i].done || g.threads[i].wait != Wait::warp) all_here = false;
        if (!all_here) continue;  // others are still running or wait elsewhere
        const char* what = g.threads[first].collective;
        if (last - first != 32)
            fail("warp collective %s in a partial warp of %u threads (block of %u)", what,
                 last - first, n);
        for (unsigned i = first; i < last; ++i)
            if (g.threads[i].collective != what)
                fail("warp %u diverged: lane %u waits in %s, lane 0 in %s", first / 32,
                     i - first, g.threads[i].collective, what);
        Thread* lanes[32];
        for (unsigned i = 0; i < 32; ++i) lanes[i] = &g.threads[first + i];
        lanes[0]->resolve(lanes);
        for (unsigned i = first; i < last; ++i) g.threads[i].wait = Wait::none;
        released = true;
    }
    return released;
}

[[noreturn]] inline void report_deadlock(unsigned n) {
    unsigned at_block = 0, at_warp = 0, done = 0;
    const char* collective = "";
    for (unsigned i = 0; i < n; ++i) {
        if (g.threads[i].done) ++done;
        else if (g.threads[i].wait == Wait::block) ++at_block;
        else if (g.threads[i].wait == Wait::warp) {
            ++at_warp;
            collective = g.threads[i].collective;
        }
    }
    fail("deadlock in block (%u,%u,%u): %u threads at __syncthreads, %u in a warp collective "
         "(%s), %u finished", g.block_idx.x, g.block_idx.y, g.block_idx.z, at_block, at_warp,
         collective, done);
}

inline void run_block(unsigned block_serial) {
    const unsigned n = g.block.x * g.block.y * g.block.z;
    if (g.smem_bytes) memset(g.smem, 0xff, g.smem_bytes);
    g.shadow.assign((g.smem_bytes + 15) / 16, Shadow{});
    for (unsigned i = 0; i < n; ++i) {
        Thread& t = g.threads[i];
        t.idx.x = i % g.block.x;
        t.idx.y = (i / g.block.x) % g.block.y;
        t.idx.z = i / (g.block.x * g.block.y);
        t.linear = i;
        t.wait = Wait::none;
        t.done = false;
        t.open_group.clear();
        t.committed.clear();
        if (t.started) continue;  // parked at the end of the last block
        t.started = true;
#ifdef EMU_TSAN
        t.tsan_fiber = __tsan_create_fiber(0);
#endif
        getcontext(&t.context);
        t.context.uc_stack.ss_sp = t.stack;
        t.context.uc_stack.ss_size = kStackBytes;
        t.context.uc_link = nullptr;  // fiber_main never returns
        makecontext(&t.context, fiber_main, 0);
    }
    const std::vector<unsigned> order = schedule_order(n, block_serial);
    tsan_release(&tsan.block_start);
    for (;;) {
        for (unsigned i : order) {
            Thread& t = g.threads[i];
            if (t.done || t.wait != Wait::none) continue;
            g.current = &t;
            tsan_switch(t.tsan_fiber);
            swapcontext(&g.scheduler, &t.context);
        }
        g.current = nullptr;
        unsigned live = 0, at_block = 0;
        for (unsigned i = 0; i < n; ++i) {
            if (g.threads[i].done) continue;
            ++live;
            if (g.threads[i].wait == Wait::block) ++at_block;
        }
        if (live == 0) {
            tsan_acquire(&tsan.block_end);
            return;
        }
        if (at_block == live && live != n)
            fail("__syncthreads in block (%u,%u,%u) reached by %u threads; the other %u have "
                 "exited without reaching it", g.block_idx.x, g.block_idx.y, g.block_idx.z,
                 live, n - live);
        if (at_block == live) {
            for (unsigned i = 0; i < n; ++i) g.threads[i].wait = Wait::none;
            ++g.barriers;
            continue;
        }
        if (!release_warps(n)) report_deadlock(n);
    }
}

inline void run_grid() {
    Internal internal;  // the scheduler only keeps the books
    const unsigned n = g.block.x * g.block.y * g.block.z;
    g.threads.resize(n);
#ifdef EMU_TSAN
    tsan.scheduler = __tsan_get_current_fiber();
#endif
    for (Thread& t : g.threads)
        if (!t.stack) t.stack = malloc(kStackBytes);
    unsigned serial = 0;
    std::vector<dim3> blocks;
    for (unsigned z = 0; z < g.grid.z; ++z)
        for (unsigned y = 0; y < g.grid.y; ++y)
            for (unsigned x = 0; x < g.grid.x; ++x) blocks.push_back(dim3{x, y, z});
    if (g.order == Order::reverse) std::reverse(blocks.begin(), blocks.end());
    if (g.order == Order::shuffled) {
        std::mt19937 rng(g.seed);
        std::shuffle(blocks.begin(), blocks.end(), rng);
    }
    for (const dim3& b : blocks) {
        g.block_idx = b;
        run_block(serial++);
    }
}

// A warp collective: park this lane with its operands; the last lane to arrive lets the
// scheduler resolve the collective for all 32 lanes at once.
inline void collective(const char* name, Resolve resolve, void* out, const void* in0,
                       const void* in1 = nullptr, const void* in2 = nullptr,
                       const void* in3 = nullptr) {
    Internal internal;
    Thread* t = g.current;
    t->collective = name;
    t->resolve = resolve;
    t->out = out;
    t->in[0] = in0;
    t->in[1] = in1;
    t->in[2] = in2;
    t->in[3] = in3;
    t->wait = Wait::warp;
    yield();
}

// ---- shared memory addresses -----------------------------------------------------------

inline unsigned shared_address(const void* p) {
    const unsigned char* c = static_cast<const unsigned char*>(p);
    if (c < g.smem || c >= g.smem + g.smem_bytes)
        fail("cvta.to.shared of %p: not in the %zu bytes of dynamic shared memory", p,
             g.smem_bytes);
    return static_cast<unsigned>(c - g.smem);
}

// The race check of one 16-byte chunk: `write` by `thread` now, or a read.
inline void note_access(unsigned addr, unsigned thread, bool write, const char* what) {
    Shadow& s = g.shadow[addr / 16];
    const unsigned long long now = g.barriers + 1;
    if (!write && s.in_flight)
        fail("thread %u reads shared bytes [%u, %u) (%s) while a cp.async from thread %u to "
             "them is still in flight (no wait_group has retired it)", thread, addr / 16 * 16,
             addr / 16 * 16 + 16, what, s.flight_owner);
    if (s.write_epoch == now && s.writer != thread)
        fail("data race on shared bytes [%u, %u): thread %u wrote them and thread %u %s them "
             "(%s) with no __syncthreads between", addr / 16 * 16, addr / 16 * 16 + 16,
             s.writer, thread, write ? "writes" : "reads", what);
    if (write) {
        if (s.read_epoch == now && s.reader != thread) {
            char reader[32];
            if (s.reader == kMany) snprintf(reader, sizeof reader, "several threads");
            else snprintf(reader, sizeof reader, "thread %u", s.reader);
            fail("data race on shared bytes [%u, %u): %s read them and thread %u "
                 "overwrites them (%s) with no __syncthreads between", addr / 16 * 16,
                 addr / 16 * 16 + 16, reader, thread, what);
        }
        s.write_epoch = now;
        s.writer = thread;
    } else if (s.read_epoch == now && s.reader != thread) {
        s.reader = kMany;
    } else {
        s.read_epoch = now;
        s.reader = thread;
    }
}

// A cp.async to the chunk at `addr` issued by `thread`: it may land at any moment from now
// until its thread's wait_group retires it, so it races with anything another thread does
// to the chunk in between.
inline void note_issue(unsigned addr, unsigned thread) {
    Shadow& s = g.shadow[addr / 16];
    if (s.in_flight && s.flight_owner != thread)
        fail("threads %u and %u both have a cp.async in flight to shared bytes [%u, %u)",
             s.flight_owner, thread, addr / 16 * 16, addr / 16 * 16 + 16);
    const unsigned long long now = g.barriers + 1;
    if ((s.read_epoch == now && s.reader != thread) || (s.write_epoch == now && s.writer != thread))
        note_access(addr, thread, true, "cp.async issued");  // reports the race
    ++s.in_flight;
    s.flight_owner = thread;
}

inline void note_landed(unsigned addr, unsigned thread) {
    --g.shadow[addr / 16].in_flight;
    note_access(addr, thread, true, "cp.async landed");
}

inline unsigned char* shared_bytes(unsigned addr, size_t bytes, size_t align, const char* what) {
    if (addr % align) fail("%s: shared address %u is not %zu-byte aligned", what, addr, align);
    if (static_cast<size_t>(addr) + bytes > g.smem_bytes)
        fail("%s: shared bytes [%u, %zu) are past the %zu-byte allocation", what, addr,
             static_cast<size_t>(addr) + bytes, g.smem_bytes);
    return g.smem + addr;
}

// ---- number formats (round to nearest even, as cvt.rn) ---------------------------------

inline uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

inline float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

inline float f16_to_f32(uint16_t h) {
    _Float16 v;
    memcpy(&v, &h, 2);
    return static_cast<float>(v);
}

inline uint16_t f32_to_f16(float f) {
    const _Float16 v = static_cast<_Float16>(f);  // IEEE conversion: round to nearest even
    uint16_t h;
    memcpy(&h, &v, 2);
    return h;
}

inline float bf16_to_f32(uint16_t h) { return from_bits(static_cast<uint32_t>(h) << 16); }

inline uint16_t f32_to_bf16(float f) {
    uint32_t u = bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
}

enum class Elem { f16, bf16 };

inline float to_f32(uint16_t h, Elem e) { return e == Elem::f16 ? f16_to_f32(h) : bf16_to_f32(h); }

inline uint16_t half_of(uint32_t reg, int which) {
    return static_cast<uint16_t>(which ? reg >> 16 : reg & 0xffffu);
}

}  // namespace emu

// ---- CUDA built-ins --------------------------------------------------------------------

#define threadIdx (::emu::g.current->idx)
#define blockIdx (::emu::g.block_idx)
#define blockDim (::emu::g.block)
#define gridDim (::emu::g.grid)

inline void __syncthreads() {
    using namespace ::emu;
    tsan_release(&tsan.barrier[g.barriers % 2]);
    {
        Internal internal;
        g.current->wait = Wait::block;
        yield();
    }
    tsan_acquire(&tsan.barrier[(g.barriers - 1) % 2]);
}

namespace emu {
template <typename T>
void resolve_shfl_xor(Thread* const* lanes) {
    for (int l = 0; l < 32; ++l) {
        const int mask = *static_cast<const int*>(lanes[l]->in[1]);
        const int src = (l ^ mask) & 31;
        *static_cast<T*>(lanes[l]->out) = *static_cast<const T*>(lanes[src]->in[0]);
    }
}
}  // namespace emu

template <typename T>
T __shfl_xor_sync(unsigned member_mask, T value, int lane_mask, int width = 32) {
    static_assert(sizeof(T) == 4, "the kernels shuffle 32-bit values");
    if (member_mask != 0xffffffffu || width != 32)
        ::emu::fail("__shfl_xor_sync with mask %#x width %d: the emulator models full warps",
                    member_mask, width);
    T result;
    ::emu::collective("shfl.sync.bfly.b32", ::emu::resolve_shfl_xor<T>, &result, &value,
                      &lane_mask);
    return result;
}

// ---- PTX instructions ------------------------------------------------------------------

namespace emu {
namespace ptx {

// cvta.to.shared.u64 + cvt.u32.u64: the 32-bit shared-window address of a shared pointer
inline unsigned cvta_to_shared(const void* p) { return shared_address(p); }

inline void complete(const std::vector<Copy>& group) {
    for (const Copy& c : group) {
        note_landed(static_cast<unsigned>(c.dst - g.smem), c.thread);
        {
            Visible landing;  // on the issuing thread's fiber
            tsan_writes(c.dst, 16);
            if (c.src_bytes) tsan_reads(c.src, static_cast<size_t>(c.src_bytes));
        }
        memset(c.dst, 0, 16);
        if (c.src_bytes) memcpy(c.dst, c.src, static_cast<size_t>(c.src_bytes));
    }
}

// cp.async.cg.shared.global [dst], [src], 16, src_size: copy src_size bytes, zero the rest
inline void cp_async_cg_16(unsigned dst, const void* src, int src_size) {
    Internal internal;
    if (src_size < 0 || src_size > 16) fail("cp.async src-size %d is outside [0, 16]", src_size);
    if (reinterpret_cast<uintptr_t>(src) % 16)
        fail("cp.async source %p is not 16-byte aligned", src);
    Copy copy{shared_bytes(dst, 16, 16, "cp.async destination"),
              static_cast<const unsigned char*>(src), src_size, g.current->linear};
    note_issue(dst, copy.thread);
    {
        Visible issue;  // the copy may land from now on
        tsan_writes(copy.dst, 16);
        if (src_size) tsan_reads(src, static_cast<size_t>(src_size));
    }
    if (g.eager_copies) complete({copy});
    else g.current->open_group.push_back(copy);
}

}  // namespace ptx

inline void land_pending_copies() {
    Thread* t = g.current;
    for (const std::vector<Copy>& group : t->committed) ptx::complete(group);
    ptx::complete(t->open_group);
    t->committed.clear();
    t->open_group.clear();
}

namespace ptx {

// cp.async.commit_group: the open copies become the newest group
inline void cp_async_commit_group() {
    Internal internal;
    g.current->committed.push_back(std::move(g.current->open_group));
    g.current->open_group.clear();
}

// cp.async.wait_group n: every committed group but the newest n has completed
inline void cp_async_wait_group(int n) {
    Internal internal;
    std::vector<std::vector<Copy>>& groups = g.current->committed;
    while (groups.size() > static_cast<size_t>(n)) {
        complete(groups.front());
        groups.erase(groups.begin());
    }
}

// ldmatrix.sync.aligned.m8n8.x4{.trans}.shared.b16: lane 8*j + r gives the address of row
// r of matrix j (eight 16-bit elements, 16-byte aligned). Word w of row r of matrix j goes
// to register j of lane 4*r + w; with .trans the matrix is transposed first.
// Whether the eight rows (16 bytes each) of one ldmatrix phase hit a 4-byte bank twice
// at different words: 32 banks of 4 bytes, one word per bank per access.
inline bool bank_conflict(const unsigned (&rows)[8]) {
    unsigned word_in_bank[32];
    bool used[32] = {};
    for (unsigned row : rows)
        for (unsigned w = 0; w < 4; ++w) {
            const unsigned word = row / 4 + w, bank = word % 32;
            if (used[bank] && word_in_bank[bank] != word) return true;
            used[bank] = true;
            word_in_bank[bank] = word;
        }
    return false;
}

template <bool Trans>
void resolve_ldmatrix_x4(Thread* const* lanes) {
    uint16_t m[4][8][8];
    for (int j = 0; j < 4; ++j) {
        unsigned rows[8];
        for (int r = 0; r < 8; ++r)
            rows[r] = *static_cast<const unsigned*>(lanes[8 * j + r]->in[0]);
        ++g.ldmatrix_phases;
        if (bank_conflict(rows)) ++g.ldmatrix_conflicted;
    }
    for (int l = 0; l < 32; ++l) {
        const unsigned addr = *static_cast<const unsigned*>(lanes[l]->in[0]);
        const unsigned char* row = shared_bytes(addr, 16, 16, "ldmatrix row");
        note_access(addr, lanes[l]->linear, false, "ldmatrix");
        memcpy(m[l / 8][l % 8], row, 16);
    }
    for (int l = 0; l < 32; ++l) {
        unsigned* r = static_cast<unsigned*>(lanes[l]->out);
        const int row = l / 4, col = 2 * (l % 4);
        for (int j = 0; j < 4; ++j) {
            const uint16_t lo = Trans ? m[j][col][row] : m[j][row][col];
            const uint16_t hi = Trans ? m[j][col + 1][row] : m[j][row][col + 1];
            r[j] = static_cast<unsigned>(lo) | static_cast<unsigned>(hi) << 16;
        }
    }
}

template <bool Trans>
void ldmatrix_x4(unsigned (&r)[4], unsigned addr) {
    tsan_reads(shared_bytes(addr, 16, 16, "ldmatrix row"), 16);  // this lane's row
    collective(Trans ? "ldmatrix.x4.trans" : "ldmatrix.x4", resolve_ldmatrix_x4<Trans>, r, &addr);
}

// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32 d, a, b, c.
// groupID = lane / 4, t = lane % 4. A (16x16, row): a0 = (g, 2t..2t+1), a1 = (g+8, 2t..),
// a2 = (g, 2t+8..), a3 = (g+8, 2t+8..). B (16x8, col): b0 = (k 2t..2t+1, n g),
// b1 = (k 2t+8.., n g). C, D (16x8): c0, c1 = (g, 2t..2t+1), c2, c3 = (g+8, 2t..2t+1).
template <Elem E>
void resolve_mma_m16n8k16(Thread* const* lanes) {
    float a[16][16], b[16][8], c[16][8];
    for (int l = 0; l < 32; ++l) {
        const unsigned* ar = static_cast<const unsigned*>(lanes[l]->in[0]);
        const unsigned* br = static_cast<const unsigned*>(lanes[l]->in[1]);
        const float* cr = static_cast<const float*>(lanes[l]->in[2]);
        const int gid = l / 4, t = l % 4;
        for (int h = 0; h < 2; ++h) {
            a[gid][2 * t + h] = to_f32(half_of(ar[0], h), E);
            a[gid + 8][2 * t + h] = to_f32(half_of(ar[1], h), E);
            a[gid][2 * t + 8 + h] = to_f32(half_of(ar[2], h), E);
            a[gid + 8][2 * t + 8 + h] = to_f32(half_of(ar[3], h), E);
            b[2 * t + h][gid] = to_f32(half_of(br[0], h), E);
            b[2 * t + 8 + h][gid] = to_f32(half_of(br[1], h), E);
            c[gid][2 * t + h] = cr[h];
            c[gid + 8][2 * t + h] = cr[2 + h];
        }
    }
    for (int l = 0; l < 32; ++l) {
        float* d = static_cast<float*>(lanes[l]->out);
        const int gid = l / 4, t = l % 4;
        for (int i = 0; i < 4; ++i) {
            const int row = gid + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
            double sum = c[row][col];
            for (int k = 0; k < 16; ++k) sum += static_cast<double>(a[row][k]) * b[k][col];
            d[i] = static_cast<float>(sum);
        }
    }
}

template <Elem E>
void mma_m16n8k16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1,
                  const float (&c)[4]) {
    const unsigned b[2] = {b0, b1};
    float cc[4] = {c[0], c[1], c[2], c[3]};
    collective(E == Elem::f16 ? "mma.m16n8k16.f16" : "mma.m16n8k16.bf16",
               resolve_mma_m16n8k16<E>, d, a, b, cc);
}

// cvt.rn.{f16x2,bf16x2}.f32 d, a, b: a goes to the upper half of d, b to the lower
inline unsigned cvt_rn_f16x2_f32(float a, float b) {
    return static_cast<unsigned>(f32_to_f16(a)) << 16 | f32_to_f16(b);
}

inline unsigned cvt_rn_bf16x2_f32(float a, float b) {
    return static_cast<unsigned>(f32_to_bf16(a)) << 16 | f32_to_bf16(b);
}

inline float cvt_f32_f16(unsigned short h) { return f16_to_f32(h); }
inline unsigned short cvt_rn_f16_f32(float f) { return f32_to_f16(f); }
inline unsigned short cvt_rn_bf16_f32(float f) { return f32_to_bf16(f); }
inline float mov_b32_f32(unsigned u) { return from_bits(u); }

}  // namespace ptx
}  // namespace emu

// ---- the launcher ----------------------------------------------------------------------
//
// usage: <exe> --grid X Y Z --block X Y Z --smem BYTES --order forward|reverse|shuffled:SEED
//              --copies lazy|eager -- ARG...
// where each ARG is p:PATH (a buffer read from PATH and written back to it after the launch)
// or i:VALUE (an int). The arguments must match the kernel's parameters one to one.

#include <tuple>

namespace emu {

struct Arg {
    char kind;  // 'p' or 'i'
    std::string path;
    unsigned char* data = nullptr;
    size_t bytes = 0;
    int value = 0;
};

inline std::vector<unsigned char> read_file(const std::string& path) {
    FILE* f = fopen(path.c_str(), "rb");
    if (!f) fail("cannot open %s", path.c_str());
    std::vector<unsigned char> data;
    unsigned char chunk[65536];
    size_t got;
    while ((got = fread(chunk, 1, sizeof chunk, f)) > 0)
        data.insert(data.end(), chunk, chunk + got);
    fclose(f);
    return data;
}

inline void write_file(const std::string& path, const unsigned char* data, size_t bytes) {
    FILE* f = fopen(path.c_str(), "wb");
    if (!f || fwrite(data, 1, bytes, f) != bytes || fclose(f) != 0)
        fail("cannot write %s", path.c_str());
}

template <typename P>
P convert(const Arg& arg, size_t index, const char* name) {
    if constexpr (std::is_pointer_v<P>) {
        if (arg.kind != 'p')
            fail("argument %zu of %s is a pointer, the launch passed an int", index, name);
        return static_cast<P>(static_cast<void*>(arg.data));
    } else {
        static_assert(std::is_same_v<P, int>, "kernel parameters must be pointers or int");
        if (arg.kind != 'i')
            fail("argument %zu of %s is an int, the launch passed a buffer", index, name);
        return arg.value;
    }
}

template <typename... P>
struct Entry {
    static inline void (*fn)(P...) = nullptr;
    static inline std::tuple<P...> args;
    static void run() { std::apply(fn, args); }

    template <size_t... I>
    static void bind(const std::vector<Arg>& a, const char* name, std::index_sequence<I...>) {
        args = std::tuple<P...>(convert<P>(a[I], I, name)...);
    }
};

inline unsigned parse_unsigned(const char* text) {
    char* end = nullptr;
    const unsigned long v = strtoul(text, &end, 10);
    if (!*text || *end) fail("not a number: %s", text);
    return static_cast<unsigned>(v);
}

template <typename... P>
int launch_main(int argc, char** argv, void (*fn)(P...), const char* name) {
    std::vector<Arg> args;
    int i = 1;
    auto need = [&](int count) {
        if (i + count >= argc) fail("%s needs %d value(s)", argv[i], count);
    };
    for (; i < argc; ++i) {
        const std::string opt = argv[i];
        if (opt == "--grid" || opt == "--block") {
            need(3);
            dim3& d = opt == "--grid" ? g.grid : g.block;
            d.x = parse_unsigned(argv[++i]);
            d.y = parse_unsigned(argv[++i]);
            d.z = parse_unsigned(argv[++i]);
        } else if (opt == "--smem") {
            need(1);
            g.smem_bytes = parse_unsigned(argv[++i]);
        } else if (opt == "--order") {
            need(1);
            const std::string o = argv[++i];
            if (o == "forward") g.order = Order::forward;
            else if (o == "reverse") g.order = Order::reverse;
            else if (o.rfind("shuffled:", 0) == 0) {
                g.order = Order::shuffled;
                g.seed = parse_unsigned(o.c_str() + 9);
            } else fail("unknown order %s", o.c_str());
        } else if (opt == "--copies") {
            need(1);
            const std::string c = argv[++i];
            if (c != "lazy" && c != "eager") fail("unknown copy mode %s", c.c_str());
            g.eager_copies = c == "eager";
        } else if (opt == "--") {
            ++i;
            break;
        } else {
            fail("unknown option %s", opt.c_str());
        }
    }
    for (; i < argc; ++i) {
        const std::string a = argv[i];
        Arg arg;
        if (a.size() < 2 || a[1] != ':' || (a[0] != 'p' && a[0] != 'i'))
            fail("bad argument %s", a.c_str());
        arg.kind = a[0];
        if (arg.kind == 'p') {
            arg.path = a.substr(2);
            const std::vector<unsigned char> data = read_file(arg.path);
            arg.bytes = data.size();
            arg.data = guarded_alloc(arg.bytes, "argument " + std::to_string(args.size()) +
                                                    " (" + arg.path + ")");
            if (arg.bytes) memcpy(arg.data, data.data(), arg.bytes);
        } else {
            arg.value = static_cast<int>(strtol(a.c_str() + 2, nullptr, 10));
        }
        args.push_back(arg);
    }
    if (args.size() != sizeof...(P))
        fail("%s takes %zu arguments, the launch passed %zu", name, sizeof...(P), args.size());
    const unsigned threads = g.block.x * g.block.y * g.block.z;
    if (threads == 0 || threads > 1024) fail("a block of %u threads (1 to 1024 allowed)", threads);
    if (g.grid.x == 0 || g.grid.y == 0 || g.grid.z == 0 || g.grid.y > 65535 || g.grid.z > 65535)
        fail("grid (%u, %u, %u) is outside CUDA's limits", g.grid.x, g.grid.y, g.grid.z);
    if (g.launch_bound && threads > g.launch_bound)
        fail("a block of %u threads is over %s's __launch_bounds__ of %u; CUDA refuses the "
             "launch", threads, name, g.launch_bound);
    if (g.smem_bytes) g.smem = guarded_alloc(g.smem_bytes, "dynamic shared memory");
    Entry<P...>::fn = fn;
    Entry<P...>::bind(args, name, std::index_sequence_for<P...>{});
    g.entry = &Entry<P...>::run;
    run_grid();
    check_canaries();
    for (const Arg& arg : args)
        if (arg.kind == 'p') write_file(arg.path, arg.data, arg.bytes);
    fprintf(stderr, "emulated %s: grid (%u, %u, %u), block %u threads, %llu block barriers, "
            "%llu ldmatrix phases, %llu with bank conflicts\n", name, g.grid.x, g.grid.y,
            g.grid.z, threads, g.barriers, g.ldmatrix_phases, g.ldmatrix_conflicted);
    return 0;
}

}  // namespace emu
