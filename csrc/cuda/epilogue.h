// Writes a finished tile: out = O / l in the input dtype (the first D of the padded columns) and
// lse = (m + log2 l) * ln 2 in float32, natural log like the CPU kernel.
#pragma once

#include <cmath>
#include <cstdint>

#include "attn_params.h"
#include "utils.h"

namespace rangeswa::cuda {

// o, m, row_sum: one lane's rows r_lo and r_lo + 8 of the tile (accumulator layout, warp_gemm.h);
// row0: the tile's first row in the flattened [B * Hq * N] rows.
template <typename Traits>
__device__ __forceinline__ void write_output(const AttnKernelParams& p, const float (&o)[Traits::kHeadDim / 8][4],
                                             const float (&m)[2], const float (&row_sum)[2], int64_t row0, int nrows,
                                             int r_lo, int tq) {
  using Element = typename Traits::Element;
  constexpr float kLn2 = 0.6931471805599453f;
  Element* out = static_cast<Element*>(p.out);
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int r = r_lo + 8 * rr;
    if (r >= nrows) continue;
    const int64_t row = row0 + r;
    const float inv = 1.f / row_sum[rr];
#pragma unroll
    for (int dt = 0; dt < Traits::kHeadDim / 8; ++dt)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int d = dt * 8 + 2 * tq + c;
        if (d < p.D) out[row * p.D + d] = from_float<Element>(o[dt][2 * rr + c] * inv);
      }
    if (tq == 0) p.lse[row] = (m[rr] + log2f(row_sum[rr])) * kLn2;
  }
}

}  // namespace rangeswa::cuda
