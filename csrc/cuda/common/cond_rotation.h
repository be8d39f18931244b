// The control rows' body keys read from k itself, rotated to the conditioning positions in a control CTA's
// K stage as each tile lands (rotate_cond_keys), and Lite's preparation folded into the control CTAs (LitePrep).
#pragma once

#include <cstdint>

#include "../attn_params.h"
#include "../block_means.h"
#include "../kernel_traits.h"
#include "../tile.h"
#include "../utils.h"
#include "elements.h"
#include "query_slot.h"

namespace rangeswa::cuda {

// A control CTA's tile of the control rows' body keys read from k itself (PreparedArrays::cond_raw), rotated
// in its stage to the conditioning positions (key t.a + r at cos_cond / sin_cond row t.a + r) by the CTA's
// threads, as the preparation would have written k_cond: the same pairs and products (rotary.h rotate_loaded). A thread
// keeps one step of 4 pairs (the rotary half is 4 x a power of two: attn_setup.h cond_keys_in_place) in rows
// kThreads / steps apart, kBatch of them with every load issued before any is used (one round trip a batch:
// one a 64-key tile at head dim 64, two a 32-key tile at 128); the layout is a template, branched on once.
// [gate:rotate-cond-rows begin]
template <typename Traits, bool kInterleaved>
__device__ __forceinline__ void rotate_cond_rows(typename Traits::Element* sk, const KvTile& t,
                                                 const AttnKernelParams& p) {
  using Element = typename Traits::Element;
  constexpr int kBatch = 256 / Traits::kHeadDim > 0 ? 256 / Traits::kHeadDim : 1;
  const int half = p.rotary_half;
  int shift = 0;  // steps = half / 4 = 1 << shift (at most 16 steps: head dims up to 128)
  while ((4 << shift) < half) ++shift;
  const int pass = Traits::kThreads >> shift;                    // rows a pass of the CTA's threads
  const int u = 4 * (int(threadIdx.x) & ((half / 4) - 1));
  const int xa = kInterleaved ? 2 * u : u, ya = kInterleaved ? 2 * u + 4 : u + half;
  const float *cs = p.cos_cond + u, *sn = p.sin_cond + u;
#pragma unroll 1
  for (int r0 = int(threadIdx.x) >> shift; r0 < t.n; r0 += kBatch * pass) {
    float a[kBatch][4], b[kBatch][4], c[kBatch][4], s[kBatch][4];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int r = imin(r0 + i * pass, t.n - 1);  // past the keys: the last row again, not stored
      const Element* row = sk + r * Traits::kStride;
      load_elements<Element, 4>(row + xa, a[i]);
      load_elements<Element, 4>(row + ya, b[i]);
      load_floats<4>(cs + (t.a + r) * half, c[i]);
      load_floats<4>(sn + (t.a + r) * half, s[i]);
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int r = r0 + i * pass;
      if (r >= t.n) break;
      rotate_loaded<4>(a[i], b[i], c[i], s[i], 1.f, kInterleaved);
      store_elements<Element, 4>(sk + r * Traits::kStride + xa, a[i]);
      store_elements<Element, 4>(sk + r * Traits::kStride + ya, b[i]);
    }
  }
}
// [gate:rotate-cond-rows end]
template <typename Traits>
__device__ __forceinline__ void rotate_cond_keys(typename Traits::Element* sk, const KvTile& t,
                                                 const AttnKernelParams& p) {
  if (p.interleaved) rotate_cond_rows<Traits, true>(sk, t, p);
  else rotate_cond_rows<Traits, false>(sk, t, p);
}

// Lite's preparation folded into the control CTAs (attn_setup.h nat_keys_from_control: head dim 64, every dim
// rotated, G = 16, 64-key tiles): as each tile of k's own body rows lands, besides rotating it in place to the
// conditioning positions (rotate_cond_rows' products), the CTA writes what the preparation would have of these
// keys: R(j) k_j into k_nat, and rule 4's G-block means of R(j) k_j and of v_j into s_nat and s_v (its tile
// holds 4 whole G-blocks). A thread takes one step of 4 pairs (and the values' 8-dim chunk of the same index)
// in 4 rows of one G-block, rows b 16 + q + 4 i (thread 4 (8 b + step) + q): its rows' natural and
// conditioning cos / sin loaded before the tile's own wait (tables), then per row the two rotations from the
// same landed pieces; the block's sums over its 4 rows, then over the 4 lanes q of its block and step
// (shuffles), lane q = 0 storing the means. The sums' order (each lane's rows, then the lanes' pairs) is not the
// preparation's (a block's rows in turn), so the means may differ from its in the last bit.

template <typename Traits>
struct LitePrep {
  using Element = typename Traits::Element;
  static constexpr int kSteps = Traits::kHeadDim / 8;  // of 4 pairs: the rotary half / 4, every dim rotated
  static_assert(Traits::kBlockN == 64 && kSteps == 8, "a 64-key tile at head dim 64: 4 rows a thread");
  int u, b, q;  // the thread's step (pairs u .. u + 3; the values' dims 2 u .. 2 u + 7), G-block, first row
  float c[4][4], s[4][4], nc[4][4], ns[4][4];  // its rows' conditioning and natural cos / sin

  __device__ __forceinline__ explicit LitePrep(const AttnKernelParams&) {
    const int t = int(threadIdx.x);
    q = t % 4;
    u = 4 * ((t / 4) % kSteps);
    b = t / (4 * kSteps);
  }
  __device__ __forceinline__ int row(int i) const { return 16 * b + q + 4 * i; }
  // The tables of tile t's rows (rows past its keys: its last row's, never stored).
  __device__ __forceinline__ void tables(const AttnKernelParams& p, const KvTile& t) {
    const int half = p.rotary_half;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int32_t at = (t.a + imin(row(i), t.n - 1)) * half + u;
      load_floats<4>(p.cos_cond + at, c[i]);
      load_floats<4>(p.sin_cond + at, s[i]);
      load_floats<4>(p.cos_int + at, nc[i]);
      load_floats<4>(p.sin_int + at, ns[i]);
    }
  }
  // Tile t's keys (sk) and values (sv) as they landed, the tables loaded; out: the KV head's arrays.
  // [gate:lite-prep-run begin]
  template <bool kInterleaved>
  __device__ __forceinline__ void run(Element* sk, const Element* sv, const KvTile& t, const AttnKernelParams& p,
                                      Element* k_nat, Element* s_nat, Element* s_v) const {
    const int half = p.rotary_half;
    const int xa = kInterleaved ? 2 * u : u, ya = kInterleaved ? 2 * u + 4 : u + half;
    const int vd = 2 * u;  // the values' 8 dims
    float kx[4] = {}, ky[4] = {}, vs[8] = {};  // the block's sums over this lane's rows
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = row(i);
      if (r >= t.n) break;  // rows past the keys: none of this lane's later ones either
      float a[4], bb[4], x[4], y[4], v[8];
      Element* kr = sk + r * Traits::kStride;
      load_elements<Element, 4>(kr + xa, a);
      load_elements<Element, 4>(kr + ya, bb);
      load_elements<Element, 8>(sv + r * Traits::kStride + vd, v);
#pragma unroll
      for (int e = 0; e < 4; ++e) x[e] = a[e], y[e] = bb[e];
      rotate_loaded<4>(x, y, nc[i], ns[i], 1.f, kInterleaved);  // R(j) k_j: the preparation's products
      Element* nat = k_nat + int64_t(t.a + r) * Traits::kHeadDim;
      store_elements<Element, 4>(nat + xa, x);
      store_elements<Element, 4>(nat + ya, y);
#pragma unroll
      for (int e = 0; e < 4; ++e) kx[e] += x[e], ky[e] += y[e];
#pragma unroll
      for (int e = 0; e < 8; ++e) vs[e] += v[e];
      rotate_loaded<4>(a, bb, c[i], s[i], 1.f, kInterleaved);  // R(j T / L) k_j, in place
      store_elements<Element, 4>(kr + xa, a);
      store_elements<Element, 4>(kr + ya, bb);
    }
    // The block's sums over its 4 lanes (lanes 4 k .. 4 k + 3: one block and step), then its means.
#pragma unroll
    for (int m = 1; m <= 2; m *= 2) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        kx[e] += __shfl_xor_sync(0xffffffffu, kx[e], m);
        ky[e] += __shfl_xor_sync(0xffffffffu, ky[e], m);
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) vs[e] += __shfl_xor_sync(0xffffffffu, vs[e], m);
    }
    const int32_t first = t.a + 16 * b;  // the block's first key
    if (q == 0 && first < t.a + t.n) {
      // 1 / G (G = 16), or, for a ragged block (the last of L's), 1 / its tokens
      const float scale = mean_factor(t.a + t.n - first >= 16, 0.0625f, p.fold.inv_last);
#pragma unroll
      for (int e = 0; e < 4; ++e) kx[e] = block_mean(kx[e], scale), ky[e] = block_mean(ky[e], scale);
#pragma unroll
      for (int e = 0; e < 8; ++e) vs[e] = block_mean(vs[e], scale);
      const int64_t at = int64_t(first / 16) * Traits::kHeadDim;
      store_elements<Element, 4>(s_nat + at + xa, kx);
      store_elements<Element, 4>(s_nat + at + ya, ky);
      store_elements<Element, 8>(s_v + at + vd, vs);
    }
  }
  // [gate:lite-prep-run end]
  __device__ __forceinline__ void run(Element* sk, const Element* sv, const KvTile& t, const AttnKernelParams& p,
                                      Element* k_nat, Element* s_nat, Element* s_v) const {
    if (p.interleaved) run<true>(sk, sv, t, p, k_nat, s_nat, s_v);
    else run<false>(sk, sv, t, p, k_nat, s_nat, s_v);
  }
};
// control_walk's stand-in for LitePrep in a CTA that folds nothing.
struct NoLitePrep {
  __device__ __forceinline__ explicit NoLitePrep(const AttnKernelParams&) {}
};

}  // namespace rangeswa::cuda
