// The host SIMT runtime behind simt.h: fibers (one per CUDA thread, on their own stacks), a scheduler per OS
// thread that runs one CTA at a time, the warp collectives and CTA barriers as rendezvous, and the PTX
// semantics of shfl.sync, ldmatrix, mma.sync and cp.async. Torch-free.
//
// Scheduling. A CTA's fibers run one at a time on their OS thread, each until it blocks: at a warp collective
// (until all 32 lanes of its warp are there), at a CTA barrier (until every thread of the CTA is there) or at
// its exit. The last lane to reach a collective performs it for the whole warp, reading every lane's operands
// where they lie (the waiting lanes' stacks) and writing every lane's results; the waiting lanes then resume.
// A lane arriving at a different collective than the ones waiting, a thread exiting while others wait for it,
// or a state where nobody can run is reported as simt::Error, never waited on.
//
// Shared memory is one buffer per OS thread, reused by its CTAs, filled with 0xff bytes at each CTA start
// (Options::poison_shared: NaN as float / bf16 / half, -1 as int) so that a read of shared memory no thread
// wrote shows up in the results. cp.async copies land at the issuing thread's cp.async.wait_group 0, the
// latest point PTX allows; with Options::check_races, a shadow of the dynamic shared memory (per 16 bytes)
// reports an ldmatrix that reads bytes a cp.async has not landed yet, or that another warp's cp.async landed
// without a CTA barrier since, and a cp.async issued onto bytes another warp read with ldmatrix since the last
// CTA barrier (plain loads and stores of shared memory are not tracked).
#include "cuda/simt/simt.h"

#include <dlfcn.h>
#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#if !defined(__x86_64__) || defined(RANGESWA_SIMT_UCONTEXT)
#define RSWA_SIMT_UCONTEXT 1
#endif

namespace simt {

std::string Site::str() const {
  const char* base = std::strrchr(file, '/');
  return std::string(base ? base + 1 : file) + ":" + std::to_string(line);
}

Options& options() {
  static Options o;
  return o;
}

std::vector<Extension>& extensions() {
  static std::vector<Extension> list;
  return list;
}

void add_extension(const Extension& e) { extensions().push_back(e); }

namespace {

// ---- context switch -----------------------------------------------------------------------------------------

#if !defined(RSWA_SIMT_UCONTEXT)
// x86-64 System V: a switch saves the callee-saved registers on the old stack, stores its stack pointer and
// loads the new one. A new fiber's stack holds a frame whose return address is rswa_simt_start, which calls
// fn(arg) (r13, r12) with the stack 16-byte aligned.
extern "C" void rswa_simt_switch(void** save_sp, void* to_sp);
extern "C" void rswa_simt_start();
asm(R"(
  .text
  .p2align 4
  .globl rswa_simt_switch
  .hidden rswa_simt_switch
  .type rswa_simt_switch,@function
rswa_simt_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size rswa_simt_switch,.-rswa_simt_switch

  .p2align 4
  .globl rswa_simt_start
  .hidden rswa_simt_start
  .type rswa_simt_start,@function
rswa_simt_start:
  movq %r12, %rdi
  callq *%r13
  ud2
  .size rswa_simt_start,.-rswa_simt_start
)");

struct Context {
  void* sp = nullptr;
};

void make_context(Context& c, char* stack, size_t size, void (*fn)(void*), void* arg) {
  const uintptr_t top = (reinterpret_cast<uintptr_t>(stack) + size) & ~uintptr_t(15);
  void** sp = reinterpret_cast<void**>(top) - 7;
  sp[0] = nullptr;                                       // r15
  sp[1] = nullptr;                                       // r14
  sp[2] = reinterpret_cast<void*>(fn);                   // r13
  sp[3] = arg;                                           // r12
  sp[4] = nullptr;                                       // rbx
  sp[5] = nullptr;                                       // rbp
  sp[6] = reinterpret_cast<void*>(&rswa_simt_start);     // return address
  c.sp = sp;
}

inline void switch_context(Context& from, Context& to) { rswa_simt_switch(&from.sp, to.sp); }
#else
struct Context {
  ucontext_t uc;
};

void (*g_entry)(void*) = nullptr;
void ucontext_entry(unsigned lo, unsigned hi) {
  void* arg = reinterpret_cast<void*>((uintptr_t(hi) << 32) | uintptr_t(lo));
  g_entry(arg);
}

void make_context(Context& c, char* stack, size_t size, void (*fn)(void*), void* arg) {
  g_entry = fn;
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = size;
  c.uc.uc_link = nullptr;
  const uintptr_t a = reinterpret_cast<uintptr_t>(arg);
  makecontext(&c.uc, reinterpret_cast<void (*)()>(&ucontext_entry), 2, unsigned(a), unsigned(a >> 32));
}

inline void switch_context(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
#endif

// ---- the state of one CTA ----------------------------------------------------------------------------------

// kPoll: blocked in wait_until (the hopper primitives: mbarrier waits, warpgroup collectives) until its
// condition holds; the scheduler evaluates it when it passes the fiber.
enum class State : uint8_t { kReady, kWarp, kBarrier, kExited, kPoll };
enum Kind : int { kSyncWarp = 0, kShuffle = 1, kLdmatrix = 2, kMma = 3 };

const char* kind_name(int kind, int sub) {
  switch (kind) {
    case kSyncWarp: return "__syncwarp";
    case kShuffle: return sub == int(Shfl::kXor) ? "__shfl_xor_sync" : sub == int(Shfl::kIdx) ? "__shfl_sync"
                        : sub == int(Shfl::kUp) ? "__shfl_up_sync" : "__shfl_down_sync";
    case kLdmatrix: return sub ? "ldmatrix.x4.trans" : "ldmatrix.x4";
    default: return sub == int(MmaType::kBF16) ? "mma.m16n8k16.bf16" : "mma.m16n8k16.f16";
  }
}

const char* barrier_name(Barrier b) {
  switch (b) {
    case Barrier::kSync: return "__syncthreads";
    case Barrier::kOr: return "__syncthreads_or";
    case Barrier::kAnd: return "__syncthreads_and";
    default: return "__syncthreads_count";
  }
}

struct Copy {
  unsigned char* dst;
  const unsigned char* src;
  bool valid;
};

struct Worker;

struct Fiber {
  Context ctx;
  char* stack = nullptr;  // mmap'd: a guard page, then Options::stack_bytes
  size_t mapped = 0;
  Worker* worker = nullptr;
  State state = State::kExited;
  int tid = 0;
  uint3 idx{};
  Site site{"", 0};  // where it waits
  std::vector<Copy> uncommitted, committed;
  std::vector<size_t> group_ends;  // per committed group (oldest first), its end in `committed`
  const std::function<bool()>* poll = nullptr;  // kPoll: the condition it waits for
  std::string poll_what;                         // kPoll: what it waits at (for the deadlock report)

  ~Fiber() {
    if (stack) munmap(stack - page(), mapped);
  }
  static size_t page() {
    static const size_t p = size_t(sysconf(_SC_PAGESIZE));
    return p;
  }
  void allocate(size_t bytes) {
    bytes = (bytes + page() - 1) / page() * page();
    mapped = bytes + page();
    void* m = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) throw Error("simt: cannot map a fiber stack");
    mprotect(m, page(), PROT_NONE);  // overflow faults instead of corrupting the neighbour
    stack = static_cast<char*>(m) + page();
  }
  size_t stack_size() const { return mapped - page(); }
};

// Per warp: the collective its lanes are gathering at.
struct WarpSlot {
  int arrived = 0, exited = 0, kind = -1, sub = 0;
  Site site{"", 0};
  void* args[32];
};

// Operands of the collectives, on the arriving lane's stack.
struct ShflArgs {
  uint32_t value;
  int arg, width;
  unsigned mask;
  uint32_t result;
};
struct LdArgs {
  const unsigned char* addr;
  uint32_t* r;
};
struct MmaArgs {
  float* d;
  const uint32_t* a;
  uint32_t b0, b1;
};

// Shadow of 16 bytes of dynamic shared memory (thread / warp ids + 1; 0: none).
struct Chunk {
  int32_t inflight;   // thread whose cp.async to these bytes has not landed
  int32_t landed;     // thread whose cp.async.wait_group landed them last
  uint32_t landed_gen;
  int32_t reader;     // warp that read them with ldmatrix in read_gen (-1: several warps)
  uint32_t read_gen;
};

struct StaticVar {
  const void* key;
  size_t offset, bytes;
};

// Initial-exec TLS: two pointers, read on every primitive (the general-dynamic model calls __tls_get_addr).
__attribute__((tls_model("initial-exec"))) thread_local Worker* t_worker = nullptr;
__attribute__((tls_model("initial-exec"))) thread_local Fiber* t_fiber = nullptr;

void fiber_main(void* arg);

std::string thread_list(const std::vector<int>& ids) {
  std::ostringstream s;
  for (size_t x = 0; x < ids.size();) {
    size_t y = x;
    while (y + 1 < ids.size() && ids[y + 1] == ids[y] + 1) ++y;
    if (x) s << ", ";
    s << ids[x];
    if (y > x) s << "-" << ids[y];
    x = y + 1;
  }
  return s.str();
}

// fp16 -> float of every bit pattern (cuda_fp16.h's host conversion), filled when the library loads.
const std::vector<float> g_half_table = [] {
  std::vector<float> t(65536);
  for (uint32_t x = 0; x < 65536; ++x) {
    __half_raw r;
    r.x = uint16_t(x);
    t[x] = __half2float(__half(r));
  }
  return t;
}();

inline float half_to_float(uint16_t h) { return g_half_table[h]; }

inline float bf16_to_float(uint16_t b) {
  const uint32_t bits = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

struct Worker {
  const Options opts;
  const std::function<void()>* body = nullptr;
  Context sched;
  std::vector<std::unique_ptr<Fiber>> fibers;
  std::vector<WarpSlot> warps;
  Stats stats;

  // The CTA.
  dim3 grid{1, 1, 1}, block{1, 1, 1};
  uint3 bidx{};
  int64_t linear_block = 0;
  int nthreads = 0, exited = 0;
  std::vector<unsigned char> dyn_storage, static_storage;
  unsigned char* dyn = nullptr;
  size_t dyn_size = 0, static_used = 0;
  std::vector<StaticVar> statics;
  std::vector<Chunk> shadow;
  std::vector<int> order;  // the threads' order in a scheduling pass
  int cursor = -1;         // position in `order` of the running fiber
  uint32_t gen = 1;  // CTA barriers completed + 1
  int bar_arrived = 0, bar_acc = 0, bar_result = 0;
  Barrier bar_kind = Barrier::kSync;
  Site bar_site{"", 0};
  std::string error;
  // A memory fault of a fiber (SIGSEGV / SIGBUS): the GPU's "illegal memory access", symbolized afterwards.
  bool faulted = false;
  const void* fault_addr = nullptr;
  const void* fault_pc = nullptr;
  std::vector<char> altstack;  // the signal handler's stack (a fiber may have overflowed its own)

  explicit Worker(const Options& o) : opts(o) {}

  [[noreturn]] void fail(const std::string& msg) { throw Error(msg); }

  std::string who(int tid) const {
    return "thread " + std::to_string(tid) + " (warp " + std::to_string(tid / 32) + ", lane " +
           std::to_string(tid % 32) + ")";
  }

  // ---- shared memory ----
  bool in_dynamic(const unsigned char* p, size_t n) const { return p >= dyn && p + n <= dyn + dyn_size; }
  bool in_static(const unsigned char* p, size_t n) const {
    for (const StaticVar& v : statics) {
      const unsigned char* b = static_storage.data() + v.offset;
      if (p >= b && p + n <= b + v.bytes) return true;
    }
    return false;
  }
  std::string where(const unsigned char* p) const {
    std::ostringstream s;
    s << static_cast<const void*>(p);
    if (p >= dyn && p < dyn + dyn_size + 4096) s << " (dynamic shared offset " << (p - dyn) << " of " << dyn_size << ")";
    return s.str();
  }

  void* static_shared(const void* key, size_t bytes, size_t align) {
    for (const StaticVar& v : statics)
      if (v.key == key) return static_storage.data() + v.offset;
    align = std::max<size_t>(align, 16);
    const size_t offset = (static_used + align - 1) / align * align;
    if (offset + bytes > static_storage.size() || dyn_size + offset + bytes > opts.max_shared_bytes)
      fail("simt: static shared memory exceeds the CTA's shared memory limit");
    static_used = offset + bytes;
    statics.push_back({key, offset, bytes});
    return static_storage.data() + offset;
  }

  // ---- fibers ----
  // A fiber that blocks or exits hands over to the next ready fiber of the scheduling pass (one switch instead
  // of two through the scheduler), or to the scheduler at the end of the pass or after an error.
  Context& leave() {
    if (error.empty() && !faulted)
      while (++cursor < nthreads) {
        Fiber* n = fibers[order[cursor]].get();
        if (n->state == State::kPoll && (*n->poll)()) n->state = State::kReady;
        if (n->state == State::kReady) {
          t_fiber = n;
          ++stats.switches;
          return n->ctx;
        }
      }
    t_fiber = nullptr;
    return sched;
  }

  void yield(Fiber* f) {
    switch_context(f->ctx, leave());
  }

  void release(int tid) {
    Fiber& f = *fibers[tid];
    if (f.state == State::kWarp || f.state == State::kBarrier) f.state = State::kReady;
  }

  // ---- warp collectives ----
  void warp_collective(int kind, int sub, Site site, void* args) {
    Fiber* f = t_fiber;
    const int warp = f->tid / 32, lane = f->tid % 32;
    WarpSlot& ws = warps[warp];
    if ((warp + 1) * 32 > nthreads)
      fail("simt: " + std::string(kind_name(kind, sub)) + " at " + site.str() + " in warp " + std::to_string(warp) +
           ", which has only " + std::to_string(nthreads - warp * 32) + " threads (blockDim not a multiple of 32)");
    if (ws.exited > 0) {
      std::vector<int> gone;
      for (int l = 0; l < 32; ++l)
        if (fibers[warp * 32 + l]->state == State::kExited) gone.push_back(l);
      fail("simt: " + who(f->tid) + " reached " + kind_name(kind, sub) + " at " + site.str() + ", but lanes " +
           thread_list(gone) + " of warp " + std::to_string(warp) + " have exited (the full-warp collective would hang)");
    }
    if (ws.arrived == 0) {
      ws.kind = kind;
      ws.sub = sub;
      ws.site = site;
    } else if (ws.kind != kind || ws.sub != sub || ((kind == kLdmatrix || kind == kMma) && !(ws.site == site))) {
      std::vector<int> waiting;
      for (int l = 0; l < 32; ++l)
        if (fibers[warp * 32 + l]->state == State::kWarp) waiting.push_back(l);
      fail("simt: lanes of warp " + std::to_string(warp) + " at different collectives: lane " + std::to_string(lane) +
           " reached " + kind_name(kind, sub) + " at " + site.str() + " while lanes " + thread_list(waiting) +
           " wait at " + kind_name(ws.kind, ws.sub) + " at " + ws.site.str() +
           ((kind == kLdmatrix || kind == kMma) ? " (.aligned: every lane must execute the same instruction)" : ""));
    }
    ws.args[lane] = args;
    f->site = site;
    if (++ws.arrived < 32) {
      f->state = State::kWarp;
      yield(f);
      return;
    }
    ws.arrived = 0;
    ++stats.warp_collectives;
    switch (kind) {
      case kShuffle: do_shuffle(ws, sub, site); break;
      case kLdmatrix: do_ldmatrix(ws, warp, sub != 0, site); break;
      case kMma:
        if (MmaType(sub) == MmaType::kBF16) do_mma<MmaType::kBF16>(ws);
        else do_mma<MmaType::kF16>(ws);
        break;
      default: break;
    }
    for (int l = 0; l < 32; ++l)
      if (l != lane) release(warp * 32 + l);
  }

  // shfl.sync (PTX 9.7.9.6; CUDA __shfl*_sync): lane l reads `value` of lane src(l) within its width segment;
  // a source outside the segment (up / down / xor past it) returns the lane's own value.
  __attribute__((noinline)) void do_shuffle(WarpSlot& ws, int mode, Site site) {
    uint32_t values[32];
    for (int l = 0; l < 32; ++l) {
      const ShflArgs& a = *static_cast<ShflArgs*>(ws.args[l]);
      if (a.mask != 0xffffffffu)
        fail("simt: " + std::string(kind_name(kShuffle, mode)) + " at " + site.str() + " with mask 0x" +
             [&] { char b[16]; std::snprintf(b, sizeof b, "%08x", a.mask); return std::string(b); }() +
             ": only full-warp masks are emulated");
      if (a.width <= 0 || a.width > 32 || (a.width & (a.width - 1)))
        fail("simt: shuffle width " + std::to_string(a.width) + " at " + site.str() + " is not a power of 2 <= 32");
      values[l] = a.value;
    }
    for (int l = 0; l < 32; ++l) {
      ShflArgs& a = *static_cast<ShflArgs*>(ws.args[l]);
      const int w = a.width, base = l / w * w;
      int src = l;
      switch (Shfl(mode)) {
        case Shfl::kIdx: src = base + (a.arg % w + w) % w; break;
        case Shfl::kXor: src = l ^ a.arg; src = src >= base + w || src < 0 ? l : src; break;
        case Shfl::kUp: src = l - a.arg < base ? l : l - a.arg; break;
        case Shfl::kDown: src = l + a.arg >= base + w ? l : l + a.arg; break;
      }
      a.result = values[src];
    }
  }

  void check_shared_row(const unsigned char* p, Site site, const char* what, int tid) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0)
      fail("simt: " + std::string(what) + " at " + site.str() + ": " + who(tid) + " gives the misaligned row address " +
           where(p) + " (rows must be 16-byte aligned)");
    if (!in_dynamic(p, 16) && !in_static(p, 16))
      fail("simt: " + std::string(what) + " at " + site.str() + ": " + who(tid) + " gives the row address " + where(p) +
           ", outside the CTA's shared memory");
  }

  // ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 (PTX 9.7.14.5.15): lanes 8m..8m+7 give the addresses of
  // rows 0..7 of matrix m (8 b16 elements = 16 bytes each). Lane l receives in r[m] two elements of matrix m:
  // without .trans row l/4, columns 2(l%4) and 2(l%4)+1; with .trans (column-major load) the same positions
  // of the transposed matrix, i.e. column l/4 of rows 2(l%4) and 2(l%4)+1. The lower column (row) is in the
  // low 16 bits.
  __attribute__((noinline)) void do_ldmatrix(WarpSlot& ws, int warp, bool trans, Site site) {
    uint16_t m[4][8][8];
    for (int l = 0; l < 32; ++l) {
      const unsigned char* p = static_cast<LdArgs*>(ws.args[l])->addr;
      check_shared_row(p, site, trans ? "ldmatrix.x4.trans" : "ldmatrix.x4", warp * 32 + l);
      if (opts.check_races && in_dynamic(p, 16)) {
        Chunk& c = shadow[(p - dyn) / 16];
        if (c.inflight)
          fail("simt: ldmatrix at " + site.str() + " (warp " + std::to_string(warp) + ") reads " + where(p) +
               ", which a cp.async of " + who(c.inflight - 1) + " has not landed: that thread has not waited "
               "(cp.async.wait_group) for it, and no __syncthreads() followed");
        if (c.landed && c.landed_gen == gen && (c.landed - 1) / 32 != warp)
          fail("simt: ldmatrix at " + site.str() + " (warp " + std::to_string(warp) + ") reads " + where(p) +
               ", landed by the cp.async.wait_group of " + who(c.landed - 1) + " with no __syncthreads() since");
        if (c.read_gen != gen) {
          c.read_gen = gen;
          c.reader = warp + 1;
        } else if (c.reader != warp + 1) {
          c.reader = -1;
        }
      }
      std::memcpy(m[l / 8][l % 8], p, 16);
    }
    ++stats.ldmatrix;
    for (int l = 0; l < 32; ++l) {
      uint32_t* r = static_cast<LdArgs*>(ws.args[l])->r;
      const int row = l / 4, col = 2 * (l % 4);
      for (int x = 0; x < 4; ++x)
        r[x] = trans ? uint32_t(m[x][col][row]) | uint32_t(m[x][col + 1][row]) << 16
                     : uint32_t(m[x][row][col]) | uint32_t(m[x][row][col + 1]) << 16;
    }
  }

  // mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 (PTX 9.7.14.5.14; fragments: 9.7.14.5.8
  // "Matrix Fragments for mma.m16n8k16 with floating point type"), groupID g = lane >> 2, t = lane % 4:
  //   A (16 x 16, row): a0..a7 in 4 registers, two per register, lower index in the low half;
  //     row = g for a_i, i in {0,1,4,5}, else g + 8; col = 2t + (i & 1) for i < 4, 2t + (i & 1) + 8 for i >= 4
  //     -> reg 0 = (g, 2t..2t+1), reg 1 = (g+8, 2t..), reg 2 = (g, 2t+8..), reg 3 = (g+8, 2t+8..)
  //   B (16 x 8, col): b0..b3 in 2 registers; row (k) = 2t + (i & 1) for i < 2, 2t + (i & 1) + 8 for i >= 2;
  //     col (n) = g -> reg 0 = (k 2t..2t+1, n g), reg 1 = (k 2t+8..2t+9, n g)
  //   C / D (16 x 8, f32): c0..c3; row = g for i < 2, g + 8 for i >= 2; col = 2t + (i & 1)
  // D = A B + C: the products of the 16-bit operands are exact in fp32; they are added to C in fp32 in k order
  // (PTX leaves the accumulation order and intermediate precision to the implementation).
  template <MmaType kType>
  __attribute__((noinline)) void do_mma(WarpSlot& ws) {
    float A[16][16], B[16][8], D[16][8];
    auto cvt = [](uint32_t bits) {
      return kType == MmaType::kBF16 ? bf16_to_float(uint16_t(bits)) : half_to_float(uint16_t(bits));
    };
    for (int l = 0; l < 32; ++l) {
      const MmaArgs& a = *static_cast<MmaArgs*>(ws.args[l]);
      const int g = l >> 2, t = l & 3;
      for (int r = 0; r < 4; ++r) {
        const int row = g + 8 * (r & 1), col = 2 * t + 8 * (r >> 1);
        A[row][col] = cvt(a.a[r] & 0xffffu);
        A[row][col + 1] = cvt(a.a[r] >> 16);
      }
      B[2 * t][g] = cvt(a.b0 & 0xffffu);
      B[2 * t + 1][g] = cvt(a.b0 >> 16);
      B[2 * t + 8][g] = cvt(a.b1 & 0xffffu);
      B[2 * t + 9][g] = cvt(a.b1 >> 16);
      D[g][2 * t] = a.d[0];
      D[g][2 * t + 1] = a.d[1];
      D[g + 8][2 * t] = a.d[2];
      D[g + 8][2 * t + 1] = a.d[3];
    }
    for (int i = 0; i < 16; ++i)
      for (int k = 0; k < 16; ++k) {
        const float x = A[i][k];
        for (int j = 0; j < 8; ++j) D[i][j] += x * B[k][j];
      }
    for (int l = 0; l < 32; ++l) {
      float* d = static_cast<MmaArgs*>(ws.args[l])->d;
      const int g = l >> 2, t = l & 3;
      d[0] = D[g][2 * t];
      d[1] = D[g][2 * t + 1];
      d[2] = D[g + 8][2 * t];
      d[3] = D[g + 8][2 * t + 1];
    }
    ++stats.mmas;
  }

  // ---- CTA barriers (bar.sync 0 / bar.red): every thread of the CTA, at the same barrier ----
  int barrier(Barrier kind, int pred, Site site) {
    Fiber* f = t_fiber;
    if (exited > 0) {
      std::vector<int> gone;
      for (int t = 0; t < nthreads; ++t)
        if (fibers[t]->state == State::kExited) gone.push_back(t);
      fail("simt: deadlock: " + who(f->tid) + " reached " + barrier_name(kind) + " at " + site.str() + ", but threads " +
           thread_list(gone) + " of the CTA have exited (a barrier in code not every thread runs)");
    }
    if (bar_arrived == 0) {
      bar_kind = kind;
      bar_site = site;
      bar_acc = kind == Barrier::kAnd ? 1 : 0;
    } else if (kind != bar_kind || !(site == bar_site)) {
      std::vector<int> waiting;
      for (int t = 0; t < nthreads; ++t)
        if (fibers[t]->state == State::kBarrier) waiting.push_back(t);
      fail("simt: divergent barrier (deadlock or undefined behaviour): " + who(f->tid) + " reached " +
           barrier_name(kind) + " at " + site.str() + " while threads " + thread_list(waiting) + " wait at " +
           barrier_name(bar_kind) + " at " + bar_site.str());
    }
    switch (kind) {
      case Barrier::kOr: bar_acc |= pred; break;
      case Barrier::kAnd: bar_acc &= pred; break;
      case Barrier::kCount: bar_acc += pred; break;
      default: break;
    }
    f->site = site;
    if (++bar_arrived < nthreads) {
      f->state = State::kBarrier;
      yield(f);
      return bar_result;
    }
    bar_arrived = 0;
    bar_result = bar_acc;
    ++gen;
    ++stats.barriers;
    for (int t = 0; t < nthreads; ++t)
      if (t != f->tid) release(t);
    return bar_result;
  }

  // ---- cp.async ----
  void cp_async(void* dst_, const void* src_, bool valid, Site site) {
    Fiber* f = t_fiber;
    auto* dst = static_cast<unsigned char*>(dst_);
    const auto* src = static_cast<const unsigned char*>(src_);
    if (reinterpret_cast<uintptr_t>(dst) % 16 || reinterpret_cast<uintptr_t>(src) % 16)
      fail("simt: cp.async 16 at " + site.str() + " by " + who(f->tid) + ": misaligned address (shared " + where(dst) +
           ", global " + [&] { std::ostringstream s; s << src_; return s.str(); }() + "; both must be 16-byte aligned)");
    if (!in_dynamic(dst, 16) && !in_static(dst, 16))
      fail("simt: cp.async 16 at " + site.str() + " by " + who(f->tid) + ": destination " + where(dst) +
           " outside the CTA's shared memory");
    if (valid && src == nullptr) fail("simt: cp.async 16 at " + site.str() + " by " + who(f->tid) + " reads a null pointer");
    ::simt::hopper::check_async_overwrite(dst, 16, site);  // a stage that a wgmma in flight still reads
    if (opts.check_races && in_dynamic(dst, 16)) {
      Chunk& c = shadow[(dst - dyn) / 16];
      if (c.inflight && c.inflight != f->tid + 1)
        fail("simt: cp.async at " + site.str() + " by " + who(f->tid) + " writes " + where(dst) + ", which " +
             who(c.inflight - 1) + "'s cp.async is still writing");
      if (c.read_gen == gen && c.reader != 0 && c.reader != f->tid / 32 + 1)
        fail("simt: cp.async at " + site.str() + " by " + who(f->tid) + " overwrites " + where(dst) + ", which " +
             (c.reader > 0 ? "warp " + std::to_string(c.reader - 1) : std::string("several warps")) +
             " read with ldmatrix since the last __syncthreads() (write-after-read race)");
      c.inflight = f->tid + 1;
    }
    f->uncommitted.push_back({dst, src, valid});
    if (opts.eager_copies) {  // the data is there at once; the bookkeeping (and the race checks) stay
      if (valid) std::memcpy(dst, src, 16);
      else std::memset(dst, 0, 16);
    }
    ++stats.cp_async;
  }

  void cp_commit() {
    Fiber* f = t_fiber;
    f->committed.insert(f->committed.end(), f->uncommitted.begin(), f->uncommitted.end());
    f->uncommitted.clear();
    f->group_ends.push_back(f->committed.size());  // an empty commit is an empty group (PTX)
  }

  void cp_wait_all() { cp_wait_group(0); }

  // cp.async.wait_group n: every committed group but the newest n lands now; those stay in flight.
  void cp_wait_group(int pending) {
    Fiber* f = t_fiber;
    const size_t groups = f->group_ends.size();
    if (groups <= size_t(pending)) return;
    const size_t landed = f->group_ends[groups - size_t(pending) - 1];
    for (size_t i = 0; i < landed; ++i) {
      const Copy& c = f->committed[i];
      if (c.valid) std::memcpy(c.dst, c.src, 16);
      else std::memset(c.dst, 0, 16);
      if (opts.check_races && in_dynamic(c.dst, 16)) {
        Chunk& s = shadow[(c.dst - dyn) / 16];
        s.inflight = 0;
        s.landed = f->tid + 1;
        s.landed_gen = gen;
      }
    }
    f->committed.erase(f->committed.begin(), f->committed.begin() + std::ptrdiff_t(landed));
    f->group_ends.erase(f->group_ends.begin(), f->group_ends.end() - pending);
    for (size_t& end : f->group_ends) end -= landed;
  }

  // ---- exits ----
  void on_exit(Fiber* f) {
    f->state = State::kExited;
    ++exited;
    WarpSlot& ws = warps[f->tid / 32];
    ++ws.exited;
    if (!error.empty()) return;
    if (ws.arrived > 0) {
      std::vector<int> waiting;
      for (int l = 0; l < 32 && (f->tid / 32) * 32 + l < nthreads; ++l)
        if (fibers[(f->tid / 32) * 32 + l]->state == State::kWarp) waiting.push_back(l);
      error = who(f->tid) + " exited while lanes " + thread_list(waiting) + " of its warp wait at " +
              kind_name(ws.kind, ws.sub) + " at " + ws.site.str() + " (the full-warp collective would hang)";
    } else if (bar_arrived > 0) {
      std::vector<int> waiting;
      for (int t = 0; t < nthreads; ++t)
        if (fibers[t]->state == State::kBarrier) waiting.push_back(t);
      error = "deadlock: " + who(f->tid) + " exited while threads " + thread_list(waiting) + " wait at " +
              barrier_name(bar_kind) + " at " + bar_site.str();
    }
  }

  std::string stall_report() const {
    std::ostringstream s;
    s << "deadlock: no thread can run;";
    std::vector<int> exit_ids;
    std::vector<std::pair<std::string, std::vector<int>>> groups;
    for (int t = 0; t < nthreads; ++t) {
      const Fiber& f = *fibers[t];
      std::string what;
      if (f.state == State::kExited) {
        exit_ids.push_back(t);
        continue;
      }
      if (f.state == State::kBarrier) what = std::string(barrier_name(bar_kind)) + " at " + f.site.str();
      else if (f.state == State::kPoll) what = f.poll_what + " at " + f.site.str();
      else what = std::string(kind_name(warps[t / 32].kind, warps[t / 32].sub)) + " at " + f.site.str();
      auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == what; });
      if (it == groups.end()) groups.push_back({what, {t}});
      else it->second.push_back(t);
    }
    for (const auto& g : groups) s << " threads " << thread_list(g.second) << " wait at " << g.first << ";";
    if (!exit_ids.empty()) s << " threads " << thread_list(exit_ids) << " exited;";
    return s.str();
  }

  // ---- one CTA ----
  void prepare(dim3 g, dim3 b, size_t smem) {
    grid = g;
    block = b;
    nthreads = int(b.x * b.y * b.z);
    const size_t stack = std::max<size_t>(opts.stack_bytes, 64 * 1024);
    while (int(fibers.size()) < nthreads) {
      fibers.push_back(std::make_unique<Fiber>());
      fibers.back()->allocate(stack);
      fibers.back()->worker = this;
    }
    warps.assign((nthreads + 31) / 32, WarpSlot{});
    dyn_size = smem;
    dyn_storage.assign(smem + 128, 0);
    dyn = dyn_storage.data() + (128 - reinterpret_cast<uintptr_t>(dyn_storage.data()) % 128) % 128;
    static_storage.assign(64 * 1024, 0);
    shadow.assign((smem + 15) / 16, Chunk{});
  }

  void run_cta(int64_t b) {
    linear_block = b;
    bidx = uint3{unsigned(b % grid.x), unsigned((b / grid.x) % grid.y), unsigned(b / (int64_t(grid.x) * grid.y))};
    exited = 0;
    bar_arrived = 0;
    gen = 1;
    error.clear();
    for (WarpSlot& w : warps) w = WarpSlot{};
    for (const Extension& e : extensions())
      if (e.cta_start) e.cta_start();
    statics.clear();
    static_used = 0;
    if (opts.poison_shared) {
      std::memset(dyn, 0xff, dyn_size);
      std::memset(static_storage.data(), 0xff, static_storage.size());
    }
    if (opts.check_races) std::fill(shadow.begin(), shadow.end(), Chunk{});
    order.resize(nthreads);
    for (int t = 0; t < nthreads; ++t) order[t] = t;
    for (int t = 0; t < nthreads; ++t) {
      Fiber& f = *fibers[t];
      f.tid = t;
      f.idx = uint3{unsigned(t % block.x), unsigned((t / block.x) % block.y), unsigned(t / (block.x * block.y))};
      f.state = State::kReady;
      f.uncommitted.clear();
      f.committed.clear();
      f.group_ends.clear();
      make_context(f.ctx, f.stack, f.stack_size(), &fiber_main, &f);
    }
    uint64_t rng = opts.schedule_seed * 0x9E3779B97F4A7C15ull + uint64_t(b);
    while (exited < nthreads) {
      if (opts.schedule_seed != 0) {  // a random order of the threads for this pass (Fisher-Yates)
        for (int t = nthreads - 1; t > 0; --t) {
          rng = rng * 6364136223846793005ull + 1442695040888963407ull;
          std::swap(order[t], order[int((rng >> 33) % uint64_t(t + 1))]);
        }
      }
      // One pass: the ready fibers in order, each handing over to the next (leave()); back here at its end.
      cursor = -1;
      Context& first = leave();
      if (&first == &sched) {
        // Nobody can run: an extension may still make progress (the hopper emulation lands a TMA copy).
        bool progressed = false;
        try {
          for (const Extension& e : extensions())
            if (!progressed && e.idle) progressed = e.idle();
        } catch (const std::exception& e) {
          throw Error(context() + e.what());
        }
        if (progressed) continue;
        throw Error(context() + stall_report());
      }
      switch_context(sched, first);
      t_fiber = nullptr;
      if (faulted) throw Error(context() + error + fault_report());
      if (!error.empty()) throw Error(context() + error);
    }
    try {
      for (const Extension& e : extensions())
        if (e.cta_end) e.cta_end();
    } catch (const std::exception& e) {
      throw Error(context() + e.what());
    }
    ++stats.ctas;
  }

  std::string fault_report() const {
    std::ostringstream s;
    s << "illegal memory access (signal) at address " << fault_addr << ", pc " << fault_pc;
    Dl_info info{};
    if (fault_pc && dladdr(fault_pc, &info) && info.dli_fname) {
      const uintptr_t offset = reinterpret_cast<uintptr_t>(fault_pc) - reinterpret_cast<uintptr_t>(info.dli_fbase);
      s << " = " << info.dli_fname << " + 0x" << std::hex << offset << std::dec;
      if (info.dli_sname) s << " (" << info.dli_sname << ")";
      // Source line, when addr2line is there and the library has line tables (-g1).
      char cmd[1024];
      std::snprintf(cmd, sizeof cmd, "addr2line -C -f -i -e '%s' 0x%lx 2>/dev/null", info.dli_fname,
                    static_cast<unsigned long>(offset));
      if (FILE* pipe = popen(cmd, "r")) {
        char line[1024];
        std::string where;
        while (std::fgets(line, sizeof line, pipe)) where += line;
        pclose(pipe);
        for (char& c : where)
          if (c == '\n') c = ' ';
        if (!where.empty() && where.find("??") != 0) s << "; addr2line: " << where;
      }
    }
    return s.str();
  }

  std::string context() const {
    std::ostringstream s;
    s << "simt: CTA blockIdx (" << bidx.x << ", " << bidx.y << ", " << bidx.z << ") of grid (" << grid.x << ", "
      << grid.y << ", " << grid.z << "), " << nthreads << " threads: ";
    return s.str();
  }
};

// SIGSEGV / SIGBUS in a fiber: recorded as the CTA's error, and the fiber leaves for the scheduler at once (its
// stack is abandoned, like the rest of the failed CTA). Outside fibers the previous handler runs.
struct sigaction g_old_segv, g_old_bus;

void fault_handler(int sig, siginfo_t* info, void* uctx) {
  Worker* w = t_worker;
  Fiber* f = t_fiber;
  if (w == nullptr || f == nullptr) {
    const struct sigaction& old = sig == SIGSEGV ? g_old_segv : g_old_bus;
    if (old.sa_flags & SA_SIGINFO) {
      if (old.sa_sigaction) old.sa_sigaction(sig, info, uctx);
      return;
    }
    if (old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN && old.sa_handler != nullptr) {
      old.sa_handler(sig);
      return;
    }
    signal(sig, SIG_DFL);  // re-faults into the default action
    return;
  }
  w->faulted = true;
  w->fault_addr = info->si_addr;
#if defined(__x86_64__)
  w->fault_pc = reinterpret_cast<const void*>(static_cast<ucontext_t*>(uctx)->uc_mcontext.gregs[REG_RIP]);
#endif
  if (w->error.empty()) w->error = w->who(f->tid) + ": ";
  f->state = State::kExited;
  ++w->exited;
  switch_context(f->ctx, w->sched);  // never returns (SA_NODEFER: the signal stays unblocked)
}

void install_fault_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = &fault_handler;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_old_segv);
    sigaction(SIGBUS, &sa, &g_old_bus);
  });
}

void fiber_main(void* arg) {
  Fiber* f = static_cast<Fiber*>(arg);
  Worker* w = f->worker;
  {
    std::string err;
    try {
      (*w->body)();
    } catch (const std::exception& e) {
      err = e.what();
    } catch (...) {
      err = "unknown exception";
    }
    if (!err.empty()) {
      if (w->error.empty()) w->error = w->who(f->tid) + ": " + err;
      f->state = State::kExited;
      ++w->exited;
    } else {
      w->on_exit(f);
    }
  }
  switch_context(f->ctx, w->leave());
  std::abort();  // an exited fiber is never resumed
}

Worker& worker() {
  if (t_worker == nullptr || t_fiber == nullptr) throw Error("simt: a device primitive called outside simt::launch");
  return *t_worker;
}

std::mutex g_stats_mutex;
Stats g_last_stats;

}  // namespace

void device_fail(const char* format, ...) {
  char message[1024];
  va_list args;
  va_start(args, format);
  std::vsnprintf(message, sizeof message, format, args);
  va_end(args);
  std::string text(message);
  while (!text.empty() && text.back() == '\n') text.pop_back();
  throw Error("device-side assertion: " + text);
}

uint3 thread_idx() {
  worker();
  return t_fiber->idx;
}
uint3 block_idx() { return worker().bidx; }
dim3 block_dim() { return worker().block; }
dim3 grid_dim() { return worker().grid; }

int barrier(Barrier kind, int predicate, Site site) { return worker().barrier(kind, predicate, site); }

void syncwarp(unsigned mask, Site site) {
  Worker& w = worker();
  if (mask != 0xffffffffu) w.fail("simt: __syncwarp at " + site.str() + " with a partial mask: only full-warp masks are emulated");
  w.warp_collective(kSyncWarp, 0, site, nullptr);
}

uint32_t shfl(Shfl mode, unsigned mask, uint32_t value, int lane_arg, int width, Site site) {
  ShflArgs a{value, lane_arg, width, mask, 0};
  worker().warp_collective(kShuffle, int(mode), site, &a);
  return a.result;
}

void ldmatrix_x4(uint32_t (&r)[4], const void* smem, bool trans, Site site) {
  LdArgs a{static_cast<const unsigned char*>(smem), r};
  worker().warp_collective(kLdmatrix, trans ? 1 : 0, site, &a);
}

void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, MmaType type, Site site) {
  MmaArgs m{d, a, b0, b1};
  worker().warp_collective(kMma, int(type), site, &m);
}

void cp_async_16(void* smem, const void* gmem, bool valid, Site site) { worker().cp_async(smem, gmem, valid, site); }
void cp_async_commit() { worker().cp_commit(); }
void cp_async_wait_all(Site) { worker().cp_wait_all(); }
void cp_async_wait_group(int pending, Site) { worker().cp_wait_group(pending); }
unsigned char* dynamic_shared() { return worker().dyn; }
size_t dynamic_shared_bytes() { return worker().dyn_size; }
int thread_rank() {
  worker();
  return t_fiber->tid;
}
int block_threads() { return worker().nthreads; }
int cp_async_in_flight(const void* shared) {
  Worker& w = worker();
  const auto* p = static_cast<const unsigned char*>(shared);
  return w.opts.check_races && w.in_dynamic(p, 1) ? w.shadow[size_t(p - w.dyn) / 16].inflight : 0;
}
std::pair<const char*, const char*> thread_stack() {
  worker();
  return {t_fiber->stack, t_fiber->stack + t_fiber->stack_size()};
}

void wait_until(const std::function<bool()>& ready, const std::string& what, Site site) {
  Worker& w = worker();
  if (ready()) return;
  Fiber* f = t_fiber;
  f->poll = &ready;
  f->poll_what = what;
  f->site = site;
  f->state = State::kPoll;
  w.yield(f);  // back here once the scheduler found ready() true
  f->poll = nullptr;
}
void* static_shared(const void* key, size_t bytes, size_t align) { return worker().static_shared(key, bytes, align); }

void launch_body(dim3 grid, dim3 block, size_t smem, const std::function<void()>& body) {
  const Options opts = options();
  const int64_t ctas = int64_t(grid.x) * grid.y * grid.z;
  const int64_t threads = int64_t(block.x) * block.y * block.z;
  if (threads <= 0 || threads > 1024) throw Error("simt: " + std::to_string(threads) + " threads per CTA (1..1024)");
  if (grid.y > 65535 || grid.z > 65535)  // the device's limits (grid.x is an unsigned below 2^31 by its type's use)
    throw Error("simt: grid (" + std::to_string(grid.x) + ", " + std::to_string(grid.y) + ", " + std::to_string(grid.z) +
                ") exceeds the device's 65535 CTAs in y or z");
  if (smem > opts.max_shared_bytes)
    throw Error("simt: " + std::to_string(smem) + " bytes of dynamic shared memory per CTA exceed the limit of " +
                std::to_string(opts.max_shared_bytes));
  if (t_fiber != nullptr) throw Error("simt: launch from inside a kernel");
  Stats total;
  if (ctas > 0) {
    int workers = opts.workers;
    if (workers <= 0) {
      const char* env = std::getenv("RANGESWA_SIMT_THREADS");
      workers = env ? std::atoi(env) : int(std::thread::hardware_concurrency());
    }
    workers = int(std::max<int64_t>(1, std::min<int64_t>(std::max(workers, 1), ctas)));
    std::atomic<int64_t> next{0};
    std::atomic<bool> stop{false};
    std::mutex m;
    int64_t error_block = -1;
    std::string error;
    install_fault_handler();
    auto work = [&] {
      Worker w(opts);
      w.body = &body;
      // The fault handler's stack, for this OS thread while it runs CTAs.
      w.altstack.assign(64 * 1024, 0);
      stack_t alt{}, old_alt{};
      alt.ss_sp = w.altstack.data();
      alt.ss_size = w.altstack.size();
      sigaltstack(&alt, &old_alt);
      Worker* saved = t_worker;
      t_worker = &w;
      try {
        w.prepare(grid, block, smem);
        for (;;) {
          if (stop.load(std::memory_order_relaxed)) break;
          const int64_t b = next.fetch_add(1);
          if (b >= ctas) break;
          try {
            w.run_cta(b);
          } catch (const std::exception& e) {
            std::lock_guard<std::mutex> lock(m);
            if (error_block < 0 || b < error_block) {
              error_block = b;
              error = e.what();
            }
            stop = true;
            break;
          }
        }
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(m);
        if (error.empty()) error = e.what();
        stop = true;
      }
      t_worker = saved;
      sigaltstack(&old_alt, nullptr);
      std::lock_guard<std::mutex> lock(m);
      total.ctas += w.stats.ctas;
      total.switches += w.stats.switches;
      total.warp_collectives += w.stats.warp_collectives;
      total.barriers += w.stats.barriers;
      total.mmas += w.stats.mmas;
      total.ldmatrix += w.stats.ldmatrix;
      total.cp_async += w.stats.cp_async;
    };
    if (workers == 1) {
      work();
    } else {
      std::vector<std::thread> pool;
      for (int x = 0; x < workers; ++x) pool.emplace_back(work);
      for (std::thread& t : pool) t.join();
    }
    for (const Extension& e : extensions())
      if (e.launch_end) e.launch_end();
    if (!error.empty()) throw Error(error);
  }
  std::lock_guard<std::mutex> lock(g_stats_mutex);
  g_last_stats = total;
}

GuardedCopy::GuardedCopy(const void* data, size_t bytes) : bytes_(bytes) {
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  const size_t padded = (bytes + 15) / 16 * 16;
  mapped_ = (padded + page - 1) / page * page + page;
  map_ = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (map_ == MAP_FAILED) throw Error("simt: cannot map a guarded copy");
  char* guard = static_cast<char*>(map_) + mapped_ - page;
  mprotect(guard, page, PROT_NONE);
  data_ = guard - padded;
  if (bytes) std::memcpy(data_, data, bytes);
}

GuardedCopy::~GuardedCopy() {
  if (map_ && map_ != MAP_FAILED) munmap(map_, mapped_);
}

Stats last_stats() {
  std::lock_guard<std::mutex> lock(g_stats_mutex);
  return g_last_stats;
}

}  // namespace simt
