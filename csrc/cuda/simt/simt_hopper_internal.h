// The state of the Hopper primitives' emulation (simt_hopper.h), shared by its parts (torch-free; no kernel
// source and no other SIMT file names it):
//   simt_hopper.cpp         the CTA's state and its hooks into the scheduler, named barriers, setmaxnreg,
//                           fence.proxy.async, the counters
//   simt_wgmma.cpp          wgmma: the warpgroup's fence, commit, wait and mma_async, the shared-memory
//                           descriptors, and the checks that nothing overwrites an operand in flight
//   simt_mbarrier_tma.cpp   mbarriers and TMA copies (cp.async.bulk.tensor), the host's tensor map
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cuda/simt/simt.h"

namespace simt::hopper::internal {

constexpr uint32_t kPoison = 0x7fc0ffeeu;  // a quiet NaN: accumulators of a wgmma in flight
constexpr uint32_t kAPoison = 0x7fff7fffu;  // two NaNs in bf16 and in f16: A registers of a wgmma in flight
constexpr uint32_t kMapMagic = 0x50414d54u;

enum Kind : int { kCommit = 1, kWait = 2, kMma = 3, kSetmaxnreg = 4 };

std::string kind_name(int kind, int sub);
std::string hex(uint64_t x);

// What encode_tensor_map_2d stores in a CUtensorMap's 128 bytes.
struct MapData {
  uint32_t magic, esize;
  uint64_t global;
  uint64_t dim[2];
  uint64_t stride1;
  uint32_t box[2];
  uint32_t swizzle;  // bytes: 0 none, 32, 64, 128
  uint32_t oob_nan, dtype;
};
static_assert(sizeof(MapData) <= sizeof(CUtensorMap), "the emulation's tensor map fits a CUtensorMap");

struct Desc {
  uint32_t start, lbo, sbo, base, W;  // W: swizzle bytes (16: none)
};

// A swizzle of W bytes (16: none) of shared address u: bits [4, 4 + b) XOR bits [7, 7 + b), b = log2(W / 16).
inline uint32_t swizzle(uint32_t u, uint32_t W) { return W <= 16 ? u : u ^ (((u >> 7) & (W / 16 - 1)) << 4); }

struct Op {
  int id = 0, n = 0, wg = 0;
  MmaType type = MmaType::kBF16;
  bool a_regs = false, done = false, trans_a = false, trans_b = false;
  uint64_t da = 0, db = 0;
  int scale_d = 0;
  Site site{"", 0};
  float* d[128];
  const uint32_t* a_ptr[128];
  uint32_t a[128][4];
  bool chained[128];
  std::vector<float> c;         // 128 x n/2: C per thread (when not chained)
  std::vector<uint32_t> reads;  // 16-byte chunks of shared memory (shared address / 16) it reads
};

struct Warpgroup {
  int arrived = 0, kind = -1, sub = 0;
  Site site{"", 0};
  uint64_t gen = 0;
  void* args[128];
  std::vector<int> uncommitted;
  std::deque<std::vector<int>> groups;
};

struct ThreadState {
  bool fenced = false;
  // The thread's stack from its last wgmma.fence's frame up, as it was then (the kernel's registers).
  std::vector<char> at_fence;
  const char* fence_low = nullptr;
  std::vector<int> hazards;  // ops released early (arrive before their wait) by barriers this thread waited on
};

struct Mbar {
  uint32_t count = 0, pending = 0;
  int64_t tx = 0;
  uint64_t phase = 0;  // completed phases
  std::vector<int> early, released;
  Site site{"", 0};  // init
};

struct Tma {
  unsigned char* dst;
  MapData map;
  int c0, c1;
  uint32_t bar, bytes;
  Site site;
  int tid;
};

// A named barrier (bar.sync / bar.red with an id): arrivals of the current round and its thread count.
struct Named {
  int arrived = 0, count = 0, acc = 0, result = 0;
  bool reduce = false;
  uint64_t gen = 0;
  Site site{"", 0};
};

struct Cta {
  std::array<Named, 16> named;
  unsigned char* dyn = nullptr;
  size_t dyn_size = 0;
  int nthreads = 0;
  std::vector<Warpgroup> wgs;
  std::vector<ThreadState> threads;
  std::map<uint32_t, Mbar> bars;
  std::deque<Tma> tmas;
  std::vector<std::unique_ptr<Op>> ops;
  std::vector<int32_t> inflight;  // per 16 bytes of dynamic shared memory: issuing thread + 1 of a TMA in flight
  // The register pool (setmaxnreg) where the launch declared the registers at entry: registers held per
  // warpgroup's thread, and the CTA's free ones. Empty: not modelled.
  std::vector<int> regs;
  int64_t pool = 0;
  Stats stats;
};

// The calling OS thread's CTA: created by the first Hopper primitive a CTA runs (cta()), dropped at its start.
extern thread_local std::unique_ptr<Cta> t_cta;

Cta& cta();
std::string who(int tid);
// The shared-window address of [p, p + bytes) and back; both throw simt::Error outside the dynamic shared memory.
uint32_t to_shared(const Cta& c, const void* p, size_t bytes, const char* what, Site site);
unsigned char* from_shared(const Cta& c, uint32_t addr, size_t bytes, const char* what, Site site);
// Pending (not executed) ops of warpgroup wg, oldest first.
std::vector<Op*> pending_ops(Cta& c, int wg);
// A write of shared chunks [lo, hi) (16 bytes each) by `what` (a TMA copy or a cp.async) of thread tid: refused
// while a wgmma in flight reads them, or one released early (in flight when its threads arrived on an mbarrier
// the writer has waited on since) (simt_wgmma.cpp).
void check_operands_free(Cta& c, int tid, uint32_t lo, uint32_t hi, const char* what, Site site);
// A TMA copy lands: its box written, its bytes completed on its mbarrier (simt_mbarrier_tma.cpp).
void land(Cta& c, const Tma& t);

// The warpgroup rendezvous of a .sync.aligned instruction: the last of the 128 threads runs `perform`.
template <typename F>
inline void collective(int kind, int sub, Site site, void* args, F&& perform) {
  Cta& c = cta();
  const int tid = thread_rank(), wg = tid / 128;
  if ((wg + 1) * 128 > c.nthreads)
    throw Error(kind_name(kind, sub) + " at " + site.str() + " by " + who(tid) + ": warpgroup " +
                std::to_string(wg) + " has only " + std::to_string(c.nthreads - wg * 128) +
                " threads (a warpgroup instruction needs all 128)");
  Warpgroup& w = c.wgs[size_t(wg)];
  if (w.arrived == 0) {
    w.kind = kind;
    w.sub = sub;
    w.site = site;
  } else if (w.kind != kind || w.sub != sub || !(w.site == site)) {
    throw Error("threads of warpgroup " + std::to_string(wg) + " at different .aligned instructions: " + who(tid) +
                " reached " + kind_name(kind, sub) + " at " + site.str() + " while " + std::to_string(w.arrived) +
                " of its threads wait at " + kind_name(w.kind, w.sub) + " at " + w.site.str());
  }
  w.args[tid % 128] = args;
  if (++w.arrived < 128) {
    const uint64_t gen = w.gen;
    wait_until([&w, gen] { return w.gen != gen; }, kind_name(kind, sub) + " (warpgroup " + std::to_string(wg) + ")",
               site);
    return;
  }
  w.arrived = 0;
  perform(w, wg);
  ++w.gen;
}

}  // namespace simt::hopper::internal
