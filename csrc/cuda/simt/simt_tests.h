// Test kernels of the SIMT emulation (simt_tests.cpp), called by simt_ops.cpp. Torch-free.
#pragma once

#include <string>
#include <vector>

namespace rangeswa::cuda::simt_tests {

// WarpGemm<AttnTraits<Element, D>> on one CTA of 4 warps: s = Q K^T (qk<cols>) and o = P V (pv<cols>), the
// accumulators written row-major. dtype: 0 float, 1 bfloat16, 2 half; q [128, D], k and v [cols, D] in it,
// p [128, cols] float; s [128, cols], o [128, D] float.
void warp_gemm(int dtype, int D, int cols, const void* q, const void* k, const void* v, const float* p, float* s,
               float* o);

// Runs the probe kernel `name` (simt_tests.cpp) on `in`; returns its output (8192 floats; CTA b of the barrier and shuffle probes at b * 1024).
std::vector<float> probe(const std::string& name, const std::vector<float>& in);

}  // namespace rangeswa::cuda::simt_tests
