// The sm_90a body kernel's producer (sm90/body_kernel.h): what the producer and the consumers share of a CTA
// (HopperCta), the mbarrier ring's position (RingSlot), and the producer warps' copies of the tiles of the spans
// into the ring (copy_tile_core, produce).
#pragma once

#include <cmath>
#include <cstdint>

#include "../attn_params.h"
#include "../plan.h"
#include "../tile.h"
#include "../utils.h"
#include "../common/kv_copy.h"
#include "../common/shared_layout.h"
#include "body_layout.h"
#include "hopper.h"

namespace rangeswa::cuda {

// What the producer and the consumers share of a body CTA: its shared arrays and the plan's counts.
template <typename Traits>
struct HopperCta {
  using Element = typename Traits::Element;
  Element *sQ, *sK, *sV;
  uint64_t *full, *empty;  // [kStages] each
  const Record* sRec;
  const TileSpan* sSpan;
  const RecordArrays<Element>* sArrays;
  const int32_t* sRet;
  int32_t *sLo, *sHi;     // [M]
  float *sMixA, *sMixB;   // [2][M]
  float* sRaw;            // [M]
  int32_t* sCurrent;      // per consumer warp
  RowGeometry* sRow;      // [M]
  Element* sBandK;        // [kBandBlocks][Dp], core-matrix layout
  float* sBand;           // [2][M][kBandStride]
  int32_t spans, k;
};

// A stage's position in the ring: the stage and the parity of its current use.
template <int kStages>
struct RingSlot {
  int stage = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void advance() {
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1u;
    }
  }
};

// The producer's copy of KV tile t into a stage (core-matrix layout; a full 64-key tile in tile_column order,
// as the mma.sync kernel's body tiles): 16-byte chunks round the kProducerThreads copying threads (one warp at
// head dims 64 and 128, the warpgroup at 80: HopperTraits::kProducerWarps), rows past t.n zero-filled (P = 0
// meets no garbage there, and window sums see scores of 0). kPasses: the passes a full tile takes (a 16-key
// tile stops early). Where a pass is whole rows (the threads a multiple of the row's chunks) a thread copies
// one 16-byte column of rows r0 + kStep i (r0 < kStep): the shared offset of pass i is the first pass's plus a
// constant (checked at compile time for every r0, in plain and in tile_column order), and its global addresses
// one pointer a tile plus constant steps (keys) or steps of the value rows' stride, so a copy costs a few
// instructions; other head dims (80) compute each chunk's place.
template <typename Traits>
struct ProducerLanes {
  static constexpr int Dp = Traits::kHeadDim, kChunks = Traits::kChunks, kThreads = Traits::kProducerThreads;
  static constexpr int kPasses = (Traits::kBlockN * kChunks + kThreads - 1) / kThreads;
  static constexpr bool kWholeRows = kThreads % kChunks == 0;
  static constexpr int kStep = kWholeRows ? kThreads / kChunks : 1;  // rows a pass
  static constexpr bool kPermuted = Traits::kBlockN == 64;
  static constexpr int W = Traits::kValueCols;  // a V stage's row (the values, then the chunk of ones)
  // Element offset of pass i's row from pass 0's, the lane's first row r0, in plain or tile_column order, in
  // a tile of kWidth-element rows (a K stage: Dp, a V stage: W).
  template <int kWidth>
  static constexpr int pass_offset(bool permuted, int r0, int i) {
    return permuted ? core_row<kWidth>(tile_column(r0 + kStep * i)) - core_row<kWidth>(tile_column(r0))
                    : core_row<kWidth>(r0 + kStep * i) - core_row<kWidth>(r0);
  }
  template <int kWidth>
  static constexpr bool constant_steps() {
    for (int r0 = 0; r0 < kStep; ++r0)
      for (int i = 0; i < kPasses; ++i)
        if (pass_offset<kWidth>(false, r0, i) != pass_offset<kWidth>(false, 0, i) ||
            (kPermuted && pass_offset<kWidth>(true, r0, i) != pass_offset<kWidth>(true, 0, i)))
          return false;
    return true;
  }
  static_assert(!kWholeRows || (constant_steps<Dp>() && constant_steps<W>()),
                "a pass's shared offset is the first's plus a constant");
  int r0, col;
  int at_k, at_v;  // core_offset of (r0, col) in a K and in a V stage, row r0 in tile_column order (64-key tiles)

  __device__ __forceinline__ explicit ProducerLanes(int pt) {
    r0 = pt / kChunks;
    col = (pt % kChunks) * 8;
    const int row = kPermuted ? tile_column(r0) : r0;
    at_k = core_row<Dp>(row) + slot_col<true>(col);
    at_v = core_row<W>(row) + slot_col<true>(col);
  }
};

template <typename Traits>
__device__ __forceinline__ void copy_tile_core(typename Traits::Element* sk, typename Traits::Element* sv,
                                               const RecordArrays<typename Traits::Element> ra, const KvTile& t,
                                               int pt, const ProducerLanes<Traits>& lanes) {
  using Lanes = ProducerLanes<Traits>;
  constexpr int Dp = Traits::kHeadDim, W = Traits::kValueCols, kChunks = Traits::kChunks, kPasses = Lanes::kPasses;
  const int32_t v_row = int32_t(ra.v_row);  // element offsets in one KV head fit 32 bits (attn_setup.h)
  const auto* gk = ra.k + t.a * Dp;
  const auto* gv = ra.v + t.a * v_row;
  const bool permute = Traits::kBlockN == 64 && t.width == 64;
  if constexpr (Lanes::kWholeRows) {
    constexpr int kStep = Lanes::kStep;
    // Element offsets from the tile's first row: row r0 + kStep i of the lane's column, or the column of row 0
    // (a valid address: nothing is read there) past the tile's keys.
    const int32_t k0 = lanes.r0 * Dp + lanes.col, v0 = lanes.r0 * v_row + lanes.col;
    if (t.n == Traits::kBlockN && t.width == Traits::kBlockN) {  // a whole tile (the steady state): no checks
      // Shared-window byte addresses of pass 0's chunks (whole tiles are 64 keys in tile_column order, or, at
      // head dim 128, plain), each pass a constant further: converted once, so a pass is its two copies.
      constexpr int kBytes = int(sizeof(typename Traits::Element));
      const uint32_t dk = hopper::smem_u32(sk + lanes.at_k), dv = hopper::smem_u32(sv + lanes.at_v);
      const auto* pk = gk + k0;
      const auto* pv = gv + v0;  // moved on by a pass's value rows (a run-time stride) after each pass
      const int32_t v_step = kStep * v_row;
#pragma unroll
      for (int i = 0; i < kPasses; ++i) {
        constexpr bool kPerm = Lanes::kPermuted;
        hopper::cp_async_16_shared(dk + kBytes * Lanes::template pass_offset<Dp>(kPerm, 0, i), pk + kStep * Dp * i, true);
        hopper::cp_async_16_shared(dv + kBytes * Lanes::template pass_offset<W>(kPerm, 0, i), pv, true);
        pv += v_step;
      }
      return;
    }
    // A tile's last keys, or a 16-key tile (rare: the edges of the spans): each pass's place computed, in a
    // loop (unrolled, the producer's 40 registers would not hold the passes' precomputed places).
#pragma unroll 1
    for (int i = 0; i < kPasses; ++i) {
      const int r = lanes.r0 + kStep * i;
      if (r >= t.width) break;
      const bool valid = r < t.n;
      const int row = permute ? tile_column(r) : r;
      cp_async_16(sk + core_offset<Dp>(row, lanes.col), gk + (valid ? k0 + kStep * Dp * i : lanes.col), valid);
      cp_async_16(sv + core_offset<W>(row, lanes.col), gv + (valid ? v0 + kStep * i * v_row : lanes.col), valid);
    }
  } else {
    const int chunks = t.width * kChunks;
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const int c = pt + Lanes::kThreads * i;
      if (c >= chunks) break;
      const int r = c / kChunks, col = (c % kChunks) * 8;
      const bool valid = r < t.n;
      const int row = permute ? tile_column(r) : r;
      const int32_t src = valid ? r : 0;
      cp_async_16(sk + core_offset<Dp>(row, col), gk + src * Dp + col, valid);
      cp_async_16(sv + core_offset<W>(row, col), gv + src * v_row + col, valid);
    }
  }
}

// The producer (thread pt of the producer warpgroup's first kProducerThreads): every tile of the spans into
// the ring, in the consumers' order.
template <typename Traits>
__device__ __forceinline__ void produce(const HopperCta<Traits>& c, int pt) {
  SpanCursor cursor;
  KvTile t;
  RingSlot<Traits::kStages> slot;
  int landing = -1;  // the stage whose copy is in flight behind the one issued last
  const ProducerLanes<Traits> lanes(pt);
#pragma unroll 1
  while (cursor.advance(c.sSpan, c.spans, t)) {
    hopper::mbarrier_wait_parity(&c.empty[slot.stage], slot.phase ^ 1u);  // its use one round ago is over
    copy_tile_core<Traits>(c.sK + slot.stage * Traits::kKElems, c.sV + slot.stage * Traits::kVElems,
                           c.sArrays[t.record], t, pt, lanes);
    cp_async_commit();
    if (landing >= 0) {
      cp_async_wait_group<1>();             // the tile before landed (this one may be in flight)
      hopper::fence_proxy_async_shared();   // generic-proxy writes, read next by wgmma (async proxy)
      hopper::mbarrier_arrive(&c.full[landing]);
    }
    landing = slot.stage;
    slot.advance();
  }
  if (landing >= 0) {
    cp_async_wait_all();
    hopper::fence_proxy_async_shared();
    hopper::mbarrier_arrive(&c.full[landing]);
  }
}

}  // namespace rangeswa::cuda
