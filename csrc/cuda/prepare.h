// The per-call preparation of the fused attention: the keys and values of every (batch, KV head) under
// each position map a key range uses, with their G-block means (rule 4's summary keys and values) and
// in-block prefix sums (blocks straddling Hn, straddling.h), padded to the kernel's head dim with
// zeros: the arrays of attn_params.h PreparedArrays. Host and device code: the preparation kernel runs
// prepare_unit with one warp per unit (lanes over the head dim), the host emulation with one lane.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "block_means.h"
#include "convert.h"
#include "grouped_positions.h"
#include "layout.h"
#include "plan.h"
#include "rotary.h"
#include "rules.h"
#include "straddling.h"

namespace rangeswa::cuda {

// cos/sin [count, rotary_half] (float) of positions first + s * step, or positions[s] (double) when
// `positions` is given; angles in double; frequencies inv_freq[k] (rotary_half doubles) when given, else theta's.
cudaError_t launch_rope_table(float* cos_out, float* sin_out, int64_t count, int rotary_half, double theta,
                              const double* inv_freq, double first, double step, const double* positions,
                              cudaStream_t stream);

struct PrepareParams {
  const void* k;  // [B, Hkv, N, D]: C control rows, then L body rows; rows at k_strides.at(b, h, n)
  const void* v;  // likewise, at v_strides.at(b, h, n)
  RowStrides k_strides, v_strides;
  void *k_ctrl, *v_ctrl, *k_nat, *k_grp, *k_cond, *v_body, *s_nat, *s_grp, *s_v, *p_nat, *p_grp;
  int64_t ctrl_stride, body_stride, sum_stride;  // elements per KV head (attn_params.h)
  // cos/sin of integer positions (R(j) at row j, R(j / g) at row j / g) and of the conditioning
  // positions j T / L (row j), [rows, rotary_half].
  const float *cos_int, *sin_int, *cos_cond, *sin_cond;
  int32_t BH, Hkv, C, L, D, Dp, G, g, rotary_half;
  bool interleaved;
  int32_t unit_tokens;  // body tokens per unit: G when block means are written (whole blocks), else 32
  // The arrays hold body rows from row0 on (the prepare op's first_key, a multiple of unit_tokens; 0 in a
  // call): row j at j - row0, G-block b at b - row0 / G. Control rows are copied when k_ctrl is set.
  int32_t row0;
  // Set by prepare_ready (the launcher and the host emulation alike): whether the call takes the vector
  // preparation (prepare_range), and the divisors it uses.
  bool vector;
  FastDiv by_Hkv, by_g, by_units, by_dim_units;
  float inv_G, inv_last;  // 1 / G and 1 / (L - G floor((L - 1) / G)), the last block's tokens

  RSWA_HD bool j_starts_block(int32_t j) const { return j % G == 0; }
  // Whether the body values are read at all: a copy of them (v_body) or their block means (s_v). Lite and
  // calls that read v in place write neither, and so never load v's body rows.
  RSWA_HD bool reads_values() const { return v_body != nullptr || s_v != nullptr; }
  // Whether the body rows get only the rotated keys k_nat and k_cond: no grouping, prefix sums, value copy
  // or block means (RangeSWA-Lite, SWA, full attention, with v read in place). The vector preparation then
  // runs its lean loop (prepare_range kLean), which has none of the rest.
  RSWA_HD bool lean() const {
    return k_grp == nullptr && p_nat == nullptr && p_grp == nullptr && s_nat == nullptr && s_grp == nullptr &&
           !reads_values();
  }
};

// A call whose body rows' arrays someone else holds (a prepared context's cache, or the control CTAs that fold
// Lite's preparation in): the preparation writes none of them; with the values read in place nothing of the
// body is left, and only the control rows' units run.
inline void prepare_call_rows_only(PrepareParams& pp) {
  pp.k_nat = pp.k_grp = pp.k_cond = pp.s_nat = pp.s_grp = pp.s_v = pp.p_nat = pp.p_grp = nullptr;
  if (pp.v_body == nullptr) pp.row0 = pp.L;
}

RSWA_HD int32_t prepare_body_units(const PrepareParams& p) {
  return (p.L - p.row0 + p.unit_tokens - 1) / p.unit_tokens;
}
RSWA_HD int32_t prepare_units(const PrepareParams& p) {
  return prepare_body_units(p) + (p.k_ctrl != nullptr ? (p.C + p.unit_tokens - 1) / p.unit_tokens : 0);
}

// Unit `unit` of KV head bh: body tokens [unit * unit_tokens, ...) (or, past the body units, a run of
// control rows), dims lane, lane + lanes, ... of the padded head dim.
template <typename Element>
RSWA_HD void prepare_unit(const PrepareParams& p, int32_t bh, int32_t unit, int lane, int lanes) {
  const int32_t b = bh / p.Hkv, h = bh % p.Hkv;
  const Element* k = static_cast<const Element*>(p.k) + p.k_strides.at(b, h, 0);
  const Element* v = static_cast<const Element*>(p.v) + p.v_strides.at(b, h, 0);
  auto out = [&](void* base, int64_t stride, int64_t row) {
    return static_cast<Element*>(base) + bh * stride + row * p.Dp;
  };
  auto element = [&](const Element* row) {
    return [row, &p](int e) { return e < p.D ? to_float(row[e]) : 0.f; };
  };
  const int32_t body_units = prepare_body_units(p);
  if (unit >= body_units) {  // control rows, never rotated
    const int32_t c0 = (unit - body_units) * p.unit_tokens, c1 = imin(p.C, c0 + p.unit_tokens);
    for (int32_t c = c0; c < c1; ++c)
      for (int d = lane; d < p.Dp; d += lanes) {
        out(p.k_ctrl, p.ctrl_stride, c)[d] = from_float<Element>(element(k + c * p.k_strides.row)(d));
        out(p.v_ctrl, p.ctrl_stride, c)[d] = from_float<Element>(element(v + c * p.v_strides.row)(d));
      }
    return;
  }
  const int32_t j0 = p.row0 + unit * p.unit_tokens, j1 = imin(p.L, j0 + p.unit_tokens);
  const int32_t block0 = p.row0 / p.G;
  const int half = p.rotary_half;
  for (int d = lane; d < p.Dp; d += lanes) {
    // Running sums of the current G-block (fp32): rotated keys under each map (straddling.h: the prefix sums P
    // are each token's sum before its key joins), and values.
    float run_nat = 0.f, run_grp = 0.f, run_v = 0.f;
    for (int32_t j = j0; j < j1; ++j) {
      const auto x = element(k + (p.C + j) * p.k_strides.row);
      const float nat = rotated_element(x, d, half, p.interleaved, p.cos_int + j * half, p.sin_int + j * half);
      const float val = p.reads_values() ? element(v + (p.C + j) * p.v_strides.row)(d) : 0.f;
      if (p.k_nat != nullptr) out(p.k_nat, p.body_stride, j - p.row0)[d] = from_float<Element>(nat);
      if (p.v_body != nullptr) out(p.v_body, p.body_stride, j - p.row0)[d] = from_float<Element>(val);
      if (p.k_cond != nullptr)
        out(p.k_cond, p.body_stride, j - p.row0)[d] =
            from_float<Element>(rotated_element(x, d, half, p.interleaved, p.cos_cond + j * half, p.sin_cond + j * half));
      if (prefix_restarts(j, p.G)) run_nat = run_grp = run_v = 0.f;
      if (p.p_nat != nullptr) out(p.p_nat, p.body_stride, j - p.row0)[d] = from_float<Element>(run_nat);
      run_nat = prefix_step(run_nat, nat);
      run_v += val;
      if (p.k_grp != nullptr) {
        const int32_t s = grouped_key_position(p.g, j);
        const float grp = rotated_element(x, d, half, p.interleaved, p.cos_int + s * half, p.sin_int + s * half);
        out(p.k_grp, p.body_stride, j - p.row0)[d] = from_float<Element>(grp);
        if (p.p_grp != nullptr) out(p.p_grp, p.body_stride, j - p.row0)[d] = from_float<Element>(run_grp);
        run_grp = prefix_step(run_grp, grp);
      }
      // Rule 4: the block's means once its last token is in (units hold whole blocks when they are written).
      if (p.s_nat != nullptr && (j + 1 == j1 || p.j_starts_block(j + 1))) {
        const int32_t blk = j / p.G;
        const float n = float(j + 1 - blk * p.G);
        out(p.s_nat, p.sum_stride, blk - block0)[d] = from_float<Element>(block_mean_of(run_nat, n));
        if (p.s_v != nullptr) out(p.s_v, p.sum_stride, blk - block0)[d] = from_float<Element>(block_mean_of(run_v, n));
        if (p.s_grp != nullptr)
          out(p.s_grp, p.sum_stride, blk - block0)[d] = from_float<Element>(block_mean_of(run_grp, n));
      }
    }
  }
}

// ---- the vector preparation --------------------------------------------------------------------------
// Calls whose rows are whole 4-element pieces at aligned addresses (D and the rotary half multiples of 4,
// k and v rows and strides aligned to a piece) run prepare_range: a lane per (token unit, 8-dim unit of
// the padded head dim), walking the unit's tokens in order with its running sums in registers. Dim unit w
// is two pieces of 4 elements, x and y: rotated pairs (table entries u .. u + 4, u = 4w: interleaved x = 2u,
// y = 2u + 4; half split x = u, y = u + half) or, from w = half / 4 on, the dims 2 half + 8 (w - half / 4)
// onwards, unrotated. Every input of a token is loaded before any is used; no division, no 64-bit index
// multiply in the token loop, v_body a copy of the loaded bits. Other calls run prepare_unit above.

// Lanes of one token unit: Dp / 8 (8, 10 or 16).
RSWA_HD int32_t prepare_dim_units(const PrepareParams& p) { return p.Dp / 8; }

template <typename Element>
RSWA_HD bool prepare_vectorizable(const PrepareParams& p) {
  constexpr int64_t kPiece = 4;
  constexpr uintptr_t kBytes = kPiece * sizeof(Element);
  auto aligned = [&](const void* base, const RowStrides& st) {
    return reinterpret_cast<uintptr_t>(base) % kBytes == 0 && st.batch % kPiece == 0 && st.head % kPiece == 0 &&
           st.row % kPiece == 0;
  };
  return p.D % kPiece == 0 && p.rotary_half % kPiece == 0 && aligned(p.k, p.k_strides) && aligned(p.v, p.v_strides);
}

// The parameters as a launch takes them: prepare_params' fields plus the vector choice and the divisors.
template <typename Element>
inline PrepareParams prepare_ready(PrepareParams p) {
  p.vector = prepare_vectorizable<Element>(p);
  p.by_Hkv = FastDiv::make(p.Hkv);
  p.by_g = FastDiv::make(p.g);
  p.by_units = FastDiv::make(prepare_units(p));
  p.by_dim_units = FastDiv::make(prepare_dim_units(p));
  p.inv_G = block_inverse(p.G);
  p.inv_last = last_block_inverse(p.L, p.G);
  return p;
}

// 4 elements (8 or 16 bytes) as floats, their bits kept (a copy stores them unchanged); and back.
template <typename Element>
struct Piece {
  static constexpr int kBytes = 4 * int(sizeof(Element));
  using Bits = typename std::conditional<kBytes == 8, uint2, uint4>::type;
  Bits bits;
  RSWA_HD static Piece load(const Element* src) { return Piece{*reinterpret_cast<const Bits*>(src)}; }
  RSWA_HD static Piece zero() { return Piece{Bits{}}; }
  RSWA_HD void store(Element* dst) const { *reinterpret_cast<Bits*>(dst) = bits; }
  RSWA_HD void to_floats(float (&x)[4]) const {
    Element e[4];
    memcpy(e, &bits, kBytes);
#pragma unroll
    for (int i = 0; i < 4; ++i) x[i] = to_float(e[i]);
  }
  RSWA_HD static void store_floats(Element* dst, const float (&x)[4]) {
    Element e[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) e[i] = from_float<Element>(x[i]);
    Bits b;
    memcpy(&b, e, kBytes);
    *reinterpret_cast<Bits*>(dst) = b;
  }
};

RSWA_HD void load_float4(const float* src, float (&x)[4]) {
  const float4 f = *reinterpret_cast<const float4*>(src);
  x[0] = f.x, x[1] = f.y, x[2] = f.z, x[3] = f.w;
}

// The pairs of dim unit w (pieces x and y) rotated by the table entries (cs[e], sn[e]) (rotary.h rotate_loaded's
// pairs and products): interleaved the pairs are (x0, x1), (x2, x3), (y0, y1), (y2, y3), half split (x_e, y_e).
template <bool kInterleaved>
RSWA_HD void rotate_unit(const float (&x)[4], const float (&y)[4], const float* cs, const float* sn,
                         float (&ox)[4], float (&oy)[4]) {
  float c[4], s[4];
  load_float4(cs, c);
  load_float4(sn, s);
#pragma unroll
  for (int e = 0; e < 4; ++e) ox[e] = x[e], oy[e] = y[e];
  rotate_loaded<4>(ox, oy, c, s, 1.f, kInterleaved);
}

// Lane work of the vector preparation: dim unit w of unit `unit` (prepare_unit's units) of KV head bh.
// Addresses inside a head are 32-bit element offsets from per-lane bases (the arrays of one KV head hold
// fewer than 2^31 elements: attn_setup.h head_offsets_fit), the inputs' rows pointers stepped by their
// stride. kLean (a call whose p.lean()): the loop rotates and stores k_nat and k_cond alone.
template <typename Element, bool kInterleaved, bool kLean>
RSWA_HD void prepare_range(const PrepareParams& p, int32_t bh, int32_t unit, int w) {
  using P = Piece<Element>;
  const int32_t b = p.by_Hkv.div(bh), h = bh - b * p.Hkv;
  const int half = p.rotary_half, rotated = half / 4;
  const bool rot = w < rotated;
  const int u = 4 * w;
  const int x = rot ? (kInterleaved ? 2 * u : u) : 2 * half + 8 * (w - rotated);
  const int y = rot ? (kInterleaved ? 2 * u + 4 : u + half) : x + 4;
  const bool xin = x < p.D, yin = y < p.D;  // pieces lie wholly inside D or past it (D % 4 == 0)
  const Element* k = static_cast<const Element*>(p.k) + p.k_strides.at(b, h, 0);
  const Element* v = static_cast<const Element*>(p.v) + p.v_strides.at(b, h, 0);
  auto base = [&](void* array, int64_t stride) {
    return array == nullptr ? nullptr : static_cast<Element*>(array) + bh * stride;
  };
  auto full = [&](void* array, int64_t stride) { return kLean ? nullptr : base(array, stride); };
  // Stores the two pieces of row offset `at` (elements) of an array base (null: not written).
  auto put = [&](Element* array, int32_t at, const float (&a)[4], const float (&c)[4]) {
    if (array == nullptr) return;
    P::store_floats(array + at + x, a);
    P::store_floats(array + at + y, c);
  };
  const int32_t body_units = prepare_body_units(p);
  if (unit >= body_units) {  // control rows, never rotated
    const int32_t c0 = (unit - body_units) * p.unit_tokens, c1 = imin(p.C, c0 + p.unit_tokens);
    Element *ko = base(p.k_ctrl, p.ctrl_stride), *vo = base(p.v_ctrl, p.ctrl_stride);
    for (int32_t c = c0; c < c1; ++c) {
      const Element *kr = k + c * p.k_strides.row, *vr = v + c * p.v_strides.row;
      (xin ? P::load(kr + x) : P::zero()).store(ko + c * p.Dp + x);
      (yin ? P::load(kr + y) : P::zero()).store(ko + c * p.Dp + y);
      (xin ? P::load(vr + x) : P::zero()).store(vo + c * p.Dp + x);
      (yin ? P::load(vr + y) : P::zero()).store(vo + c * p.Dp + y);
    }
    return;
  }
  const int32_t j0 = p.row0 + unit * p.unit_tokens, j1 = imin(p.L, j0 + p.unit_tokens);
  const Element* kr = k + (p.C + j0) * p.k_strides.row;
  const Element* vr = v + (p.C + j0) * p.v_strides.row;
  Element *o_nat = base(p.k_nat, p.body_stride), *o_grp = full(p.k_grp, p.body_stride);
  Element *o_cond = base(p.k_cond, p.body_stride), *o_v = full(p.v_body, p.body_stride);
  Element *o_pnat = full(p.p_nat, p.body_stride), *o_pgrp = full(p.p_grp, p.body_stride);
  // Table offsets of this unit's entries: native and conditioning j half + u, grouped (j / g) half + u.
  int32_t s_rem;  // j - g (j / g)
  const int32_t s = grouped_key_position(p.by_g, p.g, j0, s_rem);  // grouped position j / g
  int32_t t_nat = j0 * half + u, t_grp = s * half + u;
  float run_nat[2][4] = {}, run_grp[2][4] = {}, run_v[2][4] = {};
  const bool vxin = !kLean && xin && p.reads_values(), vyin = !kLean && yin && p.reads_values();  // v, when read
  // Every lane of a warp walks unit_tokens steps (a uniform trip count: no divergent loop exit), a lane of
  // the ragged last unit idling past its tokens.
#pragma unroll 1
  for (int32_t n = 0, j = j0, at = (j0 - p.row0) * p.Dp; n < p.unit_tokens; ++n, ++j, at += p.Dp) {
    if (j >= j1) continue;
    const P kx = xin ? P::load(kr + x) : P::zero(), ky = yin ? P::load(kr + y) : P::zero();
    const P vx = vxin ? P::load(vr + x) : P::zero(), vy = vyin ? P::load(vr + y) : P::zero();
    kr += p.k_strides.row;
    vr += p.v_strides.row;
    float a[4], c[4], va[4], vc[4];
    kx.to_floats(a);
    ky.to_floats(c);
    vx.to_floats(va);
    vy.to_floats(vc);
    float nat[2][4], grp[2][4], cond[2][4];
#pragma unroll
    for (int e = 0; e < 4; ++e)  // unrotated units keep the inputs
      nat[0][e] = grp[0][e] = cond[0][e] = a[e], nat[1][e] = grp[1][e] = cond[1][e] = c[e];
    if (rot) {
      rotate_unit<kInterleaved>(a, c, p.cos_int + t_nat, p.sin_int + t_nat, nat[0], nat[1]);
      if (o_cond != nullptr)
        rotate_unit<kInterleaved>(a, c, p.cos_cond + t_nat, p.sin_cond + t_nat, cond[0], cond[1]);
      if (o_grp != nullptr) rotate_unit<kInterleaved>(a, c, p.cos_int + t_grp, p.sin_int + t_grp, grp[0], grp[1]);
    }
    put(o_cond, at, cond[0], cond[1]);
    put(o_nat, at, nat[0], nat[1]);
    if (o_v != nullptr) {
      vx.store(o_v + at + x);
      vy.store(o_v + at + y);
    }
    // The in-block prefix sums (straddling.h; the unit is one block when they are written): P at token j is the
    // sum before j's key joins it.
    put(o_pnat, at, run_nat[0], run_nat[1]);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      run_nat[0][e] = prefix_step(run_nat[0][e], nat[0][e]), run_nat[1][e] = prefix_step(run_nat[1][e], nat[1][e]);
      run_v[0][e] += va[e], run_v[1][e] += vc[e];
    }
    if (o_grp != nullptr) {
      put(o_grp, at, grp[0], grp[1]);
      put(o_pgrp, at, run_grp[0], run_grp[1]);
#pragma unroll
      for (int e = 0; e < 4; ++e)
        run_grp[0][e] = prefix_step(run_grp[0][e], grp[0][e]), run_grp[1][e] = prefix_step(run_grp[1][e], grp[1][e]);
    }
    t_nat += half;
    if (next_key_moves(s_rem, p.g)) t_grp += half;
  }
  // Rule 4: the block's means (the unit is one whole block when they are written: unit_tokens = G), by the
  // host's reciprocal of its size (G, or the last block's).
  if (!kLean && p.s_nat != nullptr && j1 > j0) {
    const float inv = mean_factor(j1 - j0 == p.G, p.inv_G, p.inv_last);
    auto mean = [&](void* array, const float (&r)[2][4]) {
      if (array == nullptr) return;
      float m0[4], m1[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) m0[e] = block_mean(r[0][e], inv), m1[e] = block_mean(r[1][e], inv);
      put(base(array, p.sum_stride), unit * p.Dp, m0, m1);  // block (row0 / G + unit) - row0 / G
    };
    mean(p.s_nat, run_nat);
    mean(p.s_grp, run_grp);
    mean(p.s_v, run_v);
  }
}

template <typename Element>
cudaError_t launch_prepare(const PrepareParams& p, cudaStream_t stream);

// A packed call's preparations in shared launches (docs/cuda.md "Packed calls"): each sequence's own call's
// parameters (prepare_ready'd) and the first CTA of each in the launch (sequence s takes CTAs [first[s],
// first[s + 1]), CTA x being CTA x - first[s] of its own launch_prepare). Device memory. The sequences of one
// launch share its kernel (prepare_variant): the op launches once per variant they use.
struct PackedPrepare {
  const PrepareParams* seq;  // [S]
  const int64_t* first;      // [S + 1]
  int32_t S;
};

// The kernel launch_prepare runs for (readied) p: 0 the unit kernel, 1 + 2 interleaved + lean the vector one;
// and its CTAs (-1: more work items than a launch indexes in 32 bits).
inline constexpr int kPrepareVariants = 5;
inline int prepare_variant(const PrepareParams& p) {
  return p.vector ? 1 + (p.interleaved ? 2 : 0) + (p.lean() ? 1 : 0) : 0;
}
inline int64_t prepare_ctas(const PrepareParams& p) {
  constexpr int64_t kUnitsPerCta = 4;  // prepare.cu: 128 threads, one unit (or 32 / (Dp / 8) of them) per warp
  const int64_t total = int64_t(prepare_units(p)) * p.BH;
  if (p.vector) {
    if (total > int64_t(0x7fffffff)) return -1;
    const int64_t per_warp = 32 / prepare_dim_units(p);
    return (total + per_warp * kUnitsPerCta - 1) / (per_warp * kUnitsPerCta);
  }
  const int64_t ctas = (total + kUnitsPerCta - 1) / kUnitsPerCta;
  return ctas > int64_t(0x7fffffff) ? -1 : ctas;
}

template <typename Element>
cudaError_t launch_prepare_packed(const PackedPrepare& pk, int variant, int64_t ctas, cudaStream_t stream);

}  // namespace rangeswa::cuda
