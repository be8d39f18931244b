// Host-side setup of one fused attention call, from the checked arguments (checks.h AttnParams): the
// sizes of the per-call arrays (rope tables, prepared keys / values / summaries) and the parameter
// structs of the preparation and attention kernels. Shared by the op (ops.cu) and by the host
// emulation that tests the kernels' plan on machines without a GPU (tests/test_ops_cuda.py).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "checks.h"
#include "cuda/attn_params.h"
#include "cuda/kernel_traits.h"
#include "cuda/prepare.h"

namespace rangeswa::cuda {

struct AttnPlan {
  int64_t Dp;                  // padded head dim (kernel_traits.h)
  int64_t BH;                  // B * H_kv rows of the prepared arrays
  int64_t nat_rows, grp_rows;  // rows per KV head (attn_params.h)
  bool grouping;               // keys_grp and the grouped table exist
  bool cond;                   // keys_cond and the conditioning table exist
  // Rope tables: rows and positions first + s * step of native, grouped and conditioning positions.
  int64_t nat_count, grp_count, cond_count;
  double grp_first, cond_step;
};

inline AttnPlan plan_attn(const AttnParams& ap) {
  const Rules& R = ap.rules;
  AttnPlan plan{};
  plan.Dp = padded_head_dim(ap.D);
  plan.BH = ap.B * ap.Hkv;
  const int64_t summaries = R.method == Method::kRangeSwa ? R.num_summary_blocks() : 0;
  plan.nat_rows = ap.C + ap.L + summaries;
  plan.grp_rows = ap.L + summaries;
  plan.grouping = R.grouping();
  plan.cond = conditioned(R, ap.C);
  const bool rotates = ap.rope.rotary_dim > 0 && ap.L > 0;
  plan.nat_count = rotates ? ap.L : 0;
  plan.grp_count = rotates && plan.grouping ? (ap.L - 1) / R.g + 2 * R.group_offset + 1 : 0;
  plan.cond_count = rotates && plan.cond ? ap.L : 0;
  plan.grp_first = plan.grouping ? double(-R.group_offset) : 0.0;  // grouped table row s = position s - c
  plan.cond_step = ap.control_position_scale;
  return plan;
}

// Device (or host) pointers of one call.
struct AttnBuffers {
  const void *q, *k, *v;  // inputs with contiguous rows (any batch / head / row strides)
  RowStrides q_strides, k_strides, v_strides;
  void* out;
  float* lse;
  void *keys_nat, *values, *keys_grp, *keys_cond;
  const float *cos_nat, *sin_nat, *cos_grp, *sin_grp, *cos_cond, *sin_cond;
  const int32_t* retrieved;  // [B, H_kv, nQb, retrieved_k] or null
  int64_t retrieved_k;
};

inline PrepareParams prepare_params(const AttnParams& ap, const AttnPlan& plan, const AttnBuffers& buf) {
  const Rules& R = ap.rules;
  PrepareParams pp{};
  pp.k = buf.k;
  pp.v = buf.v;
  pp.k_strides = buf.k_strides;
  pp.v_strides = buf.v_strides;
  pp.keys_nat = buf.keys_nat;
  pp.values = buf.values;
  pp.keys_grp = buf.keys_grp;
  pp.keys_cond = buf.keys_cond;
  pp.cos_nat = buf.cos_nat;
  pp.sin_nat = buf.sin_nat;
  pp.cos_grp = buf.cos_grp;
  pp.sin_grp = buf.sin_grp;
  pp.cos_cond = buf.cos_cond;
  pp.sin_cond = buf.sin_cond;
  pp.BH = plan.BH;
  pp.Hkv = ap.Hkv;
  pp.N = ap.N;
  pp.C = ap.C;
  pp.L = ap.L;
  pp.D = ap.D;
  pp.Dp = plan.Dp;
  pp.nat_rows = plan.nat_rows;
  pp.grp_rows = plan.grp_rows;
  pp.G = R.G;
  pp.summaries = R.method == Method::kRangeSwa;
  pp.g = plan.grouping ? R.g : 1;
  pp.group_offset = R.group_offset;
  pp.rotary_half = int(ap.rope.rotary_dim / 2);
  pp.interleaved = ap.rope.interleaved;
  return pp;
}

inline AttnKernelParams kernel_params(const AttnParams& ap, const AttnPlan& plan, const AttnBuffers& buf) {
  const Rules& R = ap.rules;
  const bool rangeswa = R.method == Method::kRangeSwa;
  AttnKernelParams p{};
  p.q = buf.q;
  p.q_strides = buf.q_strides;
  p.out = buf.out;
  p.lse = buf.lse;
  p.keys_nat = buf.keys_nat;
  p.keys_grp = buf.keys_grp;
  p.keys_cond = buf.keys_cond;
  p.values = buf.values;
  p.nat_rows = plan.nat_rows;
  p.grp_rows = plan.grp_rows;
  p.cos_nat = buf.cos_nat;
  p.sin_nat = buf.sin_nat;
  p.cos_grp = buf.cos_grp;
  p.sin_grp = buf.sin_grp;
  p.cos_cond = buf.cos_cond;
  p.sin_cond = buf.sin_cond;
  p.rotary_half = int(ap.rope.rotary_dim / 2);
  p.interleaved = ap.rope.interleaved;
  if (rangeswa && buf.retrieved != nullptr && buf.retrieved_k > 0) {
    p.retrieved = buf.retrieved;
    p.retrieved_k = buf.retrieved_k;
  }
  p.rules = R;
  p.B = ap.B;
  p.Hq = ap.Hq;
  p.Hkv = ap.Hkv;
  p.N = ap.N;
  p.C = ap.C;
  p.L = ap.L;
  p.D = ap.D;
  p.Nq = ap.Nq;
  p.first_row = ap.first_row;
  const double log2e = 1.4426950408889634;
  p.scale_log2 = float(ap.scale * log2e);
  p.control_bias_log2 = float(ap.control_bias * log2e);
  p.log2_block = float(std::log2(double(R.G)));
  p.log2_last_block = ap.L > 0 ? float(std::log2(double(R.block_size(R.num_summary_blocks() - 1)))) : 0.f;
  p.num_q_slots = plan.grouping ? 3 : (plan.cond ? 2 : 1);
  p.cond_queries = plan.cond;
  p.control_tiles = (ap.C + kAttnTileRows - 1) / kAttnTileRows;
  // rangeswa tiles stay inside one query block (rows of a tile share their retrieved blocks).
  p.tile_query_block = rangeswa ? R.Qb : kAttnTileRows;
  p.tiles_per_query_block =
      rangeswa ? (std::min(R.Qb, std::max<int64_t>(ap.L, 1)) + kAttnTileRows - 1) / kAttnTileRows : 1;
  // Only the query blocks holding rows of q (from first_row on, SPEC section 7) get tiles.
  p.first_tile_query_block = ap.first_row / p.tile_query_block;
  const int64_t blocks = (ap.L + p.tile_query_block - 1) / p.tile_query_block - p.first_tile_query_block;
  p.body_tiles = ap.Lq > 0 ? blocks * p.tiles_per_query_block : 0;
  return p;
}

// Calls the CUDA kernel does not run, with the reason (nullptr: supported). Section 7 lets a row see
// a summary block in part only when the causal block cb and G divide neither each other (a row's
// visible end then falls inside a G-block other than its own) and the window radius is below cb - 1
// (that block lies outside its window). Such a summary has a value of its own per row, which the
// kernel's shared summary tiles cannot hold; the CPU kernel and the reference compute it. CoLa's
// cb = G = 16 and every cb dividing or divided by G run here.
inline const char* cuda_unsupported(const AttnParams& ap) {
  const Rules& R = ap.rules;
  if (R.method == Method::kRangeSwa && R.cb > 0 && R.cb % R.G != 0 && R.G % R.cb != 0 && R.radius < R.cb - 1)
    return "attn on CUDA needs causal_block and summary_block to divide one another, or a window radius "
           "W // 2 of at least causal_block - 1 (otherwise a row can see a summary block in part, which only "
           "the CPU kernel computes); run this configuration on the CPU";
  return nullptr;
}

}  // namespace rangeswa::cuda
