// Test kernels of the Hopper emulation (tests/test_simt_hopper.py through simt_hopper_ops.cpp): hopper_tile.cu's
// kernels and launchers, unmodified (their tensor maps from the emulation's encode_tensor_map_2d); fragment-layout probes on hand-made operands;
// a TMA probe; and kernels that misuse a primitive (each must raise). Torch-free.
#include "cuda/simt/simt_hopper_tests.h"

#include "cuda/simt/simt.h"
// The kernel source under test, unmodified.
#include "hopper_tile.cu"  // tests/cpp: the test kernels (tests/cuda_emulator.py puts the folder on the include path)

namespace rangeswa::cuda::simt_hopper_tests {
namespace {

using namespace ::rangeswa::cuda::hopper;
namespace ht = ::rangeswa::cuda::hopper_tile;

CUtensorMapSwizzle map_swizzle(int bytes) {
  switch (bytes) {
    case 32: return CU_TENSOR_MAP_SWIZZLE_32B;
    case 64: return CU_TENSOR_MAP_SWIZZLE_64B;
    case 128: return CU_TENSOR_MAP_SWIZZLE_128B;
    default: return CU_TENSOR_MAP_SWIZZLE_NONE;
  }
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw ::simt::Error(std::string(what) + ": the launcher refused (cudaError " + std::to_string(int(e)) + ")");
}

// which 0: tile_kernel's Q K^T (out = x y^T), 1: its P V (out = x y), through hopper_tile.cu's launcher.
template <typename E, uint32_t kW>
void tile_w(int which, bool a_regs, const uint16_t* x_bits, const uint16_t* y_bits, float* out) {
  const E* x = reinterpret_cast<const E*>(x_bits);
  const E* y = reinterpret_cast<const E*>(y_bits);
  if (which == 0 && a_regs) check(ht::launch_tile<E, kW, true, false>(x, y, out, nullptr), "qk_tile");
  else if (which == 0) check(ht::launch_tile<E, kW, false, false>(x, y, out, nullptr), "qk_tile");
  else if (a_regs) check(ht::launch_tile<E, kW, true, true>(x, y, out, nullptr), "pv_tile");
  else check(ht::launch_tile<E, kW, false, true>(x, y, out, nullptr), "pv_tile");
}

template <typename E>
void tile_e(int which, int swizzle, bool a_regs, const uint16_t* x, const uint16_t* y, float* out) {
  switch (swizzle) {
    case 0: tile_w<E, 16>(which, a_regs, x, y, out); break;
    case 32: tile_w<E, 32>(which, a_regs, x, y, out); break;
    case 64: tile_w<E, 64>(which, a_regs, x, y, out); break;
    case 128: tile_w<E, 128>(which, a_regs, x, y, out); break;
    default: throw ::simt::Error("tile: swizzle 0, 32, 64 or 128");
  }
}

// ---- fragment-layout probe ------------------------------------------------------------------------------------
// One wgmma m64nNk16 (128 threads) on A [64 x 16] = in[0..1024) and B [16 x N] = in[1024..) (row-major floats
// exact in E), C = 0. A and B are stored by plain stores in the no-swizzle K-major core-matrix layout (8 x 8
// elements = 128 contiguous bytes; LBO 128 bytes between the two core matrices along k, SBO 256 between 8-row
// groups), then fence.proxy.async. kForm 0: A from shared memory; 1: A from registers built by the
// fragment layout of sm90/hopper.h. out[t * N / 2 + i] = d[i] of thread t.
// mode: 0 correct; 1 reads d[0] between commit and wait (into out[4096 + t]); 2 no wgmma.fence; 3 writes d[0]
// before the wait; 4 no wait_group; 5 only threads 0-63 issue the wgmma; 6 changes an A register before the
// wait (kForm 1); 7 writes d[0] between wgmma.fence and the mma_async; 8 changes an A register between them
// (kForm 1); 9 reads a[0] between commit and wait (into out[4096 + t] as its bits; kForm 1).
template <typename E, int N, int kForm>
__global__ void layout_kernel(const float* in, float* out, int mode) {
  RSWA_DYNAMIC_SHARED(smem_raw);
  unsigned char* base = ht::align_1024(smem_raw);
  uint16_t* sA = reinterpret_cast<uint16_t*>(base);
  uint16_t* sB = reinterpret_cast<uint16_t*>(base + 2048);
  const int t = threadIdx.x;
  auto bits = [](float x) {
    const E e = E(x);
    uint16_t b;
    std::memcpy(&b, &e, 2);
    return b;
  };
  // (row, k) -> element index in the core-matrix layout: (row / 8) * 128 + (k / 8) * 64 + (row % 8) * 8 + k % 8
  for (int x = t; x < 64 * 16; x += 128) {
    const int m = x / 16, k = x % 16;
    sA[(m / 8) * 128 + (k / 8) * 64 + (m % 8) * 8 + k % 8] = bits(in[x]);
  }
  for (int x = t; x < 16 * N; x += 128) {
    const int k = x / N, n = x % N;
    sB[(n / 8) * 128 + (k / 8) * 64 + (n % 8) * 8 + k % 8] = bits(in[1024 + x]);
  }
  fence_proxy_async_shared();
  __syncthreads();
  const int w = t / 32, g = (t % 32) / 4, q = t % 4;
  uint32_t a[4];
  for (int r = 0; r < 4; ++r) {
    const int row = 16 * w + g + 8 * (r & 1), col = 2 * q + 8 * (r >> 1);
    a[r] = uint32_t(bits(in[row * 16 + col])) | uint32_t(bits(in[row * 16 + col + 1])) << 16;
  }
  float d[N / 2];
  for (int i = 0; i < N / 2; ++i) d[i] = 0.f;
  const uint64_t desc_a = make_smem_desc(smem_u32(sA), 128, 256, Swizzle::kNone);
  const uint64_t desc_b = make_smem_desc(smem_u32(sB), 128, 256, Swizzle::kNone);
  if (mode != 2) wgmma_fence();
  if (mode == 7) d[0] = 1.f;
  if (mode == 8) a[1] ^= 1u;
  if (mode == 5 && t >= 64) return;
  if (kForm == 0) wgmma_ss<N, E>(d, desc_a, desc_b, 0);
  else wgmma_rs<N, E>(d, a, desc_b, 0);
  wgmma_commit();
  if (mode == 1) out[4096 + t] = d[0];
  if (mode == 3) d[0] = 1.f;
  if (mode == 6) a[1] ^= 1u;
  if (mode == 9) std::memcpy(&out[4096 + t], &a[0], 4);
  if (mode == 4) return;
  wgmma_wait<0>();
  for (int i = 0; i < N / 2; ++i) out[t * (N / 2) + i] = d[i];
}

// A chain of two wgmma on one accumulator without a wait between them, the second with scale-d 1: D = A B + A B.
// out as layout_kernel's (ss form, f16, N = 16).
__global__ void chain_kernel(const float* in, float* out, int) {
  RSWA_DYNAMIC_SHARED(smem_raw);
  unsigned char* base = ht::align_1024(smem_raw);
  uint16_t* sA = reinterpret_cast<uint16_t*>(base);
  uint16_t* sB = reinterpret_cast<uint16_t*>(base + 2048);
  const int t = threadIdx.x;
  for (int x = t; x < 64 * 16; x += 128) {
    const int m = x / 16, k = x % 16;
    const __half e(in[x]);
    std::memcpy(&sA[(m / 8) * 128 + (k / 8) * 64 + (m % 8) * 8 + k % 8], &e, 2);
  }
  for (int x = t; x < 16 * 16; x += 128) {
    const int k = x / 16, n = x % 16;
    const __half e(in[1024 + x]);
    std::memcpy(&sB[(n / 8) * 128 + (k / 8) * 64 + (n % 8) * 8 + k % 8], &e, 2);
  }
  fence_proxy_async_shared();
  __syncthreads();
  float d[8];
  const uint64_t desc_a = make_smem_desc(smem_u32(sA), 128, 256, Swizzle::kNone);
  const uint64_t desc_b = make_smem_desc(smem_u32(sB), 128, 256, Swizzle::kNone);
  wgmma_fence();
  wgmma_ss<16, __half>(d, desc_a, desc_b, 0);
  wgmma_commit();
  wgmma_ss<16, __half>(d, desc_a, desc_b, 1);
  wgmma_commit();
  wgmma_wait<0>();
  for (int i = 0; i < 8; ++i) out[t * 8 + i] = d[i];
}

// mbarrier misuse: mode 0 arrives on a barrier no thread initialised; mode 1 waits for a phase of a barrier
// expecting two arrivals that gets one (every thread blocks: a deadlock).
__global__ void mbarrier_misuse_kernel(const float*, float*, int mode) {
  RSWA_DYNAMIC_SHARED(smem_raw);
  uint64_t* bar = reinterpret_cast<uint64_t*>(ht::align_1024(smem_raw));
  if (mode == 0) {
    mbarrier_arrive(bar);
    return;
  }
  if (threadIdx.x == 0) mbarrier_init(bar, 2);
  __syncthreads();
  if (threadIdx.x == 0) mbarrier_arrive(bar);  // one of the two arrivals
  mbarrier_wait_parity(bar, 0);
}

// TMA probe: thread 0 copies the box, every thread then reads shared memory.
__global__ void tma_kernel(const __grid_constant__ CUtensorMap map, int c0, int c1, int bytes, int32_t* out) {
  RSWA_DYNAMIC_SHARED(smem_raw);
  unsigned char* base = ht::align_1024(smem_raw);
  uint64_t* bar = reinterpret_cast<uint64_t*>(base + 65536);
  if (threadIdx.x == 0) {
    mbarrier_init(bar, 1);
    fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    mbarrier_arrive_expect_tx(bar, uint32_t(bytes));
    tma_load_2d(base, &map, c0, c1, bar);
  }
  mbarrier_wait_parity(bar, 0);
  const uint16_t* s = reinterpret_cast<const uint16_t*>(base);
  for (int x = threadIdx.x; x < bytes / 2; x += blockDim.x) out[x] = s[x];
}

// Named barriers (sm90/hopper.h named_barrier_sync / _or), 256 threads. mode 0: each warpgroup reduces its own
// predicate with bar.red.or on barrier 2 + warpgroup (true in thread 5 of warpgroup 0 only), then all 256 meet
// at bar.sync 1, 256; out[t] = the reduction thread t got. mode 1: warpgroup 0 at bar.sync 1, 256 while
// warpgroup 1 comes to bar.sync 1, 128 (one barrier, two counts). mode 2: bar.sync 1, 256 with warpgroup 1 gone.
__global__ void named_barrier_kernel(const float*, float* out, int mode) {
  const int t = threadIdx.x, wg = t / 128;
  if (mode == 1) {
    named_barrier_sync(1, wg == 0 ? 256 : 128);
    return;
  }
  if (mode == 2) {
    if (wg == 1) return;
    named_barrier_sync(1, 256);
    return;
  }
  out[t] = named_barrier_or(2 + wg, 128, wg == 0 && t == 5) ? 1.f : 0.f;
  named_barrier_sync(1, 256);
}

// A cp.async onto a wgmma's operand, 128 threads: one wgmma m64n16k16 (A and B from shared memory, K-major
// without swizzle) in flight, then thread 0 copies 16 bytes onto B's first chunk: mode 0 after the
// wgmma.wait_group (allowed), mode 1 before it (the emulation refuses: the wgmma reads those bytes later).
// Mode 2: thread 0's cp.async onto B's first chunk is committed but not waited for when the wgmma issues (the
// emulation refuses: the data may land after the wgmma read it); mode 3 waits, then a barrier (allowed).
__global__ void async_overwrite_kernel(const float* in, float* out, int mode) {
  RSWA_DYNAMIC_SHARED(smem);
  const uint32_t a = smem_u32(smem), b = smem_u32(smem + 2048);
  float d[8];
  if (mode >= 2 && threadIdx.x == 0) {
    cp_async_16(smem + 2048, in, true);
    cp_async_commit();
    if (mode == 3) cp_async_wait_all();
  }
  if (mode == 3) __syncthreads();
  wgmma_fence();
  wgmma_ss<16, __half>(d, make_smem_desc(a, 128, 256, Swizzle::kNone), make_smem_desc(b, 128, 256, Swizzle::kNone), 0);
  wgmma_commit();
  if (mode == 1 && threadIdx.x == 0) {
    cp_async_16(smem + 2048, in, true);
    cp_async_commit();
    cp_async_wait_all();
  }
  wgmma_wait<0>();
  if (mode == 2 && threadIdx.x == 0) cp_async_wait_all();
  if (mode == 0 && threadIdx.x == 0) {
    cp_async_16(smem + 2048, in, true);
    cp_async_commit();
    cp_async_wait_all();
  }
  out[threadIdx.x] = 1.f;
}

// setmaxnreg's register pool, 384 threads (a producer warpgroup and two consumers, the body kernel's split at
// head dims 80 and 128): the launch declares `entry` registers a thread (mode 0: 168, the split's mean; 1: 160,
// fewer), the producer gives registers up (.dec 40; mode 2: it does not) and the consumers take theirs (.inc
// 232), then every thread writes out[t] = 1. Modes 1 and 2 deadlock: the pool cannot feed both consumers.
__global__ void setmaxnreg_kernel(const float*, float* out, int mode) {
  if (threadIdx.x < 128) {
    if (mode != 2) setmaxnreg_dec<40>();
  } else {
    setmaxnreg_inc<232>();
  }
  out[threadIdx.x] = 1.f;
}

template <typename E, int N, int kForm>
void layout(const std::vector<float>& in, std::vector<float>& out, int mode) {
  ::simt::launch(dim3(1), dim3(128), 1024 + 2048 + 4096, layout_kernel<E, N, kForm>, in.data(), out.data(), mode);
}

}  // namespace

void tile(int which, int dtype, int swizzle, bool a_regs, const uint16_t* x, const uint16_t* y, float* out) {
  if (dtype == 1) tile_e<__nv_bfloat16>(which, swizzle, a_regs, x, y, out);
  else tile_e<__half>(which, swizzle, a_regs, x, y, out);
}

void qk_ring(int tiles, int mode, const uint16_t* q, const uint16_t* k, float* out) {
  check(ht::launch_ring<__nv_bfloat16>(reinterpret_cast<const __nv_bfloat16*>(q), reinterpret_cast<const __nv_bfloat16*>(k),
                                       tiles, mode, out, nullptr),
        "qk_ring");
}

std::vector<int32_t> tma_probe(int swizzle, int c0, int c1, int box0, int box1, int dim0, int dim1, bool oob_nan) {
  std::vector<uint16_t> data(size_t(dim0) * size_t(dim1));
  for (size_t i = 0; i < data.size(); ++i) data[i] = uint16_t(i);
  CUtensorMap map;
  const CUresult r = encode_tensor_map_2d(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, data.data(), uint64_t(dim0),
                                          uint64_t(dim1), uint64_t(dim0) * 2, uint32_t(box0), uint32_t(box1),
                                          map_swizzle(swizzle),
                                          oob_nan ? CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA
                                                  : CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw ::simt::Error("encode_tensor_map_2d: CUresult " + std::to_string(int(r)) + " (the driver would refuse the map)");
  const int bytes = box0 * box1 * 2;
  std::vector<int32_t> out(size_t(bytes / 2), -1);
  ::simt::launch(dim3(1), dim3(128), 65536 + 64 + 1024, tma_kernel, map, c0, c1, bytes, out.data());
  return out;
}

std::vector<float> probe(const std::string& name, const std::vector<float>& in_) {
  std::vector<float> out(8192, 0.f), in(in_);
  in.resize(std::max<size_t>(in.size(), 4096), 0.f);
  int mode = 0;
  std::string base = name;
  if (const size_t at = name.find(':'); at != std::string::npos) {
    base = name.substr(0, at);
    mode = std::stoi(name.substr(at + 1));
  }
  if (base == "layout_ss_f16_16") layout<__half, 16, 0>(in, out, mode);
  else if (base == "layout_ss_f16_64") layout<__half, 64, 0>(in, out, mode);
  else if (base == "layout_ss_f16_128") layout<__half, 128, 0>(in, out, mode);
  else if (base == "layout_ss_bf16_32") layout<__nv_bfloat16, 32, 0>(in, out, mode);
  else if (base == "layout_rs_f16_64") layout<__half, 64, 1>(in, out, mode);
  else if (base == "layout_rs_bf16_16") layout<__nv_bfloat16, 16, 1>(in, out, mode);
  else if (base == "chain") ::simt::launch(dim3(1), dim3(128), 1024 + 2048 + 512, chain_kernel, in.data(), out.data(), 0);
  else if (base == "mbarrier") ::simt::launch(dim3(1), dim3(32), 2048, mbarrier_misuse_kernel, in.data(), out.data(), mode);
  else if (base == "named") ::simt::launch(dim3(1), dim3(256), 0, named_barrier_kernel, in.data(), out.data(), mode);
  else if (base == "setmaxnreg") {
    ::simt::hopper::registers_at_entry(mode == 1 ? 160 : 168);
    ::simt::launch(dim3(1), dim3(384), 0, setmaxnreg_kernel, in.data(), out.data(), mode);
  } else if (base == "overwrite") ::simt::launch(dim3(1), dim3(128), 4096, async_overwrite_kernel, in.data(), out.data(), mode);
  else throw ::simt::Error("no hopper probe named " + name);
  return out;
}

}  // namespace rangeswa::cuda::simt_hopper_tests
