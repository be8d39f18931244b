// The control query rows' split-K merge (section 3: control rows see every key, so their work is split
// over the body keys, attn_params.h): part x (a chunk's warp) left a normalised partial output o_x and its
// base-2 log-sum-exp s_x (-inf and o_x = 0 where it saw no key); the row's log-sum-exp is s = log2 sum_x
// 2^s_x and its output sum_x 2^(s_x - s) o_x, FlashAttention's combine. Host and device code (the combine
// kernel and the emulator).
#pragma once

#include <cmath>
#include <cstdint>

#include "attn_params.h"

namespace rangeswa::cuda {

// Element d of control row c of query head `head` (b * Hq + h); d == D gives the row's log-sum-exp
// (natural log, like every lse the op returns).
RSWA_HD float combine_control(const AttnKernelParams& p, int64_t head, int32_t c, int32_t d) {
  const int64_t heads = int64_t(p.B) * p.Hq, C = p.geo.C;
  const int32_t parts = control_partials(p);
  auto at = [&](int32_t x) { return (x * heads + head) * C + c; };
  float mx = -INFINITY;
  for (int32_t x = 0; x < parts; ++x) mx = fmaxf(mx, p.ctrl_lse[at(x)]);
  float sum = 0.f, acc = 0.f;
  for (int32_t x = 0; x < parts; ++x) {
    const float w = exp2f(p.ctrl_lse[at(x)] - mx);
    sum += w;
    if (d < p.D) acc += w * p.ctrl_o[at(x) * p.Dp + d];
  }
  return d < p.D ? acc / sum : (mx + log2f(sum)) * 0.6931471805599453f;
}

}  // namespace rangeswa::cuda
