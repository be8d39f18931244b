// Host emulation of the fused attention kernel (mainloop.h) for machines without a GPU: the same setup
// (attn_setup.h), the same preparation (prepare.h prepare_unit), the same plan (plan.h, through
// attn_params.h plan_tile), and each CTA's walk over its records with the kernel's own decisions
// (tile.h: variant order, KV tiles, per-warp skip / full / masked choice, masked logits, exclusion bits,
// plan.h: straddling blocks), the matrix products done by plain loops on the same rounded operands.
// tests/test_ops_cuda.py builds it with torch.utils.cpp_extension.load and holds it to the reference over
// the test grid; tests/test_cuda_plan.py reads its plan statistics (plan_stats) for the census. What it
// cannot check (mma.sync / ldmatrix fragment layouts, cp.async, barriers, races) is listed in docs/cuda.md.
// Not part of the extension: setup.py compiles csrc/cuda/*.cu, not this folder.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <vector>

#include "checks.h"
#include "schema.h"
#include "cuda/attn_params.h"
#include "cuda/attn_setup.h"
#include "cuda/combine.h"
#include "cuda/kernel_traits.h"
#include "cuda/plan.h"
#include "cuda/prepare.h"
#include "cuda/rotary.h"
#include "cuda/tile.h"
#include "cuda/utils.h"
#include "cuda/emulator/host_call.h"

namespace rangeswa::cuda {
namespace {

// The CTA's record list (control rows plan theirs in the kernel).
struct CtaRecords {
  const Record* list;
  int32_t count;
  Record local[2];
  const int32_t* sorted;
  int32_t k;
};

CtaRecords cta_records(const AttnKernelParams& p, const QueryTile& t, int32_t bh) {
  CtaRecords r{};
  if (t.control) {
    r.count = plan_control_tile(p.geo, t.chunk, p.control_chunk_keys, p.control_bias_log2, r.local);
    r.list = r.local;
    return r;
  }
  const int64_t plan = int64_t(bh) * p.body_tiles + t.index;
  r.list = p.records + plan * p.max_records;
  r.count = p.record_count[plan];
  if (p.retrieved != nullptr) {
    r.sorted = p.retrieved + (int64_t(bh) * p.nQb + t.qb) * p.retrieved_k;
    r.k = p.retrieved_k;
  }
  return r;
}

// The array rows a record reads: keys and values of its KV head.
template <typename Element>
struct KvRows {
  const Element *keys, *values;
};

template <typename Element>
KvRows<Element> record_rows(const AttnKernelParams& p, const Record& r, int32_t bh) {
  auto at = [&](const void* base, int64_t stride) {
    return base ? static_cast<const Element*>(base) + bh * stride : nullptr;
  };
  const PreparedArrays& a = p.kv;
  switch (KeySet(r.keys)) {
    case KeySet::kCtrl: return {at(a.k_ctrl, a.ctrl_stride), at(a.v_ctrl, a.ctrl_stride)};
    case KeySet::kNat: return {at(a.k_nat, a.key_stride), at(a.v_body, a.value_stride)};
    case KeySet::kGrp: return {at(a.k_grp, a.key_stride), at(a.v_body, a.value_stride)};
    case KeySet::kCond: return {at(a.k_cond, a.key_stride), at(a.v_body, a.value_stride)};
    case KeySet::kSumNat: return {at(a.s_nat, a.sum_stride), at(a.s_v, a.sum_stride)};
    default: return {at(a.s_grp, a.sum_stride), at(a.s_v, a.sum_stride)};
  }
}

template <typename Element, int kHeadDim>
struct Emulator {
  using Traits = AttnTraits<Element, kHeadDim>;
  static constexpr int M = Traits::kBlockM, N = Traits::kBlockN, kWarpRows = Traits::kWarpRows;
  static constexpr bool kRoundP = Traits::kTensorCores;  // P enters the PV mma in the element type

  const AttnKernelParams& p;
  explicit Emulator(const AttnKernelParams& params) : p(params) {}

  static float round(float x) { return to_float(from_float<Element>(x)); }

  // The query slot: the tile's rows under variant v, rounded to the element type (zero past the rows).
  void fill(std::vector<float>& slot, const QueryTile& t, int64_t head, QVar v) {
    const Geometry& g = p.geo;
    const int64_t n0 = t.control ? t.i0 : g.C + t.i0 - p.first_row;
    const Element* q = static_cast<const Element*>(p.q) + p.q_strides.at(head / p.Hq, head % p.Hq, n0);
    for (int r = 0; r < M; ++r)
      for (int d = 0; d < kHeadDim; ++d) {
        float x = 0.f;
        if (r < t.nrows && d < p.D) {
          const Element* row = q + int64_t(r) * p.q_strides.row;
          auto load = [&](int e) { return e < p.D ? to_float(row[e]) : 0.f; };
          const int32_t i = t.i0 + r, half = p.rotary_half;
          if (v == QVar::kPlain) {
            x = load(d);
          } else if (v == QVar::kCond) {
            x = rotated_element(load, d, half, p.interleaved, p.cos_cond + i * half, p.sin_cond + i * half);
          } else {
            const int32_t pos = variant_position(g, v, i), a = pos < 0 ? -pos : pos;
            x = rotated_element(load, d, half, p.interleaved, p.cos_int + a * half, p.sin_int + a * half,
                                pos < 0 ? -1.f : 1.f);
          }
        }
        slot[r * kHeadDim + d] = round(x);
      }
  }

  // One CTA of attn_kernel.
  void cta(int64_t block) {
    const Geometry& g = p.geo;
    const int64_t per_head = int64_t(p.control_tiles) * p.control_chunks + p.body_tiles;
    const int64_t head = block / per_head;
    const QueryTile t = query_tile<M>(p, int32_t(block % per_head));
    if (t.nrows <= 0) return;
    const int32_t bh = int32_t((head / p.Hq) * p.Hkv + (head % p.Hq) / (p.Hq / p.Hkv));
    const CtaRecords rec = cta_records(p, t, bh);

    std::vector<float> m(M, -INFINITY), l(M, 0.f), o(M * kHeadDim, 0.f), slot(M * kHeadDim, 0.f);
    std::vector<float> s(M * N), kt(N * kHeadDim), vt(N * kHeadDim);
    auto update = [&](int r, const float* x, int cols, const float* values) {  // the online softmax, base 2
      float mx = -INFINITY;
      for (int c = 0; c < cols; ++c) mx = std::max(mx, x[c]);
      const float m_new = std::max(m[r], mx), shift = m_new == -INFINITY ? 0.f : m_new;
      const float alpha = std::exp2(m[r] - shift);
      m[r] = m_new;
      float sum = 0.f;
      for (int d = 0; d < kHeadDim; ++d) o[r * kHeadDim + d] *= alpha;
      for (int c = 0; c < cols; ++c) {
        const float pr = std::exp2(x[c] - shift);
        sum += pr;
        const float pv = kRoundP ? round(pr) : pr;
        for (int d = 0; d < kHeadDim; ++d) o[r * kHeadDim + d] += pv * values[c * kHeadDim + d];
      }
      l[r] = l[r] * alpha + sum;
    };

    // Rows (plan.h RowGeometry, straddling blocks included) and the two parts of those blocks' logits.
    std::vector<RowGeometry> rows(M);
    std::vector<float> mix_a(2 * M, 0.f), mix_b(2 * M, 0.f), raw(M, 0.f);
    bool any_side[2] = {false, false};
    for (int r = 0; r < M; ++r) {
      rows[r] = t.control ? RowGeometry{} : row_geometry(g, t.i0 + r, rec.sorted, rec.k);
      for (int side = 0; side < 2 && !t.control && r < t.nrows; ++side)
        any_side[side] = any_side[side] || rows[r].mix[side] >= 0;
    }
    auto row_of = [&](const void* base, int64_t stride, int32_t row) {
      return static_cast<const Element*>(base) + bh * stride + int64_t(row) * p.Dp;
    };
    auto dot = [&](int r, const Element* x) {
      float acc = 0.f;
      for (int d = 0; d < kHeadDim; ++d) acc += slot[r * kHeadDim + d] * to_float(x[d]);
      return acc;
    };
    auto mixed_dots = [&](QVar v) {
      const PreparedArrays& a = p.kv;
      for (int r = 0; r < t.nrows; ++r) {
        const MixedBlock L{rows[r].mix[0], rows[r].mix_m[0]}, R{rows[r].mix[1], rows[r].mix_m[1]};
        if (L.block >= 0 && v == QVar::kNat) {
          mix_a[2 * r] += dot(r, row_of(a.s_nat, a.sum_stride, L.block));
          mix_b[2 * r] -= dot(r, row_of(a.p_nat, a.key_stride, L.m));
        }
        if (L.block >= 0 && v == QVar::kLeft) mix_b[2 * r] += dot(r, row_of(a.p_grp, a.key_stride, L.m));
        if (R.block >= 0 && v == QVar::kNat) mix_b[2 * r + 1] += dot(r, row_of(a.p_nat, a.key_stride, R.m));
        if (R.block >= 0 && v == QVar::kRight) {
          mix_a[2 * r + 1] += dot(r, row_of(a.s_grp, a.sum_stride, R.block));
          mix_b[2 * r + 1] -= dot(r, row_of(a.p_grp, a.key_stride, R.m));
        }
      }
    };

    // The Hn bands (plan.h hn_bands): per side and row, each block's logit from the product of the row's
    // class, made while the slot holds that variant; -inf until then (and for rows past the tile).
    const BandRecords bands = t.control ? BandRecords{{0, 0}, {0, 0}} : BandRecords::find(rec.list, rec.count);
    std::vector<float> stash(2 * M * kBandBlocks, -INFINITY);
    auto band_dots = [&](QVar v) {
      const PreparedArrays& a = p.kv;
      for (int side = 0; side < 2; ++side) {
        if (!bands.uses(side, v)) continue;
        for (int r = 0; r < t.nrows; ++r) {
          const Bounds cols = band_columns(rows[r], side, v, bands.k0[side], bands.n[side]);
          for (int c = cols.lo; c < cols.hi; ++c) {
            const void* base = v == QVar::kNat ? a.s_nat : a.s_grp;
            stash[(side * M + r) * kBandBlocks + c] = dot(r, row_of(base, a.sum_stride, bands.k0[side] + c));
          }
        }
      }
    };

    const uint32_t needed =
        t.control ? 1u << int(QVar::kPlain) : variants_needed(rec.list, rec.count, any_side[0], any_side[1]);
    int32_t slot_at = -1;  // index into variant_at of the slot's variant
    auto advance_slot = [&](int32_t until) {
      while (slot_at < until) {
        ++slot_at;
        if (!((needed >> int(variant_at(slot_at))) & 1)) continue;
        fill(slot, t, head, variant_at(slot_at));
        if (!t.control) {
          mixed_dots(variant_at(slot_at));
          band_dots(variant_at(slot_at));
        }
      }
    };
    auto slot_index = [](QVar v) {
      for (int32_t x = 0; x < kVariantSlots; ++x)
        if (variant_at(x) == v) return x;
      return kVariantSlots - 1;
    };

    std::vector<Bounds> bounds(M);
    std::vector<WarpBounds> warps(M / kWarpRows);
    int32_t current = -1;
    TileCursor cursor;
    KvTile kv{};
    while (cursor.advance<N, kCtrlCols>(g, rec.list, rec.count, rec.sorted, rec.k, kv)) {
      const Record& r = rec.list[kv.record];
      advance_slot(slot_index(QVar(r.qvar)));
      if (kv.record != current) {  // a new record: its bounds per row, reduced per warp
        current = kv.record;
        for (int w = 0; w < M / kWarpRows; ++w) {
          warps[w] = WarpBounds::empty();
          for (int x = 0; x < kWarpRows; ++x) {
            const int row = w * kWarpRows + x;
            bounds[row] = t.control ? Bounds{r.k0, r.k0 + r.n} : record_bounds(g, r, rows[row]);
            if (row < t.nrows) warps[w].add(bounds[row]);
            const int side = Scope(r.scope) == Scope::kMixedLeft ? 0 : 1;
            if (r.flags & kRecBand) {  // the row's straddling block joins its band's logits
              const int32_t b = rows[row].mix[side];
              if (row < t.nrows && b >= r.k0 && b < r.k0 + r.n)
                stash[(side * M + row) * kBandBlocks + b - r.k0] =
                    straddling_score(g, b, mix_a[2 * row + side], mix_b[2 * row + side]);
            } else if (r.flags & kRecDirect) {
              const Bounds& b = bounds[row];
              raw[row] = b.hi > b.lo ? straddling_score(g, b.lo, mix_a[2 * row + side], mix_b[2 * row + side]) : 0.f;
            }
          }
        }
      }
      const KvRows<Element> src = record_rows<Element>(p, r, bh);
      for (int c = 0; c < N; ++c)
        for (int d = 0; d < kHeadDim; ++d) {  // zero past n, like cp.async
          kt[c * kHeadDim + d] = c < kv.n ? to_float(src.keys[int64_t(kv.a + c) * p.Dp + d]) : 0.f;
          vt[c * kHeadDim + d] = c < kv.n ? to_float(src.values[int64_t(kv.a + c) * p.Dp + d]) : 0.f;
        }
      const int32_t ragged = ragged_column(g, r, kv);
      const int side = Scope(r.scope) == Scope::kMixedLeft ? 0 : 1;
      const bool sums = (r.flags & kRecWindowSums) != 0;
      for (int w = 0; w < M / kWarpRows; ++w) {
        const TileWork work = classify(warps[w], kv, r);
        if (work == TileWork::kSkip) continue;
        const bool fixups = has_column_fixups(kv, ragged);
        for (int x = 0; x < kWarpRows; ++x) {
          const int row = w * kWarpRows + x;
          float* sr = s.data() + row * N;
          for (int c = 0; c < kv.width; ++c) {
            float acc = 0.f;
            for (int d = 0; d < kHeadDim; ++d) acc += slot[row * kHeadDim + d] * kt[c * kHeadDim + d];
            if (r.flags & kRecBand) acc = stash[(side * M + row) * kBandBlocks + c];
            else if (r.flags & kRecDirect) acc = raw[row];
            sr[c] = acc;
          }
          // A window tile with its edges' summaries: each G-block's mean raw score over the tile's keys.
          float means[N / 8 + 1] = {};
          if (sums && work == TileWork::kMasked)
            for (int c0 = 0; c0 < kv.n; c0 += g.G) {
              float sum = 0.f;
              const int n = std::min<int>(g.G, kv.n - c0);
              for (int c = c0; c < c0 + n; ++c) sum += sr[c];
              means[c0 / g.G] = sum / float(n);
            }
          for (int c = 0; c < kv.width; ++c) {
            const float acc = sr[c];
            sr[c] = sums && work == TileWork::kMasked
                        ? window_sum_logit(acc, means[c / g.G], c, kv, bounds[row], p.scale_log2)
                    : work == TileWork::kMasked
                        ? masked_logit(acc, c, kv, bounds[row], ragged, p.scale_log2, r.bias_log2, g.log2_last_block)
                    : fixups ? column_logit(acc, c, kv, ragged, p.scale_log2, r.bias_log2, g.log2_last_block)
                             : acc * p.scale_log2 + r.bias_log2;
          }
          update(row, sr, kv.width, vt.data());
        }
      }
    }
    if (!t.control) advance_slot(kVariantSlots - 1);

    if (t.control) {  // partial results of this chunk of keys
      const int64_t at = (int64_t(t.chunk) * p.B * p.Hq + head) * g.C + t.i0;
      for (int r = 0; r < t.nrows; ++r) {
        for (int d = 0; d < kHeadDim; ++d) p.ctrl_o[(at + r) * p.Dp + d] = o[r * kHeadDim + d] / l[r];
        p.ctrl_lse[at + r] = m[r] + std::log2(l[r]);
      }
      return;
    }
    const int64_t row0 = head * p.Nq + g.C + t.i0 - p.first_row;
    Element* out = static_cast<Element*>(p.out);
    for (int r = 0; r < t.nrows; ++r) {
      for (int d = 0; d < p.D; ++d) out[(row0 + r) * p.D + d] = from_float<Element>(o[r * kHeadDim + d] / l[r]);
      p.lse[row0 + r] = (m[r] + std::log2(l[r])) * 0.6931471805599453f;
    }
  }
};

template <typename Element>
void run(const AttnKernelParams& p, const AttnSetup& s) {
  const int64_t ctas = s.ctas_per_head() * p.B * p.Hq;
  auto all = [&](auto emulator) {
    at::parallel_for(0, ctas, 1, [&](int64_t begin, int64_t end) {
      for (int64_t block = begin; block < end; ++block) emulator.cta(block);
    });
  };
  if (s.Dp == 64) all(Emulator<Element, 64>(p));
  else if (s.Dp == 80) all(Emulator<Element, 80>(p));
  else all(Emulator<Element, 128>(p));
  combine_on_host<Element>(p);  // the combine kernel
}

// attn with the CUDA kernels' plan, on CPU tensors; `retrieved` as the op takes it (computed by the
// caller when the method retrieves).
std::tuple<at::Tensor, at::Tensor> attn_emulated(RSWA_ATTN_PARAMS, std::optional<at::TensorList> prepared) {
  HostCall hc;
  hc.ap = checked(RSWA_ATTN_ARGS, prepared);
  if (hc.ap.Nq == 0 || hc.ap.B == 0 || hc.ap.Hq == 0)
    return {at::zeros(q.sizes(), q.options()), at::zeros({hc.ap.B, hc.ap.Hq, hc.ap.Nq}, q.options().dtype(at::kFloat))};
  build(hc, q, k, v, retrieved, prepared, HostLanes{});
  dispatch_dtype(hc.q.scalar_type(), [&](auto tag) { run<decltype(tag)>(hc.p, hc.s); });
  return {hc.out, hc.lse};
}

// The plan's census: per body CTA of the first (batch, query head), the columns: records, KV tiles,
// 16-column control tiles, masked tiles (some warp masks), masked warp-tiles, full warp-tiles,
// skipped warp-tiles, rows, GEMM columns summed over rows (the columns its warp multiplies), keys seen
// summed over rows (columns it sees, straddling blocks included), straddling blocks scored per row,
// query-slot fills, masked tiles, tiles with column fix-ups, masked warp-tiles by key set, direct tiles,
// window tiles with summaries, Hn band tiles.
at::Tensor plan_stats(RSWA_ATTN_PARAMS, std::optional<at::TensorList> prepared) {
  HostCall hc;
  hc.ap = checked(RSWA_ATTN_ARGS, prepared);
  build(hc, q, k, v, retrieved, prepared, HostLanes{});
  const AttnKernelParams& p = hc.p;
  const Geometry& g = p.geo;
  constexpr int M = kAttnTileRows, W = M / 4;
  const int N = kv_tile_cols(hc.q.scalar_type() != at::kFloat, hc.s.Dp);
  at::Tensor stats = at::zeros({p.body_tiles, 22}, at::kDouble);
  for (int32_t x = 0; x < p.body_tiles; ++x) {
    double* st = stats.data_ptr<double>() + x * 22;
    const QueryTile t = query_tile<M>(p, p.control_tiles * p.control_chunks + x);
    if (t.nrows <= 0) continue;
    const CtaRecords rec = cta_records(p, t, 0);
    bool any_side[2] = {false, false};
    std::vector<RowGeometry> rows(M);
    for (int r = 0; r < M; ++r) {
      rows[r] = row_geometry(g, t.i0 + r, rec.sorted, rec.k);
      for (int side = 0; side < 2 && r < t.nrows; ++side) {
        any_side[side] = any_side[side] || rows[r].mix[side] >= 0;
        st[9] += rows[r].mix[side] >= 0;
      }
    }
    const uint32_t needed = variants_needed(rec.list, rec.count, any_side[0], any_side[1]);
    for (int32_t sl = 0; sl < kVariantSlots; ++sl) st[10] += (needed >> int(variant_at(sl))) & 1;
    // The Hn bands' products: per side, one 16-column Q K^T per variant it uses (native, its far one).
    const BandRecords bands = BandRecords::find(rec.list, rec.count);
    for (int side = 0; side < 2; ++side)
      if (bands.n[side] > 0) st[7] += 2.0 * kBandBlocks * t.nrows;
    st[0] = rec.count;
    st[5] = t.nrows;
    std::vector<Bounds> bounds(M);
    WarpBounds warps[4];
    int32_t current = -1;
    TileCursor cursor;
    KvTile kv{};
    auto advance = [&]() {
      return N == 64 ? cursor.advance<64, kCtrlCols>(g, rec.list, rec.count, rec.sorted, rec.k, kv)
                     : cursor.advance<32, kCtrlCols>(g, rec.list, rec.count, rec.sorted, rec.k, kv);
    };
    while (advance()) {
      const Record& r = rec.list[kv.record];
      if (kv.record != current) {
        current = kv.record;
        for (int w = 0; w < 4; ++w) {
          warps[w] = WarpBounds::empty();
          for (int i = 0; i < W; ++i) {
            bounds[w * W + i] = record_bounds(g, r, rows[w * W + i]);
            if (w * W + i < t.nrows) warps[w].add(bounds[w * W + i]);
          }
        }
      }
      const int32_t ragged = ragged_column(g, r, kv);
      const bool direct = (r.flags & kRecDirect) != 0;  // no K tile: counted apart
      (direct ? st[19] : KeySet(r.keys) == KeySet::kCtrl ? st[2] : st[1]) += 1;
      bool masked = false;
      st[12] += !direct && has_column_fixups(kv, ragged);
      const bool sums = (r.flags & kRecWindowSums) != 0;
      for (int w = 0; w < 4; ++w) {
        const TileWork work = classify(warps[w], kv, r);
        if (!direct) {
          st[work == TileWork::kSkip ? 6 : work == TileWork::kFull ? 4 : 3] += 1;
          masked = masked || work == TileWork::kMasked;
          st[13 + r.keys] += work == TileWork::kMasked;
        }
        for (int i = 0; i < W && w * W + i < t.nrows; ++i) {
          if (work != TileWork::kSkip) st[7] += kv.width;
          const Bounds& b = bounds[w * W + i];
          for (int c = 0; c < kv.n; ++c) {
            const bool exact = kv.a + c >= b.lo && kv.a + c < b.hi;
            // a window record with its edges' summaries: a block outside the row's window is one key
            st[8] += sums ? (exact || (kv.a + c) % g.G == 0) : exact && ((kv.excluded >> c) & 1) == 0;
          }
        }
      }
      st[11] += masked;
      st[20] += sums;
      st[21] += (r.flags & kRecBand) != 0;
    }
  }
  // Columns, in order: 0 records, 1 KV tiles, 2 control tiles, 3 masked warp-tiles, 4 full warp-tiles,
  // 5 rows, 6 skipped warp-tiles, 7 GEMM columns over rows, 8 keys seen over rows, 9 straddling blocks,
  // 10 query-slot fills, 11 masked tiles, 12 tiles with column fix-ups, 13-18 masked warp-tiles by key set
  // (plan.h KeySet order), 19 direct tiles (straddling blocks and Hn bands; in no other tile column),
  // 20 tiles of window records with their edges' summaries (plan.h window_sums), 21 Hn band tiles.
  return stats;
}

// The prepare op with the CUDA op's layout and its preparation (prepare_unit, one lane per unit), on CPU
// tensors; the retrieval key means are ATen's float64 block means (host_call.h HostLanes::key_means).
std::vector<at::Tensor> prepare_emulated(RSWA_PREPARE_PARAMS) {
  const ContextParams cp = check_prepare(RSWA_PREPARE_ARGS);
  return prepare_call(k, v, cp, first_key, HostLanes{});
}

}  // namespace
}  // namespace rangeswa::cuda

TORCH_LIBRARY(rangeswa_emulator, m) {
  m.def(rangeswa::schema::kAttn);
  std::string stats(rangeswa::schema::kAttn);
  stats.replace(0, 4, "plan_stats");
  stats.replace(stats.find("-> (Tensor, Tensor)"), std::string::npos, "-> Tensor");
  m.def(stats.c_str());
  m.def(rangeswa::schema::kPrepare);
}

TORCH_LIBRARY_IMPL(rangeswa_emulator, CPU, m) {
  m.impl("attn", &rangeswa::cuda::attn_emulated);
  m.impl("plan_stats", &rangeswa::cuda::plan_stats);
  m.impl("prepare", &rangeswa::cuda::prepare_emulated);
}
