// Rule 4 for the G-blocks straddling distance Hn (SPEC decision 9), the one device home: which block of a row
// straddles and the token where its class changes (mixed_block: plan.h row_geometry keeps them per row), the
// in-block exclusive prefix sums the preparation writes for it (prefix_restarts, prefix_step: prepare.h, both
// loops) and its logit from the parts the kernels' dot products give (straddling_score: sm80/mainloop.h,
// sm90/consumer.h; the products themselves, one term of the formula below each, are each kernel's loads in
// common/query_slot.h straddling_dots). Host and device code.
//
// A G-block b holding tokens on both sides of distance Hn from row i (rules.h kMixed) is a summary whose logit
// is the mean of its exact logits, each under its own class. With the in-block exclusive prefix sums
// P[m] = the sum of the block's keys before token m (prepared per array: P_nat of R(j) k_j, P_grp of R(j / g) k_j)
// and the block means S[b], that mean is, n_b the block's tokens,
//   left  (tokens before m = i - Hn grouped):        q_nat . S_nat[b] + (q_left . P_grp[m] - q_nat . P_nat[m]) / n_b
//   right (tokens from  m = i + Hn + 1 grouped):     q_right . S_grp[b] + (q_nat . P_nat[m] - q_right . P_grp[m]) / n_b
// so the kernel scores each such block with three dot products per row (the whole block's term and the parts
// over n_b), and the plan's direct records (kRecDirect) fold it into the softmax like any key, with no Q K^T.
#pragma once

#include <cstdint>

#include "rules.h"

namespace rangeswa::cuda {

struct MixedBlock {
  int32_t block;  // -1: none on this side
  int32_t m;      // the token where the class changes
};

// Row i's block straddling distance Hn on `side` (0 left, 1 right) when the row sees it as a summary, and the
// token m where its class changes: i - Hn on the left (the tokens before m grouped), i + Hn + 1 on the right
// (the tokens from m grouped). None when grouping, summaries or far summaries are off, when m is no key or a
// block's first token (the class changes on a block boundary: both blocks lie wholly in one class), or when
// the row sees the block otherwise: in its window (rule 2), not at all (section 7) or retrieved (rule 3).
// g: the plan's Geometry; sorted / k: the query block's retrieved blocks. window_first, window_last,
// visible_blocks and is_retrieved_block are the plan's, found through g's namespace where plan.h row_geometry
// calls this. (plan.h plan_body_tile's direct records cover the blocks of the tokens m of a tile's rows.)
template <typename Geometry>
RSWA_HD MixedBlock mixed_block(const Geometry& g, const int32_t* sorted, int32_t k, int32_t i, int side) {
  MixedBlock none{-1, 0};
  if (!g.grouping || !g.summaries || !g.far_summaries) return none;
  const int32_t m = side == 0 ? i - g.Hn : i + g.Hn + 1;
  if (m <= 0 || m >= g.L || g.by_G.mod(m) == 0) return none;  // the class changes on a block boundary
  const int32_t b = g.by_G.div(m);
  if (b >= window_first(g, i) && b <= window_last(g, i)) return none;
  if (b >= visible_blocks(g, i)) return none;
  if (is_retrieved_block(g, sorted, k, b)) return none;
  return MixedBlock{b, m};
}

// The in-block exclusive prefix sums P the preparation writes (prepare.h, both loops: prepare_unit and
// prepare_range) walk each G-block's tokens with a running sum of its keys under one position map (R(j) k_j for
// P_nat, R(j / g) k_j for P_grp): the sum is 0 at a block's first token (prefix_restarts), P at token m is the
// sum before m (written first: exclusive), then m's key joins it (prefix_step). The vector loop's units are whole
// blocks, so its sums start from 0 at each unit.
RSWA_HD bool prefix_restarts(int32_t j, int32_t G) { return j % G == 0; }

// The running sum once token m's key joins it (by value: the callers' SASS is as before the home).
RSWA_HD float prefix_step(float sum, float key) { return sum + key; }

// The tokens n_b of a G-block from whose first token `keys` keys remain: G, or fewer in the ragged last block.
RSWA_HD int32_t block_tokens(int32_t G, int32_t keys) { return G < keys ? G : keys; }

// A direct record's raw score for a row: the mean exact logit of its straddling block b from the parts above,
// `whole` (q . S[b]) and `parts` (the two prefix terms), over the block's n_b = min(G, L - b G) tokens; before
// scale and bias. g: the plan's Geometry.
template <typename Geometry>
RSWA_HD float straddling_score(const Geometry& g, int32_t block, float whole, float parts) {
  const int32_t n = block_tokens(g.G, g.L - block * g.G);
#if defined(__CUDA_ARCH__)
  return whole + __fdividef(parts, float(n));
#else
  return whole + parts / float(n);
#endif
}

}  // namespace rangeswa::cuda
