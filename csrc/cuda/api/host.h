// Host helpers of the CUDA entry points (attn_api.cpp): a launch's error as an exception, the refusal to run
// inside a CUDA graph capture, the dispatch on the element type, the device's shared memory per CTA, a tensor's
// data or null. Compiled by the host compiler with ATen.
#pragma once

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace rangeswa::cuda {

inline void check_launch(cudaError_t err, const char* what) {
  TORCH_CHECK(err == cudaSuccess, what, " failed on the GPU: ", cudaGetErrorString(err));
}

// The ops that stage their launches on the host per call may not run while the device's current stream is
// captured into a CUDA graph: a packed call reads its offsets on the host (one sync) and sizes its launches by
// them, a rope table built on first use would be cached in memory the graph owns, given frequencies are copied
// from the host. Refused before any launch (a graph would replay launches staged for the captured call's values);
// their schemas carry the cudagraph_unsafe tag (csrc/rangeswa.cpp), so torch.compile(mode="reduce-overhead") runs
// them between its graphs. docs/gpu.md, "CUDA graphs".
inline void refuse_capture(const char* op, const at::Device& device) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  check_launch(cudaStreamIsCapturing(at::cuda::getCurrentCUDAStream(device.index()), &status), "capture status");
  TORCH_CHECK_NOT_IMPLEMENTED(status == cudaStreamCaptureStatusNone, "rangeswa::", op, " on CUDA cannot be "
                              "captured in a CUDA graph (it stages its launches on the host per call); compile the "
                              "model with torch.compile(mode=\"reduce-overhead\"), which runs it between its graphs, "
                              "or call it outside the capture");
}

// Runs f(Element{}) for the element type of a float32 / bfloat16 / float16 tensor.
template <typename F>
inline void dispatch_dtype(at::ScalarType type, const F& f) {
  if (type == at::kBFloat16) f(__nv_bfloat16{});
  else if (type == at::kHalf) f(__half{});
  else f(float{});
}

// Shared memory a CTA may opt in to on `device` (ATen caches the properties).
inline int max_shared_memory(const at::Device& device) {
  return int(at::cuda::getDeviceProperties(device.index())->sharedMemPerBlockOptin);
}

// A tensor's data, or null when it is undefined or empty.
template <typename T>
inline T* ptr_or_null(const at::Tensor& t) {
  return t.defined() && t.numel() > 0 ? static_cast<T*>(t.data_ptr()) : nullptr;
}

}  // namespace rangeswa::cuda
