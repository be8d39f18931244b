// The torch-free launchers of every CUDA kernel, called by the host entry points (attn_api.cpp) after
// all input checks. Each returns the launch's cudaError_t; none allocates.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "attn_params.h"
#include "prepare.h"
#include "topk_blocks.h"

namespace rangeswa::cuda {

// Rule 3's retrieved blocks sorted per (KV head, query block) and checked against `rules` (an invalid one
// is a device-side assertion: retrieved_blocks.h sort_retrieved), then the records of every body tile. `given` has
// `given_k` blocks per row (the call's K), `sorted` p.retrieved_k (attn_setup.h retrieved_room).
cudaError_t launch_plan(const AttnKernelParams& p, const Rules& rules, const int32_t* given, int32_t given_k,
                        int32_t* sorted, Record* records, int32_t* counts, int64_t plans, cudaStream_t stream);

// The control rows' outputs and log-sum-exp from their chunks (combine.h).
template <typename Element>
cudaError_t launch_combine(const AttnKernelParams& p, cudaStream_t stream);

// A packed call's sequences in one launch each (attn_params.h PackedLaunch; pk.first counts each kernel's
// own work items, attn_api.cpp packed_first): the retrieved blocks of every sequence sorted and checked (one
// job per sequence: its rules, its selection's blocks, pk.seq[s].retrieved the sorted rows; first[s] its
// first (KV head, query block) row), the plans of every body tile (first: plan threads), the control rows'
// combine (first: items Hq x C x (D + 1)).
struct SortJob {
  Rules rules;
  const int32_t* given;
  int32_t given_k;  // blocks per row of `given` (the sorted rows have pk.seq[s].retrieved_k)
};
cudaError_t launch_sort_packed(const PackedLaunch& pk, const SortJob* jobs, int64_t rows, cudaStream_t stream);
cudaError_t launch_plan_packed(const PackedLaunch& pk, int64_t plans, cudaStream_t stream);
template <typename Element>
cudaError_t launch_combine_packed(const PackedLaunch& pk, int64_t items, cudaStream_t stream);

// The fused attention kernel of one (element type, padded head dim): attn_hdim<D>_<dtype>.cu.
template <typename Element, int kHeadDim>
cudaError_t run_attn(const AttnKernelParams& p, cudaStream_t stream);
template <typename Element, int kHeadDim>
size_t attn_smem_bytes(const AttnKernelParams& p);
// ... its control CTAs alone, folding Lite's preparation in (sm80/attn_launch.h run_control_fold; head dim 64, 16-bit:
// attn_hdim64_<dtype>.cu) ...
template <typename Element, int kHeadDim>
cudaError_t run_control_fold(const AttnKernelParams& p, cudaStream_t stream);
// ... and for every sequence of a packed call, pk in host memory (sm80/attn_launch.h run_attn_packed: one launch per
// PackedAttnLaunch::kSeqs sequences).
template <typename Element, int kHeadDim>
cudaError_t run_attn_packed(const PackedLaunch& pk, int64_t blocks, int32_t kv_stages, size_t smem,
                            cudaStream_t stream, int32_t per_launch);

// The warp-specialized sm_90a body kernel (sm90/body_kernel.h) with the control CTAs on the mma.sync one:
// attn_hopper_<dtype>.cu (16-bit elements). hopper_kernel_built: whether the build holds its sm_90a code for
// the current device.
template <typename Element, int kHeadDim>
cudaError_t run_attn_hopper(const AttnKernelParams& p, cudaStream_t stream);
template <typename Element, int kHeadDim>
size_t hopper_smem_bytes(const AttnKernelParams& p);
template <typename Element, int kHeadDim>
bool hopper_kernel_built();

// out[r] = R(positions[r % n]) x[r] for the rows of x [rows, D] (rotary_dim dims rotated): rope.cu.
template <typename Element>
cudaError_t launch_rope(const Element* x, const double* positions, Element* out, int64_t rows, int64_t n, int64_t D,
                        int rotary_dim, double theta, const double* inv_freq, bool interleaved,
                        cudaStream_t stream);

// Rule 4's block means: ks[bh, b] = mean over G-block b of R(pos_j) k[bh, j] (no rotation when cos is
// null; cos/sin [L, rotary_half] from launch_rope_table), vs[bh, b] = mean of v; sums in double:
// block_summary.cu.
template <typename Element>
cudaError_t launch_block_summary(const Element* k, const Element* v, const float* cos_t, const float* sin_t,
                                 Element* ks, Element* vs, int64_t BH, int64_t L, int64_t D, int64_t G,
                                 int rotary_half, bool interleaved, cudaStream_t stream);

}  // namespace rangeswa::cuda
