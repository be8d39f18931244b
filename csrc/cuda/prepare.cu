// Rope tables and the prepared keys / values / summaries of the fused attention (prepare.h).
#include "prepare.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "rotary.h"

namespace rangeswa::cuda {
namespace {

constexpr int kThreads = 128;

__global__ void rope_table_kernel(float* cos_out, float* sin_out, int64_t count, int half, double theta,
                                  double first, double step, const double* positions) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= count * half) return;
  const int64_t s = idx / half;
  const int k = int(idx % half);
  const double pos = positions != nullptr ? positions[s] : first + double(s) * step;
  rope_cos_sin(pos, k, 2 * half, theta, cos_out + idx, sin_out + idx);
}

// grid (chunks, B * H_kv): one CTA per chunk of a KV head, one thread per unit.
template <typename Element>
__global__ void __launch_bounds__(kThreads) prepare_kernel(const PrepareParams p) {
  for (int u = threadIdx.x; u < prepare_units(p); u += blockDim.x) prepare_unit<Element>(p, blockIdx.y, blockIdx.x, u);
}

}  // namespace

cudaError_t launch_rope_table(float* cos_out, float* sin_out, int64_t count, int rotary_half, double theta,
                              double first, double step, const double* positions, cudaStream_t stream) {
  const int64_t n = count * rotary_half;
  if (n == 0) return cudaSuccess;
  const int threads = 256;
  rope_table_kernel<<<unsigned((n + threads - 1) / threads), threads, 0, stream>>>(cos_out, sin_out, count, rotary_half,
                                                                                   theta, first, step, positions);
  return cudaGetLastError();
}

template <typename Element>
cudaError_t launch_prepare(const PrepareParams& p, cudaStream_t stream) {
  const int64_t chunks = prepare_body_chunks(p) + prepare_control_chunks(p);
  if (chunks == 0 || p.BH == 0) return cudaSuccess;
  if (chunks > int64_t(0x7fffffff) || p.BH > 65535) return cudaErrorInvalidConfiguration;
  prepare_kernel<Element><<<dim3(unsigned(chunks), unsigned(p.BH)), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

template cudaError_t launch_prepare<float>(const PrepareParams&, cudaStream_t);
template cudaError_t launch_prepare<__nv_bfloat16>(const PrepareParams&, cudaStream_t);
template cudaError_t launch_prepare<__half>(const PrepareParams&, cudaStream_t);

}  // namespace rangeswa::cuda
