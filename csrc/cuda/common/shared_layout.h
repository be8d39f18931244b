// A CTA's shared-memory carve-up and what its prologue keeps there: the per-record arrays (RecordArrays,
// record_arrays), the plan's region that both body kernels lay out alike (PlanRegion), the mma.sync CTA's
// whole layout (SharedLayout: its body and control CTAs), and a body tile's fixed facts (BodyCta).
#pragma once

#include <cstddef>
#include <cstdint>

#include "../attn_params.h"
#include "../kernel_traits.h"
#include "../plan.h"
#include "../tile.h"

namespace rangeswa::cuda {

// The keys and values arrays of one record for the CTA's KV head (record_arrays), and the elements between
// their rows (Dp; k's or v's own row stride for the control rows' body keys and the body values read in
// place). Element offsets inside one KV head's arrays fit 32 bits (attn_setup.h head_offsets_fit).
template <typename Element>
struct RecordArrays {
  const Element* k;
  const Element* v;
  int32_t k_row, v_row;
};

// The part of a body CTA's shared memory that both body kernels (this one and the sm_90a one,
// hopper/body_layout.h) lay out alike after their per-row words, which end at byte kGeometry: the rows'
// RowGeometry; the plan as the plan kernel wrote it (records, then the tile spans: attn_params.h records_of /
// spans_of); per record its keys and values arrays for the CTA's KV head (RecordArrays), found once in the
// prologue; the retrieved blocks; the Hn bands (plan.h hn_bands), when the call has them (geo.band_ok): one
// band's summary rows as a 16-row K tile of kBandRowBytes a row, and per side and row the logits of its
// blocks (kBandStride floats a row: one bank apart).
template <typename Element, int M, size_t kGeometry, size_t kBandRowBytes>
struct PlanRegion {
  static constexpr size_t up16(size_t x) { return (x + 15) / 16 * 16; }
  static constexpr size_t kRecords = up16(kGeometry + size_t(M) * sizeof(RowGeometry));
  static constexpr size_t spans(int max_records) { return kRecords + size_t(max_records) * sizeof(Record); }
  static constexpr size_t arrays(int max_records, int k) {
    return spans(max_records) + size_t(max_spans(k)) * sizeof(TileSpan);
  }
  static constexpr size_t retrieved(int max_records, int k) {
    return arrays(max_records, k) + size_t(max_records) * sizeof(RecordArrays<Element>);
  }
  static constexpr int kBandStride = kBandBlocks + 1;
  static constexpr size_t band_k(int max_records, int k) { return up16(retrieved(max_records, k) + size_t(k) * 4); }
  static constexpr size_t band_logits(int max_records, int k) {
    return band_k(max_records, k) + size_t(kBandBlocks) * kBandRowBytes;
  }
  static constexpr size_t bytes(int max_records, int k, bool band) {
    return band ? band_logits(max_records, k) + size_t(2) * M * kBandStride * sizeof(float)
                : retrieved(max_records, k) + size_t(k) * 4;
  }
};

// Shared memory: the query slot, two or three K and V stages (Traits::kStages); per row (at offsets fixed at
// compile time, so the walk addresses them from one register) its bounds in the current record, the parts
// of its straddling blocks' logits, a direct record's score, and per warp the record of those bounds; then
// the PlanRegion.
template <typename Traits>
struct SharedRows {
  using Element = typename Traits::Element;
  static constexpr size_t kK = size_t(Traits::kQElems) * sizeof(Element);
  static constexpr size_t kV = kK + size_t(Traits::kStages) * Traits::kKVElems * sizeof(Element);
  // Per row: bounds (2), straddling parts (4), direct score (1), int32 each; then per warp the record whose
  // bounds they hold (the masked loop's).
  static constexpr size_t kRows = kV + size_t(Traits::kStages) * Traits::kKVElems * sizeof(Element);
  static constexpr size_t kGeometry = kRows + size_t(Traits::kBlockM) * 7 * 4 + 16;
  static_assert(Traits::kWarps * 4 <= 16, "a record index per warp");
  static_assert(kK % 16 == 0 && kV % 16 == 0 && kRows % 16 == 0 && kGeometry % 16 == 0, "16-byte aligned");
};

template <typename Traits>
struct SharedLayout
    : SharedRows<Traits>,
      PlanRegion<typename Traits::Element, Traits::kBlockM, SharedRows<Traits>::kGeometry,
                 size_t(Traits::kStride) * sizeof(typename Traits::Element)> {};

// The keys and values array of a record's key set for KV head bh (= batch * Hkv + kv_head), and the
// elements between value rows.
template <typename Element>
__device__ __forceinline__ void record_arrays(const PreparedArrays& a, KeySet keys, int32_t bh, int32_t batch,
                                              int32_t kv_head, int32_t Dp, RecordArrays<Element>& out) {
  const void *kb, *vb;
  int64_t stride;
  switch (keys) {
    case KeySet::kCtrl: kb = a.k_ctrl; vb = a.v_ctrl; stride = a.ctrl_stride; break;
    case KeySet::kNat: kb = a.k_nat; vb = a.v_body; stride = a.key_stride; break;
    case KeySet::kGrp: kb = a.k_grp; vb = a.v_body; stride = a.key_stride; break;
    case KeySet::kCond: kb = a.k_cond; vb = a.v_body; stride = a.key_stride; break;
    case KeySet::kSumNat: kb = a.s_nat; vb = a.s_v; stride = a.sum_stride; break;
    default: kb = a.s_grp; vb = a.s_v; stride = a.sum_stride; break;
  }
  const bool body = keys == KeySet::kNat || keys == KeySet::kGrp || keys == KeySet::kCond;
  const bool raw = keys == KeySet::kCond && a.cond_raw;  // k's own rows (the control CTAs rotate them)
  // Every candidate read before the selects (no branch around a parameter's read).
  const int64_t own = bh * stride, cond_at = a.cond.at(batch, kv_head, 0), value_at = a.values.at(batch, kv_head, 0);
  const int32_t cond_row = int32_t(a.cond.row), value_row = int32_t(a.values.row);
  out.k = static_cast<const Element*>(kb) + (raw ? cond_at : own);
  out.k_row = raw ? cond_row : Dp;
  out.v = static_cast<const Element*>(vb) + (body ? value_at : own);
  out.v_row = body ? value_row : Dp;
}

// Body tile `plan` (of KV head bh, query block qb) into shared memory by kThreads threads (thread tid), as both body
// kernels' prologues read it: its records and `spans` spans in one copy as the plan kernel laid them out (the
// records' unused entries too: one loop; attn_params.h records_of), then its k retrieved blocks.
template <int kThreads>
__device__ __forceinline__ void copy_plan(const AttnKernelParams& p, int64_t plan, int32_t spans, int32_t bh,
                                          int32_t qb, int32_t k, Record* sRec, int32_t* sRet, int tid) {
  const int4* src = reinterpret_cast<const int4*>(records_of(p, p.records, plan));
#pragma unroll 1
  for (int x = tid; x < p.max_records + spans; x += kThreads) reinterpret_cast<int4*>(sRec)[x] = src[x];
  const int32_t* given = k > 0 ? p.retrieved + (int64_t(bh) * p.nQb + qb) * k : nullptr;
#pragma unroll 1
  for (int x = tid; x < k; x += kThreads) sRet[x] = given[x];
}

// Each of a body tile's `count` records' arrays for KV head bh (record_arrays), by kThreads threads (thread tid),
// read by the tile copies.
template <typename Element, int kThreads>
__device__ __forceinline__ void find_record_arrays(const AttnKernelParams& p, const Record* sRec, int32_t count,
                                                   int32_t bh, int32_t batch, int32_t Dp,
                                                   RecordArrays<Element>* sArrays, int tid) {
#pragma unroll 1
  for (int x = tid; x < count; x += kThreads) {
    RecordArrays<Element> ra;
    record_arrays<Element>(p.kv, KeySet(sRec[x].keys), bh, batch, bh - batch * p.Hkv, Dp, ra);
    sArrays[x] = ra;
  }
}

// What a body CTA's fills, dots and epilogue need of its tile, kept in shared memory for the walk (not in
// registers across it).
struct BodyCta {
  const void* q_rows;  // the q row of the tile's first row
  int64_t row0;        // the output row of the tile's first row
  int32_t i0, nrows, bh;
  uint32_t needed;     // the query variants the tile fills (tile.h variants_needed)
  bool q_chunks;       // slot_rows_in_chunks
};

}  // namespace rangeswa::cuda
