// The state of the host SIMT runtime behind simt.h, shared by its parts (torch-free; no kernel source and no
// other SIMT file names it):
//   simt.cpp         the scheduler: one Worker per OS thread runs one CTA at a time, fibers hand over to each
//                    other, CTA barriers, exits, deadlock reports, launches
//   simt_fiber.cpp   fibers: the x86-64 stack switch (ucontext elsewhere) and the fibers' stacks
//   simt_warp.cpp    the warp collectives: shfl.sync, ldmatrix, mma.sync (and ldmatrix's race checks)
//   simt_shared.cpp  shared memory and cp.async (and cp.async's race checks)
//   simt_faults.cpp  memory faults: the signal handler, its report, guarded copies of global arrays
//
// Scheduling. A CTA's fibers run one at a time on their OS thread, each until it blocks: at a warp collective
// (until all 32 lanes of its warp are there), at a CTA barrier (until every thread of the CTA is there) or at
// its exit. The last lane to reach a collective performs it for the whole warp, reading every lane's operands
// where they lie (the waiting lanes' stacks) and writing every lane's results; the waiting lanes then resume.
// A lane arriving at a different collective than the ones waiting, a thread exiting while others wait for it,
// or a state where nobody can run is reported as simt::Error, never waited on.
#pragma once

#include <ucontext.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cuda/simt/simt.h"

#if !defined(__x86_64__) || defined(RANGESWA_SIMT_UCONTEXT)
#define RSWA_SIMT_UCONTEXT 1
#endif

namespace simt::runtime {

// ---- context switch (simt_fiber.cpp) ---------------------------------------------------------------------------

#if !defined(RSWA_SIMT_UCONTEXT)
// x86-64 System V: a switch saves the callee-saved registers on the old stack, stores its stack pointer and
// loads the new one.
extern "C" void rswa_simt_switch(void** save_sp, void* to_sp);

struct Context {
  void* sp = nullptr;
};

inline void switch_context(Context& from, Context& to) { rswa_simt_switch(&from.sp, to.sp); }
#else
struct Context {
  ucontext_t uc;
};

inline void switch_context(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
#endif

// A context that starts by calling fn(arg) on the stack [stack, stack + size).
void make_context(Context& c, char* stack, size_t size, void (*fn)(void*), void* arg);

// ---- the state of one CTA ----------------------------------------------------------------------------------

// kPoll: blocked in wait_until (the hopper primitives: mbarrier waits, warpgroup collectives) until its
// condition holds; the scheduler evaluates it when it passes the fiber.
enum class State : uint8_t { kReady, kWarp, kBarrier, kExited, kPoll };
enum Kind : int { kSyncWarp = 0, kShuffle = 1, kLdmatrix = 2, kMma = 3 };

const char* kind_name(int kind, int sub);   // simt_warp.cpp
const char* barrier_name(Barrier b);        // simt.cpp
// "0-3, 7": thread (or lane) ids, consecutive ones as ranges.
std::string thread_list(const std::vector<int>& ids);

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

  ~Fiber();
  static size_t page();
  void allocate(size_t bytes);
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
// constinit: no dynamic initialization, so other files read them directly (no TLS wrapper call). simt.cpp.
extern constinit __attribute__((tls_model("initial-exec"))) thread_local Worker* t_worker;
extern constinit __attribute__((tls_model("initial-exec"))) thread_local Fiber* t_fiber;

// A fiber's entry: runs the kernel body, records its exit or exception, hands over (simt.cpp).
void fiber_main(void* arg);

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

  // ---- shared memory (simt_shared.cpp) ----
  bool in_dynamic(const unsigned char* p, size_t n) const { return p >= dyn && p + n <= dyn + dyn_size; }
  bool in_static(const unsigned char* p, size_t n) const;
  std::string where(const unsigned char* p) const;
  void* static_shared(const void* key, size_t bytes, size_t align);
  void cp_async(void* dst_, const void* src_, bool valid, Site site);
  void cp_commit();
  void cp_wait_all() { cp_wait_group(0); }
  // cp.async.wait_group n: every committed group but the newest n lands now; those stay in flight.
  void cp_wait_group(int pending);

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

  // ---- warp collectives (simt_warp.cpp) ----
  void warp_collective(int kind, int sub, Site site, void* args);
  void do_shuffle(WarpSlot& ws, int mode, Site site);
  void check_shared_row(const unsigned char* p, Site site, const char* what, int tid);
  void do_ldmatrix(WarpSlot& ws, int warp, bool trans, Site site);
  template <MmaType kType>
  void do_mma(WarpSlot& ws);

  // ---- CTA barriers, exits, one CTA (simt.cpp) ----
  int barrier(Barrier kind, int pred, Site site);
  void on_exit(Fiber* f);
  std::string stall_report() const;
  void prepare(dim3 g, dim3 b, size_t smem);
  void run_cta(int64_t b);
  std::string context() const;

  // ---- memory faults (simt_faults.cpp) ----
  std::string fault_report() const;
};

// The calling fiber's worker; throws outside a launch.
inline Worker& worker() {
  if (t_worker == nullptr || t_fiber == nullptr) throw Error("simt: a device primitive called outside simt::launch");
  return *t_worker;
}

// SIGSEGV / SIGBUS in a fiber reported as the CTA's error, installed once (simt_faults.cpp).
void install_fault_handler();

}  // namespace simt::runtime
