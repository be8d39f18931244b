// Host SIMT emulation of the CUDA kernels: the kernel source compiled by a host C++ compiler (g++) and run
// with one fiber per CUDA thread (simt_runtime.h). The SIMT build force-includes this header (g++ -include, with
// -DRANGESWA_SIMT) ahead of every source: it defines RSWA_DEVICE_PRIMITIVES, so utils.h leaves out its
// inline-PTX device primitives and the kernel headers, included as usual, run on these (see
// csrc/cuda/simt/README.md). No kernel header names this one.
//
// What is emulated, and how exactly (PTX ISA 8.x section numbers; docs.nvidia.com/cuda/parallel-thread-execution):
//   threadIdx / blockIdx / blockDim / gridDim      the calling fiber's CUDA thread
//   __syncthreads(), __syncthreads_or/_and/_count  a CTA barrier (bar.sync 0 / bar.red.{or,and,popc}, 9.7.13.1)
//   __syncwarp(), __shfl_sync / __shfl_xor_sync     warp rendezvous (bar.warp.sync 9.7.13.2, shfl.sync 9.7.9.6)
//   __any_sync / __all_sync, __reduce_min/max_sync  vote.sync.{any,all}.pred (9.7.13.4), redux.sync (9.7.13.10)
//   ldmatrix_x4[_trans]                             ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 (9.7.14.5.15)
//   mma_16816<bf16 / half>                          mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{..}.f32
//                                                   (9.7.14.5.14, fragments 9.7.14.5.8)
//   cp_async_16 / _commit / _wait_all / _wait_group cp.async.cg.shared.global 16 (9.7.9.25.3), commit_group,
//                                                   wait_group n: copies land at the wait, as late as PTX allows
//   exp2_approx, __fdividef, __log2f                ex2.approx.ftz.f32, div.approx.f32, lg2.approx.ftz.f32
// Every warp collective waits until all 32 lanes of the warp arrive at the same collective; a CTA barrier
// waits for every thread of the CTA. Misuse (lanes at different collectives, a lane or thread that exited,
// a deadlock, misaligned or out-of-shared-memory addresses, cp.async data read before it landed and a CTA
// barrier published it) throws simt::Error from simt::launch; nothing hangs.
#pragma once

#if !defined(RANGESWA_SIMT)
#error "simt.h is the host SIMT emulation of the device primitives: define RANGESWA_SIMT"
#endif
// utils.h: the device primitives are defined here.
#define RSWA_DEVICE_PRIMITIVES 1

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>  // before the built-in macros below (it declares gridDim etc.)
#include <vector_functions.h>
#include <vector_types.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <source_location>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

// CUDA attributes that the host compiler does not know (host_defines.h leaves these to nvcc).
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif
#ifndef __grid_constant__
#define __grid_constant__
#endif

namespace simt {

// What went wrong in an emulated launch (misuse of a collective, deadlock, bad address, ...).
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A source location: the call site of a primitive (default arguments evaluate at the caller).
struct Site {
  const char* file;
  int line;
  Site(const char* f, int l) : file(f), line(l) {}
  Site(const std::source_location& l) : file(l.file_name()), line(int(l.line())) {}  // NOLINT: implicit
  bool operator==(const Site& o) const { return line == o.line && (file == o.file || std::strcmp(file, o.file) == 0); }
  std::string str() const;
};

// The caller's location: a std::source_location default argument is evaluated at the call site.
#define RSWA_SIMT_HERE std::source_location::current()

enum class Barrier : int { kSync = 0, kOr = 1, kAnd = 2, kCount = 3 };
enum class Shfl : int { kIdx = 0, kXor = 1, kUp = 2, kDown = 3 };
enum class MmaType : int { kBF16 = 0, kF16 = 1 };

struct Options {
  int workers = 0;                     // OS threads running CTAs (0: RANGESWA_SIMT_THREADS or the hardware's)
  size_t stack_bytes = 256 * 1024;     // per fiber (one per CUDA thread); a guard page below each
  size_t max_shared_bytes = 232448;    // dynamic + static shared memory per CTA (sm_90: 227 KB)
  bool poison_shared = true;           // fill shared memory with 0xff bytes (NaN / -1) at CTA start
  bool check_races = true;             // cp.async vs ldmatrix ordering checks (see simt_shared.cpp)
  bool eager_copies = false;           // cp.async lands at issue (default: at the wait, the latest PTX allows)
  uint64_t schedule_seed = 0;          // 0: threads run in order; else a random order per scheduling pass
  bool guard_global = true;            // the attn op runs on copies of its arrays that end at a PROT_NONE page
};

// A copy of `bytes` of `data` placed so that it ends (rounded up to 16 bytes) at an inaccessible page: a read or
// write past its end faults, and the fault is reported as an illegal memory access of the thread.
class GuardedCopy {
 public:
  GuardedCopy(const void* data, size_t bytes);
  ~GuardedCopy();
  GuardedCopy(const GuardedCopy&) = delete;
  GuardedCopy& operator=(const GuardedCopy&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  void* map_ = nullptr;
  size_t mapped_ = 0, bytes_ = 0;
  void* data_ = nullptr;
};
Options& options();

// ---- the calling fiber's CUDA thread (valid inside a launch only) ------------------------------------------
uint3 thread_idx();
uint3 block_idx();
dim3 block_dim();
dim3 grid_dim();

// ---- collectives (simt_warp.cpp, simt_shared.cpp, simt.cpp) -------------------------------------------------
int barrier(Barrier kind, int predicate, Site site);
void syncwarp(unsigned mask, Site site);
uint32_t shfl(Shfl mode, unsigned mask, uint32_t value, int lane_arg, int width, Site site);
void ldmatrix_x4(uint32_t (&r)[4], const void* smem, bool trans, Site site);
void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, MmaType type, Site site);
void cp_async_16(void* smem, const void* gmem, bool valid, Site site);
void cp_async_commit();
void cp_async_wait_all(Site site);
void cp_async_wait_group(int pending, Site site);
unsigned char* dynamic_shared();
void* static_shared(const void* key, size_t bytes, size_t align);

// Throws simt::Error with the printf-formatted message (RSWA_DEVICE_FAIL).
[[noreturn]] void device_fail(const char* format, ...);

// ---- launches ----------------------------------------------------------------------------------------------
// Runs `body` once per CUDA thread of every CTA of the grid: block (x, y, z) threads per CTA, one fiber each,
// `dynamic_smem_bytes` of dynamic shared memory per CTA. Throws simt::Error (naming the CTA and the threads)
// when the kernel misuses a primitive, deadlocks, or throws.
void launch_body(dim3 grid, dim3 block, size_t dynamic_smem_bytes, const std::function<void()>& body);

// simt::launch(grid, block_threads, dynamic_smem_bytes, kernel, params...): kernel<<<grid, block, smem>>>(params...)
// The parameters are copied once and passed to every thread (by value, as the kernel declares them).
template <typename Kernel, typename... Params>
void launch(dim3 grid, dim3 block, size_t dynamic_smem_bytes, Kernel kernel, const Params&... params) {
  const std::tuple<Params...> args(params...);
  launch_body(grid, block, dynamic_smem_bytes, [&] { std::apply(kernel, args); });
}

// Statistics of the last launch on this OS thread (for timing and tests).
struct Stats {
  int64_t ctas = 0, switches = 0, warp_collectives = 0, barriers = 0, mmas = 0, ldmatrix = 0, cp_async = 0;
};
Stats last_stats();

// ---- extensions (the hopper emulation, simt_hopper.cpp) --------------------------------------------------------
// Hooks run on the worker's OS thread: cta_start before a CTA's threads start (reset per-CTA state); idle when
// no thread can run (return true after making progress, e.g. landing an asynchronous copy, false to let the
// deadlock be reported); cta_end after every thread exited (throw simt::Error for state left behind).
struct Extension {
  void (*cta_start)() = nullptr;
  bool (*idle)() = nullptr;
  void (*cta_end)() = nullptr;
  void (*launch_end)() = nullptr;  // after the launch's last CTA (on the launching thread)
};
void add_extension(const Extension& e);  // at library load, before any launch
std::vector<Extension>& extensions();
size_t dynamic_shared_bytes();   // of the calling thread's CTA
int thread_rank();               // the calling thread's linear index in its CTA
int block_threads();             // threads of the calling thread's CTA
// A cp.async in flight (not landed by its thread's cp.async.wait_group) onto the 16 bytes of dynamic shared
// memory at `shared`, in the calling thread's CTA: the issuing thread + 1, or 0 (none, or Options::check_races off).
int cp_async_in_flight(const void* shared);
// The calling thread's stack [low, high): its registers (the kernel's locals) live there.
std::pair<const char*, const char*> thread_stack();
// Blocks the calling thread until ready() holds (evaluated by the scheduler, on this OS thread, whenever it
// passes the thread); a state where nothing can run reports the thread as waiting at `what` at `site`.
void wait_until(const std::function<bool()>& ready, const std::string& what, Site site);

}  // namespace simt

// ---- launches as the kernels' launchers write them (utils.h RSWA_LAUNCH / RSWA_OPT_IN_SMEM) ------------------------
// The stream is ignored (launches run to completion, in order); a misuse throws simt::Error, so a launch
// that returns gives cudaSuccess. Opting in to more shared memory than Options::max_shared_bytes is refused
// as the device refuses it.
#define RSWA_LAUNCH(kernel, grid, block, smem, stream, ...) \
  ((void)(stream), ::simt::launch(dim3(grid), dim3(block), size_t(smem), kernel, __VA_ARGS__), cudaSuccess)
#define RSWA_OPT_IN_SMEM(kernel, bytes) \
  ((void)(kernel), size_t(bytes) <= ::simt::options().max_shared_bytes ? cudaSuccess : cudaErrorInvalidValue)
// A device-side assertion (utils.h) as a simt::Error naming the thread, with the kernel's message.
#define RSWA_DEVICE_FAIL(...) ::simt::device_fail(__VA_ARGS__)
// Grids of at most two CTA rows (the hardware allows 65535, utils.h): kernels that stride over KV heads by
// gridDim.y take that loop on every emulated grid of more than two heads.
#define RSWA_MAX_GRID_Y 2

// ---- the CUDA built-ins --------------------------------------------------------------------------------------
#define threadIdx (::simt::thread_idx())
#define blockIdx (::simt::block_idx())
#define blockDim (::simt::block_dim())
#define gridDim (::simt::grid_dim())

inline void __syncthreads(std::source_location site = RSWA_SIMT_HERE) { ::simt::barrier(::simt::Barrier::kSync, 0, site); }
inline int __syncthreads_or(int p, std::source_location site = RSWA_SIMT_HERE) {
  return ::simt::barrier(::simt::Barrier::kOr, p != 0, site);
}
inline int __syncthreads_and(int p, std::source_location site = RSWA_SIMT_HERE) {
  return ::simt::barrier(::simt::Barrier::kAnd, p != 0, site);
}
inline int __syncthreads_count(int p, std::source_location site = RSWA_SIMT_HERE) {
  return ::simt::barrier(::simt::Barrier::kCount, p != 0, site);
}
inline void __syncwarp(unsigned mask = 0xffffffffu, std::source_location site = RSWA_SIMT_HERE) {
  ::simt::syncwarp(mask, site);
}

namespace simt::detail {
template <typename T>
inline T shuffle(Shfl mode, unsigned mask, T var, int arg, int width, Site site) {
  static_assert(sizeof(T) == 4 && std::is_trivially_copyable_v<T>, "32-bit shuffles only");
  uint32_t bits;
  std::memcpy(&bits, &var, 4);
  bits = ::simt::shfl(mode, mask, bits, arg, width, site);
  T out;
  std::memcpy(&out, &bits, 4);
  return out;
}
}  // namespace simt::detail

template <typename T>
inline T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32, std::source_location site = RSWA_SIMT_HERE) {
  return ::simt::detail::shuffle(::simt::Shfl::kIdx, mask, var, src_lane, width, site);
}
template <typename T>
inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32,
                         std::source_location site = RSWA_SIMT_HERE) {
  return ::simt::detail::shuffle(::simt::Shfl::kXor, mask, var, lane_mask, width, site);
}
template <typename T>
inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32, std::source_location site = RSWA_SIMT_HERE) {
  return ::simt::detail::shuffle(::simt::Shfl::kUp, mask, var, int(delta), width, site);
}
template <typename T>
inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32,
                          std::source_location site = RSWA_SIMT_HERE) {
  return ::simt::detail::shuffle(::simt::Shfl::kDown, mask, var, int(delta), width, site);
}

// vote.sync.any.pred: whether the predicate holds in some lane of `mask`, every lane of the mask
// participating (a butterfly of shuffles, so a lane missing from the vote is reported as a shuffle's).
inline int __any_sync(unsigned mask, int predicate, std::source_location site = RSWA_SIMT_HERE) {
  uint32_t any = predicate != 0;
  for (int x = 1; x < 32; x *= 2) any |= ::simt::shfl(::simt::Shfl::kXor, mask, any, x, 32, site);
  return int(any);
}

// vote.sync.all.pred: whether the predicate holds in every lane of `mask` (the same butterfly).
inline int __all_sync(unsigned mask, int predicate, std::source_location site = RSWA_SIMT_HERE) {
  uint32_t all = predicate != 0;
  for (int x = 1; x < 32; x *= 2) all &= ::simt::shfl(::simt::Shfl::kXor, mask, all, x, 32, site);
  return int(all);
}

// redux.sync.{min,max}.s32: the least / greatest value over the lanes of `mask` (every lane of it
// participating; a butterfly of shuffles, so a lane missing is reported as a shuffle's).
inline int __reduce_min_sync(unsigned mask, int value, std::source_location site = RSWA_SIMT_HERE) {
  for (int x = 1; x < 32; x *= 2)
    value = std::min(value, int(::simt::shfl(::simt::Shfl::kXor, mask, uint32_t(value), x, 32, site)));
  return value;
}
inline int __reduce_max_sync(unsigned mask, int value, std::source_location site = RSWA_SIMT_HERE) {
  for (int x = 1; x < 32; x *= 2)
    value = std::max(value, int(::simt::shfl(::simt::Shfl::kXor, mask, uint32_t(value), x, 32, site)));
  return value;
}

// Fast-math intrinsics (CUDA Math API "Single Precision Intrinsics").
// __fdividef: div.approx.f32; for 2^126 < |y| < 2^128 it returns 0 (and NaN for an infinite x there).
inline float __fdividef(float x, float y) {
  const float ay = std::fabs(y);
  if (ay > 0x1p126f && ay < INFINITY) return std::isinf(x) ? NAN : 0.f;
  return x / y;
}
namespace simt::detail {
inline float ftz(float x) { return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.f, x) : x; }
// lg2.approx.ftz.f32: subnormal inputs flushed to (signed) zero, so they give -inf.
inline float lg2_approx_ftz(float x) { return std::log2(ftz(x)); }
}  // namespace simt::detail
// glibc's math.h declares a __log2f it does not export: the intrinsic is a macro here.
#define __log2f(x) (::simt::detail::lg2_approx_ftz(x))
inline float __expf(float x) { return std::exp(x); }
// Double-precision intrinsics with round-to-nearest and no contraction (the operations the host performs).
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline float __logf(float x) { return std::log(x); }

// ---- shared memory ----------------------------------------------------------------------------------------------
// The CTA's dynamic shared memory (16-byte aligned, the size given at launch), and a shared variable of the CTA:
// the same object for every thread of the CTA, keyed by the declaration (a function-local static's address).
#define RSWA_DYNAMIC_SHARED(name) unsigned char* name = ::simt::dynamic_shared()
#define RSWA_STATIC_SHARED(type, name)                                                                  \
  static const char rswa_simt_key_##name = 0;                                                           \
  type& name = *static_cast<type*>(::simt::static_shared(&rswa_simt_key_##name, sizeof(type), alignof(type)))

// ---- the device API of utils.h -----------------------------------------------------------------------------------
namespace rangeswa::cuda {

// 16 bytes global -> shared; `valid` false: nothing is read and the 16 bytes are zeroed. Both addresses must be
// 16-byte aligned and the destination in shared memory.
inline void cp_async_16(void* smem, const void* gmem, bool valid, std::source_location site = RSWA_SIMT_HERE) {
  ::simt::cp_async_16(smem, gmem, valid, site);
}
inline void cp_async_commit() { ::simt::cp_async_commit(); }
// cp.async.wait_group 0: every committed copy of this thread lands now.
inline void cp_async_wait_all(std::source_location site = RSWA_SIMT_HERE) { ::simt::cp_async_wait_all(site); }
// cp.async.wait_group kPending: every committed group of this thread but the newest kPending lands now.
template <int kPending>
inline void cp_async_wait_group(std::source_location site = RSWA_SIMT_HERE) { ::simt::cp_async_wait_group(kPending, site); }

inline void ldmatrix_x4(uint32_t (&r)[4], const void* smem, std::source_location site = RSWA_SIMT_HERE) {
  ::simt::ldmatrix_x4(r, smem, false, site);
}
inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem, std::source_location site = RSWA_SIMT_HERE) {
  ::simt::ldmatrix_x4(r, smem, true, site);
}

template <typename Element>
void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
               std::source_location site = RSWA_SIMT_HERE);
template <>
inline void mma_16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                                     std::source_location site) {
  ::simt::mma_m16n8k16(d, a, b0, b1, ::simt::MmaType::kBF16, site);
}
template <>
inline void mma_16816<__half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                              std::source_location site) {
  ::simt::mma_m16n8k16(d, a, b0, b1, ::simt::MmaType::kF16, site);
}

// Two floats as one register of two 16-bit values, `lo` in the low half (cvt.rn.{bf16x2,f16x2}.f32).
template <typename Element>
uint32_t pack2(float lo, float hi);
template <>
inline uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  return bits;
}
template <>
inline uint32_t pack2<__half>(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  return bits;
}

// ex2.approx.ftz.f32: 2^x with subnormal inputs and results flushed to zero; 2^-inf = +0.
// Two adjacent elements in one store (utils.h store2).
template <typename Element>
inline void store2(Element* dst, float a, float b) {
  *reinterpret_cast<uint32_t*>(dst) = pack2<Element>(a, b);
}
template <>
inline void store2<float>(float* dst, float a, float b) {
  dst[0] = a;
  dst[1] = b;
}

// bmsk.clamp.b32 d, a, b (PTX ISA 9.7.8.23): the PTX semantics as written there.
inline uint32_t bit_range(uint32_t a, uint32_t b) {
  const uint32_t a1 = a & 0x1f, b1 = b & 0x1f, sum = a1 + b1;
  uint32_t mask0 = ~0u << a1, mask1 = sum >= 32 ? 0u : ~0u << sum;
  if (a >= 32) mask0 = 0;
  if (sum >= 32 || a >= 32 || b >= 32) mask1 = 0;
  else if (b1 == 0) mask1 = ~0u;
  return mask0 & ~mask1;
}

inline float exp2_approx(float x) { return ::simt::detail::ftz(std::exp2(::simt::detail::ftz(x))); }

}  // namespace rangeswa::cuda

// ---- the Hopper primitives of sm90/hopper.h (wgmma, mbarrier, TMA, setmaxnreg) ----------------------------------------
#include "cuda/simt/simt_hopper.h"
