// Definition of simt_attn::run_attn (attn_simt.h), included by the per-dtype translation units.
#pragma once

#include "cuda/simt/simt.h"
// The kernel source and its launcher, unmodified, compiled for the host (the build force-includes simt.h: the kernels run on its primitives).
#include "cuda/sm80/attn_launch.h"
#include "cuda/simt/attn_simt.h"

namespace rangeswa::cuda::simt_attn {

template <typename Element, int kHeadDim>
size_t run_attn(const AttnKernelParams& p) {
  const cudaError_t err = cuda::run_attn<Element, kHeadDim>(p, nullptr);  // the device's launch (control and body tiles)
  if (err != cudaSuccess) throw ::simt::Error("simt: the attn launcher refused the launch (cudaError " +
                                              std::to_string(int(err)) + ")");
  return attn_smem_bytes<Element, kHeadDim>(p);
}

template <typename Element, int kHeadDim>
void run_attn_packed(const PackedLaunch& pk, int64_t blocks, int32_t kv_stages, size_t smem, int32_t per_launch) {
  const cudaError_t err = cuda::run_attn_packed<Element, kHeadDim>(pk, blocks, kv_stages, smem, nullptr, per_launch);
  if (err != cudaSuccess) throw ::simt::Error("simt: the packed attn launcher refused the launch (cudaError " +
                                              std::to_string(int(err)) + ")");
}

template <typename Element, int kHeadDim>
size_t attn_smem(const AttnKernelParams& p) {
  return attn_smem_bytes<Element, kHeadDim>(p);
}

}  // namespace rangeswa::cuda::simt_attn

#define RANGESWA_SIMT_INSTANTIATE_D(Element, D)                                                             \
  template size_t rangeswa::cuda::simt_attn::run_attn<Element, D>(const rangeswa::cuda::AttnKernelParams&);   \
  template size_t rangeswa::cuda::simt_attn::attn_smem<Element, D>(const rangeswa::cuda::AttnKernelParams&);  \
  template void rangeswa::cuda::simt_attn::run_attn_packed<Element, D>(const rangeswa::cuda::PackedLaunch&,   \
                                                                        int64_t, int32_t, size_t, int32_t);
#define RANGESWA_SIMT_INSTANTIATE(Element)  \
  RANGESWA_SIMT_INSTANTIATE_D(Element, 64)  \
  RANGESWA_SIMT_INSTANTIATE_D(Element, 80)  \
  RANGESWA_SIMT_INSTANTIATE_D(Element, 128)
