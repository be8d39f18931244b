// Section 3's grouped positions, the one device home: the key of position j rotated to j / g (prepare.h:
// grouped_key_position, the vector lanes walking their keys with next_key_moves), a query i of a grouped variant
// rotated to i / g + c on the left and i / g - c on the right (c = Hn - Hn / g; tile.h variant_position), and the
// position classes of exact keys: within Hn of the row native, farther left grouped-left, farther right
// grouped-right (plan.h record_bounds and exact_records). by_g divides by g (plan.h FastDiv). Host and device code.
#pragma once

#include <cstdint>

#include "rules.h"

namespace rangeswa::cuda {

// Key j's grouped position j / g.
RSWA_HD int32_t grouped_key_position(int32_t g, int32_t j) { return j / g; }

// The same by g's divider `by_g`, and in `rem` the remainder j - g (j / g) (the start of a walk over keys).
template <typename Div>
RSWA_HD int32_t grouped_key_position(const Div& by_g, int32_t g, int32_t j, int32_t& rem) {
  const int32_t s = by_g.div(j);
  rem = j - s * g;
  return s;
}

// One key further in a walk from grouped_key_position: whether its grouped position is the next one (`rem` kept).
// g by reference: read at the compare, where the preparation's loop reads it (its SASS is as before the home).
RSWA_HD bool next_key_moves(int32_t& rem, const int32_t& g) {
  const bool moves = ++rem == g;
  if (moves) rem = 0;
  return moves;
}

// Query i's position in a grouped variant: i / g + c for the keys farther left than Hn (`left`), i / g - c for
// those farther right; g the plan's Geometry (by_g, c).
template <typename Geometry>
RSWA_HD int32_t grouped_query_position(const Geometry& g, int32_t i, bool left) {
  return left ? g.by_g.div(i) + g.c : g.by_g.div(i) - g.c;
}

// The position classes of row i's exact keys: grouped-left below native_first, native in
// [native_first, grouped_right_first), grouped-right from grouped_right_first.
RSWA_HD int32_t native_first(int32_t Hn, int32_t i) { return i - Hn; }
RSWA_HD int32_t grouped_right_first(int32_t Hn, int32_t i) { return i + Hn + 1; }

}  // namespace rangeswa::cuda
