// Small kernels run once per attn call before the fused kernel (the CPU kernel's prepare_keys):
// RoPE cos/sin tables, and the keys and values of every (batch, KV head) rotated to each position
// map a key range uses, with their G-block means (the summary keys and values of rule 4), all padded
// to the kernel's head dim with zeros (attn_params.h lists the arrays).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "layout.h"
#include "rules.h"
#include "utils.h"

namespace rangeswa::cuda {

// cos/sin [count, rotary_half] (float) of positions first + s * step, or positions[s] (double) when
// `positions` is given; angles in double.
cudaError_t launch_rope_table(float* cos_out, float* sin_out, int64_t count, int rotary_half, double theta,
                              double first, double step, const double* positions, cudaStream_t stream);

struct PrepareParams {
  const void* k;  // [B, Hkv, N, D]: C control rows, then L body rows; rows at k_strides.at(b, h, n)
  const void* v;  // likewise, at v_strides.at(b, h, n)
  RowStrides k_strides, v_strides;
  void* keys_nat;   // [BH, nat_rows, Dp]
  void* values;     // [BH, nat_rows, Dp]
  void* keys_grp;   // [BH, grp_rows, Dp] or null
  void* keys_cond;  // [BH, L, Dp] or null
  const float *cos_nat, *sin_nat, *cos_grp, *sin_grp, *cos_cond, *sin_cond;
  int64_t BH, Hkv, N, C, L, D, Dp;  // BH = B * Hkv rows of the prepared arrays
  int64_t nat_rows, grp_rows;
  int64_t G;                // summary block
  bool summaries;           // write the block means (rangeswa)
  int64_t g, group_offset;  // the grouped key j sits at table row j / g + group_offset (position j / g)
  int rotary_half;
  bool interleaved;
};

inline constexpr int64_t kPrepareRows = 32;  // tokens per CTA when no block means are needed

// Body tokens per CTA: whole G-blocks when their means are written.
RSWA_HD int64_t prepare_chunk_tokens(const PrepareParams& p) {
  return p.summaries ? p.G * (p.G >= kPrepareRows ? 1 : kPrepareRows / p.G) : kPrepareRows;
}
RSWA_HD int64_t prepare_body_chunks(const PrepareParams& p) {
  return (p.L + prepare_chunk_tokens(p) - 1) / prepare_chunk_tokens(p);
}
RSWA_HD int64_t prepare_control_chunks(const PrepareParams& p) { return (p.C + kPrepareRows - 1) / kPrepareRows; }
// Work units of a row: one per rotated pair, one per other (pass-through or padding) dim.
RSWA_HD int prepare_units(const PrepareParams& p) { return int(p.rotary_half + (p.Dp - 2 * p.rotary_half)); }

// The work of one thread of the preparation kernel: unit u of chunk `chunk` of row bh of B*H_kv.
// Body chunks write R(j) k_j, R(j/g) k_j, R(j T/L) k_j and v_j for their tokens (dims ia, ib of the
// unit) and the means of the G-blocks they hold; control chunks copy control keys and values.
template <typename Element>
__host__ __device__ inline void prepare_unit(const PrepareParams& p, int64_t bh, int64_t chunk, int u) {
  const int64_t Dp = p.Dp, D = p.D;
  const Element* k = static_cast<const Element*>(p.k) + p.k_strides.at(bh / p.Hkv, bh % p.Hkv, 0);
  const Element* v = static_cast<const Element*>(p.v) + p.v_strides.at(bh / p.Hkv, bh % p.Hkv, 0);
  const int64_t k_ld = p.k_strides.row, v_ld = p.v_strides.row;
  Element* kn = static_cast<Element*>(p.keys_nat) + bh * p.nat_rows * Dp;
  Element* vo = static_cast<Element*>(p.values) + bh * p.nat_rows * Dp;
  Element* kg = p.keys_grp ? static_cast<Element*>(p.keys_grp) + bh * p.grp_rows * Dp : nullptr;
  Element* kc = p.keys_cond ? static_cast<Element*>(p.keys_cond) + bh * p.L * Dp : nullptr;
  const int half = p.rotary_half;
  auto load = [&](const Element* row, int d) { return d < D ? to_float(row[d]) : 0.f; };
  auto store = [&](Element* row, int d, float x) { row[d] = from_float<Element>(x); };
  // Unit u: a rotated pair (ia, ib) of frequency fk, or a single dim ia = ib (fk = -1).
  const int fk = u < half ? u : -1;
  const int ia = u < half ? (p.interleaved ? 2 * u : u) : 2 * half + (u - half);
  const int ib = u < half ? (p.interleaved ? 2 * u + 1 : u + half) : ia;

  const int64_t body_chunks = prepare_body_chunks(p);
  if (chunk >= body_chunks) {  // control rows, never rotated
    const int64_t c0 = (chunk - body_chunks) * kPrepareRows;
    for (int64_t c = c0; c < p.C && c < c0 + kPrepareRows; ++c)
      for (int d : {ia, ib}) {
        store(kn + c * Dp, d, load(k + c * k_ld, d));
        store(vo + c * Dp, d, load(v + c * v_ld, d));
      }
    return;
  }
  const int64_t j0 = chunk * prepare_chunk_tokens(p), j1 = min64(p.L, j0 + prepare_chunk_tokens(p));
  // Block sums of the rotated keys (native, grouped) and of the values, dims ia and ib, in double.
  double sum[3][2] = {{0.0, 0.0}, {0.0, 0.0}, {0.0, 0.0}};
  for (int64_t j = j0; j < j1; ++j) {
    const Element* krow = k + (p.C + j) * k_ld;
    const float ka = load(krow, ia), kb = load(krow, ib);
    // R x at table row s: (a cos - b sin, a sin + b cos) like the CPU's rotate_row; x for a single dim.
    auto rotate = [&](const float* cos_t, const float* sin_t, int64_t s, float* ra, float* rb) {
      if (fk < 0) {
        *ra = *rb = ka;
        return;
      }
      const float c = cos_t[s * half + fk], sn = sin_t[s * half + fk];
      *ra = ka * c - kb * sn;
      *rb = ka * sn + kb * c;
    };
    float ra, rb;
    rotate(p.cos_nat, p.sin_nat, j, &ra, &rb);
    store(kn + (p.C + j) * Dp, ia, ra);
    store(kn + (p.C + j) * Dp, ib, rb);
    sum[0][0] += ra;
    sum[0][1] += rb;
    if (kg != nullptr) {
      rotate(p.cos_grp, p.sin_grp, j / p.g + p.group_offset, &ra, &rb);
      store(kg + j * Dp, ia, ra);
      store(kg + j * Dp, ib, rb);
      sum[1][0] += ra;
      sum[1][1] += rb;
    }
    if (kc != nullptr) {
      rotate(p.cos_cond, p.sin_cond, j, &ra, &rb);
      store(kc + j * Dp, ia, ra);
      store(kc + j * Dp, ib, rb);
    }
    const Element* vrow = v + (p.C + j) * v_ld;
    const float va = load(vrow, ia), vb = load(vrow, ib);
    store(vo + (p.C + j) * Dp, ia, va);
    store(vo + (p.C + j) * Dp, ib, vb);
    sum[2][0] += va;
    sum[2][1] += vb;
    // Rule 4: the means of a G-block once its last token is in (summary rows follow the body rows).
    if (p.summaries && ((j + 1) % p.G == 0 || j + 1 == p.L)) {
      const int64_t blk = j / p.G, n = j + 1 - blk * p.G, srow = p.L + blk;
      auto mean = [&](int a, int c) { return float(sum[a][c] / double(n)); };
      store(kn + (p.C + srow) * Dp, ia, mean(0, 0));
      store(kn + (p.C + srow) * Dp, ib, mean(0, 1));
      if (kg != nullptr) {
        store(kg + srow * Dp, ia, mean(1, 0));
        store(kg + srow * Dp, ib, mean(1, 1));
      }
      store(vo + (p.C + srow) * Dp, ia, mean(2, 0));
      store(vo + (p.C + srow) * Dp, ib, mean(2, 1));
      for (auto& s : sum) s[0] = s[1] = 0.0;
    }
  }
}

template <typename Element>
cudaError_t launch_prepare(const PrepareParams& p, cudaStream_t stream);

}  // namespace rangeswa::cuda
