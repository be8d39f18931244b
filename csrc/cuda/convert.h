// Element <-> float for the element types of the kernels (float, bfloat16, float16), host and device, so
// the host setup, the emulator and the kernels convert alike.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace rangeswa::cuda {

template <typename T>
__host__ __device__ __forceinline__ float to_float(T x) {
  return static_cast<float>(x);
}
template <>
__host__ __device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <>
__host__ __device__ __forceinline__ float to_float<__half>(__half x) {
  return __half2float(x);
}

template <typename T>
__host__ __device__ __forceinline__ T from_float(float x) {
  return static_cast<T>(x);
}
template <>
__host__ __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__host__ __device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}

}  // namespace rangeswa::cuda
