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

// The sequence of work item x of a packed (variable-length) launch: P holds `first`, the [S + 1] offsets of
// the sequences' work items (first[0] = 0, nondecreasing), and S; sequence s takes items [first[s],
// first[s + 1]) (attn_params.h PackedLaunch, prepare.h PackedPrepare, topk_blocks.h PackedTopk). A binary search.
template <typename P>
RSWA_HD int32_t packed_sequence(const P& pk, int64_t x) {
  int32_t lo = 0, hi = pk.S - 1;  // the last s with first[s] <= x
  while (lo < hi) {
    const int32_t mid = (lo + hi + 1) / 2;
    if (pk.first[mid] <= x) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

}  // namespace rangeswa
