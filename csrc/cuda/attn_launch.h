// Launch of the fused attention kernel for one (element type, padded head dim). Each instantiation
// lives in its own attn_hdim<D>_<dtype>.cu so the build compiles them in parallel; the host entry
// (attn_api.cpp) only sees the declaration in launch.h. The SIMT emulation runs this same launcher.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "attn_params.h"
#include "kernel_traits.h"
#include "mainloop.h"

namespace rangeswa::cuda {

template <typename Element, int kHeadDim>
size_t attn_smem_bytes(const AttnKernelParams& p) {
  return SharedLayout<AttnTraits<Element, kHeadDim>>::bytes(p.max_records, p.retrieved_k, p.geo.band_ok);
}

// Two launches on the stream: the control rows' CTAs (every head), then the body tiles' CTAs.
template <typename Element, int kHeadDim>
cudaError_t run_attn(const AttnKernelParams& params, cudaStream_t stream) {
  using Traits = AttnTraits<Element, kHeadDim>;
  const size_t smem = attn_smem_bytes<Element, kHeadDim>(params);
  auto kernel = attn_kernel<Traits>;
  if (smem > 48 * 1024) {
    const cudaError_t err = RSWA_OPT_IN_SMEM(kernel, smem);
    if (err != cudaSuccess) return err;
  }
  const int32_t control = params.control_tiles * params.control_chunks;
  for (const auto& [base, tiles] : {std::pair<int32_t, int32_t>{0, control}, {control, params.body_tiles}}) {
    const int64_t blocks = int64_t(tiles) * params.B * params.Hq;
    if (blocks == 0) continue;
    if (blocks > int64_t(0x7fffffff)) return cudaErrorInvalidConfiguration;
    AttnKernelParams p = params;
    p.tile_base = base;
    p.by_ctas_per_head = FastDiv::make(tiles);
    const cudaError_t err = RSWA_LAUNCH(kernel, unsigned(blocks), Traits::kThreads, smem, stream, p);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace rangeswa::cuda

// One instantiation per attn_hdim<D>_<dtype>.cu.
#define RANGESWA_INSTANTIATE_ATTN(Element, D)                                                             \
  template cudaError_t rangeswa::cuda::run_attn<Element, D>(const rangeswa::cuda::AttnKernelParams&,       \
                                                            cudaStream_t);                                \
  template size_t rangeswa::cuda::attn_smem_bytes<Element, D>(const rangeswa::cuda::AttnKernelParams&);
