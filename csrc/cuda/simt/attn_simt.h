// The real attention kernel (mainloop.h attn_kernel) run through the host SIMT emulation: one launch per
// (element type, padded head dim), each instantiated in its own attn_simt_<dtype>.cpp. Torch-free.
#pragma once

#include <cstddef>

#include "cuda/attn_params.h"

namespace rangeswa::cuda::simt_attn {

// attn_kernel<AttnTraits<Element, kHeadDim>><<<CTAs, kThreads, SharedLayout::bytes(...)>>>(p), emulated;
// returns the dynamic shared memory bytes per CTA. Throws simt::Error on a misuse the emulator detects.
template <typename Element, int kHeadDim>
size_t run_attn(const AttnKernelParams& p);

}  // namespace rangeswa::cuda::simt_attn
