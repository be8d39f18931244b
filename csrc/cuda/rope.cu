// The rope op on CUDA (SPEC sections 1 and 5): R(p) x at arbitrary positions, both pair styles,
// partial rotary dims. Angles are formed in double so large positions keep float precision.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "checks.h"

namespace rangeswa::cuda {
namespace {

template <typename scalar_t>
__global__ void rope_kernel(const scalar_t* __restrict__ x, const double* __restrict__ positions,
                            scalar_t* __restrict__ out, int64_t rows, int64_t n, int64_t D, int64_t rotary_dim,
                            double log_theta, bool interleaved) {
  const int64_t row = blockIdx.x;
  if (row >= rows) return;
  const double pos = positions[row % n];
  const int64_t half = rotary_dim / 2;
  const scalar_t* xr = x + row * D;
  scalar_t* orow = out + row * D;
  for (int64_t k = threadIdx.x; k < half; k += blockDim.x) {
    const double inv_freq = exp(-2.0 * double(k) / double(rotary_dim) * log_theta);
    double s, c;
    sincos(pos * inv_freq, &s, &c);
    const int64_t ia = interleaved ? 2 * k : k, ib = interleaved ? 2 * k + 1 : k + half;
    const float a = static_cast<float>(xr[ia]), b = static_cast<float>(xr[ib]);
    orow[ia] = static_cast<scalar_t>(a * float(c) - b * float(s));
    orow[ib] = static_cast<scalar_t>(a * float(s) + b * float(c));
  }
  for (int64_t d = rotary_dim + threadIdx.x; d < D; d += blockDim.x) orow[d] = xr[d];
}

at::Tensor rope_cuda(const at::Tensor& x, const at::Tensor& positions, double theta, int64_t rotary_dim,
                     c10::string_view rope_style) {
  check_bhnd(x, "x");
  RopeParams rope = check_rope(x.size(3), theta, rotary_dim, rope_style);
  TORCH_CHECK_VALUE(positions.device() == x.device(), "positions must be on the device of x (", x.device(),
                    "), got ", positions.device());
  TORCH_CHECK_VALUE(positions.dim() == 1 && positions.size(0) == x.size(2),
                    "positions must be a 1-D tensor of ", x.size(2), " entries, got shape ", positions.sizes());
  TORCH_CHECK_VALUE(at::isFloatingType(positions.scalar_type()), "positions must be a floating tensor");
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor xc = x.contiguous();
  at::Tensor pos = positions.to(at::kDouble).contiguous();
  at::Tensor out = at::empty_like(xc);
  const int64_t rows = xc.numel() / std::max<int64_t>(1, xc.size(3));
  if (rows == 0) return out;
  const int threads = 64;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, xc.scalar_type(), "rangeswa_rope", [&] {
    rope_kernel<scalar_t><<<static_cast<unsigned>(rows), threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<scalar_t>(), pos.data_ptr<double>(), out.data_ptr<scalar_t>(), rows, xc.size(2), xc.size(3),
        rope.rotary_dim, std::log(rope.theta), rope.interleaved);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(rangeswa, CUDA, m) { m.impl("rope", &rope_cuda); }

}  // namespace rangeswa::cuda
