// The two matrix products of one warp per KV tile: S = Q K^T for the warp's kWarpRows query rows
// (kMBlocks m16 blocks), and O += P V. Both hold S, P and O in the accumulator layout of mma.sync
// m16n8k16: in m16 block mb, lane l owns rows g = l / 4 and g + 8, and in every 8-column tile the
// columns 2t and 2t + 1, t = l % 4:
//   acc[mb][n][0] = (g, 8n + 2t), [1] = (g, 8n + 2t + 1), [2] = (g + 8, 8n + 2t), [3] = (g + 8, 8n + 2t + 1).
// bf16/fp16 run on tensor cores (ldmatrix + mma.sync, sm_80+); fp32 computes the same elements with FFMA
// (exact to fp32; TF32 tensor cores would miss the 1e-5 accuracy target). kCols: the tile's columns
// (kBlockN, or kCtrlCols for control keys).
#pragma once

#include "../kernel_traits.h"
#include "../utils.h"

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
// Each B fragment feeds one MMA per m16 block.
template <typename Traits>
struct WarpGemm<Traits, true> {
  using Element = typename Traits::Element;
  static constexpr int kHeadDim = Traits::kHeadDim, kStride = Traits::kStride, MB = Traits::kMBlocks;
  static constexpr int DT = kHeadDim / 8;

  // s = Q[warp rows at sQ] . K[kCols rows at sK]^T
  template <int kCols>
  static __device__ __forceinline__ void qk(float (&s)[MB][kCols / 8][4], const Element* sQ, const Element* sK,
                                            int lane) {
#pragma unroll
    for (int mb = 0; mb < MB; ++mb)
#pragma unroll
      for (int n = 0; n < kCols / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mb][n][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      uint32_t a[MB][4];
#pragma unroll
      for (int mb = 0; mb < MB; ++mb)
        ldmatrix_x4(a[mb], sQ + (mb * 16 + lane % 16) * kStride + kk * 16 + (lane / 16) * 8);
#pragma unroll
      for (int nb = 0; nb < kCols / 16; ++nb) {
        uint32_t b[4];
        ldmatrix_x4(b, sK + (nb * 16 + (lane / 16) * 8 + lane % 8) * kStride + kk * 16 + ((lane / 8) % 2) * 8);
#pragma unroll
        for (int mb = 0; mb < MB; ++mb) {
          mma_16816<Element>(s[mb][2 * nb], a[mb], b[0], b[1]);
          mma_16816<Element>(s[mb][2 * nb + 1], a[mb], b[2], b[3]);
        }
      }
    }
  }

  // o += P . V[kCols rows at sV], P rounded to the element type (as in FlashAttention)
  template <int kCols>
  static __device__ __forceinline__ void pv(float (&o)[MB][DT][4], const float (&p)[MB][kCols / 8][4],
                                            const Element* sV, int lane) {
#pragma unroll
    for (int j = 0; j < kCols / 16; ++j) {
      uint32_t a[MB][4];
#pragma unroll
      for (int mb = 0; mb < MB; ++mb) {
        a[mb][0] = pack2<Element>(p[mb][2 * j][0], p[mb][2 * j][1]);
        a[mb][1] = pack2<Element>(p[mb][2 * j][2], p[mb][2 * j][3]);
        a[mb][2] = pack2<Element>(p[mb][2 * j + 1][0], p[mb][2 * j + 1][1]);
        a[mb][3] = pack2<Element>(p[mb][2 * j + 1][2], p[mb][2 * j + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < kHeadDim / 16; ++dp) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, sV + (j * 16 + ((lane / 8) % 2) * 8 + lane % 8) * kStride + dp * 16 + (lane / 16) * 8);
#pragma unroll
        for (int mb = 0; mb < MB; ++mb) {
          mma_16816<Element>(o[mb][2 * dp], a[mb], b[0], b[1]);
          mma_16816<Element>(o[mb][2 * dp + 1], a[mb], b[2], b[3]);
        }
      }
    }
  }
};

// fp32: every lane computes its own accumulator elements with FFMA from shared memory.
template <typename Traits>
struct WarpGemm<Traits, false> {
  static constexpr int kHeadDim = Traits::kHeadDim, kStride = Traits::kStride, MB = Traits::kMBlocks;
  static constexpr int DT = kHeadDim / 8;
  static_assert(kHeadDim % 4 == 0 && kStride % 4 == 0, "float4 row reads");

  template <int kCols>
  static __device__ __forceinline__ void qk(float (&s)[MB][kCols / 8][4], const float* sQ, const float* sK,
                                            int lane) {
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int mb = 0; mb < MB; ++mb) {
      float(&sm)[kCols / 8][4] = s[mb];
#pragma unroll
      for (int n = 0; n < kCols / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) sm[n][e] = 0.f;
      const float* q0 = sQ + (mb * 16 + g) * kStride;
      const float* q1 = sQ + (mb * 16 + g + 8) * kStride;
#pragma unroll 2
      for (int d = 0; d < kHeadDim; d += 4) {
        const float4 a0 = *reinterpret_cast<const float4*>(q0 + d);
        const float4 a1 = *reinterpret_cast<const float4*>(q1 + d);
#pragma unroll
        for (int n = 0; n < kCols / 8; ++n)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const float4 kv = *reinterpret_cast<const float4*>(sK + (n * 8 + 2 * t + c) * kStride + d);
            sm[n][c] += a0.x * kv.x + a0.y * kv.y + a0.z * kv.z + a0.w * kv.w;
            sm[n][2 + c] += a1.x * kv.x + a1.y * kv.y + a1.z * kv.z + a1.w * kv.w;
          }
      }
    }
  }

  // The probabilities of row g for key 8n + 2u + c live in lane 4g + u of the quad: shuffle them in.
  template <int kCols>
  static __device__ __forceinline__ void pv(float (&o)[MB][DT][4], const float (&p)[MB][kCols / 8][4],
                                            const float* sV, int lane) {
    const int t = lane % 4, quad = lane & ~3;
#pragma unroll
    for (int mb = 0; mb < MB; ++mb)
#pragma unroll
      for (int n = 0; n < kCols / 8; ++n)
#pragma unroll
        for (int u = 0; u < 4; ++u)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const float p0 = __shfl_sync(0xffffffffu, p[mb][n][c], quad | u);
            const float p1 = __shfl_sync(0xffffffffu, p[mb][n][2 + c], quad | u);
            const float* v = sV + (n * 8 + 2 * u + c) * kStride + 2 * t;
#pragma unroll
            for (int dt = 0; dt < DT; ++dt) {
              const float2 vv = *reinterpret_cast<const float2*>(v + dt * 8);
              o[mb][dt][0] += p0 * vv.x;
              o[mb][dt][1] += p0 * vv.y;
              o[mb][dt][2] += p1 * vv.x;
              o[mb][dt][3] += p1 * vv.y;
            }
          }
  }
};

}  // namespace rangeswa::cuda
