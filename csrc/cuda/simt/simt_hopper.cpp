// The Hopper primitives of csrc/cuda/hopper.h in the host SIMT emulation (declared in simt_hopper.h). Torch-free.
//
// PTX ISA 8.x sections (docs.nvidia.com/cuda/parallel-thread-execution) and how each is emulated:
//
// wgmma (9.7.15). A warpgroup is 4 consecutive warps (threads 128 w' .. 128 w' + 127). wgmma.fence,
//   commit_group, wait_group and mma_async are .sync.aligned: every thread of the warpgroup executes the same
//   instruction; here each is a warpgroup rendezvous (a thread at a different one, or a missing thread, is
//   reported). mma_async is asynchronous: at issue the emulation records the operation (descriptors, the A
//   registers, the accumulator's addresses and its value as C) and fills the accumulator registers with a NaN
//   (kPoison); the product runs when a wgmma.wait_group retires its group (the latest point PTX allows), reading
//   shared memory then. So an accumulator read before the wait shows as NaN, an accumulator written before the
//   wait is reported, A registers changed before the wait are reported, and shared memory overwritten before
//   the wait changes the result. Consecutive mma_async on the same accumulator chain without a wait (the
//   ordering PTX guarantees for the same shape). wgmma.fence: a thread's mma_async needs a wgmma.fence since
//   its last wait_group (or its start) -- stricter than PTX, which asks for the fence only between other
//   accesses of the registers and the mma_async, but every such access happens after a wait -- and no write
//   of its accumulator or A registers between that fence and the mma_async (the fence takes a copy of the
//   thread's stack, where the kernel's registers live, and the mma_async compares its registers with it; the
//   emulation's own poisoning updates the copy). A registers (the rs form) are poisoned too while their
//   wgmma is in flight (kAPoison, a NaN pair in bf16 and f16: a read before the wait shows as NaN) and given
//   back when the last wgmma in flight that reads them retires; a change of them before then is reported.
//   At issue and when it runs, a wgmma reading shared bytes that a TMA copy or a cp.async (its thread's
//   cp.async.wait_group has not landed it) still writes is reported.
//   Operands: A (64 x 16) and B (16 x N; B[k][n]) of 16-bit elements; D = A B + C with the products exact in
//   fp32 and added to C in fp32 in k order (the order and intermediate precision are the implementation's;
//   real tensor cores round differently). Fragment layouts: hopper.h's header comment.
//   Shared-memory operands: descriptor 9.7.15.5.1.2.2 (start, LBO, SBO, base offset, swizzle), layouts of
//   9.7.15.5.1.2.1 (the canonical layouts, T = 8 elements of 16 bits = 16 bytes). The element (mn, k) lies at
//     K-major  (imm-trans 0), no swizzle: start + (mn / 8) SBO + (2k / 16) LBO + (mn % 8) 16 + 2k % 16
//                             swizzle W:  start + (mn / 8) SBO + (mn % 8) W + 2k                (LBO unused)
//     MN-major (imm-trans 1), no swizzle: start + (mn / 8) SBO + (k / 8) LBO + (k % 8) 16 + 2 (mn % 8)
//                             swizzle W:  start + (mn / (W/2)) LBO + (k / 8) SBO + (k % 8) W + 2 (mn % (W/2))
//   and with a swizzle of W bytes bits [4, 4 + b) of that address XOR bits [7, 7 + b), b = log2(W / 16): the
//   swizzle is a function of the shared-memory address, as TMA's is, so both agree for tiles that start at a
//   multiple of 8 W bytes. Reading of the ISA: the descriptor's base offset (for a start inside a pattern) is
//   refused, and so is a start whose k16 step (K-major) or first row (MN-major) leaves its W-byte row.
// mbarrier (9.7.13.15): phase (its parity), pending arrival count, expected count, tx-count. arrive: pending
//   - 1; arrive.expect_tx: tx-count + bytes, then an arrival; complete_tx (TMA): tx-count - bytes; the phase
//   completes when pending = 0 and tx-count = 0 (then pending = expected, the next phase). try_wait.parity p:
//   true once the current phase's parity differs from p; here the thread blocks until then (the scheduler
//   reports a deadlock if no thread can make it happen). Barriers live in dynamic shared memory.
// cp.async.bulk.tensor.2d (9.7.9.25.5.1) with a tensor map of encode_tensor_map_2d (cuTensorMapEncodeTiled's
//   checks): the box at (c0, c1), elements outside the tensor zero (or NaN with OOB_FILL_NAN), written densely
//   (rows of box0 elements) from dst and swizzled as above (the map's swizzle; reading of the ISA: the row
//   pitch is the box's inner size, at most the swizzle span). A copy is in flight until no thread can run
//   otherwise (or at issue with Options::eager_copies); then it lands and completes its bytes on its mbarrier.
//   Checked: a wgmma reading bytes of a copy in flight, a copy onto bytes an unfinished wgmma reads, a copy
//   onto bytes a wgmma reads that was not complete when its thread arrived on a barrier the copying thread has
//   waited on since (a stage released before wgmma.wait_group), copies overlapping each other.
// fence.proxy.async (9.7.13.4): counted (plain shared-memory stores are not tracked, so a missing one is not
//   detected). setmaxnreg (9.7.19.8): a warpgroup collective; the value in 24..256, a multiple of 8. Where the
//   launcher declares the registers a thread starts with (registers_at_entry: ptxas's count, which the gate
//   holds to the split), the CTA's pool is modelled: .dec gives (held - value) x 128 registers back to it,
//   .inc blocks until it holds (value - held) x 128 (a split the pool cannot feed is a deadlock, reported);
//   .dec above or .inc below the count held is refused.
#include "cuda/simt/simt.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <vector>

namespace simt::hopper {
namespace {

constexpr uint32_t kPoison = 0x7fc0ffeeu;  // a quiet NaN: accumulators of a wgmma in flight
constexpr uint32_t kAPoison = 0x7fff7fffu;  // two NaNs in bf16 and in f16: A registers of a wgmma in flight
constexpr uint32_t kMapMagic = 0x50414d54u;

enum Kind : int { kCommit = 1, kWait = 2, kMma = 3, kSetmaxnreg = 4 };

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

Desc decode(uint64_t d) {
  static const uint32_t widths[4] = {16, 128, 64, 32};
  return Desc{uint32_t(d & 0x3FFF) << 4, uint32_t((d >> 16) & 0x3FFF) << 4, uint32_t((d >> 32) & 0x3FFF) << 4,
              uint32_t((d >> 49) & 7), widths[d >> 62]};
}

uint32_t swizzle(uint32_t u, uint32_t W) { return W <= 16 ? u : u ^ (((u >> 7) & (W / 16 - 1)) << 4); }

// The shared address of element (mn, k) of an operand of 16-bit elements (the header comment).
uint32_t element_address(const Desc& d, int mn, int k, bool mn_major) {
  const uint32_t m = uint32_t(mn), kk = uint32_t(k);
  if (!mn_major) {
    if (d.W == 16) return d.start + (m / 8) * d.sbo + (2 * kk / 16) * d.lbo + (m % 8) * 16 + 2 * kk % 16;
    return swizzle(d.start + (m / 8) * d.sbo + (m % 8) * d.W + 2 * kk, d.W);
  }
  if (d.W == 16) return d.start + (m / 8) * d.sbo + (kk / 8) * d.lbo + (kk % 8) * 16 + 2 * (m % 8);
  const uint32_t per_row = d.W / 2;
  return swizzle(d.start + (m / per_row) * d.lbo + (kk / 8) * d.sbo + (kk % 8) * d.W + 2 * (m % per_row), d.W);
}

void check_desc(const Desc& d, const char* which, bool mn_major, Site site) {
  if (d.W == 16) return;
  if (mn_major && d.start % d.W != 0)
    throw Error("wgmma at " + site.str() + ": the MN-major " + which + " descriptor starts at shared address " +
                hex(d.start) + ", not at the start of a " + std::to_string(d.W) + "-byte swizzle row (not emulated)");
  if (d.base != 0)
    throw Error("wgmma at " + site.str() + ": the " + which + " descriptor has a matrix base offset of " +
                std::to_string(d.base) + "; the emulation runs base offset 0 only (tiles at multiples of the "
                "swizzle pattern, " + std::to_string(8 * d.W) + " bytes)");
  if (d.start % (8 * d.W) >= d.W || d.start % d.W + 32 > d.W)
    throw Error("wgmma at " + site.str() + ": the " + which + " descriptor starts at shared address " +
                hex(d.start) + ", " + std::to_string(d.start % (8 * d.W)) + " bytes into a " +
                std::to_string(d.W) + "-byte swizzle pattern: its k16 step must lie in the pattern's first row "
                "(a start inside the pattern needs the base offset, which the emulation does not run)");
}

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

struct WgArgs {
  float* d;
  const uint32_t* a;
  uint64_t da, db;
  int scale_d;
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

std::atomic<int> g_entry_regs{0};  // registers_at_entry of the launch under way (0: none declared)

thread_local std::unique_ptr<Cta> t_cta;
std::mutex g_stats_mutex;
Stats g_stats;

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

// The warpgroup rendezvous of a .sync.aligned instruction: the last of the 128 threads runs `perform`.
template <typename F>
void collective(int kind, int sub, Site site, void* args, F&& perform) {
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

bool is_poison(const float* p, int count) {
  for (int i = 0; i < count; ++i) {
    uint32_t bits;
    std::memcpy(&bits, p + i, 4);
    if (bits != kPoison) return false;
  }
  return true;
}

void poison(float* p, int count) {
  for (int i = 0; i < count; ++i) std::memcpy(p + i, &kPoison, 4);
}

float to_float(uint16_t bits, MmaType type) {
  if (type == MmaType::kBF16) {
    const uint32_t u = uint32_t(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  __half_raw r;
  r.x = bits;
  return __half2float(__half(r));
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

void check_landed(Cta& c, const Op& op, const char* when) {
  for (uint32_t chunk : op.reads) {
    const size_t i = chunk - kSharedBase / 16;
    if (i < c.inflight.size() && c.inflight[i])
      throw Error("wgmma.mma_async at " + op.site.str() + " (warpgroup " + std::to_string(op.wg) + ", " + when +
                  ") reads shared address " + hex(uint64_t(chunk) * 16) + ", which a TMA copy issued by " +
                  who(c.inflight[i] - 1) + " has not written yet: no mbarrier wait has seen that copy complete");
    if (i < c.inflight.size())
      if (const int copier = cp_async_in_flight(c.dyn + 16 * i))
        throw Error("wgmma.mma_async at " + op.site.str() + " (warpgroup " + std::to_string(op.wg) + ", " + when +
                    ") reads shared address " + hex(uint64_t(chunk) * 16) + ", which a cp.async issued by " +
                    who(copier - 1) + " has not landed: that thread's cp.async.wait_group has not seen it complete");
  }
}

// The bytes [p, p + n) of a thread's stack copy taken at its wgmma.fence (null: outside the copy).
char* at_fence(ThreadState& s, const void* p, size_t n) {
  const char* b = static_cast<const char*>(p);
  if (s.fence_low == nullptr || b < s.fence_low || b + n > s.fence_low + s.at_fence.size()) return nullptr;
  return s.at_fence.data() + (b - s.fence_low);
}

// A register write between the thread's wgmma.fence and this mma_async (PTX: undefined): its accumulator or
// A registers differ from the fence's copy of its stack.
void check_fenced(ThreadState& s, const void* regs, size_t n, const char* what, const std::string& whom, Site site) {
  const char* copy = at_fence(s, regs, n);
  if (copy != nullptr && std::memcmp(copy, regs, n) != 0)
    throw Error("wgmma.mma_async at " + site.str() + " by " + whom + ": its " + what + " registers were written "
                "after its wgmma.fence (PTX asks for the fence between any other access of the registers and the "
                "mma_async that uses them)");
}

// The emulation's own write of registers [p, p + n): the fence's copy follows it.
void follow(ThreadState& s, const void* p, size_t n) {
  if (char* copy = at_fence(s, p, n)) std::memcpy(copy, p, n);
}

// D = A B + C for the 128 threads of the op's warpgroup (the header comment's layouts).
void execute(Cta& c, Op& op) {
  const int nacc = op.n / 2;
  check_landed(c, op, "when it runs");
  if (op.n < 8 || op.n > 256 || op.n % 8 != 0)
    throw Error("wgmma.mma_async at " + op.site.str() + ": N = " + std::to_string(op.n) + " (8..256, a multiple of 8)");
  float A[64][16], B[16][256];  // wgmma's largest N, 256
  if (op.a_regs) {
    const std::vector<Op*> pending = pending_ops(c, op.wg);
    for (int t = 0; t < 128; ++t) {
      for (int r = 0; r < 4; ++r)
        if (op.a_ptr[t][r] != kAPoison)
          throw Error("wgmma.mma_async at " + op.site.str() + ": " + who(op.wg * 128 + t) +
                      " changed its A fragment register a[" + std::to_string(r) +
                      "] before the wgmma.wait_group that retires it");
      // The registers back, unless a later wgmma in flight reads them too.
      const bool shared = std::any_of(pending.begin(), pending.end(), [&](const Op* o) {
        return o != &op && !o->done && o->a_regs && o->a_ptr[t] == op.a_ptr[t];
      });
      if (!shared) std::memcpy(const_cast<uint32_t*>(op.a_ptr[t]), op.a[t], 16);
      const int w = t / 32, g = (t % 32) / 4, q = t % 4;
      for (int r = 0; r < 4; ++r) {
        const int row = 16 * w + g + 8 * (r & 1), col = 2 * q + 8 * (r >> 1);
        A[row][col] = to_float(uint16_t(op.a[t][r] & 0xffffu), op.type);
        A[row][col + 1] = to_float(uint16_t(op.a[t][r] >> 16), op.type);
      }
    }
  } else {
    const Desc da = decode(op.da);
    for (int m = 0; m < 64; ++m)
      for (int k = 0; k < 16; ++k) {
        uint16_t bits;
        std::memcpy(&bits, from_shared(c, element_address(da, m, k, op.trans_a), 2, "wgmma A", op.site), 2);
        A[m][k] = to_float(bits, op.type);
      }
  }
  const Desc db = decode(op.db);
  for (int nn = 0; nn < op.n; ++nn)
    for (int k = 0; k < 16; ++k) {
      uint16_t bits;
      std::memcpy(&bits, from_shared(c, element_address(db, nn, k, op.trans_b), 2, "wgmma B", op.site), 2);
      B[k][nn] = to_float(bits, op.type);
    }
  std::vector<Op*> later = pending_ops(c, op.wg);
  std::vector<float> result(static_cast<size_t>(nacc));
  for (int t = 0; t < 128; ++t) {
    if (!op.chained[t] && !is_poison(op.d[t], nacc))
      throw Error("wgmma.mma_async at " + op.site.str() + ": " + who(op.wg * 128 + t) +
                  " wrote its accumulator registers before the wgmma.wait_group that retires the operation");
    const int w = t / 32, g = (t % 32) / 4, q = t % 4;
    for (int i = 0; i < nacc; ++i) {
      const int row = 16 * w + g + 8 * ((i / 2) % 2), col = 8 * (i / 4) + 2 * q + (i % 2);
      float acc = op.c[size_t(t * nacc + i)];
      for (int k = 0; k < 16; ++k) acc += A[row][k] * B[k][col];
      result[size_t(i)] = acc;
    }
    // A later op on the same accumulator takes this result as its C; the registers stay poisoned for it.
    Op* next = nullptr;
    for (Op* o : later)
      if (o != &op && !o->done && o->d[t] == op.d[t] && o->chained[t] && o->id > op.id) {
        next = o;
        break;
      }
    if (next) {
      for (int i = 0; i < nacc; ++i) next->c[size_t(t * nacc + i)] = next->scale_d ? result[size_t(i)] : 0.f;
      next->chained[t] = false;
    } else {
      std::memcpy(op.d[t], result.data(), size_t(nacc) * 4);
    }
  }
  op.done = true;
}

void complete_if_done(Cta& c, Mbar& b) {
  if (b.pending == 0 && b.tx == 0) {
    ++b.phase;
    b.pending = b.count;
    b.released = std::move(b.early);
    b.early.clear();
    ++c.stats.phases;
  }
}

Mbar& barrier_at(Cta& c, uint64_t* bar, const char* what, Site site) {
  const uint32_t addr = to_shared(c, bar, 8, what, site);
  if (addr % 8) throw Error(std::string(what) + " at " + site.str() + ": mbarrier address " + hex(addr) + " is not 8-byte aligned");
  auto it = c.bars.find(addr);
  if (it == c.bars.end())
    throw Error(std::string(what) + " at " + site.str() + " by " + who(thread_rank()) + ": no mbarrier.init at shared address " +
                hex(addr));
  return it->second;
}

void land(Cta& c, const Tma& t) {
  const MapData& m = t.map;
  const uint32_t W = m.swizzle ? m.swizzle : 16;
  const uint32_t dst = kSharedBase + uint32_t(t.dst - c.dyn);
  unsigned char fill[8] = {0};
  if (m.oob_nan) {
    const uint32_t nan32 = 0x7fc00000u;
    const uint16_t nan16 = m.dtype == CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 ? 0x7fc0 : 0x7e00;
    if (m.esize == 4) std::memcpy(fill, &nan32, 4);
    else std::memcpy(fill, &nan16, 2);
  }
  for (uint32_t r = 0; r < m.box[1]; ++r)
    for (uint32_t e = 0; e < m.box[0]; ++e) {
      const int64_t x = int64_t(t.c0) + e, y = int64_t(t.c1) + r;
      const uint32_t offset = (r * m.box[0] + e) * m.esize;
      unsigned char* out = c.dyn + (swizzle(dst + offset, W) - kSharedBase);
      if (x >= 0 && y >= 0 && uint64_t(x) < m.dim[0] && uint64_t(y) < m.dim[1])
        std::memcpy(out, reinterpret_cast<const unsigned char*>(m.global) + uint64_t(y) * m.stride1 + uint64_t(x) * m.esize,
                    m.esize);
      else
        std::memcpy(out, fill, m.esize);
    }
  const size_t first = (t.dst - c.dyn) / 16;
  for (size_t i = first; i < first + t.bytes / 16; ++i) c.inflight[i] = 0;
  auto it = c.bars.find(t.bar);
  if (it == c.bars.end())
    throw Error("a TMA copy issued at " + t.site.str() + " completed on shared address " + hex(t.bar) +
                ", which holds no mbarrier any more");
  it->second.tx -= int64_t(t.bytes);
  complete_if_done(c, it->second);
}

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

uint32_t smem_u32(const void* p, Site site) { return to_shared(cta(), p, 0, "smem_u32", site); }
void* smem_pointer(uint32_t addr, size_t bytes, Site site) { return from_shared(cta(), addr, bytes, "a shared address", site); }

void wgmma_fence(Site) {
  Cta& c = cta();
  ThreadState& s = c.threads[size_t(thread_rank())];
  s.fenced = true;
  // The caller's frames lie above this one's: its registers as they are at the fence.
  const char* low = static_cast<const char*>(__builtin_frame_address(0));
  const char* high = thread_stack().second;
  s.fence_low = low;
  s.at_fence.assign(low, high);
}

void wgmma_commit(Site site) {
  collective(kCommit, 0, site, nullptr, [](Warpgroup& w, int) {
    w.groups.push_back(std::move(w.uncommitted));
    w.uncommitted.clear();
    ++cta().stats.wgmma_groups;
  });
}

void wgmma_wait(int pending, Site site) {
  collective(kWait, pending, site, nullptr, [pending](Warpgroup& w, int wg) {
    Cta& c = cta();
    while (int(w.groups.size()) > pending) {
      for (int id : w.groups.front()) execute(c, *c.ops[size_t(id)]);
      w.groups.pop_front();
    }
    for (int t = 0; t < 128; ++t) c.threads[size_t(wg * 128 + t)].fenced = false;
  });
}

void wgmma(int n, MmaType type, int trans_a, int trans_b, float* d, const uint32_t* a, uint64_t desc_a,
           uint64_t desc_b, int scale_d, Site site) {
  Cta& c = cta();
  const int tid = thread_rank();
  if (!c.threads[size_t(tid)].fenced)
    throw Error("wgmma.mma_async at " + site.str() + " by " + who(tid) + " without a wgmma.fence since the thread's "
                "last wgmma.wait_group (or its start): PTX asks for wgmma.fence before the first mma_async and "
                "between other accesses of its registers and the mma_async");
  WgArgs args{d, a, desc_a, desc_b, scale_d};
  const int sub = n * 16 + (trans_a ? 8 : 0) + (trans_b ? 4 : 0) + (type == MmaType::kF16 ? 2 : 0) + (a ? 1 : 0);
  collective(kMma, sub, site, &args, [&](Warpgroup& w, int wg) {
    auto op = std::make_unique<Op>();
    op->id = int(c.ops.size());
    op->n = n;
    op->wg = wg;
    op->type = type;
    op->a_regs = a != nullptr;
    op->trans_a = trans_a != 0;
    op->trans_b = trans_b != 0;
    op->site = site;
    const WgArgs& first = *static_cast<WgArgs*>(w.args[0]);
    op->da = first.da;
    op->db = first.db;
    op->scale_d = first.scale_d;
    for (int t = 0; t < 128; ++t) {
      const WgArgs& x = *static_cast<WgArgs*>(w.args[t]);
      if (x.db != first.db || (!a && x.da != first.da) || (x.scale_d != 0) != (first.scale_d != 0))
        throw Error("wgmma.mma_async at " + site.str() + ": " + who(wg * 128 + t) +
                    " gives other descriptors or scale-d than thread " + std::to_string(wg * 128) +
                    " (they are one instruction's operands: uniform over the warpgroup)");
    }
    // The shared memory it reads: every element's 16-byte chunk.
    const Desc db = decode(op->db);
    check_desc(db, "B", op->trans_b, site);
    std::vector<uint32_t> reads;
    for (int nn = 0; nn < n; ++nn)
      for (int k = 0; k < 16; ++k) {
        const uint32_t addr = element_address(db, nn, k, op->trans_b);
        from_shared(c, addr, 2, "wgmma B", site);
        reads.push_back(addr / 16);
      }
    if (!a) {
      const Desc da = decode(op->da);
      check_desc(da, "A", op->trans_a, site);
      for (int m = 0; m < 64; ++m)
        for (int k = 0; k < 16; ++k) {
          const uint32_t addr = element_address(da, m, k, op->trans_a);
          from_shared(c, addr, 2, "wgmma A", site);
          reads.push_back(addr / 16);
        }
    }
    std::sort(reads.begin(), reads.end());
    reads.erase(std::unique(reads.begin(), reads.end()), reads.end());
    op->reads = std::move(reads);
    check_landed(c, *op, "at issue");
    const std::vector<Op*> before = pending_ops(c, wg);
    const int nacc = n / 2;
    for (int t = 0; t < 128; ++t) {
      const WgArgs& x = *static_cast<WgArgs*>(w.args[t]);
      ThreadState& s = c.threads[size_t(wg * 128 + t)];
      check_fenced(s, x.d, size_t(nacc) * 4, "accumulator", who(wg * 128 + t), site);
      if (a) check_fenced(s, x.a, 16, "A fragment", who(wg * 128 + t), site);
    }
    op->c.assign(size_t(128 * nacc), 0.f);
    for (int t = 0; t < 128; ++t) {
      const WgArgs& x = *static_cast<WgArgs*>(w.args[t]);
      op->d[t] = x.d;
      op->chained[t] = false;
      for (const Op* p : before) {
        const float* pd = p->d[t];
        if (pd == x.d) {
          if (p->n != n)
            throw Error("wgmma.mma_async at " + site.str() + " (m64n" + std::to_string(n) + ") by " +
                        who(wg * 128 + t) + " accumulates into the registers of the m64n" + std::to_string(p->n) +
                        " at " + p->site.str() + ", still in flight (only the same shape is ordered)");
          op->chained[t] = true;
        } else if (pd < x.d + nacc && x.d < pd + p->n / 2) {
          throw Error("wgmma.mma_async at " + site.str() + " by " + who(wg * 128 + t) +
                      " accumulates into registers that overlap those of the wgmma at " + p->site.str() +
                      ", still in flight");
        }
      }
      ThreadState& s = c.threads[size_t(wg * 128 + t)];
      if (!op->chained[t]) {
        for (int i = 0; i < nacc; ++i) op->c[size_t(t * nacc + i)] = op->scale_d ? x.d[i] : 0.f;
        poison(x.d, nacc);
        follow(s, x.d, size_t(nacc) * 4);
      }
      if (a) {
        // Registers that a wgmma in flight already reads hold kAPoison: their values are that one's.
        const Op* reader = nullptr;
        for (const Op* p : before)
          if (p->a_regs && p->a_ptr[t] == x.a) reader = p;
        op->a_ptr[t] = x.a;
        for (int r = 0; r < 4; ++r) op->a[t][r] = reader != nullptr ? reader->a[t][r] : x.a[r];
        uint32_t* regs = const_cast<uint32_t*>(x.a);
        for (int r = 0; r < 4; ++r) regs[r] = kAPoison;
        follow(s, x.a, 16);
      }
    }
    w.uncommitted.push_back(op->id);
    c.ops.push_back(std::move(op));
    ++c.stats.wgmma;
  });
}

void mbarrier_init(uint64_t* bar, uint32_t count, Site site) {
  Cta& c = cta();
  const uint32_t addr = to_shared(c, bar, 8, "mbarrier.init", site);
  if (addr % 8) throw Error("mbarrier.init at " + site.str() + ": address " + hex(addr) + " is not 8-byte aligned");
  if (count == 0 || count >= (1u << 20))
    throw Error("mbarrier.init at " + site.str() + ": expected arrival count " + std::to_string(count) +
                " outside 1..2^20-1");
  Mbar& b = c.bars[addr];
  b = Mbar{};
  b.count = b.pending = count;
  b.site = site;
  std::memset(bar, 0, 8);
}

void mbarrier_arrive(uint64_t* bar, uint32_t tx_bytes, bool expect_tx, Site site) {
  Cta& c = cta();
  const int tid = thread_rank();
  Mbar& b = barrier_at(c, bar, expect_tx ? "mbarrier.arrive.expect_tx" : "mbarrier.arrive", site);
  if (b.pending == 0)
    throw Error("mbarrier.arrive at " + site.str() + " by " + who(tid) + ": the current phase has no pending arrival left");
  if (expect_tx) {
    b.tx += int64_t(tx_bytes);
    if (b.tx >= (int64_t(1) << 20))
      throw Error("mbarrier.arrive.expect_tx at " + site.str() + ": tx-count " + std::to_string(b.tx) +
                  " exceeds 2^20 - 1");
  }
  // The arriving thread's wgmma operations still in flight: a copy by a thread that waits on this phase must
  // not overwrite what they read.
  if (tid / 128 < int(c.wgs.size()))
    for (const Op* p : pending_ops(c, tid / 128))
      if (std::find(b.early.begin(), b.early.end(), p->id) == b.early.end()) b.early.push_back(p->id);
  --b.pending;
  ++c.stats.arrivals;
  complete_if_done(c, b);
}

bool mbarrier_try_wait_parity(uint64_t* bar, uint32_t parity, Site site) {
  Cta& c = cta();
  const int tid = thread_rank();
  Mbar& b = barrier_at(c, bar, "mbarrier.try_wait.parity", site);
  if (parity > 1) throw Error("mbarrier.try_wait.parity at " + site.str() + ": parity " + std::to_string(parity));
  if ((b.phase & 1) == parity) {
    ++c.stats.blocked_waits;
    Mbar* p = &b;
    wait_until([p, parity] { return (p->phase & 1) != parity; },
               "mbarrier.try_wait.parity " + std::to_string(parity) + " (barrier at shared " +
                   hex(kSharedBase + uint32_t(reinterpret_cast<unsigned char*>(bar) - c.dyn)) + ", in phase " +
                   std::to_string(b.phase) + ")",
               site);
  }
  std::vector<int>& h = c.threads[size_t(tid)].hazards;
  for (int id : b.released)
    if (std::find(h.begin(), h.end(), id) == h.end()) h.push_back(id);
  return true;
}

void fence_proxy_async(Site) { ++cta().stats.proxy_fences; }

void tma_load_2d(void* dst, const CUtensorMap* map, int c0, int c1, uint64_t* bar, Site site) {
  Cta& c = cta();
  const int tid = thread_rank();
  MapData m;
  std::memcpy(&m, map, sizeof m);
  if (m.magic != kMapMagic)
    throw Error("cp.async.bulk.tensor at " + site.str() + " by " + who(tid) +
                ": the tensor map was not made by encode_tensor_map_2d");
  const uint32_t bytes = m.box[0] * m.box[1] * m.esize;
  const uint32_t addr = to_shared(c, dst, bytes, "cp.async.bulk.tensor", site);
  if (addr % 128)
    throw Error("cp.async.bulk.tensor at " + site.str() + ": shared destination " + hex(addr) + " is not 128-byte aligned");
  barrier_at(c, bar, "cp.async.bulk.tensor (its mbarrier)", site);
  const uint32_t lo = addr / 16, hi = (addr + bytes) / 16;
  auto overlaps = [&](const Op& op) {
    return std::any_of(op.reads.begin(), op.reads.end(), [&](uint32_t ch) { return ch >= lo && ch < hi; });
  };
  for (int id : c.threads[size_t(tid)].hazards) {
    const Op& op = *c.ops[size_t(id)];
    if (overlaps(op))
      throw Error("cp.async.bulk.tensor at " + site.str() + " by " + who(tid) + " overwrites shared memory that the "
                  "wgmma.mma_async at " + op.site.str() + " (warpgroup " + std::to_string(op.wg) + ") reads, which was "
                  "still in flight when its threads arrived on an mbarrier this thread has waited on since (release "
                  "the stage after wgmma.wait_group)");
  }
  for (size_t wg = 0; wg < c.wgs.size(); ++wg)
    for (const Op* op : pending_ops(c, int(wg)))
      if (overlaps(*op))
        throw Error("cp.async.bulk.tensor at " + site.str() + " by " + who(tid) + " overwrites shared memory that the "
                    "wgmma.mma_async at " + op->site.str() + " (warpgroup " + std::to_string(wg) + ") reads and has "
                    "not finished (no wgmma.wait_group retired it)");
  const size_t first = (addr - kSharedBase) / 16;
  for (size_t i = first; i < first + bytes / 16; ++i)
    if (c.inflight[i])
      throw Error("cp.async.bulk.tensor at " + site.str() + " by " + who(tid) + " writes shared address " +
                  hex(uint64_t(kSharedBase) + 16 * i) + ", which another TMA copy (issued by " +
                  who(c.inflight[i] - 1) + ") is still writing");
  for (size_t i = first; i < first + bytes / 16; ++i) c.inflight[i] = tid + 1;
  c.tmas.push_back(Tma{static_cast<unsigned char*>(dst), m, c0, c1, to_shared(c, bar, 8, "cp.async.bulk.tensor", site),
                       bytes, site, tid});
  ++c.stats.tma;
  c.stats.tma_bytes += bytes;
  if (options().eager_copies) {
    const Tma t = c.tmas.back();
    c.tmas.pop_back();
    land(c, t);
  }
}

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

void check_async_overwrite(const void* dst, size_t bytes, Site site) {
  if (!t_cta) return;  // no Hopper primitive has run in this CTA
  Cta& c = *t_cta;
  const auto* p = static_cast<const unsigned char*>(dst);
  if (p < c.dyn || p + bytes > c.dyn + c.dyn_size) return;
  const int tid = thread_rank();
  const uint32_t lo = to_shared(c, dst, bytes, "cp.async", site) / 16, hi = lo + uint32_t((bytes + 15) / 16);
  auto overlaps = [&](const Op& op) {
    return std::any_of(op.reads.begin(), op.reads.end(), [&](uint32_t ch) { return ch >= lo && ch < hi; });
  };
  for (int id : c.threads[size_t(tid)].hazards)
    if (overlaps(*c.ops[size_t(id)]))
      throw Error("cp.async at " + site.str() + " by " + who(tid) + " overwrites shared memory that the wgmma.mma_async "
                  "at " + c.ops[size_t(id)]->site.str() + " reads, which was still in flight when its threads arrived "
                  "on an mbarrier this thread has waited on since (release the stage after wgmma.wait_group)");
  for (size_t wg = 0; wg < c.wgs.size(); ++wg)
    for (const Op* op : pending_ops(c, int(wg)))
      if (overlaps(*op))
        throw Error("cp.async at " + site.str() + " by " + who(tid) + " overwrites shared memory that the "
                    "wgmma.mma_async at " + op->site.str() + " (warpgroup " + std::to_string(wg) + ") reads and has "
                    "not finished (no wgmma.wait_group retired it)");
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

CUresult encode_tensor_map_2d(CUtensorMap* map, CUtensorMapDataType type, void* global, uint64_t dim0, uint64_t dim1,
                              uint64_t stride1_bytes, uint32_t box0, uint32_t box1, CUtensorMapSwizzle swizzle_mode,
                              CUtensorMapFloatOOBfill oob_fill) {
  uint32_t esize = 0;
  bool is_float = false;
  switch (type) {
    case CU_TENSOR_MAP_DATA_TYPE_UINT8: esize = 1; break;
    case CU_TENSOR_MAP_DATA_TYPE_UINT16: esize = 2; break;
    case CU_TENSOR_MAP_DATA_TYPE_UINT32:
    case CU_TENSOR_MAP_DATA_TYPE_INT32: esize = 4; break;
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT16:
    case CU_TENSOR_MAP_DATA_TYPE_BFLOAT16: esize = 2; is_float = true; break;
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT32: esize = 4; is_float = true; break;
    default: return CUDA_ERROR_NOT_SUPPORTED;
  }
  uint32_t W = 0;
  switch (swizzle_mode) {
    case CU_TENSOR_MAP_SWIZZLE_NONE: W = 0; break;
    case CU_TENSOR_MAP_SWIZZLE_32B: W = 32; break;
    case CU_TENSOR_MAP_SWIZZLE_64B: W = 64; break;
    case CU_TENSOR_MAP_SWIZZLE_128B: W = 128; break;
    default: return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (reinterpret_cast<uintptr_t>(map) % 64 || reinterpret_cast<uintptr_t>(global) % 16) return CUDA_ERROR_INVALID_VALUE;
  if (dim0 == 0 || dim1 == 0 || dim0 > (uint64_t(1) << 32) || dim1 > (uint64_t(1) << 32)) return CUDA_ERROR_INVALID_VALUE;
  if (stride1_bytes % 16 || stride1_bytes >= (uint64_t(1) << 40) || stride1_bytes < dim0 * esize)
    return CUDA_ERROR_INVALID_VALUE;
  if (box0 == 0 || box1 == 0 || box0 > 256 || box1 > 256 || (box0 * esize) % 16) return CUDA_ERROR_INVALID_VALUE;
  if (W && box0 * esize > W) return CUDA_ERROR_INVALID_VALUE;
  if (oob_fill == CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA && !is_float) return CUDA_ERROR_INVALID_VALUE;
  MapData m{};
  m.magic = kMapMagic;
  m.esize = esize;
  m.global = reinterpret_cast<uint64_t>(global);
  m.dim[0] = dim0;
  m.dim[1] = dim1;
  m.stride1 = stride1_bytes;
  m.box[0] = box0;
  m.box[1] = box1;
  m.swizzle = W;
  m.oob_nan = oob_fill == CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA;
  m.dtype = uint32_t(type);
  std::memset(map, 0, sizeof(CUtensorMap));
  std::memcpy(map, &m, sizeof m);
  return CUDA_SUCCESS;
}

uint32_t descriptor_address(uint64_t desc, int mn, int k, bool mn_major) {
  const Desc d = decode(desc);
  check_desc(d, "tested", mn_major, Site("descriptor_address", 0));
  return element_address(d, mn, k, mn_major);
}

Stats last_stats() {
  std::lock_guard<std::mutex> lock(g_stats_mutex);
  return g_stats;
}

void reset_stats() {
  std::lock_guard<std::mutex> lock(g_stats_mutex);
  g_stats = Stats{};
}

}  // namespace simt::hopper
