// The one online softmax of SPEC section 2 ("everything selected for row i goes into one softmax"),
// over the accumulator layout of warp_gemm.h: each lane holds rows g and g + 8, the 4 lanes of a quad
// share a row. Logits arrive in base 2 (scale * log2(e) folded in, summary bias log2(n_b) added
// before the max), -inf marking pairs the row does not see. fp32 running max and sum.
#pragma once

#include <cmath>

#include "utils.h"

namespace rangeswa::cuda {

template <int NT>
struct OnlineSoftmax {
  float m[2];  // running max of rows g, g + 8 (same in all 4 lanes of the quad)
  float l[2];  // this lane's share of the running sum (the quad's shares are added in finish())

  __device__ __forceinline__ void init() {
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.f;
  }

  // Folds logits x into the state: x becomes the probabilities exp2(x - m_new), and o (the unnormalised
  // output, DT 8-column tiles) is rescaled by exp2(m_old - m_new).
  template <int DT>
  __device__ __forceinline__ void update(float (&x)[NT][4], float (&o)[DT][4]) {
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < NT; ++n) mx = fmaxf(mx, fmaxf(x[n][2 * rr], x[n][2 * rr + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m[rr], mx);
      // A row that has seen nothing yet keeps m = -inf; shifting by 0 then turns every -inf into 0
      // instead of NaN.
      const float shift = m_new == -INFINITY ? 0.f : m_new;
      const float alpha = exp2_approx(m[rr] - shift);
      m[rr] = m_new;
      float sum = 0.f;
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float p = exp2_approx(x[n][2 * rr + c] - shift);
          x[n][2 * rr + c] = p;
          sum += p;
        }
      l[rr] = l[rr] * alpha + sum;
#pragma unroll
      for (int dt = 0; dt < DT; ++dt) {
        o[dt][2 * rr] *= alpha;
        o[dt][2 * rr + 1] *= alpha;
      }
    }
  }

  // Row sums over the quad, in a fixed order (deterministic).
  __device__ __forceinline__ void finish(float (&row_sum)[2]) const {
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      float s = l[rr];
      s += __shfl_xor_sync(0xffffffffu, s, 1);
      s += __shfl_xor_sync(0xffffffffu, s, 2);
      row_sum[rr] = s;
    }
  }
};

}  // namespace rangeswa::cuda
