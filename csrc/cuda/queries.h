// The query rotations of a tile (SPEC section 3, rules.h PosClass): each pair of a body query row i
// and a key uses one of native (q at i), grouped-left (q at i/g + c), grouped-right (q at i/g - c) or,
// against the unrotated control keys under the conditioning correction, q at i T / L. Control query
// rows are never rotated. A tile keeps each rotation it needs in one shared-memory slot.
#pragma once

#include <cstdint>

#include "attn_params.h"
#include "block.h"
#include "rotary.h"
#include "rules.h"

namespace rangeswa::cuda {

enum class QueryRotation : uint8_t { kPlain, kNative, kLeft, kRight, kCond };

// Query row n of head `head` (= b * Hq + h) in q's own strides; the rows of a tile follow each other
// p.q_strides.row elements apart.
template <typename Element>
RSWA_HD const Element* query_row(const AttnKernelParams& p, int64_t head, int64_t n) {
  return static_cast<const Element*>(p.q) + p.q_strides.at(head / p.Hq, head % p.Hq, n);
}

// Element d of the tile's row r under rotation `rot`, unscaled (0 past the tile's rows and past D);
// x(e) reads element e of that row of q as float.
template <typename Load>
RSWA_HD float query_element(const AttnKernelParams& p, const QueryTile& t, QueryRotation rot, int r, int d,
                            const Load& x) {
  if (r >= t.nrows || d >= p.D) return 0.f;
  const Rules& R = p.rules;
  const int64_t i = t.i0 + r;
  // Table rows: native and conditioning at i; the grouped table starts at position -c, so
  // grouped-left (i/g + c) is row i/g + 2c and grouped-right (i/g - c) row i/g.
  switch (rot) {
    case QueryRotation::kNative:
      return rotated_element(x, d, p.rotary_half, p.interleaved, p.cos_nat + i * p.rotary_half,
                             p.sin_nat + i * p.rotary_half);
    case QueryRotation::kLeft: {
      const int64_t s = i / R.g + 2 * R.group_offset;
      return rotated_element(x, d, p.rotary_half, p.interleaved, p.cos_grp + s * p.rotary_half,
                             p.sin_grp + s * p.rotary_half);
    }
    case QueryRotation::kRight: {
      const int64_t s = i / R.g;
      return rotated_element(x, d, p.rotary_half, p.interleaved, p.cos_grp + s * p.rotary_half,
                             p.sin_grp + s * p.rotary_half);
    }
    case QueryRotation::kCond:
      return rotated_element(x, d, p.rotary_half, p.interleaved, p.cos_cond + i * p.rotary_half,
                             p.sin_cond + i * p.rotary_half);
    default:
      return x(d);
  }
}

// Slots: 0 native (plain for control rows), 1 grouped-left, 2 grouped-right. Under the conditioning
// correction slot 1 holds the conditioning rotation while the control keys are scored (they come
// first), and is rewritten with grouped-left before the first body key.
RSWA_HD QueryRotation initial_slot_rotation(const AttnKernelParams& p, const QueryTile& t, int slot) {
  if (slot == 0) return t.control ? QueryRotation::kPlain : QueryRotation::kNative;
  if (slot == 1 && p.cond_queries) return QueryRotation::kCond;
  return slot == 1 ? QueryRotation::kLeft : QueryRotation::kRight;
}

// Slots a tile fills (control rows need only the plain one).
RSWA_HD int tile_slots(const AttnKernelParams& p, const QueryTile& t) { return t.control ? 1 : p.num_q_slots; }

// The slot a GEMM pass of class `cls` (PosClass numbering) reads; slot1_cond: slot 1 still holds the
// conditioning rotation.
RSWA_HD int query_slot(const KvTile& k, int cls, bool slot1_cond) {
  if (k.kind == SegKind::kControl) return slot1_cond ? 1 : 0;
  return cls;
}

}  // namespace rangeswa::cuda
