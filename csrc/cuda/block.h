// Which KV tiles a query tile visits (SPEC section 2), and what each tile needs done per element.
//
// A query tile is up to kBlockM body rows inside one query block (so they share their retrieved
// blocks), or up to kBlockM control rows. Its keys are a list of segments, walked in this order in
// tiles of kBlockN keys:
//   control  control keys [0, C)                            rule 1
//   sinks    body tokens [0, min(S, lo))                    swa sinks left of the window
//   mixed    body tokens around distance Hn (left, right)   rule 4 blocks straddling Hn (no softmax:
//                                                            their exact logits are summed per block)
//   body     full / self_extend: [0, L); swa: its token window; rangeswa: the union of the tile's
//            block-aligned windows (rule 2, masked per row); control rows: [0, L)
//   retrieved  one segment per rule-3 block of the query block (rangeswa)
//   summary  G-blocks left and right of the blocks every row sees exactly (rule 4, rangeswa)
// Segments never overlap, so every key (exact or summary) enters the softmax at most once per row.
#pragma once

#include <cstdint>

#include "attn_params.h"
#include "rules.h"

namespace rangeswa::cuda {

enum class SegKind : uint8_t { kControl = 0, kBody = 1, kMixed = 2, kSummary = 3 };

// How a body segment's keys are seen: all exact, rule 2's block-aligned window (rangeswa), or the
// token window plus sinks (swa).
enum class Visibility : uint8_t { kAll = 0, kWindow = 1, kSwa = 2 };

// Keys [begin, end): control indices, body tokens or G-blocks by kind.
struct Segment {
  int64_t begin, end;
  SegKind kind;
  Visibility vis;
};

// Fixed segments, stored in shared memory; the retrieved ones are read from `retrieved` on the fly.
enum : int { kSegControl = 0, kSegSinks, kSegMixedLeft, kSegMixedRight, kSegBody, kSegSummaryLeft,
             kSegSummaryRight, kNumFixedSegments };

// Bits of KvTile::classes: one GEMM pass per query class present (PosClass / BlockClass numbering).
enum : uint8_t { kNativeBit = 1, kLeftBit = 2, kRightBit = 4 };

struct QueryTile {
  bool control;    // control rows [i0, i0 + nrows) of [0, C); else body rows
  int64_t i0, i1;  // first and last row
  int64_t qb;      // query block of body rows
  int nrows;
  // Section 7: body keys [0, seen_by_all) are visible to every row of the tile, [0, seen_by_any) to
  // some (both L without a causal block, and for control rows).
  int64_t seen_by_all, seen_by_any;
  // rangeswa: window blocks of the first and last row, and the tokens every row sees in its window
  int64_t wf0, wl0, wf1, wl1, window_all_lo, window_all_hi;
};

template <int kBlockM>
RSWA_HD QueryTile query_tile(const AttnKernelParams& p, int64_t tile) {
  const Rules& R = p.rules;
  QueryTile t{};
  if (tile < p.control_tiles) {
    t.control = true;
    t.i0 = tile * kBlockM;
    t.nrows = int(min64(kBlockM, p.C - t.i0));
  } else {
    const int64_t bt = tile - p.control_tiles;
    t.qb = p.first_tile_query_block + bt / p.tiles_per_query_block;
    const int64_t end = min64(p.L, (t.qb + 1) * p.tile_query_block);
    t.i0 = max64(t.qb * p.tile_query_block, p.first_row) + (bt % p.tiles_per_query_block) * kBlockM;
    t.nrows = int(max64(0, min64(kBlockM, end - t.i0)));
  }
  t.i1 = t.i0 + t.nrows - 1;
  t.seen_by_all = t.seen_by_any = p.L;
  if (!t.control && t.nrows > 0) {
    t.seen_by_all = R.visible_end(t.i0);
    t.seen_by_any = R.visible_end(t.i1);
  }
  if (!t.control && t.nrows > 0 && R.method == Method::kRangeSwa) {
    t.wf0 = R.window_first_block(t.i0);
    t.wl0 = R.window_last_block(t.i0);
    t.wf1 = R.window_first_block(t.i1);
    t.wl1 = R.window_last_block(t.i1);
    t.window_all_lo = R.block_start(t.wf1);
    t.window_all_hi = R.block_end(t.wl0);
  }
  return t;
}

// The fixed segments of a query tile (one thread writes them to shared memory).
RSWA_HD void build_segments(const AttnKernelParams& p, const QueryTile& t, Segment* seg) {
  const Rules& R = p.rules;
  for (int s = 0; s < kNumFixedSegments; ++s) seg[s] = Segment{0, 0, SegKind::kBody, Visibility::kAll};
  seg[kSegControl] = Segment{0, p.C, SegKind::kControl, Visibility::kAll};
  // Section 7: keys from t.seen_by_any on are invisible to every row (no segment reaches them).
  if (t.control || R.method == Method::kFull || R.method == Method::kSelfExtend) {
    seg[kSegBody] = Segment{0, t.seen_by_any, SegKind::kBody, Visibility::kAll};
    return;
  }
  if (R.method == Method::kSwa) {
    // Sinks left of the window are all seen; the window segment reaches at least to the last sink so
    // that sinks right of lo come with it (masked per element) even when the radius (W - S) / 2 < 0.
    const int64_t lo = max64(0, t.i0 - R.radius), hi = min64(t.seen_by_any, t.i1 + R.radius + 1);
    const int64_t sinks_end = min64(R.sinks, t.seen_by_any);
    seg[kSegSinks] = Segment{0, min64(sinks_end, lo), SegKind::kBody, Visibility::kAll};
    seg[kSegBody] = Segment{lo, max64(hi, sinks_end), SegKind::kBody, Visibility::kSwa};
    return;
  }
  // rangeswa
  seg[kSegBody] = Segment{R.block_start(t.wf0), max64(R.block_start(t.wf0), min64(R.block_end(t.wl1), t.seen_by_any)),
                          SegKind::kBody, Visibility::kWindow};
  // Mixed blocks exist for far summaries under grouping (when the window reaches past Hn they all lie
  // inside their row's window and need no pass). The left and right runs may overlap when Hn is small
  // against the tile, so the right one starts where the left one ends: each logit is added once.
  if (R.grouping() && R.summaries && R.far_summaries && R.radius < R.Hn + 1) {
    const int64_t left_last = t.i1 - R.Hn - 1, right_first = t.i0 + R.Hn + 1;
    int64_t left_end = 0;
    if (left_last >= 0) {
      left_end = R.block_end(left_last / R.G);
      seg[kSegMixedLeft] = Segment{R.block_start(max64(0, t.i0 - R.Hn - 1) / R.G), left_end, SegKind::kMixed,
                                   Visibility::kAll};
    }
    if (right_first < p.L) {
      const int64_t begin = max64(left_end, R.block_start(right_first / R.G));
      const int64_t end = R.block_end(min64(p.L - 1, t.i1 + R.Hn + 1) / R.G);
      seg[kSegMixedRight] = Segment{begin, max64(begin, end), SegKind::kMixed, Visibility::kAll};
    }
  }
  // Summaries: every block unless far summaries are off (then only blocks near some row), minus the
  // blocks [wf1, wl0] inside every row's window.
  const int64_t nG = R.num_summary_blocks();
  int64_t lo = 0, hi = R.summaries ? ceil_div(t.seen_by_any, R.G) - 1 : -1;  // blocks with a key some row sees
  if (!R.far_summaries) {
    lo = R.far_left_end(t.i0);
    hi = min64(hi, R.far_right_begin(t.i1) - 1);
  }
  const int64_t left_end = min64(hi, t.wf1 - 1) + 1, right_begin = max64(lo, max64(t.wl0 + 1, t.wf1));
  seg[kSegSummaryLeft] = Segment{lo, max64(lo, left_end), SegKind::kSummary, Visibility::kAll};
  seg[kSegSummaryRight] = Segment{right_begin, max64(right_begin, hi + 1), SegKind::kSummary, Visibility::kAll};
}

// The segment list of one tile: fixed segments in shared memory, then the retrieved blocks.
struct SegmentList {
  const Segment* fixed;
  const int32_t* retrieved;  // this tile's row of rule-3 blocks, or null
  int64_t retrieved_k;

  RSWA_HD int64_t count() const { return kNumFixedSegments + retrieved_k; }

  // Order: control, sinks, mixed left/right, body, retrieved..., summary left/right.
  RSWA_HD Segment at(const Rules& R, int64_t s) const {
    if (s <= kSegBody) return fixed[s];
    if (s < kSegSummaryLeft + retrieved_k) return retrieved_segment(R, s - kSegSummaryLeft);
    return fixed[s - retrieved_k];
  }

  RSWA_HD Segment retrieved_segment(const Rules& R, int64_t x) const {
    const int64_t kb = retrieved[x];
    if (kb < 0) return Segment{0, 0, SegKind::kBody, Visibility::kAll};
    return Segment{kb * R.Rb, min64(R.L, kb * R.Rb + R.Rb), SegKind::kBody, Visibility::kAll};
  }

  // Bit x set: summary block b0 + x (x < n) lies in a retrieved key block (rule 3, exact for every row).
  RSWA_HD uint64_t retrieved_mask(const Rules& R, int64_t b0, int n) const {
    uint64_t mask = 0;
    const int64_t per = R.Rb / R.G;  // G-blocks per key block
    for (int64_t x = 0; x < retrieved_k; ++x) {
      const int64_t kb = retrieved[x];
      if (kb < 0) continue;
      const int64_t lo = max64(kb * per, b0), hi = min64(min64(kb * per + per, R.num_summary_blocks()), b0 + n);
      if (lo >= hi) continue;
      const int bits = int(hi - lo);
      mask |= (bits >= 64 ? ~0ull : ((1ull << bits) - 1)) << (lo - b0);
    }
    return mask;
  }
};

// One KV tile: keys [a, a + n) of a segment, and which per-element work it needs. Interior tiles
// (every flag false, one class) only scale their logits.
struct KvTile {
  SegKind kind;
  Visibility vis;
  int64_t a;
  int n;
  uint8_t classes;          // GEMM passes (kNativeBit | kLeftBit | kRightBit)
  bool per_class;           // elements pick their class; summaries may be kMixed
  bool check_count;         // n < kBlockN: columns past n are not keys
  bool check_visibility;    // per-element rule 2 / swa / rule 4 roles
  bool check_last_block;    // holds the ragged last G-block (its own log2 n_b)
  bool check_causal;        // section 7: some key (or block) lies past some row's visible end
  uint64_t retrieved_mask;  // summary tiles: see SegmentList::retrieved_mask

  // Edge tiles decide per element (mask.h edge_logit); interior tiles only scale and add their bias.
  RSWA_HD bool edge() const { return check_count || check_visibility || per_class || check_last_block || check_causal; }
};

// The prepared array (attn_params.h) and first row holding a tile's keys for one GEMM pass.
enum class KeyArray : uint8_t { kNative = 0, kGrouped = 1, kCond = 2 };
struct RowRef {
  KeyArray array;
  int64_t row;
};

RSWA_HD RowRef key_rows(const AttnKernelParams& p, const QueryTile& t, const KvTile& k, bool grouped) {
  if (k.kind == SegKind::kControl) return RowRef{KeyArray::kNative, k.a};
  if (k.kind == SegKind::kSummary)
    return grouped ? RowRef{KeyArray::kGrouped, p.L + k.a} : RowRef{KeyArray::kNative, p.C + p.L + k.a};
  if (t.control && p.keys_cond != nullptr) return RowRef{KeyArray::kCond, k.a};  // control rows, section 3
  return grouped ? RowRef{KeyArray::kGrouped, k.a} : RowRef{KeyArray::kNative, p.C + k.a};
}

// First row of `values` holding a tile's values (control, body, or summary values).
RSWA_HD int64_t value_row(const AttnKernelParams& p, const KvTile& k) {
  if (k.kind == SegKind::kControl) return k.a;
  if (k.kind == SegKind::kSummary) return p.C + p.L + k.a;
  return p.C + k.a;
}

// The first GEMM pass of a tile is native when present, else grouped (which K copy to prefetch).
RSWA_HD bool first_pass_grouped(const KvTile& k) { return (k.classes & kNativeBit) == 0; }

// Cursor over the segments: the next key of segment `seg`.
struct KvCursor {
  int64_t seg = 0;
  int64_t next = 0;
};

template <int kBlockN>
RSWA_HD KvTile describe_tile(const AttnKernelParams& p, const QueryTile& t,
                                                const SegmentList& segs, const Segment& s, int64_t a, int n) {
  const Rules& R = p.rules;
  KvTile k{};
  k.kind = s.kind;
  k.vis = s.vis;
  k.a = a;
  k.n = n;
  k.check_count = n < kBlockN;
  k.classes = kNativeBit;
  const int64_t last = a + n - 1;
  if ((s.kind == SegKind::kBody || s.kind == SegKind::kMixed) && !t.control) {
    if (R.grouping()) {  // R.pos_class(i, j) over rows [i0, i1] x keys [a, last]
      const bool left = a < t.i1 - R.Hn, right = last > t.i0 + R.Hn;
      const bool native = last >= t.i0 - R.Hn && a <= t.i1 + R.Hn;
      k.classes = uint8_t((native ? kNativeBit : 0) | (left ? kLeftBit : 0) | (right ? kRightBit : 0));
      k.per_class = int(native) + int(left) + int(right) > 1;
    }
    if (s.vis == Visibility::kWindow) {
      k.check_visibility = !(a >= t.window_all_lo && last < t.window_all_hi);
    } else if (s.vis == Visibility::kSwa) {  // swa_sees for all pairs: all sinks, or all within the radius
      k.check_visibility = !(last < R.sinks || (t.i1 - a <= R.radius && last - t.i0 <= R.radius));
    }
  } else if (s.kind == SegKind::kSummary) {
    // The extreme pairs decide for the whole tile: is_near is tightest for (i1, a) and (i0, last).
    const bool all_near = R.is_near(t.i1, a) && R.is_near(t.i0, last);
    if (R.grouping() && !all_near) {
      const bool all_left = R.block_class(t.i0, last) == BlockClass::kLeft;
      const bool all_right = R.block_class(t.i1, a) == BlockClass::kRight;
      if (all_left) {
        k.classes = kLeftBit;
      } else if (all_right) {
        k.classes = kRightBit;
      } else {
        k.per_class = true;
        k.classes = uint8_t(kNativeBit | (R.block_class(t.i1, a) == BlockClass::kLeft ? kLeftBit : 0) |
                            (R.block_class(t.i0, last) == BlockClass::kRight ? kRightBit : 0));
      }
    }
    k.retrieved_mask = segs.retrieved_mask(R, a, n);
    const bool window_overlap = a <= t.wl1 && last >= t.wf0;
    k.check_visibility = window_overlap || k.retrieved_mask != 0 || (!R.far_summaries && !all_near);
    k.check_last_block = last == R.num_summary_blocks() - 1 && R.block_size(last) != R.G;
    k.check_causal = R.block_start(last) >= t.seen_by_all;
  }
  if (s.kind == SegKind::kBody && !t.control) k.check_causal = last >= t.seen_by_all;
  return k;
}

// Advances to the next non-empty KV tile; false when the tile's keys are exhausted.
template <int kBlockN>
RSWA_HD bool next_kv_tile(const AttnKernelParams& p, const QueryTile& t, const SegmentList& segs,
                                             KvCursor& cur, KvTile& out) {
  const Rules& R = p.rules;
  while (cur.seg < segs.count()) {
    const Segment s = segs.at(R, cur.seg);
    const int64_t start = max64(cur.next, s.begin);
    if (start < s.end) {
      const int n = int(min64(kBlockN, s.end - start));
      cur.next = start + n;
      out = describe_tile<kBlockN>(p, t, segs, s, start, n);
      return true;
    }
    ++cur.seg;
    cur.next = 0;
  }
  return false;
}

}  // namespace rangeswa::cuda
