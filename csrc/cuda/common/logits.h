// A warp's KV tile of scores to logits, the same for both body kernels and the control CTAs: WarpTile (what
// the tile is and how the warp treats it), given scores in place of Q K^T, tile_logits (the column fix-ups:
// masks, window sums, the ragged last block's bias); zero_output.
#pragma once

#include <cmath>
#include <cstdint>

#include "../attn_params.h"
#include "../plan.h"
#include "../summary_bias.h"
#include "../tile.h"
#include "../utils.h"

namespace rangeswa::cuda {

// A warp's output accumulators (its rows' O, DT 8-column tiles per m16 block), zeroed.
template <int MB, int DT>
__device__ __forceinline__ void zero_output(float (&o)[MB][DT][4]) {
#pragma unroll
  for (int mb = 0; mb < MB; ++mb)
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mb][dt][e] = 0.f;
}

// What one warp's KV tile takes besides its accumulators: where the operands are, what the tile is and
// how the warp treats it (tile.h), and the logit's scale and biases.
template <typename Element>
struct WarpTile {
  const Element *q, *k, *v;  // the warp's query rows, the tile's keys and values (shared memory)
  int lane, row0;            // the lane, and the warp's first row in the CTA
  TileWork work;             // full or masked (never skip: no call then)
  bool fixups;               // column fix-ups (tile.h has_column_fixups)
  bool sums;                 // a window record with its edges' summaries (plan.h window_sums, G = 16)
  KvTile tile;
  int32_t ragged;            // the ragged last G-block's column, or -1
  const int32_t *lo, *hi;    // every tile row's bounds in the record (shared memory), read on masked tiles
  // Raw scores that replace Q K^T, at given[row * given_rows + column * given_cols]: a direct record's one
  // per row (plan.h kRecDirect; given_cols = 0), an Hn band's per row and block ([row][kBandStride], plan.h
  // hn_bands); null: Q K^T.
  const float* given;
  int given_rows, given_cols;
  float scale_log2, bias, last_bias;  // base 2: the scale, the record's bias, the ragged block's
};

// Raw scores given per row and column (WarpTile::given) in place of Q K^T, in the accumulator layout of
// MB m16 blocks: s[mb][n][e] of the lane's rows row0 + 16 mb + 8 (e / 2), columns 8 n + 2 tq + e % 2.
// [gate:given-scores begin]
template <int MB, int NT>
__device__ __forceinline__ void given_scores(float (&s)[MB][NT][4], const float* given, int given_rows,
                                             int given_cols, int row0, int tq) {
#pragma unroll
  for (int mb = 0; mb < MB; ++mb)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float* r = given + (row0 + mb * 16 + (e / 2) * 8) * given_rows + (2 * tq + e % 2) * given_cols;
#pragma unroll
      for (int n = 0; n < NT; ++n) s[mb][n][e] = r[n * 8 * given_cols];
    }
}
// [gate:given-scores end]

// An Hn band's summary rows of one side for variant v (blocks k0 .. k0 + nb - 1 of KV head bh's native means for
// v = native, near blocks, else its grouped ones, far blocks; rows of Dp elements) as a 16-row K tile in shared
// memory, zero past its blocks, by kThreads threads (thread tid) in 16-byte chunks; at(r, c): the element offset of
// row r, dim c in the tile (the kernel's layout of a K operand). Both body kernels' band products start here.
template <typename Element, int Dp, int kThreads, typename At>
__device__ __forceinline__ void load_band_rows(Element* tile, const PreparedArrays& a, QVar v, int32_t bh, int32_t k0,
                                               int32_t nb, int tid, At at) {
  constexpr int kChunk = 16 / int(sizeof(Element)), kChunks = Dp / kChunk;
  const Element* src = static_cast<const Element*>(v == QVar::kNat ? a.s_nat : a.s_grp) + bh * a.sum_stride;
#pragma unroll 1
  for (int x = tid; x < kBandBlocks * kChunks; x += kThreads) {
    const int r = x / kChunks, c = (x % kChunks) * kChunk;
    uint4 val = make_uint4(0u, 0u, 0u, 0u);
    if (r < nb) val = *reinterpret_cast<const uint4*>(src + int64_t(k0 + r) * Dp + c);
    *reinterpret_cast<uint4*>(tile + at(r, c)) = val;
  }
}

// An Hn band's product with the query slot (plan.h hn_bands: one side's band blocks, the slot's variant) into the
// CTA's band logits of that side (`band`: kBandStride floats a row): each of the lane's rows keeps the columns of
// its own class (plan.h band_columns, one field of its RowGeometry). sc in the accumulator layout: the lane's rows
// row0 + 16 mb + 8 h, columns 8 n + 2 tq + j. Both body kernels' band products end here.
template <int MB>
__device__ __forceinline__ void keep_band_scores(const float (&sc)[MB][kBandBlocks / 8][4], const BandEdge& e,
                                                 int32_t k0, int32_t nb, const RowGeometry* sRow, int row0, int tq,
                                                 float* band, int stride) {
#pragma unroll
  for (int mb = 0; mb < MB; ++mb)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row0 + 16 * mb + 8 * h;
      const Bounds b = band_columns(e, reinterpret_cast<const int32_t*>(sRow + row)[e.field], k0, nb);
      float* out = band + row * stride;
#pragma unroll
      for (int n = 0; n < kBandBlocks / 8; ++n)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int c = n * 8 + 2 * tq + j;
          if (uint32_t(c - b.lo) < uint32_t(b.hi - b.lo)) out[c] = sc[mb][n][2 * h + j];
        }
    }
}

// The logits of one warp's scores on a KV tile of kCols columns (MB m16 blocks of rows), for the softmax's
// FFMA a x + b (a = the scale, b = the record's bias): a full tile without column fix-ups (the steady state
// of a record, warp-uniform) takes the scores as they are; a masked or fixed-up tile first replaces the
// scores of the columns a row does not see: -inf, or in a window record with its edges' summaries (plan.h
// window_sums, G = 16; bias 0) the mean score of the key's G-block over the tile's keys (spread over the
// block's n_b columns it weighs n_b 2^mean: rule 4's log n_b). In the one tile holding the ragged last
// G-block's summary, that column's score is shifted by (its bias - the record's) / the scale, so that a x + b
// carries its own bias. Both kernels' warps call it (sm80/mainloop.h, sm90/consumer.h; the control CTAs' warp_tile).
template <int MB, int kCols, typename Element>
__device__ __forceinline__ void tile_logits(float (&s)[MB][kCols / 8][4], const WarpTile<Element>& w) {
  const KvTile& t = w.tile;
  const int lane = w.lane, row0 = w.row0;
  const TileWork work = w.work;
  const bool fixups = w.fixups, sums = w.sums;
  const int32_t ragged = w.ragged;
  const int32_t *lo = w.lo, *hi = w.hi;
  const float scale_log2 = w.scale_log2, bias = w.bias, last_bias = w.last_bias;
  constexpr int NT = kCols / 8;
  // 64-key tiles are stored in tile_column order (lane tq holds the keys [16 tq, 16 tq + 16) of its rows),
  // others in plain order (columns 8n + 2tq + j).
  constexpr bool kPermuted = kCols == 64;
  const int tq = lane % 4;
  if (work == TileWork::kFull && !fixups) return;
  // This lane's columns: key base + off(n, j) of the tile, bit off(n, j) of a word (off < 32).
  const int32_t base = kPermuted ? 2 * NT * tq : 2 * tq;
  auto off = [](int n, int j) { return kPermuted ? 2 * n + j : 8 * n + j; };
  static_assert(kPermuted ? 2 * NT <= 32 : 8 * NT <= 32, "a lane's columns fit one word");
  // Bits [c0, c1) of the word, clamped to it.
  auto bits = [](int32_t c0, int32_t c1) {
    const int32_t from = imax(c0, 0);
    return bit_range(uint32_t(from), uint32_t(imax(c1 - from, 0)));
  };
  // Columns the fix-ups leave, the same for every row: those within the keys, bar excluded G-blocks.
  const uint32_t live = fixups ? bits(0, t.n - base) & ~uint32_t(t.excluded >> base) : ~0u;
  // Window sums run on 64-key tiles (api/config.h choose_config), where each lane holds one G-block.
  constexpr bool kSums = kPermuted && NT == 8;
  float inv = 0.f;  // 1 / the keys of this lane's block in the tile
  if constexpr (kSums) inv = __fdividef(1.f, float(imax(1, imin(16, t.n - base))));
  // Per row slot rr = 2 mb + h of the lane: the columns it sees.
  uint32_t seen[2 * MB];
#pragma unroll
  for (int rr = 0; rr < 2 * MB; ++rr) {
    const int row = row0 + (rr / 2) * 16 + (rr % 2) * 8;
    const int32_t first = t.a + base;  // the key of bit 0
    const uint32_t bounds = bits(lo[row] - first, hi[row] - first);  // read on every such tile
    seen[rr] = (work == TileWork::kMasked ? bounds : ~0u) & live;
  }
  if (kSums && sums) {  // warp-uniform: a window tile with its edges' summaries
#pragma unroll
    for (int rr = 0; rr < 2 * MB; ++rr) {
      const int mb = rr / 2, h = rr % 2;
      float sum = 0.f;
#pragma unroll
      for (int n = 0; n < NT; ++n) sum += s[mb][n][2 * h] + s[mb][n][2 * h + 1];
      const float mean = sum * inv;
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int j = 0; j < 2; ++j) {  // a column past the keys is no block's: -inf
          float& x = s[mb][n][2 * h + j];
          x = ((seen[rr] >> off(n, j)) & 1u) ? x : (((live >> off(n, j)) & 1u) ? mean : -INFINITY);
        }
    }
  } else {
#pragma unroll
    for (int rr = 0; rr < 2 * MB; ++rr)
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          float& x = s[rr / 2][n][2 * (rr % 2) + j];
          // [gate:logit-select begin]
          x = ((seen[rr] >> off(n, j)) & 1u) ? x : -INFINITY;
          // [gate:logit-select end]
        }
  }
  // warp-uniform, one tile a call: the ragged block's column (its bit in the lane's word) gets its own bias
  // (summary_bias.h)
  if (ragged >= 0) shift_ragged_column(s, ragged - base, last_bias, bias, scale_log2, off);
}

}  // namespace rangeswa::cuda
