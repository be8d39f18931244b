// Small kernels run once per attn call before the fused kernel (the CPU kernel's prepare_keys):
// RoPE cos/sin tables, and the keys and values of every (batch, KV head) rotated to each position
// map a key range uses, with their G-block means (the summary keys and values of rule 4), all padded
// to the kernel's head dim with zeros (attn_params.h lists the arrays).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace rangeswa::cuda {

// cos/sin [count, rotary_half] (float) of positions first + s * step, or positions[s] (double) when
// `positions` is given; angles in double.
cudaError_t launch_rope_table(float* cos_out, float* sin_out, int64_t count, int rotary_half, double theta,
                              double first, double step, const double* positions, cudaStream_t stream);

struct PrepareParams {
  const void* k;  // [BH, N, D]: C control rows, then L body rows
  const void* v;
  void* keys_nat;   // [BH, nat_rows, Dp]
  void* values;     // [BH, nat_rows, Dp]
  void* keys_grp;   // [BH, grp_rows, Dp] or null
  void* keys_cond;  // [BH, L, Dp] or null
  const float *cos_nat, *sin_nat, *cos_grp, *sin_grp, *cos_cond, *sin_cond;
  int64_t BH, N, C, L, D, Dp;
  int64_t nat_rows, grp_rows;
  int64_t G;              // summary block
  bool summaries;         // write the block means (rangeswa)
  int64_t g, group_offset;  // the grouped key j sits at table row j / g + group_offset (position j / g)
  int rotary_half;
  bool interleaved;
};

template <typename Element>
cudaError_t launch_prepare(const PrepareParams& p, cudaStream_t stream);

}  // namespace rangeswa::cuda
