// The warp-specialized body kernel for sm_90a (issue 30): the mma.sync kernel's body CTA (sm80/mainloop.h
// attn_kernel) on Hopper's asynchronous machinery, from the same plan (records and tile spans), with the
// same logits, softmax and epilogue. One CTA per body tile of 128 query rows, a producer warpgroup and one or two
// consumer warpgroups (HopperTraits::kMBlocks: at head dim 64 one consumer warpgroup of 128 rows, 256 threads,
// two CTAs a multiprocessor; at 80 and 128 two of 64 rows, 384 threads, one CTA):
//
//   all threads   the prologue: the plan, the retrieved blocks, each row's geometry (as attn_kernel's, read
//                 and computed by the producer warpgroup, a thread a row; the consumer warps meet it at the
//                 barriers), the ring's mbarriers; then the roles split (setmaxnreg: the producer's
//                 warpgroup gives registers up, the consumers' take them)
//   producer      warpgroup 0 walks the tile spans (tile.h SpanCursor) and copies each tile's keys and values
//                 with cp.async (16-byte chunks round its first warp, HopperTraits::kProducerWarps; the others
//                 leave after setmaxnreg) into the next of kStages stages (core-matrix layout, 64-key tiles in tile_column
//                 order as the mma.sync kernel stores them), waiting on the stage's `empty` barrier first and
//                 arriving on its `full` barrier once the copy landed (cp.async.wait_group, then the
//                 async-proxy fence: wgmma reads it); one tile's copy stays in flight behind the next's issue
//   consumers     the other warpgroups, kGroupRows rows each, a warp kWarpRows of them (warp w of group c: rows
//                 kGroupRows c + kWarpRows w ..; with two m16 blocks a warp, block mb of warp w is rows 16 w .. of
//                 the group's mb-th m64 product, HopperTraits::slot_row): the same walk over the spans, filling
//                 the query slot per variant (with the straddling blocks' dots and the Hn bands' products it
//                 gives) between named barriers of the consumer threads; per tile: wait on `full`, S = Q K^T
//                 by wgmma from shared memory (one m64 product per block of a warp's rows, the same keys), the
//                 logits (tile_logits) and the online softmax per warp (common/softmax.h, its m16 blocks), O += P V by
//                 wgmma with P in registers, then one arrival per warpgroup on `empty`
//
// The unmasked loop overlaps the softmax with the next tile's Q K^T: the next tile of the run is waited for
// and its product issued before the current tile's softmax, and both groups retire together after P V. The
// masked loop takes each tile alone: per warp the two votes of its rows (tile.h classify), per warpgroup a
// bar.red.or of them (wgmma is a warpgroup's instruction: the group computes a tile when one of its warps
// needs it; a warp whose rows see none of it then takes it masked, every score -inf, so it adds nothing).
// A 16-column tile every row sees whole (control keys, an Hn band) skips the votes and the barrier
// (Consumer::whole_tile).
//
// Control CTAs (their rows split a chunk's keys over the warps) stay on the mma.sync kernel: the launcher
// (sm90/body_launch.h) runs them as a grid of their own before this one.
#pragma once

#include <cmath>
#include <cstdint>

#include "../attn_params.h"
#include "../plan.h"
#include "../tile.h"
#include "../utils.h"
#include "../common/kv_copy.h"
#include "../common/logits.h"
#include "../common/query_slot.h"
#include "../common/shared_layout.h"
#include "../common/softmax.h"
#include "body_gemm.h"
#include "body_layout.h"
#include "hopper.h"

namespace rangeswa::cuda {

// What the producer and the consumers share of a body CTA: its shared arrays and the plan's counts.
template <typename Traits>
struct HopperCta {
  using Element = typename Traits::Element;
  Element *sQ, *sK, *sV;
  uint64_t *full, *empty;  // [kStages] each
  const Record* sRec;
  const TileSpan* sSpan;
  const RecordArrays<Element>* sArrays;
  const int32_t* sRet;
  int32_t *sLo, *sHi;     // [M]
  float *sMixA, *sMixB;   // [2][M]
  float* sRaw;            // [M]
  int32_t* sCurrent;      // per consumer warp
  RowGeometry* sRow;      // [M]
  Element* sBandK;        // [kBandBlocks][Dp], core-matrix layout
  float* sBand;           // [2][M][kBandStride]
  int32_t spans, k;
};

// A stage's position in the ring: the stage and the parity of its current use.
template <int kStages>
struct RingSlot {
  int stage = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void advance() {
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1u;
    }
  }
};

// The producer's copy of KV tile t into a stage (core-matrix layout; a full 64-key tile in tile_column order,
// as the mma.sync kernel's body tiles): 16-byte chunks round the kProducerThreads copying threads (one warp at
// head dims 64 and 128, the warpgroup at 80: HopperTraits::kProducerWarps), rows past t.n zero-filled (P = 0
// meets no garbage there, and window sums see scores of 0). kPasses: the passes a full tile takes (a 16-key
// tile stops early). Where a pass is whole rows (the threads a multiple of the row's chunks) a thread copies
// one 16-byte column of rows r0 + kStep i (r0 < kStep): the shared offset of pass i is the first pass's plus a
// constant (checked at compile time for every r0, in plain and in tile_column order), and its global addresses
// one pointer a tile plus constant steps (keys) or steps of the value rows' stride, so a copy costs a few
// instructions; other head dims (80) compute each chunk's place.
template <typename Traits>
struct ProducerLanes {
  static constexpr int Dp = Traits::kHeadDim, kChunks = Traits::kChunks, kThreads = Traits::kProducerThreads;
  static constexpr int kPasses = (Traits::kBlockN * kChunks + kThreads - 1) / kThreads;
  static constexpr bool kWholeRows = kThreads % kChunks == 0;
  static constexpr int kStep = kWholeRows ? kThreads / kChunks : 1;  // rows a pass
  static constexpr bool kPermuted = Traits::kBlockN == 64;
  static constexpr int W = Traits::kValueCols;  // a V stage's row (the values, then the chunk of ones)
  // Element offset of pass i's row from pass 0's, the lane's first row r0, in plain or tile_column order, in
  // a tile of kWidth-element rows (a K stage: Dp, a V stage: W).
  template <int kWidth>
  static constexpr int pass_offset(bool permuted, int r0, int i) {
    return permuted ? core_row<kWidth>(tile_column(r0 + kStep * i)) - core_row<kWidth>(tile_column(r0))
                    : core_row<kWidth>(r0 + kStep * i) - core_row<kWidth>(r0);
  }
  template <int kWidth>
  static constexpr bool constant_steps() {
    for (int r0 = 0; r0 < kStep; ++r0)
      for (int i = 0; i < kPasses; ++i)
        if (pass_offset<kWidth>(false, r0, i) != pass_offset<kWidth>(false, 0, i) ||
            (kPermuted && pass_offset<kWidth>(true, r0, i) != pass_offset<kWidth>(true, 0, i)))
          return false;
    return true;
  }
  static_assert(!kWholeRows || (constant_steps<Dp>() && constant_steps<W>()),
                "a pass's shared offset is the first's plus a constant");
  int r0, col;
  int at_k, at_v;  // core_offset of (r0, col) in a K and in a V stage, row r0 in tile_column order (64-key tiles)

  __device__ __forceinline__ explicit ProducerLanes(int pt) {
    r0 = pt / kChunks;
    col = (pt % kChunks) * 8;
    const int row = kPermuted ? tile_column(r0) : r0;
    at_k = core_row<Dp>(row) + slot_col<true>(col);
    at_v = core_row<W>(row) + slot_col<true>(col);
  }
};

template <typename Traits>
__device__ __forceinline__ void copy_tile_core(typename Traits::Element* sk, typename Traits::Element* sv,
                                               const RecordArrays<typename Traits::Element> ra, const KvTile& t,
                                               int pt, const ProducerLanes<Traits>& lanes) {
  using Lanes = ProducerLanes<Traits>;
  constexpr int Dp = Traits::kHeadDim, W = Traits::kValueCols, kChunks = Traits::kChunks, kPasses = Lanes::kPasses;
  const int32_t v_row = int32_t(ra.v_row);  // element offsets in one KV head fit 32 bits (attn_setup.h)
  const auto* gk = ra.k + t.a * Dp;
  const auto* gv = ra.v + t.a * v_row;
  const bool permute = Traits::kBlockN == 64 && t.width == 64;
  if constexpr (Lanes::kWholeRows) {
    constexpr int kStep = Lanes::kStep;
    // Element offsets from the tile's first row: row r0 + kStep i of the lane's column, or the column of row 0
    // (a valid address: nothing is read there) past the tile's keys.
    const int32_t k0 = lanes.r0 * Dp + lanes.col, v0 = lanes.r0 * v_row + lanes.col;
    if (t.n == Traits::kBlockN && t.width == Traits::kBlockN) {  // a whole tile (the steady state): no checks
      // Shared-window byte addresses of pass 0's chunks (whole tiles are 64 keys in tile_column order, or, at
      // head dim 128, plain), each pass a constant further: converted once, so a pass is its two copies.
      constexpr int kBytes = int(sizeof(typename Traits::Element));
      const uint32_t dk = hopper::smem_u32(sk + lanes.at_k), dv = hopper::smem_u32(sv + lanes.at_v);
      const auto* pk = gk + k0;
      const auto* pv = gv + v0;  // moved on by a pass's value rows (a run-time stride) after each pass
      const int32_t v_step = kStep * v_row;
#pragma unroll
      for (int i = 0; i < kPasses; ++i) {
        constexpr bool kPerm = Lanes::kPermuted;
        hopper::cp_async_16_shared(dk + kBytes * Lanes::template pass_offset<Dp>(kPerm, 0, i), pk + kStep * Dp * i, true);
        hopper::cp_async_16_shared(dv + kBytes * Lanes::template pass_offset<W>(kPerm, 0, i), pv, true);
        pv += v_step;
      }
      return;
    }
    // A tile's last keys, or a 16-key tile (rare: the edges of the spans): each pass's place computed, in a
    // loop (unrolled, the producer's 40 registers would not hold the passes' precomputed places).
#pragma unroll 1
    for (int i = 0; i < kPasses; ++i) {
      const int r = lanes.r0 + kStep * i;
      if (r >= t.width) break;
      const bool valid = r < t.n;
      const int row = permute ? tile_column(r) : r;
      cp_async_16(sk + core_offset<Dp>(row, lanes.col), gk + (valid ? k0 + kStep * Dp * i : lanes.col), valid);
      cp_async_16(sv + core_offset<W>(row, lanes.col), gv + (valid ? v0 + kStep * i * v_row : lanes.col), valid);
    }
  } else {
    const int chunks = t.width * kChunks;
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const int c = pt + Lanes::kThreads * i;
      if (c >= chunks) break;
      const int r = c / kChunks, col = (c % kChunks) * 8;
      const bool valid = r < t.n;
      const int row = permute ? tile_column(r) : r;
      const int32_t src = valid ? r : 0;
      cp_async_16(sk + core_offset<Dp>(row, col), gk + src * Dp + col, valid);
      cp_async_16(sv + core_offset<W>(row, col), gv + src * v_row + col, valid);
    }
  }
}

// The producer (thread pt of the producer warpgroup's first kProducerThreads): every tile of the spans into
// the ring, in the consumers' order.
template <typename Traits>
__device__ __forceinline__ void produce(const HopperCta<Traits>& c, int pt) {
  SpanCursor cursor;
  KvTile t;
  RingSlot<Traits::kStages> slot;
  int landing = -1;  // the stage whose copy is in flight behind the one issued last
  const ProducerLanes<Traits> lanes(pt);
#pragma unroll 1
  while (cursor.advance(c.sSpan, c.spans, t)) {
    hopper::mbarrier_wait_parity(&c.empty[slot.stage], slot.phase ^ 1u);  // its use one round ago is over
    copy_tile_core<Traits>(c.sK + slot.stage * Traits::kKElems, c.sV + slot.stage * Traits::kVElems,
                           c.sArrays[t.record], t, pt, lanes);
    cp_async_commit();
    if (landing >= 0) {
      cp_async_wait_group<1>();             // the tile before landed (this one may be in flight)
      hopper::fence_proxy_async_shared();   // generic-proxy writes, read next by wgmma (async proxy)
      hopper::mbarrier_arrive(&c.full[landing]);
    }
    landing = slot.stage;
    slot.advance();
  }
  if (landing >= 0) {
    cp_async_wait_all();
    hopper::fence_proxy_async_shared();
    hopper::mbarrier_arrive(&c.full[landing]);
  }
}

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
    const PreparedArrays& a = p.kv;
    const Element* src = static_cast<const Element*>(v == QVar::kNat ? a.s_nat : a.s_grp) + cta.bh * a.sum_stride;
#pragma unroll 1
    for (int side = 0; side < 2; ++side) {
      if (!bands.uses(side, v)) continue;
      const int32_t k0 = bands.first(side), nb = bands.blocks(side);
#pragma unroll 1
      for (int x = ct; x < kBandBlocks * Traits::kChunks; x += Traits::kConsumerThreads) {
        const int r = x / Traits::kChunks, col = (x % Traits::kChunks) * 8;
        uint4 val = make_uint4(0u, 0u, 0u, 0u);
        if (r < nb) val = *reinterpret_cast<const uint4*>(src + int64_t(k0 + r) * Dp + col);
        *reinterpret_cast<uint4*>(c.sBandK + core_offset<Dp>(r, col)) = val;
      }
      hopper::fence_proxy_async_shared();
      sync_consumers();
      float sc[MB][kBandBlocks / 2];
      qk_issue<Traits, kBandBlocks>(sc, q_lo, kmajor_lo<Dp>(hopper::smem_u32(c.sBandK)));
      hopper::wgmma_commit();
      wait_products<0>(sc);
      const BandEdge e = band_edge(side, v);
#pragma unroll
      for (int mb = 0; mb < MB; ++mb)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = row0 + 16 * mb + 8 * h;
          const Bounds b = band_columns(e, reinterpret_cast<const int32_t*>(c.sRow + row)[e.field], k0, nb);
          float* out = c.sBand + (side * M + row) * kBandStride;
#pragma unroll
          for (int n = 0; n < kBandBlocks / 8; ++n)
#pragma unroll
            for (int j = 0; j < 2; ++j) {
              const int col = n * 8 + 2 * tq + j;
              if (uint32_t(col - b.lo) < uint32_t(b.hi - b.lo)) out[col] = sc[mb][4 * n + 2 * h + j];
            }
        }
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
    if (ragged >= 0) {  // warp-uniform: its column's scores shifted so that the softmax's a x + b has its bias
      const float delta = __fdividef(p.geo.log2_last_block - rec.bias_log2, p.scale_log2);
#pragma unroll
      for (int mb = 0; mb < MB; ++mb)
#pragma unroll
        for (int n = 0; n < kCtrlCols / 8; ++n)
#pragma unroll
          for (int j = 0; j < 2; ++j)
            if (8 * n + 2 * tq + j == ragged) {
              s[mb][4 * n + j] += delta;
              s[mb][4 * n + 2 + j] += delta;
            }
    }
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
    if (p.D % kChunk == 0) {  // rows of D elements stay 16-byte aligned
#pragma unroll 1
      for (int x = lane; x < WR * Traits::kChunks; x += 32) {
        const int row = first + x / Traits::kChunks, col = (x % Traits::kChunks) * kChunk;
        if (row < nrows && col < p.D)
          *reinterpret_cast<uint4*>(out + (out0 + row) * p.D + col) =
              *reinterpret_cast<const uint4*>(staged + row * Dp + col);
      }
    } else {
#pragma unroll 1
      for (int x = lane; x < WR * Dp; x += 32) {
        const int row = first + x / Dp, col = x % Dp;
        if (row < nrows && col < p.D) out[(out0 + row) * p.D + col] = staged[row * Dp + col];
      }
    }
  }
  // [gate:hopper-epilogue end]
};

// A body CTA: the prologue (every thread), then the roles.
template <typename Traits>
__device__ __forceinline__ void hopper_body_cta(const AttnKernelParams& p) {
  using Element = typename Traits::Element;
  using Layout = HopperLayout<Traits>;
  constexpr int M = Traits::kBlockM, kThreads = Traits::kThreads, kStages = Traits::kStages;
  const Geometry& g = p.geo;

  const int tid = threadIdx.x;
  // The producer warpgroup (its 4 warps: the tile's 128 rows, one a thread) reads the plan and computes the
  // rows; the consumer warps skip the tile's index arithmetic and the copies, and learn what they need (the
  // spans' count, cta, the bands) from shared memory after the barriers.
  const bool planner = tid < Traits::kThreads - Traits::kConsumerThreads;
  static_assert(Traits::kThreads - Traits::kConsumerThreads == Traits::kBlockM, "a producer thread a row");
  // This grid holds the body tiles only (the control CTAs run on the mma.sync kernel): tile index past them.
  QueryTile t{};
  int32_t head = 0, batch = 0, h = 0, bh = 0;
  if (planner) {
    const int32_t control = p.control_tiles * p.control_chunks;
    head = p.by_ctas_per_head.div(int32_t(blockIdx.x));  // b * Hq + h
    t = query_tile<M>(p, control + p.by_ctas_per_head.mod(int32_t(blockIdx.x)));
    batch = p.by_Hq.div(head);
    h = p.by_Hq.mod(head);
    bh = batch * p.Hkv + p.by_group.div(h);
  }

  RSWA_DYNAMIC_SHARED(smem);
  HopperCta<Traits> c;
  c.sQ = reinterpret_cast<Element*>(smem);
  c.sK = reinterpret_cast<Element*>(smem + Layout::kK);
  c.sV = reinterpret_cast<Element*>(smem + Layout::kV);
  c.full = reinterpret_cast<uint64_t*>(smem + Layout::kBars);
  c.empty = c.full + kStages;
  Record* sRec = reinterpret_cast<Record*>(smem + Layout::kRecords);
  c.sRec = sRec;
  c.sSpan = reinterpret_cast<const TileSpan*>(smem + uint32_t(Layout::spans(p.max_records)));
  auto* sArrays = reinterpret_cast<RecordArrays<Element>*>(smem + uint32_t(Layout::arrays(p.max_records, p.retrieved_k)));
  c.sArrays = sArrays;
  int32_t* sRet = reinterpret_cast<int32_t*>(smem + uint32_t(Layout::retrieved(p.max_records, p.retrieved_k)));
  c.sRet = sRet;
  c.sLo = reinterpret_cast<int32_t*>(smem + Layout::kRows);
  c.sHi = c.sLo + M;
  c.sMixA = reinterpret_cast<float*>(c.sHi + M);
  c.sMixB = c.sMixA + 2 * M;
  c.sRaw = c.sMixB + 2 * M;
  c.sCurrent = reinterpret_cast<int32_t*>(c.sRaw + M);
  c.sRow = reinterpret_cast<RowGeometry*>(smem + Layout::kGeometry);
  c.sBandK = reinterpret_cast<Element*>(smem + uint32_t(Layout::band_k(p.max_records, p.retrieved_k)));
  c.sBand = reinterpret_cast<float*>(smem + uint32_t(Layout::band_logits(p.max_records, p.retrieved_k)));
  RSWA_STATIC_SHARED(BandRecords, shared_bands);
  RSWA_STATIC_SHARED(BodyCta, cta);
  RSWA_STATIC_SHARED(int2, shared_plan);  // the tile's rows (none: the CTA leaves) and its spans

  // ---- prologue: records and spans, retrieved blocks, rows (attn_kernel's, over the producer warpgroup) ------
  c.k = p.retrieved != nullptr ? p.retrieved_k : 0;
  int32_t count = 0;
  constexpr int kPlanners = Traits::kBlockM;
  if (planner && t.nrows > 0) {
    const int64_t plan = int64_t(bh) * p.body_tiles + t.index;
    // [gate:hopper-plan-read begin]
    count = p.record_count[2 * plan];
    // [gate:hopper-plan-read end]
    const int32_t spans = p.record_count[2 * plan + 1];
    if (tid == 0) shared_plan = make_int2(t.nrows, spans);
    const int4* src = reinterpret_cast<const int4*>(records_of(p, p.records, plan));
#pragma unroll 1
    for (int x = tid; x < p.max_records + spans; x += kPlanners) reinterpret_cast<int4*>(sRec)[x] = src[x];
    const int32_t* given = c.k > 0 ? p.retrieved + (int64_t(bh) * p.nQb + t.qb) * c.k : nullptr;
#pragma unroll 1
    for (int x = tid; x < c.k; x += kPlanners) sRet[x] = given[x];
  } else if (tid == 0) {
    shared_plan = make_int2(0, 0);
  }
  __syncthreads();
  if (shared_plan.x <= 0) return;  // the whole CTA leaves (the same value for every thread)
  c.spans = shared_plan.y;
#pragma unroll 1
  for (int x = tid; x < count; x += kPlanners) {  // count is 0 outside the producer warpgroup
    RecordArrays<Element> ra;
    record_arrays<Element>(p.kv, KeySet(sRec[x].keys), bh, batch, bh - batch * p.Hkv, Traits::kHeadDim, ra);
    sArrays[x] = ra;
  }
  const bool row_thread = tid < M;
  RowGeometry me{};
  if (row_thread) {
    me = row_geometry(g, t.i0 + tid, sRet, c.k);
    c.sRow[tid] = me;
#pragma unroll
    for (int x = 0; x < 2; ++x) {
      c.sMixA[x * M + tid] = 0.f;
      c.sMixB[x * M + tid] = 0.f;
    }
  }
  if (tid < Traits::kConsumerThreads / 32) c.sCurrent[tid] = -1;
  // The walks over the records (the Hn bands, the variants needed) by one thread, not by every warp: the
  // barriers of the votes below publish the bands, and `needed` goes into cta.
  if (tid == 0) shared_bands = BandRecords::find(sRec, count);
  uint32_t any = 0;  // bit x: some row has a straddling block on side x
#pragma unroll
  for (int x = 0; x < 2; ++x)
    any |= uint32_t(__syncthreads_or(row_thread && tid < t.nrows && me.mix[x] >= 0) != 0) << x;
  const BandRecords bands = shared_bands;
  if (bands.n[0] + bands.n[1] > 0)
#pragma unroll 1
    for (int x = tid; x < 2 * M * Layout::kBandStride; x += kThreads) c.sBand[x] = -INFINITY;
  {
    // The V stages' chunks of ones (HopperTraits::kValueCols): chunk Dp / 8 of every key row, 128 contiguous
    // bytes an 8-key group, stored once (the producer copies the values only); wgmma reads them (the async
    // proxy) after the barrier below.
    constexpr int W = Traits::kValueCols, kGroups = kStages * Traits::kBlockN / 8;
    const uint32_t one2 = pack2<Element>(1.f, 1.f);
    const uint4 ones = make_uint4(one2, one2, one2, one2);
#pragma unroll 1
    for (int x = tid; x < kGroups * 8; x += kThreads)
      *reinterpret_cast<uint4*>(c.sV + (x / 8) * 8 * W + (Traits::kHeadDim / 8) * 64 + (x % 8) * 8) = ones;
    hopper::fence_proxy_async_shared();
  }
  if (tid == 0) {
    const uint32_t needed = variants_needed(sRec, count, any & 1, any & 2);
    const int32_t n0 = g.C + t.i0 - p.first_row;  // q row of the tile's first row
    const Element* q_rows = static_cast<const Element*>(p.q) + p.q_strides.at(batch, h, n0);
    cta = BodyCta{q_rows, int64_t(head) * p.Nq + n0, t.i0, t.nrows, bh, needed, slot_rows_in_chunks<Traits>(p, q_rows)};
#pragma unroll 1
    for (int s = 0; s < kStages; ++s) {
      hopper::mbarrier_init(&c.full[s], Traits::kProducerThreads);  // the copying threads
      hopper::mbarrier_init(&c.empty[s], Traits::kConsumers);  // one arrival per consumer warpgroup
    }
    hopper::fence_barrier_init();
  }
  __syncthreads();  // the plan, the rows, cta and the barriers are published

  // ---- the roles ------------------------------------------------------------------------------------------------
  if (tid < 128) {
    hopper::setmaxnreg_dec<Traits::kProducerRegs>();  // the whole warpgroup (setmaxnreg is per warpgroup)
    if (tid < Traits::kProducerThreads) produce<Traits>(c, tid);  // the copying warps; the others are done
    return;
  }
  hopper::setmaxnreg_inc<Traits::kConsumerRegs>();
  Consumer<Traits> consumer(p, c, cta, shared_bands, tid - 128);
  consumer.walk();
  consumer.epilogue();
}

// The kernel: its body only where wgmma and setmaxnreg exist (the sm_90a pass, and the host SIMT emulation);
// other passes of the build (sm_80 SASS, its PTX) get an empty kernel that the host never launches
// (sm90/body_launch.h hopper_kernel_built).
template <typename Traits>
__global__ void __launch_bounds__(Traits::kThreads, Traits::kResident) hopper_attn_kernel(const __grid_constant__ AttnKernelParams p) {
#if defined(RANGESWA_SIMT) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
  hopper_body_cta<Traits>(p);
#endif
}

}  // namespace rangeswa::cuda
