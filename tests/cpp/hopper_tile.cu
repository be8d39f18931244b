// Small sm_90a kernels on sm90/hopper.h's primitives: S = Q K^T for one 64 x 64 tile with head dim 64 (TMA into
// swizzled shared memory, an mbarrier, four k16 steps of wgmma m64n64k16, A from shared memory or from
// registers), O = P V for one tile (V an N-major B), and Q K^T over a ring of K tiles (a producer warp issuing
// TMA into two stages, a consumer warpgroup waiting on full barriers and releasing stages on empty barriers,
// setmaxnreg between the roles); their host launchers. Test code, not part of the extension (it lives with the
// tests, outside csrc/): scripts/hopper_gate.py compiles it with nvcc for sm_90a and reads its SASS, and the SIMT
// emulation runs the same source, launchers included (csrc/cuda/simt/simt_hopper_tests.cpp includes it from
// tests/cpp, through tests/test_simt_hopper.py). The groundwork of issue 30's body kernel.
//
// Shared-memory tiles: a 64 x 64 tile of 16-bit elements is stored as 128 / W column boxes of 64 rows x W bytes
// (W the swizzle span, 16 with no swizzle), box b holding columns [b W / 2, (b + 1) W / 2) at byte 64 W b, each
// written by one TMA copy with the map's swizzle and read by wgmma through K-major descriptors:
// the k16 step ks starts at byte (32 ks / W) 64 W + 32 ks % W; SBO = 8 W (8-row groups), LBO = 64 W (the next
// core-matrix column, used only without swizzle). Tiles start at multiples of 1024 bytes of shared address.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "cuda/sm90/hopper.h"
#include "cuda/utils.h"

namespace rangeswa::cuda::hopper_tile {

using namespace ::rangeswa::cuda::hopper;

constexpr uint32_t kTileBytes = 64 * 64 * 2;

template <uint32_t kW>
__host__ __device__ constexpr Swizzle swizzle_mode() {
  return kW == 128 ? Swizzle::k128B : kW == 64 ? Swizzle::k64B : kW == 32 ? Swizzle::k32B : Swizzle::kNone;
}

// The byte offset (from the tile's start) of the k16 step ks of row 0.
template <uint32_t kW>
__host__ __device__ constexpr uint32_t step_offset(int ks) {
  return (32u * uint32_t(ks) / kW) * 64u * kW + 32u * uint32_t(ks) % kW;
}

// The A fragment of the k16 step ks (sm90/hopper.h: a[0] = (16 w + g, 2q..), a[1] = (+8, 2q..), a[2] = (16 w + g,
// 2q+8..), a[3] = (+8, 2q+8..)) read from the swizzled tile with plain loads.
template <uint32_t kW>
__device__ __forceinline__ void load_a_fragment(uint32_t (&a)[4], const unsigned char* tile, int ks) {
  const int t = threadIdx.x % 128, w = t / 32, g = (t % 32) / 4, q = t % 4;
  const uint32_t base = smem_u32(tile);
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const uint32_t row = uint32_t(16 * w + g + 8 * (r & 1)), col = uint32_t(16 * ks + 2 * q + 8 * (r >> 1));
    const uint32_t u = base + (2 * col / kW) * 64 * kW + row * kW + 2 * col % kW;
    a[r] = *reinterpret_cast<const uint32_t*>(tile + (swizzle_address(u, kW) - base));
  }
}

// d = Q K^T over head dim 64 for the warpgroup's 64 x 64 tile: four wgmma m64n64k16, one commit group. With
// kEarlyRelease (a deliberate bug for the tests) `release` is arrived on between the commit and the wait.
template <typename E, uint32_t kW, bool kARegs>
__device__ __forceinline__ void qk_tile(float (&d)[32], const unsigned char* sQ, const unsigned char* sK,
                                        uint64_t* early_release = nullptr) {
  constexpr Swizzle kMode = swizzle_mode<kW>();
  const uint32_t q = smem_u32(sQ), k = smem_u32(sK);
  uint32_t a[4][4];
  if constexpr (kARegs) {
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) load_a_fragment<kW>(a[ks], sQ, ks);
  }
  wgmma_fence();
  fence_operand(d);
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    const uint64_t desc_b = make_smem_desc(k + step_offset<kW>(ks), 64 * kW, 8 * kW, kMode);
    if constexpr (kARegs) {
      wgmma_rs<64, E>(d, a[ks], desc_b, ks > 0);
    } else {
      const uint64_t desc_a = make_smem_desc(q + step_offset<kW>(ks), 64 * kW, 8 * kW, kMode);
      wgmma_ss<64, E>(d, desc_a, desc_b, ks > 0);
    }
  }
  wgmma_commit();
  if (early_release) mbarrier_arrive(early_release);
  wgmma_wait<0>();
  fence_operand(d);
}

// d = P V for the warpgroup's 64 x 64 tile over 64 keys: P [64 x 64 keys] as A (K-major, from shared memory or
// from registers, as a softmax leaves it), V [64 keys x 64 columns] row-major as an N-major B (imm-trans-b 1):
// the key step ks starts at row 16 ks of every box, 16 ks W bytes in; with a swizzle, LBO = 64 W (the next box of
// W / 2 columns) and SBO = 8 W (the next 8 keys); without, the roles swap: SBO = 64 W, LBO = 8 W.
template <typename E, uint32_t kW, bool kARegs>
__device__ __forceinline__ void pv_tile(float (&d)[32], const unsigned char* sP, const unsigned char* sV) {
  constexpr Swizzle kMode = swizzle_mode<kW>();
  constexpr uint32_t kLbo = kW == 16 ? 8 * kW : 64 * kW, kSbo = kW == 16 ? 64 * kW : 8 * kW;
  const uint32_t p = smem_u32(sP), v = smem_u32(sV);
  uint32_t a[4][4];
  if constexpr (kARegs) {
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) load_a_fragment<kW>(a[ks], sP, ks);
  }
  wgmma_fence();
  fence_operand(d);
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    const uint64_t desc_b = make_smem_desc(v + 16 * uint32_t(ks) * kW, kLbo, kSbo, kMode);
    if constexpr (kARegs) {
      wgmma_rs<64, E, 1>(d, a[ks], desc_b, ks > 0);
    } else {
      const uint64_t desc_a = make_smem_desc(p + step_offset<kW>(ks), 64 * kW, 8 * kW, kMode);
      wgmma_ss<64, E, 0, 1>(d, desc_a, desc_b, ks > 0);
    }
  }
  wgmma_commit();
  wgmma_wait<0>();
  fence_operand(d);
}

// The accumulator of thread t of the warpgroup (sm90/hopper.h): d[i] = (16 w + g + 8 ((i / 2) % 2), 8 (i / 4) + 2q + i % 2).
__device__ __forceinline__ void store_tile(float* out, const float (&d)[32]) {
  const int t = threadIdx.x % 128, w = t / 32, g = (t % 32) / 4, q = t % 4;
#pragma unroll
  for (int i = 0; i < 32; i += 2) {
    const int row = 16 * w + g + 8 * ((i / 2) % 2), col = 8 * (i / 4) + 2 * q;
    *reinterpret_cast<float2*>(out + row * 64 + col) = make_float2(d[i], d[i + 1]);
  }
}

// Loads a 64 x 64 tile (rows row0.., all 64 columns) as 128 / kW boxes.
template <uint32_t kW>
__device__ __forceinline__ void load_tile(unsigned char* dst, const CUtensorMap* map, int row0, uint64_t* bar) {
#pragma unroll
  for (int b = 0; b < int(128 / kW); ++b) tma_load_2d(dst + b * 64 * kW, map, b * int(kW) / 2, row0, bar);
}

// 1024-byte aligned shared memory (the swizzle patterns' repeat) from the dynamic shared memory.
__device__ __forceinline__ unsigned char* align_1024(unsigned char* p) {
  const uint32_t a = smem_u32(p);
  return p + (1024u - a % 1024u) % 1024u;
}

// One CTA of 128 threads: out[64 x 64] = X[64 x 64] Y[64 x 64]^T (kPV false: Q K^T) or X Y (kPV true: P V of
// attention, Y row-major read as an N-major B). Dynamic shared memory: kSmemTile.
inline constexpr uint32_t kSmemTile = 2 * kTileBytes + 64 + 1024;
template <typename E, uint32_t kW, bool kARegs, bool kPV>
__global__ void __launch_bounds__(128, 1)
    tile_kernel(const __grid_constant__ CUtensorMap tx, const __grid_constant__ CUtensorMap ty, float* out) {
  RSWA_DYNAMIC_SHARED(smem_raw);
  unsigned char* base = align_1024(smem_raw);
  unsigned char* sX = base;
  unsigned char* sY = base + kTileBytes;
  uint64_t* bar = reinterpret_cast<uint64_t*>(base + 2 * kTileBytes);
  if (threadIdx.x == 0) {
    mbarrier_init(bar, 1);
    fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    mbarrier_arrive_expect_tx(bar, 2 * kTileBytes);
    load_tile<kW>(sX, &tx, 0, bar);
    load_tile<kW>(sY, &ty, 0, bar);
  }
  mbarrier_wait_parity(bar, 0);
  float d[32];
  if constexpr (kPV)
    pv_tile<E, kW, kARegs>(d, sX, sY);
  else
    qk_tile<E, kW, kARegs>(d, sX, sY);
  store_tile(out, d);
}

// The ring's deliberate bugs (tests/test_simt_hopper.py expects each to be reported).
enum RingMode : int { kRingCorrect = 0, kRingWrongParity = 1, kRingMissingExpectTx = 2, kRingEarlyRelease = 3 };

// 256 threads: warpgroup 0 is the producer (one thread issues the copies; setmaxnreg.dec), warpgroup 1 the
// consumer (setmaxnreg.inc). Q [64 x 64] once; K [tiles * 64 x 64] through two stages; out[t] = Q K_t^T.
// Dynamic shared memory: kSmemRing.
inline constexpr uint32_t kSmemRing = 3 * kTileBytes + 64 + 1024;
template <typename E>
__global__ void __launch_bounds__(256, 1)
    qk_ring_kernel(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk, float* out,
                   int tiles, int mode) {
  constexpr uint32_t kW = 128;
  RSWA_DYNAMIC_SHARED(smem_raw);
  unsigned char* base = align_1024(smem_raw);
  unsigned char* sQ = base;
  unsigned char* sK = base + kTileBytes;  // two stages
  uint64_t* bars = reinterpret_cast<uint64_t*>(base + 3 * kTileBytes);
  uint64_t* q_full = bars;
  uint64_t* full = bars + 1;   // [2]
  uint64_t* empty = bars + 3;  // [2]
  if (threadIdx.x == 0) {
    mbarrier_init(q_full, 1);
    for (int s = 0; s < 2; ++s) {
      mbarrier_init(&full[s], 1);
      mbarrier_init(&empty[s], 128);
    }
    fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x < 128) {
    setmaxnreg_dec<40>();
    if (threadIdx.x == 0) {
      mbarrier_arrive_expect_tx(q_full, kTileBytes);
      load_tile<kW>(sQ, &tq, 0, q_full);
      for (int t = 0; t < tiles; ++t) {
        const int s = t % 2, round = t / 2;
        mbarrier_wait_parity(&empty[s], uint32_t((round & 1) ^ 1));  // round 0: the stage starts empty
        if (mode == kRingMissingExpectTx) mbarrier_arrive(&full[s]);
        else mbarrier_arrive_expect_tx(&full[s], kTileBytes);
        load_tile<kW>(sK + s * kTileBytes, &tk, 64 * t, &full[s]);
      }
    }
  } else {
    setmaxnreg_inc<232>();
    mbarrier_wait_parity(q_full, 0);
    for (int t = 0; t < tiles; ++t) {
      const int s = t % 2, round = t / 2;
      mbarrier_wait_parity(&full[s], uint32_t(mode == kRingWrongParity ? (round & 1) ^ 1 : round & 1));
      float d[32];
      if (mode == kRingEarlyRelease) {
        qk_tile<E, kW, false>(d, sQ, sK + s * kTileBytes, &empty[s]);
      } else {
        qk_tile<E, kW, false>(d, sQ, sK + s * kTileBytes);
        mbarrier_arrive(&empty[s]);
      }
      store_tile(out + t * 64 * 64, d);
    }
  }
}

// ---- launchers (host; the SIMT emulation runs them too, RSWA_LAUNCH being simt::launch there) --------------------

template <typename E>
constexpr CUtensorMapDataType map_type() {
  return std::is_same_v<E, __nv_bfloat16> ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
}

// The map of this file's tiles: an array [rows, 64] row-major, boxes of 64 rows x W bytes (16 without swizzle).
template <typename E, uint32_t kW>
CUresult tile_map(CUtensorMap* map, const E* data, uint64_t rows) {
  const CUtensorMapSwizzle swizzle = kW == 128 ? CU_TENSOR_MAP_SWIZZLE_128B
                                   : kW == 64  ? CU_TENSOR_MAP_SWIZZLE_64B
                                   : kW == 32  ? CU_TENSOR_MAP_SWIZZLE_32B
                                               : CU_TENSOR_MAP_SWIZZLE_NONE;
  return encode_tensor_map_2d(map, map_type<E>(), const_cast<E*>(data), 64, rows, 128, kW / 2, 64, swizzle);
}

// out [64, 64] = x y^T (kPV false) or x y (kPV true), by tile_kernel; x, y [64, 64] row-major.
template <typename E, uint32_t kW, bool kARegs, bool kPV>
cudaError_t launch_tile(const E* x, const E* y, float* out, cudaStream_t stream) {
  CUtensorMap tx, ty;
  if (tile_map<E, kW>(&tx, x, 64) != CUDA_SUCCESS || tile_map<E, kW>(&ty, y, 64) != CUDA_SUCCESS)
    return cudaErrorInvalidValue;
  return RSWA_LAUNCH((tile_kernel<E, kW, kARegs, kPV>), 1, 128, kSmemTile, stream, tx, ty, out);
}

// out [tiles, 64, 64] = q k_t^T over k [tiles * 64, 64] (mode: RingMode).
template <typename E>
cudaError_t launch_ring(const E* q, const E* k, int tiles, int mode, float* out, cudaStream_t stream) {
  CUtensorMap tq, tk;
  if (tile_map<E, 128>(&tq, q, 64) != CUDA_SUCCESS || tile_map<E, 128>(&tk, k, uint64_t(tiles) * 64) != CUDA_SUCCESS)
    return cudaErrorInvalidValue;
  return RSWA_LAUNCH(qk_ring_kernel<E>, 1, 256, kSmemRing, stream, tq, tk, out, tiles, mode);
}

// The instantiations the gate reads (and a GPU check would launch).
template cudaError_t launch_tile<__nv_bfloat16, 128, false, false>(const __nv_bfloat16*, const __nv_bfloat16*, float*,
                                                                   cudaStream_t);
template cudaError_t launch_tile<__nv_bfloat16, 128, true, false>(const __nv_bfloat16*, const __nv_bfloat16*, float*,
                                                                  cudaStream_t);
template cudaError_t launch_tile<__half, 128, false, false>(const __half*, const __half*, float*, cudaStream_t);
template cudaError_t launch_tile<__nv_bfloat16, 128, true, true>(const __nv_bfloat16*, const __nv_bfloat16*, float*,
                                                                 cudaStream_t);
template cudaError_t launch_ring<__nv_bfloat16>(const __nv_bfloat16*, const __nv_bfloat16*, int, int, float*,
                                                cudaStream_t);

}  // namespace rangeswa::cuda::hopper_tile
