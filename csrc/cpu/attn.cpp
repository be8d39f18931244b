// The fused RangeSWA attention on the CPU (SPEC sections 1-4, op `attn` of section 5).
//
// Work is split into tiles of up to kTileRows body query rows inside one query block (so the rows
// of a tile share their retrieved blocks), plus one task for the control query rows of each head.
// A tile walks its keys as segments and folds each into one online softmax (running max m, sum l,
// unnormalised output o), so memory per thread is a few tile-sized buffers and nothing is N x N:
//   - the control keys;
//   - "dense" runs of G-blocks, where every exact logit of the tile's rows is computed (window
//     union, retrieved blocks, and blocks that straddle the native/grouped position boundary for
//     some row); per row, each block there is exact, summarised (mean of its exact logits plus
//     log n_b) or hidden, as rules.h says;
//   - "summary" runs of G-blocks whose position class is the same for every row of the tile, scored
//     against precomputed block means of the rotated keys (q . mean(R k) = mean(q . R k)).
// Pairs use separately rotated vectors (rules.h PosClass): native (q at i, k at j), grouped-left
// (q at i/g + c, k at j/g) or grouped-right (q at i/g - c, k at j/g); body -> control uses q at
// i*T/L (or i) against the unrotated control key; control -> body uses k at j*T/L (or j).
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/kernels.h"

namespace rangeswa::cpu {
namespace {

constexpr int64_t kTileRows = 64;
constexpr int64_t kChunkKeys = 512;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Kind of a G-block in a tile's plan.
// kSumMixed: summarised blocks whose position class differs between rows of the tile, or mixes
// classes inside the block for some row (it straddles distance Hn).
enum class Kind : uint8_t { kSkip, kDense, kSumNative, kSumLeft, kSumRight, kSumMixed };

// Per (batch, KV head) keys and summaries, computed once per call.
struct KvView {
  const float* k_control;  // [C, D] control keys, never rotated
  const float* v_control;  // [C, D]
  const float* v_body;     // [L, D]
  const float* k_native;   // [L, D] R(j) k_j
  const float* k_grouped;  // [L, D] R(j/g) k_j (grouping only)
  const float* k_cond;     // [L, D] R(j T/L) k_j (extrapolating with control tokens only)
  const float* sk_native;  // [nG, D] mean of k_native per G-block (rangeswa only)
  const float* sk_grouped; // [nG, D] mean of k_grouped per G-block (rangeswa with grouping only)
  const float* sv;         // [nG, D] mean of v per G-block (rangeswa only)
};

struct Call {
  AttnParams p;
  const float* q;  // float [B, Hq, N, D]
  const float* k;
  const float* v;
  float* out;      // float [B, Hq, N, D]
  float* lse;      // float [B, Hq, N]
  const int32_t* retrieved;  // [B, Hkv, nQb, K'] or null
  int64_t retrieved_k;
  RopeTable native, grouped, cond;  // positions j; j/g - c .. ; j*T/L
  std::vector<float> log_block_size;  // log n_b of every G-block (rule 4's summary bias)
  at::Tensor k_native, k_grouped, k_cond, sk_native, sk_grouped, sv;

  int64_t chunk_tokens() const { return std::max(p.rules.G, (kChunkKeys / p.rules.G) * p.rules.G); }

  KvView view(int64_t b, int64_t hkv) const {
    const int64_t N = p.N, D = p.D, L = p.L, nG = p.rules.num_summary_blocks();
    const int64_t kv = b * p.Hkv + hkv;
    auto at_ = [&](const at::Tensor& t, int64_t rows) {
      return t.defined() ? t.data_ptr<float>() + kv * rows * D : nullptr;
    };
    return KvView{k + kv * N * D,         v + kv * N * D,          v + (kv * N + p.C) * D,
                  at_(k_native, L),       at_(k_grouped, L),       at_(k_cond, L),
                  at_(sk_native, nG),     at_(sk_grouped, nG),     at_(sv, nG)};
  }
};

// Online softmax state of up to kTileRows rows.
struct Softmax {
  int64_t n = 0, D = 0;
  std::vector<float> m, l, o;

  void reset(int64_t rows, int64_t dim) {
    n = rows;
    D = dim;
    m.assign(rows, kNegInf);
    l.assign(rows, 0.f);
    o.assign(rows * dim, 0.f);
  }

  // Folds logits S[n, cols] (row stride lds, -inf = not seen) with values V[cols, D] into the state.
  // S is overwritten with probabilities.
  void update(float* S, int64_t cols, int64_t lds, const float* V) {
    if (cols == 0) return;
    for (int64_t r = 0; r < n; ++r) {
      float* row = S + r * lds;
      float mx = kNegInf;
#pragma omp simd reduction(max : mx)
      for (int64_t j = 0; j < cols; ++j) mx = row[j] > mx ? row[j] : mx;
      if (mx == kNegInf) {
        std::fill(row, row + cols, 0.f);
        continue;
      }
      const float m_new = std::max(m[r], mx);
      const float alpha = m[r] == kNegInf ? 0.f : std::exp(m[r] - m_new);
      exp_shifted(row, cols, m_new);
      float sum = 0.f;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < cols; ++j) sum += row[j];
      l[r] = l[r] * alpha + sum;
      if (alpha != 1.f)
        for (int64_t c = 0; c < D; ++c) o[r * D + c] *= alpha;
      m[r] = m_new;
    }
    gemm_nn(n, D, cols, S, lds, V, D, o.data(), D, 1.f);
  }

  void write(float* out_rows, float* lse_rows) const {
    for (int64_t r = 0; r < n; ++r) {
      const float inv = 1.f / l[r];
      for (int64_t c = 0; c < D; ++c) out_rows[r * D + c] = o[r * D + c] * inv;
      lse_rows[r] = m[r] + std::log(l[r]);
    }
  }
};

// Buffers of one worker thread.
struct Workspace {
  std::vector<float> qn, qgl, qgr, qc;  // [kTileRows, D] rotated, scaled queries
  std::vector<float> s, s_alt, s_right, s_sum;  // [kTileRows, chunk] score buffers
  std::vector<Kind> kind;               // [nG] tile plan
  std::vector<uint8_t> retrieved;       // [nG] block lies in a retrieved key block
  Softmax softmax;

  explicit Workspace(const Call& c) {
    const int64_t D = c.p.D, chunk = c.chunk_tokens(), rows = std::max<int64_t>(kTileRows, c.p.C);
    qn.resize(rows * D);
    qgl.resize(rows * D);
    qgr.resize(rows * D);
    qc.resize(rows * D);
    s.resize(rows * chunk);
    s_alt.resize(rows * chunk);
    s_right.resize(rows * chunk);
    s_sum.resize(rows * chunk);
    kind.resize(c.p.rules.num_summary_blocks());
    retrieved.resize(c.p.rules.num_summary_blocks());
  }
};

struct Tile {
  int64_t i0, n, qb;  // body rows [i0, i0 + n) of query block qb
  int64_t last() const { return i0 + n - 1; }
};

// Exact logits S[r, j - a] of tile rows with body keys j in [a, b), each pair in its position class.
// Keys split into runs where every row agrees on the class (one GEMM with the matching query
// rotation) and the two narrow runs near +-Hn where rows disagree (both GEMMs, then a per-pair pick).
void exact_scores(const Call& c, const KvView& kv, const Tile& t, Workspace& ws, int64_t a, int64_t b, float* S,
                  int64_t lds) {
  const Rules& R = c.p.rules;
  const int64_t D = c.p.D;
  auto scores = [&](int64_t lo, int64_t hi, const float* qv, const float* keys, float* dst) {
    if (hi > lo) gemm_nt(t.n, hi - lo, D, qv, D, keys + lo * D, D, dst + (lo - a), lds);
  };
  if (!R.grouping()) {
    scores(a, b, ws.qn.data(), kv.k_native, S);
    return;
  }
  auto clamp = [&](int64_t x) { return std::min(b, std::max(a, x)); };
  // Boundaries: j < i0 - Hn is grouped-left for every row, j < last - Hn for some row; likewise right.
  const int64_t left_all = clamp(t.i0 - R.Hn), left_some = clamp(t.last() - R.Hn);
  const int64_t right_some = clamp(t.i0 + R.Hn + 1), right_all = clamp(t.last() + R.Hn + 1);
  scores(a, left_all, ws.qgl.data(), kv.k_grouped, S);
  scores(left_all, right_all, ws.qn.data(), kv.k_native, S);
  scores(right_all, b, ws.qgr.data(), kv.k_grouped, S);
  float* alt = ws.s_alt.data();
  auto mixed = [&](int64_t lo, int64_t hi, const float* qv, PosClass cls) {
    if (hi <= lo) return;
    scores(lo, hi, qv, kv.k_grouped, alt);
    for (int64_t r = 0; r < t.n; ++r)
      for (int64_t j = lo; j < hi; ++j)
        if (R.pos_class(t.i0 + r, j) == cls) S[r * lds + j - a] = alt[r * lds + j - a];
  };
  mixed(left_all, left_some, ws.qgl.data(), PosClass::kGroupedLeft);
  mixed(right_some, right_all, ws.qgr.data(), PosClass::kGroupedRight);
}

// Token-level methods (full, self_extend, swa): every key of [a, b) exact or hidden.
void dense_tokens(const Call& c, const KvView& kv, const Tile& t, Workspace& ws, int64_t a, int64_t b) {
  const Rules& R = c.p.rules;
  const int64_t lds = c.chunk_tokens();
  float* S = ws.s.data();
  exact_scores(c, kv, t, ws, a, b, S, lds);
  if (R.method == Method::kSwa)
    for (int64_t r = 0; r < t.n; ++r)
      for (int64_t j = a; j < b; ++j)
        if (R.token_role(t.i0 + r, j) != Role::kExact) S[r * lds + j - a] = kNegInf;
  ws.softmax.update(S, b - a, lds, kv.v_body + a * c.p.D);
}

// rangeswa: G-blocks [ba, bb) with every exact logit computed; per row each block is exact,
// summarised from its exact logits, or hidden.
void dense_blocks(const Call& c, const KvView& kv, const Tile& t, Workspace& ws, int64_t ba, int64_t bb) {
  const Rules& R = c.p.rules;
  const int64_t lds = c.chunk_tokens(), a = R.block_start(ba), b = R.block_end(bb - 1), nb = bb - ba;
  float* S = ws.s.data();
  float* Ssum = ws.s_sum.data();
  exact_scores(c, kv, t, ws, a, b, S, lds);
  bool any_summary = false, any_exact = false;
  for (int64_t r = 0; r < t.n; ++r) {
    float* row = S + r * lds;
    for (int64_t blk = ba; blk < bb; ++blk) {
      const int64_t s0 = R.block_start(blk) - a, s1 = R.block_end(blk) - a;
      const Role role = R.block_role(t.i0 + r, blk, ws.retrieved[blk] != 0);
      float summary = kNegInf;
      if (role == Role::kSummary) {
        float acc = 0.f;
        for (int64_t j = s0; j < s1; ++j) acc += row[j];
        summary = acc / float(s1 - s0) + c.log_block_size[blk];
        any_summary = true;
      }
      if (role != Role::kExact) std::fill(row + s0, row + s1, kNegInf);
      any_exact = any_exact || role == Role::kExact;
      Ssum[r * lds + blk - ba] = summary;
    }
  }
  if (any_exact) ws.softmax.update(S, b - a, lds, kv.v_body + a * c.p.D);
  if (any_summary) ws.softmax.update(Ssum, nb, lds, kv.sv + ba * c.p.D);
}

// Position class of a whole block for row i; kSumMixed when its tokens fall in several classes.
Kind block_class(const Rules& R, int64_t i, int64_t blk) {
  if (!R.grouping() || R.is_near(i, blk)) return Kind::kSumNative;
  if (R.block_end(blk) - 1 < i - R.Hn) return Kind::kSumLeft;
  if (R.block_start(blk) > i + R.Hn) return Kind::kSumRight;
  return Kind::kSumMixed;
}

// Summary logit of a block whose tokens fall in several position classes for tile row r: the mean
// of its exact logits, each with its own rotation pair.
float mixed_block_logit(const Call& c, const KvView& kv, const Tile& t, const Workspace& ws, int64_t r, int64_t blk) {
  const Rules& R = c.p.rules;
  const int64_t D = c.p.D, i = t.i0 + r;
  float acc = 0.f;
  for (int64_t j = R.block_start(blk); j < R.block_end(blk); ++j) {
    const PosClass cls = R.pos_class(i, j);
    const float* qv = (cls == PosClass::kNative ? ws.qn : cls == PosClass::kGroupedLeft ? ws.qgl : ws.qgr).data() + r * D;
    const float* kk = (cls == PosClass::kNative ? kv.k_native : kv.k_grouped) + j * D;
    float dot = 0.f;
#pragma omp simd reduction(+ : dot)
    for (int64_t d = 0; d < D; ++d) dot += qv[d] * kk[d];
    acc += dot;
  }
  return acc / float(R.block_size(blk));
}

// rangeswa: G-blocks [ba, bb) summarised (or hidden) for every row, scored against the block means
// of the rotated keys: in one position class for the whole run, or per (row, block) for kSumMixed.
void summary_blocks(const Call& c, const KvView& kv, const Tile& t, Workspace& ws, int64_t ba, int64_t bb, Kind kind) {
  const Rules& R = c.p.rules;
  const int64_t lds = c.chunk_tokens(), D = c.p.D, nb = bb - ba;
  float* S = ws.s_sum.data();
  auto scores = [&](Kind cls, float* dst) {
    const float* qv = cls == Kind::kSumNative ? ws.qn.data() : cls == Kind::kSumLeft ? ws.qgl.data() : ws.qgr.data();
    const float* sk = cls == Kind::kSumNative ? kv.sk_native : kv.sk_grouped;
    gemm_nt(t.n, nb, D, qv, D, sk + ba * D, D, dst, lds);
  };
  if (kind != Kind::kSumMixed) {
    scores(kind, S);
  } else {
    scores(Kind::kSumNative, ws.s.data());
    scores(Kind::kSumLeft, ws.s_alt.data());
    scores(Kind::kSumRight, ws.s_right.data());
    for (int64_t r = 0; r < t.n; ++r)
      for (int64_t x = 0; x < nb; ++x) {
        const Kind cls = block_class(R, t.i0 + r, ba + x);
        const int64_t at = r * lds + x;
        S[at] = cls == Kind::kSumNative ? ws.s[at]
              : cls == Kind::kSumLeft   ? ws.s_alt[at]
              : cls == Kind::kSumRight  ? ws.s_right[at]
                                        : mixed_block_logit(c, kv, t, ws, r, ba + x);
      }
  }
  const float* log_n = c.log_block_size.data() + ba;
  bool any = false;
  for (int64_t r = 0; r < t.n; ++r) {
    float* row = S + r * lds;
    if (R.far_summaries) {  // outside the window and retrieval every block is summarised
      for (int64_t x = 0; x < nb; ++x) row[x] += log_n[x];
      any = true;
      continue;
    }
    for (int64_t x = 0; x < nb; ++x) {
      const bool seen = R.block_role(t.i0 + r, ba + x, false) == Role::kSummary;
      row[x] = seen ? row[x] + log_n[x] : kNegInf;
      any = any || seen;
    }
  }
  if (any) ws.softmax.update(S, nb, lds, kv.sv + ba * D);
}

// rangeswa: which blocks a tile scores densely, which by summary class, which not at all.
void plan_tile(const Call& c, const Tile& t, Workspace& ws, int64_t b, int64_t h, int64_t* first, int64_t* last) {
  const Rules& R = c.p.rules;
  const int64_t nG = R.num_summary_blocks(), hkv = h / (c.p.Hq / c.p.Hkv);
  const int64_t wf = R.window_first_block(t.i0), wl = R.window_last_block(t.last());
  int64_t lo = 0, hi = nG - 1;
  if (!R.far_summaries) {  // only near blocks and the window can be seen
    lo = std::min(wf, std::max<int64_t>(0, (t.i0 - R.Hn) / R.G));
    hi = std::max(wl, std::min(nG - 1, (t.last() + R.Hn) / R.G));
  }
  std::fill(ws.retrieved.begin(), ws.retrieved.end(), 0);
  if (c.retrieved != nullptr) {
    const int32_t* row = c.retrieved + ((b * c.p.Hkv + hkv) * R.num_query_blocks() + t.qb) * c.retrieved_k;
    const int64_t per = R.Rb / R.G;
    for (int64_t s = 0; s < c.retrieved_k; ++s) {
      if (row[s] < 0) continue;
      for (int64_t blk = row[s] * per; blk < std::min(nG, row[s] * per + per); ++blk) {
        ws.retrieved[blk] = 1;
        lo = std::min(lo, blk);
        hi = std::max(hi, blk);
      }
    }
  }
  for (int64_t blk = lo; blk <= hi; ++blk) {
    Kind k;
    if ((blk >= wf && blk <= wl) || ws.retrieved[blk]) {
      k = Kind::kDense;
    } else {
      const Kind first_row = block_class(R, t.i0, blk), last_row = block_class(R, t.last(), blk);
      k = first_row == last_row ? first_row : Kind::kSumMixed;
    }
    ws.kind[blk] = k;
  }
  *first = lo;
  *last = hi;
}

// Folds every control key into the softmax for `rows` query rows whose vectors are `qv`.
void control_keys(const Call& c, const KvView& kv, int64_t rows, const float* qv, Workspace& ws) {
  const int64_t D = c.p.D, chunk = c.chunk_tokens();
  for (int64_t a = 0; a < c.p.C; a += chunk) {
    const int64_t w = std::min(c.p.C, a + chunk) - a;
    gemm_nt(rows, w, D, qv, D, kv.k_control + a * D, D, ws.s.data(), chunk);
    ws.softmax.update(ws.s.data(), w, chunk, kv.v_control + a * D);
  }
}

void rotate_queries(const Call& c, const float* qrows, const Tile& t, Workspace& ws) {
  const Rules& R = c.p.rules;
  const int64_t D = c.p.D;
  const float scale = float(c.p.scale);
  for (int64_t r = 0; r < t.n; ++r) {
    const int64_t i = t.i0 + r;
    const float* x = qrows + r * D;
    rotate_row(x, ws.qn.data() + r * D, c.native.cos(i), c.native.sin(i), D, c.p.rope, scale);
    if (R.grouping()) {
      const int64_t base = i / R.g;  // table index = position + c
      rotate_row(x, ws.qgl.data() + r * D, c.grouped.cos(base + 2 * R.group_offset),
                 c.grouped.sin(base + 2 * R.group_offset), D, c.p.rope, scale);
      rotate_row(x, ws.qgr.data() + r * D, c.grouped.cos(base), c.grouped.sin(base), D, c.p.rope, scale);
    }
    if (R.extrapolating && c.p.C > 0)
      rotate_row(x, ws.qc.data() + r * D, c.cond.cos(i), c.cond.sin(i), D, c.p.rope, scale);
  }
}

void body_tile(const Call& c, int64_t b, int64_t h, const Tile& t, Workspace& ws) {
  const AttnParams& p = c.p;
  const Rules& R = p.rules;
  const int64_t D = p.D, hkv = h / (p.Hq / p.Hkv);
  const KvView kv = c.view(b, hkv);
  const int64_t row0 = (b * p.Hq + h) * p.N + p.C + t.i0;
  rotate_queries(c, c.q + row0 * D, t, ws);
  ws.softmax.reset(t.n, D);

  const int64_t chunk = c.chunk_tokens();
  // Rule 1: control keys, unrotated (position 0).
  control_keys(c, kv, t.n, R.extrapolating ? ws.qc.data() : ws.qn.data(), ws);
  if (R.method == Method::kFull || R.method == Method::kSelfExtend) {
    for (int64_t a = 0; a < p.L; a += chunk) dense_tokens(c, kv, t, ws, a, std::min(p.L, a + chunk));
  } else if (R.method == Method::kSwa) {
    const int64_t lo = std::max<int64_t>(0, t.i0 - R.radius), hi = std::min(p.L, t.last() + R.radius + 1);
    const int64_t sinks = std::min(R.sinks, lo);  // sinks inside the window are visited with it
    for (int64_t a = 0; a < sinks; a += chunk) dense_tokens(c, kv, t, ws, a, std::min(sinks, a + chunk));
    for (int64_t a = lo; a < hi; a += chunk) dense_tokens(c, kv, t, ws, a, std::min(hi, a + chunk));
  } else {
    int64_t first = 0, last = -1;
    plan_tile(c, t, ws, b, h, &first, &last);
    // A dense run scores up to `chunk` tokens, a summary run up to `chunk` blocks.
    const int64_t dense_blocks_per_chunk = chunk / R.G;
    for (int64_t ba = first; ba <= last;) {
      const Kind k = ws.kind[ba];
      const int64_t limit = k == Kind::kDense ? dense_blocks_per_chunk : chunk;
      int64_t bb = ba + 1;
      while (bb <= last && ws.kind[bb] == k && bb - ba < limit) ++bb;
      if (k == Kind::kDense) dense_blocks(c, kv, t, ws, ba, bb);
      else if (k != Kind::kSkip) summary_blocks(c, kv, t, ws, ba, bb, k);
      ba = bb;
    }
  }
  ws.softmax.write(c.out + row0 * D, c.lse + row0);
}

// Control query rows: every control key (position 0 on both sides) and every body key, the latter
// at position j*T/L with logit bias -log(L/T) when extrapolating, else native.
void control_rows(const Call& c, int64_t b, int64_t h, Workspace& ws) {
  const AttnParams& p = c.p;
  const int64_t D = p.D, hkv = h / (p.Hq / p.Hkv), lds = c.chunk_tokens();
  const KvView kv = c.view(b, hkv);
  const int64_t row0 = (b * p.Hq + h) * p.N;
  const float scale = float(p.scale);
  for (int64_t r = 0; r < p.C * D; ++r) ws.qn[r] = c.q[row0 * D + r] * scale;
  ws.softmax.reset(p.C, D);
  control_keys(c, kv, p.C, ws.qn.data(), ws);
  float* S = ws.s.data();
  const float* keys = p.rules.extrapolating ? kv.k_cond : kv.k_native;
  const float bias = float(p.control_bias);
  for (int64_t a = 0; a < p.L; a += lds) {
    const int64_t w = std::min(p.L, a + lds) - a;
    gemm_nt(p.C, w, D, ws.qn.data(), D, keys + a * D, D, S, lds);
    if (bias != 0.f)
      for (int64_t r = 0; r < p.C; ++r)
        for (int64_t j = 0; j < w; ++j) S[r * lds + j] += bias;
    ws.softmax.update(S, w, lds, kv.v_body + a * D);
  }
  ws.softmax.write(c.out + row0 * D, c.lse + row0);
}

// Rotated keys and block summaries of every (batch, KV head).
void prepare_keys(Call& c) {
  const AttnParams& p = c.p;
  const Rules& R = p.rules;
  const int64_t L = p.L, D = p.D, nG = R.num_summary_blocks();
  auto opts = at::TensorOptions().dtype(at::kFloat);
  c.k_native = at::empty({p.B, p.Hkv, L, D}, opts);
  if (R.grouping()) c.k_grouped = at::empty({p.B, p.Hkv, L, D}, opts);
  if (R.extrapolating && p.C > 0) c.k_cond = at::empty({p.B, p.Hkv, L, D}, opts);
  const bool summaries = R.method == Method::kRangeSwa;
  if (summaries) {
    c.sk_native = at::empty({p.B, p.Hkv, nG, D}, opts);
    c.sv = at::empty({p.B, p.Hkv, nG, D}, opts);
    if (R.grouping()) c.sk_grouped = at::empty({p.B, p.Hkv, nG, D}, opts);
  }
  at::parallel_for(0, p.B * p.Hkv, 1, [&](int64_t begin, int64_t end) {
    for (int64_t kvh = begin; kvh < end; ++kvh) {
      const float* kbody = c.k + (kvh * p.N + p.C) * D;
      float* kn = c.k_native.data_ptr<float>() + kvh * L * D;
      float* kg = R.grouping() ? c.k_grouped.data_ptr<float>() + kvh * L * D : nullptr;
      float* kc = c.k_cond.defined() ? c.k_cond.data_ptr<float>() + kvh * L * D : nullptr;
      for (int64_t j = 0; j < L; ++j) {
        rotate_row(kbody + j * D, kn + j * D, c.native.cos(j), c.native.sin(j), D, p.rope, 1.f);
        if (kg) {
          const int64_t s = j / R.g + R.group_offset;
          rotate_row(kbody + j * D, kg + j * D, c.grouped.cos(s), c.grouped.sin(s), D, p.rope, 1.f);
        }
        if (kc) rotate_row(kbody + j * D, kc + j * D, c.cond.cos(j), c.cond.sin(j), D, p.rope, 1.f);
      }
      if (summaries) {
        block_means(kn, L, R.G, D, c.sk_native.data_ptr<float>() + kvh * nG * D);
        block_means(c.v + (kvh * p.N + p.C) * D, L, R.G, D, c.sv.data_ptr<float>() + kvh * nG * D);
        if (kg) block_means(kg, L, R.G, D, c.sk_grouped.data_ptr<float>() + kvh * nG * D);
      }
    }
  });
}

std::tuple<at::Tensor, at::Tensor> attn_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                            const std::optional<at::Tensor>& retrieved, c10::string_view method,
                                            int64_t control_tokens, int64_t window, int64_t summary_block,
                                            int64_t near_range, int64_t topk, int64_t retrieval_block,
                                            int64_t query_block, int64_t train_length, int64_t sinks,
                                            bool far_summaries, double theta, int64_t rotary_dim,
                                            c10::string_view rope_style, double scale) {
  Call c{};
  c.p = check_attn(q, k, v, retrieved, method, control_tokens, window, summary_block, near_range, topk,
                   retrieval_block, query_block, train_length, sinks, far_summaries, theta, rotary_dim,
                   rope_style, scale);
  const AttnParams& p = c.p;
  const Rules& R = p.rules;
  at::Tensor qf = q.to(at::kFloat).contiguous(), kf = k.to(at::kFloat).contiguous(),
             vf = v.to(at::kFloat).contiguous();
  at::Tensor out = at::empty({p.B, p.Hq, p.N, p.D}, qf.options());
  at::Tensor lse = at::empty({p.B, p.Hq, p.N}, qf.options());
  if (p.N == 0 || p.B == 0 || p.Hq == 0) return {out.to(q.scalar_type()), lse};
  c.q = qf.data_ptr<float>();
  c.k = kf.data_ptr<float>();
  c.v = vf.data_ptr<float>();
  c.out = out.data_ptr<float>();
  c.lse = lse.data_ptr<float>();

  at::Tensor blocks;
  if (R.method == Method::kRangeSwa && p.L > 0) {
    if (retrieved.has_value()) {
      blocks = retrieved->contiguous();
      check_retrieved_values(blocks, R);
    } else if (R.topk > 0) {
      blocks = topk_blocks_float(qf, kf, p.C, R);
    }
  }
  if (blocks.defined() && blocks.size(3) > 0) {
    c.retrieved = blocks.data_ptr<int32_t>();
    c.retrieved_k = blocks.size(3);
  }

  c.native = RopeTable(p.rope, 0.0, 1.0, std::max<int64_t>(p.L, 1));
  if (R.grouping())
    c.grouped = RopeTable(p.rope, double(-R.group_offset), 1.0, (p.L - 1) / R.g + 2 * R.group_offset + 1);
  if (R.extrapolating) c.cond = RopeTable(p.rope, 0.0, p.control_position_scale, p.L);
  prepare_keys(c);
  for (int64_t blk = 0; blk < R.num_summary_blocks(); ++blk) c.log_block_size.push_back(std::log(float(R.block_size(blk))));

  std::vector<Tile> tiles;
  for (int64_t qb = 0; qb < R.num_query_blocks(); ++qb) {
    const int64_t end = std::min(p.L, qb * R.Qb + R.Qb);
    for (int64_t i0 = qb * R.Qb; i0 < end; i0 += kTileRows) tiles.push_back({i0, std::min(kTileRows, end - i0), qb});
  }
  const int64_t n_tiles = int64_t(tiles.size()), heads = p.B * p.Hq;
  const int64_t control_tasks = p.C > 0 ? heads : 0;
  at::parallel_for(0, heads * n_tiles + control_tasks, 1, [&](int64_t begin, int64_t end) {
    Workspace ws(c);
    for (int64_t task = begin; task < end; ++task) {
      if (task < heads * n_tiles) {
        const int64_t bh = task / n_tiles;
        body_tile(c, bh / p.Hq, bh % p.Hq, tiles[task % n_tiles], ws);
      } else {
        const int64_t bh = task - heads * n_tiles;
        control_rows(c, bh / p.Hq, bh % p.Hq, ws);
      }
    }
  });
  return {out.to(q.scalar_type()), lse};
}

}  // namespace

TORCH_LIBRARY_IMPL(rangeswa, CPU, m) { m.impl("attn", &attn_cpu); }

}  // namespace rangeswa::cpu
