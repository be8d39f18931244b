// The query slot: its rows rotated from q with the rope tables (fill_slot_row and the fills it calls, in
// the mma.sync kernel's plain layout or a wgmma operand's core matrices), the rotation of loaded pairs both
// fills and the conditioning rotation use (rotary.h rotate_loaded), and the straddling blocks' dots made from a slot row.
#pragma once

#include <cstdint>
#include <cstring>

#include "../attn_params.h"
#include "../plan.h"
#include "../rotary.h"
#include "../utils.h"
#include "elements.h"
#include "shared_layout.h"

namespace rangeswa::cuda {

// The element offset of dim d within a query-slot row: rows in plain order (the mma.sync kernel), or, kCore,
// as the core matrices of a wgmma operand (hopper/body_layout.h: 8-element chunks of a row 64 elements apart,
// the row's place in its 8-row group added by the caller).
template <bool kCore>
RSWA_HD int slot_col(int d) {
  if constexpr (kCore) return (d / 8) * 64 + d % 8;
  else return d;
}

// N elements of a slot row from dim x on: one store up to a 16-byte chunk (whole chunks stay contiguous in
// slot_col's layouts), chunk by chunk past it (the core-matrix layout puts a row's chunks 128 bytes apart).
template <typename Element, bool kCore, int N>
__device__ __forceinline__ void store_slot(Element* dst, int x, const float (&v)[N]) {
  constexpr int kChunk = 16 / int(sizeof(Element));
  if constexpr (N <= kChunk) {
    store_elements<Element, N>(dst + slot_col<kCore>(x), v);
  } else if constexpr (kCore && sizeof(Element) == 2) {
    // The sm_90a kernel's steps of 16 or more elements start on a chunk (x a multiple of 8: fill_row_vector's
    // aligned steps), so chunk x / 8 + c / 8 of the row is the 16-byte word (x / 8 + c / 8) * 8 of the
    // core-matrix layout (slot_col<true>: chunks 64 elements apart). Indexed as 16-byte words, each chunk's
    // store stays one 16-byte store; the element pointer slot_col gives left NVVM four 4-byte stores a chunk.
    uint4* words = reinterpret_cast<uint4*>(dst);
#pragma unroll
    for (int c = 0; c < N; c += kChunk)
      words[(x / kChunk + c / kChunk) * 8] =
          make_uint4(pack2<Element>(v[c], v[c + 1]), pack2<Element>(v[c + 2], v[c + 3]),
                     pack2<Element>(v[c + 4], v[c + 5]), pack2<Element>(v[c + 6], v[c + 7]));
  } else {
#pragma unroll
    for (int c = 0; c < N; c += kChunk) {
      float part[kChunk];
#pragma unroll
      for (int e = 0; e < kChunk; ++e) part[e] = v[c + e];
      store_elements<Element, kChunk>(dst + slot_col<kCore>(x + c), part);
    }
  }
}

// One step of fill_row_vector's rotation: kPairs rotated pairs from pair u on (the half layout's dims u.. and
// u + half.., the interleaved layout's 2u..2u + 2 kPairs - 1), every load issued before any is used.
// kLayout: -1 the layout read from `interleaved` at run time (a select per element), 0 the half layout, 1 the
// interleaved one (known at compile time: no selects).

// [gate:rotate-pairs begin]
template <typename Traits, bool kCore, int kPairs, int kLayout = -1>
__device__ __forceinline__ void rotate_pairs(typename Traits::Element* dst, const typename Traits::Element* row,
                                             const float* cs, const float* sn, float sign, int half, int u,
                                             bool interleaved_) {
  using Element = typename Traits::Element;
  constexpr int P = kPairs;
  const bool interleaved = kLayout < 0 ? interleaved_ : kLayout == 1;
  const int x = interleaved ? 2 * u : u, y = interleaved ? 2 * u + P : u + half;
  float a[P], b[P], c[P], s[P];
  load_elements<Element, P>(row + x, a);
  load_elements<Element, P>(row + y, b);
  load_floats<P>(cs + u, c);
  load_floats<P>(sn + u, s);
  rotate_loaded<P>(a, b, c, s, sign, interleaved);
  store_slot<Element, kCore, P>(dst, x, a);
  store_slot<Element, kCore, P>(dst, y, b);
}
// [gate:rotate-pairs end]

// One query row of the slot under a rotation, for rows whose q is 16-byte aligned and whose rotary half is
// whole 16-byte chunks: dst = the row's slot row, row = its q row (null: a padding row, zeros), cs / sn =
// its table rows (null: no rotation), sign = -1 for a negative position. A step rotates the 4 pairs of the
// table entries u .. u + 4 (one float4 each) from two pieces of 4 elements, at x and y: interleaved x = 2u,
// y = 2u + 4 (pairs (x0, x1), (x2, x3), (y0, y1), (y2, y3)); half split x = u, y = u + half (pairs (x_e,
// y_e)). Every load of a step is issued before any is used: a fill costs half / 4 dependent round trips
// per thread (8 at head dim 64), where one element pair at a time cost two per pair.
// kPairs: the rotated pairs a step loads before using any (one global round trip a step): 4 (the mma.sync
// kernel's), or 8 / 16 (the sm_90a kernel's: half / 16 round trips a fill), the rest of the rotary half by 4.
// kSplit: two threads fill the row, `part` 0 and 1: each rotates half the pairs (when the rotary half is a
// multiple of 16: whole aligned steps; else part 0 all of them) and copies every other 16-byte chunk of the rest.
// [gate:fill-row-vector begin]
template <typename Traits, bool kCore = false, int kPairs = 4, bool kSplit = false>
__device__ __forceinline__ void fill_row_vector(typename Traits::Element* dst, const typename Traits::Element* row,
                                                const float* cs, const float* sn, float sign, int half, int D,
                                                bool interleaved, int part = 0) {
  using Element = typename Traits::Element;
  static_assert(kPairs == 4 || kPairs == 8 || kPairs == 16, "4, 8 or 16 pairs a step");
  if (cs != nullptr) {
    int u = 0, end = half;
    if constexpr (kSplit) {
      if (half % 16 == 0) {
        u = part * (half / 2);
        end = u + half / 2;
      } else if (part != 0) {
        u = end;
      }
    }
    if constexpr (kPairs > 4) {
      // The sm_90a kernel's fill: the layout branched on once, each step's code for its own layout; and the sign
      // too (a row at a non-negative position, every row of most fills: its steps multiply no sine by the sign,
      // 16 FMUL a step fewer; a negative one keeps the multiply).
      auto steps = [&](auto layout, float sg) {
#pragma unroll 1
        for (; u + kPairs <= end; u += kPairs)
          rotate_pairs<Traits, kCore, kPairs, decltype(layout)::value>(dst, row, cs, sn, sg, half, u, interleaved);
      };
      if (interleaved) {
        if (sign == 1.f) steps(std::integral_constant<int, 1>{}, 1.f);
        else steps(std::integral_constant<int, 1>{}, sign);
      } else {
        if (sign == 1.f) steps(std::integral_constant<int, 0>{}, 1.f);
        else steps(std::integral_constant<int, 0>{}, sign);
      }
    }
#pragma unroll 1
    for (; u < end; u += 4) rotate_pairs<Traits, kCore, 4>(dst, row, cs, sn, sign, half, u, interleaved);
  }
  // The rest (every dim when there is no rotation): copied, zero past D and on padding rows.
  constexpr int kChunk = 16 / int(sizeof(Element));
  constexpr int kStride = kSplit ? 2 * kChunk : kChunk;
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll 1
  for (int d = (cs != nullptr ? 2 * half : 0) + (kSplit ? part * kChunk : 0); d < Traits::kHeadDim; d += kStride)
    *reinterpret_cast<uint4*>(dst + slot_col<kCore>(d)) =
        row != nullptr && d < D ? *reinterpret_cast<const uint4*>(row + d) : zero;
}
// [gate:fill-row-vector end]

// Whether the query slot's rows take fill_row_vector: D, the rotary half and the row stride whole 16-byte
// chunks, and the tile's first q row (`rows`) 16-byte aligned.
template <typename Traits>
__device__ __forceinline__ bool slot_rows_in_chunks(const AttnKernelParams& p, const typename Traits::Element* rows) {
  constexpr int kChunk = 16 / int(sizeof(typename Traits::Element));
  return p.D % kChunk == 0 && p.rotary_half % kChunk == 0 && p.q_strides.row % kChunk == 0 &&
         reinterpret_cast<uintptr_t>(rows) % 16 == 0;
}

// One query row of the slot, unscaled, rounded to the element type; zero past D and on padding rows (row
// null); rotated by the table rows cs / sn (null: not rotated) with sign -1 for a negative position. Rows
// in 16-byte chunks (slot_rows_in_chunks) take fill_row_vector, others element pairs u (dims da, db): a
// rotated pair (interleaved (2u, 2u+1), half (u, u + half)) or two dims past the rotary ones.
// [gate:fill-row begin]
template <typename Traits, bool kCore = false, int kPairs = 4, bool kSplit = false>
__device__ __forceinline__ void fill_row(typename Traits::Element* dst, const typename Traits::Element* row,
                                         const float* cs, const float* sn, float sign, int half, int D,
                                         bool interleaved, bool chunks, int part = 0) {
  using Element = typename Traits::Element;
  if (chunks) {
    fill_row_vector<Traits, kCore, kPairs, kSplit>(dst, row, cs, sn, sign, half, D, interleaved, part);
    return;
  }
  if (kSplit && part != 0) return;  // element pairs: part 0 fills the whole row
#pragma unroll 1
  for (int u = 0; u < Traits::kHeadDim / 2; ++u) {
    const int da = u < half ? (interleaved ? 2 * u : u) : 2 * u;
    const int db = u < half ? (interleaved ? 2 * u + 1 : u + half) : 2 * u + 1;
    float a = row != nullptr && da < D ? to_float(row[da]) : 0.f;
    float b = row != nullptr && db < D ? to_float(row[db]) : 0.f;
    if (cs != nullptr && u < half) {
      const float c = cs[u], se = sn[u] * sign;
      const float ra = a * c - b * se;
      b = a * se + b * c;
      a = ra;
    }
    dst[slot_col<kCore>(da)] = from_float<Element>(a);
    dst[slot_col<kCore>(db)] = from_float<Element>(b);
  }
}
// [gate:fill-row end]

// Row r of a body tile under query variant v into its slot row dst (kCore: a wgmma operand's layout,
// slot_col): rotated from q with the rope tables, zero on padding rows. kPairs, kSplit, part: fill_row_vector's.
// [gate:fill-slot-row begin]
template <typename Traits, bool kCore = false, int kPairs = 4, bool kSplit = false>
__device__ __forceinline__ void fill_slot_row(const AttnKernelParams& p, const BodyCta& cta, QVar v, int r,
                                              typename Traits::Element* dst, int part = 0) {
  using Element = typename Traits::Element;
  const Geometry& g = p.geo;
  const int half = p.rotary_half;
  const bool in = r < cta.nrows;
  const float *cs = nullptr, *sn = nullptr;  // this row's table rows (null: no rotation)
  float sign = 1.f;
  if (in && v != QVar::kPlain && half > 0) {  // padding rows read no table row (past L)
    const int32_t pos = v == QVar::kCond ? cta.i0 + r : variant_position(g, v, cta.i0 + r);
    const int64_t at = int64_t(pos < 0 ? -pos : pos) * half;
    cs = (v == QVar::kCond ? p.cos_cond : p.cos_int) + at;
    sn = (v == QVar::kCond ? p.sin_cond : p.sin_int) + at;
    sign = pos < 0 ? -1.f : 1.f;
  }
  const Element* row = in ? static_cast<const Element*>(cta.q_rows) + int64_t(r) * p.q_strides.row : nullptr;
  fill_row<Traits, kCore, kPairs, kSplit>(dst, row, cs, sn, sign, half, p.D, p.interleaved, cta.q_chunks, part);
}
// [gate:fill-slot-row end]

// Straddling blocks (straddling.h, its formula): the parts of row r's logits that variant v gives, as (array, row,
// target, sign) terms, from its slot row qr (kCore: slot_col's layout); sMixA / sMixB [2][M] per side and row.
// kStep: the 16-byte loads of a term issued before any is used (2: the mma.sync kernel's; the sm_90a kernel's
// whole row, one round trip a term at head dims 64 and 80). kSplit: two threads take the row's terms, `part` 0
// the even ones and 1 the odd (a variant's terms add into distinct targets: the same sums in the same order).
// [gate:straddling-dots begin]
template <typename Traits, bool kCore = false, int kStep = 2, bool kSplit = false>
__device__ __forceinline__ void straddling_dots(const AttnKernelParams& p, const BodyCta& cta, QVar v, int r,
                                                const typename Traits::Element* qr, const RowGeometry* sRow,
                                                float* sMixA, float* sMixB, int part = 0) {
  using Element = typename Traits::Element;
  constexpr int M = Traits::kBlockM, Dp = Traits::kHeadDim;
  if (r >= cta.nrows) return;
  const PreparedArrays& a = p.kv;
  const int32_t bh = cta.bh;
  const RowGeometry& mine = sRow[r];  // read back from shared memory: no registers held across the walk
  const int32_t lb = mine.mix[0], lm = mine.mix_m[0], rb = mine.mix[1], rm = mine.mix_m[1];
#pragma unroll 1
  for (int term = 0; term < 3; ++term) {
    const void* base = nullptr;
    int64_t row = 0;
    float* target = nullptr;
    float sign = 1.f;
    if (v == QVar::kNat) {
      if (term == 0 && lb >= 0) { base = a.s_nat; row = int64_t(lb) * Dp; target = sMixA + r; }
      if (term == 1 && lb >= 0) { base = a.p_nat; row = int64_t(lm) * Dp; target = sMixB + r; sign = -1.f; }
      if (term == 2 && rb >= 0) { base = a.p_nat; row = int64_t(rm) * Dp; target = sMixB + M + r; }
    } else if (v == QVar::kLeft) {
      if (term == 0 && lb >= 0) { base = a.p_grp; row = int64_t(lm) * Dp; target = sMixB + r; }
    } else if (v == QVar::kRight) {
      if (term == 0 && rb >= 0) { base = a.s_grp; row = int64_t(rb) * Dp; target = sMixA + M + r; }
      if (term == 1 && rb >= 0) { base = a.p_grp; row = int64_t(rm) * Dp; target = sMixB + M + r; sign = -1.f; }
    }
    if (target == nullptr || (kSplit && term % 2 != part)) continue;
    const bool summary = base == a.s_nat || base == a.s_grp;
    const Element* x = static_cast<const Element*>(base) + bh * (summary ? a.sum_stride : a.key_stride) + row;
    // 16-byte loads, kStep issued before any is used (4 round trips per term at head dim 64 in bf16 with 2,
    // was 8 of 2-byte loads; prepared rows are 16-byte aligned), summed in dim order.
    constexpr int kChunk = 16 / int(sizeof(Element));
    static_assert(Dp % (kStep * kChunk) == 0, "whole steps");
    float acc = 0.f;
#pragma unroll 1
    for (int d0 = 0; d0 < Dp; d0 += kStep * kChunk) {
      uint4 raw[kStep];
#pragma unroll
      for (int c = 0; c < kStep; ++c) raw[c] = *reinterpret_cast<const uint4*>(x + d0 + c * kChunk);
#pragma unroll
      for (int c = 0; c < kStep; ++c) {
        Element xe[kChunk], qe[kChunk];
        memcpy(xe, &raw[c], 16);
        const uint4 qraw = *reinterpret_cast<const uint4*>(qr + slot_col<kCore>(d0 + c * kChunk));
        memcpy(qe, &qraw, 16);
#pragma unroll
        for (int e = 0; e < kChunk; ++e) acc += to_float(qe[e]) * to_float(xe[e]);
      }
    }
    *target += sign * acc;
  }
}
// [gate:straddling-dots end]

}  // namespace rangeswa::cuda
