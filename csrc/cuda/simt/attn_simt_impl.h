// Definition of simt_attn::run_attn (attn_simt.h), included by the per-dtype translation units.
#pragma once

#include "cuda/simt/simt.h"
// The kernel source, unmodified, compiled for the host (utils.h takes its RANGESWA_SIMT branch).
#include "cuda/mainloop.h"
#include "cuda/simt/attn_simt.h"

namespace rangeswa::cuda::simt_attn {

template <typename Element, int kHeadDim>
size_t run_attn(const AttnKernelParams& p) {
  using Traits = AttnTraits<Element, kHeadDim>;
  const size_t smem = SharedLayout<Traits>::bytes(p.max_records, p.retrieved_k, p.geo.band_ok);  // as attn_launch.h
  const int64_t blocks = (int64_t(p.control_tiles) * p.control_chunks + p.body_tiles) * p.B * p.Hq;
  if (blocks == 0) return smem;
  if (blocks > int64_t(0x7fffffff)) throw ::simt::Error("simt: grid too large");
  ::simt::launch(dim3(unsigned(blocks)), dim3(Traits::kThreads), smem, attn_kernel<Traits>, p);
  return smem;
}

}  // namespace rangeswa::cuda::simt_attn

#define RANGESWA_SIMT_INSTANTIATE(Element)                                                          \
  template size_t rangeswa::cuda::simt_attn::run_attn<Element, 64>(const rangeswa::cuda::AttnKernelParams&); \
  template size_t rangeswa::cuda::simt_attn::run_attn<Element, 80>(const rangeswa::cuda::AttnKernelParams&); \
  template size_t rangeswa::cuda::simt_attn::run_attn<Element, 128>(const rangeswa::cuda::AttnKernelParams&);
