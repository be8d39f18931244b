// Launch of the sm_90a body kernel (sm90/body_kernel.h) for one (element type, padded head dim): the
// control CTAs on the mma.sync kernel (sm80/attn_launch.h run_attn over a grid of the control tiles only: the
// same parameters with ctas_per_head = the control tiles), then the body tiles on the Hopper kernel (a grid
// of the body tiles only: ctas_per_head = the body tiles, which the kernel numbers past the control ones).
// Both kernels read the same plan. Each instantiation lives in attn_hopper_<dtype>.cu; the host entry
// (attn_api.cpp) sees launch.h's declarations. The SIMT emulation runs this launcher too.
#pragma once

#include <cuda_runtime.h>

#include "../attn_params.h"
#include "../launch.h"
#include "../plan.h"
#include "../common/launch_checks.h"
#include "body_kernel.h"
#include "body_layout.h"

namespace rangeswa::cuda {

template <typename Element, int kHeadDim>
size_t hopper_smem_bytes(const AttnKernelParams& p) {
  return HopperLayout<HopperTraits<Element, kHeadDim>>::bytes(p.max_records, p.retrieved_k, p.geo.band_ok);
}

// Whether the build holds the kernel's sm_90a code for the current device: the PTX it came from is 9.0 or
// later (a build without the 90a target leaves only the empty kernel of the sm_80 pass, or its PTX).
template <typename Element, int kHeadDim>
bool hopper_kernel_built() {
#if defined(RANGESWA_SIMT)
  return true;
#else
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, hopper_attn_kernel<HopperTraits<Element, kHeadDim>>) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return attr.ptxVersion >= 90 && attr.binaryVersion == 90;
#endif
}

template <typename Element, int kHeadDim>
cudaError_t run_attn_hopper(const AttnKernelParams& p, cudaStream_t stream) {
  using Traits = HopperTraits<Element, kHeadDim>;
  const int32_t control = p.control_tiles * p.control_chunks, body = p.by_ctas_per_head.d - control;
  if (control > 0) {
    AttnKernelParams pc = p;
    pc.by_ctas_per_head = FastDiv::make(control);
    cudaError_t err;
    // Lite's preparation folded into the control CTAs (attn_setup.h nat_keys_from_control: head dim 64 only).
    if constexpr (kHeadDim == 64)
      err = p.fold.s_v != nullptr ? run_control_fold<Element, kHeadDim>(pc, stream) : run_attn<Element, kHeadDim>(pc, stream);
    else err = run_attn<Element, kHeadDim>(pc, stream);
    if (err != cudaSuccess) return err;
  }
  const int64_t blocks = int64_t(body) * p.B * p.Hq;
  if (blocks == 0) return cudaSuccess;
  AttnKernelParams pb = p;
  pb.by_ctas_per_head = FastDiv::make(body);
  const size_t smem = hopper_smem_bytes<Element, kHeadDim>(p);
  auto kernel = hopper_attn_kernel<Traits>;
  // The registers at entry are the CTA's setmaxnreg pool: another count than the split's would leave the
  // consumers waiting on setmaxnreg.inc forever, so such a build is refused (the emulation models the pool).
#if !defined(RANGESWA_SIMT)
  cudaFuncAttributes attr{};
  if (const cudaError_t err = cudaFuncGetAttributes(&attr, kernel); err != cudaSuccess) return err;
  if (attr.numRegs != Traits::kEntryRegs) return cudaErrorInvalidConfiguration;
#endif
#if defined(RANGESWA_SIMT)
  ::simt::hopper::registers_at_entry(Traits::kEntryRegs);  // this launch's pool
#endif
  return launch_checked(kernel, blocks, Traits::kThreads, smem, stream, pb);
}

}  // namespace rangeswa::cuda

// One instantiation per attn_hopper_<dtype>.cu, for the three padded head dims.
#define RANGESWA_INSTANTIATE_ATTN_HOPPER(Element)                                                            \
  template cudaError_t rangeswa::cuda::run_attn_hopper<Element, 64>(const rangeswa::cuda::AttnKernelParams&,  \
                                                                    cudaStream_t);                           \
  template cudaError_t rangeswa::cuda::run_attn_hopper<Element, 80>(const rangeswa::cuda::AttnKernelParams&,  \
                                                                    cudaStream_t);                           \
  template cudaError_t rangeswa::cuda::run_attn_hopper<Element, 128>(const rangeswa::cuda::AttnKernelParams&, \
                                                                     cudaStream_t);                          \
  template size_t rangeswa::cuda::hopper_smem_bytes<Element, 64>(const rangeswa::cuda::AttnKernelParams&);   \
  template size_t rangeswa::cuda::hopper_smem_bytes<Element, 80>(const rangeswa::cuda::AttnKernelParams&);   \
  template size_t rangeswa::cuda::hopper_smem_bytes<Element, 128>(const rangeswa::cuda::AttnKernelParams&);  \
  template bool rangeswa::cuda::hopper_kernel_built<Element, 64>();                                          \
  template bool rangeswa::cuda::hopper_kernel_built<Element, 80>();                                          \
  template bool rangeswa::cuda::hopper_kernel_built<Element, 128>();
