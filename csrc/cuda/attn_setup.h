// Host-side setup of one fused attention call, from the checked arguments (checks.h AttnParams): which
// prepared arrays it needs and their sizes, the tile layout, the split of the control rows, and the
// parameter structs of the preparation and attention kernels. Shared by the op (attn_api.cpp) and the
// host emulations (emulator/host_call.h: the SIMT emulation and the plan census), so all run the same
// plan on the same arrays.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>

#include "checks.h"
#include "cuda/api/config.h"
#include "cuda/attn_params.h"
#include "cuda/kernel_traits.h"
#include "cuda/plan.h"
#include "cuda/prepare.h"

namespace rangeswa::cuda {

// Control rows split the body keys into chunks of this many keys (one CTA each, its warps splitting the
// chunk again; merged by log-sum-exp).
inline constexpr int32_t kControlChunkKeys = 1024;

struct AttnSetup {
  Geometry geo;
  int32_t Dp;
  int64_t BH;  // B * Hkv: KV heads of the prepared arrays
  // Prepared arrays the call needs (attn_params.h PreparedArrays).
  bool grouped_keys, cond_keys, summaries, grouped_summaries, prefix;
  int32_t unit_tokens;  // prepare.h
  // Rope tables: integer positions [0, int_rows), conditioning positions i T / L for i in [0, cond_rows).
  int64_t int_rows, cond_rows;
  double cond_step;
  // Tile layout (attn_params.h).
  int32_t tile_block, tiles_per_block, first_tile_block, body_tiles;
  int32_t control_tiles, control_chunks, control_chunk_keys;
  // retrieved_k: the sorted blocks a query block keeps (retrieved_room), given_k: the call's K (the columns of
  // the given or selected blocks, which the sort reads).
  int32_t nQb, retrieved_k, given_k, max_records, max_spans, span_budget;
  int32_t kv_stages;  // K/V pipeline stages of the body walk (apply_config: api/config.h choose_config)
  float scale_log2, control_bias_log2;
  Config config;  // how the call runs (apply_config; the default until then: two stages, no bands)

  int64_t ctas_per_head() const { return int64_t(control_tiles) * control_chunks + body_tiles; }
  int64_t plans() const { return BH * body_tiles; }
  // 16-byte entries per plan: its records, then its tile spans (attn_params.h plan_records / plan_spans).
  int64_t plan_entries() const { return int64_t(max_records) + max_spans; }
};

// The retrieved blocks a query block can hold: rule 3 retrieves distinct key blocks, so never more than the
// call's key blocks, whatever K is asked (K = 1000 at L = 180 retrieves at most 12 blocks of 16). The sorted
// blocks, the plan's records and spans and the kernel's shared memory are sized by it, not by K: a K past the
// key blocks runs as K = nKb does.
inline int64_t retrieved_room(const Rules& R, int64_t K) { return std::min<int64_t>(K, R.num_key_blocks()); }

// The rules of attn's own selection (retrieved=None): K clamped to retrieved_room. The selection keeps
// min(K, nKb) blocks anyway (topk_blocks.cu kept); its table then has no columns that would only hold -1.
inline Rules selection_rules(Rules R) {
  R.topk = retrieved_room(R, R.topk);
  return R;
}

// Why a call's attention launch cannot be made (empty: it can), checked before anything is allocated: its
// kernel's shared memory per CTA (`smem`: api/config.h Config::smem) within the device's opt-in
// `limit`, and its grid of CTAs within CUDA's 2^31 - 1. The plan's room, and so the shared memory, grows with
// the retrieved blocks a query block keeps (retrieved_room: topk, at most the key blocks).
inline std::string launch_refusal(const AttnParams& ap, const AttnSetup& s, size_t smem, size_t limit) {
  if (smem > limit)
    return "attn on CUDA keeps min(K, key blocks) = " + std::to_string(s.retrieved_k) + " retrieved blocks per " +
           "query block (K = " + std::to_string(s.given_k) + ": topk, or the last dimension of retrieved), whose " +
           "plan needs " + std::to_string(smem) +
           " bytes of shared memory per CTA, more than the device's limit of " + std::to_string(limit) +
           "; use a smaller topk";
  const int64_t ctas = s.ctas_per_head() * ap.B * ap.Hq;
  if (ctas > int64_t(0x7fffffff))
    return "attn on CUDA: the call needs " + std::to_string(ctas) + " CTAs (B x H_q x tiles per head), more than a "
           "launch's 2^31 - 1; split the batch or the heads";
  return std::string();
}

inline AttnSetup setup_attn(const AttnParams& ap, int64_t retrieved_k) {
  const Rules& R = ap.rules;
  AttnSetup s{};
  s.geo = make_geometry(R, ap.C);
  const Geometry& g = s.geo;
  const bool rangeswa = R.method == Method::kRangeSwa;
  s.Dp = padded_head_dim(ap.D);
  s.BH = ap.B * ap.Hkv;
  s.grouped_keys = g.grouping;
  s.cond_keys = g.cond;
  s.summaries = g.summaries;
  s.grouped_summaries = g.summaries && g.grouping;
  s.prefix = g.summaries && g.grouping && g.far_summaries;
  s.unit_tokens = g.summaries ? g.G : 32;
  const bool rotates = ap.rope.rotary_dim > 0 && ap.L > 0;
  // Positions up to L - 1 (native keys and queries); grouped ones stay below T <= L - 1 when grouping.
  s.int_rows = rotates ? std::max<int64_t>(ap.L, 1) : 0;
  s.cond_rows = rotates && g.cond ? ap.L : 0;
  s.cond_step = ap.control_position_scale;

  const int32_t M = kAttnTileRows;
  s.tile_block = rangeswa ? g.Qb : M;
  s.tiles_per_block = rangeswa ? (std::min(g.Qb, std::max(g.L, 1)) + M - 1) / M : 1;
  s.first_tile_block = int32_t(ap.first_row / s.tile_block);
  const int32_t blocks = int32_t(ceil_div(ap.L, s.tile_block)) - s.first_tile_block;
  s.body_tiles = ap.Lq > 0 ? blocks * s.tiles_per_block : 0;
  s.control_tiles = int32_t(ceil_div(ap.C, kControlTileRows));
  s.control_chunk_keys = kControlChunkKeys;
  s.control_chunks = int32_t(std::max<int64_t>(1, ceil_div(ap.L, kControlChunkKeys)));
  s.nQb = int32_t(R.num_query_blocks());
  s.given_k = rangeswa ? int32_t(retrieved_k) : 0;
  s.retrieved_k = rangeswa ? int32_t(retrieved_room(R, retrieved_k)) : 0;
  s.max_records = max_records(s.retrieved_k);
  s.max_spans = max_spans(s.retrieved_k);
  s.span_budget = s.max_spans;
  s.kv_stages = 2;
  const double log2e = 1.4426950408889634;
  s.scale_log2 = float(ap.scale * log2e);
  s.control_bias_log2 = float(ap.control_bias * log2e);
  return s;
}

// The call's shape for choose_config (api/config.h): the shared memory per CTA of the mma.sync kernel (`mma(p)`)
// and of the sm_90a kernel (`hopper(p)`, asked for 16-bit calls alone) for each configuration it weighs, from
// parameters that hold what their layouts read (the plan's room, the retrieved blocks, the bands, the stages; Dp
// picks the SIMT emulation's instantiation).
template <typename MmaSmem, typename HopperSmem>
CallShape call_shape(const AttnSetup& s, bool sixteen_bit, const MmaSmem& mma, const HopperSmem& hopper) {
  CallShape c;
  c.sixteen_bit = sixteen_bit;
  c.Dp = s.Dp;
  c.G = s.geo.G;
  c.max_spans = s.max_spans;
  AttnKernelParams probe{};
  probe.max_records = s.max_records;
  probe.retrieved_k = s.retrieved_k;
  probe.Dp = s.Dp;
  for (int band = 0; band < 2; ++band) {
    probe.geo.band_ok = band == 1;
    for (int32_t stages = 2; stages <= 3; ++stages) {
      probe.kv_stages = stages;
      c.mma_smem[band][stages - 2] = mma(probe);
    }
    probe.kv_stages = 2;
    c.hopper_smem[band] = sixteen_bit ? hopper(probe) : 0;
  }
  return c;
}

// The chosen configuration into the setup: its stages, span budget and the plan's edge-free records (plan.h
// window_sums, hn_bands) for the body kernel's KV tile.
inline void apply_config(AttnSetup& s, const Config& c) {
  s.config = c;
  s.kv_stages = c.kv_stages;
  s.span_budget = c.span_budget;
  s.geo.window_sums_ok = c.window_sums;
  s.geo.band_ok = c.bands;
  s.geo.tile_cols = c.tile_cols;
}

// Device (or host) pointers of one call.
struct AttnBuffers {
  const void *q, *k, *v;  // inputs with contiguous rows (any batch / head / row strides)
  RowStrides q_strides, k_strides, v_strides;
  void* out;
  float* lse;
  void *k_ctrl, *v_ctrl, *k_nat, *k_grp, *k_cond, *v_body, *s_nat, *s_grp, *s_v, *p_nat, *p_grp;
  const float *cos_int, *sin_int, *cos_cond, *sin_cond;
  const int32_t* retrieved;  // [B, Hkv, nQb, retrieved_k] as given (best first), or null
  int32_t* retrieved_sorted;  // the same rows ascending, -1 last (plan kernel)
  Record* records;            // [plans, max_records + max_spans]: records, then tile spans (tile.h TileSpan)
  int32_t* record_count;      // [plans, 2]: records, tile spans
  float *ctrl_o, *ctrl_lse;   // control rows' partial results
  // Elements between KV heads of the body keys / prefix sums and of the summaries: L * Dp and nG * Dp
  // for a call's own arrays (make_buffers), the cache's for a prepared context's.
  int64_t key_stride, sum_stride;
  // The body values (body_values): v_body's rows, and whether they are v's own (read in place, not written).
  RowStrides values;
  bool values_in_place;
  // The control rows' body keys (cond_from_keys): k itself, rotated by the control CTAs (cond_raw), or the
  // preparation's k_cond.
  RowStrides cond;
  bool cond_raw;
};

// Whether the kernel's tile copies (cp.async 16) can read an input x's body rows in place: the head dim is its
// own padding, x's data and its batch, head and row strides are whole 16-byte chunks, and a KV head's rows lie
// within 32-bit element offsets.
inline bool rows_in_place(const AttnParams& ap, const AttnSetup& s, const void* x, const RowStrides& xs,
                          int64_t element_bytes) {
  auto whole = [&](int64_t elements) { return elements * element_bytes % 16 == 0; };
  return ap.D == s.Dp && ap.L > 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 && whole(xs.batch) &&
         whole(xs.head) && whole(xs.row) && (ap.C + ap.L) * xs.row < (int64_t(1) << 31);
}

// Whether the kernel reads the body values in place from v instead of a padded copy (rows_in_place: D = Dp,
// 64, 80 or 128, and 16-byte rows) and the configuration allows it (RANGESWA_CUDA_VALUES=copy keeps the copy).
inline bool values_in_place(const AttnParams& ap, const AttnSetup& s, const void* v, const RowStrides& vs,
                            int64_t element_bytes) {
  return s.config.values_in_place && rows_in_place(ap, s, v, vs, element_bytes);
}

// The body values the kernel reads (buf.v and buf.v_strides set): v itself when values_in_place, else a
// [B * Hkv, L, Dp] copy that the preparation writes (`array(needed, rows)` allocates it).
template <typename Array>
void body_values(const AttnParams& ap, const AttnSetup& s, AttnBuffers& buf, int64_t element_bytes,
                 const Array& array) {
  buf.values_in_place = values_in_place(ap, s, buf.v, buf.v_strides, element_bytes);
  if (buf.values_in_place) {
    buf.v_body = const_cast<char*>(static_cast<const char*>(buf.v)) + buf.v_strides.at(0, 0, ap.C) * element_bytes;
    buf.values = buf.v_strides;
  } else {
    buf.v_body = array(ap.L > 0, ap.L);
    buf.values = RowStrides{ap.Hkv * ap.L * s.Dp, ap.L * s.Dp, s.Dp};
  }
}

// Whether the control CTAs read the control rows' body keys from k itself and rotate them to the
// conditioning positions as each tile lands (common/cond_rotation.h rotate_cond_keys) instead of reading a k_cond array
// that the preparation writes: the call has the conditioning correction and no prepared context (whose
// cache holds k_cond), the head dim is its own padding, k's rows start on 16 bytes (cp.async 16) as
// values_in_place asks of v, and the rotary half is 4 x a power of two pairs (rotate_cond_rows: a thread's
// step of 4 pairs the same in every row it rotates; 64 at head dim 128, 32 at 64). The same products
// as the preparation's, one array less written and read. Where the configuration allows it (RANGESWA_CUDA_COND=copy
// keeps the array).
inline bool cond_keys_in_place(const AttnParams& ap, const AttnSetup& s, const void* k, const RowStrides& ks,
                               int64_t element_bytes) {
  if (!s.config.cond_in_place) return false;
  const int64_t steps = ap.rope.rotary_dim / 8;  // of 4 pairs (rotary_dim 0: none, no power of two)
  return s.cond_keys && ap.rope.rotary_dim % 8 == 0 && steps > 0 && (steps & (steps - 1)) == 0 &&
         rows_in_place(ap, s, k, ks, element_bytes);
}

// A call without a prepared context: where the control rows' body keys come from (buf.k and buf.k_strides
// set; before own_arrays, which allots k_cond only when they are not k's own).
inline void cond_from_keys(const AttnParams& ap, const AttnSetup& s, AttnBuffers& buf, int64_t element_bytes) {
  buf.cond_raw = cond_keys_in_place(ap, s, buf.k, buf.k_strides, element_bytes);
  if (!buf.cond_raw) return;
  buf.k_cond = const_cast<char*>(static_cast<const char*>(buf.k)) + buf.k_strides.at(0, 0, ap.C) * element_bytes;
  buf.cond = buf.k_strides;
}

// Whether Lite's preparation folds into the control CTAs (common/cond_rotation.h LitePrep): the body runs on the sm_90a
// kernel (whose launch runs the control grid first, sm90/body_launch.h, so every array is whole before a
// body CTA reads it), the control CTAs load every body key and value from k and v themselves (cond_raw, and v
// read in place), and what the preparation would write of the body rows is k_nat and rule 4's means s_nat and
// s_v alone (Lite: no grouping, prefix sums or far summaries), head dim 64 with every dim rotated and G = 16
// (a 64-key tile holds 4 whole G-blocks; at head dim 128 the control CTA's registers would not hold the
// natural tables beside its output). The preparation then reads no body row and writes the control rows
// alone: one pass over k and v instead of two. `fold` is Config::fold (api/config.h: the sm_90a launch;
// RANGESWA_CUDA_FOLD=off clears it, for A/B measurements and tests).
inline bool nat_keys_from_control(const AttnParams& ap, const PrepareParams& pp, const AttnBuffers& buf, bool fold) {
  return fold && buf.cond_raw && buf.values_in_place && ap.C > 0 && ap.L > 0 && pp.row0 == 0 && ap.D == 64 &&
         pp.Dp == 64 && 2 * int64_t(pp.rotary_half) == ap.D && pp.G == 16 && pp.unit_tokens == 16 &&
         pp.k_nat != nullptr && pp.s_nat != nullptr && pp.s_v != nullptr && pp.k_grp == nullptr &&
         pp.k_cond == nullptr && pp.v_body == nullptr && pp.s_grp == nullptr && pp.p_nat == nullptr &&
         pp.p_grp == nullptr;
}

// The call's k_nat, s_nat and s_v to the control CTAs (p.fold) and out of the preparation, which then runs its
// control rows' units alone (prepare.h prepare_call_rows_only).
inline void nat_keys_to_control(PrepareParams& pp, AttnKernelParams& p) {
  p.fold = FoldedPrepare{pp.k_nat, pp.s_nat, pp.s_v, last_block_inverse(pp.L, pp.G)};
  prepare_call_rows_only(pp);
}

// What of a call's preparation its control CTAs take over (p.fold), where they can: Lite's body rows. One call
// whose configuration folds (`fold`: Config::fold, api/config.h: the sm_90a launch), without a prepared context
// (whose cache holds them).
inline void fold_into_control(const AttnParams& ap, PrepareParams& pp, const AttnBuffers& buf, bool fold,
                              AttnKernelParams& p) {
  if (nat_keys_from_control(ap, pp, buf, fold)) nat_keys_to_control(pp, p);
}

inline PrepareParams prepare_params(const AttnParams& ap, const AttnSetup& s, const AttnBuffers& buf) {
  PrepareParams pp{};
  pp.k = buf.k;
  pp.v = buf.v;
  pp.k_strides = buf.k_strides;
  pp.v_strides = buf.v_strides;
  pp.k_ctrl = buf.k_ctrl;
  pp.v_ctrl = buf.v_ctrl;
  pp.k_nat = buf.k_nat;
  pp.k_grp = buf.k_grp;
  pp.k_cond = buf.cond_raw ? nullptr : buf.k_cond;  // k's own rows are never written
  pp.v_body = buf.values_in_place ? nullptr : buf.v_body;  // v read in place is never written
  pp.s_nat = buf.s_nat;
  pp.s_grp = buf.s_grp;
  pp.s_v = buf.s_v;
  pp.p_nat = buf.p_nat;
  pp.p_grp = buf.p_grp;
  pp.ctrl_stride = ap.C * s.Dp;
  pp.body_stride = ap.L * s.Dp;
  pp.sum_stride = int64_t(s.geo.nG) * s.Dp;
  pp.row0 = 0;
  pp.cos_int = buf.cos_int;
  pp.sin_int = buf.sin_int;
  pp.cos_cond = buf.cos_cond;
  pp.sin_cond = buf.sin_cond;
  pp.BH = int32_t(s.BH);
  pp.Hkv = int32_t(ap.Hkv);
  pp.C = int32_t(ap.C);
  pp.L = int32_t(ap.L);
  pp.D = int32_t(ap.D);
  pp.Dp = s.Dp;
  pp.G = s.geo.G;
  pp.g = s.grouped_keys ? s.geo.g : 1;
  pp.rotary_half = int32_t(ap.rope.rotary_dim / 2);
  pp.interleaved = ap.rope.interleaved;
  pp.unit_tokens = s.unit_tokens;
  return pp;
}

inline AttnKernelParams kernel_params(const AttnParams& ap, const AttnSetup& s, const AttnBuffers& buf) {
  AttnKernelParams p{};
  p.q = buf.q;
  p.q_strides = buf.q_strides;
  p.out = buf.out;
  p.lse = buf.lse;
  p.kv = PreparedArrays{buf.k_ctrl, buf.v_ctrl, buf.k_nat, buf.k_grp, buf.k_cond, buf.v_body,
                        buf.s_nat, buf.s_grp, buf.s_v, buf.p_nat, buf.p_grp, ap.C * s.Dp, buf.key_stride,
                        buf.sum_stride, buf.values, buf.cond, buf.cond_raw};
  p.cos_int = buf.cos_int;
  p.sin_int = buf.sin_int;
  p.cos_cond = buf.cos_cond;
  p.sin_cond = buf.sin_cond;
  p.rotary_half = int32_t(ap.rope.rotary_dim / 2);
  p.interleaved = ap.rope.interleaved;
  p.records = buf.records;
  p.record_count = buf.record_count;
  p.max_records = s.max_records;
  p.max_spans = s.max_spans;
  p.span_budget = s.span_budget;
  p.kv_stages = s.kv_stages;
  p.retrieved = s.retrieved_k > 0 ? buf.retrieved_sorted : nullptr;
  p.retrieved_k = s.retrieved_k;
  p.nQb = s.nQb;
  p.geo = s.geo;
  p.B = int32_t(ap.B);
  p.Hq = int32_t(ap.Hq);
  p.Hkv = int32_t(ap.Hkv);
  p.D = int32_t(ap.D);
  p.Dp = s.Dp;
  p.Nq = int32_t(ap.Nq);
  p.first_row = int32_t(ap.first_row);
  p.scale_log2 = s.scale_log2;
  p.control_bias_log2 = s.control_bias_log2;
  p.control_tiles = s.control_tiles;
  p.control_chunks = s.control_chunks;
  p.control_chunk_keys = s.control_chunk_keys;
  p.body_tiles = s.body_tiles;
  p.tile_block = s.tile_block;
  p.tiles_per_block = s.tiles_per_block;
  p.first_tile_block = s.first_tile_block;
  p.by_ctas_per_head = FastDiv::make(int32_t(s.ctas_per_head()));
  p.by_chunks = FastDiv::make(s.control_chunks);
  p.by_tiles_per_block = FastDiv::make(std::max(1, s.tiles_per_block));
  p.by_Hq = FastDiv::make(int32_t(ap.Hq));
  p.by_group = FastDiv::make(int32_t(ap.Hq / ap.Hkv));
  p.ctrl_o = buf.ctrl_o;
  p.ctrl_lse = buf.ctrl_lse;
  return p;
}

// The preparation's and the kernel's parameters of a staged call (context.h stage_arrays; its tables, blocks and
// plan buffers in `buf`): with a prepared `context` the preparation writes the control rows alone; one call (not
// `packed`, whose sequences share the preparation's launches) without a context folds into its control CTAs what
// its configuration allows (fold_into_control).
struct StagedParams {
  PrepareParams pp;  // before prepare_ready
  AttnKernelParams p;
};
inline StagedParams stage_params(const AttnParams& ap, const AttnSetup& s, const AttnBuffers& buf, bool context,
                                 bool packed) {
  StagedParams st{prepare_params(ap, s, buf), kernel_params(ap, s, buf)};
  if (context) prepare_call_rows_only(st.pp);
  if (!packed && !context) fold_into_control(ap, st.pp, buf, s.config.fold, st.p);
  return st;
}

// Element offsets inside one KV head's prepared array are 32-bit (prepare.h prepare_range, the kernel's
// tile copies): its rows times the padded head dim stay below 2^31.
inline bool head_offsets_fit(int64_t rows, int64_t D) {
  return rows * int64_t(padded_head_dim(D)) < (int64_t(1) << 31);
}

// Whether some body row sees a summary block in part (section 7): its visible end v = min(L, (i // cb + 1) cb)
// falls inside G-block b = v // G (v % G != 0, v < L) and b is a summary for the row (rules.h block_role: outside
// its window, and near it unless far summaries). Such a summary has a value of its own per row (the mean of the
// block's visible tokens), which the kernel's shared summary tiles cannot hold; the CPU kernel and the
// reference compute it. The rows of a causal block share v; the one most likely to see b as a summary is its
// first (its window ends earliest) or, for near-only summaries, the first that b is near. The pattern repeats
// every G / gcd(cb, G) causal blocks (a shift by lcm(cb, G) moves rows, ends and blocks alike) and only the end
// of the body breaks it (the windows capped at L - 1, the ragged last block nearer), so the first and the last
// G / gcd(cb, G) causal blocks decide. Never when cb and G divide
// one another (v is a block end, or lies in the row's own block) or the radius is at least cb - 1 (b then lies in
// every row's window); CoLa's cb = G = 16 and every such pairing run here.
inline bool sees_a_summary_in_part(const Rules& R) {
  if (R.method != Method::kRangeSwa || !R.summaries || R.cb <= 0 || R.cb >= R.L || R.cb % R.G == 0 ||
      R.G % R.cb == 0 || R.radius >= R.cb - 1)
    return false;
  int64_t a = R.cb, b = R.G;
  while (b != 0) a = std::exchange(b, a % b);  // gcd(cb, G)
  const int64_t blocks = ceil_div(R.L, R.cb), period = std::min(blocks, R.G / a);
  for (int64_t x = 0; x < 2 * period; ++x) {
    const int64_t m = x < period ? x : blocks - 2 * period + x;  // the first period, then the last
    const int64_t i0 = m * R.cb, v = std::min(R.L, i0 + R.cb);
    if (v >= R.L || v % R.G == 0) continue;
    const int64_t blk = v / R.G;
    // The first row of the causal block for which blk is a summary at all (near-only: within Hn of it).
    const int64_t i = R.far_summaries ? i0 : std::max(i0, R.block_end(blk) - 1 - R.Hn);
    if (i < v && !R.in_window(i, blk)) return true;
  }
  return false;
}

// Calls the CUDA kernel does not run, with the reason (nullptr: supported).
inline const char* cuda_unsupported(const AttnParams& ap) {
  const Rules& R = ap.rules;
  if (sees_a_summary_in_part(R))
    return "attn on CUDA does not compute a summary block that a row sees in part (section 7: causal_block and "
           "summary_block divide neither one another, the window radius W // 2 is below causal_block - 1, and a "
           "row's visible end falls inside a block outside its window), which only the CPU kernel computes; run "
           "this configuration on the CPU, or use a causal_block that divides or is divided by summary_block";
  if (ap.L + ap.C >= kMaxPlanTokens)
    return "attn on CUDA takes sequences of fewer than 2^29 tokens (C + L)";
  if (!head_offsets_fit(ap.L + ap.C, ap.D))
    return "attn on CUDA takes fewer than 2^31 elements per KV head and array: (C + L) x the head dim padded to "
           "64, 80 or 128 (16M tokens at head dim 128, 33M at 64)";
  return nullptr;
}

}  // namespace rangeswa::cuda
