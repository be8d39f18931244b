// The block_summary op's kernel (SPEC section 5): per G-block means of rotated keys and of values.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "launch.h"
#include "utils.h"

namespace rangeswa::cuda {
namespace {

// One CTA per G-block, its row of the grid striding over the B*H heads; one thread per rotated pair or single
// dim.
template <typename Element>
__device__ void block_summary_of_head(const Element* k, const Element* v, const float* cos_t, const float* sin_t,
                                      Element* ks, Element* vs, int64_t bh, int64_t L, int64_t D, int64_t G,
                                      int half, bool interleaved) {
  const int64_t blk = blockIdx.x, nG = (L + G - 1) / G;
  const int64_t j0 = blk * G, j1 = j0 + G < L ? j0 + G : L;
  const int rotated_half = cos_t != nullptr ? half : 0;  // no positions: every dim passes through
  const int64_t units = rotated_half + (D - 2 * rotated_half);
  for (int64_t u = threadIdx.x; u < units; u += blockDim.x) {
    const bool pair = u < rotated_half;
    const int64_t ia = !pair ? 2 * rotated_half + (u - rotated_half) : interleaved ? 2 * u : u;
    const int64_t ib = !pair ? ia : interleaved ? 2 * u + 1 : u + rotated_half;
    double sk[2] = {0.0, 0.0}, sv[2] = {0.0, 0.0};
    for (int64_t j = j0; j < j1; ++j) {
      const Element* kr = k + (bh * L + j) * D;
      const Element* vr = v + (bh * L + j) * D;
      const float a = to_float(kr[ia]), b = to_float(kr[ib]);
      if (pair) {
        const float c = cos_t[j * half + u], s = sin_t[j * half + u];
        sk[0] += a * c - b * s;
        sk[1] += a * s + b * c;
      } else {
        sk[0] += a;
        sk[1] += b;
      }
      sv[0] += to_float(vr[ia]);
      sv[1] += to_float(vr[ib]);
    }
    const double n = double(j1 - j0);
    Element* kout = ks + (bh * nG + blk) * D;
    Element* vout = vs + (bh * nG + blk) * D;
    kout[ia] = from_float<Element>(float(sk[0] / n));
    kout[ib] = from_float<Element>(float(sk[1] / n));
    vout[ia] = from_float<Element>(float(sv[0] / n));
    vout[ib] = from_float<Element>(float(sv[1] / n));
  }
}

template <typename Element>
__global__ void block_summary_kernel(const Element* k, const Element* v, const float* cos_t, const float* sin_t,
                                     Element* ks, Element* vs, int64_t BH, int64_t L, int64_t D, int64_t G, int half,
                                     bool interleaved) {
  for (int64_t bh = blockIdx.y; bh < BH; bh += gridDim.y)  // utils.h grid_rows
    block_summary_of_head(k, v, cos_t, sin_t, ks, vs, bh, L, D, G, half, interleaved);
}

}  // namespace

template <typename Element>
cudaError_t launch_block_summary(const Element* k, const Element* v, const float* cos_t, const float* sin_t,
                                 Element* ks, Element* vs, int64_t BH, int64_t L, int64_t D, int64_t G,
                                 int rotary_half, bool interleaved, cudaStream_t stream) {
  const int64_t nG = (L + G - 1) / G;
  if (nG == 0 || BH == 0) return cudaSuccess;
  if (nG > int64_t(0x7fffffff)) return cudaErrorInvalidConfiguration;
  return RSWA_LAUNCH(block_summary_kernel<Element>, dim3(unsigned(nG), grid_rows(BH)), 128, 0, stream, k, v, cos_t,
                     sin_t, ks, vs, BH, L, D, G, rotary_half, interleaved);
}

template cudaError_t launch_block_summary<float>(const float*, const float*, const float*, const float*, float*,
                                                 float*, int64_t, int64_t, int64_t, int64_t, int, bool, cudaStream_t);
template cudaError_t launch_block_summary<__nv_bfloat16>(const __nv_bfloat16*, const __nv_bfloat16*, const float*,
                                                         const float*, __nv_bfloat16*, __nv_bfloat16*, int64_t,
                                                         int64_t, int64_t, int64_t, int, bool, cudaStream_t);
template cudaError_t launch_block_summary<__half>(const __half*, const __half*, const float*, const float*, __half*,
                                                  __half*, int64_t, int64_t, int64_t, int64_t, int, bool,
                                                  cudaStream_t);

}  // namespace rangeswa::cuda
