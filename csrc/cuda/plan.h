// The plan of the fused attention kernel: which keys each CTA scores, as a short list of records,
// and the per-row bounds that decide, for each record, which of its keys a row sees (SPEC sections
// 2-3 and 7). Host and device code, int32 only: the plan kernel and the host emulator run
// plan_body_tile / plan_control_tile (and, for the kernel's two loops, tile.h plan_spans, which runs
// record_bounds for two rows per record); the attention kernel's masked loop runs it once per record and row.
//
// A record is one contiguous row range of one prepared array (attn_params.h), scored with one query
// variant, so every KV tile the kernel loads is a plain copy of consecutive rows:
//
//   keys        array                         query variant           rows of a body tile
//   kCtrl       control keys (never rotated)  cond (i T / L) or nat   [0, C), in 16-column tiles
//   kNat        R(j) k_j                      nat (i)                 exact keys within Hn of the row
//   kGrp        R(j / g) k_j                  left (i/g + c)          exact keys farther left than Hn
//                                             right (i/g - c)         ... farther right
//   kSumNat     G-block means of R(j) k_j     nat                     near summaries (rule 4)
//   kSumGrp     G-block means of R(j/g) k_j   left / right            far summaries
//   kCond       R(j T / L) k_j                plain                   control rows' body keys
//
// A row of the tile sees key x of a record (a token or a G-block index) when lo <= x < hi, with
// [lo, hi) = record_bounds(...): the record's scope (window, left / right of the window, all),
// intersected with the position class of its query variant (section 3) and the row's visible keys
// (section 7). Exact keys are every key of the window records and of the retrieved blocks; a G-block
// is a summary for a row when it lies outside the row's window, is not retrieved and (Lite) is near:
// the summary records cover those blocks, and the retrieved ones are removed per KV tile (a 64-bit
// column mask, retrieved_blocks.h exclusion_bits). Blocks straddling distance Hn (class kMixed) are in no record: the
// kernel scores them per row from prefix sums (mixed_block), so no KV tile is spent on them.
// Each row thus meets each key it sees in exactly one record, and every key it sees is in one.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "grouped_positions.h"
#include "retrieved_blocks.h"
#include "rules.h"
#include "straddling.h"
#include "summary_bias.h"

namespace rangeswa::cuda {

enum class KeySet : uint8_t { kCtrl = 0, kNat = 1, kGrp = 2, kCond = 3, kSumNat = 4, kSumGrp = 5 };
enum class QVar : uint8_t { kNat = 0, kLeft = 1, kRight = 2, kCond = 3, kPlain = 4 };
// Which keys of its range a record offers a row before class and visibility: all of them, the row's
// rule-2 window (rangeswa: its G-blocks; swa: its token window past the sinks), or the G-blocks left /
// right of the row's window.
// kMixedLeft / kMixedRight: the G-block straddling distance Hn on that side of the row (mixed_block), whose
// logit the kernel has from prefix-sum dot products rather than from a K tile (kRecDirect).
enum class Scope : uint8_t { kAll = 0, kWindow = 1, kSumLeft = 2, kSumRight = 3, kMixedLeft = 4, kMixedRight = 5 };

enum : uint8_t {
  kRecClass = 1,    // keep only the keys of the query variant's position class (section 3)
  kRecCausal = 2,   // keep only keys the row sees (section 7)
  kRecExclude = 4,  // summary record that some retrieved block overlaps (exclusion_bits per tile)
  kRecDirect = 8,   // straddling blocks: per-row logits from prefix sums, no Q K^T (values: G-block means)
  // A window record whose rows see every key: exact in their window, and the other G-blocks as near
  // summaries, each a block mean of the tile's exact logits spread over the block's columns (window_sums).
  kRecWindowSums = 16,
  // A direct record over the Hn band (hn_bands): every row sees every block, far, straddling or near,
  // with per-row logits made while the query slot held each variant (no mask).
  kRecBand = 32,
};

struct Record {
  int32_t k0, n;  // keys [k0, k0 + n) of the array
  uint8_t keys, qvar, scope, flags;
  float bias_log2;  // logit bias in base 2: log2 G for summaries, -log(L/T) log2(e) for control rows
};
static_assert(sizeof(Record) == 16, "records are 16 bytes");

// n / d for 0 <= n < 2^31 and a divisor d >= 1 fixed for the call, as a multiply-high and a shift (the
// round-up method: m = ceil(2^p / d) with p = 31 + ceil(log2 d); exact for every n in that range), so
// that the kernel divides by G, cb, g and the tile counts without an integer division sequence.
struct FastDiv {
  int32_t d;
  uint32_t m;
  int32_t shift;

  static FastDiv make(int32_t divisor) {
    FastDiv f{divisor, 0u, 0};
    if (divisor > 1) {
      int32_t log2 = 0;
      while ((int64_t(1) << log2) < divisor) ++log2;
      const int64_t p = 31 + log2;
      f.m = uint32_t(((int64_t(1) << p) + divisor - 1) / divisor);
      f.shift = int32_t(p - 32);
    }
    return f;
  }
  RSWA_HD int32_t div(int32_t n) const {
    if (d == 1) return n;
#if defined(__CUDA_ARCH__)
    return int32_t(__umulhi(uint32_t(n), m) >> shift);
#else
    return int32_t(uint32_t((uint64_t(uint32_t(n)) * m) >> 32) >> shift);
#endif
  }
  RSWA_HD int32_t mod(int32_t n) const { return n - div(n) * d; }
};

// The numbers the plan depends on, in int32 (the op rejects sequences of 2^30 tokens or more).
struct Geometry {
  int32_t L, C, G, nG, Hn, radius, Rb, Qb, sinks, cb;
  int32_t g, c;        // group size (0: no grouping) and offset Hn - Hn / g
  int32_t method;      // rules.h Method
  bool grouping;       // section 3's grouped positions are on
  bool far_summaries;  // rule 4 beyond Hn (off: RangeSWA-Lite)
  bool summaries;      // rule 4 at all
  bool cond;           // conditioning correction (body rows score control keys at i T / L)
  // Edge-free records (window_sums, hn_bands below), chosen by the host for the kernel instantiation
  // (api/config.h choose_config): window_sums_ok when G = 16 on 64-key tiles, band_ok when the kernel's band
  // buffers fit without costing a CTA per multiprocessor.
  bool window_sums_ok, band_ok;
  int32_t tile_cols;  // keys per KV tile of the kernel instantiation (kernel_traits.h kv_tile_cols; choose_config)
  float log2_block, log2_last_block;  // rule 4's summary bias log2 n_b (summary_bias.h): full blocks, the last block
  FastDiv by_G, by_cb, by_g, by_blocks_per_key_block;  // / G, / cb, / g, / (Rb / G) (1 when unused)
};

// Sizes past the sequence change nothing (a window, near range or causal block of L tokens or more acts
// as L), so they are clamped; the op has rejected L >= kMaxPlanTokens.
inline constexpr int64_t kMaxPlanTokens = int64_t(1) << 29;

inline Geometry make_geometry(const Rules& R, int64_t C) {
  const int64_t L = R.L, cap = kMaxPlanTokens;
  Geometry g{};
  g.L = int32_t(L);
  g.C = int32_t(C);
  // A G-block or key block longer than the sequence holds it all, like one of exactly L tokens.
  const int64_t G = L > 0 ? min64(R.G, L) : 1;
  g.G = int32_t(G);
  g.nG = int32_t(ceil_div(L, G));
  g.Rb = int32_t(G * min64(R.Rb / R.G, max64(1, ceil_div(L, G))));
  g.Qb = int32_t(min64(R.Qb, max64(L, 1)));
  g.Hn = int32_t(min64(R.Hn, cap));
  // rules.h keeps SPEC's floor division: swa's radius (W - S) // 2 may be -1 (only sinks are seen).
  g.radius = int32_t(min64(R.radius, cap));
  g.sinks = int32_t(min64(R.sinks, cap));
  g.cb = int32_t(min64(R.cb, L));
  g.g = int32_t(R.g);
  g.c = int32_t(R.group_offset);
  g.method = int32_t(R.method);
  g.grouping = R.grouping();
  g.far_summaries = R.far_summaries;
  g.summaries = R.summaries && R.method == Method::kRangeSwa;
  g.cond = conditioned(R, C);
  g.log2_block = summary_bias_log2(G);
  g.log2_last_block = last_block_bias_log2(L, G, g.nG);
  g.by_G = FastDiv::make(g.G);
  g.by_cb = FastDiv::make(g.cb > 0 ? g.cb : 1);
  g.by_g = FastDiv::make(g.g > 0 ? g.g : 1);
  g.by_blocks_per_key_block = FastDiv::make(g.Rb / g.G);
  return g;
}

// --- rows (rules.h in int32; i >= 0 throughout) -------------------------------------------------------

// Rule 2: the row's window blocks [first, last] (rangeswa).
RSWA_HD int32_t window_first(const Geometry& g, int32_t i) { return g.by_G.div(imax(0, i - g.radius)); }
RSWA_HD int32_t window_last(const Geometry& g, int32_t i) { return g.by_G.div(imin(g.L - 1, i + g.radius)); }
// Section 7: body keys [0, visible_end) and the G-blocks [0, visible_blocks) a row sees whole. With the
// CUDA kernel's restriction (attn_setup.h cuda_unsupported) no summary block is seen in part.
RSWA_HD int32_t visible_end(const Geometry& g, int32_t i) {
  return g.cb == 0 ? g.L : imin(g.L, (g.by_cb.div(i) + 1) * g.cb);
}
RSWA_HD int32_t visible_blocks(const Geometry& g, int32_t i) {
  const int32_t end = visible_end(g, i), whole = g.by_G.div(end);  // both read before the select: no branch
  return end == g.L ? g.nG : whole;
}
// Rule 4's near blocks [near_first, near_last] and the blocks wholly farther than Hn: [0, far_left_end)
// and [far_right_begin, nG) (rules.h, same names).
RSWA_HD int32_t near_first(const Geometry& g, int32_t i) { return i - g.Hn <= 0 ? 0 : g.by_G.div(i - g.Hn + g.G - 1); }
RSWA_HD int32_t near_last(const Geometry& g, int32_t i) {
  return i + g.Hn >= g.L - 1 ? g.nG - 1 : g.by_G.div(i + g.Hn + 1) - 1;
}
RSWA_HD int32_t far_left_end(const Geometry& g, int32_t i) { return i - g.Hn > 0 ? g.by_G.div(i - g.Hn) : 0; }
RSWA_HD int32_t far_right_begin(const Geometry& g, int32_t i) { return imin(g.nG, g.by_G.div(i + g.Hn) + 1); }

// --- blocks straddling distance Hn ------------------------------------------------------------------

// Which G-block of a row straddles distance Hn on each side, and the token where its class changes:
// straddling.h mixed_block (row_geometry keeps them per row; the direct records below cover the tile's).

// --- edge-free records ------------------------------------------------------------------------------
//
// A tile's rows disagree at the window's edges, at distance Hn (near summaries give way to straddling
// and far ones) and, for Lite, at the near range's edge. Where rows differ only in *how* they see a
// G-block, not *whether*, the plan hands every row the whole range and the kernel picks per element, so
// the near and far summary records are seen whole by every row and run FlashAttention's unmasked loop:
//  - window_sums: the G-blocks at the window's edges that some rows of the tile see exactly are near
//    summaries for the others. Logits are linear in the key, so a block's summary logit is the mean of
//    the exact logits its window tile computes anyway; spread over the block's n_b columns (each the
//    mean, no bias) it weighs n_b 2^mean in the softmax and brings the mean of the block's values, which
//    is rule 4's summary key and value. The window's edge tiles thus need no second tile of summaries.
//    (The kernel does so for G = 16 on 64-key tiles; other G and tiles keep the masked records.)
//  - hn_bands: the G-blocks within the tile's spread of distance Hn (far for some rows, straddling or
//    near for others) form one direct record per side, at most kBandBlocks blocks, whose per-row logits
//    come from the product of the row's class (band_columns), made while the query slot holds it.
inline constexpr int32_t kBandBlocks = 16;

// Whether the window record of rows [i0, i1] carries its edges' near summaries (kRecWindowSums): every
// block of the tile's window union that a row does not see exactly must be a near summary for it.
RSWA_HD bool window_sums(const Geometry& g, int32_t i0, int32_t i1) {
  if (!g.window_sums_ok || !g.summaries || g.cb > 0 || g.method != int32_t(Method::kRangeSwa)) return false;
  if (g.far_summaries && !g.grouping) return true;  // every block outside a row's window: a native summary
  return window_first(g, i0) >= near_first(g, i1) && window_last(g, i1) <= near_last(g, i0);
}

// The Hn bands of rows [i0, i1]: G-blocks [left_lo, left_hi) and [right_lo, right_hi), or off.
struct Bands {
  int32_t left_lo, left_hi, right_lo, right_hi;
  bool on;
};

RSWA_HD Bands hn_bands(const Geometry& g, int32_t i0, int32_t i1) {
  Bands b{0, 0, 0, 0, false};
  if (!g.band_ok || !g.grouping || !g.summaries || !g.far_summaries || g.cb > 0 ||
      g.method != int32_t(Method::kRangeSwa))
    return b;
  b.left_lo = far_left_end(g, i0);
  b.left_hi = imax(b.left_lo, near_first(g, i1));
  b.right_lo = near_last(g, i0) + 1;
  b.right_hi = imax(b.right_lo, far_right_begin(g, i1));
  // Each band fits one direct tile and lies outside every row's window.
  b.on = b.left_hi - b.left_lo <= kBandBlocks && b.right_hi - b.right_lo <= kBandBlocks &&
         b.left_hi <= window_first(g, i0) && b.right_lo > window_last(g, i1);
  return b;
}

struct Bounds {
  int32_t lo, hi;
};

// Everything about body row i that record_bounds needs besides i, computed once per row (the kernel keeps
// it in shared memory for the CTA's life).
struct RowGeometry {
  int32_t win_lo, win_hi;  // rule 2's exact window as tokens (swa: its token window past the sinks)
  int32_t wf, wl;          // rule 2's window blocks [wf, wl] (rangeswa)
  int32_t nf, nl1;         // near blocks [nf, nl1)
  int32_t fle, frb;        // far blocks [0, fle) and [frb, nG)
  int32_t vis_end, vis_blocks;  // section 7
  int32_t mix[2], mix_m[2];     // the straddling block left / right of the row (-1: none) and its token m
};

// RowGeometry's fields as int32 offsets (the kernel reads one of them by a run-time choice).
inline constexpr int kRowNf = int(offsetof(RowGeometry, nf) / sizeof(int32_t));
inline constexpr int kRowNl1 = int(offsetof(RowGeometry, nl1) / sizeof(int32_t));
inline constexpr int kRowFle = int(offsetof(RowGeometry, fle) / sizeof(int32_t));
inline constexpr int kRowFrb = int(offsetof(RowGeometry, frb) / sizeof(int32_t));

// Row i of a tile whose query block retrieved `sorted` (k entries; null for control rows).
// [gate:row-geometry begin]
RSWA_HD RowGeometry row_geometry(const Geometry& g, int32_t i, const int32_t* sorted = nullptr, int32_t k = 0) {
  RowGeometry r;
  r.wf = window_first(g, i);
  r.wl = window_last(g, i);
  if (g.method == int32_t(Method::kSwa)) {  // token window past the sinks (they have a record)
    r.win_lo = imax(g.sinks, i - g.radius);
    r.win_hi = imin(g.L, i + g.radius + 1);
  } else {
    r.win_lo = r.wf * g.G;
    r.win_hi = imin(g.L, (r.wl + 1) * g.G);
  }
  r.nf = near_first(g, i);
  r.nl1 = near_last(g, i) + 1;
  r.fle = far_left_end(g, i);
  r.frb = far_right_begin(g, i);
  r.vis_end = visible_end(g, i);
  r.vis_blocks = visible_blocks(g, i);
  for (int side = 0; side < 2; ++side) {
    const MixedBlock mb = mixed_block(g, sorted, k, i, side);
    r.mix[side] = mb.block;
    r.mix_m[side] = mb.m;
  }
  return r;
}
// [gate:row-geometry end]

// Which blocks of an Hn band (G-blocks [k0, k0 + n) on `side`, 0 left, 1 right) take their score from
// variant v's product for a row: far blocks the side's grouped variant, near ones the native variant; the
// row's straddling block neither (prefix sums, mixed_block). Far blocks come first on the left and last on
// the right, near ones the other way, so v's blocks are the columns before or after one edge of the row:
// its far blocks' end fle / begin frb, or its near blocks' begin nf / end nl1 (RowGeometry `field`, as
// int32 offsets, which the kernel reads by a run-time choice).
struct BandEdge {
  int field;  // int32 offset in RowGeometry
  bool head;  // v's columns are those before the edge (else from it on)
};

RSWA_HD BandEdge band_edge(int side, QVar v) {
  const bool head = (side == 0) == (v != QVar::kNat);
  return BandEdge{side == 0 ? (head ? kRowFle : kRowNf) : (head ? kRowNl1 : kRowFrb), head};
}

// The columns [lo, hi) of v's blocks given the row's edge (its `field`, a block index).
RSWA_HD Bounds band_columns(const BandEdge& e, int32_t edge, int32_t k0, int32_t n) {
  const int32_t x = edge - k0;
  return e.head ? Bounds{0, imax(0, imin(n, x))} : Bounds{imax(0, imin(n, x)), n};
}

RSWA_HD Bounds band_columns(const RowGeometry& row, int side, QVar v, int32_t k0, int32_t n) {
  const BandEdge e = band_edge(side, v);
  return band_columns(e, reinterpret_cast<const int32_t*>(&row)[e.field], k0, n);
}

// The keys [lo, hi) of record r that a body row sees (control rows see every key: kPlain records). A
// window record with kRecWindowSums gives the keys the row sees exactly; it sees the rest of the record
// as near summaries.
// [gate:record-bounds begin]
RSWA_HD Bounds record_bounds(const Geometry& g, const Record& r, const RowGeometry& row, int32_t i) {
  if (r.flags & kRecBand) return Bounds{r.k0, r.k0 + r.n};  // every row sees the whole band
  if (Scope(r.scope) == Scope::kMixedLeft || Scope(r.scope) == Scope::kMixedRight) {
    const int32_t b = row.mix[Scope(r.scope) == Scope::kMixedLeft ? 0 : 1];
    return b >= r.k0 && b < r.k0 + r.n ? Bounds{b, b + 1} : Bounds{r.k0, r.k0};
  }
  const KeySet keys = KeySet(r.keys);
  if (keys == KeySet::kCtrl || QVar(r.qvar) == QVar::kPlain) return Bounds{r.k0, r.k0 + r.n};
  const bool summary = keys == KeySet::kSumNat || keys == KeySet::kSumGrp;
  const Scope scope = Scope(r.scope);
  const QVar v = QVar(r.qvar);
  const bool cls = (r.flags & kRecClass) != 0;
  int32_t lo = r.k0, hi = r.k0 + r.n;
  if (scope == Scope::kWindow) {
    lo = imax(lo, row.win_lo);
    hi = imin(hi, row.win_hi);
  }
  if (scope == Scope::kSumLeft) hi = imin(hi, row.wf);
  if (scope == Scope::kSumRight) lo = imax(lo, row.wl + 1);
  // Section 3's position classes: exact keys within Hn are native, farther ones grouped; near G-blocks
  // are native, blocks wholly beyond Hn grouped, straddling ones in no record.
  if (cls && v == QVar::kNat) {
    lo = imax(lo, summary ? row.nf : native_first(g.Hn, i));
    hi = imin(hi, summary ? row.nl1 : grouped_right_first(g.Hn, i));
  }
  if (cls && v == QVar::kLeft) hi = imin(hi, summary ? row.fle : native_first(g.Hn, i));
  if (cls && v == QVar::kRight) lo = imax(lo, summary ? row.frb : grouped_right_first(g.Hn, i));
  if (r.flags & kRecCausal) hi = imin(hi, summary ? row.vis_blocks : row.vis_end);
  return Bounds{lo, imax(lo, hi)};
}

RSWA_HD Bounds record_bounds(const Geometry& g, const Record& r, int32_t i, const int32_t* sorted = nullptr,
                              int32_t k = 0) {
  return record_bounds(g, r, row_geometry(g, i, sorted, k), i);
}
// [gate:record-bounds end]

// --- the plan of one CTA ------------------------------------------------------------------------------

// Upper bound on the records of a body tile with `k` retrieved blocks (the plan kernel's stride).
RSWA_HD int32_t max_records(int32_t k) { return 14 + 3 * k; }
// The tile spans a body tile may have (tile.h plan_spans; the kernel keeps them in shared memory). A record
// has at most three (masked head, unmasked middle, masked tail), plus two per retrieved block in each of the
// at most four summary records that exclude retrieved blocks; the plans the census measures have at most
// 41 at K = 8 (32k, every case). The room is smaller than that bound so that head dims 80 and 128 keep
// two CTAs per multiprocessor on an A100 (as before the spans): a plan that would pass it sends the tiles of
// its later records down the masked loop whole (one span each), which takes any tile.
RSWA_HD int32_t max_spans(int32_t k) { return max_records(k) + 2 * k + 4; }

struct PlanWriter {
  Record* out;
  int32_t count;

  RSWA_HD void add(KeySet keys, QVar v, Scope scope, uint8_t flags, int32_t k0, int32_t k1, float bias) {
    if (k1 <= k0) return;
    out[count++] = Record{k0, k1 - k0, uint8_t(keys), uint8_t(v), uint8_t(scope), flags, bias};
  }
};

// Exact body keys [a, b) for the rows [i0, i1], one record per position class some pair of the tile
// uses: grouped-left keys lie below i1 - Hn, native ones in [i0 - Hn, i1 + Hn], grouped-right ones above
// i0 + Hn. Emitted in the query variants' order (left, nat, right) through the pass argument.
// `sums` (kRecWindowSums or 0) goes to the native record, the only one window_sums leaves non-empty.
RSWA_HD void exact_records(const Geometry& g, PlanWriter& w, QVar pass, Scope scope, int32_t i0, int32_t i1,
                           int32_t a, int32_t b, uint8_t sums = 0) {
  const uint8_t causal = g.cb > 0 ? kRecCausal : 0;
  if (!g.grouping) {
    if (pass == QVar::kNat) w.add(KeySet::kNat, QVar::kNat, scope, uint8_t(causal | sums), a, b, 0.f);
    return;
  }
  const uint8_t f = uint8_t(kRecClass | causal);
  if (pass == QVar::kLeft) w.add(KeySet::kGrp, QVar::kLeft, scope, f, a, imin(b, native_first(g.Hn, i1)), 0.f);
  if (pass == QVar::kNat)
    w.add(KeySet::kNat, QVar::kNat, scope, uint8_t(f | sums), imax(a, native_first(g.Hn, i0)),
          imin(b, grouped_right_first(g.Hn, i1)), 0.f);
  if (pass == QVar::kRight)
    w.add(KeySet::kGrp, QVar::kRight, scope, f, imax(a, grouped_right_first(g.Hn, i0)), b, 0.f);
}

// Summary records of the rows [i0, i1] on one side of their windows: blocks [lo, hi) (the union over the
// rows), split by class as record_bounds splits them. With Hn bands (`banded`) the near and far records
// stop where the bands begin, so every row sees them whole.
RSWA_HD void summary_records(const Geometry& g, PlanWriter& w, QVar pass, Scope side, int32_t i0, int32_t i1,
                             int32_t lo, int32_t hi, bool exclude, bool banded) {
  const uint8_t base = uint8_t((g.cb > 0 ? kRecCausal : 0) | (exclude ? kRecExclude : 0));
  const float bias = g.log2_block;
  // Rows whose far blocks end first / near blocks begin last: the union's ends, or the bands' edges.
  const int32_t first = banded ? i1 : i0, last = banded ? i0 : i1;
  if (g.grouping) {
    const uint8_t f = uint8_t(base | kRecClass);
    if (pass == QVar::kLeft && g.far_summaries && side == Scope::kSumLeft)
      w.add(KeySet::kSumGrp, QVar::kLeft, side, f, lo, imin(hi, far_left_end(g, last)), bias);
    if (pass == QVar::kNat)
      w.add(KeySet::kSumNat, QVar::kNat, side, f, imax(lo, near_first(g, first)), imin(hi, near_last(g, last) + 1),
            bias);
    if (pass == QVar::kRight && g.far_summaries && side == Scope::kSumRight)
      w.add(KeySet::kSumGrp, QVar::kRight, side, f, imax(lo, far_right_begin(g, first)), hi, bias);
  } else if (pass == QVar::kNat) {
    if (g.far_summaries) {
      w.add(KeySet::kSumNat, QVar::kNat, side, base, lo, hi, bias);
    } else {  // Lite: near blocks only (without grouping "near" is the only class restriction)
      w.add(KeySet::kSumNat, QVar::kNat, side, uint8_t(base | kRecClass), imax(lo, near_first(g, i0)),
            imin(hi, near_last(g, i1) + 1), bias);
    }
  }
}

// The records of a tile of body rows [i0, i0 + nrows) (inside one query block for rangeswa), whose
// query block retrieved `sorted` (ascending, -1 padded, k entries). Records come in the order the
// kernel fills its query slot: cond, left, nat, right.
RSWA_HD int32_t plan_body_tile(const Geometry& g, int32_t i0, int32_t nrows, const int32_t* sorted, int32_t k,
                               Record* out) {
  PlanWriter w{out, 0};
  const int32_t i1 = i0 + nrows - 1;
  const int32_t seen = visible_end(g, i1);  // keys no row of the tile sees come in no record
  const Method method = Method(g.method);
  const QVar order[3] = {QVar::kLeft, QVar::kNat, QVar::kRight};
  const bool sums = window_sums(g, i0, i1);
  const Bands bands = hn_bands(g, i0, i1);
  if (g.cond) w.add(KeySet::kCtrl, QVar::kCond, Scope::kAll, 0, 0, g.C, 0.f);
  for (int p = 0; p < 3; ++p) {
    const QVar pass = order[p];
    if (pass == QVar::kNat && !g.cond) w.add(KeySet::kCtrl, QVar::kNat, Scope::kAll, 0, 0, g.C, 0.f);
    if (method == Method::kFull || method == Method::kSelfExtend) {
      exact_records(g, w, pass, Scope::kAll, i0, i1, 0, seen);
    } else if (method == Method::kSwa) {
      if (pass == QVar::kNat) {
        const int32_t sinks = imin(g.sinks, seen);
        w.add(KeySet::kNat, QVar::kNat, Scope::kAll, g.cb > 0 ? kRecCausal : 0, 0, sinks, 0.f);
        const int32_t lo = imax(sinks, i0 - g.radius), hi = imin(seen, i1 + g.radius + 1);
        w.add(KeySet::kNat, QVar::kNat, Scope::kWindow, g.cb > 0 ? kRecCausal : 0, lo, hi, 0.f);
      }
    } else {  // rangeswa
      const int32_t wf0 = window_first(g, i0), wl1 = window_last(g, i1);
      exact_records(g, w, pass, Scope::kWindow, i0, i1, wf0 * g.G, imin(seen, imin(g.L, (wl1 + 1) * g.G)),
                    sums ? kRecWindowSums : 0);
      // Rule 3: the retrieved key blocks, adjacent ones merged into one range.
      for (int32_t x = 0; x < k && sorted[x] >= 0;) {
        const RetrievedRun run = retrieved_run(g, sorted, k, x);
        exact_records(g, w, pass, Scope::kAll, i0, i1, run.k0, run.k1);
        x = run.next;
      }
      if (g.summaries) {
        const int32_t vis = visible_blocks(g, i1);
        // With window sums the window record holds the blocks some rows see exactly, others as summaries.
        const int32_t left_hi = imin(vis, window_first(g, sums ? i0 : i1));
        const int32_t right_lo = window_last(g, sums ? i1 : i0) + 1;
        summary_records(g, w, pass, Scope::kSumLeft, i0, i1, 0, left_hi,
                        overlaps_retrieved(g, sorted, k, 0, left_hi), bands.on);
        summary_records(g, w, pass, Scope::kSumRight, i0, i1, right_lo, vis,
                        overlaps_retrieved(g, sorted, k, right_lo, vis), bands.on);
      }
    }
  }
  // Blocks straddling distance Hn (mixed_block): the blocks holding the class-change tokens m of the
  // tile's rows, m = i - Hn on the left and i + Hn + 1 on the right, one direct record per side.
  if (bands.on) {  // the Hn bands: every row sees every block of its side's band
    const uint8_t f = uint8_t(kRecDirect | kRecBand);
    const auto excl = [&](int32_t lo, int32_t hi) {
      return uint8_t(f | (overlaps_retrieved(g, sorted, k, lo, hi) ? kRecExclude : 0));
    };
    w.add(KeySet::kSumNat, QVar::kPlain, Scope::kMixedLeft, excl(bands.left_lo, bands.left_hi), bands.left_lo,
          bands.left_hi, g.log2_block);
    w.add(KeySet::kSumNat, QVar::kPlain, Scope::kMixedRight, excl(bands.right_lo, bands.right_hi), bands.right_lo,
          bands.right_hi, g.log2_block);
  } else if (method == Method::kRangeSwa && g.grouping && g.summaries && g.far_summaries) {
    const int32_t left_lo = imax(i0 - g.Hn, 1), left_hi = i1 - g.Hn;
    if (left_hi >= left_lo)
      w.add(KeySet::kSumNat, QVar::kPlain, Scope::kMixedLeft, kRecDirect, g.by_G.div(left_lo),
            g.by_G.div(left_hi) + 1, g.log2_block);
    const int32_t right_lo = i0 + g.Hn + 1, right_hi = imin(i1 + g.Hn + 1, g.L - 1);
    if (right_hi >= right_lo)
      w.add(KeySet::kSumNat, QVar::kPlain, Scope::kMixedRight, kRecDirect, g.by_G.div(right_lo),
            g.by_G.div(right_hi) + 1, g.log2_block);
  }
  return w.count;
}

// Control query rows see every control key and every body key (section 3): body keys rotated to
// j T / L with the bias -log(L / T) under the conditioning correction, else native. Their work is split
// over the body keys (split-K): chunk `chunk` of `chunk_keys` keys, the first chunk adding the control keys.
RSWA_HD int32_t plan_control_tile(const Geometry& g, int32_t chunk, int32_t chunk_keys, float body_bias_log2,
                                  Record* out) {
  PlanWriter w{out, 0};
  if (chunk == 0) w.add(KeySet::kCtrl, QVar::kPlain, Scope::kAll, 0, 0, g.C, 0.f);
  const int32_t a = chunk * chunk_keys, b = imin(g.L, a + chunk_keys);
  w.add(g.cond ? KeySet::kCond : KeySet::kNat, QVar::kPlain, Scope::kAll, 0, a, b, body_bias_log2);
  return w.count;
}

}  // namespace rangeswa::cuda
