// The rope op's kernel (SPEC sections 1 and 5): R(p) x at arbitrary positions, both pair styles,
// partial rotary dims. Angles are formed in double so large positions keep float precision.
#include "launch.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "rotary.h"
#include "utils.h"

namespace rangeswa::cuda {
namespace {

// One CTA per row of x [rows, D]; row r sits at positions[r % n].
template <typename Element>
__global__ void rope_kernel(const Element* __restrict__ x, const double* __restrict__ positions,
                            Element* __restrict__ out, int64_t rows, int64_t n, int64_t D, int rotary_dim,
                            double theta, const double* __restrict__ inv_freq, bool interleaved) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const double pos = positions[row % n];
    const int half = rotary_dim / 2;
    const Element* xr = x + row * D;
    Element* orow = out + row * D;
    for (int k = threadIdx.x; k < half; k += blockDim.x) {
      float c, s;
      rope_cos_sin(pos, k, rotary_dim, theta, inv_freq, &c, &s);
      const int ia = interleaved ? 2 * k : k, ib = interleaved ? 2 * k + 1 : k + half;
      const float a = to_float(xr[ia]), b = to_float(xr[ib]);
      orow[ia] = from_float<Element>(a * c - b * s);
      orow[ib] = from_float<Element>(a * s + b * c);
    }
    for (int64_t d = rotary_dim + threadIdx.x; d < D; d += blockDim.x) orow[d] = xr[d];
  }
}

}  // namespace

template <typename Element>
cudaError_t launch_rope(const Element* x, const double* positions, Element* out, int64_t rows, int64_t n, int64_t D,
                        int rotary_dim, double theta, const double* inv_freq, bool interleaved,
                        cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const unsigned blocks = unsigned(rows < (int64_t(1) << 30) ? rows : (int64_t(1) << 30));
  return RSWA_LAUNCH(rope_kernel<Element>, blocks, 64, 0, stream, x, positions, out, rows, n, D, rotary_dim, theta,
                     inv_freq, interleaved);
}

template cudaError_t launch_rope<float>(const float*, const double*, float*, int64_t, int64_t, int64_t, int, double,
                                        const double*, bool, cudaStream_t);
template cudaError_t launch_rope<__nv_bfloat16>(const __nv_bfloat16*, const double*, __nv_bfloat16*, int64_t, int64_t,
                                                int64_t, int, double, const double*, bool, cudaStream_t);
template cudaError_t launch_rope<__half>(const __half*, const double*, __half*, int64_t, int64_t, int64_t, int, double,
                                         const double*, bool, cudaStream_t);

}  // namespace rangeswa::cuda
