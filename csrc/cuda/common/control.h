// The control CTAs (SPEC rule 1's control rows: 32 rows and a chunk of the keys a CTA, its 4 warps splitting
// each tile's columns), on mma.sync under both body kernels: control_unit, control_walk, control_cta, and
// control_kernel, the control grid of the sm_90a launch that folds Lite's preparation in.
#pragma once

#include <cstdint>
#include <type_traits>

#include "../attn_params.h"
#include "../kernel_traits.h"
#include "../plan.h"
#include "../tile.h"
#include "../utils.h"
#include "cond_rotation.h"
#include "kv_copy.h"
#include "query_slot.h"
#include "shared_layout.h"
#include "warp_tile.h"

namespace rangeswa::cuda {

// A control CTA's warp's share of KV tile t (kernel_traits.h kControlSplit): the 16-column units of the
// chunk's tiles go round the warps, unit s of t (keys [a + 16 s, a + 16 s + 16)) to warp (first + s) mod
// kControlSplit, `first` the tile's first unit's warp. Returns the warp's unit, n = 0 when the tile has
// none for it. Control CTAs store their tiles in plain order (load_kv_async), so a unit is 16 whole rows.
// [gate:control-unit begin]
RSWA_HD KvTile control_unit(const KvTile& t, int warp, int32_t first) {
  const int32_t s = (warp - first + kControlSplit) % kControlSplit, c0 = s * kCtrlCols;
  KvTile u = t;
  u.a = t.a + c0;
  u.n = c0 < t.width ? imax(0, imin(kCtrlCols, t.n - c0)) : 0;
  u.width = kCtrlCols;
  u.excluded = t.excluded >> c0;
  return u;
}
// [gate:control-unit end]

// A control CTA's walk over its chunk (plan.h plan_control_tile's records; the slot holds its rows, filled
// and published by the first barrier here). Every warp holds the CTA's kControlTileRows rows and takes its
// 16-column unit of each tile (control_unit), so the 4 warps split the chunk's keys; every row sees every
// key of the records, so a unit is a full tile (column fix-ups past its keys). Each warp leaves its
// normalised partial output and base-2 log-sum-exp, merged with the other parts by the combine kernel.
// sBounds: the body's row-bounds buffer, which warp_tile reads on a fixed-up tile but uses only on masked
// ones (any values serve here). kFold: this CTA folds Lite's preparation in (LitePrep: nat, s_nat and s_v the KV
// head's k_nat, s_nat and s_v; a walk of its own, so that the fold's registers cost the other CTAs' walk nothing).
template <typename Traits, bool kFold>
__device__ __forceinline__ void control_walk(const AttnKernelParams& p, const QueryTile& t, int32_t head,
                                             const typename Traits::Element* sQ, typename Traits::Element* sK,
                                             typename Traits::Element* sV, const Record* sRec,
                                             const RecordArrays<typename Traits::Element>* sArrays, int32_t count,
                                             const int32_t* sBounds, typename Traits::Element* nat,
                                             typename Traits::Element* s_nat, typename Traits::Element* s_v) {
  using Element = typename Traits::Element;
  constexpr int N = Traits::kBlockN, Dp = Traits::kHeadDim, MB = Traits::kMBlocks, DT = Dp / 8;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, tq = lane % 4, gq = lane / 4;
  OnlineSoftmax<MB> softmax;
  softmax.init();
  float o[MB][DT][4];
  zero_output(o);
  TileCursor cursor;
  KvTile cur{}, nxt{};
  bool have_cur = false;
  int stage = 1;
  int32_t first = 0;  // the warp of the current tile's first unit
  // Keys read from k itself are rotated as each tile lands (rotate_cond_keys; folding, LitePrep, its cos / sin
  // loaded before the tile's wait).
  const bool cond_raw = p.kv.cond_raw && p.cos_cond != nullptr;
  [[maybe_unused]] std::conditional_t<kFold, LitePrep<Traits>, NoLitePrep> fold(p);
  // Iteration n issues the copy of tile n (plain row order) and computes tile n - 1.
  for (;;) {
    const bool have_nxt = cursor.advance<N, kCtrlCols>(p.geo, sRec, count, nullptr, 0, nxt);
    const bool rotates = have_cur && cond_raw && KeySet(sRec[cur.record].keys) == KeySet::kCond;
    if constexpr (kFold)
      if (rotates) fold.tables(p, cur);
    cp_async_wait_all();
    __syncthreads();  // tile n - 1 landed; every warp is done with tile n - 2
    copy_tile<Traits>(sK, sV, stage ^ 1, sArrays, nxt, false);  // past the last tile: a zero fill
    cp_async_commit();
    if (!have_cur && !have_nxt) break;
    if (rotates) {
      // k's own rows, as they landed (and, folding, Lite's preparation of them and of their values)
      if constexpr (kFold) fold.run(sK + stage * Traits::kKVElems, sV + stage * Traits::kKVElems, cur, p, nat, s_nat, s_v);
      else rotate_cond_keys<Traits>(sK + stage * Traits::kKVElems, cur, p);
      __syncthreads();  // every warp reads keys another warp rotated
    }
    if (have_cur) {
      const KvTile mine = control_unit(cur, warp, first);
      if (__any_sync(0xffffffffu, mine.n > 0)) {  // warp-uniform (a vote: ptxas sees it so)
        const int32_t unit = (mine.a - cur.a) * Traits::kStride;
        const WarpTile<Element> w{sQ, sK + stage * Traits::kKVElems + unit, sV + stage * Traits::kKVElems + unit,
                                  lane, gq, TileWork::kFull, has_column_fixups(mine, -1), false, mine, -1,
                                  sBounds, sBounds + Traits::kBlockM, nullptr, 0, 0, p.scale_log2,
                                  sRec[cur.record].bias_log2, 0.f};
        warp_tile<Traits, kCtrlCols>(o, softmax, w);
      }
      first = (first + cur.width / kCtrlCols) % kControlSplit;
    }
    cur = nxt;
    have_cur = have_nxt;
    stage ^= 1;
  }
  float row_sum[2 * MB];
  softmax.finish(row_sum);
  const int64_t at = (int64_t(t.chunk * kControlSplit + warp) * p.B * p.Hq + head) * p.geo.C + t.i0;
  float* const ctrl_o = p.ctrl_o + at * Dp;  // read once: the stores under a condition are then predicated
  float* const ctrl_lse = p.ctrl_lse + at;
#pragma unroll
  for (int rr = 0; rr < 2 * MB; ++rr) {
    const int row = (rr / 2) * 16 + gq + 8 * (rr % 2);
    if (row >= t.nrows) continue;
    // A part that saw no key (its units past the chunk's keys) leaves o = 0 and lse = m + log2 0 = -inf.
    const float inv = row_sum[rr] > 0.f ? __fdividef(1.f, row_sum[rr]) : 0.f;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
      *reinterpret_cast<float2*>(ctrl_o + row * Dp + dt * 8 + 2 * tq) =
          make_float2(o[rr / 2][dt][2 * (rr % 2)] * inv, o[rr / 2][dt][2 * (rr % 2) + 1] * inv);
    if (tq == 0) ctrl_lse[row] = softmax.m[rr] + __log2f(row_sum[rr]);
  }
}

// A control CTA (query_tile: kControlTileRows control rows, chunk t.chunk of the keys): its two records
// (plan.h plan_control_tile) and their arrays, its rows in the slot unrotated, then control_walk. Its own
// function, so that nothing of the body CTAs' prologue stays live across their walk on its account. kMayFold:
// the CTA folds Lite's preparation in where p.fold asks (control_kernel's CTAs; attn_kernel's never do, so that
// it carries none of the fold's code).
template <typename Traits, bool kMayFold = false>
__device__ __forceinline__ void control_cta(const AttnKernelParams& p, const QueryTile& t, int32_t head,
                                            int32_t batch, int32_t h, int32_t bh, unsigned char* smem) {
  using Element = typename Traits::Element;
  using Layout = SharedLayout<Traits>;
  Element* sQ = reinterpret_cast<Element*>(smem);
  Record* sRec = reinterpret_cast<Record*>(smem + Layout::kRecords);
  RecordArrays<Element>* sArrays = reinterpret_cast<RecordArrays<Element>*>(smem + Layout::arrays(p.max_records, p.retrieved_k));
  RSWA_STATIC_SHARED(int32_t, control_count);
  const int tid = threadIdx.x;
  if (tid == 0) control_count = plan_control_tile(p.geo, t.chunk, p.control_chunk_keys, p.control_bias_log2, sRec);
  __syncthreads();
  const int32_t count = control_count;
  if (tid < count) {
    RecordArrays<Element> ra;
    record_arrays<Element>(p.kv, KeySet(sRec[tid].keys), bh, batch, bh - batch * p.Hkv, Traits::kHeadDim, ra);
    sArrays[tid] = ra;
  }
  const Element* q_rows = static_cast<const Element*>(p.q) + p.q_strides.at(batch, h, t.i0);
  const Element* row = tid < t.nrows ? q_rows + int64_t(tid) * p.q_strides.row : nullptr;
  fill_row<Traits>(sQ + tid * Traits::kStride, row, nullptr, nullptr, 1.f, p.rotary_half, p.D, p.interleaved,
                   slot_rows_in_chunks<Traits>(p, q_rows));
  // Lite's preparation folded in (attn_setup.h nat_keys_from_control): by the first control tile of the KV head's
  // first query head, once for every body key over its chunks. LitePrep exists where the control CTAs' tiles are
  // 64 keys at head dim 64 on the tensor cores.
  constexpr bool kNat = kMayFold && Traits::kHeadDim == 64 && Traits::kBlockN == 64 && Traits::kTensorCores;
  Element* sK = reinterpret_cast<Element*>(smem + Layout::kK);
  Element* sV = reinterpret_cast<Element*>(smem + Layout::kV);
  const int32_t* sBounds = reinterpret_cast<const int32_t*>(smem + Layout::kRows);
  if constexpr (kNat) {
    if (p.fold.k_nat != nullptr && t.i0 == 0 && p.by_group.mod(h) == 0) {
      control_walk<Traits, true>(p, t, head, sQ, sK, sV, sRec, sArrays, count, sBounds,
                                 static_cast<Element*>(p.fold.k_nat) + bh * p.kv.key_stride,
                                 static_cast<Element*>(p.fold.s_nat) + bh * p.kv.sum_stride,
                                 static_cast<Element*>(p.fold.s_v) + bh * p.kv.sum_stride);
      return;
    }
  }
  control_walk<Traits, false>(p, t, head, sQ, sK, sV, sRec, sArrays, count, sBounds, nullptr, nullptr, nullptr);
}

// The control CTAs of one call alone, Lite's preparation folded into those that p.fold names (attn_setup.h
// nat_keys_from_control; the sm_90a launch's control grid, hopper/body_launch.h): p's CTAs per head are its
// control tiles. A kernel of its own, beside attn_kernel, whose CTAs run the same control_cta without the fold.
template <typename Traits>
__global__ void __launch_bounds__(Traits::kThreads, 2) control_kernel(const __grid_constant__ AttnKernelParams p) {
  const int32_t cta = int32_t(blockIdx.x);
  const int32_t head = p.by_ctas_per_head.div(cta);  // b * Hq + h
  const QueryTile t = query_tile<Traits::kBlockM>(p, p.by_ctas_per_head.mod(cta));
  if (t.nrows <= 0 || !t.control) return;
  const int32_t batch = p.by_Hq.div(head), h = p.by_Hq.mod(head);
  RSWA_DYNAMIC_SHARED(smem);
  control_cta<Traits, true>(p, t, head, batch, h, batch * p.Hkv + p.by_group.div(h), smem);
}

}  // namespace rangeswa::cuda
