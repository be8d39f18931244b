// The sm_90a body kernel's consumer warpgroups (sm90/body_kernel.h): their walk over the tile spans (Consumer:
// the query slot's fills with the straddling dots and the Hn bands' products, the unmasked and masked loops on
// wgmma, the 16-column tiles every row sees whole, the epilogue).
#pragma once

#include <cmath>
#include <cstdint>

#include "../attn_params.h"
#include "../plan.h"
#include "../tile.h"
#include "../utils.h"
#include "../common/epilogue.h"
#include "../common/logits.h"
#include "../common/query_slot.h"
#include "../common/shared_layout.h"
#include "../common/softmax.h"
#include "body_gemm.h"
#include "body_layout.h"
#include "hopper.h"
#include "producer.h"

namespace rangeswa::cuda {

// One consumer warpgroup's walk (thread ct of the 256 consumer threads).
template <typename Traits>
struct Consumer {
  using Element = typename Traits::Element;
  static constexpr int M = Traits::kBlockM, N = Traits::kBlockN, Dp = Traits::kHeadDim, DT = Dp / 8;
  static constexpr int MB = Traits::kMBlocks, WR = Traits::kWarpRows;  // a warp's m16 blocks, its rows
  static constexpr int W = Traits::kValueCols, WT = W / 8;  // P V's columns: the values', then the row sums'
  static constexpr int kBandStride = HopperLayout<Traits>::kBandStride;

  const AttnKernelParams& p;
  const HopperCta<Traits>& c;
  const BodyCta& cta;
  const BandRecords& bands;
  int ct, group, warp, lane, tq;  // warp: the consumer warp, WR rows each
  int row0;                       // the lane's first row (rows row0 + 16 mb + 8 h)
  int my_row;                     // the row this lane keeps per-row state for (lanes 0..WR - 1)
  bool owner;
  uint32_t q_lo;                  // the low descriptor word of the group's first slot row (body_gemm.h)
  uint32_t k_lo, v_lo;            // ... of stage 0's keys and values (a stage adds kStageK / kStageV)
  OnlineSoftmax<MB> softmax;
  float o[MB][W / 2];  // P V's accumulators: the output (DT 8-column tiles), then the row sums (one more)
  RingSlot<Traits::kStages> slot;

  __device__ __forceinline__ Consumer(const AttnKernelParams& p_, const HopperCta<Traits>& c_, const BodyCta& cta_,
                                      const BandRecords& bands_, int ct_)
      : p(p_), c(c_), cta(cta_), bands(bands_), ct(ct_) {
    group = ct / 128;
    warp = ct / 32;
    lane = ct % 32;
    tq = lane % 4;
    row0 = WR * warp + lane / 4;
    my_row = WR * warp + lane % WR;
    owner = lane < WR;
    q_lo = __shfl_sync(0xffffffffu, kmajor_lo<Dp>(hopper::smem_u32(c.sQ + core_row<Dp>(Traits::kGroupRows * group))), 0);
    k_lo = kmajor_lo<Dp>(hopper::smem_u32(c.sK));
    v_lo = mnmajor_lo<W>(hopper::smem_u32(c.sV));
    softmax.init();
#pragma unroll
    for (int mb = 0; mb < MB; ++mb)
#pragma unroll
      for (int i = 0; i < W / 2; ++i) o[mb][i] = 0.f;
  }

  __device__ __forceinline__ void sync_consumers() const {
    hopper::named_barrier_sync(kConsumersBarrier, Traits::kConsumerThreads);
  }
  // A stage's tiles' low descriptor words: stage 0's plus the stage's bytes / 16.
  static constexpr uint32_t kStageK = uint32_t(Traits::kKElems * sizeof(Element) / 16);
  static constexpr uint32_t kStageV = uint32_t(Traits::kVElems * sizeof(Element) / 16);
  // The stage comes from lane 0 (every lane holds the same): a value the compiler then knows warp-uniform, so
  // the descriptors stay in uniform registers (CUTLASS's canonical_warp_idx_sync does the same).
  __device__ __forceinline__ uint32_t stage_k(int stage) const {
    return k_lo + uint32_t(__shfl_sync(0xffffffffu, stage, 0)) * kStageK;
  }
  __device__ __forceinline__ uint32_t stage_v(int stage) const {
    return v_lo + uint32_t(__shfl_sync(0xffffffffu, stage, 0)) * kStageV;
  }
  // The group is done with the current stage (its wgmma retired): one arrival per warpgroup.
  __device__ __forceinline__ void release() {
    if (ct % 128 == 0) hopper::mbarrier_arrive(&c.empty[slot.stage]);
    slot.advance();
  }

  // The Hn bands (plan.h hn_bands, band_columns) while the slot holds variant v: per side whose blocks v
  // scores, the band's summary rows as a 16-key tile and a 64 x 16 product per group.
  __device__ __forceinline__ void band_dots(QVar v) {
#pragma unroll 1
    for (int side = 0; side < 2; ++side) {
      if (!bands.uses(side, v)) continue;
      const int32_t k0 = bands.first(side), nb = bands.blocks(side);
      load_band_rows<Element, Dp, Traits::kConsumerThreads>(c.sBandK, p.kv, v, cta.bh, k0, nb, ct,
                                                           [](int r, int col) { return core_offset<Dp>(r, col); });
      hopper::fence_proxy_async_shared();
      sync_consumers();
      float sc[MB][kBandBlocks / 2];
      qk_issue<Traits, kBandBlocks>(sc, q_lo, kmajor_lo<Dp>(hopper::smem_u32(c.sBandK)));
      hopper::wgmma_commit();
      wait_products<0>(sc);
      keep_band_scores<MB>(as_blocks<MB, kBandBlocks>(sc), band_edge(side, v), k0, nb, c.sRow, row0, tq,
                           c.sBand + side * M * kBandStride, kBandStride);
      sync_consumers();  // both groups read the band tile (the next side or variant overwrites it)
    }
  }

  // The slot's variants from fill slot `from` to `to` that the tile needs: after a barrier that ends every
  // consumer's use of the slot (their wgmma retired), the fill (each warp's rows 16 at a time, two lanes a row:
  // lanes l and l + 16 each rotate half its pairs, fill_row_vector's kSplit; a row into its slot row,
  // HopperTraits::slot_row), the async-proxy fence (wgmma reads the slot), a barrier, the straddling blocks'
  // dots (the row's terms split over the same two lanes) and the bands.
  // [gate:hopper-fill-slots begin]
  __device__ __forceinline__ void fill_slots(int32_t from, int32_t to) {
#pragma unroll 1
    for (int32_t at = from; at <= to; ++at) {
      const QVar v = variant_at(at);
      if (!((cta.needed >> int(v)) & 1)) continue;
      sync_consumers();
#pragma unroll 1
      for (int mb = 0; mb < MB; ++mb) {
        const int r = WR * warp + 16 * mb + (lane & 15);
        fill_slot_row<Traits, true, Traits::kFillPairs, true>(p, cta, v, r, c.sQ + core_row<Dp>(Traits::slot_row(r)),
                                                              lane / 16);
      }
      hopper::fence_proxy_async_shared();
      sync_consumers();
#pragma unroll 1
      for (int mb = 0; mb < MB; ++mb) {
        const int r = WR * warp + 16 * mb + (lane & 15);
        straddling_dots<Traits, true, Traits::kDotChunks, true>(p, cta, v, r, c.sQ + core_row<Dp>(Traits::slot_row(r)),
                                                                c.sRow, c.sMixA, c.sMixB, lane / 16);
      }
      band_dots(v);
    }
  }
  // [gate:hopper-fill-slots end]

  __device__ __forceinline__ WarpTile<Element> warp_tile_of(const KvTile& t, TileWork work, float bias) const {
    return WarpTile<Element>{nullptr, nullptr, nullptr, lane, row0, work, false, false, t, -1, c.sLo, c.sHi,
                             nullptr, 0, 0, p.scale_log2, bias, 0.f};
  }

  // Logits and softmax of the group's scores s on a tile (tile_logits, OnlineSoftmax), P into a, then
  // P V issued (not committed).
  template <int kCols, bool kLogits>
  __device__ __forceinline__ void softmax_pv(float (&s)[MB][kCols / 2], uint32_t (&a)[MB][kCols / 16][4],
                                             const WarpTile<Element>& w, uint32_t v) {
    auto& blocks = as_blocks<MB, kCols>(s);
    if constexpr (kLogits) tile_logits<MB, kCols>(blocks, w);
    softmax.template update<kCols / 8, WT, false>(blocks, as_blocks<MB, W>(o), w.scale_log2, w.bias);
    pack_p<Traits, kCols>(a, s);
    pv_issue<Traits, kCols>(o, a, v);
  }

  // A masked-loop tile of kCols columns for the group: scores (Q K^T, or given), then softmax_pv; retired.
  template <int kCols>
  __device__ __forceinline__ void masked_tile(const WarpTile<Element>& w) {
    float s[MB][kCols / 2];
    if (w.given == nullptr) {
      qk_issue<Traits, kCols>(s, q_lo, stage_k(slot.stage));
      hopper::wgmma_commit();
      wait_products<0>(s);
    } else {
      given_scores<MB, kCols / 8>(as_blocks<MB, kCols>(s), w.given, w.given_rows, w.given_cols, w.row0, tq);
    }
    uint32_t a[MB][kCols / 16][4];
    softmax_pv<kCols, true>(s, a, w, stage_v(slot.stage));
    hopper::wgmma_commit();
    wait_products<0>(o, a);
  }

  // A 16-column tile that every row sees whole (plan.h record_bounds): control keys (rule 1: every row sees
  // every one, always) and an Hn band (every row sees each of its blocks, in the class of its row; the scores
  // given, hopper band_dots and masked_record). The masked loop's tile without its votes, row bounds, group
  // barrier or per-row selects, since no row's view differs: the scores (Q K^T of 16 columns, or the band's),
  // the fix-ups that are the same for every row (tile_logits' `live` and ragged column), the softmax and P V;
  // retired. The same operations as masked_tile on these tiles.
  template <bool kBand>
  __device__ __forceinline__ void whole_tile(const KvTile& t, const Record& rec) {
    float s[MB][kCtrlCols / 2];
    if constexpr (kBand) {
      const float* given = c.sBand + (Scope(rec.scope) == Scope::kMixedLeft ? 0 : M) * kBandStride;
      given_scores<MB, kCtrlCols / 8>(as_blocks<MB, kCtrlCols>(s), given, kBandStride, 1, row0, tq);
    } else {
      qk_issue<Traits, kCtrlCols>(s, q_lo, stage_k(slot.stage));
      hopper::wgmma_commit();
      wait_products<0>(s);
    }
    // The column fix-ups, the same for every row (tile_logits' `live` and its ragged column): the columns past the
    // keys, a band's G-blocks that a retrieved block overlaps (exact keys of another record: exclusion_bits, bit c
    // column c), and the ragged last G-block's bias in a band that holds it.
    uint32_t dead = t.n < kCtrlCols ? ~0u << t.n : 0u;
    int32_t ragged = -1;
    if constexpr (kBand) {
      if (rec.flags & kRecExclude) dead |= uint32_t(exclusion_bits(p.geo, c.sRet, c.k, t.a, t.n));
      ragged = ragged_column(p.geo, rec, t);
    }
    if (dead != 0) {  // warp-uniform: s[mb][4 n + 2 h + j] is column 8 n + 2 tq + j (rows row0 + 16 mb + 8 h)
#pragma unroll
      for (int mb = 0; mb < MB; ++mb)
#pragma unroll
        for (int n = 0; n < kCtrlCols / 8; ++n)
#pragma unroll
          for (int j = 0; j < 2; ++j)
            if ((dead >> (8 * n + 2 * tq + j)) & 1u) s[mb][4 * n + j] = s[mb][4 * n + 2 + j] = -INFINITY;
    }
    if (ragged >= 0)  // warp-uniform: its column's scores shifted so that the softmax's a x + b has its bias
      shift_ragged_column(as_blocks<MB, kCtrlCols>(s), ragged - 2 * tq, p.geo.log2_last_block, rec.bias_log2,
                          p.scale_log2, [](int n, int j) { return 8 * n + j; });
    uint32_t a[MB][kCtrlCols / 16][4];
    softmax.template update<kCtrlCols / 8, WT, false>(as_blocks<MB, kCtrlCols>(s), as_blocks<MB, W>(o), p.scale_log2,
                                                      rec.bias_log2);
    pack_p<Traits, kCtrlCols>(a, s);
    pv_issue<Traits, kCtrlCols>(o, a, stage_v(slot.stage));
    hopper::wgmma_commit();
    wait_products<0>(o, a);
  }

  // The unmasked loop over a run (FlashAttention's: every row sees every key, no fix-up), in
  // FlashAttention-3's order within a warpgroup: per tile, the next tile's Q K^T and this tile's P V are
  // issued together (P already in registers), the softmax of the next tile's scores runs while this tile's
  // P V is in flight (softmax fold(): the output, P V's accumulator, is rescaled once P V retired), then the
  // next tile's P is packed. The scores have one buffer (P V reads P from its own registers) and nothing is
  // copied between tiles. `cur` is the run's first tile; on return, the tile after the run.
  __device__ __forceinline__ void unmasked_run(SpanCursor& cursor, KvTile& cur) {
    float s[MB][N / 2];
    uint32_t a[MB][N / 16][4];
    float alpha[2 * MB];
    // The span's end and its record's bias, read again only where a span ends: within a span the next tile
    // is this one moved on by the span's tile width (what SpanCursor::advance gives, computed in registers).
    int32_t span_end = c.sSpan[cursor.span].end;
    float bias = c.sRec[cur.record].bias_log2;
    hopper::mbarrier_wait_parity(&c.full[slot.stage], slot.phase);
    qk_issue<Traits, N>(s, q_lo, stage_k(slot.stage));
    hopper::wgmma_commit();
    wait_products<0>(s);
    if (softmax.template fold<N / 8, false>(as_blocks<MB, N>(s), p.scale_log2, bias, alpha))
      softmax.template rescale<WT>(as_blocks<MB, W>(o), alpha);
    pack_p<Traits, N>(a, s);
    KvTile nxt;
#pragma unroll 1
    for (;;) {
      if (cur.a + cur.width < span_end) {  // the span's next tile (a later tile of a span continues the run)
        nxt = cur;
        nxt.a = cur.a + cur.width;
        nxt.n = imin(cur.width, span_end - nxt.a);
        nxt.cont = true;
        cursor.next += cur.width;
      } else {
        cursor.advance(c.sSpan, c.spans, nxt);
        if (!nxt.cont) break;  // the run goes on: the same slot, the next stage
        span_end = c.sSpan[cursor.span].end;
        bias = c.sRec[nxt.record].bias_log2;
      }
      RingSlot<Traits::kStages> next = slot;
      next.advance();
      hopper::mbarrier_wait_parity(&c.full[next.stage], next.phase);
      qk_issue<Traits, N>(s, q_lo, stage_k(next.stage));
      hopper::wgmma_commit();
      pv_issue<Traits, N>(o, a, stage_v(slot.stage));
      hopper::wgmma_commit();
      wait_products<1>(s);  // the next tile's Q K^T (this tile's P V, committed after it, may run on)
      const bool raised = softmax.template fold<N / 8, false>(as_blocks<MB, N>(s), p.scale_log2, bias, alpha);
      wait_products<0>(o, a);  // this tile's P V: its stage is free, the output may be rescaled
      release();
      if (raised) softmax.template rescale<WT>(as_blocks<MB, W>(o), alpha);
      pack_p<Traits, N>(a, s);
      cur = nxt;
    }
    pv_issue<Traits, N>(o, a, stage_v(slot.stage));  // the run's last tile
    hopper::wgmma_commit();
    wait_products<0>(o, a);
    release();
    cur = nxt;
  }

  // A masked run's new record (its first tile, or a record the run moves on to): where the warp's rows' bounds
  // in shared memory are another record's (sCurrent), each row's bounds, and the straddling or direct score
  // the record gives the row.
  __device__ __forceinline__ void masked_record(const Record& rec, int32_t rec_index, bool valid) {
    const Geometry& g = p.geo;
    if (__any_sync(0xffffffffu, rec_index != c.sCurrent[warp])) {
      c.sCurrent[warp] = rec_index;  // every lane the same value, after every lane read it (the vote)
      if (owner) {
        const Bounds b = record_bounds(g, rec, c.sRow[my_row], cta.i0 + my_row);
        c.sLo[my_row] = b.lo;
        c.sHi[my_row] = b.hi;
        const int x = Scope(rec.scope) == Scope::kMixedLeft ? 0 : 1;
        if (rec.flags & kRecBand) {  // this row's straddling block joins the band's scores
          const int32_t blk = x == 0 ? c.sRow[my_row].mix[0] : c.sRow[my_row].mix[1];
          if (valid && blk >= rec.k0 && blk < rec.k0 + rec.n)
            c.sBand[(x * M + my_row) * kBandStride + blk - rec.k0] =
                straddling_score(g, blk, c.sMixA[x * M + my_row], c.sMixB[x * M + my_row]);
        } else if (rec.flags & kRecDirect) {
          c.sRaw[my_row] =
              b.hi > b.lo ? straddling_score(g, b.lo, c.sMixA[x * M + my_row], c.sMixB[x * M + my_row]) : 0.f;
        }
      }
      __syncwarp();  // the warp's rows' bounds are in shared memory
    }
  }

  // The masked loop over a run: per record each row's bounds, per tile the warps' votes and the group's.
  // The record's fields and the lane's row bounds stay in registers while the record lasts (a run's tiles
  // mostly share one): a tile of the same record reads neither the record nor the bounds again.
  __device__ __forceinline__ void masked_run(SpanCursor& cursor, KvTile& cur) {
    const Geometry& g = p.geo;
    const bool valid = my_row < cta.nrows;
    int32_t held = -1;  // the record in rec and mine (cur.record is the same in every lane: the spans' walk)
    Record rec{};
    Bounds mine{};
#pragma unroll 1
    do {
      KvTile nxt;
      cursor.advance(c.sSpan, c.spans, nxt);
      hopper::mbarrier_wait_parity(&c.full[slot.stage], slot.phase);
      if (cur.record != held) {
        held = cur.record;
        rec = c.sRec[held];
        const bool band = (rec.flags & kRecBand) != 0;
        if (band || KeySet(rec.keys) == KeySet::kCtrl) {  // warp-uniform: every consumer walks the same spans
          if (band) {
            masked_record(rec, held, valid);  // the rows' straddling blocks join the band's scores
            whole_tile<true>(cur, rec);
          } else {
            whole_tile<false>(cur, rec);
          }
          release();
          held = -1;  // such a record's next tile comes here again; the masked tiles pay no test
          cur = nxt;
          continue;
        }
        masked_record(rec, held, valid);
        mine = Bounds{c.sLo[my_row], c.sHi[my_row]};
      }
      cur.excluded = (rec.flags & kRecExclude) ? exclusion_bits(g, c.sRet, c.k, cur.a, cur.n) : 0;
      const bool row = owner && valid;  // with one m16 block lanes 16..31 hold the same rows: no vote of their own
      TileWork work = classify(__all_sync(0xffffffffu, row_sees_all(mine, cur, row)),
                               __any_sync(0xffffffffu, row_sees_any(mine, cur, row)), rec);
      if (hopper::named_barrier_or(kGroupBarrier0 + group, 128, work != TileWork::kSkip)) {
        if (work == TileWork::kSkip) work = TileWork::kMasked;  // no row of the warp sees a key: all -inf
        const int32_t ragged = ragged_column(g, rec, cur);
        WarpTile<Element> w = warp_tile_of(cur, work, rec.bias_log2);
        w.fixups = has_column_fixups(cur, ragged);
        w.sums = (rec.flags & kRecWindowSums) != 0;
        w.ragged = ragged;
        w.last_bias = g.log2_last_block;
        if (cur.width == kCtrlCols) {  // control keys, a direct record or an Hn band: 16 columns
          const bool band = (rec.flags & kRecBand) != 0;
          w.given = band ? c.sBand + (Scope(rec.scope) == Scope::kMixedLeft ? 0 : M) * kBandStride
                    : (rec.flags & kRecDirect) ? c.sRaw : nullptr;
          w.given_rows = band ? kBandStride : 1;
          w.given_cols = band ? 1 : 0;
          w.sums = false;
          masked_tile<kCtrlCols>(w);
        } else {
          masked_tile<N>(w);
        }
      }
      release();
      cur = nxt;
    } while (cur.cont);
  }

  // The walk over the spans: per run, the slot's fills since the run before, then its loop; once the tiles
  // are done, the variants straddling blocks may still need.
  __device__ __forceinline__ void walk() {
    SpanCursor cursor;
    KvTile cur;
    cursor.advance(c.sSpan, c.spans, cur);
#pragma unroll 1
    for (;;) {
      int32_t kind, from;
      cursor.run(c.sSpan, c.spans, kind, from);
      fill_slots(from, kind >= 0 ? kind >> 1 : kVariantSlots - 1);
      if (kind < 0) break;
      if (!(kind & 1)) unmasked_run(cursor, cur);
      else masked_run(cursor, cur);
    }
  }

  // O / l in the element type, staged through the slot (rows of Dp elements, in the CTA's row order) so that
  // rows leave in 16-byte stores; the log-sum-exp per row.
  // [gate:hopper-epilogue begin]
  __device__ __forceinline__ void epilogue() {
    sync_consumers();  // every group is done with the slot
    Element* staged = c.sQ;
    const int64_t out0 = cta.row0;
    const int32_t nrows = cta.nrows;
    constexpr float kLn2 = 0.6931471805599453f;
#pragma unroll
    for (int mb = 0; mb < MB; ++mb)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = row0 + 16 * mb + 8 * h;
        // The row's probability sum, from P V's columns of ones (every lane of the row's quad holds it whole).
        const float row_sum = o[mb][4 * DT + 2 * h];
        const float inv = __fdividef(1.f, row_sum);
#pragma unroll
        for (int dt = 0; dt < DT; ++dt)
          store2(staged + row * Dp + dt * 8 + 2 * tq, o[mb][4 * dt + 2 * h] * inv, o[mb][4 * dt + 2 * h + 1] * inv);
        if (tq == 0 && row < nrows) p.lse[out0 + row] = (softmax.m[2 * mb + h] + __log2f(row_sum)) * kLn2;
      }
    __syncwarp();
    Element* out = static_cast<Element*>(p.out);
    constexpr int kChunk = 8;
    const int first = WR * warp;  // the warp's rows: first .. first + WR - 1
    if constexpr (32 % Traits::kChunks == 0) {
      if (p.D % kChunk == 0) {  // whole rows a pass (head dims 64, 128): one column a lane, rows kRowStep apart
        constexpr int kRowStep = 32 / Traits::kChunks;
        const int row = first + lane / Traits::kChunks, col = (lane % Traits::kChunks) * kChunk;
        if (col < p.D) {
          Element* dst = out + (out0 + row) * p.D + col;
          const Element* from = staged + row * Dp + col;
          const int64_t step = int64_t(kRowStep) * p.D;
#pragma unroll
          for (int i = 0; i < WR / kRowStep; ++i)
            if (row + kRowStep * i < nrows)
              *reinterpret_cast<uint4*>(dst + i * step) = *reinterpret_cast<const uint4*>(from + i * kRowStep * Dp);
        }
        return;
      }
    }
    store_staged_rows<Element, Dp, WR>(out, staged, Dp, out0, first, nrows, p.D, lane);
  }
  // [gate:hopper-epilogue end]
};

}  // namespace rangeswa::cuda
