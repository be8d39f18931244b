// The Hopper primitives of csrc/cuda/sm90/hopper.h in the host SIMT emulation (declared in simt_hopper.h). Torch-free.
// This file: the CTA's state (simt_hopper_internal.h) and its hooks into the scheduler, named barriers,
// setmaxnreg, fence.proxy.async and the counters; simt_wgmma.cpp and simt_mbarrier_tma.cpp the rest.
//
// PTX ISA 8.x sections (docs.nvidia.com/cuda/parallel-thread-execution) and how each is emulated:
//
// fence.proxy.async (9.7.13.4): counted (plain shared-memory stores are not tracked, so a missing one is not
//   detected). setmaxnreg (9.7.19.8): a warpgroup collective; the value in 24..256, a multiple of 8. Where the
//   launcher declares the registers a thread starts with (registers_at_entry: ptxas's count, which the gate
//   holds to the split), the CTA's pool is modelled: .dec gives (held - value) x 128 registers back to it,
//   .inc blocks until it holds (value - held) x 128 (a split the pool cannot feed is a deadlock, reported);
//   .dec above or .inc below the count held is refused.
#include "cuda/simt/simt_hopper_internal.h"

#include <atomic>
#include <mutex>
#include <sstream>

namespace simt::hopper {
namespace internal {
namespace {

std::atomic<int> g_entry_regs{0};  // registers_at_entry of the launch under way (0: none declared)

std::mutex g_stats_mutex;
Stats g_stats;

}  // namespace

thread_local std::unique_ptr<Cta> t_cta;

std::string kind_name(int kind, int sub) {
  switch (kind) {
    case kCommit: return "wgmma.commit_group";
    case kWait: return "wgmma.wait_group " + std::to_string(sub);
    case kMma:
      return "wgmma.mma_async m64n" + std::to_string(sub >> 4) + "k16" + ((sub & 2) ? ".f16" : ".bf16") +
             ((sub & 1) ? " (A in registers)" : " (A in shared memory)") + ((sub & 8) ? " M-major A" : "") +
             ((sub & 4) ? " N-major B" : "");
    default: return std::string("setmaxnreg.") + ((sub & 1) ? "inc " : "dec ") + std::to_string(sub >> 1);
  }
}

std::string hex(uint64_t x) {
  std::ostringstream s;
  s << "0x" << std::hex << x;
  return s.str();
}

Cta& cta() {
  if (!t_cta) {
    t_cta = std::make_unique<Cta>();
    Cta& c = *t_cta;
    c.dyn = dynamic_shared();
    c.dyn_size = dynamic_shared_bytes();
    c.nthreads = block_threads();
    c.wgs.resize(size_t((c.nthreads + 127) / 128));
    c.threads.resize(size_t(c.nthreads));
    c.inflight.assign((c.dyn_size + 15) / 16, 0);
    if (const int entry = g_entry_regs.load(); entry > 0) c.regs.assign(c.wgs.size(), entry);
  }
  return *t_cta;
}

std::string who(int tid) {
  return "thread " + std::to_string(tid) + " (warpgroup " + std::to_string(tid / 128) + ", warp " +
         std::to_string(tid / 32) + ", lane " + std::to_string(tid % 32) + ")";
}

uint32_t to_shared(const Cta& c, const void* p, size_t bytes, const char* what, Site site) {
  const auto* b = static_cast<const unsigned char*>(p);
  if (b < c.dyn || b + bytes > c.dyn + c.dyn_size)
    throw Error(std::string(what) + " at " + site.str() + ": address " + hex(reinterpret_cast<uintptr_t>(p)) +
                " is not in the CTA's dynamic shared memory (" + std::to_string(c.dyn_size) +
                " bytes; the emulated hopper primitives take dynamic shared memory only)");
  return kSharedBase + uint32_t(b - c.dyn);
}

unsigned char* from_shared(const Cta& c, uint32_t addr, size_t bytes, const char* what, Site site) {
  if (addr < kSharedBase || addr - kSharedBase + bytes > c.dyn_size)
    throw Error(std::string(what) + " at " + site.str() + ": shared address " + hex(addr) +
                " lies outside the CTA's dynamic shared memory [" + hex(kSharedBase) + ", " +
                hex(kSharedBase + c.dyn_size) + ")");
  return c.dyn + (addr - kSharedBase);
}

// Pending (not executed) ops of warpgroup wg, oldest first.
std::vector<Op*> pending_ops(Cta& c, int wg) {
  std::vector<Op*> out;
  const Warpgroup& w = c.wgs[size_t(wg)];
  for (const auto& g : w.groups)
    for (int id : g) out.push_back(c.ops[size_t(id)].get());
  for (int id : w.uncommitted) out.push_back(c.ops[size_t(id)].get());
  return out;
}

namespace {

void on_cta_start() { t_cta.reset(); }

bool on_idle() {
  if (!t_cta || t_cta->tmas.empty()) return false;
  Cta& c = *t_cta;
  const Tma t = c.tmas.front();
  c.tmas.pop_front();
  land(c, t);
  return true;
}

void merge_stats(const Stats& s) {
  std::lock_guard<std::mutex> lock(g_stats_mutex);
  g_stats.wgmma += s.wgmma;
  g_stats.wgmma_groups += s.wgmma_groups;
  g_stats.tma += s.tma;
  g_stats.tma_bytes += s.tma_bytes;
  g_stats.arrivals += s.arrivals;
  g_stats.phases += s.phases;
  g_stats.blocked_waits += s.blocked_waits;
  g_stats.proxy_fences += s.proxy_fences;
}

void on_cta_end() {
  if (!t_cta) return;
  std::unique_ptr<Cta> c = std::move(t_cta);
  merge_stats(c->stats);
  for (size_t wg = 0; wg < c->wgs.size(); ++wg) {
    std::vector<Op*> left = pending_ops(*c, int(wg));
    if (!left.empty())
      throw Error("warpgroup " + std::to_string(wg) + " exited with " + std::to_string(left.size()) +
                  " wgmma.mma_async in flight (the first at " + left.front()->site.str() +
                  "): no wgmma.wait_group retired them");
  }
  if (!c->tmas.empty())
    throw Error("the CTA exited with " + std::to_string(c->tmas.size()) + " TMA copies in flight (the first issued at " +
                c->tmas.front().site.str() + " by " + who(c->tmas.front().tid) + ")");
}

const bool g_registered = [] {
  Extension e;
  e.cta_start = &on_cta_start;
  e.idle = &on_idle;
  e.cta_end = &on_cta_end;
  e.launch_end = [] { g_entry_regs = 0; };  // a declaration holds for its launch
  add_extension(e);
  return true;
}();

}  // namespace
}  // namespace internal

using namespace internal;

uint32_t smem_u32(const void* p, Site site) { return to_shared(cta(), p, 0, "smem_u32", site); }
void* smem_pointer(uint32_t addr, size_t bytes, Site site) { return from_shared(cta(), addr, bytes, "a shared address", site); }

void fence_proxy_async(Site) { ++cta().stats.proxy_fences; }

int named_barrier(int id, int count, int pred, bool reduce, Site site) {
  Cta& c = cta();
  const int tid = thread_rank();
  const char* name = reduce ? "bar.red.or" : "bar.sync";
  if (id < 1 || id > 15)
    throw Error(std::string(name) + " at " + site.str() + " by " + who(tid) + ": barrier id " + std::to_string(id) +
                " (1..15 here; 0 is __syncthreads')");
  if (count <= 0 || count % 32 || count > c.nthreads)
    throw Error(std::string(name) + " at " + site.str() + " by " + who(tid) + ": thread count " +
                std::to_string(count) + " (whole warps, at most the CTA's " + std::to_string(c.nthreads) + ")");
  Named& b = c.named[size_t(id)];
  if (b.arrived == 0) {
    b.count = count;
    b.reduce = reduce;
    b.acc = 0;
    b.site = site;
  } else if (b.count != count || b.reduce != reduce) {
    throw Error(std::string(name) + " " + std::to_string(id) + ", " + std::to_string(count) + " at " + site.str() +
                " by " + who(tid) + " while " + std::to_string(b.arrived) + " threads wait at " +
                (b.reduce ? "bar.red.or " : "bar.sync ") + std::to_string(id) + ", " + std::to_string(b.count) +
                " at " + b.site.str() + " (one barrier, two thread counts or kinds)");
  }
  b.acc |= pred;
  if (++b.arrived < count) {
    const uint64_t gen = b.gen;
    Named* nb = &b;
    wait_until([nb, gen] { return nb->gen != gen; }, std::string(name) + " " + std::to_string(id) + ", " +
               std::to_string(count), site);
    return b.result;
  }
  b.arrived = 0;
  b.result = b.acc;
  ++b.gen;
  return b.result;
}

void setmaxnreg(bool inc, int regs, Site site) {
  if (regs < 24 || regs > 256 || regs % 8)
    throw Error("setmaxnreg at " + site.str() + ": " + std::to_string(regs) + " registers (24..256, multiples of 8)");
  collective(kSetmaxnreg, regs * 2 + (inc ? 1 : 0), site, nullptr, [inc, regs, site](Warpgroup&, int wg) {
    Cta& c = cta();
    if (c.regs.empty()) return;  // the launch declared no registers at entry
    int& held = c.regs[size_t(wg)];
    const std::string what = std::string(inc ? "setmaxnreg.inc " : "setmaxnreg.dec ") + std::to_string(regs) +
                             " (warpgroup " + std::to_string(wg) + ", holding " + std::to_string(held) + " a thread)";
    if (inc ? regs < held : regs > held)
      throw Error(what + " at " + site.str() + ": " + (inc ? ".inc below" : ".dec above") + " the count it holds");
    if (!inc) {
      c.pool += int64_t(held - regs) * 128;
      held = regs;
      return;
    }
    const int64_t need = int64_t(regs - held) * 128;
    Cta* cp = &c;
    if (c.pool < need)
      wait_until([cp, need] { return cp->pool >= need; },
                 what + ", waiting for " + std::to_string(need) + " registers of the CTA's pool, which has " +
                     std::to_string(c.pool),
                 site);
    c.pool -= need;
    held = regs;
  });
}

void registers_at_entry(int regs) { g_entry_regs = regs; }

Stats last_stats() {
  std::lock_guard<std::mutex> lock(g_stats_mutex);
  return g_stats;
}

void reset_stats() {
  std::lock_guard<std::mutex> lock(g_stats_mutex);
  g_stats = Stats{};
}

}  // namespace simt::hopper
