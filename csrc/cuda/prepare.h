// The per-call preparation of the fused attention: the keys and values of every (batch, KV head) under
// each position map a key range uses, with their G-block means (rule 4's summary keys and values) and
// in-block prefix sums (blocks straddling Hn, plan.h mixed_block), padded to the kernel's head dim with
// zeros: the arrays of attn_params.h PreparedArrays. Host and device code: the preparation kernel runs
// prepare_unit with one warp per unit (lanes over the head dim), the host emulation with one lane.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "convert.h"
#include "layout.h"
#include "plan.h"
#include "rotary.h"
#include "rules.h"

namespace rangeswa::cuda {

// cos/sin [count, rotary_half] (float) of positions first + s * step, or positions[s] (double) when
// `positions` is given; angles in double.
cudaError_t launch_rope_table(float* cos_out, float* sin_out, int64_t count, int rotary_half, double theta,
                              double first, double step, const double* positions, cudaStream_t stream);

struct PrepareParams {
  const void* k;  // [B, Hkv, N, D]: C control rows, then L body rows; rows at k_strides.at(b, h, n)
  const void* v;  // likewise, at v_strides.at(b, h, n)
  RowStrides k_strides, v_strides;
  void *k_ctrl, *v_ctrl, *k_nat, *k_grp, *k_cond, *v_body, *s_nat, *s_grp, *s_v, *p_nat, *p_grp;
  int64_t ctrl_stride, body_stride, sum_stride;  // elements per KV head (attn_params.h)
  // cos/sin of integer positions (R(j) at row j, R(j / g) at row j / g) and of the conditioning
  // positions j T / L (row j), [rows, rotary_half].
  const float *cos_int, *sin_int, *cos_cond, *sin_cond;
  int32_t BH, Hkv, C, L, D, Dp, G, g, rotary_half;
  bool interleaved;
  int32_t unit_tokens;  // body tokens per unit: G when block means are written (whole blocks), else 32
  // The arrays hold body rows from row0 on (the prepare op's first_key, a multiple of unit_tokens; 0 in a
  // call): row j at j - row0, G-block b at b - row0 / G. Control rows are copied when k_ctrl is set.
  int32_t row0;

  RSWA_HD bool j_starts_block(int32_t j) const { return j % G == 0; }
};

RSWA_HD int32_t prepare_body_units(const PrepareParams& p) {
  return (p.L - p.row0 + p.unit_tokens - 1) / p.unit_tokens;
}
RSWA_HD int32_t prepare_units(const PrepareParams& p) {
  return prepare_body_units(p) + (p.k_ctrl != nullptr ? (p.C + p.unit_tokens - 1) / p.unit_tokens : 0);
}

// Unit `unit` of KV head bh: body tokens [unit * unit_tokens, ...) (or, past the body units, a run of
// control rows), dims lane, lane + lanes, ... of the padded head dim.
template <typename Element>
RSWA_HD void prepare_unit(const PrepareParams& p, int32_t bh, int32_t unit, int lane, int lanes) {
  const int32_t b = bh / p.Hkv, h = bh % p.Hkv;
  const Element* k = static_cast<const Element*>(p.k) + p.k_strides.at(b, h, 0);
  const Element* v = static_cast<const Element*>(p.v) + p.v_strides.at(b, h, 0);
  auto out = [&](void* base, int64_t stride, int64_t row) {
    return static_cast<Element*>(base) + bh * stride + row * p.Dp;
  };
  auto element = [&](const Element* row) {
    return [row, &p](int e) { return e < p.D ? to_float(row[e]) : 0.f; };
  };
  const int32_t body_units = prepare_body_units(p);
  if (unit >= body_units) {  // control rows, never rotated
    const int32_t c0 = (unit - body_units) * p.unit_tokens, c1 = imin(p.C, c0 + p.unit_tokens);
    for (int32_t c = c0; c < c1; ++c)
      for (int d = lane; d < p.Dp; d += lanes) {
        out(p.k_ctrl, p.ctrl_stride, c)[d] = from_float<Element>(element(k + c * p.k_strides.row)(d));
        out(p.v_ctrl, p.ctrl_stride, c)[d] = from_float<Element>(element(v + c * p.v_strides.row)(d));
      }
    return;
  }
  const int32_t j0 = p.row0 + unit * p.unit_tokens, j1 = imin(p.L, j0 + p.unit_tokens);
  const int32_t block0 = p.row0 / p.G;
  const int half = p.rotary_half;
  for (int d = lane; d < p.Dp; d += lanes) {
    // Running sums of the current G-block (fp32): rotated keys under each map, and values.
    float run_nat = 0.f, run_grp = 0.f, run_v = 0.f;
    for (int32_t j = j0; j < j1; ++j) {
      const auto x = element(k + (p.C + j) * p.k_strides.row);
      const float nat = rotated_element(x, d, half, p.interleaved, p.cos_int + j * half, p.sin_int + j * half);
      const float val = element(v + (p.C + j) * p.v_strides.row)(d);
      if (p.k_nat != nullptr) out(p.k_nat, p.body_stride, j - p.row0)[d] = from_float<Element>(nat);
      if (p.v_body != nullptr) out(p.v_body, p.body_stride, j - p.row0)[d] = from_float<Element>(val);
      if (p.k_cond != nullptr)
        out(p.k_cond, p.body_stride, j - p.row0)[d] =
            from_float<Element>(rotated_element(x, d, half, p.interleaved, p.cos_cond + j * half, p.sin_cond + j * half));
      if (p.j_starts_block(j)) run_nat = run_grp = run_v = 0.f;
      if (p.p_nat != nullptr) out(p.p_nat, p.body_stride, j - p.row0)[d] = from_float<Element>(run_nat);
      run_nat += nat;
      run_v += val;
      if (p.k_grp != nullptr) {
        const int32_t s = j / p.g;
        const float grp = rotated_element(x, d, half, p.interleaved, p.cos_int + s * half, p.sin_int + s * half);
        out(p.k_grp, p.body_stride, j - p.row0)[d] = from_float<Element>(grp);
        if (p.p_grp != nullptr) out(p.p_grp, p.body_stride, j - p.row0)[d] = from_float<Element>(run_grp);
        run_grp += grp;
      }
      // Rule 4: the block's means once its last token is in (units hold whole blocks when they are written).
      if (p.s_nat != nullptr && (j + 1 == j1 || p.j_starts_block(j + 1))) {
        const int32_t blk = j / p.G;
        const float n = float(j + 1 - blk * p.G);
        out(p.s_nat, p.sum_stride, blk - block0)[d] = from_float<Element>(run_nat / n);
        out(p.s_v, p.sum_stride, blk - block0)[d] = from_float<Element>(run_v / n);
        if (p.s_grp != nullptr) out(p.s_grp, p.sum_stride, blk - block0)[d] = from_float<Element>(run_grp / n);
      }
    }
  }
}

template <typename Element>
cudaError_t launch_prepare(const PrepareParams& p, cudaStream_t stream);

}  // namespace rangeswa::cuda
