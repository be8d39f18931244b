// wgmma in the Hopper primitives' emulation (simt_hopper.h; the shared state in simt_hopper_internal.h). Torch-free.
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
//   real tensor cores round differently). Fragment layouts: sm90/hopper.h's header comment.
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
#include <algorithm>
#include <vector>

#include "cuda/simt/simt_hopper_internal.h"

namespace simt::hopper {
namespace internal {
namespace {

Desc decode(uint64_t d) {
  static const uint32_t widths[4] = {16, 128, 64, 32};
  return Desc{uint32_t(d & 0x3FFF) << 4, uint32_t((d >> 16) & 0x3FFF) << 4, uint32_t((d >> 32) & 0x3FFF) << 4,
              uint32_t((d >> 49) & 7), widths[d >> 62]};
}

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

struct WgArgs {
  float* d;
  const uint32_t* a;
  uint64_t da, db;
  int scale_d;
};

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

}  // namespace

void check_operands_free(Cta& c, int tid, uint32_t lo, uint32_t hi, const char* what, Site site) {
  auto overlaps = [&](const Op& op) {
    return std::any_of(op.reads.begin(), op.reads.end(), [&](uint32_t ch) { return ch >= lo && ch < hi; });
  };
  for (int id : c.threads[size_t(tid)].hazards) {
    const Op& op = *c.ops[size_t(id)];
    if (overlaps(op))
      throw Error(std::string(what) + " at " + site.str() + " by " + who(tid) + " overwrites shared memory that the "
                  "wgmma.mma_async at " + op.site.str() + " (warpgroup " + std::to_string(op.wg) + ") reads, which was "
                  "still in flight when its threads arrived on an mbarrier this thread has waited on since (release "
                  "the stage after wgmma.wait_group)");
  }
  for (size_t wg = 0; wg < c.wgs.size(); ++wg)
    for (const Op* op : pending_ops(c, int(wg)))
      if (overlaps(*op))
        throw Error(std::string(what) + " at " + site.str() + " by " + who(tid) + " overwrites shared memory that the "
                    "wgmma.mma_async at " + op->site.str() + " (warpgroup " + std::to_string(wg) + ") reads and has "
                    "not finished (no wgmma.wait_group retired it)");
}

}  // namespace internal

using namespace internal;

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

void check_async_overwrite(const void* dst, size_t bytes, Site site) {
  if (!t_cta) return;  // no Hopper primitive has run in this CTA
  Cta& c = *t_cta;
  const auto* p = static_cast<const unsigned char*>(dst);
  if (p < c.dyn || p + bytes > c.dyn + c.dyn_size) return;
  const int tid = thread_rank();
  const uint32_t lo = to_shared(c, dst, bytes, "cp.async", site) / 16, hi = lo + uint32_t((bytes + 15) / 16);
  check_operands_free(c, tid, lo, hi, "cp.async", site);
}

uint32_t descriptor_address(uint64_t desc, int mn, int k, bool mn_major) {
  const Desc d = decode(desc);
  check_desc(d, "tested", mn_major, Site("descriptor_address", 0));
  return element_address(d, mn, k, mn_major);
}

}  // namespace simt::hopper
