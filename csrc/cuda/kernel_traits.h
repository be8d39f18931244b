// Tile sizes and shared-memory strides of the fused attention kernel, per (element type, padded head
// dim). Head dims are padded to a multiple of 16 (the k of mma m16n8k16): up to 64 run as 64, 65..80
// (ELF-M's 66, ELF-L's 80) as 80, 81..128 as 128; the padding columns are zero in the prepared keys,
// values and the rotated queries, so they add nothing to q.k and give output columns never stored.
#pragma once

#include <cstdint>
#include <type_traits>

namespace rangeswa::cuda {

// Query rows per CTA (the plan is made for tiles of this many rows): 4 warps of 32 rows, so every K and
// V fragment a warp loads feeds two m16 MMAs (FlashAttention-2's 128-row tile).
inline constexpr int kAttnTileRows = 128;
// Control keys are scored in tiles of 16 columns, not a whole KV tile.
inline constexpr int kCtrlCols = 16;
// Control query rows per CTA: one warp's rows. The CTA's warps split the keys among them instead (split-K
// inside the CTA: warp w takes every kControlSplit-th 16-column unit of the chunk's tiles, common/control.h
// control_unit), each leaving its own partial result for the combine kernel, so no warp idles while
// another walks the chunk.
inline constexpr int kControlTileRows = 32;
inline constexpr int kControlSplit = 4;

// Keys per KV tile for an element type and padded head dim (AttnTraits::kBlockN, for host code). fp32
// (SIMT path) halves it so its query tile and two K/V stages fit in an sm_80 multiprocessor's 163 KB; head
// dim 128 halves it so the score and output accumulators fit in registers without spills.
inline constexpr int kv_tile_cols(bool tensor_cores, int Dp) { return !tensor_cores || Dp > 80 ? 32 : 64; }
// ... of the sm_90a body kernel (sm90/body_layout.h HopperTraits::kBlockN): 64 at every head dim. Its consumer
// warps hold 16 rows, so a 64-key tile's scores and a head dim 128 output fit their registers, and a tile's fixed
// costs (its mbarriers, the softmax's reductions, the loop) are paid once per 64 keys.
inline constexpr int kHopperTileCols = 64;
// The plan's KV tile (api/config.h choose_config, geo.tile_cols) for the body kernel that runs the call.
inline constexpr int body_tile_cols(bool tensor_cores, int Dp, bool hopper) {
  return hopper ? kHopperTileCols : kv_tile_cols(tensor_cores, Dp);
}

// The padded head dim a head dim D runs as (0 = unsupported).
inline constexpr int padded_head_dim(int64_t D) { return D <= 64 ? 64 : D <= 80 ? 80 : D <= 128 ? 128 : 0; }

// K/V pipeline stages of the body walk (sm80/mainloop.h attn_kernel): 2 (tile n + 1 loads while tile n is
// computed) or 3 (tiles n + 1 and n + 2 in flight), chosen per call on the host (attn_api.cpp: 3 where the
// device's shared memory holds two CTAs per multiprocessor with it) and passed as AttnKernelParams::kv_stages.
template <typename Element_, int kHeadDim_, int kStages_ = 2>
struct AttnTraits {
  using Element = Element_;
  static constexpr bool kTensorCores = !std::is_same_v<Element, float>;
  static constexpr int kHeadDim = kHeadDim_;  // padded
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBlockM = kAttnTileRows;
  static constexpr int kWarpRows = kBlockM / kWarps;  // 32: two m16 blocks per warp
  static constexpr int kMBlocks = kWarpRows / 16;
  static constexpr int kBlockN = kv_tile_cols(kTensorCores, kHeadDim);  // keys per KV tile
  // Shared-memory rows are padded by 16 bytes: an odd number of 16-byte chunks per row puts the 8 row
  // addresses of every ldmatrix (and the fp32 path's float4 reads) in distinct banks.
  static constexpr int kStride = kHeadDim + 16 / int(sizeof(Element));
  static constexpr int kQElems = kBlockM * kStride;
  static constexpr int kKVElems = kBlockN * kStride;
  static constexpr int kStages = kStages_;  // K/V stages: tiles n + 1 .. n + kStages - 1 load while tile n is computed

  static_assert(kStages == 2 || kStages == 3, "two or three K/V stages");
  static_assert(kHeadDim % 16 == 0, "the padded head dim must be a multiple of the mma k (16)");
  static_assert(kBlockN % 16 == 0 && kBlockN <= 64, "KV tiles are 16..64 keys (one 64-bit column mask)");
  static_assert(kCtrlCols % 16 == 0 && kCtrlCols <= kBlockN, "control tiles are whole k16 steps");
  static_assert(kControlTileRows == kWarpRows && kControlSplit == kWarps, "control rows: one warp's, split over all");
  static_assert((kStride * sizeof(Element) / 16) % 2 == 1, "rows must be an odd number of 16-byte chunks");
  static_assert(kStride * sizeof(Element) % 16 == 0, "rows must stay 16-byte aligned for cp.async");
};

}  // namespace rangeswa::cuda
