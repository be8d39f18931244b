// The copies of a KV tile into a K/V stage (cp.async): the tile_column order of a 64-key tile, load_kv_async,
// copy_tile.
#pragma once

#include "../kernel_traits.h"
#include "../tile.h"
#include "../utils.h"
#include "shared_layout.h"

namespace rangeswa::cuda {

// The shared-memory row, and so the column of S and P, of key r of a 64-key tile: lane t of a quad owns
// the columns 8n + 2t + j (n < 8, j < 2) of its rows in the MMA accumulators, and key 16t + 2n + j lands
// there, so each lane holds one whole G-block of 16 of its rows (window sums add it up inside the lane).
// The order is made where the tile is stored: reads stay in plain row order, whose ldmatrix addresses
// hit distinct banks (rows 16 bytes apart in an odd number of 16-byte chunks), where a read in this order
// would put four of its eight rows on the same banks. K and V share it, so softmax and P V are unchanged.
RSWA_HD constexpr int tile_column(int r) { return 8 * ((r % 16) / 2) + 2 * (r / 16) + r % 2; }

// Copies rows [0, n) of the keys and of the values of a tile (global arrays of kHeadDim-element rows,
// key rows k_row apart, value rows v_row apart) into `rows`-row shared tiles, a 64-key tile's rows in
// tile_column order when `permute` (body CTAs; control CTAs keep plain order for control_unit); rows past
// n are zero-filled, so that P = 0 never meets garbage V (and window sums see scores of 0 there).
template <typename Traits>
__device__ __forceinline__ void load_kv_async(typename Traits::Element* sk, typename Traits::Element* sv,
                                              const typename Traits::Element* gk, const typename Traits::Element* gv,
                                              int k_row, int v_row, int rows, int n, bool permute) {
  constexpr int kChunk = 16 / int(sizeof(typename Traits::Element));
  constexpr int kChunksPerRow = Traits::kHeadDim / kChunk;
  constexpr bool kPermuted = Traits::kBlockN == 64;
  // Rows in whole passes of the CTA (kPass rows of 16-byte chunks per pass: 16 at head dim 64, 8 at 128): a
  // thread copies one 16-byte column of the rows r0 + kPass p, which a permuted 64-key tile (kPass 16)
  // stores at tile_column(r0) + 2p and other tiles at r0 + kPass p: one address and constant offsets.
  constexpr int kPass = Traits::kThreads / kChunksPerRow;
  if constexpr (Traits::kThreads % kChunksPerRow == 0 && Traits::kBlockN % kPass == 0 && kCtrlCols % kPass == 0 &&
                (!kPermuted || kPass == 16)) {
    const int r0 = int(threadIdx.x) / kChunksPerRow, col = (int(threadIdx.x) % kChunksPerRow) * kChunk;
    const bool full = rows == Traits::kBlockN;
    auto copy = [&](int p, int at) {  // pass p: row r0 + kPass p to row `at`
      const int r = r0 + kPass * p;
      const bool valid = r < n;
      const int32_t from = (valid ? r : 0) * k_row + col, from_v = (valid ? r : 0) * v_row + col;
      cp_async_16(sk + at * Traits::kStride + col, gk + from, valid);
      cp_async_16(sv + at * Traits::kStride + col, gv + from_v, valid);
    };
    if (kPermuted && full && permute) {
      const int at = tile_column(r0);
#pragma unroll
      for (int p = 0; p < Traits::kBlockN / kPass; ++p) copy(p, at + 2 * p);
    } else {
#pragma unroll
      for (int p = 0; p < Traits::kBlockN / kPass; ++p) {
        if (p >= kCtrlCols / kPass && !full) break;  // a 16-key tile: its passes only
        copy(p, r0 + kPass * p);
      }
    }
    return;
  }
  const int per = rows * kChunksPerRow;
  for (int c = threadIdx.x; c < 2 * per; c += Traits::kThreads) {
    const bool value = c >= per;
    const int cc = value ? c - per : c, r = cc / kChunksPerRow, col = (cc % kChunksPerRow) * kChunk;
    const bool valid = r < n;
    const int at = kPermuted && permute && rows == Traits::kBlockN ? tile_column(r) : r;
    cp_async_16((value ? sv : sk) + at * Traits::kStride + col,
                (value ? gv : gk) + (valid ? r : 0) * (value ? v_row : k_row) + col, valid);
  }
}

// Issues the copy of KV tile t (its record's arrays, sArrays) into K/V stage `stage`, a 64-key tile in
// tile_column order when `permute` (load_kv_async).
template <typename Traits>
__device__ __forceinline__ void copy_tile(typename Traits::Element* sK, typename Traits::Element* sV, int stage,
                                          const RecordArrays<typename Traits::Element>* sArrays, const KvTile& t,
                                          bool permute) {
  const RecordArrays<typename Traits::Element> ra = sArrays[t.record];
  load_kv_async<Traits>(sK + stage * Traits::kKVElems, sV + stage * Traits::kKVElems, ra.k + t.a * ra.k_row,
                        ra.v + t.a * ra.v_row, ra.k_row, ra.v_row, t.width, t.n, permute);
}

}  // namespace rangeswa::cuda
