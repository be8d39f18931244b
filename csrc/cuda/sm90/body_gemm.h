// The body kernel's two products for one consumer warpgroup (64 query rows) on core-matrix tiles
// (sm90/body_layout.h), as asynchronous wgmma: S = Q K^T with both operands in shared memory, O += P V with
// P in registers. Each issues its instructions only (after wgmma.fence); the caller commits the group and
// waits for it, so that a product can run while the warpgroup does other work (the softmax of the tile before).
//
// Accumulators are wgmma's m64nN fragment (sm90/hopper.h): d[4 n + e] is row 16 w + g + 8 (e / 2), column
// 8 n + 2 q + e % 2 for warp w of the warpgroup, lane 4 g + q: per warp exactly mma.sync's m16n8 C fragments
// of one m16 block. A group's MB products (HopperTraits::kMBlocks) give each warp MB such blocks, which the
// query slot's row order (HopperTraits::slot_row) makes the warp's consecutive rows, so the mma.sync kernel's
// logits and softmax (common/logits.h tile_logits, common/softmax.h) run on them unchanged, viewed as [MB][N / 8][4]
// (as_blocks).
#pragma once

#include <cstdint>

#include "hopper.h"
#include "../utils.h"
#include "body_layout.h"

namespace rangeswa::cuda {

// MB wgmma accumulators of N / 2 floats (a warp's rows in MB m16 blocks: HopperTraits::kMBlocks) viewed as the
// mma.sync kernel's [MB][N / 8][4] fragments.
template <int MB, int N>
__device__ __forceinline__ float (&as_blocks(float (&d)[MB][N / 2]))[MB][N / 8][4] {
  return *reinterpret_cast<float(*)[MB][N / 8][4]>(&d);
}

// The registers of a group's products pinned where the source puts them (sm90/hopper.h fence_operand, CUTLASS's
// warpgroup_fence_operand, as FlashAttention-3 does): around each product's issue and after the wait that
// retires it, so that the compiler moves no access of the accumulators (or of P, the A registers) into a
// wgmma's flight, which ptxas would answer by serializing every wgmma (advisories C7514 / C7515, refused by
// scripts/cuda_gates.py).
template <int MB, int K>
__device__ __forceinline__ void fence_products(float (&d)[MB][K]) {
#pragma unroll
  for (int mb = 0; mb < MB; ++mb) hopper::fence_operand(d[mb]);
}
template <int MB, int KS>
__device__ __forceinline__ void fence_products(uint32_t (&a)[MB][KS][4]) {
#pragma unroll
  for (int mb = 0; mb < MB; ++mb)
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) hopper::fence_operand(a[mb][ks]);
}

// wgmma.wait_group kPending, then the registers of the products it retired fenced (fence_products).
template <int kPending, typename... Regs>
__device__ __forceinline__ void wait_products(Regs&... regs) {
  hopper::wgmma_wait<kPending>();
  (fence_products(regs), ...);
}

// Descriptors of a core-matrix tile of Dp (K-major) or W (MN-major: a V stage's kValueCols) columns at shared
// address `addr` (body_layout.h).
template <int Dp>
__device__ __forceinline__ uint64_t kmajor_desc(uint32_t addr) {
  return hopper::make_smem_desc(addr, 128, 16 * Dp, hopper::Swizzle::kNone);
}
template <int W>
__device__ __forceinline__ uint64_t mnmajor_desc(uint32_t addr) {
  return hopper::make_smem_desc(addr, 16 * W, 128, hopper::Swizzle::kNone);
}

// The descriptors' two 32-bit words: the low one holds the start address (bits 0-13, the byte address / 16)
// and LBO, the high one SBO and the swizzle mode, a constant. A k step, a stage or a slot moves a tile's start
// by a multiple of 16 bytes within shared memory (below 256 KB: the 14-bit field never carries), so the low
// word of a moved start is the low word of the first plus the bytes / 16: one add a wgmma instead of the
// whole encoding from the address.
template <int Dp>
__device__ __forceinline__ uint32_t kmajor_lo(uint32_t addr) {
  return uint32_t(kmajor_desc<Dp>(addr));
}
template <int W>
__device__ __forceinline__ uint32_t mnmajor_lo(uint32_t addr) {
  return uint32_t(mnmajor_desc<W>(addr));
}
template <int Dp>
inline constexpr uint32_t kKmajorHi = uint32_t(hopper::make_smem_desc(0, 128, 16 * Dp, hopper::Swizzle::kNone) >> 32);
template <int W>
inline constexpr uint32_t kMnmajorHi = uint32_t(hopper::make_smem_desc(0, 16 * W, 128, hopper::Swizzle::kNone) >> 32);
__device__ __forceinline__ uint64_t desc_words(uint32_t lo, uint32_t hi) { return uint64_t(hi) << 32 | lo; }

// The low descriptor word's step from a group's m64 product to the next (slot rows 64 mb ..: HopperTraits::slot_row).
template <typename Traits>
inline constexpr uint32_t kQBlockStep = uint32_t(core_row<Traits::kHeadDim>(64) * sizeof(typename Traits::Element) / 16);

// S (MB products of 64 rows x kCols keys) = Q K^T over the head dim: q_lo and k_lo the low descriptor words
// (kmajor_lo) of the warpgroup's first slot row and of the tile's first key (core-matrix tiles); product mb's
// rows start 64 mb slot rows in (kQBlockStep), the k16 step ks 256 ks bytes in. Every product of the same
// key operand, issued in one group.
template <typename Traits, int kCols, int MB>
__device__ __forceinline__ void qk_issue(float (&s)[MB][kCols / 2], uint32_t q_lo, uint32_t k_lo) {
  constexpr int Dp = Traits::kHeadDim;
  fence_products(s);
  hopper::wgmma_fence();
#pragma unroll
  for (int mb = 0; mb < MB; ++mb)
#pragma unroll
    for (int ks = 0; ks < Dp / 16; ++ks)
      hopper::wgmma_ss<kCols, typename Traits::Element>(
          s[mb], desc_words(q_lo + mb * kQBlockStep<Traits> + 16 * ks, kKmajorHi<Dp>),
          desc_words(k_lo + 16 * ks, kKmajorHi<Dp>), ks > 0);
  fence_products(s);
}

// P as wgmma's A fragments, per product and key step (sm90/hopper.h: a[0] = (row g, keys 2q..2q+1), a[1] = (row
// g + 8, ..), a[2] = (row g, keys 2q+8..), a[3] = (row g + 8, keys 2q+8..)), rounded to the element type.
template <typename Traits, int kCols, int MB>
__device__ __forceinline__ void pack_p(uint32_t (&a)[MB][kCols / 16][4], const float (&p)[MB][kCols / 2]) {
  using Element = typename Traits::Element;
#pragma unroll
  for (int mb = 0; mb < MB; ++mb)
#pragma unroll
    for (int ks = 0; ks < kCols / 16; ++ks)
#pragma unroll
      for (int r = 0; r < 4; ++r) a[mb][ks][r] = pack2<Element>(p[mb][8 * ks + 2 * r], p[mb][8 * ks + 2 * r + 1]);
}

// O (MB products of 64 rows x W = kValueCols: the head dim's columns, then the row sums) += P V over the tile's
// kCols keys: v_lo the low descriptor word (mnmajor_lo) of the tile's first key; the key step ks starts 32 W
// ks bytes in.
template <typename Traits, int kCols, int MB>
__device__ __forceinline__ void pv_issue(float (&o)[MB][Traits::kValueCols / 2],
                                         uint32_t (&a)[MB][kCols / 16][4], uint32_t v_lo) {
  constexpr int W = Traits::kValueCols;
  fence_products(o);
  fence_products(a);
  hopper::wgmma_fence();
#pragma unroll
  for (int mb = 0; mb < MB; ++mb)
#pragma unroll
    for (int ks = 0; ks < kCols / 16; ++ks)
      hopper::wgmma_rs<W, typename Traits::Element, 1>(o[mb], a[mb][ks], desc_words(v_lo + 2 * W * ks, kMnmajorHi<W>), 1);
  fence_products(o);
  fence_products(a);
}

}  // namespace rangeswa::cuda
