// Test entry points of the Hopper emulation (simt_hopper_tests.cpp), called by simt_hopper_ops.cpp. Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace rangeswa::cuda::simt_hopper_tests {

// hopper_tile.cu's tile_kernel: Q K^T (which 0: out [64, 64] = x [64, 64] y [64, 64]^T) or P V (which 1:
// out = x y); bf16 (dtype 1) or f16 (2) bits of x and y row-major; swizzle 0 (none), 32, 64 or 128 bytes;
// a_regs: wgmma's A from registers.
void tile(int which, int dtype, int swizzle, bool a_regs, const uint16_t* x, const uint16_t* y, float* out);

// hopper_tile.cu's qk_ring_kernel (bf16): out [tiles, 64, 64] = q k_t^T; k [tiles * 64, 64]; mode RingMode.
void qk_ring(int tiles, int mode, const uint16_t* q, const uint16_t* k, float* out);

// A TMA copy of a [dim1, dim0] array of uint16 holding 0, 1, 2, ... (its row-major index) with the given box,
// coordinates and swizzle (0, 32, 64, 128) into 1024-byte aligned shared memory; returns the box's shared
// bytes as uint16 values (box0 * box1 of them), in shared-memory order.
std::vector<int32_t> tma_probe(int swizzle, int c0, int c1, int box0, int box1, int dim0, int dim1, bool oob_nan);

// Runs the probe kernel `name` on `in`; returns its output (8192 floats).
std::vector<float> probe(const std::string& name, const std::vector<float>& in);

}  // namespace rangeswa::cuda::simt_hopper_tests
