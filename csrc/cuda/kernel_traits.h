// Tile sizes and the shared-memory layout of the fused attention kernel, per (element type, padded
// head dim). The padded head dim is a multiple of 16 (the k of mma m16n8k16): head dims up to 64 run
// as 64, 65..80 (ELF-M's 66, ELF-L's 80) as 80, 81..128 as 128; the padding columns are zero in the
// prepared keys, values and rotated queries, so they add nothing to q.k and produce zero output
// columns that are never stored.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace rangeswa::cuda {

// Query rows per tile (the op sizes its grid with it).
inline constexpr int kAttnTileRows = 64;

// The padded head dim a head dim D runs as (0 = unsupported).
inline constexpr int padded_head_dim(int64_t D) { return D <= 64 ? 64 : D <= 80 ? 80 : D <= 128 ? 128 : 0; }

template <typename Element_, int kHeadDim_>
struct AttnTraits {
  using Element = Element_;
  static constexpr bool kTensorCores = !std::is_same_v<Element, float>;
  static constexpr int kHeadDim = kHeadDim_;  // padded
  static constexpr int kNWarps = 4;
  static constexpr int kThreads = kNWarps * 32;
  static constexpr int kBlockM = 16 * kNWarps;  // query rows per tile, 16 per warp
  static_assert(kBlockM == kAttnTileRows, "the op's grid assumes kAttnTileRows rows per tile");
  // Keys per KV tile. fp32 halves it so that three fp32 query slots and the K/V tiles of head dim
  // 128 stay under an sm_80 multiprocessor's 163 KB of shared memory.
  static constexpr int kBlockN = kTensorCores ? 64 : 32;
  // Shared-memory rows are padded by 16 bytes: an odd number of 16-byte chunks per row makes the 8
  // row addresses of every ldmatrix (and the fp32 path's float4 row reads) hit distinct banks.
  static constexpr int kStride = kHeadDim + 16 / int(sizeof(Element));
  static constexpr int kQSlotElems = kBlockM * kStride;
  static constexpr int kKVElems = kBlockN * kStride;

  static_assert(kHeadDim % 16 == 0, "the padded head dim must be a multiple of the mma k (16)");
  static_assert(kBlockN % 16 == 0 && kBlockN <= 64, "KV tiles are 16..64 keys (one 64-bit block mask)");
  static_assert((kStride * sizeof(Element) / 16) % 2 == 1, "rows must be an odd number of 16-byte chunks");
  static_assert(kStride * sizeof(Element) % 16 == 0, "rows must stay 16-byte aligned for cp.async");
};

}  // namespace rangeswa::cuda
