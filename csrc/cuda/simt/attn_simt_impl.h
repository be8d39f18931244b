// Definition of simt_attn::run_attn (attn_simt.h), included by the per-dtype translation units.
#pragma once

#include "cuda/simt/simt.h"
// The kernel source and its launcher, unmodified, compiled for the host (the build force-includes simt.h: the kernels run on its primitives).
#include "cuda/attn_launch.h"
#include "cuda/simt/attn_simt.h"

namespace rangeswa::cuda::simt_attn {

template <typename Element, int kHeadDim>
size_t run_attn(const AttnKernelParams& p) {
  const cudaError_t err = cuda::run_attn<Element, kHeadDim>(p, nullptr);  // the device's launch (control and body tiles)
  if (err != cudaSuccess) throw ::simt::Error("simt: the attn launcher refused the launch (cudaError " +
                                              std::to_string(int(err)) + ")");
  return attn_smem_bytes<Element, kHeadDim>(p);
}

}  // namespace rangeswa::cuda::simt_attn

#define RANGESWA_SIMT_INSTANTIATE(Element)                                                          \
  template size_t rangeswa::cuda::simt_attn::run_attn<Element, 64>(const rangeswa::cuda::AttnKernelParams&); \
  template size_t rangeswa::cuda::simt_attn::run_attn<Element, 80>(const rangeswa::cuda::AttnKernelParams&); \
  template size_t rangeswa::cuda::simt_attn::run_attn<Element, 128>(const rangeswa::cuda::AttnKernelParams&);
