// What every launch of an attention kernel checks (sm80/attn_launch.h, sm90/body_launch.h), written once: the
// kernel opted in to its dynamic shared memory above the default 48 KB, no launch for no CTA, and a grid one
// launch takes.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "../utils.h"

namespace rangeswa::cuda {

// The most CTAs one launch's grid takes (its x dimension).
constexpr int64_t kMaxGrid = 0x7fffffff;

// Opts `kernel` in to `smem` bytes of dynamic shared memory where it needs more than the default 48 KB.
template <typename Kernel>
cudaError_t opt_in_smem(Kernel kernel, size_t smem) {
  return smem > 48 * 1024 ? RSWA_OPT_IN_SMEM(kernel, smem) : cudaSuccess;
}

// One launch of `kernel` over `blocks` CTAs of `threads` threads and `smem` bytes of dynamic shared memory: opted
// in first (opt_in_smem), nothing launched for no CTA, cudaErrorInvalidConfiguration for a grid past kMaxGrid.
template <typename Kernel, typename Params>
cudaError_t launch_checked(Kernel kernel, int64_t blocks, int threads, size_t smem, cudaStream_t stream,
                           const Params& params) {
  if (const cudaError_t err = opt_in_smem(kernel, smem); err != cudaSuccess) return err;
  if (blocks == 0) return cudaSuccess;
  if (blocks > kMaxGrid) return cudaErrorInvalidConfiguration;
  return RSWA_LAUNCH(kernel, unsigned(blocks), threads, smem, stream, params);
}

}  // namespace rangeswa::cuda
