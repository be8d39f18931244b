// The two matrix products of one warp per KV tile: S = Q K^T for the warp's 16 query rows, and
// O += P V. Both paths hold S, P and O in the accumulator layout of mma.sync m16n8k16: lane l owns
// rows g = l / 4 and g + 8, and in every 8-column tile the columns 2t and 2t + 1, t = l % 4:
//   acc[n][0] = (g, 8n + 2t), acc[n][1] = (g, 8n + 2t + 1), acc[n][2] = (g + 8, 8n + 2t), acc[n][3] = (g + 8, 8n + 2t + 1).
// bf16/fp16 run on tensor cores (ldmatrix + mma.sync, sm_80+); fp32 computes the same elements with
// FFMA (slower, but exact to fp32; TF32 tensor cores would miss the 1e-5 accuracy target).
#pragma once

#include "kernel_traits.h"
#include "utils.h"

namespace rangeswa::cuda {

template <typename Traits, bool kTensorCores = Traits::kTensorCores>
struct WarpGemm;

// Tensor cores. Operand fragments come from shared memory through ldmatrix:
//  - A (Q rows, 16 x 16 per k step): matrices (rows 0-7 | 8-15) x (cols 0-7 | 8-15) in the order a0..a3,
//    so lane l addresses row l % 16, column 8 * (l / 16).
//  - B of S (K rows are B's columns, already "col-major"): for keys 16nb..16nb+15, matrices
//    (keys 0-7, d 0-7), (keys 0-7, d 8-15), (keys 8-15, d 0-7), (keys 8-15, d 8-15) give b0, b1 of
//    n-tile 2nb and b0, b1 of n-tile 2nb+1: lane l addresses key 8 * (l / 16) + l % 8, d 8 * ((l / 8) % 2).
//  - B of O (V rows are B's rows, so ldmatrix.trans): for keys 16j.., d 16dp..: matrices
//    (keys 0-7, d 0-7), (keys 8-15, d 0-7), (keys 0-7, d 8-15), (keys 8-15, d 8-15) give b0, b1 of
//    d-tile 2dp and of d-tile 2dp+1: lane l addresses key 8 * ((l / 8) % 2) + l % 8, d 8 * (l / 16).
//  - A of O is P itself: n-tiles 2j and 2j+1 of the S accumulators are the k16 A fragment of keys 16j...
template <typename Traits>
struct WarpGemm<Traits, true> {
  using Element = typename Traits::Element;
  static constexpr int kHeadDim = Traits::kHeadDim, kBlockN = Traits::kBlockN, kStride = Traits::kStride;
  static constexpr int NT = kBlockN / 8, DT = kHeadDim / 8;

  // s = Q[16 rows at sQ] . K[kBlockN rows at sK]^T
  static __device__ __forceinline__ void qk(float (&s)[NT][4], const Element* sQ, const Element* sK, int lane) {
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      uint32_t a[4];
      ldmatrix_x4(a, sQ + (lane % 16) * kStride + kk * 16 + (lane / 16) * 8);
#pragma unroll
      for (int nb = 0; nb < kBlockN / 16; ++nb) {
        uint32_t b[4];
        ldmatrix_x4(b, sK + (nb * 16 + (lane / 16) * 8 + lane % 8) * kStride + kk * 16 + ((lane / 8) % 2) * 8);
        mma_16816<Element>(s[2 * nb], a, b[0], b[1]);
        mma_16816<Element>(s[2 * nb + 1], a, b[2], b[3]);
      }
    }
  }

  // s[n][e] = (Q . K^T)[n][e] where keep(n, e); 16 keys at a time so that only 8 extra accumulators
  // are live (the second and third class passes of tiles near distance Hn).
  template <typename Keep>
  static __device__ __forceinline__ void qk_merge(float (&s)[NT][4], const Element* sQ, const Element* sK, int lane,
                                                  const Keep& keep) {
#pragma unroll
    for (int nb = 0; nb < kBlockN / 16; ++nb) {
      float t[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        uint32_t a[4], b[4];
        ldmatrix_x4(a, sQ + (lane % 16) * kStride + kk * 16 + (lane / 16) * 8);
        ldmatrix_x4(b, sK + (nb * 16 + (lane / 16) * 8 + lane % 8) * kStride + kk * 16 + ((lane / 8) % 2) * 8);
        mma_16816<Element>(t[0], a, b[0], b[1]);
        mma_16816<Element>(t[1], a, b[2], b[3]);
      }
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (keep(2 * nb + h, e)) s[2 * nb + h][e] = t[h][e];
    }
  }

  // o += P . V[kBlockN rows at sV], P rounded to the element type (as in FlashAttention)
  static __device__ __forceinline__ void pv(float (&o)[DT][4], const float (&p)[NT][4], const Element* sV, int lane) {
#pragma unroll
    for (int j = 0; j < kBlockN / 16; ++j) {
      const uint32_t a[4] = {pack2<Element>(p[2 * j][0], p[2 * j][1]), pack2<Element>(p[2 * j][2], p[2 * j][3]),
                             pack2<Element>(p[2 * j + 1][0], p[2 * j + 1][1]),
                             pack2<Element>(p[2 * j + 1][2], p[2 * j + 1][3])};
#pragma unroll
      for (int dp = 0; dp < kHeadDim / 16; ++dp) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, sV + (j * 16 + ((lane / 8) % 2) * 8 + lane % 8) * kStride + dp * 16 + (lane / 16) * 8);
        mma_16816<Element>(o[2 * dp], a, b[0], b[1]);
        mma_16816<Element>(o[2 * dp + 1], a, b[2], b[3]);
      }
    }
  }
};

// fp32: every lane computes its own accumulator elements with FFMA from shared memory.
template <typename Traits>
struct WarpGemm<Traits, false> {
  static constexpr int kHeadDim = Traits::kHeadDim, kBlockN = Traits::kBlockN, kStride = Traits::kStride;
  static constexpr int NT = kBlockN / 8, DT = kHeadDim / 8;
  static_assert(kHeadDim % 4 == 0 && kStride % 4 == 0, "float4 row reads");

  static __device__ __forceinline__ void qk(float (&s)[NT][4], const float* sQ, const float* sK, int lane) {
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = 0.f;
    const float* q0 = sQ + g * kStride;
    const float* q1 = sQ + (g + 8) * kStride;
#pragma unroll 2
    for (int d = 0; d < kHeadDim; d += 4) {
      const float4 a0 = *reinterpret_cast<const float4*>(q0 + d);
      const float4 a1 = *reinterpret_cast<const float4*>(q1 + d);
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float4 kv = *reinterpret_cast<const float4*>(sK + (n * 8 + 2 * t + c) * kStride + d);
          s[n][c] += a0.x * kv.x + a0.y * kv.y + a0.z * kv.z + a0.w * kv.w;
          s[n][2 + c] += a1.x * kv.x + a1.y * kv.y + a1.z * kv.z + a1.w * kv.w;
        }
    }
  }

  template <typename Keep>
  static __device__ __forceinline__ void qk_merge(float (&s)[NT][4], const float* sQ, const float* sK, int lane,
                                                  const Keep& keep) {
    const int g = lane / 4, t = lane % 4;
    const float* q0 = sQ + g * kStride;
    const float* q1 = sQ + (g + 8) * kStride;
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      float acc[4] = {0.f, 0.f, 0.f, 0.f};
      for (int d = 0; d < kHeadDim; d += 4) {
        const float4 a0 = *reinterpret_cast<const float4*>(q0 + d);
        const float4 a1 = *reinterpret_cast<const float4*>(q1 + d);
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float4 kv = *reinterpret_cast<const float4*>(sK + (n * 8 + 2 * t + c) * kStride + d);
          acc[c] += a0.x * kv.x + a0.y * kv.y + a0.z * kv.z + a0.w * kv.w;
          acc[2 + c] += a1.x * kv.x + a1.y * kv.y + a1.z * kv.z + a1.w * kv.w;
        }
      }
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (keep(n, e)) s[n][e] = acc[e];
    }
  }

  // The probabilities of row g for key 8n + 2u + c live in lane 4g + u of the quad: shuffle them in.
  static __device__ __forceinline__ void pv(float (&o)[DT][4], const float (&p)[NT][4], const float* sV, int lane) {
    const int t = lane % 4, quad = lane & ~3;
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int u = 0; u < 4; ++u)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float p0 = __shfl_sync(0xffffffffu, p[n][c], quad | u);
          const float p1 = __shfl_sync(0xffffffffu, p[n][2 + c], quad | u);
          const float* v = sV + (n * 8 + 2 * u + c) * kStride + 2 * t;
#pragma unroll
          for (int dt = 0; dt < DT; ++dt) {
            const float2 vv = *reinterpret_cast<const float2*>(v + dt * 8);
            o[dt][0] += p0 * vv.x;
            o[dt][1] += p0 * vv.y;
            o[dt][2] += p1 * vv.x;
            o[dt][3] += p1 * vv.y;
          }
        }
  }
};

}  // namespace rangeswa::cuda
