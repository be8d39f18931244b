// The sm_90a body kernel's sizes and shared memory (sm90/body_kernel.h): the same plan as the mma.sync
// kernel, laid out on its own tile width (128-row query tiles, KV tiles of kHopperTileCols = 64 keys at every
// head dim, 16-column tiles for control keys, direct records and Hn bands), a producer warpgroup and consumer
// warpgroups of 64 rows a wgmma product (wgmma's M; HopperTraits::kMBlocks products a group), and every wgmma
// operand in shared memory in the canonical no-swizzle
// layout of core matrices (PTX ISA 9.7.15.5.1.2: 8 rows of 16 bytes, 128 contiguous bytes each).
//
// Core-matrix layout of a tile of R rows x Dp 16-bit columns (the query slot, a K or V stage, the Hn band's
// summary rows): element (row, d) at element offset (row / 8) 8 Dp + (d / 8) 64 + (row % 8) 8 + d % 8, i.e.
// 8-row groups 16 Dp bytes apart, the 16-byte chunks of a group 128 bytes apart. Read by wgmma through
//   K-major descriptors (the query slot as A, keys as B: mn = row, k = d): LBO = 128 (the next 8 d),
//     SBO = 16 Dp (the next 8 rows); the k16 step ks starts 256 ks bytes in;
//   MN-major descriptors (values as B of P V: mn = d, k = key): SBO = 128 (the next 8 d), LBO = 16 W (the
//     next 8 keys); the key step ks starts 32 W ks bytes in. A V stage's rows are W = Dp + 8 columns wide
//     (HopperTraits::kValueCols: the values, then a chunk of ones).
// A row's 16-byte chunks are whole, so the producer's cp.async copies and the slot's fills write 16 bytes at a
// time (common/query_slot.h slot_col<true> is the column part of this offset).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "../kernel_traits.h"
#include "../plan.h"
#include "../tile.h"
#include "../common/kv_copy.h"
#include "../common/shared_layout.h"

namespace rangeswa::cuda {

// kMBlocks_: the m16 blocks of rows a consumer warp holds, i.e. the m64 accumulators of its warpgroup's
// products. 1: two consumer warpgroups of 64 rows (warp w of group c: rows 64 c + 16 w ..), one CTA a
// multiprocessor. 2 (head dim 64): one consumer warpgroup of all 128 rows, two m64 products an operand tile
// (slot rows 0..63, then 64..127; warp w holds rows 32 w .. 32 w + 31, HopperTraits::slot_row), so a tile's
// waits, votes, barriers and loop count once for 32 rows a warp instead of 16, and two CTAs a multiprocessor
// (256 threads: the producer warpgroup at 24 registers, the consumers at 232) overlap one CTA's prologue,
// fills and epilogue with the other's tiles. Head dims 80 and 128 keep 1: two accumulators of P V's 44 or 68
// registers a thread would not fit with the scores.
template <typename Element_, int kHeadDim_, int kMBlocks_ = (kHeadDim_ == 64 ? 2 : 1)>
struct HopperTraits {
  using Element = Element_;
  static_assert(!std::is_same_v<Element, float>, "wgmma takes 16-bit operands: fp32 stays on the mma.sync kernel");
  static constexpr bool kTensorCores = true;
  static constexpr int kHeadDim = kHeadDim_;  // padded
  static constexpr int kBlockM = kAttnTileRows;                  // the plan's query tile
  static constexpr int kBlockN = kHopperTileCols;                 // the plan's KV tile (64 keys)
  static constexpr int kMBlocks = kMBlocks_;                     // m16 blocks a consumer warp, m64 products a group
  static constexpr int kWarpRows = 16 * kMBlocks;                // a consumer warp's rows
  static constexpr int kGroupRows = 64 * kMBlocks;               // a consumer warpgroup's rows
  static constexpr int kConsumers = kBlockM / kGroupRows;        // consumer warpgroups
  static constexpr int kConsumerThreads = 128 * kConsumers;
  static constexpr int kThreads = 128 + kConsumerThreads;        // warpgroup 0 produces
  static constexpr int kResident = kConsumers == 1 ? 2 : 1;      // CTAs a multiprocessor (__launch_bounds__)
  // K/V stages of the mbarrier ring: 4, or 3 where two CTAs share a multiprocessor (each with the plan's region
  // within half its shared memory: tests/test_simt_hopper_attn.py; the other CTA's copies overlap this one's).
  static constexpr int kStages = kResident == 2 ? 3 : 4;
  // setmaxnreg: the producer gives registers up, the consumers take them (per multiprocessor:
  // kResident x (128 x producer + kConsumerThreads x consumer) <= 64K).
  static constexpr int kProducerRegs = kResident == 2 ? 32 : 40;
  static constexpr int kConsumerRegs = kResident == 2 ? 224 : 232;
  // The registers a thread starts with: the CTA's pool that setmaxnreg draws on (.inc blocks until the pool has
  // them), so exactly the split's mean (168 for 384 threads, 128 for 256), which is also what
  // __launch_bounds__(kThreads, kResident) lets ptxas give (scripts/cuda_gates.py holds ptxas to it; the launcher
  // refuses another count, body_launch.h).
  static constexpr int kEntryRegs = (128 * kProducerRegs + kConsumerThreads * kConsumerRegs) / kThreads;
  static_assert(kEntryRegs * kThreads == 128 * kProducerRegs + kConsumerThreads * kConsumerRegs &&
                    kEntryRegs == 65536 / (kThreads * kResident) / 8 * 8,
                "the split's mean is a whole count, the launch bounds' cap");
  // The query slot row of CTA row r: warp w's block mb of rows (rows 16 mb .. of its kWarpRows) are rows 16 w ..
  // of the group's mb-th m64 product, whose A operand is slot rows 64 mb .. 64 mb + 63 (of the group's).
  // The identity where a warp holds one block.
  RSWA_HD static constexpr int slot_row(int r) {
    if constexpr (kMBlocks == 1) return r;
    else return (r / kGroupRows) * kGroupRows + 64 * ((r % kWarpRows) / 16) + 16 * ((r % kGroupRows) / kWarpRows) + r % 16;
  }
  static_assert(kMBlocks == 1 || (slot_row(16) == 64 && slot_row(32) == 16 && slot_row(127) == 127),
                "warp 0's second block is the second product's first rows, warp 1 the first product's next");
  static constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
  // The producer warpgroup's warps that copy (the others leave after setmaxnreg): one where a warp's 32 lanes
  // cover whole rows (head dims 64 and 128: a lane copies one 16-byte column of every (32 / kChunks)-th row,
  // its shared offsets constant steps from one base, producer.h ProducerLanes), so the steady state pays one
  // warp's loop overhead a tile instead of four; all four at head dim 80, whose chunks are placed one by one.
  static constexpr int kProducerWarps = 32 % kChunks == 0 ? 1 : 4;
  static constexpr int kProducerThreads = 32 * kProducerWarps;
  // The query slot's fills and the straddling blocks' dots issue more loads before using any than the
  // mma.sync kernel's (one CTA a multiprocessor: nothing else issues while the consumers wait on them): 16
  // rotated pairs a step (common/query_slot.h fill_row_vector: half / 16 round trips a fill, 2 at head dim 64), a whole
  // row of 16-byte chunks a term (straddling_dots: one round trip a term; two at head dim 128).
  static constexpr int kFillPairs = 16;
  static constexpr int kDotChunks = kChunks;
  // A V stage's rows hold the head dim's values and then one 16-byte chunk of ones (written once, before the
  // roles split; the producer copies the values only): P V over kValueCols columns gives each row's
  // probability sum in its last columns with the output, on the tensor cores, and the softmax adds no row sums
  // (32 FADD a thread and tile at head dim 64). The sum is of P as P V takes it (rounded to the element type).
  static constexpr int kValueCols = kHeadDim + 8;
  static constexpr int kKElems = kBlockN * kHeadDim;     // a K stage
  static constexpr int kVElems = kBlockN * kValueCols;   // a V stage

  static_assert(kMBlocks == 1 || kMBlocks == 2, "one or two m16 blocks a consumer warp");
  static_assert(kConsumers * kGroupRows == kBlockM, "whole consumer warpgroups");
  // The unmasked loop waits for tile n + 1 while it holds tile n's stage, and the producer arrives on tile
  // n + 1's full barrier only once it has issued tile n + 2, into the stage of tile n + 2 - kStages: that tile
  // must be one the consumers have released (n - 1 or earlier), so at least three stages.
  static_assert(kStages >= 3, "the ring needs three stages or more (the overlap holds one while waiting on the next)");
  static_assert(kResident * (128 * kProducerRegs + kConsumerThreads * kConsumerRegs) <= 65536, "the register file");
  static_assert(kHeadDim % 16 == 0 && kBlockN % 16 == 0, "whole k16 steps");
};

// Element offset of (row, d) in a core-matrix tile of Dp columns (the header comment).
template <int Dp>
RSWA_HD constexpr int core_row(int row) {
  return (row / 8) * 8 * Dp + (row % 8) * 8;
}
template <int Dp>
RSWA_HD int core_offset(int row, int d) {
  return core_row<Dp>(row) + slot_col<true>(d);
}

// Barrier ids of the consumers' named barriers (sm90/hopper.h named_barrier_*; 0 is __syncthreads'): both
// consumer warpgroups, then one per warpgroup.
inline constexpr int kConsumersBarrier = 1;
inline constexpr int kGroupBarrier0 = 2;

// Shared memory of the body kernel: the query slot, the K and V stages, the ring's mbarriers; per row its
// bounds in the current record, its straddling blocks' parts and a direct record's score, and per consumer
// warp the record whose bounds they hold; then the PlanRegion both body kernels share (common/shared_layout.h).
template <typename Traits>
struct HopperRows {
  using Element = typename Traits::Element;
  static constexpr int M = Traits::kBlockM, Dp = Traits::kHeadDim;
  static constexpr size_t kK = size_t(M) * Dp * sizeof(Element);
  static constexpr size_t kV = kK + size_t(Traits::kStages) * Traits::kKElems * sizeof(Element);
  static constexpr size_t kBars = kV + size_t(Traits::kStages) * Traits::kVElems * sizeof(Element);
  static constexpr size_t kRows = kBars + (size_t(2) * Traits::kStages * sizeof(uint64_t) + 15) / 16 * 16;
  static constexpr size_t kGeometry = kRows + size_t(M) * 7 * 4 + 4 * 8;
  static_assert(kK % 128 == 0 && kV % 128 == 0 && kBars % 16 == 0 && kRows % 16 == 0, "aligned tiles and barriers");
  static_assert(Traits::kConsumers * 4 <= 8, "a record index per consumer warp");
};

template <typename Traits>
struct HopperLayout
    : HopperRows<Traits>,
      PlanRegion<typename Traits::Element, Traits::kBlockM, HopperRows<Traits>::kGeometry,
                 size_t(Traits::kHeadDim) * sizeof(typename Traits::Element)> {};

}  // namespace rangeswa::cuda
