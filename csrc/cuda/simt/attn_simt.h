// The real attention kernel (sm80/mainloop.h attn_kernel) run through the host SIMT emulation: one launch per
// (element type, padded head dim), each instantiated in its own attn_simt_<dtype>.cpp. Torch-free.
#pragma once

#include <cstddef>

#include "cuda/attn_params.h"

namespace rangeswa::cuda::simt_attn {

// attn_kernel<AttnTraits<Element, kHeadDim>><<<CTAs, kThreads, SharedLayout::bytes(...)>>>(p), emulated;
// returns the dynamic shared memory bytes per CTA. Throws simt::Error on a misuse the emulator detects.
template <typename Element, int kHeadDim>
size_t run_attn(const AttnKernelParams& p);

// A packed call's sequences (pk in host memory) on attn_packed_kernel (sm80/attn_launch.h run_attn_packed: per_launch
// sequences a launch), emulated; attn_smem: the dynamic shared memory per CTA of one call (sm80/attn_launch.h
// attn_smem_bytes).
template <typename Element, int kHeadDim>
void run_attn_packed(const PackedLaunch& pk, int64_t blocks, int32_t kv_stages, size_t smem, int32_t per_launch);
template <typename Element, int kHeadDim>
size_t attn_smem(const AttnKernelParams& p);

// The sm_90a path (sm90/body_launch.h run_attn_hopper): the control CTAs on attn_kernel, the body tiles on
// hopper_attn_kernel<HopperTraits<Element, kHeadDim>> (256 threads at head dim 64, else 384), emulated; returns the body kernel's
// dynamic shared memory bytes per CTA. bf16 / fp16 (attn_simt_hopper_<dtype>.cpp).
template <typename Element, int kHeadDim>
size_t run_attn_hopper(const AttnKernelParams& p);
// ... and its body kernel's dynamic shared memory per CTA (sm90/body_launch.h hopper_smem_bytes).
template <typename Element, int kHeadDim>
size_t hopper_smem(const AttnKernelParams& p);

}  // namespace rangeswa::cuda::simt_attn
