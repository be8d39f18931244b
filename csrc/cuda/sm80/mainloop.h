// The fused RangeSWA attention kernel (SPEC sections 1-4 and 7): one CTA per tile of 128 query rows
// (4 warps of 32) and (batch, query head), walking the KV tiles of its plan (plan.h records and tile.h tile
// spans, made by the plan kernel) with one online softmax, FlashAttention-2 style. (A control CTA holds 32
// control rows and a chunk of the keys; its 4 warps hold the same rows and split each tile's columns,
// control_unit.)
//
//   prologue: the plan (records, spans) and retrieved blocks -> shared memory; each row's straddling
//             blocks (plan.h); issue the copy of KV tile 0
//   per run of tiles (the spans: per query variant its unmasked tiles, then its masked ones): fill the
//             query slot if the variant changed, then
//     the unmasked loop, per tile: wait, barrier (tile n landed, tile n - 1 done) -> issue the copy of tile
//             n + 1 into the other stage (three K/V stages: of tile n + 2 into tile n - 1's, tile n + 1 in
//             flight) -> S = Q K^T, softmax (scale and bias in its FFMA), O += P V
//     the masked loop, per tile: the same wait and copy -> each row's bounds in a new record -> per warp,
//             two votes: skip, or S = Q K^T, logits (full / masked / column fix-ups, tile.h), softmax, O += P V
//   last: the direct records of the blocks straddling distance Hn (their logits from three dot products
//         per row and side, made as the query variants were filled) or of the Hn bands (their logits from
//         a 16-column product per variant, plan.h hn_bands), in the masked loop; output staged through
//         shared memory
//
// The query slot holds the tile's rows under one rotation at a time (native, grouped-left, grouped-right,
// conditioning, or none for control rows), rotated here from the input with the rope tables; records
// come in the slot's fill order, so a tile fills it at most four times. Every decision (records, spans,
// bounds, skip / full / masked, column fix-ups, straddling blocks) comes from plan.h and tile.h, which the
// host emulator runs too.
#pragma once

#include <cmath>
#include <cstdint>

#include "../attn_params.h"
#include "../kernel_traits.h"
#include "../plan.h"
#include "../tile.h"
#include "../utils.h"
#include "../common/control.h"
#include "../common/epilogue.h"
#include "../common/kv_copy.h"
#include "../common/logits.h"
#include "../common/query_slot.h"
#include "../common/shared_layout.h"
#include "../common/softmax.h"
#include "../common/warp_gemm.h"
#include "../common/warp_tile.h"

namespace rangeswa::cuda {

// CTA `cta_index` of one call's launch (p: the call's parameters): attn_kernel's body, and the packed launch's per
// sequence (attn_packed_kernel).
template <typename Traits>
__device__ __forceinline__ void attn_cta(const AttnKernelParams& p, int32_t cta_index) {
  using Element = typename Traits::Element;
  using Layout = SharedLayout<Traits>;
  constexpr int M = Traits::kBlockM, N = Traits::kBlockN, Dp = Traits::kHeadDim, MB = Traits::kMBlocks;
  constexpr int DT = Dp / 8, WR = Traits::kWarpRows;
  static_assert(M == Traits::kThreads, "one thread per query row: its bounds, its straddling blocks");
  const Geometry& g = p.geo;

  const int32_t head = p.by_ctas_per_head.div(cta_index);  // b * Hq + h
  const QueryTile t = query_tile<M>(p, p.by_ctas_per_head.mod(cta_index));
  if (t.nrows <= 0) return;  // the whole CTA leaves before any barrier
  const int32_t batch = p.by_Hq.div(head), h = p.by_Hq.mod(head);
  const int32_t bh = batch * p.Hkv + p.by_group.div(h);

  RSWA_DYNAMIC_SHARED(smem);
  if (t.control) {  // control rows: a CTA of their own kind (its prologue and walk share no state with the body's)
    control_cta<Traits>(p, t, head, batch, h, bh, smem);
    return;
  }
  Element* sQ = reinterpret_cast<Element*>(smem);
  Element* sK = reinterpret_cast<Element*>(smem + Layout::kK);
  Element* sV = reinterpret_cast<Element*>(smem + Layout::kV);
  Record* sRec = reinterpret_cast<Record*>(smem + Layout::kRecords);
  RecordArrays<Element>* sArrays = reinterpret_cast<RecordArrays<Element>*>(smem + uint32_t(Layout::arrays(p.max_records, p.retrieved_k)));
  int32_t* sRet = reinterpret_cast<int32_t*>(smem + uint32_t(Layout::retrieved(p.max_records, p.retrieved_k)));
  TileSpan* sSpan = reinterpret_cast<TileSpan*>(smem + uint32_t(Layout::spans(p.max_records)));
  // Per row: its bounds in the current record, the two parts of its straddling blocks' logits (per side)
  // and, in a direct record, its raw score.
  int32_t* sLo = reinterpret_cast<int32_t*>(smem + Layout::kRows);
  int32_t* sHi = sLo + M;
  float* sMixA = reinterpret_cast<float*>(sHi + M);  // [2][M]
  float* sMixB = sMixA + 2 * M;                      // [2][M]
  float* sRaw = sMixB + 2 * M;
  int32_t* sCurrent = reinterpret_cast<int32_t*>(sRaw + M);  // per warp: the record whose bounds sLo / sHi hold
  RowGeometry* sRow = reinterpret_cast<RowGeometry*>(smem + Layout::kGeometry);
  // The Hn bands (only when the call has them: otherwise not allotted).
  Element* sBandK = reinterpret_cast<Element*>(smem + uint32_t(Layout::band_k(p.max_records, p.retrieved_k)));
  float* sBand = reinterpret_cast<float*>(smem + uint32_t(Layout::band_logits(p.max_records, p.retrieved_k)));
  constexpr int kBandStride = Layout::kBandStride;
  static_assert(kBandBlocks == kCtrlCols, "an Hn band is one direct tile");
  RSWA_STATIC_SHARED(BandRecords, shared_bands);

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, tq = lane % 4, gq = lane / 4;
  const int32_t i = t.i0 + tid;  // this thread's row (body tiles)

  // ---- prologue: records, retrieved blocks, straddling blocks --------------------------------------
  const int64_t plan = int64_t(bh) * p.body_tiles + t.index;
  const int32_t count = p.record_count[2 * plan], spans = p.record_count[2 * plan + 1];
  const int32_t k = p.retrieved != nullptr ? p.retrieved_k : 0;
  copy_plan<M>(p, plan, spans, bh, t.qb, k, sRec, sRet, tid);
  __syncthreads();
  // Each record's arrays (the barriers below publish them).
  find_record_arrays<Element, M>(p, sRec, count, bh, batch, Dp, sArrays, tid);
  // This thread's row, for record_bounds and its straddling blocks.
  const RowGeometry me = row_geometry(g, i, sRet, k);
  // [gate:body-row-geometry begin]
  sRow[tid] = me;
  // [gate:body-row-geometry end]
  const bool valid = tid < t.nrows;
  if (tid < Traits::kWarps) sCurrent[tid] = -1;  // no record's bounds yet (published by the barriers below)
  uint32_t any = 0;  // bit x: some row has a straddling block on side x
#pragma unroll
  for (int x = 0; x < 2; ++x) {
    sMixA[x * M + tid] = 0.f;
    sMixB[x * M + tid] = 0.f;
    any |= uint32_t(__syncthreads_or(valid && me.mix[x] >= 0) != 0) << x;
  }
  const uint32_t needed = variants_needed(sRec, count, any & 1, any & 2);
  // The Hn bands: logits -inf until the variant of a row's class gives them (rows past the tile keep it).
  // Kept in shared memory for band_dots (published by the fill's barriers), not in registers across the walk.
  const BandRecords bands = BandRecords::find(sRec, count);
  if (tid == 0) shared_bands = bands;
  if (bands.n[0] + bands.n[1] > 0)
#pragma unroll 1
    for (int x = tid; x < 2 * M * kBandStride; x += M) sBand[x] = -INFINITY;

  // ---- the query slot --------------------------------------------------------------------------------
  RSWA_STATIC_SHARED(BodyCta, cta);
  if (tid == 0) {
    const int32_t n0 = g.C + t.i0 - p.first_row;  // q row of the tile's first row
    const Element* q_rows = static_cast<const Element*>(p.q) + p.q_strides.at(batch, h, n0);
    cta = BodyCta{q_rows, int64_t(head) * p.Nq + n0, t.i0, t.nrows, bh, needed, slot_rows_in_chunks<Traits>(p, q_rows)};
  }
  __syncthreads();  // cta is published
  // The tile's rows under variant v (thread r fills row r), and the straddling blocks' parts it gives.
  auto fill = [&](QVar v) { fill_slot_row<Traits>(p, cta, v, tid, sQ + tid * Traits::kStride); };
  auto mixed_dots = [&](QVar v) {
    straddling_dots<Traits>(p, cta, v, tid, sQ + tid * Traits::kStride, sRow, sMixA, sMixB);
  };

  // The Hn bands (plan.h hn_bands, band_columns): while the slot holds variant v, the band blocks of v's
  // class get their scores from a 16-column product per band with its summary rows (native means for near
  // blocks, grouped ones for far blocks). Every thread of the CTA calls it alike (barriers inside).
  auto band_dots = [&](QVar v) {
#pragma unroll 1
    for (int side = 0; side < 2; ++side) {
      if (!shared_bands.uses(side, v)) continue;
      const int32_t k0 = shared_bands.first(side), nb = shared_bands.blocks(side);
      // The band's summary rows of v's class (zero past its blocks).
      load_band_rows<Element, Dp, M>(sBandK, p.kv, v, cta.bh, k0, nb, tid,
                                     [](int r, int c) { return r * Traits::kStride + c; });
      __syncthreads();
      float sc[MB][kBandBlocks / 8][4];
      WarpGemm<Traits>::template qk<kBandBlocks>(sc, sQ + warp * WR * Traits::kStride, sBandK, lane);
      // Rows past the tile store scores of their zero queries, never output.
      keep_band_scores<MB>(sc, band_edge(side, v), k0, nb, sRow, warp * WR + gq, tq, sBand + side * M * kBandStride,
                           kBandStride);
      __syncthreads();  // every warp has read the band tile (the next band or call overwrites it)
    }
  };

  // ---- the walk over the KV tiles ----------------------------------------------------------------------
  OnlineSoftmax<MB> softmax;
  softmax.init();
  float o[MB][DT][4];
  zero_output(o);

  // This lane's rows: slot rr = 2 mb + h is tile row warp * 32 + 16 mb + g + 8 h.
  auto row_of = [&](int rr) { return warp * WR + (rr / 2) * 16 + gq + 8 * (rr % 2); };
  // The slot's variants from fill slot `from` to `to` (variant_at), those the CTA needs: after the barrier
  // that ends every warp's use of the slot, the fill, and the straddling blocks' and Hn bands' dots it gives.
  auto fill_slots = [&](int32_t from, int32_t to) {
#pragma unroll 1
    for (int32_t at = from; at <= to; ++at) {
      const QVar v = variant_at(at);
      if (!((cta.needed >> int(v)) & 1)) continue;
      __syncthreads();  // every warp is done with the slot (its last tile, the previous variant's dots)
      fill(v);
      __syncthreads();
      mixed_dots(v);
      band_dots(v);
    }
  };
  // The tiles in the order of the plan's spans (tile.h plan_spans); with two K/V stages tile n + 1's copy is
  // issued before tile n is computed, with three tile n + 2's (tile n + 1's in flight since the tile before:
  // cp.async.wait_group 1), one barrier per tile: `step` waits for the current tile and issues the next
  // copy into the stage the tile before it used. Three stages keep one more tile's descriptor (`nxt`) and the
  // cursor as it was at the current tile (`lag`: its run), and rotate the stage index without a division.
  constexpr int kStages = Traits::kStages;
  SpanCursor cursor, lag;
  KvTile cur{}, nxt, far;
  int stage = 0;
  const bool first = cursor.advance(sSpan, spans, cur);
  if (first) copy_tile<Traits>(sK, sV, 0, sArrays, cur, true);
  cp_async_commit();
  if constexpr (kStages == 3) {
    lag = cursor;
    cursor.advance(sSpan, spans, nxt);
    if (first) copy_tile<Traits>(sK, sV, 1, sArrays, nxt, true);
    cp_async_commit();
  }
  // Past the last tile the cursor leaves a tile of no keys, whose copy zero-fills the free stage: no branch.
  KvTile& ahead = kStages == 3 ? far : nxt;  // the tile whose copy `step` issues
  auto step = [&]() {
    if constexpr (kStages == 3) lag = cursor;
    cursor.advance(sSpan, spans, ahead);
    if constexpr (kStages == 3) cp_async_wait_group<1>();  // tile n landed; tile n + 1 may be in flight
    else cp_async_wait_all();
    __syncthreads();  // the current tile landed; every warp is done with the one before it
    copy_tile<Traits>(sK, sV, kStages == 3 ? (stage == 0 ? 2 : stage - 1) : stage ^ 1, sArrays, ahead, true);
    cp_async_commit();
  };
  // After a tile: the next one is current.
  auto rotate = [&]() {
    cur = nxt;
    if constexpr (kStages == 3) {
      nxt = far;
      stage = stage == 2 ? 0 : stage + 1;
    } else {
      stage ^= 1;
    }
  };
  // Per run of tiles of one kind (the spans: per query variant its unmasked tiles, then its masked ones):
  // the slot's fills since the run before (SpanCursor: `from`), then the run's loop, while the tiles continue
  // the run; once the tiles are done, the variants straddling blocks may still need.
#pragma unroll 1
  for (;;) {
    int32_t kind, from;
    (kStages == 3 ? lag : cursor).run(sSpan, spans, kind, from);  // the current tile's run
    fill_slots(from, kind >= 0 ? kind >> 1 : kVariantSlots - 1);
    if (kind < 0) break;
    // The unmasked loop (FlashAttention's): every row of the CTA sees every key of the tile, no column
    // fix-up; no bounds, no selects, no warp reduction. (A warp of padding rows computes them, unused.)
    if (!(kind & 1)) {
#pragma unroll 1
    do {
      step();
      // Only the record's bias of the tile is used (no bounds, no fix-ups): the next tile is the state.
      const float bias = sRec[cur.record].bias_log2;
      const WarpTile<Element> w{sQ + warp * WR * Traits::kStride, sK + stage * Traits::kKVElems,
                                sV + stage * Traits::kKVElems, lane, row_of(0), TileWork::kFull, false, false, cur,
                                -1, sLo, sHi, nullptr, 0, 0, p.scale_log2, bias, 0.f};
      warp_tile<Traits, N, false>(o, softmax, w);
      rotate();
    } while (cur.cont);
    } else {
    // [gate:masked-loop begin]
    // The masked loop: the variant's other tiles. Per record, each row's bounds; per tile and warp, skip /
    // full / masked by two votes of its rows, and the column fix-ups (tile.h).
#pragma unroll 1
    do {
      step();
      const Record rec = sRec[cur.record];
      if (__any_sync(0xffffffffu, cur.record != sCurrent[warp])) {  // a new record: each row's bounds
        sCurrent[warp] = cur.record;  // every lane the same value, after every lane read it (the vote)
        const Bounds b = record_bounds(g, rec, sRow[tid], cta.i0 + tid);
        sLo[tid] = b.lo;
        sHi[tid] = b.hi;
        // This row's straddling block: every part is in (its own dots, done).
        const int x = Scope(rec.scope) == Scope::kMixedLeft ? 0 : 1;
        if (rec.flags & kRecBand) {  // joins the band's scores
          const int32_t blk = x == 0 ? sRow[tid].mix[0] : sRow[tid].mix[1];
          if (valid && blk >= rec.k0 && blk < rec.k0 + rec.n)
            sBand[(x * M + tid) * kBandStride + blk - rec.k0] = straddling_score(g, blk, sMixA[x * M + tid], sMixB[x * M + tid]);
        } else if (rec.flags & kRecDirect) {
          sRaw[tid] = b.hi > b.lo ? straddling_score(g, b.lo, sMixA[x * M + tid], sMixB[x * M + tid]) : 0.f;
        }
        __syncwarp();  // the warp's rows' bounds are in shared memory
      }
      cur.excluded = (rec.flags & kRecExclude) ? exclusion_bits(g, sRet, k, cur.a, cur.n) : 0;
      const Bounds mine{sLo[tid], sHi[tid]};
      const TileWork work = classify(__all_sync(0xffffffffu, row_sees_all(mine, cur, valid)),
                                     __any_sync(0xffffffffu, row_sees_any(mine, cur, valid)), rec);
      if (work != TileWork::kSkip) {
        const int32_t ragged = ragged_column(g, rec, cur);
        const bool fixups = has_column_fixups(cur, ragged);
        WarpTile<Element> w{sQ + warp * WR * Traits::kStride, sK + stage * Traits::kKVElems,
                            sV + stage * Traits::kKVElems, lane, row_of(0), work, fixups,
                            (rec.flags & kRecWindowSums) != 0, cur, ragged, sLo, sHi, nullptr, 0, 0,
                            p.scale_log2, rec.bias_log2, g.log2_last_block};
        if (cur.width == kCtrlCols) {  // control keys, a direct record or an Hn band: 16 columns
          const bool band = (rec.flags & kRecBand) != 0;
          w.given = band ? sBand + (Scope(rec.scope) == Scope::kMixedLeft ? 0 : M) * kBandStride
                    : (rec.flags & kRecDirect) ? sRaw : nullptr;
          w.given_rows = band ? kBandStride : 1;
          w.given_cols = band ? 1 : 0;
          w.sums = false;
          warp_tile<Traits, kCtrlCols>(o, softmax, w);
        } else {
          warp_tile<Traits, N>(o, softmax, w);
        }
      }
      rotate();
    } while (cur.cont);
    // [gate:masked-loop end]
    }
  }

  // [gate:body-epilogue begin]
  // ---- epilogue -------------------------------------------------------------------------------------------
  float row_sum[2 * MB];
  softmax.finish(row_sum);
  // Body rows: O / l in the element type, staged through the query slot so that rows leave in 16-byte stores.
  __syncthreads();  // every warp is done with the slot
  const int64_t row0 = cta.row0;
  const int32_t nrows = cta.nrows;
  constexpr float kLn2 = 0.6931471805599453f;
  float* const lse = p.lse + row0;  // read once: stores under a condition are then predicated
#pragma unroll
  for (int rr = 0; rr < 2 * MB; ++rr) {
    const int row = row_of(rr);
    const float inv = __fdividef(1.f, row_sum[rr]);
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
      store2(sQ + row * Traits::kStride + dt * 8 + 2 * tq, o[rr / 2][dt][2 * (rr % 2)] * inv,
             o[rr / 2][dt][2 * (rr % 2) + 1] * inv);
    if (tq == 0 && row < nrows) lse[row] = (softmax.m[rr] + __log2f(row_sum[rr])) * kLn2;
  }
  __syncwarp();
  store_staged_rows<Element, Dp, WR>(static_cast<Element*>(p.out), sQ, Traits::kStride, row0, warp * WR, nrows, p.D,
                                     lane);
}
  // [gate:body-epilogue end]

// One launch of the fused kernel for one call: per head, its control CTAs, then its body CTAs.
template <typename Traits>
__global__ void __launch_bounds__(Traits::kThreads, 2) attn_kernel(const __grid_constant__ AttnKernelParams p) {
  attn_cta<Traits>(p, int32_t(blockIdx.x));
}

// One launch for up to PackedAttnLaunch::kSeqs sequences of a packed call (attn_params.h): CTA x is CTA x - first[s]
// of sequence s's own launch, run on its own parameters (in the kernel parameter space, so warp-uniform as
// attn_kernel's). The same CTA code as attn_kernel's; the one-call kernel is unchanged by it.
template <typename Traits>
__global__ void __launch_bounds__(Traits::kThreads, 2) attn_packed_kernel(const __grid_constant__ PackedAttnLaunch pk) {
  const int32_t x = int32_t(blockIdx.x);
  // The last sequence s with first[s] <= x. sm_90a: a scan at fixed offsets, in uniform registers; sm_80: a binary
  // search (ptxas spills at head dim 128 with three stages on sm_90a with the search, on sm_80 with the scan).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  const int32_t s = packed_sequence(pk, x);
#else
  int32_t s = 0;
#pragma unroll
  for (int j = 1; j < PackedAttnLaunch::kSeqs; ++j) s += int32_t(j < pk.S && pk.first[j] <= x);
#endif
  attn_cta<Traits>(pk.seq[s], x - pk.first[s]);
}

}  // namespace rangeswa::cuda
