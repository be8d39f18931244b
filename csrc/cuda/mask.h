// Per-element decisions of edge tiles (SPEC section 2 rules 2-4 and section 3 classes), from rules.h.
// A row's window and its "mixed" summary blocks are computed once per tile (RowCtx) so that the
// per-element tests are comparisons, never divisions.
#pragma once

#include <cstdint>

#include <cmath>

#include "attn_params.h"
#include "block.h"
#include "rules.h"

namespace rangeswa::cuda {

// One body query row of a tile.
struct RowCtx {
  int64_t i;                  // body row
  int64_t wf, wl;             // rule 2: its window blocks [wf, wl] (R.in_window(i, b) <=> wf <= b <= wl)
  int64_t win_lo, win_hi;     // the same window as tokens [wf * G, block_end(wl))
  int64_t mixed_block[2];     // its kMixed blocks on the left / right of i (-1: none)
  int64_t mixed_lo[2], mixed_hi[2];  // their tokens [lo, hi)
  int64_t visible_end;        // section 7: it sees body keys [0, visible_end) only
};

RSWA_HD RowCtx make_row_ctx(const Rules& R, int64_t i) {
  RowCtx c{};
  c.i = i;
  c.wf = R.window_first_block(i);
  c.wl = R.window_last_block(i);
  c.win_lo = R.block_start(c.wf);
  c.win_hi = R.block_end(c.wl);
  c.visible_end = R.visible_end(i);
  for (int side = 0; side < 2; ++side) {
    c.mixed_block[side] = -1;
    c.mixed_lo[side] = c.mixed_hi[side] = 0;
  }
  if (!R.grouping() || !R.far_summaries || !R.summaries) return c;  // mixed blocks are far: unseen then
  // A block is kMixed for i exactly when it holds both i - Hn - 1 and i - Hn (left) or both i + Hn and
  // i + Hn + 1 (right); one block can be both when G > 2 Hn + 1, and is then kept once (left).
  const int64_t left = i - R.Hn - 1, right = i + R.Hn + 1;
  if (left >= 0 && R.block_class(i, left / R.G) == BlockClass::kMixed) c.mixed_block[0] = left / R.G;
  if (right < R.L && right / R.G != c.mixed_block[0] && R.block_class(i, right / R.G) == BlockClass::kMixed)
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
  return R.summaries && (R.far_summaries || R.is_near(row.i, b));
}

// The class an element's score comes from: its pair's PosClass (exact keys) or its block's BlockClass.
RSWA_HD int element_class(const Rules& R, SegKind kind, const RowCtx& row, int64_t key) {
  return kind == SegKind::kSummary ? int(R.block_class(row.i, key)) : int(R.pos_class(row.i, key));
}

// Mixed-block pass: which of the row's mixed blocks body key j belongs to (0 left, 1 right, -1 none).
RSWA_HD int mixed_side(const RowCtx& row, int64_t j) {
  if (j >= row.mixed_lo[0] && j < row.mixed_hi[0]) return 0;
  if (j >= row.mixed_lo[1] && j < row.mixed_hi[1]) return 1;
  return -1;
}

// The base-2 bias every element of a tile gets: log2 G for summaries (rule 4), the conditioning
// shift for control rows scoring body keys (section 3), else 0.
RSWA_HD float tile_bias(const AttnKernelParams& p, const QueryTile& t, const KvTile& k) {
  if (k.kind == SegKind::kSummary) return p.log2_block;
  if (t.control && k.kind == SegKind::kBody) return p.control_bias_log2;
  return 0.f;
}

// The base-2 logit of element (row, key a + col) of an edge tile, -inf where the row does not see it.
// s: the raw q . k of the element's class; mixed: the row's two sums of mixed-block exact logits.
RSWA_HD float edge_logit(const AttnKernelParams& p, const QueryTile& t, const KvTile& k, const RowCtx& row, int col,
                         float s, const float* mixed) {
  const Rules& R = p.rules;
  if (k.check_count && col >= k.n) return -INFINITY;
  const int64_t key = k.a + col;
  if (k.kind == SegKind::kSummary) {
    // Section 7: a block starting past the row's visible end is dropped (the host admits no call in
    // which a summarised block is visible in part: attn_setup.h cuda_unsupported).
    if (k.check_causal && R.block_start(key) >= row.visible_end) return -INFINITY;
    if (k.check_visibility && !summary_visible(R, row, key, ((k.retrieved_mask >> col) & 1) != 0)) return -INFINITY;
    const float log2_n =
        k.check_last_block && key == R.num_summary_blocks() - 1 ? p.log2_last_block : p.log2_block;
    if (k.per_class && R.block_class(row.i, key) == BlockClass::kMixed) {
      const float mean = mixed[key == row.mixed_block[0] ? 0 : 1] / float(R.block_size(key));
      return mean * p.scale_log2 + log2_n;
    }
    return s * p.scale_log2 + log2_n;
  }
  if (k.kind == SegKind::kBody && k.check_causal && key >= row.visible_end) return -INFINITY;
  if (k.kind == SegKind::kBody && k.check_visibility && !body_key_visible(R, k.vis, row, key)) return -INFINITY;
  return s * p.scale_log2 + tile_bias(p, t, k);
}

}  // namespace rangeswa::cuda
