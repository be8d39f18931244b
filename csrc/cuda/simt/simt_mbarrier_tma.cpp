// mbarriers and TMA copies in the Hopper primitives' emulation (simt_hopper.h; the shared state in
// simt_hopper_internal.h). Torch-free.
//
// PTX ISA 8.x sections (docs.nvidia.com/cuda/parallel-thread-execution) and how each is emulated:
//
// mbarrier (9.7.13.15): phase (its parity), pending arrival count, expected count, tx-count. arrive: pending
//   - 1; arrive.expect_tx: tx-count + bytes, then an arrival; complete_tx (TMA): tx-count - bytes; the phase
//   completes when pending = 0 and tx-count = 0 (then pending = expected, the next phase). try_wait.parity p:
//   true once the current phase's parity differs from p; here the thread blocks until then (the scheduler
//   reports a deadlock if no thread can make it happen). Barriers live in dynamic shared memory.
// cp.async.bulk.tensor.2d (9.7.9.25.5.1) with a tensor map of encode_tensor_map_2d (cuTensorMapEncodeTiled's
//   checks): the box at (c0, c1), elements outside the tensor zero (or NaN with OOB_FILL_NAN), written densely
//   (rows of box0 elements) from dst and swizzled as simt_wgmma.cpp's header says (the map's swizzle; reading
//   of the ISA: the row pitch is the box's inner size, at most the swizzle span). A copy is in flight until no
//   thread can run otherwise (or at issue with Options::eager_copies); then it lands and completes its bytes on
//   its mbarrier.
//   Checked: a wgmma reading bytes of a copy in flight, a copy onto bytes an unfinished wgmma reads, a copy
//   onto bytes a wgmma reads that was not complete when its thread arrived on a barrier the copying thread has
//   waited on since (a stage released before wgmma.wait_group), copies overlapping each other.
#include <algorithm>

#include "cuda/simt/simt_hopper_internal.h"

namespace simt::hopper {
namespace internal {
namespace {

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

}  // namespace

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

}  // namespace internal

using namespace internal;

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
  check_operands_free(c, tid, addr / 16, (addr + bytes) / 16, "cp.async.bulk.tensor", site);
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


}  // namespace simt::hopper
