// Rule 4's summary bias log n_b and the ragged last G-block, the one device home: the bias of a G-block summary
// of n_b keys (the plan's Geometry holds the full blocks' and the last block's, plan.h make_geometry), the column
// of a summary tile that holds the ragged last block (tile.h ragged_column), and that column's shift in a warp's
// scores (common/logits.h tile_logits and the sm_90a kernel's whole tiles, sm90/consumer.h, call it). Host and
// device code; the shift is device code (nvcc or the SIMT emulation).
#pragma once

#include <cmath>
#include <cstdint>

#include "rules.h"

namespace rangeswa::cuda {

// The summary bias log2 n_b of a G-block of n_b keys (rule 4's log n_b over log 2), in double rounded to float.
inline float summary_bias_log2(int64_t keys) { return float(std::log2(double(keys))); }

// The bias of the last of the G-blocks of L keys (blocks of G; L - (blocks - 1) G keys, fewer than G when it is
// ragged); 0 for no key.
inline float last_block_bias_log2(int64_t L, int64_t G, int64_t blocks) {
  return L > 0 ? summary_bias_log2(L - (blocks - 1) * G) : 0.f;
}

// The column of the ragged last G-block in a tile of a record's keys, or -1 when the record's keys are not G-block
// summaries (`summaries`), the tile does not hold it, or it is not ragged (its bias is the full blocks'): g the
// plan's Geometry (nG blocks, log2_block and log2_last_block from the two functions above), t a tile of keys
// [t.a, t.a + t.n) (tile.h KvTile; tile.h ragged_column calls it).
// [gate:ragged-column begin]
template <typename Geometry, typename Tile>
RSWA_HD int32_t ragged_summary_column(bool summaries, const Geometry& g, const Tile& t) {
  if (!summaries || g.log2_last_block == g.log2_block) return -1;
  const int32_t last = g.nG - 1;
  return last >= t.a && last < t.a + t.n ? last - t.a : -1;
}
// [gate:ragged-column end]

#if defined(__CUDACC__) || defined(RANGESWA_SIMT)
// The ragged last G-block's own bias in the one tile that holds its summary: the scores of its column, bit `last`
// of the lane's columns (off(n, j): the lane's column n, j's bit; no column when the lane holds none), shifted by
// (its bias - the record's) / the scale, so that the softmax's a x + b carries its bias.
template <int MB, int NT, typename Off>
__device__ __forceinline__ void shift_ragged_column(float (&s)[MB][NT][4], int32_t last, float last_bias, float bias,
                                                    float scale_log2, Off off) {
  const float delta = __fdividef(last_bias - bias, scale_log2);  // so that a x + b has last_bias
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const float d = off(n, j) == last ? delta : 0.f;
#pragma unroll
      for (int mb = 0; mb < MB; ++mb)
#pragma unroll
        for (int h = 0; h < 2; ++h) s[mb][n][2 * h + j] += d;
    }
}
#endif

}  // namespace rangeswa::cuda
