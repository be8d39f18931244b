// Definition of simt_attn::run_attn_hopper (attn_simt.h), included by the per-dtype translation units.
#pragma once

#include "cuda/simt/simt.h"
// The kernels' sources and the launcher, unmodified, compiled for the host (simt.h force-included: the
// kernels run on its primitives, sm90/hopper.h's on simt_hopper.cpp).
#include "cuda/sm80/attn_launch.h"
#include "cuda/sm90/body_launch.h"
#include "cuda/simt/attn_simt.h"

namespace rangeswa::cuda::simt_attn {

template <typename Element, int kHeadDim>
size_t run_attn_hopper(const AttnKernelParams& p) {
  const cudaError_t err = cuda::run_attn_hopper<Element, kHeadDim>(p, nullptr);  // the device's launches
  if (err != cudaSuccess)
    throw ::simt::Error("simt: the sm_90a attn launcher refused the launch (cudaError " + std::to_string(int(err)) + ")");
  return hopper_smem_bytes<Element, kHeadDim>(p);
}

template <typename Element, int kHeadDim>
size_t hopper_smem(const AttnKernelParams& p) {
  return hopper_smem_bytes<Element, kHeadDim>(p);
}

}  // namespace rangeswa::cuda::simt_attn

#define RANGESWA_SIMT_INSTANTIATE_HOPPER(Element)                                                             \
  template size_t rangeswa::cuda::simt_attn::run_attn_hopper<Element, 64>(const rangeswa::cuda::AttnKernelParams&); \
  template size_t rangeswa::cuda::simt_attn::run_attn_hopper<Element, 80>(const rangeswa::cuda::AttnKernelParams&); \
  template size_t rangeswa::cuda::simt_attn::run_attn_hopper<Element, 128>(const rangeswa::cuda::AttnKernelParams&); \
  template size_t rangeswa::cuda::simt_attn::hopper_smem<Element, 64>(const rangeswa::cuda::AttnKernelParams&);     \
  template size_t rangeswa::cuda::simt_attn::hopper_smem<Element, 80>(const rangeswa::cuda::AttnKernelParams&);     \
  template size_t rangeswa::cuda::simt_attn::hopper_smem<Element, 128>(const rangeswa::cuda::AttnKernelParams&);
