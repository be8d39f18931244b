// Rule 3's retrieved blocks in the attention, the one device home: a query block's given blocks checked and
// sorted (sort_retrieved: plan.cu's sort kernel and the host emulator, emulator/host_call.h, run it), the exact
// keys they give every row of the block (retrieved_run: plan.h plan_body_tile's records), and the G-blocks they
// take out of the summaries (overlaps_retrieved for a record, exclusion_bits for a KV tile's columns: tile.h,
// sm80/mainloop.h, sm90/consumer.h, emulator/plan_emulator.cu; is_retrieved_block for one block, plan.h
// mixed_block). The excluded columns' mask is applied by common/logits.h tile_logits and sm90/consumer.h
// whole_tile. A query block's `sorted` blocks are ascending, -1 after the last, k entries; g is the plan's Geometry
// (L, nG, Rb, by_blocks_per_key_block: Rb / G G-blocks per key block). Host and device code.
#pragma once

#include <cstdint>

#include "rules.h"

namespace rangeswa::cuda {

// The query block qb's blocks in ascending order, -1 last (the plan's input), checked against checks.cpp
// check_retrieved_values' rules: each given block is -1 or a candidate of qb in [0, nKb), and none is given
// twice. Returns false at the first that breaks them, its value in *bad (not placed: the sorted row stays inside
// the arrays). The CUDA op checks a user's blocks here, on the device, so a call neither syncs nor breaks
// CUDA-graph capture (plan.cu sort_kernel). The given row has `given_k` entries, the sorted one `k`
// (attn_setup.h retrieved_room: at most the key blocks, which the distinct given blocks never outnumber, so no
// given block is lost).
// The message of a row that breaks them (printf: the block, the query block, nKb).
#define RSWA_BAD_RETRIEVED                                                                                  \
  "rangeswa attn: retrieved holds block %d for query block %lld: outside [-1, %lld), not a candidate (it " \
  "overlaps the query block's local windows) or given twice\n"
RSWA_HD bool sort_retrieved(const int32_t* given, int32_t given_k, int32_t* sorted, int32_t k, const Rules& R,
                            int64_t qb, int32_t* bad) {
  const int64_t nKb = R.num_key_blocks();
  int32_t n = 0;
  bool ok = true;
  for (int32_t x = 0; x < given_k; ++x) {
    const int32_t kb = given[x];
    if (kb == -1) continue;
    bool fits = kb >= 0 && kb < nKb && R.is_candidate(qb, kb) && n < k;  // (n < k: distinct blocks below nKb)
    for (int32_t y = 0; fits && y < n; ++y) fits = sorted[y] != kb;
    if (!fits) {
      if (ok) *bad = kb;
      ok = false;
      continue;
    }
    int32_t y = n++;
    while (y > 0 && sorted[y - 1] > kb) {
      sorted[y] = sorted[y - 1];
      --y;
    }
    sorted[y] = kb;
  }
  for (int32_t x = n; x < k; ++x) sorted[x] = -1;
  return ok;
}

// The exact keys of the run of adjacent retrieved blocks that starts at entry x (sorted[x] >= 0): keys [k0, k1)
// (key blocks of Rb keys, the last one ending at L), the next run at entry `next`. Every row of the query block
// sees them exactly (rule 3).
struct RetrievedRun {
  int32_t next, k0, k1;
};
template <typename Geometry>
RSWA_HD RetrievedRun retrieved_run(const Geometry& g, const int32_t* sorted, int32_t k, int32_t x) {
  int32_t y = x + 1;
  while (y < k && sorted[y] == sorted[y - 1] + 1) ++y;
  return RetrievedRun{y, sorted[x] * g.Rb, imin(g.L, sorted[y - 1] * g.Rb + g.Rb)};
}

// Whether any retrieved block overlaps G-blocks [lo, hi) (a summary record that must exclude them).
template <typename Geometry>
RSWA_HD bool overlaps_retrieved(const Geometry& g, const int32_t* sorted, int32_t k, int32_t lo, int32_t hi) {
  const int32_t per = g.by_blocks_per_key_block.d;
  for (int32_t x = 0; x < k && sorted[x] >= 0; ++x)
    if (sorted[x] * per < hi && imin(sorted[x] * per + per, g.nG) > lo) return true;
  return false;
}

// Bit x set: G-block b0 + x (x < 64) lies in one of the query block's retrieved key blocks, which every row of
// the tile sees exactly (rule 3), so it is no summary.
// [gate:exclusion-bits begin]
template <typename Geometry>
RSWA_HD uint64_t exclusion_bits(const Geometry& g, const int32_t* sorted, int32_t k, int32_t b0, int32_t n) {
  uint64_t bits = 0;
  const int32_t per = g.by_blocks_per_key_block.d;
  // Every entry is looked at (no early exit: the -1 padding overlaps nothing), so the loop has one exit.
RSWA_ROLLED
  for (int32_t x = 0; x < k; ++x) {
    const int32_t kb = sorted[x];
    const int32_t lo = imax(kb * per, b0), hi = imin(imin(kb * per + per, g.nG), b0 + n);
    const int32_t width = imin(64, imax(0, hi - lo));
    const uint64_t run = width >= 64 ? ~uint64_t(0) : ((uint64_t(1) << width) - 1);
    bits |= kb >= 0 && width > 0 ? run << (lo - b0) : 0;
  }
  return bits;
}
// [gate:exclusion-bits end]

// Whether G-block b lies in one of the retrieved blocks.
template <typename Geometry>
RSWA_HD bool is_retrieved_block(const Geometry& g, const int32_t* sorted, int32_t k, int32_t b) {
  const int32_t kb = g.by_blocks_per_key_block.div(b);
RSWA_ROLLED
  for (int32_t x = 0; x < k && sorted[x] >= 0 && sorted[x] <= kb; ++x)
    if (sorted[x] == kb) return true;
  return false;
}

}  // namespace rangeswa::cuda
