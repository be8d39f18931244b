// Where the rows of a [B, H, N, D] input lie in memory, so kernels read strided views (ELF's v and
// LangFlow's q, k, v are slices of one qkv projection) without copying them first. Torch-free, shared
// by the CPU kernels, the CUDA kernels and the host emulation of the CUDA kernel.
#pragma once

#include <cstdint>

#include "rules.h"

namespace rangeswa {

// Element strides of a [B, H, N, D] tensor whose D elements are contiguous (FlashAttention's params
// carry the same batch / head / row strides): element (b, h, n, d) sits at at(b, h, n) + d.
struct RowStrides {
  int64_t batch, head, row;
  RSWA_HD int64_t at(int64_t b, int64_t h, int64_t n) const { return b * batch + h * head + n * row; }
};

}  // namespace rangeswa
