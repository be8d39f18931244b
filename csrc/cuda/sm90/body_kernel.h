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
#include "../common/query_slot.h"
#include "../common/shared_layout.h"
#include "body_layout.h"
#include "consumer.h"
#include "hopper.h"
#include "producer.h"

namespace rangeswa::cuda {

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
    copy_plan<kPlanners>(p, plan, spans, bh, t.qb, c.k, sRec, sRet, tid);
  } else if (tid == 0) {
    shared_plan = make_int2(0, 0);
  }
  __syncthreads();
  if (shared_plan.x <= 0) return;  // the whole CTA leaves (the same value for every thread)
  c.spans = shared_plan.y;
  // count is 0 outside the producer warpgroup
  find_record_arrays<Element, kPlanners>(p, sRec, count, bh, batch, Traits::kHeadDim, sArrays, tid);
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
