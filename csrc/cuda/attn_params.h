// Everything one launch of the fused attention kernel reads, filled once on the host (attn_setup.h)
// and passed by value as a __grid_constant__ kernel parameter; and the CTA -> query tile map. No torch
// types, so the kernel instantiations compile without the torch headers.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernel_traits.h"
#include "layout.h"
#include "plan.h"
#include "rules.h"
#include "tile.h"

namespace rangeswa::cuda {

// The element types of the op's inputs; bf16 and fp16 run on tensor cores, fp32 on the SIMT path.
enum class DType : int { kFloat = 0, kBFloat16 = 1, kHalf = 2 };

// The prepared arrays of one call (prepare.h writes them), in the input dtype, rows padded to the
// kernel's head dim Dp with zeros; array X of KV head bh (= b * Hkv + h) starts at X + bh * <its head
// stride>, row r at + r * Dp. Arrays a call does not need are null.
struct PreparedArrays {
  const void* k_ctrl;  // [C]  control keys (unrotated)
  const void* v_ctrl;  // [C]  control values
  const void* k_nat;   // [L]  R(j) k_j
  const void* k_grp;   // [L]  R(j / g) k_j                       grouping
  const void* k_cond;  // [L]  R(j T / L) k_j                     control rows under the correction
                       //      (or k's own unrotated body rows, cond_raw: the control CTAs rotate them)
  const void* v_body;  // [L]  v_j: the call's copy, or v itself read in place (values below)
  const void* s_nat;   // [nG] G-block means of R(j) k_j           rangeswa with summaries
  const void* s_grp;   // [nG] G-block means of R(j / g) k_j       ... and grouping
  const void* s_v;     // [nG] G-block means of v_j
  const void* p_nat;   // [L]  in-block exclusive prefix sums of R(j) k_j       blocks straddling Hn
  const void* p_grp;   // [L]  in-block exclusive prefix sums of R(j / g) k_j   (straddling.h)
  // Elements between KV heads: control arrays, body keys (and prefix sums), summaries (a call's own arrays:
  // C * Dp, L * Dp, nG * Dp; a prepared context's keep their cache's strides).
  int64_t ctrl_stride, key_stride, sum_stride;
  // Body value row r of (batch b, KV head h) at v_body + values.at(b, h, r): the copy's [B * Hkv, L, Dp]
  // strides, or v's own with v_body at its first body row (attn_setup.h values_in_place).
  RowStrides values;
  // cond_raw: k_cond is k itself at its first body row, rows at cond.at(b, h, r), unrotated; the control
  // CTAs rotate each tile to the conditioning positions as it lands (attn_setup.h cond_keys_in_place,
  // common/cond_rotation.h rotate_cond_keys), and the preparation writes no k_cond.
  RowStrides cond;
  bool cond_raw;
};

// Lite's preparation folded into the control CTAs (common/cond_rotation.h LitePrep; attn_setup.h nat_keys_from_control):
// the arrays they write in its place, k_nat, s_nat and s_v.
struct FoldedPrepare {
  void *k_nat, *s_nat, *s_v;  // the KV heads' arrays (kv's k_nat, s_nat, s_v, writable); s_v null: no fold
  float inv_last;             // 1 / the last G-block's tokens (block_means.h last_block_inverse)
};

struct AttnKernelParams {
  const void* q;  // [B, Hq, Nq, D], before RoPE; rows at q_strides.at(b, h, n)
  RowStrides q_strides;
  void* out;      // [B, Hq, Nq, D], contiguous
  float* lse;     // [B, Hq, Nq], natural log
  PreparedArrays kv;
  FoldedPrepare fold;  // s_v null: the preparation wrote every array

  // cos/sin [positions, rotary_half] of the query rotations: integer positions 0.. (a negative position
  // p reads row -p with the sine negated), and the conditioning positions i T / L at row i.
  const float *cos_int, *sin_int, *cos_cond, *sin_cond;
  int32_t rotary_half;
  bool interleaved;

  // The plan (plan kernel): plan x = bh * body_tiles + t (body tile t of KV head bh) holds max_records
  // records and then max_spans tile spans (tile.h TileSpan; both 16 bytes) at records + x * (max_records +
  // max_spans), their counts at record_count[2 x] and [2 x + 1] (records_of, spans_of); the retrieved blocks of query block qb,
  // ascending and -1 padded, at retrieved + (bh * nQb + qb) * retrieved_k (null: no retrieval).
  const Record* records;
  const int32_t* record_count;
  int32_t max_records, max_spans;
  int32_t span_budget;  // the spans a plan may write (attn_setup.h span_budget; at most max_spans)
  int32_t kv_stages;    // K/V pipeline stages of the body walk: 2 or 3 (kernel_traits.h; fp32 runs 2)
  const int32_t* retrieved;
  int32_t retrieved_k, nQb;

  Geometry geo;
  int32_t B, Hq, Hkv, D, Dp;
  // q and the output hold Nq = C + Lq rows: the control rows, then body rows first_row .. L - 1 (SPEC
  // section 7's cached calls; first_row = 0 otherwise). Body row i is q row C + i - first_row.
  int32_t Nq, first_row;
  float scale_log2;         // scale * log2(e): logits are kept in base 2
  float control_bias_log2;  // section 3: -log(L/T) log2(e) on control rows' body-key logits

  // Work split per (batch, query head): control_tiles x control_chunks CTAs of kControlTileRows control
  // rows (split-K over the body keys, chunks of control_chunk_keys, and inside a CTA over its warps;
  // partial results in ctrl_o / ctrl_lse, merged by the combine kernel), then body_tiles CTAs. Body tile t
  // holds rows [max(qb * tile_block, first_row) + s * kBlockM, ...) with qb = first_tile_block + t /
  // tiles_per_block, s = t % tiles_per_block, clipped to block qb's rows (tile_block = Qb for rangeswa, so a
  // tile's rows share their retrieved blocks).
  int32_t control_tiles, control_chunks, control_chunk_keys, body_tiles;
  int32_t tile_block, tiles_per_block, first_tile_block;
  // One launch runs every tile of every head (sm80/attn_launch.h run_attn). Divisions of the CTA index: by the
  // CTAs per head, the control chunks, the tiles per block, Hq and the query heads per KV head.
  FastDiv by_ctas_per_head, by_chunks, by_tiles_per_block, by_Hq, by_group;
  float* ctrl_o;    // [control_partials, B * Hq, C, Dp] normalised partial outputs (fp32)
  float* ctrl_lse;  // [control_partials, B * Hq, C] their log-sum-exp (base 2; -inf: the part saw no key)
};

// A packed call's sequences in one launch (csrc/varlen.h; docs/cuda.md "Packed calls"): each sequence's own
// call's kernel parameters (attn_setup.h kernel_params of the sequence alone, with out / lse pointing at its
// first packed row and Nq the packed rows per head, so its rows land in the packed output), and the first work
// item of each sequence in the launch: sequence s takes items [first[s], first[s + 1]) (CTAs of the attention
// kernel, threads of the plan or combine kernels), item x of the launch being item x - first[s] of its own
// call's launch. Sequences with no work have first[s] == first[s + 1]. Device memory, as the kernels read it.
struct PackedLaunch {
  const AttnKernelParams* seq;  // [S]
  const int64_t* first;         // [S + 1], first[0] = 0, nondecreasing
  int32_t S;
};

// The bytes of kernel parameters a launch may pass (CUDA 12.1 and later, Volta and later devices).
constexpr size_t kMaxKernelParamBytes = 32764;

// The attention kernel's packed launch (sm80/mainloop.h attn_packed_kernel): up to kSeqs sequences' parameters and
// first CTAs (as PackedLaunch's) passed by value, in the kernel parameter space, as attn_kernel's own parameters
// are: each CTA reads its sequence's fields from the constant bank at an offset that depends only on blockIdx, so
// ptxas knows every field warp-uniform (read through a pointer into global or shared memory, they are not: the
// branches on them diverge and sm_80's shuffles after them take the warp-sync slow path). A call with more
// sequences takes several launches (sm80/attn_launch.h run_attn_packed).
struct PackedAttnLaunch {
  static constexpr int kSeqs =
      int((kMaxKernelParamBytes - 2 * sizeof(int64_t)) / (sizeof(AttnKernelParams) + sizeof(int32_t)));
  AttnKernelParams seq[kSeqs];
  int32_t first[kSeqs + 1];  // first[0] = 0, increasing (a launch's CTAs are indexed in 32 bits)
  int32_t S;
};
static_assert(sizeof(PackedAttnLaunch) <= kMaxKernelParamBytes, "a packed attention launch fits the parameter space");

// Whether a packed call's sequences at (padded) head dim D run one launch each on attn_kernel rather than kSeqs a
// launch on attn_packed_kernel: the one place that chooses (sm80/attn_launch.h run_attn_packed launches by it, the SIMT
// emulation counts launches by it). At head dim 128 attn_kernel holds 254-255 registers and the packed kernel's
// sequence (its parameters' offset, one more live value) spilled 4-8 B on sm_90a however it was found (issue 49:
// a uniform scan 4-28 B, a binary search 106 B; a shared-memory copy of the parameters brought 25 CALLs back).
constexpr bool packed_per_sequence(int head_dim) { return head_dim > 80; }

// The control rows' partial results: one per chunk of body keys and warp of its CTA (kControlSplit).
RSWA_HD int32_t control_partials(const AttnKernelParams& p) { return p.control_chunks * kControlSplit; }

// One CTA's query rows.
struct QueryTile {
  bool control;    // control rows [i0, i0 + nrows) of [0, C); else body rows
  int32_t i0, nrows;
  int32_t qb;      // query block of body rows
  int32_t chunk;   // control rows: the split-K chunk of body keys
  int32_t index;   // body rows: the tile's index among the body tiles (its plan)
};

template <int kBlockM>
RSWA_HD QueryTile query_tile(const AttnKernelParams& p, int32_t tile) {
  QueryTile t{};
  const int32_t control = p.control_tiles * p.control_chunks;
  if (tile < control) {
    t.control = true;
    t.chunk = p.by_chunks.mod(tile);
    t.i0 = p.by_chunks.div(tile) * kControlTileRows;
    t.nrows = imin(kControlTileRows, p.geo.C - t.i0);
    return t;
  }
  t.index = tile - control;
  t.qb = p.first_tile_block + p.by_tiles_per_block.div(t.index);
  const int32_t end = imin(p.geo.L, (t.qb + 1) * p.tile_block);
  t.i0 = imax(t.qb * p.tile_block, p.first_row) + p.by_tiles_per_block.mod(t.index) * kBlockM;
  t.nrows = imax(0, imin(kBlockM, end - t.i0));
  return t;
}

// Plan x's records and tile spans (plan x = bh * body_tiles + t), in a buffer of the layout above.
RSWA_HD int64_t plan_entries(const AttnKernelParams& p) { return int64_t(p.max_records) + p.max_spans; }
template <typename R>
RSWA_HD R* records_of(const AttnKernelParams& p, R* records, int64_t x) { return records + x * plan_entries(p); }
template <typename R>
RSWA_HD auto spans_of(const AttnKernelParams& p, R* records, int64_t x) {
  using Span = std::conditional_t<std::is_const_v<R>, const TileSpan, TileSpan>;
  return reinterpret_cast<Span*>(records_of(p, records, x) + p.max_records);
}

// The plan of body tile t of KV head bh (the plan kernel's thread, and the emulator): its records and its
// tile spans (tile.h plan_spans) at plan x = bh * body_tiles + t of `records`, their counts at counts[2 x],
// counts[2 x + 1].
RSWA_HD void plan_tile(const AttnKernelParams& p, int32_t bh, int32_t t, Record* records, int32_t* counts) {
  const int64_t x = int64_t(bh) * p.body_tiles + t;
  Record* out = records_of(p, records, x);
  const QueryTile tile = query_tile<kAttnTileRows>(p, p.control_tiles * p.control_chunks + t);
  counts[2 * x] = counts[2 * x + 1] = 0;
  if (tile.nrows <= 0) return;
  const int32_t* sorted = p.retrieved ? p.retrieved + (int64_t(bh) * p.nQb + tile.qb) * p.retrieved_k : nullptr;
  const int32_t k = sorted ? p.retrieved_k : 0;
  const int32_t n = plan_body_tile(p.geo, tile.i0, tile.nrows, sorted, k, out);
  counts[2 * x] = n;
  counts[2 * x + 1] =
      plan_spans(p.geo, out, n, sorted, k, tile.i0, tile.nrows, spans_of(p, records, x), imax(p.span_budget, n),
                 kCtrlCols);
}

}  // namespace rangeswa::cuda
