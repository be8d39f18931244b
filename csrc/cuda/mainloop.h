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
#include "rotary.h"
#include "softmax.h"
#include "utils.h"
#include "warp_gemm.h"

namespace rangeswa::cuda {

// Which rotation a query slot receives.
enum class QueryRotation : uint8_t { kPlain, kNative, kLeft, kRight, kCond };

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

// Writes kBlockM rotated, unscaled query rows into a slot (rows past nrows and dims past D are 0).
template <typename Traits>
__device__ __forceinline__ void load_queries(typename Traits::Element* slot, const typename Traits::Element* q,
                                             const AttnKernelParams& p, const QueryTile& t, QueryRotation rot) {
  using Element = typename Traits::Element;
  const Rules& R = p.rules;
  const float *cos_t = nullptr, *sin_t = nullptr;
  if (rot == QueryRotation::kNative) cos_t = p.cos_nat, sin_t = p.sin_nat;
  if (rot == QueryRotation::kLeft || rot == QueryRotation::kRight) cos_t = p.cos_grp, sin_t = p.sin_grp;
  if (rot == QueryRotation::kCond) cos_t = p.cos_cond, sin_t = p.sin_cond;
  for (int idx = threadIdx.x; idx < Traits::kBlockM * Traits::kHeadDim; idx += Traits::kThreads) {
    const int r = idx / Traits::kHeadDim, d = idx % Traits::kHeadDim;
    float val = 0.f;
    if (r < t.nrows && d < p.D) {
      const Element* row = q + int64_t(r) * p.D;
      auto x = [&](int e) { return to_float(row[e]); };
      if (cos_t == nullptr) {
        val = x(d);
      } else {
        const int64_t i = t.i0 + r;
        // Table rows: native and conditioning at i; grouped tables start at position -c, so
        // grouped-left (i/g + c) is row i/g + 2c and grouped-right (i/g - c) row i/g.
        const int64_t s = rot == QueryRotation::kLeft    ? i / R.g + 2 * R.group_offset
                          : rot == QueryRotation::kRight ? i / R.g
                                                         : i;
        val = rotated_element(x, d, p.rotary_half, p.interleaved, cos_t + s * p.rotary_half, sin_t + s * p.rotary_half);
      }
    }
    slot[r * Traits::kStride + d] = from_float<Element>(val);
  }
}

template <typename Traits>
__global__ void __launch_bounds__(Traits::kThreads) attn_kernel(const __grid_constant__ AttnKernelParams p) {
  using Element = typename Traits::Element;
  using Gemm = WarpGemm<Traits>;
  using Layout = SharedLayout<Traits>;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kStride = Traits::kStride;
  constexpr int NT = Gemm::NT, DT = Gemm::DT;
  const Rules& R = p.rules;

  const int64_t tiles_per_head = p.control_tiles + p.body_tiles;
  const int64_t head = int64_t(blockIdx.x) / tiles_per_head;
  const QueryTile t = query_tile<kBlockM>(p, int64_t(blockIdx.x) % tiles_per_head);
  if (t.nrows <= 0) return;  // the whole CTA leaves before any barrier
  const int64_t b = head / p.Hq, h = head % p.Hq, hkv = h / (p.Hq / p.Hkv), kvh = b * p.Hkv + hkv;

  extern __shared__ __align__(16) unsigned char smem[];
  const int slots = p.num_q_slots;
  Element* sQ = reinterpret_cast<Element*>(smem);
  Element* sK = reinterpret_cast<Element*>(smem + Layout::kKOffset(slots));
  Element* sV = reinterpret_cast<Element*>(smem + Layout::kVOffset(slots));
  Segment* sSeg = reinterpret_cast<Segment*>(smem + Layout::kSegOffset(slots));
  RowCtx* sRow = reinterpret_cast<RowCtx*>(smem + Layout::kRowOffset(slots));
  float* sMixed = reinterpret_cast<float*>(smem + Layout::kMixedOffset(slots));

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, tq = lane % 4;

  // Per-head arrays.
  const Element* keys_nat = static_cast<const Element*>(p.keys_nat) + kvh * p.nat_rows * Traits::kHeadDim;
  const Element* values = static_cast<const Element*>(p.values) + kvh * p.nat_rows * Traits::kHeadDim;
  const Element* keys_grp =
      p.keys_grp ? static_cast<const Element*>(p.keys_grp) + kvh * p.grp_rows * Traits::kHeadDim : nullptr;
  const Element* keys_cond = p.keys_cond ? static_cast<const Element*>(p.keys_cond) + kvh * p.L * Traits::kHeadDim : nullptr;
  const int64_t row0 = head * p.N + (t.control ? 0 : p.C) + t.i0;  // first query row in [B*Hq*N]
  const Element* q_rows = static_cast<const Element*>(p.q) + row0 * p.D;

  SegmentList segs{sSeg, nullptr, 0};
  if (!t.control && R.method == Method::kRangeSwa && p.retrieved != nullptr) {
    segs.retrieved = p.retrieved + (kvh * R.num_query_blocks() + t.qb) * p.retrieved_k;
    segs.retrieved_k = p.retrieved_k;
  }

  // Key rows of a tile for one GEMM pass (grouped: the grouped-position copy), and its value rows.
  auto key_rows = [&](const KvTile& k, bool grouped) -> const Element* {
    const int64_t D = Traits::kHeadDim;
    if (k.kind == SegKind::kControl) return keys_nat + k.a * D;
    if (k.kind == SegKind::kSummary) return grouped ? keys_grp + (p.L + k.a) * D : keys_nat + (p.C + p.L + k.a) * D;
    if (t.control && keys_cond != nullptr) return keys_cond + k.a * D;
    return grouped ? keys_grp + k.a * D : keys_nat + (p.C + k.a) * D;
  };
  auto value_rows = [&](const KvTile& k) -> const Element* {
    const int64_t D = Traits::kHeadDim;
    if (k.kind == SegKind::kControl) return values + k.a * D;
    if (k.kind == SegKind::kSummary) return values + (p.C + p.L + k.a) * D;
    return values + (p.C + k.a) * D;
  };
  // The first pass of a tile is native when present, else grouped.
  auto first_pass_grouped = [](const KvTile& k) { return (k.classes & kNativeBit) == 0; };

  // Prologue: the plan (one thread), row contexts, mixed sums; then the first K copy and the queries.
  if (tid == 0) build_segments(p, t, sSeg);
  if (tid < kBlockM) {
    sRow[tid] = make_row_ctx(R, t.i0 + min64(tid, t.nrows - 1));  // rows past the tile mirror its last row
    sMixed[2 * tid] = sMixed[2 * tid + 1] = 0.f;
  }
  __syncthreads();

  KvCursor cursor;
  KvTile cur{};
  bool have = next_kv_tile<kBlockN>(p, t, segs, cursor, cur);
  if (have) load_tile_async<Traits, kBlockN>(sK, key_rows(cur, first_pass_grouped(cur)), cur.n);
  cp_async_commit();

  const bool grouping_queries = !t.control && slots == 3;
  // Slot 1 holds the conditioning rotation while body rows score the control keys, then the
  // grouped-left one.
  bool slot1_cond = !t.control && p.cond_queries;
  load_queries<Traits>(sQ, q_rows, p, t, t.control ? QueryRotation::kPlain : QueryRotation::kNative);
  if (slot1_cond) load_queries<Traits>(sQ + Traits::kQSlotElems, q_rows, p, t, QueryRotation::kCond);
  else if (grouping_queries) load_queries<Traits>(sQ + Traits::kQSlotElems, q_rows, p, t, QueryRotation::kLeft);
  if (grouping_queries) load_queries<Traits>(sQ + 2 * Traits::kQSlotElems, q_rows, p, t, QueryRotation::kRight);

  OnlineSoftmax<NT> softmax;
  softmax.init();
  float o[DT][4];
#pragma unroll
  for (int dt = 0; dt < DT; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[dt][e] = 0.f;

  const bool warp_active = warp * 16 < t.nrows;  // warps whose 16 rows are all past the tile skip the math
  const int r_lo = warp * 16 + g;                 // this lane's rows r_lo, r_lo + 8 of the tile
  const Element* sQw = sQ + warp * 16 * kStride;

  while (have) {
    KvTile nxt{};
    const bool have_next = next_kv_tile<kBlockN>(p, t, segs, cursor, nxt);
    cp_async_wait_all();
    __syncthreads();  // K(n) visible; every warp is done with V(n-1) and the previous scores
    if (slot1_cond && cur.kind != SegKind::kControl) {
      slot1_cond = false;
      if (grouping_queries) {
        load_queries<Traits>(sQ + Traits::kQSlotElems, q_rows, p, t, QueryRotation::kLeft);
        __syncthreads();
      }
    }
    if (cur.kind != SegKind::kMixed) load_tile_async<Traits, kBlockN>(sV, value_rows(cur), cur.n);
    cp_async_commit();

    // S = Q K^T, one pass per query class present.
    float s[NT][4];
    const int control_slot = (cur.kind == SegKind::kControl && slot1_cond) ? 1 : 0;
    auto element_class = [&](int rr, int col) -> int {
      const RowCtx& row = sRow[r_lo + 8 * rr];
      return cur.kind == SegKind::kSummary ? int(block_class(R, row.i, cur.a + col))
                                           : int(R.pos_class(row.i, cur.a + col));
    };
    auto merge_pass = [&](int cls, const Element* slot) {
      Gemm::qk_merge(s, slot, sK, lane,
                     [&](int n, int e) { return element_class(e / 2, n * 8 + 2 * tq + (e & 1)) == cls; });
    };
    if (cur.classes & kNativeBit) {
      if (warp_active) Gemm::qk(s, sQw + control_slot * Traits::kQSlotElems, sK, lane);
    }
    if (cur.classes & (kLeftBit | kRightBit)) {
      const bool after_native = (cur.classes & kNativeBit) != 0;
      if (after_native) {  // second K copy: the grouped keys
        __syncthreads();
        load_tile_async<Traits, kBlockN>(sK, key_rows(cur, true), cur.n);
        cp_async_commit();
        cp_async_wait_all();
        __syncthreads();
      }
      if (warp_active) {
        bool first = !after_native;
        if (cur.classes & kLeftBit) {
          if (first) Gemm::qk(s, sQw + 1 * Traits::kQSlotElems, sK, lane);
          else merge_pass(int(PosClass::kGroupedLeft), sQw + 1 * Traits::kQSlotElems);
          first = false;
        }
        if (cur.classes & kRightBit) {
          if (first) Gemm::qk(s, sQw + 2 * Traits::kQSlotElems, sK, lane);
          else merge_pass(int(PosClass::kGroupedRight), sQw + 2 * Traits::kQSlotElems);
        }
      }
    }

    cp_async_wait_all();
    __syncthreads();  // V(n) visible; every warp is done with K(n)
    if (have_next) load_tile_async<Traits, kBlockN>(sK, key_rows(nxt, first_pass_grouped(nxt)), nxt.n);
    cp_async_commit();

    if (warp_active && cur.kind == SegKind::kMixed) {
      // Rule 4 for blocks straddling Hn: add each row's exact logits of its mixed blocks.
      float part[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = n * 8 + 2 * tq + (e & 1), rr = e / 2;
          const RowCtx& row = sRow[r_lo + 8 * rr];
          const int64_t j = cur.a + col;
          if (col >= cur.n) continue;
          if (j >= row.mixed_lo[0] && j < row.mixed_hi[0]) part[rr][0] += s[n][e];
          else if (j >= row.mixed_lo[1] && j < row.mixed_hi[1]) part[rr][1] += s[n][e];
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
      // Logits in base 2: S * scale * log2(e) + bias, -inf where the row does not see the key.
      const float bias = cur.kind == SegKind::kSummary                ? p.log2_block
                         : (t.control && cur.kind == SegKind::kBody) ? p.control_bias_log2
                                                                      : 0.f;
      const bool edge = cur.check_count || cur.check_visibility || cur.per_class || cur.check_last_block;
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float x = s[n][e] * p.scale_log2 + bias;
          if (edge) {
            const int col = n * 8 + 2 * tq + (e & 1), rr = e / 2;
            const RowCtx& row = sRow[r_lo + 8 * rr];
            bool visible = !(cur.check_count && col >= cur.n);
            if (cur.kind == SegKind::kSummary) {
              const int64_t blk = cur.a + col;
              if (cur.check_visibility)
                visible = visible && summary_visible(R, row, blk, (cur.retrieved_mask >> col) & 1);
              float log2_n = p.log2_block;
              if (cur.check_last_block && blk == R.num_summary_blocks() - 1) {
                log2_n = p.log2_last_block;
                x = s[n][e] * p.scale_log2 + log2_n;
              }
              if (cur.per_class && visible && block_class(R, row.i, blk) == BlockClass::kMixed) {
                const int side = blk == row.mixed_block[0] ? 0 : 1;
                const float mean = sMixed[2 * (r_lo + 8 * rr) + side] / float(R.block_size(blk));
                x = mean * p.scale_log2 + log2_n;
              }
            } else if (cur.kind == SegKind::kBody && cur.check_visibility) {
              visible = visible && body_key_visible(R, cur.vis, row, cur.a + col);
            }
            if (!visible) x = -INFINITY;
          }
          s[n][e] = x;
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
