// Launch of the fused attention kernel for one (element type, padded head dim). Each instantiation
// lives in its own attn_hdim<D>_<dtype>.cu so the build compiles them in parallel; the host entry
// (attn_api.cpp) only sees the declaration in launch.h. The SIMT emulation runs this same launcher.
#pragma once

#include <cuda_runtime.h>

#include <memory>

#include "../attn_params.h"
#include "../kernel_traits.h"
#include "../common/launch_checks.h"
#include "mainloop.h"

namespace rangeswa::cuda {

// The kernel's traits for p.kv_stages: three K/V stages only on the tensor-core path (fp32, the SIMT FFMA
// path, keeps two: one instantiation per file less to compile).
template <typename Element, int kHeadDim, typename F>
auto with_traits(const AttnKernelParams& p, const F& f) {
  if constexpr (AttnTraits<Element, kHeadDim>::kTensorCores)
    if (p.kv_stages == 3) return f(AttnTraits<Element, kHeadDim, 3>{});
  return f(AttnTraits<Element, kHeadDim, 2>{});
}

template <typename Element, int kHeadDim>
size_t attn_smem_bytes(const AttnKernelParams& p) {
  return with_traits<Element, kHeadDim>(p, [&](auto traits) {
    return SharedLayout<decltype(traits)>::bytes(p.max_records, p.retrieved_k, p.geo.band_ok);
  });
}

// One launch of the kernel kernel_of(traits) (attn_kernel or control_kernel of p.kv_stages' traits) over p's CTAs,
// per head by_ctas_per_head of them.
template <typename Element, int kHeadDim, typename KernelOf>
cudaError_t launch_tiles(const AttnKernelParams& p, cudaStream_t stream, const KernelOf& kernel_of) {
  return with_traits<Element, kHeadDim>(p, [&](auto traits) -> cudaError_t {
    using Traits = decltype(traits);
    const size_t smem = SharedLayout<Traits>::bytes(p.max_records, p.retrieved_k, p.geo.band_ok);
    const int64_t blocks = int64_t(p.by_ctas_per_head.d) * p.B * p.Hq;
    return launch_checked(kernel_of(traits), blocks, Traits::kThreads, smem, stream, p);
  });
}

// One launch: per head, the control rows' CTAs, then the body tiles' (attn_params.h query_tile). The
// control CTAs ride among the body CTAs instead of running as a grid of their own before them: no launch
// gap and no tail of a control-only grid between the two.
template <typename Element, int kHeadDim>
cudaError_t run_attn(const AttnKernelParams& p, cudaStream_t stream) {
  return launch_tiles<Element, kHeadDim>(p, stream, [](auto traits) { return attn_kernel<decltype(traits)>; });
}

// The control CTAs alone, folding Lite's preparation in (common/control.h control_kernel): p's CTAs per head are its
// control tiles (sm90/body_launch.h run_attn_hopper's control grid when p.fold is set). Head dim 64, 16-bit.
template <typename Element, int kHeadDim>
cudaError_t run_control_fold(const AttnKernelParams& p, cudaStream_t stream) {
  return launch_tiles<Element, kHeadDim>(p, stream, [](auto traits) { return control_kernel<decltype(traits)>; });
}

// Every sequence of a packed call on the attention kernel (sm80/mainloop.h attn_packed_kernel): pk in host memory (the
// sequences' parameters and first CTAs, packed.h PackedCalls::attn_launch), `blocks` CTAs in all (pk.first[S]),
// `smem` bytes per CTA (the largest of the sequences' attn_smem_bytes), the traits of `kv_stages` (every
// sequence's p.kv_stages; attn_api.cpp groups them). The sequences with CTAs go `per_launch` (at most
// PackedAttnLaunch::kSeqs; fewer: the SIMT emulation's tests) to a launch: one launch for any call of up to that many.
// At a head dim where attn_params.h packed_per_sequence holds (128), each sequence with CTAs is a launch of
// attn_kernel of its own (run_attn: its CTAs, its shared memory) and attn_packed_kernel is not instantiated.
template <typename Element, int kHeadDim>
cudaError_t run_attn_packed(const PackedLaunch& pk, int64_t blocks, int32_t kv_stages, size_t smem,
                            cudaStream_t stream, int32_t per_launch) {
  if constexpr (packed_per_sequence(kHeadDim)) {
    if (blocks != pk.first[pk.S]) return cudaErrorInvalidValue;
    for (int32_t s = 0; s < pk.S; ++s) {
      if (pk.first[s + 1] == pk.first[s]) continue;  // no CTAs in this stage count's launch
      const cudaError_t err = run_attn<Element, kHeadDim>(pk.seq[s], stream);
      if (err != cudaSuccess) return err;
    }
    return cudaSuccess;
  } else {
    AttnKernelParams probe{};
    probe.kv_stages = kv_stages;
    return with_traits<Element, kHeadDim>(probe, [&](auto traits) -> cudaError_t {
      using Traits = decltype(traits);
      auto kernel = attn_packed_kernel<Traits>;
      if (const cudaError_t err = opt_in_smem(kernel, smem); err != cudaSuccess) return err;
      if (blocks == 0) return cudaSuccess;
      if (blocks != pk.first[pk.S]) return cudaErrorInvalidValue;
      auto launch = std::make_unique<PackedAttnLaunch>();  // ~32 KB: off the stack
      PackedAttnLaunch& one = *launch;
      int32_t s = 0;
      while (s < pk.S) {
        one.S = 0;
        one.first[0] = 0;
        for (; s < pk.S && one.S < imin(imax(per_launch, 1), PackedAttnLaunch::kSeqs); ++s) {
          const int64_t ctas = pk.first[s + 1] - pk.first[s];
          if (ctas == 0) continue;
          if (ctas > kMaxGrid) return cudaErrorInvalidConfiguration;
          if (one.first[one.S] + ctas > kMaxGrid) break;  // the next launch's
          one.seq[one.S] = pk.seq[s];
          one.first[one.S + 1] = int32_t(one.first[one.S] + ctas);
          ++one.S;
        }
        const int32_t grid = one.first[one.S];
        if (grid == 0) continue;
        const cudaError_t err = RSWA_LAUNCH(kernel, unsigned(grid), Traits::kThreads, smem, stream, one);
        if (err != cudaSuccess) return err;
      }
      return cudaSuccess;
    });
  }
}

}  // namespace rangeswa::cuda

// One instantiation per attn_hdim<D>_<dtype>.cu.
#define RANGESWA_INSTANTIATE_ATTN(Element, D)                                                             \
  template cudaError_t rangeswa::cuda::run_attn<Element, D>(const rangeswa::cuda::AttnKernelParams&,       \
                                                            cudaStream_t);                                \
  template size_t rangeswa::cuda::attn_smem_bytes<Element, D>(const rangeswa::cuda::AttnKernelParams&);       \
  template cudaError_t rangeswa::cuda::run_attn_packed<Element, D>(const rangeswa::cuda::PackedLaunch&, int64_t, \
                                                                   int32_t, size_t, cudaStream_t, int32_t);
// ... and, at head dim 64 in bf16 / fp16, the control kernel that folds Lite's preparation in.
#define RANGESWA_INSTANTIATE_CONTROL_FOLD(Element, D)                                                      \
  template cudaError_t rangeswa::cuda::run_control_fold<Element, D>(const rangeswa::cuda::AttnKernelParams&, \
                                                                     cudaStream_t);
