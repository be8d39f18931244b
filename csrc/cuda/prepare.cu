// Rope tables and the prepared arrays of the fused attention (prepare.h): one warp per unit of tokens,
// lanes over the head dim (coalesced row reads and writes).
#include "prepare.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "rotary.h"
#include "utils.h"

namespace rangeswa::cuda {
namespace {

constexpr int kThreads = 128;

__global__ void rope_table_kernel(float* cos_out, float* sin_out, int64_t count, int half, double theta,
                                  const double* inv_freq, double first, double step, const double* positions) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= count * half) return;
  const int64_t s = idx / half;
  const int k = int(idx % half);
  const double pos = positions != nullptr ? positions[s] : first + double(s) * step;
  rope_cos_sin(pos, k, 2 * half, theta, inv_freq, cos_out + idx, sin_out + idx);
}

// One warp per unit (prepare.h): 4 units per CTA, units of all KV heads in one flat grid.
constexpr int kUnitsPerCta = kThreads / 32;

template <typename Element>
__global__ void __launch_bounds__(kThreads) prepare_kernel(const PrepareParams p, int32_t units) {
  const int64_t x = int64_t(blockIdx.x) * kUnitsPerCta + threadIdx.x / 32;
  if (x >= int64_t(units) * p.BH) return;
  prepare_unit<Element>(p, int32_t(x / units), int32_t(x % units), int(threadIdx.x % 32), 32);
}

// The vector preparation (prepare.h prepare_range): Dp / 8 lanes per unit, 32 / (Dp / 8) units per warp.
template <typename Element, bool kInterleaved, bool kLean>
__global__ void __launch_bounds__(kThreads) prepare_vector_kernel(const PrepareParams p, int32_t total) {
  const int lane = int(threadIdx.x % 32), per = prepare_dim_units(p), slots = p.by_dim_units.div(32);
  const int slot = p.by_dim_units.div(lane), w = lane - slot * per;
  const int32_t x = (int32_t(blockIdx.x) * kUnitsPerCta + int32_t(threadIdx.x / 32)) * slots + slot;
  if (slot >= slots || x >= total) return;
  const int32_t bh = p.by_units.div(x);
  prepare_range<Element, kInterleaved, kLean>(p, bh, x - bh * p.by_units.d, w);
}

// Packed calls (prepare.h PackedPrepare): CTA x is CTA x - first[s] of sequence s's own launch, on its
// parameters (s = layout.h packed_sequence).

template <typename Element>
__global__ void __launch_bounds__(kThreads) prepare_packed_kernel(const __grid_constant__ PackedPrepare pk) {
  const int32_t s = packed_sequence(pk, int64_t(blockIdx.x));
  const PrepareParams& p = pk.seq[s];
  const int32_t units = prepare_units(p);
  const int64_t x = (int64_t(blockIdx.x) - pk.first[s]) * kUnitsPerCta + threadIdx.x / 32;
  if (x >= int64_t(units) * p.BH) return;
  prepare_unit<Element>(p, int32_t(x / units), int32_t(x % units), int(threadIdx.x % 32), 32);
}

template <typename Element, bool kInterleaved, bool kLean>
__global__ void __launch_bounds__(kThreads) prepare_vector_packed_kernel(const __grid_constant__ PackedPrepare pk) {
  const int32_t s = packed_sequence(pk, int64_t(blockIdx.x));
  const PrepareParams& p = pk.seq[s];
  const int32_t total = prepare_units(p) * p.BH, cta = int32_t(int64_t(blockIdx.x) - pk.first[s]);
  const int lane = int(threadIdx.x % 32), per = prepare_dim_units(p), slots = p.by_dim_units.div(32);
  const int slot = p.by_dim_units.div(lane), w = lane - slot * per;
  const int32_t x = (cta * kUnitsPerCta + int32_t(threadIdx.x / 32)) * slots + slot;
  if (slot >= slots || x >= total) return;
  const int32_t bh = p.by_units.div(x);
  prepare_range<Element, kInterleaved, kLean>(p, bh, x - bh * p.by_units.d, w);
}

}  // namespace

cudaError_t launch_rope_table(float* cos_out, float* sin_out, int64_t count, int rotary_half, double theta,
                              const double* inv_freq, double first, double step, const double* positions,
                              cudaStream_t stream) {
  const int64_t n = count * rotary_half;
  if (n == 0) return cudaSuccess;
  const int threads = 256;
  return RSWA_LAUNCH(rope_table_kernel, unsigned((n + threads - 1) / threads), threads, 0, stream, cos_out, sin_out,
                     count, rotary_half, theta, inv_freq, first, step, positions);
}

template <typename Element>
cudaError_t launch_prepare(const PrepareParams& given, cudaStream_t stream) {
  const PrepareParams p = prepare_ready<Element>(given);
  const int32_t units = prepare_units(p);
  if (p.vector) {
    const int64_t total = int64_t(units) * p.BH, per_warp = 32 / prepare_dim_units(p);
    const int64_t ctas = (total + per_warp * kUnitsPerCta - 1) / (per_warp * kUnitsPerCta);
    if (ctas == 0) return cudaSuccess;
    if (total > int64_t(0x7fffffff)) return cudaErrorInvalidConfiguration;
    auto kernel = p.interleaved ? (p.lean() ? prepare_vector_kernel<Element, true, true>
                                            : prepare_vector_kernel<Element, true, false>)
                                : (p.lean() ? prepare_vector_kernel<Element, false, true>
                                            : prepare_vector_kernel<Element, false, false>);
    return RSWA_LAUNCH(kernel, unsigned(ctas), kThreads, 0, stream, p, int32_t(total));
  }
  const int64_t ctas = (int64_t(units) * p.BH + kUnitsPerCta - 1) / kUnitsPerCta;
  if (ctas == 0) return cudaSuccess;
  if (ctas > int64_t(0x7fffffff)) return cudaErrorInvalidConfiguration;
  return RSWA_LAUNCH(prepare_kernel<Element>, unsigned(ctas), kThreads, 0, stream, p, units);
}

template <typename Element>
cudaError_t launch_prepare_packed(const PackedPrepare& pk, int variant, int64_t ctas, cudaStream_t stream) {
  if (ctas == 0) return cudaSuccess;
  if (ctas > int64_t(0x7fffffff)) return cudaErrorInvalidConfiguration;
  auto kernel = variant == 1 ? prepare_vector_packed_kernel<Element, false, false>
                : variant == 2 ? prepare_vector_packed_kernel<Element, false, true>
                : variant == 3 ? prepare_vector_packed_kernel<Element, true, false>
                : variant == 4 ? prepare_vector_packed_kernel<Element, true, true>
                               : prepare_packed_kernel<Element>;
  return RSWA_LAUNCH(kernel, unsigned(ctas), kThreads, 0, stream, pk);
}

template cudaError_t launch_prepare_packed<float>(const PackedPrepare&, int, int64_t, cudaStream_t);
template cudaError_t launch_prepare_packed<__nv_bfloat16>(const PackedPrepare&, int, int64_t, cudaStream_t);
template cudaError_t launch_prepare_packed<__half>(const PackedPrepare&, int, int64_t, cudaStream_t);
template cudaError_t launch_prepare<float>(const PrepareParams&, cudaStream_t);
template cudaError_t launch_prepare<__nv_bfloat16>(const PrepareParams&, cudaStream_t);
template cudaError_t launch_prepare<__half>(const PrepareParams&, cudaStream_t);

}  // namespace rangeswa::cuda
