// The one online softmax of SPEC section 2 ("everything selected for row i goes into one softmax"),
// over the accumulator layout of common/warp_gemm.h: each lane holds rows g and g + 8 of each of its warp's m16
// blocks (row slot rr = 2 mb + h), the 4 lanes of a quad share a row. Logits arrive in base 2 (scale *
// log2(e) folded in, biases added before the max), -inf marking pairs the row does not see. fp32 running
// max and sum.
#pragma once

#include <cmath>

#include "../utils.h"

namespace rangeswa::cuda {

template <int MB>
struct OnlineSoftmax {
  static constexpr int R = 2 * MB;  // row slots per lane
  float m[R];  // running max (same in all 4 lanes of the quad)
  float l[R];  // this lane's share of the running sum (the quad's shares are added in finish())

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int rr = 0; rr < R; ++rr) {
      m[rr] = -INFINITY;
      l[rr] = 0.f;
    }
  }

  // Folds logits a x + b (a > 0, the same for every entry) into the state: x becomes the probabilities
  // exp2(a x + b - m_new), one FFMA and one ex2 each, and o (the unnormalised output, DT 8-column tiles per
  // m16 block) is rescaled by exp2(m_old - m_new). The row max is taken on x and mapped once (a x + b
  // rounds monotonically in x), so m_new is the max of the rounded logits. Logits computed beforehand
  // come with a = 1, b = 0 (x - m_new exactly as a subtraction).
  // The output is rescaled only when some row of the warp raised its max (a warp vote): past a record's
  // first tiles the maxima rarely move, and alpha = 1 exactly otherwise (FlashAttention-4's conditional
  // rescaling, without its threshold).
  // kRowSum false: the row sums are left to the caller (l stays 0): the sm_90a body kernel gets them from its
  // P V product, whose values carry a column of ones (sm90/body_layout.h kValueCols).
  template <int NT, int DT, bool kRowSum = true>
  __device__ __forceinline__ void update(float (&x)[MB][NT][4], float (&o)[MB][DT][4], float a, float b) {
    float alpha[R];
    if (fold<NT, kRowSum>(x, a, b, alpha)) rescale(o, alpha);
  }

  // update() in its two parts, also called apart by a kernel whose output accumulators are in flight while
  // it folds the next tile's scores (the sm_90a body kernel: P V of one tile runs during the softmax of the
  // next): fold() does the work on x and the state, leaving o alone, and returns the warp's vote on a raised
  // max with the factors in alpha; rescale() applies them to o once o may be written.
  template <int NT, bool kRowSum = true>
  __device__ __forceinline__ bool fold(float (&x)[MB][NT][4], float a, float b, float (&alpha)[R]) {
    bool raised = false;
#pragma unroll
    for (int mb = 0; mb < MB; ++mb)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int rr = 2 * mb + h;
        float mx = -INFINITY;
#pragma unroll
        for (int n = 0; n < NT; ++n) mx = fmaxf(mx, fmaxf(x[mb][n][2 * h], x[mb][n][2 * h + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m[rr], fmaf(mx, a, b));
        // A row that has seen nothing yet keeps m = -inf; shifting by 0 then turns every -inf into 0
        // instead of NaN. alpha = exp2(m_old - m_new): 0 from a row's first keys (m_old = -inf), exactly 1
        // when the max did not move (and for a row that has seen nothing: both -inf, shifted by 0).
        const float shift = m_new == -INFINITY ? 0.f : m_new;
        const float offset = b - shift;
        raised |= m_new != m[rr];
        alpha[rr] = exp2_approx(m[rr] - shift);
        m[rr] = m_new;
        [[maybe_unused]] float sum = 0.f;
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const float p = exp2_approx(fmaf(x[mb][n][2 * h + c], a, offset));
            x[mb][n][2 * h + c] = p;
            if constexpr (kRowSum) sum += p;
          }
        if constexpr (kRowSum) l[rr] = l[rr] * alpha[rr] + sum;
      }
    return __any_sync(0xffffffffu, raised);
  }
  template <int DT>
  __device__ __forceinline__ static void rescale(float (&o)[MB][DT][4], const float (&alpha)[R]) {
#pragma unroll
    for (int mb = 0; mb < MB; ++mb)
#pragma unroll
      for (int dt = 0; dt < DT; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[mb][dt][e] *= alpha[2 * mb + e / 2];
  }

  // Folds one more key (logit x, base 2) into row slot rr: rescales the row's output; the caller adds
  // p * value to its columns. Only lane `owner` of the quad counts p in the row sum. Returns p.
  template <int DT>
  __device__ __forceinline__ float update_one(int rr, float x, float (&o)[DT][4], int h, bool owner) {
    const float m_new = fmaxf(m[rr], x);
    const float shift = m_new == -INFINITY ? 0.f : m_new;
    const float alpha = exp2_approx(m[rr] - shift), p = exp2_approx(x - shift);
    m[rr] = m_new;
    l[rr] = l[rr] * alpha + (owner ? p : 0.f);
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
      o[dt][2 * h] *= alpha;
      o[dt][2 * h + 1] *= alpha;
    }
    return p;
  }

  // Row sums over the quad, in a fixed order (deterministic).
  __device__ __forceinline__ void finish(float (&row_sum)[R]) const {
#pragma unroll
    for (int rr = 0; rr < R; ++rr) {
      float s = l[rr];
      s += __shfl_xor_sync(0xffffffffu, s, 1);
      s += __shfl_xor_sync(0xffffffffu, s, 2);
      row_sum[rr] = s;
    }
  }
};

}  // namespace rangeswa::cuda
