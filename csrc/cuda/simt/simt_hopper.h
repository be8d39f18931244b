// The Hopper primitives of csrc/cuda/sm90/hopper.h in the host SIMT emulation (included at the end of simt.h, so
// force-included ahead of every SIMT source): RSWA_HOPPER_PRIMITIVES makes sm90/hopper.h leave its inline PTX out
// and the same names, in rangeswa::cuda::hopper, run on simt_hopper.cpp, simt_wgmma.cpp and simt_mbarrier_tma.cpp.
// No kernel header names this one.
//
// What is emulated (those files have the details and the PTX ISA sections):
//   smem_u32                   the shared-window address of dynamic shared memory (kSharedBase + offset)
//   wgmma_fence / _commit /    warpgroup collectives (.sync.aligned: all 128 threads of the warpgroup at the
//   _wait<N>, wgmma_ss / _rs   same instruction); mma_async is deferred: it runs at the wait_group that retires
//                              its group, reading shared memory then; the accumulator is poisoned (NaN) in
//                              between, so a read before the wait shows
//   mbarrier_*                 phase, pending arrivals, tx-count; try_wait blocks the thread until the phase
//                              completes (the scheduler reports a deadlock when it never can)
//   tma_load_2d                the box, OOB fill, swizzle of the tensor map; lands (and completes its bytes
//                              on the mbarrier) only when no thread can run otherwise, as late as possible
//   fence_proxy_async_shared,  counted; fence_barrier_init is a no-op
//   setmaxnreg_inc / _dec      a warpgroup collective checking its value; with registers_at_entry, the CTA's
//                              register pool (.inc blocks until the pool has the registers)
//   named_barrier_sync / _or   bar.sync / bar.red.or with an id (1..15) and a thread count: the first `count`
//                              arrivals release each other (a different count at the same id is reported)
//   encode_tensor_map_2d       the host's cuTensorMapEncodeTiled for rank 2 (its checks, an emulation map)
#pragma once

#define RSWA_HOPPER_PRIMITIVES 1

#include <cuda.h>

#include <cstdint>
#include <source_location>

namespace simt::hopper {

// The shared-window address of the dynamic shared memory's first byte in the emulation: 1024-byte aligned
// shared memory is a choice of the kernel (it must align its tiles itself, as on the device).
inline constexpr uint32_t kSharedBase = 0x80;

uint32_t smem_u32(const void* p, Site site);
// The bytes at a shared-window address (smem_u32's inverse), `bytes` of them in the CTA's dynamic shared memory.
void* smem_pointer(uint32_t addr, size_t bytes, Site site);
void wgmma_fence(Site site);
void wgmma_commit(Site site);
void wgmma_wait(int pending, Site site);
// a == nullptr: A from shared memory (desc_a; trans_a 1: M-major); else A's 4 registers. trans_b 1: N-major B.
void wgmma(int n, MmaType type, int trans_a, int trans_b, float* d, const uint32_t* a, uint64_t desc_a, uint64_t desc_b,
           int scale_d, Site site);
void mbarrier_init(uint64_t* bar, uint32_t count, Site site);
void mbarrier_arrive(uint64_t* bar, uint32_t tx_bytes, bool expect_tx, Site site);
bool mbarrier_try_wait_parity(uint64_t* bar, uint32_t parity, Site site);
void fence_proxy_async(Site site);
void tma_load_2d(void* dst, const CUtensorMap* map, int c0, int c1, uint64_t* bar, Site site);
void setmaxnreg(bool inc, int regs, Site site);
// The registers a thread of the next launch's kernel starts with (ptxas's count on the device): its CTAs model
// setmaxnreg's register pool (threads x regs, setmaxnreg.inc blocking until the pool has what it asks). For
// that launch only; a launch with no declaration runs setmaxnreg without the pool.
void registers_at_entry(int regs);
// bar.sync id, count (reduce false) or bar.red.or.pred (reduce true): returns the OR of pred over the threads.
int named_barrier(int id, int count, int pred, bool reduce, Site site);
// A write of generic-proxy data (cp.async) over [dst, dst + bytes) of shared memory: refused while a wgmma in
// flight reads it, or one released early (arrive before its wait) that the writer has waited on.
void check_async_overwrite(const void* dst, size_t bytes, Site site);
CUresult encode_tensor_map_2d(CUtensorMap* map, CUtensorMapDataType type, void* global, uint64_t dim0, uint64_t dim1,
                              uint64_t stride1_bytes, uint32_t box0, uint32_t box1, CUtensorMapSwizzle swizzle,
                              CUtensorMapFloatOOBfill oob_fill);

// The emulated byte address (shared window) of element (mn, k) of the operand a descriptor describes (K-major,
// or MN-major with mn_major), as a wgmma of 16-bit elements reads it (for tests/test_simt_hopper.py; throws
// simt::Error on descriptors the emulation refuses).
uint32_t descriptor_address(uint64_t desc, int mn, int k, bool mn_major);

struct Stats {
  int64_t wgmma = 0, wgmma_groups = 0, tma = 0, tma_bytes = 0, arrivals = 0, phases = 0, blocked_waits = 0,
          proxy_fences = 0;
};
Stats last_stats();  // accumulated since the last reset_stats()
void reset_stats();

}  // namespace simt::hopper

namespace rangeswa::cuda::hopper {

inline uint32_t smem_u32(const void* p, std::source_location site = RSWA_SIMT_HERE) {
  return ::simt::hopper::smem_u32(p, site);
}
// cp_async_16 to a shared-window address (sm90/hopper.h): the emulation's cp.async on the bytes there.
inline void cp_async_16_shared(uint32_t dst, const void* src, bool valid, std::source_location site = RSWA_SIMT_HERE) {
  ::simt::cp_async_16(::simt::hopper::smem_pointer(dst, 16, site), src, valid, site);
}
inline void wgmma_fence(std::source_location site = RSWA_SIMT_HERE) { ::simt::hopper::wgmma_fence(site); }
inline void wgmma_commit(std::source_location site = RSWA_SIMT_HERE) { ::simt::hopper::wgmma_commit(site); }
template <int kPending>
inline void wgmma_wait(std::source_location site = RSWA_SIMT_HERE) {
  static_assert(kPending >= 0 && kPending <= 7, "wgmma.wait_group N: 0..7");
  ::simt::hopper::wgmma_wait(kPending, site);
}
template <int K, typename T>
inline void fence_operand(T (&)[K]) {}

namespace detail {
template <typename E>
constexpr ::simt::MmaType wgmma_type() {
  static_assert(std::is_same_v<E, __nv_bfloat16> || std::is_same_v<E, __half>, "wgmma: bf16 or f16 operands");
  return std::is_same_v<E, __nv_bfloat16> ? ::simt::MmaType::kBF16 : ::simt::MmaType::kF16;
}
}  // namespace detail

template <int N, typename E, int kTransA = 0, int kTransB = 0>
inline void wgmma_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int scale_d,
                     std::source_location site = RSWA_SIMT_HERE) {
  static_assert(N == 16 || N == 32 || N == 64 || N == 72 || N == 80 || N == 88 || N == 128 || N == 136,
                "wgmma: N of 16, 32, 64, 72, 80, 88, 128 or 136");
  ::simt::hopper::wgmma(N, detail::wgmma_type<E>(), kTransA, kTransB, d, nullptr, desc_a, desc_b, scale_d, site);
}
template <int N, typename E, int kTransB = 0>
inline void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b, int scale_d,
                     std::source_location site = RSWA_SIMT_HERE) {
  static_assert(N == 16 || N == 32 || N == 64 || N == 72 || N == 80 || N == 88 || N == 128 || N == 136,
                "wgmma: N of 16, 32, 64, 72, 80, 88, 128 or 136");
  ::simt::hopper::wgmma(N, detail::wgmma_type<E>(), 0, kTransB, d, a, 0, desc_b, scale_d, site);
}

inline void mbarrier_init(uint64_t* bar, uint32_t count, std::source_location site = RSWA_SIMT_HERE) {
  ::simt::hopper::mbarrier_init(bar, count, site);
}
inline void fence_barrier_init() {}
inline void mbarrier_arrive(uint64_t* bar, std::source_location site = RSWA_SIMT_HERE) {
  ::simt::hopper::mbarrier_arrive(bar, 0, false, site);
}
inline void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes, std::source_location site = RSWA_SIMT_HERE) {
  ::simt::hopper::mbarrier_arrive(bar, bytes, true, site);
}
inline bool mbarrier_try_wait_parity(uint64_t* bar, uint32_t parity, std::source_location site = RSWA_SIMT_HERE) {
  return ::simt::hopper::mbarrier_try_wait_parity(bar, parity, site);
}
inline void mbarrier_wait_parity(uint64_t* bar, uint32_t parity, std::source_location site = RSWA_SIMT_HERE) {
  while (!::simt::hopper::mbarrier_try_wait_parity(bar, parity, site)) {
  }
}
inline void fence_proxy_async_shared(std::source_location site = RSWA_SIMT_HERE) {
  ::simt::hopper::fence_proxy_async(site);
}
inline void tma_load_2d(void* dst, const CUtensorMap* map, int c0, int c1, uint64_t* bar,
                        std::source_location site = RSWA_SIMT_HERE) {
  ::simt::hopper::tma_load_2d(dst, map, c0, c1, bar, site);
}
inline void named_barrier_sync(int id, int count, std::source_location site = RSWA_SIMT_HERE) {
  ::simt::hopper::named_barrier(id, count, 0, false, site);
}
inline bool named_barrier_or(int id, int count, bool pred, std::source_location site = RSWA_SIMT_HERE) {
  return ::simt::hopper::named_barrier(id, count, pred ? 1 : 0, true, site) != 0;
}
template <int kRegs>
inline void setmaxnreg_inc(std::source_location site = RSWA_SIMT_HERE) {
  static_assert(kRegs >= 24 && kRegs <= 256 && kRegs % 8 == 0, "setmaxnreg: 24..256, a multiple of 8");
  ::simt::hopper::setmaxnreg(true, kRegs, site);
}
template <int kRegs>
inline void setmaxnreg_dec(std::source_location site = RSWA_SIMT_HERE) {
  static_assert(kRegs >= 24 && kRegs <= 256 && kRegs % 8 == 0, "setmaxnreg: 24..256, a multiple of 8");
  ::simt::hopper::setmaxnreg(false, kRegs, site);
}

// The host's tensor map for a 2D row-major array [dim1][dim0] with rows stride1_bytes apart (the emulation's
// cuTensorMapEncodeTiled; on the device build the driver's is used).
inline CUresult encode_tensor_map_2d(CUtensorMap* map, CUtensorMapDataType type, void* global, uint64_t dim0,
                                     uint64_t dim1, uint64_t stride1_bytes, uint32_t box0, uint32_t box1,
                                     CUtensorMapSwizzle swizzle,
                                     CUtensorMapFloatOOBfill oob_fill = CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) {
  return ::simt::hopper::encode_tensor_map_2d(map, type, global, dim0, dim1, stride1_bytes, box0, box1, swizzle,
                                              oob_fill);
}

}  // namespace rangeswa::cuda::hopper
