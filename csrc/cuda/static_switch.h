// Runtime choices -> template parameters, in one place (FlashAttention's static_switch.h). The kernel
// instantiations this dispatches to are declared here and defined one per attn_hdim<D>_<dtype>.cu.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "attn_params.h"
#include "kernel_traits.h"

namespace rangeswa::cuda {

template <typename Element, int kHeadDim>
cudaError_t run_attn(const AttnKernelParams& p, cudaStream_t stream);

}  // namespace rangeswa::cuda

// DTYPE_SWITCH(dtype, T, ...): runs the lambda body with `using T = float / __nv_bfloat16 / __half`.
#define DTYPE_SWITCH(DTYPE, T, ...)                           \
  [&] {                                                       \
    switch (DTYPE) {                                          \
      case ::rangeswa::cuda::DType::kBFloat16: {              \
        using T = __nv_bfloat16;                              \
        return __VA_ARGS__();                                 \
      }                                                       \
      case ::rangeswa::cuda::DType::kHalf: {                  \
        using T = __half;                                     \
        return __VA_ARGS__();                                 \
      }                                                       \
      default: {                                              \
        using T = float;                                      \
        return __VA_ARGS__();                                 \
      }                                                       \
    }                                                         \
  }()

// HEADDIM_SWITCH(D, kHeadDim, ...): the padded head dim of kernel_traits.h padded_head_dim (64, 80,
// 128); the caller has rejected D > 128.
#define HEADDIM_SWITCH(D, HEADDIM, ...)                       \
  [&] {                                                       \
    if ((D) <= 64) {                                          \
      constexpr int HEADDIM = 64;                             \
      return __VA_ARGS__();                                   \
    } else if ((D) <= 80) {                                   \
      constexpr int HEADDIM = 80;                             \
      return __VA_ARGS__();                                   \
    } else {                                                  \
      constexpr int HEADDIM = 128;                            \
      return __VA_ARGS__();                                   \
    }                                                         \
  }()
