// One mma.sync warp's KV tile (scores, logits, softmax, P V): the mma.sync body CTA's and every control CTA's.
#pragma once

#include "logits.h"
#include "softmax.h"
#include "warp_gemm.h"

namespace rangeswa::cuda {

// One KV tile of kCols columns for one warp: scores, logits, softmax, PV. In a window tile with its
// edges' summaries, a row's keys outside its bounds take their G-block's mean score. kLogits = false: the
// unmasked loop's tile (full, no column fix-up), with no logit code at all.
template <typename Traits, int kCols, bool kLogits = true>
__device__ __forceinline__ void warp_tile(float (&o)[Traits::kMBlocks][Traits::kHeadDim / 8][4],
                                          OnlineSoftmax<Traits::kMBlocks>& softmax,
                                          const WarpTile<typename Traits::Element>& w) {
  constexpr int MB = Traits::kMBlocks, NT = kCols / 8;
  static_assert(kCols != 64 || Traits::kBlockN == 64, "only full 64-key tiles are stored permuted");
  float s[MB][NT][4];
  if (w.given == nullptr) WarpGemm<Traits>::template qk<kCols>(s, w.q, w.k, w.lane);
  else given_scores<MB, NT>(s, w.given, w.given_rows, w.given_cols, w.row0, w.lane % 4);
  if constexpr (kLogits) tile_logits<MB, kCols>(s, w);
  softmax.template update<NT, Traits::kHeadDim / 8>(s, o, w.scale_log2, w.bias);
  WarpGemm<Traits>::template pv<kCols>(o, s, w.v, w.lane);
}

}  // namespace rangeswa::cuda
