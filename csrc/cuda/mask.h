// Per-element decisions of edge tiles (SPEC section 2 rules 2-4 and section 3 classes), from rules.h.
// A row's window and its "mixed" summary blocks are computed once per tile (RowCtx) so that the
// per-element tests are comparisons, never divisions.
#pragma once

#include <cstdint>

#include "rules.h"

namespace rangeswa::cuda {

// How a body segment's keys are seen: all exact, rule 2's block-aligned window (rangeswa), or the
// token window plus sinks (swa).
enum class Visibility : uint8_t { kAll = 0, kWindow = 1, kSwa = 2 };

// Position class of a whole G-block for row i (the CPU kernel's block_class). The first three equal
// PosClass (and select the query slot); kMixed: the block straddles distance Hn, so its summary logit
// is the mean of exact logits under each token's own class (docs/spec_decisions.md item 9).
enum class BlockClass : uint8_t { kNative = 0, kLeft = 1, kRight = 2, kMixed = 3 };

RSWA_HD BlockClass block_class(const Rules& R, int64_t i, int64_t b) {
  if (!R.grouping() || R.is_near(i, b)) return BlockClass::kNative;
  if (R.block_end(b) - 1 < i - R.Hn) return BlockClass::kLeft;
  if (R.block_start(b) > i + R.Hn) return BlockClass::kRight;
  return BlockClass::kMixed;
}

// One body query row of a tile.
struct RowCtx {
  int64_t i;                  // body row
  int64_t wf, wl;             // rule 2: its window blocks [wf, wl] (R.in_window(i, b) <=> wf <= b <= wl)
  int64_t win_lo, win_hi;     // the same window as tokens [wf * G, block_end(wl))
  int64_t mixed_block[2];     // its kMixed blocks on the left / right of i (-1: none)
  int64_t mixed_lo[2], mixed_hi[2];  // their tokens [lo, hi)
};

RSWA_HD RowCtx make_row_ctx(const Rules& R, int64_t i) {
  RowCtx c{};
  c.i = i;
  c.wf = R.window_first_block(i);
  c.wl = R.window_last_block(i);
  c.win_lo = R.block_start(c.wf);
  c.win_hi = R.block_end(c.wl);
  for (int side = 0; side < 2; ++side) {
    c.mixed_block[side] = -1;
    c.mixed_lo[side] = c.mixed_hi[side] = 0;
  }
  if (!R.grouping() || !R.far_summaries) return c;  // mixed blocks are never near, so never seen then
  // A block is kMixed for i exactly when it holds both i - Hn - 1 and i - Hn (left) or both i + Hn and
  // i + Hn + 1 (right); one block can be both when G > 2 Hn + 1, and is then kept once (left).
  const int64_t left = i - R.Hn - 1, right = i + R.Hn + 1;
  if (left >= 0 && block_class(R, i, left / R.G) == BlockClass::kMixed) c.mixed_block[0] = left / R.G;
  if (right < R.L && right / R.G != c.mixed_block[0] && block_class(R, i, right / R.G) == BlockClass::kMixed)
    c.mixed_block[1] = right / R.G;
  for (int side = 0; side < 2; ++side)
    if (c.mixed_block[side] >= 0) {
      c.mixed_lo[side] = R.block_start(c.mixed_block[side]);
      c.mixed_hi[side] = R.block_end(c.mixed_block[side]);
    }
  return c;
}

// Whether row `row` sees body key j exactly, for a segment of visibility `vis` (rules 2 and 5, swa).
RSWA_HD bool body_key_visible(const Rules& R, Visibility vis, const RowCtx& row, int64_t j) {
  if (vis == Visibility::kWindow) return j >= row.win_lo && j < row.win_hi;  // R.in_window(i, j / G)
  if (vis == Visibility::kSwa) return R.token_role(row.i, j) == Role::kExact;
  return true;
}

// Rule 4: whether row `row` sees G-block b as a summary; R.block_role(i, b, retrieved) == kSummary.
RSWA_HD bool summary_visible(const Rules& R, const RowCtx& row, int64_t b, bool retrieved) {
  const bool in_window = b >= row.wf && b <= row.wl;
  if (in_window || retrieved) return false;
  return R.far_summaries || R.is_near(row.i, b);
}

}  // namespace rangeswa::cuda
