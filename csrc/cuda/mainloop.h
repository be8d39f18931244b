// The fused RangeSWA attention kernel (SPEC sections 1-4 and 7): one CTA per tile of 128 query rows
// (4 warps of 32) and (batch, query head), walking the KV tiles of its plan (plan.h records and tile.h tile
// spans, made by the plan kernel) with one online softmax, FlashAttention-2 style. (A control CTA holds 32
// control rows and a chunk of the keys; its 4 warps hold the same rows and split each tile's columns,
// control_unit.)
//
//   prologue: the plan (records, spans) and retrieved blocks -> shared memory; each row's straddling
//             blocks (plan.h); issue the copy of KV tile 0
//   per run of tiles (the spans: per query variant its unmasked tiles, then its masked ones): fill the
//             query slot if the variant changed, then
//     the unmasked loop, per tile: wait, barrier (tile n landed, tile n - 1 done) -> issue the copy of tile
//             n + 1 into the other stage (three K/V stages: of tile n + 2 into tile n - 1's, tile n + 1 in
//             flight) -> S = Q K^T, softmax (scale and bias in its FFMA), O += P V
//     the masked loop, per tile: the same wait and copy -> each row's bounds in a new record -> per warp,
//             two votes: skip, or S = Q K^T, logits (full / masked / column fix-ups, tile.h), softmax, O += P V
//   last: the direct records of the blocks straddling distance Hn (their logits from three dot products
//         per row and side, made as the query variants were filled) or of the Hn bands (their logits from
//         a 16-column product per variant, plan.h hn_bands), in the masked loop; output staged through
//         shared memory
//
// The query slot holds the tile's rows under one rotation at a time (native, grouped-left, grouped-right,
// conditioning, or none for control rows), rotated here from the input with the rope tables; records
// come in the slot's fill order, so a tile fills it at most four times. Every decision (records, spans,
// bounds, skip / full / masked, column fix-ups, straddling blocks) comes from plan.h and tile.h, which the
// host emulator runs too.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "attn_params.h"
#include "kernel_traits.h"
#include "plan.h"
#include "rotary.h"
#include "softmax.h"
#include "tile.h"
#include "utils.h"
#include "warp_gemm.h"

namespace rangeswa::cuda {

// The keys and values arrays of one record for the CTA's KV head (record_arrays), and the elements between
// their rows (Dp; k's or v's own row stride for the control rows' body keys and the body values read in
// place). Element offsets inside one KV head's arrays fit 32 bits (attn_setup.h head_offsets_fit).
template <typename Element>
struct RecordArrays {
  const Element* k;
  const Element* v;
  int32_t k_row, v_row;
};

// The part of a body CTA's shared memory that both body kernels (this one and the sm_90a one,
// hopper/body_layout.h) lay out alike after their per-row words, which end at byte kGeometry: the rows'
// RowGeometry; the plan as the plan kernel wrote it (records, then the tile spans: attn_params.h records_of /
// spans_of); per record its keys and values arrays for the CTA's KV head (RecordArrays), found once in the
// prologue; the retrieved blocks; the Hn bands (plan.h hn_bands), when the call has them (geo.band_ok): one
// band's summary rows as a 16-row K tile of kBandRowBytes a row, and per side and row the logits of its
// blocks (kBandStride floats a row: one bank apart).
template <typename Element, int M, size_t kGeometry, size_t kBandRowBytes>
struct PlanRegion {
  static constexpr size_t up16(size_t x) { return (x + 15) / 16 * 16; }
  static constexpr size_t kRecords = up16(kGeometry + size_t(M) * sizeof(RowGeometry));
  static constexpr size_t spans(int max_records) { return kRecords + size_t(max_records) * sizeof(Record); }
  static constexpr size_t arrays(int max_records, int k) {
    return spans(max_records) + size_t(max_spans(k)) * sizeof(TileSpan);
  }
  static constexpr size_t retrieved(int max_records, int k) {
    return arrays(max_records, k) + size_t(max_records) * sizeof(RecordArrays<Element>);
  }
  static constexpr int kBandStride = kBandBlocks + 1;
  static constexpr size_t band_k(int max_records, int k) { return up16(retrieved(max_records, k) + size_t(k) * 4); }
  static constexpr size_t band_logits(int max_records, int k) {
    return band_k(max_records, k) + size_t(kBandBlocks) * kBandRowBytes;
  }
  static constexpr size_t bytes(int max_records, int k, bool band) {
    return band ? band_logits(max_records, k) + size_t(2) * M * kBandStride * sizeof(float)
                : retrieved(max_records, k) + size_t(k) * 4;
  }
};

// Shared memory: the query slot, two or three K and V stages (Traits::kStages); per row (at offsets fixed at
// compile time, so the walk addresses them from one register) its bounds in the current record, the parts
// of its straddling blocks' logits, a direct record's score, and per warp the record of those bounds; then
// the PlanRegion.
template <typename Traits>
struct SharedRows {
  using Element = typename Traits::Element;
  static constexpr size_t kK = size_t(Traits::kQElems) * sizeof(Element);
  static constexpr size_t kV = kK + size_t(Traits::kStages) * Traits::kKVElems * sizeof(Element);
  // Per row: bounds (2), straddling parts (4), direct score (1), int32 each; then per warp the record whose
  // bounds they hold (the masked loop's).
  static constexpr size_t kRows = kV + size_t(Traits::kStages) * Traits::kKVElems * sizeof(Element);
  static constexpr size_t kGeometry = kRows + size_t(Traits::kBlockM) * 7 * 4 + 16;
  static_assert(Traits::kWarps * 4 <= 16, "a record index per warp");
  static_assert(kK % 16 == 0 && kV % 16 == 0 && kRows % 16 == 0 && kGeometry % 16 == 0, "16-byte aligned");
};

template <typename Traits>
struct SharedLayout
    : SharedRows<Traits>,
      PlanRegion<typename Traits::Element, Traits::kBlockM, SharedRows<Traits>::kGeometry,
                 size_t(Traits::kStride) * sizeof(typename Traits::Element)> {};

// The shared-memory row, and so the column of S and P, of key r of a 64-key tile: lane t of a quad owns
// the columns 8n + 2t + j (n < 8, j < 2) of its rows in the MMA accumulators, and key 16t + 2n + j lands
// there, so each lane holds one whole G-block of 16 of its rows (window sums add it up inside the lane).
// The order is made where the tile is stored: reads stay in plain row order, whose ldmatrix addresses
// hit distinct banks (rows 16 bytes apart in an odd number of 16-byte chunks), where a read in this order
// would put four of its eight rows on the same banks. K and V share it, so softmax and P V are unchanged.
RSWA_HD constexpr int tile_column(int r) { return 8 * ((r % 16) / 2) + 2 * (r / 16) + r % 2; }

// A control CTA's warp's share of KV tile t (kernel_traits.h kControlSplit): the 16-column units of the
// chunk's tiles go round the warps, unit s of t (keys [a + 16 s, a + 16 s + 16)) to warp (first + s) mod
// kControlSplit, `first` the tile's first unit's warp. Returns the warp's unit, n = 0 when the tile has
// none for it. Control CTAs store their tiles in plain order (load_kv_async), so a unit is 16 whole rows.
RSWA_HD KvTile control_unit(const KvTile& t, int warp, int32_t first) {
  const int32_t s = (warp - first + kControlSplit) % kControlSplit, c0 = s * kCtrlCols;
  KvTile u = t;
  u.a = t.a + c0;
  u.n = c0 < t.width ? imax(0, imin(kCtrlCols, t.n - c0)) : 0;
  u.width = kCtrlCols;
  u.excluded = t.excluded >> c0;
  return u;
}

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

// N consecutive floats (N = 2 or a multiple of 4), from an address aligned to min(N, 4) floats.
template <int N>
RSWA_HD void load_floats(const float* src, float (&x)[N]) {
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int i = 0; i < N; i += 4) {
      const float4 f = *reinterpret_cast<const float4*>(src + i);
      x[i] = f.x, x[i + 1] = f.y, x[i + 2] = f.z, x[i + 3] = f.w;
    }
  } else {
    static_assert(N == 2, "2 floats or a multiple of 4");
    const float2 f = *reinterpret_cast<const float2*>(src);
    x[0] = f.x, x[1] = f.y;
  }
}

// N elements (4, 8, 16 or 32 bytes, aligned so) as floats, and back: one to two vector loads or stores.
template <typename Element, int N>
RSWA_HD void load_elements(const Element* src, float (&x)[N]) {
  constexpr int kBytes = N * int(sizeof(Element));
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16 || kBytes == 32, "4, 8, 16 or 32 bytes");
  Element e[N];
  if constexpr (kBytes == 4) {
    const uint32_t raw = *reinterpret_cast<const uint32_t*>(src);
    memcpy(e, &raw, 4);
  } else if constexpr (kBytes == 8) {
    const uint2 raw = *reinterpret_cast<const uint2*>(src);
    memcpy(e, &raw, 8);
  } else {
#pragma unroll
    for (int i = 0; i < kBytes / 16; ++i) {
      const uint4 raw = reinterpret_cast<const uint4*>(src)[i];
      memcpy(reinterpret_cast<char*>(e) + 16 * i, &raw, 16);
    }
  }
#pragma unroll
  for (int i = 0; i < N; ++i) x[i] = to_float(e[i]);
}
template <typename Element, int N>
RSWA_HD void store_elements(Element* dst, const float (&x)[N]) {
  constexpr int kBytes = N * int(sizeof(Element));
  Element e[N];
#pragma unroll
  for (int i = 0; i < N; ++i) e[i] = from_float<Element>(x[i]);
  if constexpr (kBytes == 4) {
    uint32_t raw;
    memcpy(&raw, e, 4);
    *reinterpret_cast<uint32_t*>(dst) = raw;
  } else if constexpr (kBytes == 8) {
    uint2 raw;
    memcpy(&raw, e, 8);
    *reinterpret_cast<uint2*>(dst) = raw;
  } else {
#pragma unroll
    for (int i = 0; i < kBytes / 16; ++i) {
      uint4 raw;
      memcpy(&raw, reinterpret_cast<const char*>(e) + 16 * i, 16);
      reinterpret_cast<uint4*>(dst)[i] = raw;
    }
  }
}

// One query row of the slot under a rotation, for rows whose q is 16-byte aligned and whose rotary half is
// whole 16-byte chunks: dst = the row's slot row, row = its q row (null: a padding row, zeros), cs / sn =
// its table rows (null: no rotation), sign = -1 for a negative position. A step rotates the 4 pairs of the
// table entries u .. u + 4 (one float4 each) from two pieces of 4 elements, at x and y: interleaved x = 2u,
// y = 2u + 4 (pairs (x0, x1), (x2, x3), (y0, y1), (y2, y3)); half split x = u, y = u + half (pairs (x_e,
// y_e)). Every load of a step is issued before any is used: a fill costs half / 4 dependent round trips
// per thread (8 at head dim 64), where one element pair at a time cost two per pair.
// The element offset of dim d within a query-slot row: rows in plain order (the mma.sync kernel), or, kCore,
// as the core matrices of a wgmma operand (hopper/body_layout.h: 8-element chunks of a row 64 elements apart,
// the row's place in its 8-row group added by the caller).
template <bool kCore>
RSWA_HD int slot_col(int d) {
  if constexpr (kCore) return (d / 8) * 64 + d % 8;
  else return d;
}

// N elements of a slot row from dim x on: one store up to a 16-byte chunk (whole chunks stay contiguous in
// slot_col's layouts), chunk by chunk past it (the core-matrix layout puts a row's chunks 128 bytes apart).
template <typename Element, bool kCore, int N>
__device__ __forceinline__ void store_slot(Element* dst, int x, const float (&v)[N]) {
  constexpr int kChunk = 16 / int(sizeof(Element));
  if constexpr (N <= kChunk) {
    store_elements<Element, N>(dst + slot_col<kCore>(x), v);
  } else if constexpr (kCore && sizeof(Element) == 2) {
    // The sm_90a kernel's steps of 16 or more elements start on a chunk (x a multiple of 8: fill_row_vector's
    // aligned steps), so chunk x / 8 + c / 8 of the row is the 16-byte word (x / 8 + c / 8) * 8 of the
    // core-matrix layout (slot_col<true>: chunks 64 elements apart). Indexed as 16-byte words, each chunk's
    // store stays one 16-byte store; the element pointer slot_col gives left NVVM four 4-byte stores a chunk.
    uint4* words = reinterpret_cast<uint4*>(dst);
#pragma unroll
    for (int c = 0; c < N; c += kChunk)
      words[(x / kChunk + c / kChunk) * 8] =
          make_uint4(pack2<Element>(v[c], v[c + 1]), pack2<Element>(v[c + 2], v[c + 3]),
                     pack2<Element>(v[c + 4], v[c + 5]), pack2<Element>(v[c + 6], v[c + 7]));
  } else {
#pragma unroll
    for (int c = 0; c < N; c += kChunk) {
      float part[kChunk];
#pragma unroll
      for (int e = 0; e < kChunk; ++e) part[e] = v[c + e];
      store_elements<Element, kChunk>(dst + slot_col<kCore>(x + c), part);
    }
  }
}

// One step of fill_row_vector's rotation: kPairs rotated pairs from pair u on (the half layout's dims u.. and
// u + half.., the interleaved layout's 2u..2u + 2 kPairs - 1), every load issued before any is used.
// kLayout: -1 the layout read from `interleaved` at run time (a select per element), 0 the half layout, 1 the
// interleaved one (known at compile time: no selects).
// The rotation of P pairs loaded as rotate_pairs loads them (a: dims x.., b: dims y..), in place: pair e is
// (a[e], b[e]) in the half layout, two neighbours of a (e < P / 2) or of b in the interleaved one; its
// first dim becomes a cos - b sin, its second a sin + b cos (rotary.h rotated_element's products).
template <int P>
__device__ __forceinline__ void rotate_loaded(float (&a)[P], float (&b)[P], const float (&c)[P], const float (&s)[P],
                                              float sign, bool interleaved) {
  constexpr int P2 = P / 2;
  float pa[P], pb[P];
#pragma unroll
  for (int e = 0; e < P; ++e) {
    const float* first = e < P2 ? a : b;
    pa[e] = interleaved ? first[2 * (e % P2)] : a[e];
    pb[e] = interleaved ? first[2 * (e % P2) + 1] : b[e];
    const float se = s[e] * sign;
    const float ra = pa[e] * c[e] - pb[e] * se, rb = pa[e] * se + pb[e] * c[e];
    pa[e] = ra;
    pb[e] = rb;
  }
#pragma unroll
  for (int e = 0; e < P; ++e) {
    float* first = e < P2 ? a : b;
    if (interleaved) {
      first[2 * (e % P2)] = pa[e];
      first[2 * (e % P2) + 1] = pb[e];
    } else {
      a[e] = pa[e];
      b[e] = pb[e];
    }
  }
}

template <typename Traits, bool kCore, int kPairs, int kLayout = -1>
__device__ __forceinline__ void rotate_pairs(typename Traits::Element* dst, const typename Traits::Element* row,
                                             const float* cs, const float* sn, float sign, int half, int u,
                                             bool interleaved_) {
  using Element = typename Traits::Element;
  constexpr int P = kPairs;
  const bool interleaved = kLayout < 0 ? interleaved_ : kLayout == 1;
  const int x = interleaved ? 2 * u : u, y = interleaved ? 2 * u + P : u + half;
  float a[P], b[P], c[P], s[P];
  load_elements<Element, P>(row + x, a);
  load_elements<Element, P>(row + y, b);
  load_floats<P>(cs + u, c);
  load_floats<P>(sn + u, s);
  rotate_loaded<P>(a, b, c, s, sign, interleaved);
  store_slot<Element, kCore, P>(dst, x, a);
  store_slot<Element, kCore, P>(dst, y, b);
}

// A control CTA's tile of the control rows' body keys read from k itself (PreparedArrays::cond_raw), rotated
// in its stage to the conditioning positions (key t.a + r at cos_cond / sin_cond row t.a + r) by the CTA's
// threads, as the preparation would have written k_cond: the same pairs and products (rotate_loaded). A thread
// keeps one step of 4 pairs (the rotary half is 4 x a power of two: attn_setup.h cond_keys_in_place) in rows
// kThreads / steps apart, kBatch of them with every load issued before any is used (one round trip a batch:
// one a 64-key tile at head dim 64, two a 32-key tile at 128); the layout is a template, branched on once.
template <typename Traits, bool kInterleaved>
__device__ __forceinline__ void rotate_cond_rows(typename Traits::Element* sk, const KvTile& t,
                                                 const AttnKernelParams& p) {
  using Element = typename Traits::Element;
  constexpr int kBatch = 256 / Traits::kHeadDim > 0 ? 256 / Traits::kHeadDim : 1;
  const int half = p.rotary_half;
  int shift = 0;  // steps = half / 4 = 1 << shift (at most 16 steps: head dims up to 128)
  while ((4 << shift) < half) ++shift;
  const int pass = Traits::kThreads >> shift;                    // rows a pass of the CTA's threads
  const int u = 4 * (int(threadIdx.x) & ((half / 4) - 1));
  const int xa = kInterleaved ? 2 * u : u, ya = kInterleaved ? 2 * u + 4 : u + half;
  const float *cs = p.cos_cond + u, *sn = p.sin_cond + u;
#pragma unroll 1
  for (int r0 = int(threadIdx.x) >> shift; r0 < t.n; r0 += kBatch * pass) {
    float a[kBatch][4], b[kBatch][4], c[kBatch][4], s[kBatch][4];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int r = imin(r0 + i * pass, t.n - 1);  // past the keys: the last row again, not stored
      const Element* row = sk + r * Traits::kStride;
      load_elements<Element, 4>(row + xa, a[i]);
      load_elements<Element, 4>(row + ya, b[i]);
      load_floats<4>(cs + (t.a + r) * half, c[i]);
      load_floats<4>(sn + (t.a + r) * half, s[i]);
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int r = r0 + i * pass;
      if (r >= t.n) break;
      rotate_loaded<4>(a[i], b[i], c[i], s[i], 1.f, kInterleaved);
      store_elements<Element, 4>(sk + r * Traits::kStride + xa, a[i]);
      store_elements<Element, 4>(sk + r * Traits::kStride + ya, b[i]);
    }
  }
}
template <typename Traits>
__device__ __forceinline__ void rotate_cond_keys(typename Traits::Element* sk, const KvTile& t,
                                                 const AttnKernelParams& p) {
  if (p.interleaved) rotate_cond_rows<Traits, true>(sk, t, p);
  else rotate_cond_rows<Traits, false>(sk, t, p);
}

// Lite's preparation folded into the control CTAs (attn_setup.h nat_keys_from_control: head dim 64, every dim
// rotated, G = 16, 64-key tiles): as each tile of k's own body rows lands, besides rotating it in place to the
// conditioning positions (rotate_cond_rows' products), the CTA writes what the preparation would have of these
// keys: R(j) k_j into k_nat, and rule 4's G-block means of R(j) k_j and of v_j into s_nat and s_v (its tile
// holds 4 whole G-blocks). A thread takes one step of 4 pairs (and the values' 8-dim chunk of the same index)
// in 4 rows of one G-block, rows b 16 + q + 4 i (thread 4 (8 b + step) + q): its rows' natural and
// conditioning cos / sin loaded before the tile's own wait (tables), then per row the two rotations from the
// same landed pieces; the block's sums over its 4 rows, then over the 4 lanes q of its block and step
// (shuffles), lane q = 0 storing the means. The sums' order (each lane's rows, then the lanes' pairs) is not the
// preparation's (a block's rows in turn), so the means may differ from its in the last bit.

template <typename Traits>
struct NatFold {
  using Element = typename Traits::Element;
  static constexpr int kSteps = Traits::kHeadDim / 8;  // of 4 pairs: the rotary half / 4, every dim rotated
  static_assert(Traits::kBlockN == 64 && kSteps == 8, "a 64-key tile at head dim 64: 4 rows a thread");
  int u, b, q;  // the thread's step (pairs u .. u + 3; the values' dims 2 u .. 2 u + 7), G-block, first row
  float c[4][4], s[4][4], nc[4][4], ns[4][4];  // its rows' conditioning and natural cos / sin

  __device__ __forceinline__ explicit NatFold(const AttnKernelParams&) {
    const int t = int(threadIdx.x);
    q = t % 4;
    u = 4 * ((t / 4) % kSteps);
    b = t / (4 * kSteps);
  }
  __device__ __forceinline__ int row(int i) const { return 16 * b + q + 4 * i; }
  // The tables of tile t's rows (rows past its keys: its last row's, never stored).
  __device__ __forceinline__ void tables(const AttnKernelParams& p, const KvTile& t) {
    const int half = p.rotary_half;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int32_t at = (t.a + imin(row(i), t.n - 1)) * half + u;
      load_floats<4>(p.cos_cond + at, c[i]);
      load_floats<4>(p.sin_cond + at, s[i]);
      load_floats<4>(p.cos_int + at, nc[i]);
      load_floats<4>(p.sin_int + at, ns[i]);
    }
  }
  // Tile t's keys (sk) and values (sv) as they landed, the tables loaded; out: the KV head's arrays.
  template <bool kInterleaved>
  __device__ __forceinline__ void run(Element* sk, const Element* sv, const KvTile& t, const AttnKernelParams& p,
                                      Element* k_nat, Element* s_nat, Element* s_v) const {
    const int half = p.rotary_half;
    const int xa = kInterleaved ? 2 * u : u, ya = kInterleaved ? 2 * u + 4 : u + half;
    const int vd = 2 * u;  // the values' 8 dims
    float kx[4] = {}, ky[4] = {}, vs[8] = {};  // the block's sums over this lane's rows
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = row(i);
      if (r >= t.n) break;  // rows past the keys: none of this lane's later ones either
      float a[4], bb[4], x[4], y[4], v[8];
      Element* kr = sk + r * Traits::kStride;
      load_elements<Element, 4>(kr + xa, a);
      load_elements<Element, 4>(kr + ya, bb);
      load_elements<Element, 8>(sv + r * Traits::kStride + vd, v);
#pragma unroll
      for (int e = 0; e < 4; ++e) x[e] = a[e], y[e] = bb[e];
      rotate_loaded<4>(x, y, nc[i], ns[i], 1.f, kInterleaved);  // R(j) k_j: the preparation's products
      Element* nat = k_nat + int64_t(t.a + r) * Traits::kHeadDim;
      store_elements<Element, 4>(nat + xa, x);
      store_elements<Element, 4>(nat + ya, y);
#pragma unroll
      for (int e = 0; e < 4; ++e) kx[e] += x[e], ky[e] += y[e];
#pragma unroll
      for (int e = 0; e < 8; ++e) vs[e] += v[e];
      rotate_loaded<4>(a, bb, c[i], s[i], 1.f, kInterleaved);  // R(j T / L) k_j, in place
      store_elements<Element, 4>(kr + xa, a);
      store_elements<Element, 4>(kr + ya, bb);
    }
    // The block's sums over its 4 lanes (lanes 4 k .. 4 k + 3: one block and step), then its means.
#pragma unroll
    for (int m = 1; m <= 2; m *= 2) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        kx[e] += __shfl_xor_sync(0xffffffffu, kx[e], m);
        ky[e] += __shfl_xor_sync(0xffffffffu, ky[e], m);
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) vs[e] += __shfl_xor_sync(0xffffffffu, vs[e], m);
    }
    const int32_t first = t.a + 16 * b;  // the block's first key
    if (q == 0 && first < t.a + t.n) {
      // 1 / G (G = 16), or, for a ragged block (the last of L's), 1 / its tokens
      const float scale = t.a + t.n - first < 16 ? p.fold.inv_last : 0.0625f;
#pragma unroll
      for (int e = 0; e < 4; ++e) kx[e] *= scale, ky[e] *= scale;
#pragma unroll
      for (int e = 0; e < 8; ++e) vs[e] *= scale;
      const int64_t at = int64_t(first / 16) * Traits::kHeadDim;
      store_elements<Element, 4>(s_nat + at + xa, kx);
      store_elements<Element, 4>(s_nat + at + ya, ky);
      store_elements<Element, 8>(s_v + at + vd, vs);
    }
  }
  __device__ __forceinline__ void run(Element* sk, const Element* sv, const KvTile& t, const AttnKernelParams& p,
                                      Element* k_nat, Element* s_nat, Element* s_v) const {
    if (p.interleaved) run<true>(sk, sv, t, p, k_nat, s_nat, s_v);
    else run<false>(sk, sv, t, p, k_nat, s_nat, s_v);
  }
};
// control_walk's stand-in for NatFold in a CTA that folds nothing.
struct NoFold {
  __device__ __forceinline__ explicit NoFold(const AttnKernelParams&) {}
};

// kPairs: the rotated pairs a step loads before using any (one global round trip a step): 4 (the mma.sync
// kernel's), or 8 / 16 (the sm_90a kernel's: half / 16 round trips a fill), the rest of the rotary half by 4.
// kSplit: two threads fill the row, `part` 0 and 1: each rotates half the pairs (when the rotary half is a
// multiple of 16: whole aligned steps; else part 0 all of them) and copies every other 16-byte chunk of the rest.
template <typename Traits, bool kCore = false, int kPairs = 4, bool kSplit = false>
__device__ __forceinline__ void fill_row_vector(typename Traits::Element* dst, const typename Traits::Element* row,
                                                const float* cs, const float* sn, float sign, int half, int D,
                                                bool interleaved, int part = 0) {
  using Element = typename Traits::Element;
  static_assert(kPairs == 4 || kPairs == 8 || kPairs == 16, "4, 8 or 16 pairs a step");
  if (cs != nullptr) {
    int u = 0, end = half;
    if constexpr (kSplit) {
      if (half % 16 == 0) {
        u = part * (half / 2);
        end = u + half / 2;
      } else if (part != 0) {
        u = end;
      }
    }
    if constexpr (kPairs > 4) {
      // The sm_90a kernel's fill: the layout branched on once, each step's code for its own layout; and the sign
      // too (a row at a non-negative position, every row of most fills: its steps multiply no sine by the sign,
      // 16 FMUL a step fewer; a negative one keeps the multiply).
      auto steps = [&](auto layout, float sg) {
#pragma unroll 1
        for (; u + kPairs <= end; u += kPairs)
          rotate_pairs<Traits, kCore, kPairs, decltype(layout)::value>(dst, row, cs, sn, sg, half, u, interleaved);
      };
      if (interleaved) {
        if (sign == 1.f) steps(std::integral_constant<int, 1>{}, 1.f);
        else steps(std::integral_constant<int, 1>{}, sign);
      } else {
        if (sign == 1.f) steps(std::integral_constant<int, 0>{}, 1.f);
        else steps(std::integral_constant<int, 0>{}, sign);
      }
    }
#pragma unroll 1
    for (; u < end; u += 4) rotate_pairs<Traits, kCore, 4>(dst, row, cs, sn, sign, half, u, interleaved);
  }
  // The rest (every dim when there is no rotation): copied, zero past D and on padding rows.
  constexpr int kChunk = 16 / int(sizeof(Element));
  constexpr int kStride = kSplit ? 2 * kChunk : kChunk;
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll 1
  for (int d = (cs != nullptr ? 2 * half : 0) + (kSplit ? part * kChunk : 0); d < Traits::kHeadDim; d += kStride)
    *reinterpret_cast<uint4*>(dst + slot_col<kCore>(d)) =
        row != nullptr && d < D ? *reinterpret_cast<const uint4*>(row + d) : zero;
}

// Whether the query slot's rows take fill_row_vector: D, the rotary half and the row stride whole 16-byte
// chunks, and the tile's first q row (`rows`) 16-byte aligned.
template <typename Traits>
__device__ __forceinline__ bool slot_rows_in_chunks(const AttnKernelParams& p, const typename Traits::Element* rows) {
  constexpr int kChunk = 16 / int(sizeof(typename Traits::Element));
  return p.D % kChunk == 0 && p.rotary_half % kChunk == 0 && p.q_strides.row % kChunk == 0 &&
         reinterpret_cast<uintptr_t>(rows) % 16 == 0;
}

// One query row of the slot, unscaled, rounded to the element type; zero past D and on padding rows (row
// null); rotated by the table rows cs / sn (null: not rotated) with sign -1 for a negative position. Rows
// in 16-byte chunks (slot_rows_in_chunks) take fill_row_vector, others element pairs u (dims da, db): a
// rotated pair (interleaved (2u, 2u+1), half (u, u + half)) or two dims past the rotary ones.
template <typename Traits, bool kCore = false, int kPairs = 4, bool kSplit = false>
__device__ __forceinline__ void fill_row(typename Traits::Element* dst, const typename Traits::Element* row,
                                         const float* cs, const float* sn, float sign, int half, int D,
                                         bool interleaved, bool chunks, int part = 0) {
  using Element = typename Traits::Element;
  if (chunks) {
    fill_row_vector<Traits, kCore, kPairs, kSplit>(dst, row, cs, sn, sign, half, D, interleaved, part);
    return;
  }
  if (kSplit && part != 0) return;  // element pairs: part 0 fills the whole row
#pragma unroll 1
  for (int u = 0; u < Traits::kHeadDim / 2; ++u) {
    const int da = u < half ? (interleaved ? 2 * u : u) : 2 * u;
    const int db = u < half ? (interleaved ? 2 * u + 1 : u + half) : 2 * u + 1;
    float a = row != nullptr && da < D ? to_float(row[da]) : 0.f;
    float b = row != nullptr && db < D ? to_float(row[db]) : 0.f;
    if (cs != nullptr && u < half) {
      const float c = cs[u], se = sn[u] * sign;
      const float ra = a * c - b * se;
      b = a * se + b * c;
      a = ra;
    }
    dst[slot_col<kCore>(da)] = from_float<Element>(a);
    dst[slot_col<kCore>(db)] = from_float<Element>(b);
  }
}

// The keys and values array of a record's key set for KV head bh (= batch * Hkv + kv_head), and the
// elements between value rows.
template <typename Element>
__device__ __forceinline__ void record_arrays(const PreparedArrays& a, KeySet keys, int32_t bh, int32_t batch,
                                              int32_t kv_head, int32_t Dp, RecordArrays<Element>& out) {
  const void *kb, *vb;
  int64_t stride;
  switch (keys) {
    case KeySet::kCtrl: kb = a.k_ctrl; vb = a.v_ctrl; stride = a.ctrl_stride; break;
    case KeySet::kNat: kb = a.k_nat; vb = a.v_body; stride = a.key_stride; break;
    case KeySet::kGrp: kb = a.k_grp; vb = a.v_body; stride = a.key_stride; break;
    case KeySet::kCond: kb = a.k_cond; vb = a.v_body; stride = a.key_stride; break;
    case KeySet::kSumNat: kb = a.s_nat; vb = a.s_v; stride = a.sum_stride; break;
    default: kb = a.s_grp; vb = a.s_v; stride = a.sum_stride; break;
  }
  const bool body = keys == KeySet::kNat || keys == KeySet::kGrp || keys == KeySet::kCond;
  const bool raw = keys == KeySet::kCond && a.cond_raw;  // k's own rows (the control CTAs rotate them)
  // Every candidate read before the selects (no branch around a parameter's read).
  const int64_t own = bh * stride, cond_at = a.cond.at(batch, kv_head, 0), value_at = a.values.at(batch, kv_head, 0);
  const int32_t cond_row = int32_t(a.cond.row), value_row = int32_t(a.values.row);
  out.k = static_cast<const Element*>(kb) + (raw ? cond_at : own);
  out.k_row = raw ? cond_row : Dp;
  out.v = static_cast<const Element*>(vb) + (body ? value_at : own);
  out.v_row = body ? value_row : Dp;
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

// The logits of one warp's scores on a KV tile of kCols columns (MB m16 blocks of rows), for the softmax's
// FFMA a x + b (a = the scale, b = the record's bias): a full tile without column fix-ups (the steady state
// of a record, warp-uniform) takes the scores as they are; a masked or fixed-up tile first replaces the
// scores of the columns a row does not see: -inf, or in a window record with its edges' summaries (plan.h
// window_sums, G = 16; bias 0) the mean score of the key's G-block over the tile's keys (spread over the
// block's n_b columns it weighs n_b 2^mean: rule 4's log n_b). In the one tile holding the ragged last
// G-block's summary, that column's score is shifted by (its bias - the record's) / the scale, so that a x + b
// carries its own bias. Both kernels' warps call it (mainloop.h, hopper/body_kernel.h).
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
          x = ((seen[rr] >> off(n, j)) & 1u) ? x : -INFINITY;
        }
  }
  if (ragged >= 0) {  // warp-uniform, one tile a call: the ragged block's column gets its own bias
    const int32_t last = ragged - base;  // its bit in the lane's word, when the lane holds it
    const float delta = __fdividef(last_bias - bias, scale_log2);  // so that a x + b has last_bias
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const float d = off(n, j) == last ? delta : 0.f;
#pragma unroll
        for (int mb = 0; mb < MB; ++mb)
#pragma unroll
          for (int h = 0; h < 2; ++h) s[mb][n][2 * h + j] += d;
      }
  }
}

// One KV tile of kCols columns for one warp: scores, logits, softmax, PV. In a window tile with its
// edges' summaries, a row's keys outside its bounds take their G-block's mean score. kLogits = false: the
// unmasked loop's tile (full, no column fix-up), with no logit code at all.
template <typename Traits, int kCols, bool kLogits = true>
__device__ __forceinline__ void warp_tile(float (&o)[Traits::kMBlocks][Traits::kHeadDim / 8][4],
                                          OnlineSoftmax<Traits::kMBlocks>& softmax,
                                          const WarpTile<typename Traits::Element>& w) {
  constexpr int MB = Traits::kMBlocks, NT = kCols / 8;
  static_assert(kCols != 64 || Traits::kBlockN == 64, "only full 64-key tiles are stored permuted");
  float s[MB][NT][4];
  if (w.given == nullptr) WarpGemm<Traits>::template qk<kCols>(s, w.q, w.k, w.lane);
  else given_scores<MB, NT>(s, w.given, w.given_rows, w.given_cols, w.row0, w.lane % 4);
  if constexpr (kLogits) tile_logits<MB, kCols>(s, w);
  softmax.template update<NT, Traits::kHeadDim / 8>(s, o, w.scale_log2, w.bias);
  WarpGemm<Traits>::template pv<kCols>(o, s, w.v, w.lane);
}

// A control CTA's walk over its chunk (plan.h plan_control_tile's records; the slot holds its rows, filled
// and published by the first barrier here). Every warp holds the CTA's kControlTileRows rows and takes its
// 16-column unit of each tile (control_unit), so the 4 warps split the chunk's keys; every row sees every
// key of the records, so a unit is a full tile (column fix-ups past its keys). Each warp leaves its
// normalised partial output and base-2 log-sum-exp, merged with the other parts by the combine kernel.
// sBounds: the body's row-bounds buffer, which warp_tile reads on a fixed-up tile but uses only on masked
// ones (any values serve here). kFold: this CTA folds Lite's preparation in (NatFold: nat, s_nat and s_v the KV
// head's k_nat, s_nat and s_v; a walk of its own, so that the fold's registers cost the other CTAs' walk nothing).
template <typename Traits, bool kFold>
__device__ __forceinline__ void control_walk(const AttnKernelParams& p, const QueryTile& t, int32_t head,
                                             const typename Traits::Element* sQ, typename Traits::Element* sK,
                                             typename Traits::Element* sV, const Record* sRec,
                                             const RecordArrays<typename Traits::Element>* sArrays, int32_t count,
                                             const int32_t* sBounds, typename Traits::Element* nat,
                                             typename Traits::Element* s_nat, typename Traits::Element* s_v) {
  using Element = typename Traits::Element;
  constexpr int N = Traits::kBlockN, Dp = Traits::kHeadDim, MB = Traits::kMBlocks, DT = Dp / 8;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, tq = lane % 4, gq = lane / 4;
  OnlineSoftmax<MB> softmax;
  softmax.init();
  float o[MB][DT][4];
  zero_output(o);
  TileCursor cursor;
  KvTile cur{}, nxt{};
  bool have_cur = false;
  int stage = 1;
  int32_t first = 0;  // the warp of the current tile's first unit
  // Keys read from k itself are rotated as each tile lands (rotate_cond_keys; folding, NatFold, its cos / sin
  // loaded before the tile's wait).
  const bool cond_raw = p.kv.cond_raw && p.cos_cond != nullptr;
  [[maybe_unused]] std::conditional_t<kFold, NatFold<Traits>, NoFold> fold(p);
  // Iteration n issues the copy of tile n (plain row order) and computes tile n - 1.
  for (;;) {
    const bool have_nxt = cursor.advance<N, kCtrlCols>(p.geo, sRec, count, nullptr, 0, nxt);
    const bool rotates = have_cur && cond_raw && KeySet(sRec[cur.record].keys) == KeySet::kCond;
    if constexpr (kFold)
      if (rotates) fold.tables(p, cur);
    cp_async_wait_all();
    __syncthreads();  // tile n - 1 landed; every warp is done with tile n - 2
    copy_tile<Traits>(sK, sV, stage ^ 1, sArrays, nxt, false);  // past the last tile: a zero fill
    cp_async_commit();
    if (!have_cur && !have_nxt) break;
    if (rotates) {
      // k's own rows, as they landed (and, folding, Lite's preparation of them and of their values)
      if constexpr (kFold) fold.run(sK + stage * Traits::kKVElems, sV + stage * Traits::kKVElems, cur, p, nat, s_nat, s_v);
      else rotate_cond_keys<Traits>(sK + stage * Traits::kKVElems, cur, p);
      __syncthreads();  // every warp reads keys another warp rotated
    }
    if (have_cur) {
      const KvTile mine = control_unit(cur, warp, first);
      if (__any_sync(0xffffffffu, mine.n > 0)) {  // warp-uniform (a vote: ptxas sees it so)
        const int32_t unit = (mine.a - cur.a) * Traits::kStride;
        const WarpTile<Element> w{sQ, sK + stage * Traits::kKVElems + unit, sV + stage * Traits::kKVElems + unit,
                                  lane, gq, TileWork::kFull, has_column_fixups(mine, -1), false, mine, -1,
                                  sBounds, sBounds + Traits::kBlockM, nullptr, 0, 0, p.scale_log2,
                                  sRec[cur.record].bias_log2, 0.f};
        warp_tile<Traits, kCtrlCols>(o, softmax, w);
      }
      first = (first + cur.width / kCtrlCols) % kControlSplit;
    }
    cur = nxt;
    have_cur = have_nxt;
    stage ^= 1;
  }
  float row_sum[2 * MB];
  softmax.finish(row_sum);
  const int64_t at = (int64_t(t.chunk * kControlSplit + warp) * p.B * p.Hq + head) * p.geo.C + t.i0;
  float* const ctrl_o = p.ctrl_o + at * Dp;  // read once: the stores under a condition are then predicated
  float* const ctrl_lse = p.ctrl_lse + at;
#pragma unroll
  for (int rr = 0; rr < 2 * MB; ++rr) {
    const int row = (rr / 2) * 16 + gq + 8 * (rr % 2);
    if (row >= t.nrows) continue;
    // A part that saw no key (its units past the chunk's keys) leaves o = 0 and lse = m + log2 0 = -inf.
    const float inv = row_sum[rr] > 0.f ? __fdividef(1.f, row_sum[rr]) : 0.f;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
      *reinterpret_cast<float2*>(ctrl_o + row * Dp + dt * 8 + 2 * tq) =
          make_float2(o[rr / 2][dt][2 * (rr % 2)] * inv, o[rr / 2][dt][2 * (rr % 2) + 1] * inv);
    if (tq == 0) ctrl_lse[row] = softmax.m[rr] + __log2f(row_sum[rr]);
  }
}

// A control CTA (query_tile: kControlTileRows control rows, chunk t.chunk of the keys): its two records
// (plan.h plan_control_tile) and their arrays, its rows in the slot unrotated, then control_walk. Its own
// function, so that nothing of the body CTAs' prologue stays live across their walk on its account. kMayFold:
// the CTA folds Lite's preparation in where p.fold asks (control_kernel's CTAs; attn_kernel's never do, so that
// it carries none of the fold's code).
template <typename Traits, bool kMayFold = false>
__device__ __forceinline__ void control_cta(const AttnKernelParams& p, const QueryTile& t, int32_t head,
                                            int32_t batch, int32_t h, int32_t bh, unsigned char* smem) {
  using Element = typename Traits::Element;
  using Layout = SharedLayout<Traits>;
  Element* sQ = reinterpret_cast<Element*>(smem);
  Record* sRec = reinterpret_cast<Record*>(smem + Layout::kRecords);
  RecordArrays<Element>* sArrays = reinterpret_cast<RecordArrays<Element>*>(smem + Layout::arrays(p.max_records, p.retrieved_k));
  RSWA_STATIC_SHARED(int32_t, control_count);
  const int tid = threadIdx.x;
  if (tid == 0) control_count = plan_control_tile(p.geo, t.chunk, p.control_chunk_keys, p.control_bias_log2, sRec);
  __syncthreads();
  const int32_t count = control_count;
  if (tid < count) {
    RecordArrays<Element> ra;
    record_arrays<Element>(p.kv, KeySet(sRec[tid].keys), bh, batch, bh - batch * p.Hkv, Traits::kHeadDim, ra);
    sArrays[tid] = ra;
  }
  const Element* q_rows = static_cast<const Element*>(p.q) + p.q_strides.at(batch, h, t.i0);
  const Element* row = tid < t.nrows ? q_rows + int64_t(tid) * p.q_strides.row : nullptr;
  fill_row<Traits>(sQ + tid * Traits::kStride, row, nullptr, nullptr, 1.f, p.rotary_half, p.D, p.interleaved,
                   slot_rows_in_chunks<Traits>(p, q_rows));
  // Lite's preparation folded in (attn_setup.h nat_keys_from_control): by the first control tile of the KV head's
  // first query head, once for every body key over its chunks. NatFold exists where the control CTAs' tiles are
  // 64 keys at head dim 64 on the tensor cores.
  constexpr bool kNat = kMayFold && Traits::kHeadDim == 64 && Traits::kBlockN == 64 && Traits::kTensorCores;
  Element* sK = reinterpret_cast<Element*>(smem + Layout::kK);
  Element* sV = reinterpret_cast<Element*>(smem + Layout::kV);
  const int32_t* sBounds = reinterpret_cast<const int32_t*>(smem + Layout::kRows);
  if constexpr (kNat) {
    if (p.fold.k_nat != nullptr && t.i0 == 0 && p.by_group.mod(h) == 0) {
      control_walk<Traits, true>(p, t, head, sQ, sK, sV, sRec, sArrays, count, sBounds,
                                 static_cast<Element*>(p.fold.k_nat) + bh * p.kv.key_stride,
                                 static_cast<Element*>(p.fold.s_nat) + bh * p.kv.sum_stride,
                                 static_cast<Element*>(p.fold.s_v) + bh * p.kv.sum_stride);
      return;
    }
  }
  control_walk<Traits, false>(p, t, head, sQ, sK, sV, sRec, sArrays, count, sBounds, nullptr, nullptr, nullptr);
}

// What a body CTA's fills, dots and epilogue need of its tile, kept in shared memory for the walk (not in
// registers across it).
struct BodyCta {
  const void* q_rows;  // the q row of the tile's first row
  int64_t row0;        // the output row of the tile's first row
  int32_t i0, nrows, bh;
  uint32_t needed;     // the query variants the tile fills (tile.h variants_needed)
  bool q_chunks;       // slot_rows_in_chunks
};

// Row r of a body tile under query variant v into its slot row dst (kCore: a wgmma operand's layout,
// slot_col): rotated from q with the rope tables, zero on padding rows. kPairs, kSplit, part: fill_row_vector's.
template <typename Traits, bool kCore = false, int kPairs = 4, bool kSplit = false>
__device__ __forceinline__ void fill_slot_row(const AttnKernelParams& p, const BodyCta& cta, QVar v, int r,
                                              typename Traits::Element* dst, int part = 0) {
  using Element = typename Traits::Element;
  const Geometry& g = p.geo;
  const int half = p.rotary_half;
  const bool in = r < cta.nrows;
  const float *cs = nullptr, *sn = nullptr;  // this row's table rows (null: no rotation)
  float sign = 1.f;
  if (in && v != QVar::kPlain && half > 0) {  // padding rows read no table row (past L)
    const int32_t pos = v == QVar::kCond ? cta.i0 + r : variant_position(g, v, cta.i0 + r);
    const int64_t at = int64_t(pos < 0 ? -pos : pos) * half;
    cs = (v == QVar::kCond ? p.cos_cond : p.cos_int) + at;
    sn = (v == QVar::kCond ? p.sin_cond : p.sin_int) + at;
    sign = pos < 0 ? -1.f : 1.f;
  }
  const Element* row = in ? static_cast<const Element*>(cta.q_rows) + int64_t(r) * p.q_strides.row : nullptr;
  fill_row<Traits, kCore, kPairs, kSplit>(dst, row, cs, sn, sign, half, p.D, p.interleaved, cta.q_chunks, part);
}

// Straddling blocks (plan.h mixed_block): the parts of row r's logits that variant v gives, as (array, row,
// target, sign) terms, from its slot row qr (kCore: slot_col's layout); sMixA / sMixB [2][M] per side and row.
// kStep: the 16-byte loads of a term issued before any is used (2: the mma.sync kernel's; the sm_90a kernel's
// whole row, one round trip a term at head dims 64 and 80). kSplit: two threads take the row's terms, `part` 0
// the even ones and 1 the odd (a variant's terms add into distinct targets: the same sums in the same order).
template <typename Traits, bool kCore = false, int kStep = 2, bool kSplit = false>
__device__ __forceinline__ void straddling_dots(const AttnKernelParams& p, const BodyCta& cta, QVar v, int r,
                                                const typename Traits::Element* qr, const RowGeometry* sRow,
                                                float* sMixA, float* sMixB, int part = 0) {
  using Element = typename Traits::Element;
  constexpr int M = Traits::kBlockM, Dp = Traits::kHeadDim;
  if (r >= cta.nrows) return;
  const PreparedArrays& a = p.kv;
  const int32_t bh = cta.bh;
  const RowGeometry& mine = sRow[r];  // read back from shared memory: no registers held across the walk
  const int32_t lb = mine.mix[0], lm = mine.mix_m[0], rb = mine.mix[1], rm = mine.mix_m[1];
#pragma unroll 1
  for (int term = 0; term < 3; ++term) {
    const void* base = nullptr;
    int64_t row = 0;
    float* target = nullptr;
    float sign = 1.f;
    if (v == QVar::kNat) {
      if (term == 0 && lb >= 0) { base = a.s_nat; row = int64_t(lb) * Dp; target = sMixA + r; }
      if (term == 1 && lb >= 0) { base = a.p_nat; row = int64_t(lm) * Dp; target = sMixB + r; sign = -1.f; }
      if (term == 2 && rb >= 0) { base = a.p_nat; row = int64_t(rm) * Dp; target = sMixB + M + r; }
    } else if (v == QVar::kLeft) {
      if (term == 0 && lb >= 0) { base = a.p_grp; row = int64_t(lm) * Dp; target = sMixB + r; }
    } else if (v == QVar::kRight) {
      if (term == 0 && rb >= 0) { base = a.s_grp; row = int64_t(rb) * Dp; target = sMixA + M + r; }
      if (term == 1 && rb >= 0) { base = a.p_grp; row = int64_t(rm) * Dp; target = sMixB + M + r; sign = -1.f; }
    }
    if (target == nullptr || (kSplit && term % 2 != part)) continue;
    const bool summary = base == a.s_nat || base == a.s_grp;
    const Element* x = static_cast<const Element*>(base) + bh * (summary ? a.sum_stride : a.key_stride) + row;
    // 16-byte loads, kStep issued before any is used (4 round trips per term at head dim 64 in bf16 with 2,
    // was 8 of 2-byte loads; prepared rows are 16-byte aligned), summed in dim order.
    constexpr int kChunk = 16 / int(sizeof(Element));
    static_assert(Dp % (kStep * kChunk) == 0, "whole steps");
    float acc = 0.f;
#pragma unroll 1
    for (int d0 = 0; d0 < Dp; d0 += kStep * kChunk) {
      uint4 raw[kStep];
#pragma unroll
      for (int c = 0; c < kStep; ++c) raw[c] = *reinterpret_cast<const uint4*>(x + d0 + c * kChunk);
#pragma unroll
      for (int c = 0; c < kStep; ++c) {
        Element xe[kChunk], qe[kChunk];
        memcpy(xe, &raw[c], 16);
        const uint4 qraw = *reinterpret_cast<const uint4*>(qr + slot_col<kCore>(d0 + c * kChunk));
        memcpy(qe, &qraw, 16);
#pragma unroll
        for (int e = 0; e < kChunk; ++e) acc += to_float(qe[e]) * to_float(xe[e]);
      }
    }
    *target += sign * acc;
  }
}

// CTA `cta_index` of one call's launch (p: the call's parameters): attn_kernel's body, and the packed launch's per
// sequence (attn_packed_kernel).
template <typename Traits>
__device__ __forceinline__ void attn_cta(const AttnKernelParams& p, int32_t cta_index) {
  using Element = typename Traits::Element;
  using Layout = SharedLayout<Traits>;
  constexpr int M = Traits::kBlockM, N = Traits::kBlockN, Dp = Traits::kHeadDim, MB = Traits::kMBlocks;
  constexpr int DT = Dp / 8, WR = Traits::kWarpRows;
  static_assert(M == Traits::kThreads, "one thread per query row: its bounds, its straddling blocks");
  const Geometry& g = p.geo;

  const int32_t head = p.by_ctas_per_head.div(cta_index);  // b * Hq + h
  const QueryTile t = query_tile<M>(p, p.by_ctas_per_head.mod(cta_index));
  if (t.nrows <= 0) return;  // the whole CTA leaves before any barrier
  const int32_t batch = p.by_Hq.div(head), h = p.by_Hq.mod(head);
  const int32_t bh = batch * p.Hkv + p.by_group.div(h);

  RSWA_DYNAMIC_SHARED(smem);
  if (t.control) {  // control rows: a CTA of their own kind (its prologue and walk share no state with the body's)
    control_cta<Traits>(p, t, head, batch, h, bh, smem);
    return;
  }
  Element* sQ = reinterpret_cast<Element*>(smem);
  Element* sK = reinterpret_cast<Element*>(smem + Layout::kK);
  Element* sV = reinterpret_cast<Element*>(smem + Layout::kV);
  Record* sRec = reinterpret_cast<Record*>(smem + Layout::kRecords);
  RecordArrays<Element>* sArrays = reinterpret_cast<RecordArrays<Element>*>(smem + uint32_t(Layout::arrays(p.max_records, p.retrieved_k)));
  int32_t* sRet = reinterpret_cast<int32_t*>(smem + uint32_t(Layout::retrieved(p.max_records, p.retrieved_k)));
  TileSpan* sSpan = reinterpret_cast<TileSpan*>(smem + uint32_t(Layout::spans(p.max_records)));
  // Per row: its bounds in the current record, the two parts of its straddling blocks' logits (per side)
  // and, in a direct record, its raw score.
  int32_t* sLo = reinterpret_cast<int32_t*>(smem + Layout::kRows);
  int32_t* sHi = sLo + M;
  float* sMixA = reinterpret_cast<float*>(sHi + M);  // [2][M]
  float* sMixB = sMixA + 2 * M;                      // [2][M]
  float* sRaw = sMixB + 2 * M;
  int32_t* sCurrent = reinterpret_cast<int32_t*>(sRaw + M);  // per warp: the record whose bounds sLo / sHi hold
  RowGeometry* sRow = reinterpret_cast<RowGeometry*>(smem + Layout::kGeometry);
  // The Hn bands (only when the call has them: otherwise not allotted).
  Element* sBandK = reinterpret_cast<Element*>(smem + uint32_t(Layout::band_k(p.max_records, p.retrieved_k)));
  float* sBand = reinterpret_cast<float*>(smem + uint32_t(Layout::band_logits(p.max_records, p.retrieved_k)));
  constexpr int kBandStride = Layout::kBandStride;
  static_assert(kBandBlocks == kCtrlCols, "an Hn band is one direct tile");
  RSWA_STATIC_SHARED(BandRecords, shared_bands);

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, tq = lane % 4, gq = lane / 4;
  const int32_t i = t.i0 + tid;  // this thread's row (body tiles)

  // ---- prologue: records, retrieved blocks, straddling blocks --------------------------------------
  const int64_t plan = int64_t(bh) * p.body_tiles + t.index;
  const int32_t count = p.record_count[2 * plan], spans = p.record_count[2 * plan + 1];
  // The plan's records and spans in one copy, as laid out (the records' unused entries too: one loop).
  const int4* src = reinterpret_cast<const int4*>(records_of(p, p.records, plan));
#pragma unroll 1
  for (int x = tid; x < p.max_records + spans; x += M) reinterpret_cast<int4*>(sRec)[x] = src[x];
  const int32_t k = p.retrieved != nullptr ? p.retrieved_k : 0;
  const int32_t* given = k > 0 ? p.retrieved + (int64_t(bh) * p.nQb + t.qb) * k : nullptr;
#pragma unroll 1
  for (int x = tid; x < k; x += M) sRet[x] = given[x];
  __syncthreads();
  // Each record's arrays, read by the tile copies (the barriers below publish them).
#pragma unroll 1
  for (int x = tid; x < count; x += M) {
    RecordArrays<Element> ra;
    record_arrays<Element>(p.kv, KeySet(sRec[x].keys), bh, batch, bh - batch * p.Hkv, Dp, ra);
    sArrays[x] = ra;
  }
  // This thread's row, for record_bounds and its straddling blocks.
  const RowGeometry me = row_geometry(g, i, sRet, k);
  sRow[tid] = me;
  const bool valid = tid < t.nrows;
  if (tid < Traits::kWarps) sCurrent[tid] = -1;  // no record's bounds yet (published by the barriers below)
  uint32_t any = 0;  // bit x: some row has a straddling block on side x
#pragma unroll
  for (int x = 0; x < 2; ++x) {
    sMixA[x * M + tid] = 0.f;
    sMixB[x * M + tid] = 0.f;
    any |= uint32_t(__syncthreads_or(valid && me.mix[x] >= 0) != 0) << x;
  }
  const uint32_t needed = variants_needed(sRec, count, any & 1, any & 2);
  // The Hn bands: logits -inf until the variant of a row's class gives them (rows past the tile keep it).
  // Kept in shared memory for band_dots (published by the fill's barriers), not in registers across the walk.
  const BandRecords bands = BandRecords::find(sRec, count);
  if (tid == 0) shared_bands = bands;
  if (bands.n[0] + bands.n[1] > 0)
#pragma unroll 1
    for (int x = tid; x < 2 * M * kBandStride; x += M) sBand[x] = -INFINITY;

  // ---- the query slot --------------------------------------------------------------------------------
  RSWA_STATIC_SHARED(BodyCta, cta);
  if (tid == 0) {
    const int32_t n0 = g.C + t.i0 - p.first_row;  // q row of the tile's first row
    const Element* q_rows = static_cast<const Element*>(p.q) + p.q_strides.at(batch, h, n0);
    cta = BodyCta{q_rows, int64_t(head) * p.Nq + n0, t.i0, t.nrows, bh, needed, slot_rows_in_chunks<Traits>(p, q_rows)};
  }
  __syncthreads();  // cta is published
  // The tile's rows under variant v (thread r fills row r), and the straddling blocks' parts it gives.
  auto fill = [&](QVar v) { fill_slot_row<Traits>(p, cta, v, tid, sQ + tid * Traits::kStride); };
  auto mixed_dots = [&](QVar v) {
    straddling_dots<Traits>(p, cta, v, tid, sQ + tid * Traits::kStride, sRow, sMixA, sMixB);
  };

  // The Hn bands (plan.h hn_bands, band_columns): while the slot holds variant v, the band blocks of v's
  // class get their scores from a 16-column product per band with its summary rows (native means for near
  // blocks, grouped ones for far blocks). Every thread of the CTA calls it alike (barriers inside).
  auto band_dots = [&](QVar v) {
    constexpr int kChunk = 16 / int(sizeof(Element)), kChunks = Dp / kChunk;
    const PreparedArrays& a = p.kv;
    const Element* src = static_cast<const Element*>(v == QVar::kNat ? a.s_nat : a.s_grp) + cta.bh * a.sum_stride;
#pragma unroll 1
    for (int side = 0; side < 2; ++side) {
      if (!shared_bands.uses(side, v)) continue;
      const int32_t k0 = shared_bands.first(side), nb = shared_bands.blocks(side);
      // The band's summary rows of v's class (zero past its blocks).
#pragma unroll 1
      for (int x = tid; x < kBandBlocks * kChunks; x += M) {
        const int r = x / kChunks, c = (x % kChunks) * kChunk;
        uint4 val = make_uint4(0u, 0u, 0u, 0u);
        if (r < nb) val = *reinterpret_cast<const uint4*>(src + int64_t(k0 + r) * Dp + c);
        *reinterpret_cast<uint4*>(sBandK + r * Traits::kStride + c) = val;
      }
      __syncthreads();
      float sc[MB][kBandBlocks / 8][4];
      WarpGemm<Traits>::template qk<kBandBlocks>(sc, sQ + warp * WR * Traits::kStride, sBandK, lane);
      // plan.h band_columns, one field of each row's geometry read per row (rows past the tile store
      // scores of their zero queries, never output).
      const BandEdge e = band_edge(side, v);
#pragma unroll
      for (int mb = 0; mb < MB; ++mb)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = warp * WR + mb * 16 + gq + h * 8;
          const Bounds b = band_columns(e, reinterpret_cast<const int32_t*>(sRow + row)[e.field], k0, nb);
          float* out = sBand + (side * M + row) * kBandStride;
#pragma unroll
          for (int n = 0; n < kBandBlocks / 8; ++n)
#pragma unroll
            for (int j = 0; j < 2; ++j) {
              const int c = n * 8 + 2 * tq + j;
              if (uint32_t(c - b.lo) < uint32_t(b.hi - b.lo)) out[c] = sc[mb][n][2 * h + j];
            }
        }
      __syncthreads();  // every warp has read the band tile (the next band or call overwrites it)
    }
  };

  // ---- the walk over the KV tiles ----------------------------------------------------------------------
  OnlineSoftmax<MB> softmax;
  softmax.init();
  float o[MB][DT][4];
  zero_output(o);

  // This lane's rows: slot rr = 2 mb + h is tile row warp * 32 + 16 mb + g + 8 h.
  auto row_of = [&](int rr) { return warp * WR + (rr / 2) * 16 + gq + 8 * (rr % 2); };
  // The slot's variants from fill slot `from` to `to` (variant_at), those the CTA needs: after the barrier
  // that ends every warp's use of the slot, the fill, and the straddling blocks' and Hn bands' dots it gives.
  auto fill_slots = [&](int32_t from, int32_t to) {
#pragma unroll 1
    for (int32_t at = from; at <= to; ++at) {
      const QVar v = variant_at(at);
      if (!((cta.needed >> int(v)) & 1)) continue;
      __syncthreads();  // every warp is done with the slot (its last tile, the previous variant's dots)
      fill(v);
      __syncthreads();
      mixed_dots(v);
      band_dots(v);
    }
  };
  // The tiles in the order of the plan's spans (tile.h plan_spans); with two K/V stages tile n + 1's copy is
  // issued before tile n is computed, with three tile n + 2's (tile n + 1's in flight since the tile before:
  // cp.async.wait_group 1), one barrier per tile: `step` waits for the current tile and issues the next
  // copy into the stage the tile before it used. Three stages keep one more tile's descriptor (`nxt`) and the
  // cursor as it was at the current tile (`lag`: its run), and rotate the stage index without a division.
  constexpr int kStages = Traits::kStages;
  SpanCursor cursor, lag;
  KvTile cur{}, nxt, far;
  int stage = 0;
  const bool first = cursor.advance(sSpan, spans, cur);
  if (first) copy_tile<Traits>(sK, sV, 0, sArrays, cur, true);
  cp_async_commit();
  if constexpr (kStages == 3) {
    lag = cursor;
    cursor.advance(sSpan, spans, nxt);
    if (first) copy_tile<Traits>(sK, sV, 1, sArrays, nxt, true);
    cp_async_commit();
  }
  // Past the last tile the cursor leaves a tile of no keys, whose copy zero-fills the free stage: no branch.
  KvTile& ahead = kStages == 3 ? far : nxt;  // the tile whose copy `step` issues
  auto step = [&]() {
    if constexpr (kStages == 3) lag = cursor;
    cursor.advance(sSpan, spans, ahead);
    if constexpr (kStages == 3) cp_async_wait_group<1>();  // tile n landed; tile n + 1 may be in flight
    else cp_async_wait_all();
    __syncthreads();  // the current tile landed; every warp is done with the one before it
    copy_tile<Traits>(sK, sV, kStages == 3 ? (stage == 0 ? 2 : stage - 1) : stage ^ 1, sArrays, ahead, true);
    cp_async_commit();
  };
  // After a tile: the next one is current.
  auto rotate = [&]() {
    cur = nxt;
    if constexpr (kStages == 3) {
      nxt = far;
      stage = stage == 2 ? 0 : stage + 1;
    } else {
      stage ^= 1;
    }
  };
  // Per run of tiles of one kind (the spans: per query variant its unmasked tiles, then its masked ones):
  // the slot's fills since the run before (SpanCursor: `from`), then the run's loop, while the tiles continue
  // the run; once the tiles are done, the variants straddling blocks may still need.
#pragma unroll 1
  for (;;) {
    int32_t kind, from;
    (kStages == 3 ? lag : cursor).run(sSpan, spans, kind, from);  // the current tile's run
    fill_slots(from, kind >= 0 ? kind >> 1 : kVariantSlots - 1);
    if (kind < 0) break;
    // The unmasked loop (FlashAttention's): every row of the CTA sees every key of the tile, no column
    // fix-up; no bounds, no selects, no warp reduction. (A warp of padding rows computes them, unused.)
    if (!(kind & 1)) {
#pragma unroll 1
    do {
      step();
      // Only the record's bias of the tile is used (no bounds, no fix-ups): the next tile is the state.
      const float bias = sRec[cur.record].bias_log2;
      const WarpTile<Element> w{sQ + warp * WR * Traits::kStride, sK + stage * Traits::kKVElems,
                                sV + stage * Traits::kKVElems, lane, row_of(0), TileWork::kFull, false, false, cur,
                                -1, sLo, sHi, nullptr, 0, 0, p.scale_log2, bias, 0.f};
      warp_tile<Traits, N, false>(o, softmax, w);
      rotate();
    } while (cur.cont);
    } else {
    // The masked loop: the variant's other tiles. Per record, each row's bounds; per tile and warp, skip /
    // full / masked by two votes of its rows, and the column fix-ups (tile.h).
#pragma unroll 1
    do {
      step();
      const Record rec = sRec[cur.record];
      if (__any_sync(0xffffffffu, cur.record != sCurrent[warp])) {  // a new record: each row's bounds
        sCurrent[warp] = cur.record;  // every lane the same value, after every lane read it (the vote)
        const Bounds b = record_bounds(g, rec, sRow[tid], cta.i0 + tid);
        sLo[tid] = b.lo;
        sHi[tid] = b.hi;
        // This row's straddling block: every part is in (its own dots, done).
        const int x = Scope(rec.scope) == Scope::kMixedLeft ? 0 : 1;
        if (rec.flags & kRecBand) {  // joins the band's scores
          const int32_t blk = x == 0 ? sRow[tid].mix[0] : sRow[tid].mix[1];
          if (valid && blk >= rec.k0 && blk < rec.k0 + rec.n)
            sBand[(x * M + tid) * kBandStride + blk - rec.k0] = straddling_score(g, blk, sMixA[x * M + tid], sMixB[x * M + tid]);
        } else if (rec.flags & kRecDirect) {
          sRaw[tid] = b.hi > b.lo ? straddling_score(g, b.lo, sMixA[x * M + tid], sMixB[x * M + tid]) : 0.f;
        }
        __syncwarp();  // the warp's rows' bounds are in shared memory
      }
      cur.excluded = (rec.flags & kRecExclude) ? exclusion_bits(g, sRet, k, cur.a, cur.n) : 0;
      const Bounds mine{sLo[tid], sHi[tid]};
      const TileWork work = classify(__all_sync(0xffffffffu, row_sees_all(mine, cur, valid)),
                                     __any_sync(0xffffffffu, row_sees_any(mine, cur, valid)), rec);
      if (work != TileWork::kSkip) {
        const int32_t ragged = ragged_column(g, rec, cur);
        const bool fixups = has_column_fixups(cur, ragged);
        WarpTile<Element> w{sQ + warp * WR * Traits::kStride, sK + stage * Traits::kKVElems,
                            sV + stage * Traits::kKVElems, lane, row_of(0), work, fixups,
                            (rec.flags & kRecWindowSums) != 0, cur, ragged, sLo, sHi, nullptr, 0, 0,
                            p.scale_log2, rec.bias_log2, g.log2_last_block};
        if (cur.width == kCtrlCols) {  // control keys, a direct record or an Hn band: 16 columns
          const bool band = (rec.flags & kRecBand) != 0;
          w.given = band ? sBand + (Scope(rec.scope) == Scope::kMixedLeft ? 0 : M) * kBandStride
                    : (rec.flags & kRecDirect) ? sRaw : nullptr;
          w.given_rows = band ? kBandStride : 1;
          w.given_cols = band ? 1 : 0;
          w.sums = false;
          warp_tile<Traits, kCtrlCols>(o, softmax, w);
        } else {
          warp_tile<Traits, N>(o, softmax, w);
        }
      }
      rotate();
    } while (cur.cont);
    }
  }

  // ---- epilogue -------------------------------------------------------------------------------------------
  float row_sum[2 * MB];
  softmax.finish(row_sum);
  // Body rows: O / l in the element type, staged through the query slot so that rows leave in 16-byte stores.
  __syncthreads();  // every warp is done with the slot
  const int64_t row0 = cta.row0;
  const int32_t nrows = cta.nrows;
  constexpr float kLn2 = 0.6931471805599453f;
  float* const lse = p.lse + row0;  // read once: stores under a condition are then predicated
#pragma unroll
  for (int rr = 0; rr < 2 * MB; ++rr) {
    const int row = row_of(rr);
    const float inv = __fdividef(1.f, row_sum[rr]);
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
      store2(sQ + row * Traits::kStride + dt * 8 + 2 * tq, o[rr / 2][dt][2 * (rr % 2)] * inv,
             o[rr / 2][dt][2 * (rr % 2) + 1] * inv);
    if (tq == 0 && row < nrows) lse[row] = (softmax.m[rr] + __log2f(row_sum[rr])) * kLn2;
  }
  __syncwarp();
  Element* out = static_cast<Element*>(p.out);
  constexpr int kChunk = 16 / int(sizeof(Element)), kChunks = Dp / kChunk;
  if (p.D % kChunk == 0) {  // rows of D elements stay 16-byte aligned
#pragma unroll 1
    for (int x = lane; x < WR * kChunks; x += 32) {
      const int row = warp * WR + x / kChunks, col = (x % kChunks) * kChunk;
      if (row < nrows && col < p.D)
        *reinterpret_cast<uint4*>(out + (row0 + row) * p.D + col) =
            *reinterpret_cast<const uint4*>(sQ + row * Traits::kStride + col);
    }
  } else {
#pragma unroll 1
    for (int x = lane; x < WR * Dp; x += 32) {
      const int row = warp * WR + x / Dp, col = x % Dp;
      if (row < nrows && col < p.D) out[(row0 + row) * p.D + col] = sQ[row * Traits::kStride + col];
    }
  }
}

// One launch of the fused kernel for one call: per head, its control CTAs, then its body CTAs.
template <typename Traits>
__global__ void __launch_bounds__(Traits::kThreads, 2) attn_kernel(const __grid_constant__ AttnKernelParams p) {
  attn_cta<Traits>(p, int32_t(blockIdx.x));
}

// The control CTAs of one call alone, Lite's preparation folded into those that p.fold names (attn_setup.h
// nat_keys_from_control; the sm_90a launch's control grid, hopper/body_launch.h): p's CTAs per head are its
// control tiles. A kernel of its own, beside attn_kernel, whose CTAs run the same control_cta without the fold.
template <typename Traits>
__global__ void __launch_bounds__(Traits::kThreads, 2) control_kernel(const __grid_constant__ AttnKernelParams p) {
  const int32_t cta = int32_t(blockIdx.x);
  const int32_t head = p.by_ctas_per_head.div(cta);  // b * Hq + h
  const QueryTile t = query_tile<Traits::kBlockM>(p, p.by_ctas_per_head.mod(cta));
  if (t.nrows <= 0 || !t.control) return;
  const int32_t batch = p.by_Hq.div(head), h = p.by_Hq.mod(head);
  RSWA_DYNAMIC_SHARED(smem);
  control_cta<Traits, true>(p, t, head, batch, h, batch * p.Hkv + p.by_group.div(h), smem);
}

// One launch for up to PackedAttnLaunch::kSeqs sequences of a packed call (attn_params.h): CTA x is CTA x - first[s]
// of sequence s's own launch, run on its own parameters (in the kernel parameter space, so warp-uniform as
// attn_kernel's). The same CTA code as attn_kernel's; the one-call kernel is unchanged by it.
template <typename Traits>
__global__ void __launch_bounds__(Traits::kThreads, 2) attn_packed_kernel(const __grid_constant__ PackedAttnLaunch pk) {
  const int32_t x = int32_t(blockIdx.x);
  // The last sequence s with first[s] <= x. sm_90a: a scan at fixed offsets, in uniform registers; sm_80: a binary
  // search (ptxas spills at head dim 128 with three stages on sm_90a with the search, on sm_80 with the scan).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  const int32_t s = packed_sequence(pk, x);
#else
  int32_t s = 0;
#pragma unroll
  for (int j = 1; j < PackedAttnLaunch::kSeqs; ++j) s += int32_t(j < pk.S && pk.first[j] <= x);
#endif
  attn_cta<Traits>(pk.seq[s], x - pk.first[s]);
}

}  // namespace rangeswa::cuda
