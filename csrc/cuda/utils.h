// Thin wrappers over the sm_80+ instructions the kernels use: cp.async (global -> shared copies that
// zero-fill rows past the end), ldmatrix, mma.sync m16n8k16 and ex2.approx. No torch headers here,
// so the per-instantiation .cu files compile fast.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdint>
#include <cstdio>

#include "convert.h"

// A build that brings its own definitions of the device primitives below defines RSWA_DEVICE_PRIMITIVES
// before any kernel header (a host emulation force-includes them); the kernels then run on those.
#if !defined(RSWA_DEVICE_PRIMITIVES)
// The CTA's dynamic shared memory, and a shared variable of the CTA.
#define RSWA_DYNAMIC_SHARED(name) extern __shared__ __align__(16) unsigned char name[]
#define RSWA_STATIC_SHARED(type, name) __shared__ type name

// A launch, as an expression giving its cudaError_t: kernel<<<grid, block, smem, stream>>>(args...). The
// SIMT emulation runs the same launch code with its own definition (simt.h), so every launcher's grid,
// block and shared memory are those it emulates.
#define RSWA_LAUNCH(kernel, grid, block, smem, stream, ...) \
  (kernel<<<(grid), (block), (smem), (stream)>>>(__VA_ARGS__), cudaGetLastError())
// Opts `kernel` in to `bytes` of dynamic shared memory (needed above 48 KB); a cudaError_t.
#define RSWA_OPT_IN_SMEM(kernel, bytes) \
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes))
// Stops the kernel with a message (printf's format and arguments): a device-side assertion, which the
// next synchronizing call reports and which leaves the CUDA context unusable, as torch's own do.
#define RSWA_DEVICE_FAIL(...) (printf(__VA_ARGS__), __trap())
// The most CTAs a grid's y dimension holds. Kernels with a CTA row per KV head loop over the heads with
// this stride (grid_rows), so any B * H_kv runs; the SIMT emulation (simt.h) sets it small so the loop
// runs on its grids too.
#define RSWA_MAX_GRID_Y 65535

namespace rangeswa::cuda {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared; when `valid` is false nothing is read and the 16 bytes are zeroed.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem),
               "r"(src_bytes)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Waits for every copy this thread issued; a __syncthreads() afterwards publishes them to the block.
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
// Waits for every copy group this thread committed but the newest kPending (a third K/V stage keeps one
// tile's copy in flight across the barrier).
template <int kPending>
__device__ __forceinline__ void cp_async_wait_group() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Four 8x8 b16 matrices; lane l gives the row address of matrix l / 8, row l % 8.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(smem)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(smem)));
}

// d += a . b for one m16n8k16 tile, fp32 accumulators, A row-major and B column-major.
template <typename Element>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma_16816<__half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as one register of two 16-bit values, `lo` in the low half (the lower column).
template <typename Element>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);

template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Two adjacent elements (dst 4- or 8-byte aligned) in one store.
template <typename Element>
__device__ __forceinline__ void store2(Element* dst, float a, float b) {
  *reinterpret_cast<uint32_t*>(dst) = pack2<Element>(a, b);
}
template <>
__device__ __forceinline__ void store2<float>(float* dst, float a, float b) {
  *reinterpret_cast<float2*>(dst) = make_float2(a, b);
}

// Bits [a, a + b) of a word, clamped to it (bmsk.clamp.b32, sm_70+): 0 when a >= 32 or b = 0, bits a..31
// when a + b >= 32.
__device__ __forceinline__ uint32_t bit_range(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("bmsk.clamp.b32 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// 2^x; 2^-inf = +0. Relative error about 2^-22.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace rangeswa::cuda
#endif  // RSWA_DEVICE_PRIMITIVES

namespace rangeswa::cuda {
// CTA rows of a grid over `rows` rows (KV heads): at most RSWA_MAX_GRID_Y, the kernel striding by gridDim.y.
inline unsigned grid_rows(int64_t rows) { return unsigned(rows < RSWA_MAX_GRID_Y ? rows : RSWA_MAX_GRID_Y); }
}  // namespace rangeswa::cuda
