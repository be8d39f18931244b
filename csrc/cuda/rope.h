// Launchers of the small standalone ops' kernels (rope.cu, block_summary.cu); torch-free, called by
// ops.cu after the input checks.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace rangeswa::cuda {

// out[r] = R(positions[r % n]) x[r] for the rows of x [rows, D] (rotary_dim dims rotated).
template <typename Element>
cudaError_t launch_rope(const Element* x, const double* positions, Element* out, int64_t rows, int64_t n, int64_t D,
                        int rotary_dim, double theta, bool interleaved, cudaStream_t stream);

// Rule 4's block means: ks[bh, b] = mean over G-block b of R(pos_j) k[bh, j] (no rotation when cos is
// null; cos/sin [L, rotary_half] from launch_rope_table), vs[bh, b] = mean of v; sums in double.
template <typename Element>
cudaError_t launch_block_summary(const Element* k, const Element* v, const float* cos_t, const float* sin_t,
                                 Element* ks, Element* vs, int64_t BH, int64_t L, int64_t D, int64_t G,
                                 int rotary_half, bool interleaved, cudaStream_t stream);

}  // namespace rangeswa::cuda
