// The end of a body CTA, the same for both body kernels: a warp's output rows, staged in shared memory in the
// element type, to the output in 16-byte stores.
#pragma once

#include <cstdint>

#include "../utils.h"

namespace rangeswa::cuda {

// A warp's kRows output rows from tile row `first` on, staged `stride` elements apart (Dp elements a row), to `out`
// (rows of D elements, the tile's row 0 at output row out0): lane by lane in 16-byte chunks where rows of D
// elements stay 16-byte aligned, else element by element; rows past nrows and columns past D are not written.
template <typename Element, int Dp, int kRows>
__device__ __forceinline__ void store_staged_rows(Element* out, const Element* staged, int stride, int64_t out0,
                                                  int first, int32_t nrows, int D, int lane) {
  constexpr int kChunk = 16 / int(sizeof(Element)), kChunks = Dp / kChunk;
  if (D % kChunk == 0) {  // rows of D elements stay 16-byte aligned
#pragma unroll 1
    for (int x = lane; x < kRows * kChunks; x += 32) {
      const int row = first + x / kChunks, col = (x % kChunks) * kChunk;
      if (row < nrows && col < D)
        *reinterpret_cast<uint4*>(out + (out0 + row) * D + col) =
            *reinterpret_cast<const uint4*>(staged + row * stride + col);
    }
  } else {
#pragma unroll 1
    for (int x = lane; x < kRows * Dp; x += 32) {
      const int row = first + x / Dp, col = x % Dp;
      if (row < nrows && col < D) out[(out0 + row) * D + col] = staged[row * stride + col];
    }
  }
}

}  // namespace rangeswa::cuda
