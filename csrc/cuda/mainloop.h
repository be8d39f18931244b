// The fused RangeSWA attention kernel (SPEC sections 1-4): one CTA per query tile (block.h) and
// (batch, query head). The CTA rotates its query rows into shared memory once per position class,
// then walks its KV tiles with one online softmax, FlashAttention-2 style:
//
//   K(n) in flight -> wait, barrier -> issue V(n) -> S = Q K(n)^T (per class pass) -> wait, barrier
//   -> issue K(n+1) -> mask / bias -> softmax -> O += P V(n)
//
// so the V copy overlaps the score GEMM and the next K copy overlaps softmax and the PV GEMM. A tile
// whose rows x keys fall in several position classes (pairs near distance Hn, section 3) runs one
// GEMM per class and keeps each element's own; grouped keys are a second K copy.
//
// Keys, values and summaries come from the prepared arrays (attn_params.h); queries are rotated here
// from the input with the rope tables: native (position i), grouped-left (i/g + c), grouped-right
// (i/g - c) and conditioning (i T/L), exactly the pairing of the CPU kernel (rules.h PosClass).
#pragma once

#include <cmath>
#include <cstdint>

#include "attn_params.h"
#include "block.h"
#include "epilogue.h"
#include "kernel_traits.h"
#include "mask.h"
#include "queries.h"
#include "softmax.h"
#include "utils.h"
#include "warp_gemm.h"

namespace rangeswa::cuda {

// Shared memory: query slots, one K and one V tile, the fixed segments, the tile's row contexts and
// the per-row sums of the mixed blocks' exact logits.
template <typename Traits>
struct SharedLayout {
  using Element = typename Traits::Element;
  static constexpr size_t kKOffset(int slots) { return size_t(slots) * Traits::kQSlotElems * sizeof(Element); }
  static constexpr size_t kVOffset(int slots) { return kKOffset(slots) + Traits::kKVElems * sizeof(Element); }
  static constexpr size_t kSegOffset(int slots) { return kVOffset(slots) + Traits::kKVElems * sizeof(Element); }
  static constexpr size_t kRowOffset(int slots) { return kSegOffset(slots) + kNumFixedSegments * sizeof(Segment); }
  static constexpr size_t kMixedOffset(int slots) { return kRowOffset(slots) + Traits::kBlockM * sizeof(RowCtx); }
  static constexpr size_t bytes(int slots) { return kMixedOffset(slots) + Traits::kBlockM * 2 * sizeof(float); }
  static_assert(Traits::kQSlotElems * sizeof(Element) % 16 == 0 && Traits::kKVElems * sizeof(Element) % 16 == 0,
                "tiles must keep 16-byte alignment");
  static_assert(sizeof(Segment) % 8 == 0 && sizeof(RowCtx) % 8 == 0, "8-byte aligned tables");
};

// Copies rows [0, nvalid) of a [rows, kHeadDim] global array into a kRows-row shared tile; rows past
// nvalid are zero-filled (so that P = 0 never meets garbage V).
template <typename Traits, int kRows>
__device__ __forceinline__ void load_tile_async(typename Traits::Element* smem, const typename Traits::Element* gmem,
                                                int nvalid) {
  using Element = typename Traits::Element;
  constexpr int kChunk = 16 / int(sizeof(Element));
  constexpr int kChunksPerRow = Traits::kHeadDim / kChunk;
  static_assert(Traits::kHeadDim % kChunk == 0, "whole 16-byte chunks per row");
#pragma unroll
  for (int c = threadIdx.x; c < kRows * kChunksPerRow; c += Traits::kThreads) {
    const int r = c / kChunksPerRow, col = (c % kChunksPerRow) * kChunk;
    const bool valid = r < nvalid;
    cp_async_16(smem + r * Traits::kStride + col, gmem + int64_t(valid ? r : 0) * Traits::kHeadDim + col, valid);
  }
}

// Writes the tile's rows under one rotation into a query slot (queries.h).
template <typename Traits>
__device__ __forceinline__ void load_queries(typename Traits::Element* slot, const typename Traits::Element* q,
                                             const AttnKernelParams& p, const QueryTile& t, QueryRotation rot) {
  using Element = typename Traits::Element;
  for (int idx = threadIdx.x; idx < Traits::kBlockM * Traits::kHeadDim; idx += Traits::kThreads) {
    const int r = idx / Traits::kHeadDim, d = idx % Traits::kHeadDim;
    const Element* row = q + int64_t(r) * p.q_strides.row;
    const float val = query_element(p, t, rot, r, d, [&](int e) { return to_float(row[e]); });
    slot[r * Traits::kStride + d] = from_float<Element>(val);
  }
}

template <typename Traits>
__global__ void __launch_bounds__(Traits::kThreads) attn_kernel(const __grid_constant__ AttnKernelParams p) {
  using Element = typename Traits::Element;
  using Gemm = WarpGemm<Traits>;
  using Layout = SharedLayout<Traits>;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kHeadDim = Traits::kHeadDim;
  constexpr int NT = Gemm::NT, DT = Gemm::DT;
  const Rules& R = p.rules;

  const int64_t tiles_per_head = p.control_tiles + p.body_tiles;
  const int64_t head = int64_t(blockIdx.x) / tiles_per_head;  // b * Hq + h
  const QueryTile t = query_tile<kBlockM>(p, int64_t(blockIdx.x) % tiles_per_head);
  if (t.nrows <= 0) return;  // the whole CTA leaves before any barrier
  const int64_t b = head / p.Hq, h = head % p.Hq, kvh = b * p.Hkv + h / (p.Hq / p.Hkv);

  extern __shared__ __align__(16) unsigned char smem[];
  const int slots = p.num_q_slots;
  Element* sQ = reinterpret_cast<Element*>(smem);
  Element* sK = reinterpret_cast<Element*>(smem + Layout::kKOffset(slots));
  Element* sV = reinterpret_cast<Element*>(smem + Layout::kVOffset(slots));
  Segment* sSeg = reinterpret_cast<Segment*>(smem + Layout::kSegOffset(slots));
  RowCtx* sRow = reinterpret_cast<RowCtx*>(smem + Layout::kRowOffset(slots));
  float* sMixed = reinterpret_cast<float*>(smem + Layout::kMixedOffset(slots));

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, tq = lane % 4;

  // This KV head's prepared arrays, the tile's query rows, its retrieved blocks.
  const Element* keys_nat = static_cast<const Element*>(p.keys_nat) + kvh * p.nat_rows * kHeadDim;
  const Element* keys_grp = p.keys_grp ? static_cast<const Element*>(p.keys_grp) + kvh * p.grp_rows * kHeadDim : nullptr;
  const Element* keys_cond = p.keys_cond ? static_cast<const Element*>(p.keys_cond) + kvh * p.L * kHeadDim : nullptr;
  const Element* values = static_cast<const Element*>(p.values) + kvh * p.nat_rows * kHeadDim;
  const int64_t n0 = t.control ? t.i0 : p.C + t.i0 - p.first_row;  // q row of the tile's first row
  const int64_t row0 = head * p.Nq + n0;  // first output row of the contiguous [B * Hq * Nq]
  const Element* q_rows = query_row<Element>(p, head, n0);
  SegmentList segs{sSeg, nullptr, 0};
  if (!t.control && R.method == Method::kRangeSwa && p.retrieved != nullptr) {
    segs.retrieved = p.retrieved + (kvh * R.num_query_blocks() + t.qb) * p.retrieved_k;
    segs.retrieved_k = p.retrieved_k;
  }
  auto load_keys = [&](const KvTile& k, bool grouped) {
    const RowRef ref = key_rows(p, t, k, grouped);
    const Element* array = ref.array == KeyArray::kNative ? keys_nat : ref.array == KeyArray::kGrouped ? keys_grp : keys_cond;
    load_tile_async<Traits, kBlockN>(sK, array + ref.row * kHeadDim, k.n);
  };

  // Prologue: the plan (one thread), row contexts, mixed sums; the first K copy; the query slots.
  if (tid == 0) build_segments(p, t, sSeg);
  if (tid < kBlockM) {
    sRow[tid] = make_row_ctx(R, t.i0 + min64(tid, t.nrows - 1));  // rows past the tile mirror its last row
    sMixed[2 * tid] = sMixed[2 * tid + 1] = 0.f;
  }
  __syncthreads();
  KvCursor cursor;
  KvTile cur{};
  bool have = next_kv_tile<kBlockN>(p, t, segs, cursor, cur);
  if (have) load_keys(cur, first_pass_grouped(cur));
  cp_async_commit();
  for (int slot = 0; slot < tile_slots(p, t); ++slot)
    load_queries<Traits>(sQ + slot * Traits::kQSlotElems, q_rows, p, t, initial_slot_rotation(p, t, slot));
  bool slot1_cond = !t.control && p.cond_queries;

  OnlineSoftmax<NT> softmax;
  softmax.init();
  float o[DT][4];
#pragma unroll
  for (int dt = 0; dt < DT; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[dt][e] = 0.f;

  const bool warp_active = warp * 16 < t.nrows;  // warps whose 16 rows are all past the tile skip the math
  const int r_lo = warp * 16 + lane / 4;          // this lane's rows r_lo and r_lo + 8 of the tile
  auto slot_rows = [&](int slot) { return sQ + slot * Traits::kQSlotElems + warp * 16 * Traits::kStride; };

  while (have) {
    KvTile nxt{};
    const bool have_next = next_kv_tile<kBlockN>(p, t, segs, cursor, nxt);
    cp_async_wait_all();
    __syncthreads();  // K(n) visible; every warp is done with V(n-1) and the previous scores
    if (slot1_cond && cur.kind != SegKind::kControl) {  // past the control keys
      slot1_cond = false;
      if (slots == 3) {
        load_queries<Traits>(sQ + Traits::kQSlotElems, q_rows, p, t, QueryRotation::kLeft);
        __syncthreads();
      }
    }
    if (cur.kind != SegKind::kMixed)
      load_tile_async<Traits, kBlockN>(sV, values + value_row(p, cur) * kHeadDim, cur.n);
    cp_async_commit();

    // S = Q K^T: one pass per query class present; later passes keep only their own elements.
    float s[NT][4];
    const bool after_native = (cur.classes & kNativeBit) != 0;
    if (after_native && warp_active) Gemm::qk(s, slot_rows(query_slot(cur, 0, slot1_cond)), sK, lane);
    if (cur.classes & (kLeftBit | kRightBit)) {
      if (after_native) {  // second K copy: the grouped keys
        __syncthreads();
        load_keys(cur, true);
        cp_async_commit();
        cp_async_wait_all();
        __syncthreads();
      }
      if (warp_active) {
        bool first = !after_native;
#pragma unroll
        for (int cls = 1; cls <= 2; ++cls) {
          if (!(cur.classes & (1 << cls))) continue;
          if (first) {
            Gemm::qk(s, slot_rows(query_slot(cur, cls, slot1_cond)), sK, lane);
            first = false;
          } else {
            Gemm::qk_merge(s, slot_rows(query_slot(cur, cls, slot1_cond)), sK, lane, [&](int n, int e) {
              return element_class(R, cur.kind, sRow[r_lo + 8 * (e / 2)], cur.a + n * 8 + 2 * tq + (e & 1)) == cls;
            });
          }
        }
      }
    }

    cp_async_wait_all();
    __syncthreads();  // V(n) visible; every warp is done with K(n)
    if (have_next) load_keys(nxt, first_pass_grouped(nxt));
    cp_async_commit();

    if (warp_active && cur.kind == SegKind::kMixed) {
      // Rule 4 for blocks straddling Hn: add each row's exact logits of its mixed blocks.
      float part[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = n * 8 + 2 * tq + (e & 1);
          const int side = col < cur.n ? mixed_side(sRow[r_lo + 8 * (e / 2)], cur.a + col) : -1;
          if (side == 0) part[e / 2][0] += s[n][e];
          if (side == 1) part[e / 2][1] += s[n][e];
        }
#pragma unroll
      for (int rr = 0; rr < 2; ++rr)
#pragma unroll
        for (int side = 0; side < 2; ++side) {
          float v = part[rr][side];
          v += __shfl_xor_sync(0xffffffffu, v, 1);
          v += __shfl_xor_sync(0xffffffffu, v, 2);
          if (tq == 0) sMixed[2 * (r_lo + 8 * rr) + side] += v;
        }
    } else if (warp_active) {
      // Base-2 logits: interior tiles scale and add the tile's bias; edge tiles decide per element.
      const bool edge = cur.edge();
      const float bias = tile_bias(p, t, cur);
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = r_lo + 8 * (e / 2);
          s[n][e] = edge ? edge_logit(p, t, cur, sRow[r], n * 8 + 2 * tq + (e & 1), s[n][e], sMixed + 2 * r)
                         : s[n][e] * p.scale_log2 + bias;
        }
      softmax.update(s, o);
      Gemm::pv(o, s, sV, lane);
    }
    cur = nxt;
    have = have_next;
  }
  cp_async_wait_all();

  if (warp_active) {
    float row_sum[2];
    softmax.finish(row_sum);
    write_output<Traits>(p, o, softmax.m, row_sum, row0, t.nrows, r_lo, tq);
  }
}

}  // namespace rangeswa::cuda
