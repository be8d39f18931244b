// What one warp does with one KV tile of a record (plan.h), and the walk over a CTA's records in KV
// tiles. Host and device code: the attention kernels (sm80/, sm90/) and the plan census (emulator/
// plan_emulator.cu plan_stats) share every decision here, so the census counts the kernel's own choices.
//
// A warp owns 32 query rows. In the kernel's masked loop each row keeps its bounds [lo, hi) in the record
// (record_bounds), and per KV tile [a, a + n) the warp picks, by two votes of its rows, one of
//   kSkip    no row of the warp sees a key of the tile: no MMA at all;
//   kFull    every row sees every key of the tile: FlashAttention's unmasked path (scale, bias);
//   kMasked  rows differ: per element, lo <= key < hi (two int32 compares).
// Independently of the rows, a tile may have column fix-ups, the same for every row: columns past its
// keys (a short tile), retrieved G-blocks of a summary record (exclusion_bits) and the ragged last
// G-block's bias; they cost one select per element on either path.
#pragma once

#include <climits>
#include <cmath>
#include <cstdint>

#include "plan.h"

namespace rangeswa::cuda {

enum class TileWork : uint8_t { kSkip = 0, kFull = 1, kMasked = 2 };

// One KV tile of a record: keys [a, a + n) of the record's array, `width` columns (n < width: the
// rest are zero rows that no row sees), and its G-block exclusion mask (summary records).
struct KvTile {
  int32_t record;  // index in the CTA's record list
  int32_t a, n, width;
  uint64_t excluded;
  int32_t kind;  // body tiles (SpanCursor): 2 x its query variant's fill slot + 1 when masked; -1: none
  bool cont;  // body tiles (SpanCursor): the tile continues the run of the tile before it (its loop goes on)
};

RSWA_HD bool summary_keys(const Record& r) {
  return KeySet(r.keys) == KeySet::kSumNat || KeySet(r.keys) == KeySet::kSumGrp;
}

// The column of the ragged last G-block's summary in a tile (its bias is log2 n_b, not log2 G), or -1
// (summary_bias.h ragged_summary_column).
RSWA_HD int32_t ragged_column(const Geometry& g, const Record& r, const KvTile& t) {
  return ragged_summary_column(summary_keys(r), g, t);
}

// A row's part in its warp's choice for tile t (rows past the tile's end take none): whether it sees every
// key of the tile, and whether it sees any.
// [gate:row-sees-all begin]
RSWA_HD bool row_sees_all(const Bounds& b, const KvTile& t, bool row) { return !row || (b.lo <= t.a && t.a + t.n <= b.hi); }
// [gate:row-sees-all end]
// [gate:row-sees-any begin]
RSWA_HD bool row_sees_any(const Bounds& b, const KvTile& t, bool row) {
  return row && b.lo < b.hi && b.lo < t.a + t.n && t.a < b.hi;
}
// [gate:row-sees-any end]

// A warp's work on tile t of record r from two votes of its rows: skip when no row sees a key of it, full
// when every row sees all of it, else masked. In a window record with its edges' summaries (plan.h
// window_sums) every row sees every key, exactly or in its G-block's mean, so no tile is skipped (common/logits.h
// tile_logits takes the G-block means on a masked tile).
// [gate:classify begin]
RSWA_HD TileWork classify(bool all, bool any, const Record& r) {
  if (!any) return (r.flags & kRecWindowSums) ? TileWork::kMasked : TileWork::kSkip;
  return all ? TileWork::kFull : TileWork::kMasked;
}
// [gate:classify end]

// Whether some columns of the tile differ from the rest for every row alike: past the keys (n < width),
// retrieved G-blocks of a summary record, or the ragged last G-block's bias.
// [gate:has-column-fixups begin]
RSWA_HD bool has_column_fixups(const KvTile& t, int32_t ragged) {
  return t.n < t.width || t.excluded != 0 || ragged >= 0;
}
// [gate:has-column-fixups end]

// The KV tiles of a CTA's records in record order: `width` columns each (kCtrlCols for control keys and for
// the direct records of straddling blocks). The control walk's cursor (body CTAs walk their spans:
// SpanCursor); the census counts a body CTA's tiles with it to check its spans hold each once.
struct TileCursor {
  int32_t record = 0, next = 0;

  template <int kBlockN, int kCtrl>
  RSWA_HD bool advance(const Geometry& g, const Record* records, int32_t count, const int32_t* sorted, int32_t k,
                       KvTile& out) {
    while (record < count) {
      const Record& r = records[record];
      const int32_t a = r.k0 + next;
      if (a < r.k0 + r.n) {
        const int32_t width = KeySet(r.keys) == KeySet::kCtrl || (r.flags & kRecDirect) ? kCtrl : kBlockN;
        out.record = record;
        out.a = a;
        out.n = imin(width, r.k0 + r.n - a);
        out.width = width;
        out.excluded = (r.flags & kRecExclude) ? exclusion_bits(g, sorted, k, a, out.n) : 0;
        out.kind = 0;
        next += width;
        return true;
      }
      ++record;
      next = 0;
    }
    out.n = 0;  // no keys (its record stays a valid index): a copy of it only zero-fills
    return false;
  }
};

// The fill order of the query slot (the order of plan_body_tile's records), and a variant's place in it.
RSWA_HD QVar variant_at(int32_t slot) {
  return slot == 0 ? QVar::kCond : slot == 1 ? QVar::kLeft : slot == 2 ? QVar::kNat : slot == 3 ? QVar::kRight
                                                                                                : QVar::kPlain;
}
inline constexpr int32_t kVariantSlots = 5;
RSWA_HD int32_t variant_slot(QVar v) {
  return v == QVar::kCond ? 0 : v == QVar::kLeft ? 1 : v == QVar::kNat ? 2 : v == QVar::kRight ? 3 : 4;
}

// The columns of a record's KV tiles: kCtrl (control keys, and the direct records of straddling blocks and
// Hn bands) or the kernel's KV tile.
RSWA_HD int32_t record_width(const Record& r, int32_t tile_cols, int32_t ctrl_cols) {
  return KeySet(r.keys) == KeySet::kCtrl || (r.flags & kRecDirect) ? ctrl_cols : tile_cols;
}

// --- tile spans: the plan's per-tile descriptors ------------------------------------------------------
//
// The plan kernel sorts a body CTA's KV tiles into the kernel's two loops, FlashAttention-2's shape: the
// unmasked loop takes the tiles every row of the CTA sees whole with no column fix-up (no bounds, no
// selects, no warp reduction), the masked loop the rest (per warp: skip, full or masked, and the column
// fix-ups). A span is a run of consecutive tiles of one record that go to the same loop. Per query
// variant (the slot is filled once per variant), the variant's unmasked spans come first, then its
// masked ones: the softmax is the same in any order of tiles, up to rounding.
struct TileSpan {
  int32_t a, end;   // keys [a, end) of the record's array, in tiles of `width` keys from a
  int16_t record;   // index in the CTA's record list
  uint8_t kind;     // 2 x the record's query variant's fill slot (variant_slot) + 1 for the masked loop
  uint8_t width;    // the record's tile width (record_width)
  uint8_t run;      // 1: the first span of a run of its kind (the span before it has another kind)
  uint8_t from;     // the first fill slot the query slot may need before the span: the span before it's slot + 1
  int16_t unused;
};
static_assert(sizeof(TileSpan) == 16, "spans are 16 bytes");

// Whether a tile of record r goes to the masked loop, given [lo, hi), the keys every row of the CTA sees:
// a 16-column tile (control keys, direct records: their own code), a tile not seen whole by every row, or
// one with column fix-ups.
RSWA_HD bool masked_tile(const Geometry& g, const Record& r, int32_t lo, int32_t hi, const KvTile& t) {
  if (t.width != g.tile_cols) return true;
  return !(lo <= t.a && t.a + t.n <= hi) || has_column_fixups(t, ragged_column(g, r, t));
}

// The spans of a body tile's records (rows [i0, i0 + nrows), retrieved blocks `sorted`), at most `capacity`
// (plan.h max_spans, at least `count`); returns their count. A record's bounds are nondecreasing in the row
// at both ends (record_bounds: maxima and minima of nondecreasing functions of i), so the keys every row sees
// are [lo of the last row, hi of the first row), empty when some row sees nothing; direct records (whose
// bounds are a row's own straddling block) are 16-column tiles, masked anyway. A record whose runs would
// leave fewer spans than the records after it goes to the masked loop whole, as one span.
RSWA_HD int32_t plan_spans(const Geometry& g, const Record* records, int32_t count, const int32_t* sorted, int32_t k,
                           int32_t i0, int32_t nrows, TileSpan* out, int32_t capacity, int32_t ctrl_cols) {
  const RowGeometry first = row_geometry(g, i0, sorted, k), last = row_geometry(g, i0 + nrows - 1, sorted, k);
  int32_t n = 0;
  auto emit = [&](int32_t record, int32_t a, int32_t end, bool masked) {
    const Record& r = records[record];
    const int kind = 2 * variant_slot(QVar(r.qvar)) + int(masked), before = n > 0 ? out[n - 1].kind : -1;
    if (n < capacity)
      out[n] = TileSpan{a, end, int16_t(record), uint8_t(kind), uint8_t(record_width(r, g.tile_cols, ctrl_cols)),
                        uint8_t(kind != before), uint8_t(before < 0 ? 0 : (before >> 1) + 1), 0};
    ++n;
  };
  // Record z's runs of tiles of one loop, in order: walk(z, f) calls f(a, end, masked) per run; returns
  // their count.
  auto walk = [&](int32_t z, auto&& f) {
    const Record& r = records[z];
    const int32_t width = record_width(r, g.tile_cols, ctrl_cols), end = r.k0 + r.n;
    const bool direct = (r.flags & kRecDirect) != 0;
    const int32_t lo = direct ? 0 : record_bounds(g, r, last, i0 + nrows - 1).lo;
    const int32_t hi = direct ? 0 : record_bounds(g, r, first, i0).hi;
    int32_t from = r.k0, runs = 0;
    bool run = true;
RSWA_ROLLED
    for (int32_t a = r.k0; a < end; a += width) {
      KvTile t{z, a, imin(width, end - a), width, 0, 0, false};
      t.excluded = (r.flags & kRecExclude) ? exclusion_bits(g, sorted, k, a, t.n) : 0;
      const bool masked = masked_tile(g, r, lo, hi, t);
      if (a > r.k0 && masked != run) {
        f(from, a, run);
        ++runs;
        from = a;
      }
      run = masked;
    }
    if (end > r.k0) {
      f(from, end, run);
      ++runs;
    }
    return runs;
  };
RSWA_ROLLED
  for (int32_t x = 0; x < count;) {
    int32_t y = x + 1;  // records [x, y): one query variant
    while (y < count && records[y].qvar == records[x].qvar) ++y;
    const int32_t before = n;
RSWA_ROLLED
    for (int pass = 0; pass < 2; ++pass) {  // unmasked spans, then masked ones
      int32_t used = before;  // the spans of the group's records so far, as decided (the same in both passes)
RSWA_ROLLED
      for (int32_t z = x; z < y; ++z) {
        const int32_t runs = walk(z, [](int32_t, int32_t, bool) {});
        const bool whole = used + runs + (count - 1 - z) > capacity;  // leaves one span per later record
        used += whole ? 1 : runs;
        if (whole) {
          if (pass == 1 && records[z].n > 0) emit(z, records[z].k0, records[z].k0 + records[z].n, true);
        } else {
          walk(z, [&](int32_t a, int32_t end, bool masked) {
            if (int(masked) == pass) emit(z, a, end, masked);
          });
        }
      }
    }
    x = y;
  }
  return n;
}

// The KV tiles of a body CTA in the order of its spans (the kernel's and the census's walk). Every span
// holds at least one tile, so a step moves on by at most one span: no loop. Past the last tile it leaves a
// tile of no keys (kind -1, its record a valid index), whose copy only zero-fills.
struct SpanCursor {
  int32_t span = 0, next = 0;

  // The next tile, `cont` when it continues the run of the tile before it (a later tile of the same span,
  // or the first of a span that starts no run). Past the last tile: a tile of no keys, kind -1, whose copy
  // only zero-fills (record 0: there is one when there was a tile before it).
  RSWA_HD bool advance(const TileSpan* spans, int32_t count, KvTile& out) {
    while (span < count) {
      const TileSpan s = spans[span];
      const int32_t a = s.a + next;
      if (a < s.end) {
        out.record = s.record;
        out.a = a;
        out.n = imin(s.width, s.end - a);
        out.width = s.width;
        out.excluded = 0;  // the masked loop's (exclusion_bits): the unmasked loop has none
        out.kind = s.kind;
        out.cont = next > 0 || !s.run;
        next += s.width;
        return true;
      }
      ++span;
      next = 0;
    }
    out.record = 0;
    out.a = 0;
    out.n = 0;
    out.width = 0;
    out.excluded = 0;
    out.kind = -1;
    out.cont = false;
    return false;
  }
  // The kind of the tile the last advance gave and `from`, the first fill slot the query slot may need
  // before its run (the run before it's slot + 1; past the last tile, the last span's slot + 1: the variants
  // straddling blocks may still need), read again from its span: the kernel keeps neither in a register
  // across the tiles.
  RSWA_HD void run(const TileSpan* spans, int32_t count, int32_t& kind, int32_t& from) const {
    const TileSpan s = spans[imin(span, imax(count - 1, 0))];  // read in bounds, used below `count`
    kind = span < count ? s.kind : -1;
    from = span < count ? s.from : count > 0 ? (s.kind >> 1) + 1 : 0;
  }
};

// The query variants a body tile fills, in the records' order (plan_body_tile): a variant is filled when
// a record scores with it or a row's straddling block needs it (straddling.h mixed_block: nat and left on the
// left, nat and right on the right; the direct records come last, after every fill).
RSWA_HD uint32_t variants_needed(const Record* records, int32_t count, bool mixed_left, bool mixed_right) {
  uint32_t mask = 0;
RSWA_ROLLED
  for (int32_t x = 0; x < count; ++x) {
    const Record& r = records[x];
    if (!(r.flags & kRecDirect)) mask |= 1u << r.qvar;
    if (r.flags & kRecBand)  // an Hn band: native products for its near blocks, its side's for the far ones
      mask |= (1u << int(QVar::kNat)) | (1u << int(Scope(r.scope) == Scope::kMixedLeft ? QVar::kLeft : QVar::kRight));
  }
  if (mixed_left) mask |= (1u << int(QVar::kNat)) | (1u << int(QVar::kLeft));
  if (mixed_right) mask |= (1u << int(QVar::kNat)) | (1u << int(QVar::kRight));
  return mask;
}

// The Hn band records of a CTA (plan.h hn_bands; at most one per side), as the kernel keeps them.
struct BandRecords {
  int32_t k0[2], n[2];  // G-blocks [k0, k0 + n) per side (n = 0: none)

  RSWA_HD static BandRecords find(const Record* records, int32_t count) {
    BandRecords b{{0, 0}, {0, 0}};
RSWA_ROLLED
    for (int32_t x = 0; x < count; ++x)
      if (records[x].flags & kRecBand) {
        const bool left = Scope(records[x].scope) == Scope::kMixedLeft;
        (left ? b.k0[0] : b.k0[1]) = records[x].k0;
        (left ? b.n[0] : b.n[1]) = records[x].n;
      }
    return b;
  }
  // Per side without indexing by a run-time value (which would put the arrays in local memory).
  RSWA_HD int32_t first(int side) const { return side == 0 ? k0[0] : k0[1]; }
  RSWA_HD int32_t blocks(int side) const { return side == 0 ? n[0] : n[1]; }
  // Whether variant v gives some blocks of the band on `side` their scores: the native one for near
  // blocks, the side's grouped one for far blocks.
  RSWA_HD bool uses(int side, QVar v) const {
    return blocks(side) > 0 && (v == QVar::kNat || v == (side == 0 ? QVar::kLeft : QVar::kRight));
  }
};


// The position a query variant rotates body row i to (section 3; the conditioning variant reads its own
// table at row i, the plain one is not rotated).
RSWA_HD int32_t variant_position(const Geometry& g, QVar v, int32_t i) {
  if (v == QVar::kLeft) return grouped_query_position(g, i, true);
  if (v == QVar::kRight) return grouped_query_position(g, i, false);
  return i;
}

}  // namespace rangeswa::cuda
