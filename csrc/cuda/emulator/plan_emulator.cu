// The plan census and the prepare op of the CUDA kernels on the host, for machines without a GPU:
// plan_stats walks every body CTA's KV tiles in the order of its tile spans with the kernel's own setup
// (attn_setup.h), plan (plan.h records and tile.h spans, through attn_params.h plan_tile) and per-warp
// decisions (tile.h: variant order, the unmasked and masked loops, the skip / full / masked choice,
// exclusion bits), checks that every tile the plan sends down the unmasked loop is full for every warp with
// no column fix-up, and counts what the kernel would do (records, tiles, GEMM
// columns, masks, fills): tests/test_cuda_plan.py and benchmarks/plan_census.py read it. The prepare op
// runs prepare.h prepare_unit with one lane per unit in the CUDA op's layout (context.h). attn itself is
// not emulated here: the SIMT emulation (csrc/cuda/simt) runs the kernel's own source, thread by thread.
// Not part of the extension: setup.py compiles csrc/cuda/*.cu, not this folder.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <vector>

#include "checks.h"
#include "schema.h"
#include "varlen.h"
#include "cuda/attn_params.h"
#include "cuda/attn_setup.h"
#include "cuda/kernel_traits.h"
#include "cuda/plan.h"
#include "cuda/prepare.h"
#include "cuda/tile.h"
#include "cuda/utils.h"
#include "cuda/emulator/host_call.h"

namespace rangeswa::cuda {
namespace {

// The CTA's record list (control rows plan theirs in the kernel).
struct CtaRecords {
  const Record* list;
  int32_t count;
  const TileSpan* spans;  // body CTAs: the plan's tile spans (tile.h plan_spans)
  int32_t nspans;
  Record local[2];
  const int32_t* sorted;
  int32_t k;
};

CtaRecords cta_records(const AttnKernelParams& p, const QueryTile& t, int32_t bh) {
  CtaRecords r{};
  if (t.control) {
    r.count = plan_control_tile(p.geo, t.chunk, p.control_chunk_keys, p.control_bias_log2, r.local);
    r.list = r.local;
    return r;
  }
  const int64_t plan = int64_t(bh) * p.body_tiles + t.index;
  r.list = records_of(p, p.records, plan);
  r.count = p.record_count[2 * plan];
  r.spans = spans_of(p, p.records, plan);
  r.nspans = p.record_count[2 * plan + 1];
  TORCH_CHECK(r.nspans <= std::max(p.span_budget, r.count), "the plan wrote ", r.nspans, " tile spans, past its budget ",
              std::max(p.span_budget, r.count));
  if (p.retrieved != nullptr) {
    r.sorted = p.retrieved + (int64_t(bh) * p.nQb + t.qb) * p.retrieved_k;
    r.k = p.retrieved_k;
  }
  return r;
}

// The plan's census: per body CTA of the first (batch, query head), the columns: records, KV tiles,
// 16-column control tiles, masked tiles (some warp masks), masked warp-tiles, full warp-tiles,
// skipped warp-tiles, rows, GEMM columns summed over rows (the columns its warp multiplies), keys seen
// summed over rows (columns it sees, straddling blocks included), straddling blocks scored per row,
// query-slot fills, masked tiles, tiles with column fix-ups, masked warp-tiles by key set, direct tiles,
// window tiles with summaries, Hn band tiles, warp-tiles that take the logit path (masked or fixed up).
at::Tensor plan_stats(RSWA_ATTN_PARAMS, std::optional<at::TensorList> prepared RSWA_VARLEN_ATTN_PARAMS) {
  TORCH_CHECK_VALUE(!cu_seqlens_q.has_value() && !cu_seqlens_k.has_value() && !control_counts.has_value(),
                    "plan_stats takes one sequence (its census is per call); call it on each sequence's rows");
  HostCall hc;
  hc.ap = checked(RSWA_ATTN_ARGS, prepared);
  build(hc, q, k, v, retrieved, prepared, HostLanes{});
  const AttnKernelParams& p = hc.p;
  const Geometry& g = p.geo;
  constexpr int M = kAttnTileRows, W = M / 4;
  const int N = g.tile_cols;  // the body kernel's KV tile (api/config.h choose_config)
  constexpr int kColumns = 27;
  at::Tensor stats = at::zeros({p.body_tiles, kColumns}, at::kDouble);
  for (int32_t x = 0; x < p.body_tiles; ++x) {
    double* st = stats.data_ptr<double>() + x * kColumns;
    const QueryTile t = query_tile<M>(p, p.control_tiles * p.control_chunks + x);
    if (t.nrows <= 0) continue;
    const CtaRecords rec = cta_records(p, t, 0);
    bool any_side[2] = {false, false};
    std::vector<RowGeometry> rows(M);
    for (int r = 0; r < M; ++r) {
      rows[r] = row_geometry(g, t.i0 + r, rec.sorted, rec.k);
      for (int side = 0; side < 2 && r < t.nrows; ++side) {
        any_side[side] = any_side[side] || rows[r].mix[side] >= 0;
        st[9] += rows[r].mix[side] >= 0;
      }
    }
    const uint32_t needed = variants_needed(rec.list, rec.count, any_side[0], any_side[1]);
    for (int32_t sl = 0; sl < kVariantSlots; ++sl) st[10] += (needed >> int(variant_at(sl))) & 1;
    // The Hn bands' products: per side, one 16-column Q K^T per variant it uses (native, its far one).
    const BandRecords bands = BandRecords::find(rec.list, rec.count);
    for (int side = 0; side < 2; ++side)
      if (bands.n[side] > 0) st[7] += 2.0 * kBandBlocks * t.nrows;
    st[0] = rec.count;
    st[5] = t.nrows;
    std::vector<Bounds> bounds(M);
    int32_t current = -1;
    // The tiles in the kernel's order (the spans: per query variant its unmasked loop, then its masked loop),
    // which must be the records' tiles, each once.
    int64_t tiles = 0, walked = 0;
    {
      TileCursor all;
      KvTile any{};
      while (N == 64 ? all.advance<64, kCtrlCols>(g, rec.list, rec.count, rec.sorted, rec.k, any)
                     : all.advance<32, kCtrlCols>(g, rec.list, rec.count, rec.sorted, rec.k, any))
        ++tiles;
    }
    SpanCursor cursor;
    KvTile kv{};
    auto advance = [&]() { return cursor.advance(rec.spans, rec.nspans, kv); };
    int32_t slot = 0;
    st[24] = rec.nspans;
    while (advance()) {
      ++walked;
      const Record& r = rec.list[kv.record];
      TORCH_CHECK((kv.kind >> 1) >= slot, "the spans go back to an earlier query variant");
      slot = kv.kind >> 1;
      const bool unmasked = (kv.kind & 1) == 0;
      kv.excluded = (r.flags & kRecExclude) ? exclusion_bits(g, rec.sorted, rec.k, kv.a, kv.n) : 0;
      if (kv.record != current) {
        current = kv.record;
        for (int i = 0; i < M; ++i) bounds[i] = record_bounds(g, r, rows[i], t.i0 + i);
      }
      const int32_t ragged = ragged_column(g, r, kv);
      const bool direct = (r.flags & kRecDirect) != 0;  // no K tile: counted apart
      (direct ? st[19] : KeySet(r.keys) == KeySet::kCtrl ? st[2] : st[1]) += 1;
      bool masked = false;
      st[12] += !direct && has_column_fixups(kv, ragged);
      const bool sums = (r.flags & kRecWindowSums) != 0;
      st[23] += unmasked;
      for (int w = 0; w < 4; ++w) {
        bool all = true, any = false;  // the kernel's two votes over the warp's rows
        for (int i = w * W; i < w * W + W; ++i) {
          all = all && row_sees_all(bounds[i], kv, i < t.nrows);
          any = any || row_sees_any(bounds[i], kv, i < t.nrows);
        }
        TileWork work = classify(all, any, r);
        if (unmasked) {  // the unmasked loop: every warp computes the tile whole (padding rows unused)
          TORCH_CHECK((w * W >= t.nrows || work == TileWork::kFull) && kv.width == N && !has_column_fixups(kv, ragged),
                      "a tile in the unmasked loop that warp ", w, " of body tile ", x, " must mask (record ",
                      kv.record, ", keys ", kv.a, " + ", kv.n, ")");
          work = TileWork::kFull;
        }
        if (!direct) {
          st[work == TileWork::kSkip ? 6 : work == TileWork::kFull ? 4 : 3] += 1;
          // the logits computed before the softmax (common/warp_tile.h warp_tile): a masked tile, or column fix-ups
          if (KeySet(r.keys) != KeySet::kCtrl)
            st[22] += work == TileWork::kMasked || (work == TileWork::kFull && has_column_fixups(kv, ragged));
          masked = masked || work == TileWork::kMasked;
          st[13 + r.keys] += work == TileWork::kMasked;
        }
        for (int i = 0; i < W && w * W + i < t.nrows; ++i) {
          if (work != TileWork::kSkip) st[7] += kv.width;
          const Bounds& b = bounds[w * W + i];
          for (int c = 0; c < kv.n; ++c) {
            const bool exact = kv.a + c >= b.lo && kv.a + c < b.hi;
            // a window record with its edges' summaries: a block outside the row's window is one key
            st[8] += sums ? (exact || (kv.a + c) % g.G == 0) : exact && ((kv.excluded >> c) & 1) == 0;
          }
        }
      }
      // The sm_90a kernel's consumer warps (sm90/body_kernel.h masked_run): 16 rows each, warpgroups of 4
      // (rows 0..63, 64..127). Its masked loop has a warpgroup compute a tile when any of its warps' votes is
      // not a skip (wgmma is the group's instruction); a warp then takes the logit path when its tile is masked,
      // fixed up, or one it would skip (taken masked, every score -inf). Its unmasked loop computes every
      // tile whole, as above.
      if (!direct && KeySet(r.keys) != KeySet::kCtrl && !unmasked) {
        constexpr int kHopperRows = 16, kGroupWarps = 4;
        for (int grp = 0; grp < M / (kHopperRows * kGroupWarps); ++grp) {
          TileWork work[kGroupWarps];
          bool computes = false;
          for (int w = 0; w < kGroupWarps; ++w) {
            bool all = true, any = false;
            const int i0 = (grp * kGroupWarps + w) * kHopperRows;
            for (int i = i0; i < i0 + kHopperRows; ++i) {
              all = all && row_sees_all(bounds[i], kv, i < t.nrows);
              any = any || row_sees_any(bounds[i], kv, i < t.nrows);
            }
            work[w] = classify(all, any, r);
            computes = computes || work[w] != TileWork::kSkip;
          }
          for (int w = 0; w < kGroupWarps; ++w) {
            if (!computes) st[26] += 1;
            else st[25] += work[w] != TileWork::kFull || has_column_fixups(kv, ragged);
          }
        }
      }
      st[11] += masked;
      st[20] += sums;
      st[21] += (r.flags & kRecBand) != 0;
    }
    TORCH_CHECK(walked == tiles, "the spans of body tile ", x, " hold ", walked, " tiles, its records ", tiles);
  }
  // Columns, in order: 0 records, 1 KV tiles, 2 control tiles, 3 masked warp-tiles, 4 full warp-tiles,
  // 5 rows, 6 skipped warp-tiles, 7 GEMM columns over rows, 8 keys seen over rows, 9 straddling blocks,
  // 10 query-slot fills, 11 masked tiles, 12 tiles with column fix-ups, 13-18 masked warp-tiles by key set
  // (plan.h KeySet order), 19 direct tiles (straddling blocks and Hn bands; in no other tile column),
  // 20 tiles of window records with their edges' summaries (plan.h window_sums), 21 Hn band tiles, 22 warp-tiles
  // of KV tiles (column 1's) whose logits are computed before the softmax (masked, or full with column fix-ups),
  // 23 tiles of the unmasked loop (tile.h plan_spans), 24 tile spans, 25 warp-tiles of the sm_90a kernel's
  // 16-row consumer warps that take the logit path (column 22's tiles, counted as sm90/body_kernel.h's masked
  // loop decides: per warpgroup of 4), 26 its 16-row warp-tiles whose warpgroup skips the tile (masked loop).
  return stats;
}

// The prepare op with the CUDA op's layout and its preparation (prepare_unit, one lane per unit), on CPU
// tensors; the retrieval key means are ATen's float64 block means (host_call.h HostLanes::key_means).
std::vector<at::Tensor> prepare_emulated_one(RSWA_PREPARE_PARAMS) {
  const ContextParams cp = check_prepare(RSWA_PREPARE_ARGS);
  return prepare_call(k, v, cp, first_key, HostLanes{});
}

// Packed as the CUDA op prepares it (attn_api.cpp prepare_cuda_packed): the same checks and packed layout
// (context.h packed_prepare), each sequence's units prepared in place by host lanes and its key means (ATen's)
// copied into its rows.
std::vector<at::Tensor> prepare_emulated(RSWA_PREPARE_PARAMS RSWA_VARLEN_PREPARE_PARAMS) {
  if (!is_packed(std::nullopt, cu_seqlens_k, control_counts)) return prepare_emulated_one(RSWA_PREPARE_ARGS);
  auto check_one = [&](const at::Tensor& k, const at::Tensor& v, int64_t control_tokens) {
    const ContextParams cp = check_prepare(RSWA_PREPARE_ARGS);
    TORCH_CHECK_VALUE(padded_head_dim(cp.D) > 0, "prepare on CUDA supports head dims up to 128, got ", cp.D);
    return cp;
  };
  const HostLanes lanes;
  std::vector<at::Tensor> keep;
  auto run = [&](PackedContextLayout& c, const std::vector<ContextParams>& cps, const at::Tensor& kc, const Packed& pk) {
    for (int64_t s = 0; s < pk.S; ++s) {
      ContextLayout& cs = c.seqs[s];
      if (cps[s].L == 0) continue;
      lanes.tables(cs.ap, cs.s, cs.buf, keep);
      lanes.prepare(c.prepare_params(s), cs.s.BH, kc.scalar_type());
      if (cps[s].means && c.out[kKeyMeans].numel() > 0)
        c.out[kKeyMeans].narrow(2, c.rows[s].means0, c.rows[s].nKb)
            .copy_(lanes.key_means(kc.narrow(2, pk.k0[s], pk.nk[s]), cps[s], 0));
    }
  };
  return packed_prepare(RSWA_PREPARE_ARGS RSWA_VARLEN_PREPARE_ARGS, check_one, run);
}

}  // namespace
}  // namespace rangeswa::cuda

TORCH_LIBRARY(rangeswa_emulator, m) {
  std::string stats(rangeswa::schema::kAttn);
  stats.replace(0, 4, "plan_stats");
  stats.replace(stats.find("-> (Tensor, Tensor)"), std::string::npos, "-> Tensor");
  m.def(stats.c_str());
  m.def(rangeswa::schema::kPrepare);
}

TORCH_LIBRARY_IMPL(rangeswa_emulator, CPU, m) {
  m.impl("plan_stats", &rangeswa::cuda::plan_stats);
  m.impl("prepare", &rangeswa::cuda::prepare_emulated);
}
