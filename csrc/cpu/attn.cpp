// The fused RangeSWA attention on the CPU (SPEC sections 1-4, op `attn` of section 5).
//
// The (batch, KV head) pairs are taken a few at a time (kPassBytes of rotated keys): each pass
// rotates their keys and forms their block summaries, then runs their query heads. Work in a pass
// is split into tiles of up to kTileRows body query rows inside one query block (so the rows of a
// tile share their retrieved blocks), plus one task for the control query rows of each head.
// A tile folds a few wide segments into one online softmax (running max m, sum l, unnormalised
// output o), so memory per thread is a few tile-sized buffers and nothing is N x N:
//   1. the control keys;
//   2. the window zone (the G-blocks of the union of the tile's windows): every exact logit, then
//      per row each block is exact, or summarised as the mean of its exact logits plus log n_b;
//   3. the retrieved blocks of the query block, gathered once into contiguous buffers;
//   4. every other G-block as one summary key, scored against block means of the rotated keys
//      (q . mean(R k) = mean(q . R k)), except blocks straddling distance Hn for a row, which are
//      scored token by token.
// Pairs use separately rotated vectors (rules.h PosClass): native (q at i, k at j), grouped-left
// (q at i/g + c, k at j/g) or grouped-right (q at i/g - c, k at j/g); body -> control uses q at
// i*T/L (or i) against the unrotated control key; control -> body uses k at j*T/L (or j). Each
// segment splits its keys into runs where all rows of the tile share one class (one GEMM each) and
// narrow runs near distance Hn where rows differ (both GEMMs, then a per-pair pick).
// SPEC section 7: tiles cover only the body rows q holds (first_row .. L - 1), and under a causal block
// every pair past the row's visible end is dropped after the rules above decide; a summary block the
// row sees only in part (possible only when cb is not a multiple of G) is averaged over its visible
// tokens, logit and value, and folded into that row alone.
// Packed calls (cu_seqlens, csrc/varlen.h): every sequence gets its own Call (its own L, rules, rope tables,
// retrieved blocks, tiles), checked as its own call would be, and run_sequences runs the passes of all of
// them, units of several sequences sharing one parallel region (docs/cpu.md, "Packed calls").
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/kernels.h"
#include "prepared.h"
#include "varlen.h"

namespace rangeswa::cpu {
namespace {

constexpr int64_t kTileRows = 64;
constexpr int64_t kChunkKeys = 512;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Per (batch, KV head) keys and summaries. The inputs' rows are read in place (row strides k_ld,
// v_ld); the rotated keys and summaries are contiguous [rows, D].
struct KvView {
  const float* k_control;  // [C, D] control keys, never rotated (row stride k_ld)
  const float* v_control;  // [C, D] (row stride v_ld)
  const float* v_body;     // [L, D] (row stride v_ld)
  int64_t k_ld, v_ld;
  const float* k_native;   // [L, D] R(j) k_j
  const float* k_grouped;  // [L, D] R(j/g) k_j (grouping only)
  const float* k_cond;     // [L, D] R(j T/L) k_j (extrapolating with control tokens only)
  const float* sk_native;  // [nG, D] mean of k_native per G-block (rangeswa only)
  const float* sk_grouped; // [nG, D] mean of k_grouped per G-block (rangeswa with grouping only)
  const float* sv;         // [nG, D] mean of v per G-block (rangeswa only)
};

// One array of rotated keys or summaries for every (batch, KV head). Logical row j of KV head kv
// (= b * Hkv + h) is at row(kv, j): a call's pass buffers hold KV heads [first, first + count)
// contiguously, a prepared context (op `prepare`, csrc/prepared.h) any batch / head strides, and the
// prepare op's own outputs start at row0.
struct HeadRows {
  float* base = nullptr;
  int64_t sb = 0, sh = 0;      // element strides between batches and between KV heads
  int64_t first = 0, Hkv = 1;  // the first KV head held
  int64_t row0 = 0, ld = 0;    // the first logical row held, row stride

  float* row(int64_t kv, int64_t j) const {
    if (base == nullptr) return nullptr;
    const int64_t x = kv - first;
    return base + (x / Hkv) * sb + (x % Hkv) * sh + (j - row0) * ld;
  }
  // Rows [count, rows, D] of KV heads [first, first + count), contiguous.
  static HeadRows pass(const at::Tensor& t, int64_t first, int64_t Hkv) {
    if (!t.defined()) return HeadRows{};
    return HeadRows{t.data_ptr<float>(), Hkv * t.size(1) * t.size(2), t.size(1) * t.size(2), first, Hkv, 0,
                    t.size(2)};
  }
  // A [B, Hkv, rows, D] tensor with contiguous rows, logical rows from row0 on; empty: no array.
  static HeadRows of(const at::Tensor& t, int64_t row0 = 0) {
    if (!t.defined() || t.numel() == 0) return HeadRows{};
    return HeadRows{t.data_ptr<float>(), t.stride(0), t.stride(1), 0, t.size(1), row0, t.stride(2)};
  }
};

struct Call {
  AttnParams p;
  const float* q;  // float [B, Hq, N, D], rows at qs.at(b, h, n)
  const float* k;  // float [B, Hkv, N, D], rows at ks.at(b, h, n)
  const float* v;
  RowStrides qs, ks, vs;
  float* out;      // float [B, Hq, out_rows, D]: row n of head (b, h) at (b * Hq + h) * out_rows + n
  float* lse;      // float [B, Hq, out_rows]
  int64_t out_rows;  // Nq; a packed call's total q rows (out and lse point at the sequence's first row)
  const int32_t* retrieved;  // [B, Hkv, nQb, K'] or null
  int64_t retrieved_k;
  std::shared_ptr<const RopeTable> native, grouped, cond;  // positions j; j/g - c .. ; j*T/L
  std::vector<float> log_block_size;  // log n_b of every G-block (rule 4's summary bias)
  // Rotated keys and summaries: a pass's buffers, or a prepared context.
  HeadRows k_native, k_grouped, k_cond, sk_native, sk_grouped, sv;
  std::vector<at::Tensor> buffers;  // the pass buffers, kept alive

  // The pass buffers hold KV heads [first, ...).
  void start_pass(int64_t first) {
    for (HeadRows* a : {&k_native, &k_grouped, &k_cond, &sk_native, &sk_grouped, &sv}) a->first = first;
  }

  // Keys per pass over a range: whole G-blocks of about kChunkKeys keys, but never more than the call
  // has, so that a G far beyond L sizes no buffer.
  int64_t chunk_tokens() const {
    return std::min(std::max(p.rules.G, (kChunkKeys / p.rules.G) * p.rules.G), std::max({p.L, p.C, int64_t(1)}));
  }
  // Whole G-blocks per window-zone pass: one when a block is wider than a chunk (then it holds at most L keys).
  int64_t chunk_blocks() const { return std::max<int64_t>(1, chunk_tokens() / p.rules.G); }

  KvView view(int64_t b, int64_t hkv) const {
    const int64_t kv = b * p.Hkv + hkv;
    return KvView{k + ks.at(b, hkv, 0),      v + vs.at(b, hkv, 0),       v + vs.at(b, hkv, p.C),
                  ks.row,                    vs.row,
                  k_native.row(kv, 0),       k_grouped.row(kv, 0),       k_cond.row(kv, 0),
                  sk_native.row(kv, 0),      sk_grouped.row(kv, 0),      sv.row(kv, 0)};
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

  // Folds one (logit, value) pair into row r alone (a summary only this row sees in this form).
  void update_one(int64_t r, float logit, const float* value) {
    if (logit == kNegInf) return;
    const float m_new = std::max(m[r], logit);
    const float alpha = m[r] == kNegInf ? 0.f : std::exp(m[r] - m_new), p = std::exp(logit - m_new);
    l[r] = l[r] * alpha + p;
    for (int64_t c = 0; c < D; ++c) o[r * D + c] = o[r * D + c] * alpha + p * value[c];
    m[r] = m_new;
  }

  // Folds logits S[n, cols] (row stride lds, -inf = not seen) with values V[cols, D] (row stride ldv)
  // into the state. S is overwritten with probabilities.
  void update(float* S, int64_t cols, int64_t lds, const float* V, int64_t ldv) {
    if (cols == 0) return;
    for (int64_t r = 0; r < n; ++r) {
      float* row = S + r * lds;
      const float mx = row_max(row, cols);
      if (mx == kNegInf) {
        std::fill(row, row + cols, 0.f);
        continue;
      }
      const float m_new = std::max(m[r], mx);
      const float alpha = m[r] == kNegInf ? 0.f : std::exp(m[r] - m_new);
      l[r] = l[r] * alpha + exp_shifted(row, cols, m_new);
      if (alpha != 1.f)
        for (int64_t c = 0; c < D; ++c) o[r * D + c] *= alpha;
      m[r] = m_new;
    }
    gemm_nn(n, D, cols, S, lds, V, ldv, o.data(), D, 1.f);
  }

  void write(float* out_rows, float* lse_rows) const {
    for (int64_t r = 0; r < n; ++r) {
      const float inv = 1.f / l[r];
      for (int64_t c = 0; c < D; ++c) out_rows[r * D + c] = o[r * D + c] * inv;
      lse_rows[r] = m[r] + std::log(l[r]);
    }
  }
};

// Within-block prefix sums of the native and grouped keys of the blocks a tile finds mixed, so a
// mixed (row, block) pair costs three dot products instead of one per token.
struct MixedPrefix {
  std::vector<int64_t> blocks;      // blocks held, in slot order
  std::vector<float> native, grouped;  // [slot][G][D]: sum of keys block_start .. block_start + s

  const float* slot(const Call& c, const KvView& kv, int64_t blk, bool grouped_side) {
    const Rules& R = c.p.rules;
    const int64_t D = c.p.D, per = std::min(R.G, R.L) * D;  // a block holds at most L keys
    size_t at = std::find(blocks.begin(), blocks.end(), blk) - blocks.begin();
    if (at == blocks.size()) {
      blocks.push_back(blk);
      native.resize(blocks.size() * per);
      grouped.resize(blocks.size() * per);
      for (int pass = 0; pass < (kv.k_grouped ? 2 : 1); ++pass) {
        const float* keys = (pass == 0 ? kv.k_native : kv.k_grouped) + R.block_start(blk) * D;
        float* out = (pass == 0 ? native : grouped).data() + at * per;
        std::copy_n(keys, D, out);
        for (int64_t s = 1; s < R.block_size(blk); ++s)
          for (int64_t d = 0; d < D; ++d) out[s * D + d] = out[(s - 1) * D + d] + keys[s * D + d];
      }
    }
    return (grouped_side ? grouped : native).data() + at * per;
  }
};

// Buffers of one worker thread.
struct Workspace {
  std::vector<float> qn, qgl, qgr, qc;          // [kTileRows, D] rotated, scaled queries
  std::vector<float> s, s_alt, s_right, s_sum;  // [kTileRows, chunk] score buffers
  std::vector<uint8_t> excluded;                // [nG] blocks the summary pass skips (window, retrieved)
  std::vector<float> bias;                      // [chunk] per-block summary bias of one pass
  std::vector<float> partial_value;             // [D] mean value of a block's visible tokens (section 7)
  std::vector<int64_t> partial;                 // tile rows that see a summary block in part (section 7)
  // Retrieved tokens of one (batch, KV head, query block), gathered in ascending token order.
  int64_t gathered_for = -1;
  std::vector<int64_t> g_index;
  std::vector<float> g_native, g_grouped, g_v;
  MixedPrefix mixed;  // reset per tile
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
    excluded.resize(c.p.rules.num_summary_blocks());
    bias.resize(chunk);
    partial_value.resize(D);
  }
};

struct Tile {
  int64_t i0, n, qb;  // body rows [i0, i0 + n) of query block qb
  int64_t last() const { return i0 + n - 1; }
};

// Exact logits S[r, x] of tile rows with `count` body keys whose indices ascend: index[x], or a + x
// when index is null; kn / kg hold their native / grouped rotations in the same order.
void exact_scores(const Call& c, const Tile& t, Workspace& ws, const float* kn, const float* kg,
                  const int64_t* index, int64_t a, int64_t count, float* S, int64_t lds) {
  const Rules& R = c.p.rules;
  const int64_t D = c.p.D;
  auto scores = [&](int64_t lo, int64_t hi, const float* qv, const float* keys, float* dst) {
    if (hi > lo) gemm_nt(t.n, hi - lo, D, qv, D, keys + lo * D, D, dst + lo, lds);
  };
  if (!R.grouping()) {
    scores(0, count, ws.qn.data(), kn, S);
    return;
  }
  // First x whose key index is >= j.
  auto first = [&](int64_t j) {
    if (index == nullptr) return std::min(count, std::max<int64_t>(0, j - a));
    return int64_t(std::lower_bound(index, index + count, j) - index);
  };
  // Keys below i0 - Hn are grouped-left for every row, below last - Hn for some; likewise right.
  const int64_t left_all = first(t.i0 - R.Hn), left_some = first(t.last() - R.Hn);
  const int64_t right_some = first(t.i0 + R.Hn + 1), right_all = first(t.last() + R.Hn + 1);
  scores(0, left_all, ws.qgl.data(), kg, S);
  scores(left_all, right_all, ws.qn.data(), kn, S);
  scores(right_all, count, ws.qgr.data(), kg, S);
  float* alt = ws.s_alt.data();
  auto mixed = [&](int64_t lo, int64_t hi, const float* qv, PosClass cls) {
    if (hi <= lo) return;
    scores(lo, hi, qv, kg, alt);
    for (int64_t r = 0; r < t.n; ++r)
      for (int64_t x = lo; x < hi; ++x)
        if (R.pos_class(t.i0 + r, index ? index[x] : a + x) == cls) S[r * lds + x] = alt[r * lds + x];
  };
  mixed(left_all, left_some, ws.qgl.data(), PosClass::kGroupedLeft);
  mixed(right_some, right_all, ws.qgr.data(), PosClass::kGroupedRight);
}

// Exact logits of tile rows with the contiguous body keys [a, b).
void exact_range(const Call& c, const KvView& kv, const Tile& t, Workspace& ws, int64_t a, int64_t b, float* S,
                 int64_t lds) {
  const int64_t D = c.p.D;
  exact_scores(c, t, ws, kv.k_native + a * D, kv.k_grouped ? kv.k_grouped + a * D : nullptr, nullptr, a, b - a, S,
               lds);
}

// Section 7: hides the keys [max(a, visible_end(i)), b) of every tile row i in S[r, j - a].
void drop_invisible(const Rules& R, const Tile& t, int64_t a, int64_t b, float* S, int64_t lds) {
  if (R.cb == 0) return;
  for (int64_t r = 0; r < t.n; ++r) {
    const int64_t from = std::max(a, R.visible_end(t.i0 + r));
    if (from < b) std::fill(S + r * lds + from - a, S + r * lds + b - a, kNegInf);
  }
}

// The mean value of a block's tokens [s0, end) (section 7: the part of a summary block a row sees).
const float* mean_value(const KvView& kv, Workspace& ws, int64_t D, int64_t s0, int64_t end) {
  std::fill(ws.partial_value.begin(), ws.partial_value.end(), 0.f);
  for (int64_t j = s0; j < end; ++j)
    for (int64_t d = 0; d < D; ++d) ws.partial_value[d] += kv.v_body[j * kv.v_ld + d];
  for (int64_t d = 0; d < D; ++d) ws.partial_value[d] /= float(end - s0);
  return ws.partial_value.data();
}

// Token-level methods (full, self_extend, swa): every key of [a, b) exact or hidden.
void dense_tokens(const Call& c, const KvView& kv, const Tile& t, Workspace& ws, int64_t a, int64_t b) {
  const Rules& R = c.p.rules;
  const int64_t lds = c.chunk_tokens();
  float* S = ws.s.data();
  exact_range(c, kv, t, ws, a, b, S, lds);
  if (R.method == Method::kSwa)
    for (int64_t r = 0; r < t.n; ++r)
      for (int64_t j = a; j < b; ++j)
        if (R.token_role(t.i0 + r, j) != Role::kExact) S[r * lds + j - a] = kNegInf;
  drop_invisible(R, t, a, b, S, lds);
  ws.softmax.update(S, b - a, lds, kv.v_body + a * kv.v_ld, kv.v_ld);
}

// rangeswa: window-zone G-blocks [ba, bb) with every exact logit computed; per row each block is
// exact (in the row's window) or summarised from its exact logits, or hidden.
void window_zone(const Call& c, const KvView& kv, const Tile& t, Workspace& ws, int64_t ba, int64_t bb) {
  const Rules& R = c.p.rules;
  const int64_t lds = c.chunk_tokens(), a = R.block_start(ba), b = R.block_end(bb - 1), nb = bb - ba;
  float* S = ws.s.data();
  float* Ssum = ws.s_sum.data();
  exact_range(c, kv, t, ws, a, b, S, lds);
  bool any_summary = false;
  // (row, logit) of a block a row sees in part (section 7): the block holding its visible end.
  std::vector<std::pair<int64_t, float>> partial;
  for (int64_t r = 0; r < t.n; ++r) {
    float* row = S + r * lds;
    const int64_t end = R.visible_end(t.i0 + r) - a;  // keys [end, ...) are invisible to this row
    for (int64_t blk = ba; blk < bb; ++blk) {
      const int64_t s0 = R.block_start(blk) - a, s1 = R.block_end(blk) - a, seen = std::min(s1, end);
      const Role role = R.block_role(t.i0 + r, blk, false);  // retrieved blocks never meet the window
      float summary = kNegInf;
      if (role == Role::kSummary && seen > s0) {  // the mean exact logit of the tokens it sees, + log n
        float acc = 0.f;
        for (int64_t j = s0; j < seen; ++j) acc += row[j];
        summary = acc / float(seen - s0) + std::log(float(seen - s0));
        if (seen < s1) {  // seen in part: its value differs from the block's mean value
          partial.emplace_back(r, summary);
          summary = kNegInf;
        } else {
          any_summary = true;
        }
      }
      if (role != Role::kExact) std::fill(row + s0, row + s1, kNegInf);
      Ssum[r * lds + blk - ba] = summary;
    }
  }
  drop_invisible(R, t, a, b, S, lds);
  ws.softmax.update(S, b - a, lds, kv.v_body + a * kv.v_ld, kv.v_ld);
  if (any_summary) ws.softmax.update(Ssum, nb, lds, kv.sv + ba * c.p.D, c.p.D);
  for (const auto& [r, logit] : partial) {
    const int64_t end = R.visible_end(t.i0 + r);
    ws.softmax.update_one(r, logit, mean_value(kv, ws, c.p.D, R.block_start(end / R.G), end));
  }
}

// rangeswa rule 3: the retrieved tokens of the tile's query block, exact for every row.
void retrieved_keys(const Call& c, const KvView& kv, const Tile& t, Workspace& ws, int64_t b, int64_t hkv) {
  const Rules& R = c.p.rules;
  const int64_t D = c.p.D, chunk = c.chunk_tokens();
  const int64_t key = (b * c.p.Hkv + hkv) * R.num_query_blocks() + t.qb;
  if (ws.gathered_for != key) {  // gather once per query block: its tiles run one after another
    std::vector<int64_t> blocks;
    const int32_t* row = c.retrieved + key * c.retrieved_k;
    for (int64_t s = 0; s < c.retrieved_k; ++s)
      if (row[s] >= 0) blocks.push_back(row[s]);
    std::sort(blocks.begin(), blocks.end());
    ws.g_index.clear();
    for (int64_t kb : blocks)
      for (int64_t j = kb * R.Rb; j < std::min(c.p.L, kb * R.Rb + R.Rb); ++j) ws.g_index.push_back(j);
    const int64_t n = int64_t(ws.g_index.size());
    ws.g_native.resize(n * D);
    ws.g_v.resize(n * D);
    ws.g_grouped.resize(R.grouping() ? n * D : 0);
    for (int64_t x = 0; x < n; ++x) {
      const int64_t j = ws.g_index[x];
      std::copy_n(kv.k_native + j * D, D, ws.g_native.data() + x * D);
      std::copy_n(kv.v_body + j * kv.v_ld, D, ws.g_v.data() + x * D);
      if (R.grouping()) std::copy_n(kv.k_grouped + j * D, D, ws.g_grouped.data() + x * D);
    }
    ws.gathered_for = key;
  }
  const int64_t n = int64_t(ws.g_index.size());
  for (int64_t x0 = 0; x0 < n; x0 += chunk) {
    const int64_t w = std::min(n, x0 + chunk) - x0;
    exact_scores(c, t, ws, ws.g_native.data() + x0 * D, R.grouping() ? ws.g_grouped.data() + x0 * D : nullptr,
                 ws.g_index.data() + x0, 0, w, ws.s.data(), chunk);
    ws.softmax.update(ws.s.data(), w, chunk, ws.g_v.data() + x0 * D, D);
  }
}

// The mean exact logit of tile row r over the tokens [s0, min(block end, end)) of block blk, each
// with its own rotation pair: a block straddling distance Hn (its tokens in several position
// classes), or one the row sees only in part (section 7). Tokens split into three runs, grouped-left
// [s0, i-Hn-1], native [i-Hn, i+Hn] and grouped-right [i+Hn+1, e], each a difference of prefix sums.
float mean_exact_logit(const Call& c, const KvView& kv, const Tile& t, Workspace& ws, int64_t r, int64_t blk,
                       int64_t end) {
  const Rules& R = c.p.rules;
  const int64_t D = c.p.D, i = t.i0 + r, s0 = R.block_start(blk), e = std::min(R.block_end(blk), end) - 1;
  auto run = [&](int64_t lo, int64_t hi, const float* qv, bool grouped_side) {  // q . sum of keys [lo, hi]
    lo = std::max(lo, s0);
    hi = std::min(hi, e);
    if (hi < lo) return 0.f;
    const float* prefix = ws.mixed.slot(c, kv, blk, grouped_side);
    const float* upper = prefix + (hi - s0) * D;
    const float* lower = lo > s0 ? prefix + (lo - 1 - s0) * D : nullptr;
    float dot = 0.f;
#pragma omp simd reduction(+ : dot)
    for (int64_t d = 0; d < D; ++d) dot += qv[d] * (upper[d] - (lower ? lower[d] : 0.f));
    return dot;
  };
  if (!R.grouping()) return run(s0, e, ws.qn.data() + r * D, false) / float(e + 1 - s0);
  const float total = run(s0, i - R.Hn - 1, ws.qgl.data() + r * D, true) +
                      run(i - R.Hn, i + R.Hn, ws.qn.data() + r * D, false) +
                      run(i + R.Hn + 1, e, ws.qgr.data() + r * D, true);
  return total / float(e + 1 - s0);
}

// rangeswa rule 4: G-blocks [ba, bb) not excluded (window zone, retrieved) as summary keys, scored
// against block means of the rotated keys in each block's position class.
void summary_pass(const Call& c, const KvView& kv, const Tile& t, Workspace& ws, int64_t ba, int64_t bb) {
  const Rules& R = c.p.rules;
  const int64_t lds = c.chunk_tokens(), D = c.p.D, nb = bb - ba;
  float* S = ws.s_sum.data();
  auto scores = [&](int64_t lo, int64_t hi, const float* qv, const float* sk, float* dst) {
    lo = std::max(lo, ba);
    hi = std::min(hi, bb);
    if (hi > lo) gemm_nt(t.n, hi - lo, D, qv, D, sk + lo * D, D, dst + (lo - ba), lds);
  };
  if (!R.grouping()) {
    scores(ba, bb, ws.qn.data(), kv.sk_native, S);
  } else {
    const int64_t left_all = R.far_left_end(t.i0), left_some = R.far_left_end(t.last());
    const int64_t right_some = R.far_right_begin(t.i0), right_all = R.far_right_begin(t.last());
    scores(ba, left_all, ws.qgl.data(), kv.sk_grouped, S);
    scores(left_all, right_all, ws.qn.data(), kv.sk_native, S);
    scores(right_all, bb, ws.qgr.data(), kv.sk_grouped, S);
    // Where rows disagree: one block more on each side holds the blocks straddling distance Hn.
    scores(left_all, left_some + 1, ws.qgl.data(), kv.sk_grouped, ws.s_alt.data());
    scores(right_some - 1, right_all, ws.qgr.data(), kv.sk_grouped, ws.s_right.data());
    auto pick = [&](int64_t lo, int64_t hi) {
      lo = std::max(lo, ba);
      hi = std::min(hi, bb);
      for (int64_t r = 0; r < t.n; ++r)
        for (int64_t blk = lo; blk < hi; ++blk) {
          const BlockClass cls = R.block_class(t.i0 + r, blk);
          const int64_t at = r * lds + blk - ba;
          if (cls == BlockClass::kLeft) S[at] = ws.s_alt[at];
          else if (cls == BlockClass::kRight) S[at] = ws.s_right[at];
          else if (cls == BlockClass::kMixed) S[at] = mean_exact_logit(c, kv, t, ws, r, blk, R.L);
        }
    };
    if (left_some + 1 >= right_some - 1) {
      pick(left_all, right_all);
    } else {
      pick(left_all, left_some + 1);
      pick(right_some - 1, right_all);
    }
  }
  // Summary bias log n_b, or -inf for blocks the window zone or retrieval already cover.
  float* bias = ws.bias.data();
  bool any = false;
  for (int64_t x = 0; x < nb; ++x) {
    bias[x] = ws.excluded[ba + x] ? kNegInf : c.log_block_size[ba + x];
    any = any || !ws.excluded[ba + x];
  }
  if (!any) return;
  for (int64_t r = 0; r < t.n; ++r) {
    float* row = S + r * lds;
#pragma omp simd
    for (int64_t x = 0; x < nb; ++x) row[x] += bias[x];
    if (!R.far_summaries) {  // RangeSWA-Lite: only blocks near this row
      const int64_t lo = std::clamp(R.near_first(t.i0 + r) - ba, int64_t(0), nb);
      const int64_t hi = std::clamp(R.near_last(t.i0 + r) + 1 - ba, lo, nb);
      std::fill(row, row + lo, kNegInf);
      std::fill(row + hi, row + nb, kNegInf);
    }
    if (R.cb > 0) {  // section 7: blocks past the row's visible end are dropped
      // split: the first block the row does not see whole (none when it sees up to L, ragged last block included)
      const int64_t end = R.visible_end(t.i0 + r), split = end == R.L ? R.num_summary_blocks() : end / R.G;
      if (end < R.L && end % R.G != 0 && split >= ba && split < bb && row[split - ba] != kNegInf)
        ws.partial.push_back(r);  // seen in part: folded below with its own logit and value
      const int64_t from = std::clamp(split - ba, int64_t(0), nb);
      std::fill(row + from, row + nb, kNegInf);
    }
  }
  ws.softmax.update(S, nb, lds, kv.sv + ba * D, D);
  for (int64_t r : ws.partial) {
    const int64_t end = R.visible_end(t.i0 + r), blk = end / R.G, s0 = R.block_start(blk);
    const float logit = mean_exact_logit(c, kv, t, ws, r, blk, end) + std::log(float(end - s0));
    ws.softmax.update_one(r, logit, mean_value(kv, ws, D, s0, end));
  }
  ws.partial.clear();
}

// Folds every control key into the softmax for `rows` query rows whose vectors are `qv`.
void control_keys(const Call& c, const KvView& kv, int64_t rows, const float* qv, Workspace& ws) {
  const int64_t D = c.p.D, chunk = c.chunk_tokens();
  for (int64_t a = 0; a < c.p.C; a += chunk) {
    const int64_t w = std::min(c.p.C, a + chunk) - a;
    gemm_nt(rows, w, D, qv, D, kv.k_control + a * kv.k_ld, kv.k_ld, ws.s.data(), chunk);
    ws.softmax.update(ws.s.data(), w, chunk, kv.v_control + a * kv.v_ld, kv.v_ld);
  }
}

void rotate_queries(const Call& c, const float* qrows, const Tile& t, Workspace& ws) {
  const Rules& R = c.p.rules;
  const int64_t D = c.p.D;
  const float scale = float(c.p.scale);
  for (int64_t r = 0; r < t.n; ++r) {
    const int64_t i = t.i0 + r;
    const float* x = qrows + r * c.qs.row;
    rotate_row(x, ws.qn.data() + r * D, c.native->cos(i), c.native->sin(i), D, c.p.rope, scale);
    if (R.grouping()) {
      const int64_t base = i / R.g;  // table index = position + c
      rotate_row(x, ws.qgl.data() + r * D, c.grouped->cos(base + 2 * R.group_offset),
                 c.grouped->sin(base + 2 * R.group_offset), D, c.p.rope, scale);
      rotate_row(x, ws.qgr.data() + r * D, c.grouped->cos(base), c.grouped->sin(base), D, c.p.rope, scale);
    }
    if (conditioned(c.p.rules, c.p.C))
      rotate_row(x, ws.qc.data() + r * D, c.cond->cos(i), c.cond->sin(i), D, c.p.rope, scale);
  }
}

void body_tile(const Call& c, int64_t b, int64_t h, const Tile& t, Workspace& ws) {
  const AttnParams& p = c.p;
  const Rules& R = p.rules;
  const int64_t D = p.D, hkv = h / (p.Hq / p.Hkv);
  const KvView kv = c.view(b, hkv);
  // q and the output hold body row i at row C + i - first_row (section 7's suffix calls).
  const int64_t n0 = p.C + t.i0 - p.first_row, row0 = (b * p.Hq + h) * c.out_rows + n0;
  rotate_queries(c, c.q + c.qs.at(b, h, n0), t, ws);
  ws.softmax.reset(t.n, D);

  const int64_t chunk = c.chunk_tokens();
  // Keys from the last row's visible end on are hidden from every row of the tile (section 7).
  const int64_t seen = R.visible_end(t.last());
  // Rule 1: control keys, unrotated (position 0).
  control_keys(c, kv, t.n, conditioned(R, p.C) ? ws.qc.data() : ws.qn.data(), ws);
  if (R.method == Method::kFull || R.method == Method::kSelfExtend) {
    for (int64_t a = 0; a < seen; a += chunk) dense_tokens(c, kv, t, ws, a, std::min(seen, a + chunk));
  } else if (R.method == Method::kSwa) {
    const int64_t lo = std::max<int64_t>(0, t.i0 - R.radius), hi = std::min(seen, t.last() + R.radius + 1);
    // Sinks before the window get their own run; sinks from lo on are visited with the window run,
    // which then reaches at least the last sink.
    const int64_t sinks_end = std::min({R.sinks, p.L, seen}), sinks = std::min(sinks_end, lo);
    const int64_t end = std::max(hi, sinks_end);
    for (int64_t a = 0; a < sinks; a += chunk) dense_tokens(c, kv, t, ws, a, std::min(sinks, a + chunk));
    for (int64_t a = lo; a < end; a += chunk) dense_tokens(c, kv, t, ws, a, std::min(end, a + chunk));
  } else {
    const int64_t nG = R.num_summary_blocks();
    const int64_t wf = R.window_first_block(t.i0), wl = R.window_last_block(t.last());
    const int64_t step = c.chunk_blocks();
    for (int64_t ba = wf; ba <= wl; ba += step) window_zone(c, kv, t, ws, ba, std::min(wl + 1, ba + step));
    std::fill(ws.excluded.begin(), ws.excluded.end(), 0);
    std::fill(ws.excluded.begin() + wf, ws.excluded.begin() + wl + 1, 1);
    if (c.retrieved != nullptr) {
      retrieved_keys(c, kv, t, ws, b, hkv);
      for (size_t x = 0; x < ws.g_index.size(); x += size_t(R.G)) ws.excluded[ws.g_index[x] / R.G] = 1;
    }
    ws.mixed.blocks.clear();
    // Without far summaries only blocks near some row of the tile can be seen.
    const int64_t lo = R.far_summaries ? 0 : R.far_left_end(t.i0);
    const int64_t hi = std::min(R.far_summaries ? nG : R.far_right_begin(t.last()), ceil_div(seen, R.G));
    if (R.summaries)
      for (int64_t ba = lo; ba < hi; ba += chunk) summary_pass(c, kv, t, ws, ba, std::min(hi, ba + chunk));
  }
  ws.softmax.write(c.out + row0 * D, c.lse + row0);
}

// Control query rows: every control key (position 0 on both sides) and every body key, the latter
// at position j*T/L with logit bias -log(L/T) when extrapolating, else native.
void control_rows(const Call& c, int64_t b, int64_t h, Workspace& ws) {
  const AttnParams& p = c.p;
  const int64_t D = p.D, hkv = h / (p.Hq / p.Hkv), lds = c.chunk_tokens();
  const KvView kv = c.view(b, hkv);
  const int64_t row0 = (b * p.Hq + h) * c.out_rows;  // of the contiguous output
  const float scale = float(p.scale);
  const float* qrows = c.q + c.qs.at(b, h, 0);
  for (int64_t r = 0; r < p.C; ++r)
    for (int64_t d = 0; d < D; ++d) ws.qn[r * D + d] = qrows[r * c.qs.row + d] * scale;
  ws.softmax.reset(p.C, D);
  control_keys(c, kv, p.C, ws.qn.data(), ws);
  float* S = ws.s.data();
  const float* keys = conditioned(p.rules, p.C) ? kv.k_cond : kv.k_native;
  const float bias = float(p.control_bias);
  for (int64_t a = 0; a < p.L; a += lds) {
    const int64_t w = std::min(p.L, a + lds) - a;
    gemm_nt(p.C, w, D, ws.qn.data(), D, keys + a * D, D, S, lds);
    if (bias != 0.f)
      for (int64_t r = 0; r < p.C; ++r)
        for (int64_t j = 0; j < w; ++j) S[r * lds + j] += bias;
    ws.softmax.update(S, w, lds, kv.v_body + a * kv.v_ld, kv.v_ld);
  }
  ws.softmax.write(c.out + row0 * D, c.lse + row0);
}

// The rotated keys and block summaries are built for a few (batch, KV head) pairs at a time, as
// many as fit in kPassBytes: every tile of those heads then reads them from the last-level cache,
// and the buffers, allocated once per call and reused pass after pass, stay small whatever L is.
constexpr int64_t kPassBytes = int64_t(8) << 20;

// A pass also holds at least one task per thread: a cached call (SPEC section 7) has a single query
// tile per head, and passes of one head would leave every thread but one idle.
int64_t heads_per_pass(const AttnParams& p, int64_t tasks_per_kv_head) {
  const Rules& R = p.rules;
  const int64_t kinds = 1 + (R.grouping() ? 1 : 0) + (conditioned(p.rules, p.C) ? 1 : 0);
  const int64_t per_head = std::max<int64_t>(1, p.L * p.D * int64_t(sizeof(float)) * kinds);
  const int64_t busy = ceil_div(at::get_num_threads(), std::max<int64_t>(1, tasks_per_kv_head));
  return std::clamp<int64_t>(std::max(kPassBytes / per_head, busy), 1, p.B * p.Hkv);
}

void allocate_keys(Call& c, int64_t heads) {
  const AttnParams& p = c.p;
  const Rules& R = p.rules;
  const int64_t L = p.L, D = p.D, nG = R.num_summary_blocks();
  auto opts = at::TensorOptions().dtype(at::kFloat);
  auto buffer = [&](bool needed, int64_t rows) {
    if (!needed) return HeadRows{};
    c.buffers.push_back(at::empty({heads, rows, D}, opts));
    return HeadRows::pass(c.buffers.back(), 0, p.Hkv);
  };
  const bool summaries = R.method == Method::kRangeSwa;
  c.k_native = buffer(true, L);
  c.k_grouped = buffer(R.grouping(), L);
  c.k_cond = buffer(conditioned(p.rules, p.C), L);
  c.sk_native = buffer(summaries, nG);
  c.sv = buffer(summaries, nG);
  c.sk_grouped = buffer(summaries && R.grouping(), nG);
}

// Rotated keys and block summaries of rows [from, L) (from a multiple of G) of the (batch, KV head)
// pairs [first, first + count), split into runs of whole G-blocks so that even one head keeps every
// thread busy. Writes the arrays of c that exist.
void prepare_keys(Call& c, int64_t first, int64_t count, int64_t from = 0) {
  const AttnParams& p = c.p;
  const Rules& R = p.rules;
  const int64_t L = p.L, D = p.D;
  for (HeadRows* a : {&c.k_native, &c.k_grouped, &c.k_cond, &c.sk_native, &c.sk_grouped, &c.sv})
    if (a->base != nullptr && a->first != 0) a->first = first;  // pass buffers hold the pass's heads
  const int64_t run = ((1024 + R.G - 1) / R.G) * R.G, runs = (L - from + run - 1) / run;
  at::parallel_for(0, count * runs, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t local = task / runs, j0 = from + (task % runs) * run, j1 = std::min(L, j0 + run);
      const int64_t kvh = first + local, b = kvh / p.Hkv, hkv = kvh % p.Hkv;
      const float* kbody = c.k + c.ks.at(b, hkv, p.C);
      for (int64_t j = j0; j < j1; ++j) {
        const float* krow = kbody + j * c.ks.row;
        rotate_row(krow, c.k_native.row(kvh, j), c.native->cos(j), c.native->sin(j), D, p.rope, 1.f);
        if (c.k_grouped.base) {
          const int64_t s = j / R.g + R.group_offset;
          rotate_row(krow, c.k_grouped.row(kvh, j), c.grouped->cos(s), c.grouped->sin(s), D, p.rope, 1.f);
        }
        if (c.k_cond.base) rotate_row(krow, c.k_cond.row(kvh, j), c.cond->cos(j), c.cond->sin(j), D, p.rope, 1.f);
      }
      if (c.sk_native.base) {  // j0 is a block start, so the run's blocks are [j0 / G, ceil(j1 / G))
        const int64_t blk = j0 / R.G;
        block_means(c.k_native.row(kvh, j0), D, j1 - j0, R.G, D, c.sk_native.row(kvh, blk));
        block_means(c.v + c.vs.at(b, hkv, p.C + j0), c.vs.row, j1 - j0, R.G, D, c.sv.row(kvh, blk));
        if (c.sk_grouped.base) block_means(c.k_grouped.row(kvh, j0), D, j1 - j0, R.G, D, c.sk_grouped.row(kvh, blk));
      }
    }
  });
}

// The rope tables of a call: native positions j, grouped positions j / g (from -c: query rows read
// i / g + c and i / g - c), conditioning positions j T / L.
void rope_tables(Call& c) {
  const AttnParams& p = c.p;
  const Rules& R = p.rules;
  c.native = rope_table(p.rope, 0.0, 1.0, std::max<int64_t>(p.L, 1));
  if (R.grouping())
    c.grouped = rope_table(p.rope, double(-R.group_offset), 1.0, (p.L - 1) / R.g + 2 * R.group_offset + 1);
  if (conditioned(R, p.C)) c.cond = rope_table(p.rope, 0.0, p.control_position_scale, p.L);
}

// One sequence of a call (the whole call, or one sequence of a packed call): its Call, its tiles, and what
// they read kept alive.
struct Sequence {
  Call c;
  std::vector<Tile> tiles;
  bool prepared = false;            // reads a prepared context (one pass over all its KV heads)
  int64_t buffer_heads = 0;         // KV heads its pass buffers hold (0: not allocated)
  at::Tensor blocks;                // its retrieved blocks
  std::vector<at::Tensor> context;  // its prepared context (views of a packed one)
};

// Everything of sq.c but the key buffers, for a checked call: qf, kf, vf are its float rows (views of the
// inputs), out / lse its first output row of `out_rows` per head.
void setup_sequence(Sequence& sq, const at::Tensor& qf, const at::Tensor& kf, const at::Tensor& vf, float* out,
                    float* lse, int64_t out_rows, const std::optional<at::Tensor>& retrieved,
                    const std::optional<at::TensorList>& prepared) {
  Call& c = sq.c;
  const AttnParams& p = c.p;
  const Rules& R = p.rules;
  c.q = qf.data_ptr<float>();
  c.k = kf.data_ptr<float>();
  c.v = vf.data_ptr<float>();
  c.qs = row_strides(qf);
  c.ks = row_strides(kf);
  c.vs = row_strides(vf);
  c.out = out;
  c.lse = lse;
  c.out_rows = out_rows;
  if (R.method == Method::kRangeSwa && p.L > 0) {
    if (retrieved.has_value()) {
      sq.blocks = retrieved->contiguous();
      check_retrieved_values(sq.blocks, R);
    } else if (R.topk > 0) {
      const bool means = prepared.has_value() && (*prepared)[kKeyMeans].numel() > 0;
      if (means)
        TORCH_CHECK_VALUE((*prepared)[kKeyMeans].sizes() ==
                              at::IntArrayRef({p.B, p.Hkv, R.num_key_blocks(), p.D}) &&
                              (*prepared)[kKeyMeans].scalar_type() == at::kDouble,
                          "prepared[", int(kKeyMeans), "] (key means) must be float64 [B, H_kv, key blocks, D], got ",
                          (*prepared)[kKeyMeans].sizes());
      Rules retrieval = R;  // columns past the key block count would only hold -1
      retrieval.topk = std::min(R.topk, R.num_key_blocks());
      sq.blocks = topk_blocks_float(qf, kf, p.C, retrieval, means ? (*prepared)[kKeyMeans] : at::Tensor());
    }
  }
  if (sq.blocks.defined() && sq.blocks.size(3) > 0) {
    c.retrieved = sq.blocks.data_ptr<int32_t>();
    c.retrieved_k = sq.blocks.size(3);
  }

  rope_tables(c);
  for (int64_t blk = 0; blk < R.num_summary_blocks(); ++blk) c.log_block_size.push_back(std::log(float(R.block_size(blk))));

  // Tiles of the body rows q holds, first_row .. L - 1, each inside one query block.
  for (int64_t qb = p.first_row / R.Qb; qb < R.num_query_blocks(); ++qb) {
    const int64_t end = std::min(p.L, qb * R.Qb + R.Qb);
    for (int64_t i0 = std::max(qb * R.Qb, p.first_row); i0 < end; i0 += kTileRows)
      sq.tiles.push_back({i0, std::min(kTileRows, end - i0), qb});
  }
  sq.prepared = prepared.has_value();
  if (sq.prepared) {
    const at::TensorList& ctx = *prepared;
    c.k_native = HeadRows::of(ctx[kKeysNat]);
    c.k_grouped = R.grouping() ? HeadRows::of(ctx[kKeysGrp]) : HeadRows{};
    c.k_cond = conditioned(R, p.C) ? HeadRows::of(ctx[kKeysCond]) : HeadRows{};
    if (R.method == Method::kRangeSwa && R.summaries) {
      c.sk_native = HeadRows::of(ctx[kSumKeys]);
      c.sv = HeadRows::of(ctx[kSumValues]);
      c.sk_grouped = R.grouping() ? HeadRows::of(ctx[kSumKeysGrp]) : HeadRows{};
    }
  }
}

// Runs the sequences' tiles and control rows. Work comes in units of a few KV heads of one sequence (as many
// as fit in kPassBytes of rotated keys, heads_per_pass); consecutive units whose buffers fit in kPassBytes
// together form a pass: their keys are prepared, then every task of the pass (sequences x heads x tiles) runs
// in one parallel region, so short sequences share the threads instead of running one after another.
void run_sequences(std::vector<Sequence>& seqs) {
  struct Unit {
    Sequence* sq;
    int64_t first, count, tasks;
    bool last;  // the sequence's last unit: its buffers go after the pass
  };
  std::vector<std::vector<Unit>> passes;
  int64_t bytes = 0;
  for (Sequence& sq : seqs) {
    const AttnParams& p = sq.c.p;
    const int64_t per_kv = p.Hq / p.Hkv, n_tiles = int64_t(sq.tiles.size()), kv_pairs = p.B * p.Hkv;
    const int64_t tasks_per_kv = per_kv * (n_tiles + (p.C > 0 ? 1 : 0));
    if (tasks_per_kv == 0 || kv_pairs == 0) continue;
    // A prepared context holds every KV head: one unit. Otherwise a few heads a unit, prepared in its pass.
    const int64_t chunk = sq.prepared ? kv_pairs : heads_per_pass(p, tasks_per_kv);
    const int64_t kinds = 1 + (p.rules.grouping() ? 1 : 0) + (conditioned(p.rules, p.C) ? 1 : 0);
    const int64_t per_head = sq.prepared ? 0 : p.L * p.D * int64_t(sizeof(float)) * kinds;
    for (int64_t first = 0; first < kv_pairs; first += chunk) {
      const int64_t count = std::min(chunk, kv_pairs - first);
      const bool same = !passes.empty() && !passes.back().empty() && passes.back().back().sq == &sq;
      if (passes.empty() || same || (bytes > 0 && bytes + count * per_head > kPassBytes)) {
        passes.emplace_back();
        bytes = 0;
      }
      passes.back().push_back({&sq, first, count, count * tasks_per_kv, first + count >= kv_pairs});
      bytes += count * per_head;
    }
  }
  for (std::vector<Unit>& pass : passes) {
    std::vector<int64_t> offsets;
    int64_t total = 0;
    for (const Unit& u : pass) {
      Sequence& sq = *u.sq;
      if (!sq.prepared) {
        if (sq.buffer_heads == 0) {  // allocated once per sequence, reused by its later units
          sq.buffer_heads = u.count;  // the first unit is the largest
          allocate_keys(sq.c, sq.buffer_heads);
        }
        sq.c.start_pass(u.first);
        prepare_keys(sq.c, u.first, u.count);
      }
      offsets.push_back(total);
      total += u.tasks;
    }
    at::parallel_for(0, total, 1, [&](int64_t begin, int64_t end) {
      std::unique_ptr<Workspace> ws;
      const Call* ws_for = nullptr;
      for (int64_t task = begin; task < end; ++task) {
        const size_t x = size_t(std::upper_bound(offsets.begin(), offsets.end(), task) - offsets.begin()) - 1;
        const Unit& u = pass[x];
        const Call& c = u.sq->c;
        const AttnParams& p = c.p;
        if (ws_for != &c) {
          ws = std::make_unique<Workspace>(c);
          ws_for = &c;
        }
        const int64_t local = task - offsets[x], per_kv = p.Hq / p.Hkv, n_tiles = int64_t(u.sq->tiles.size());
        const int64_t heads = u.count * per_kv, head0 = u.first * per_kv;
        if (local < heads * n_tiles) {
          const int64_t bh = head0 + local / n_tiles;
          body_tile(c, bh / p.Hq, bh % p.Hq, u.sq->tiles[local % n_tiles], *ws);
        } else {
          const int64_t bh = head0 + local - heads * n_tiles;
          control_rows(c, bh / p.Hq, bh % p.Hq, *ws);
        }
      }
    });
    for (const Unit& u : pass)
      if (u.last && !u.sq->prepared) {
        u.sq->c.buffers.clear();
        u.sq->buffer_heads = 0;
      }
  }
}

// A packed call (csrc/varlen.h): each sequence checked as the call attn(q_s, k_s, v_s, control_tokens = C_s)
// would be, then all of them run together (run_sequences).
std::tuple<at::Tensor, at::Tensor> attn_cpu_packed(RSWA_ATTN_PARAMS, std::optional<at::TensorList> prepared
                                                       RSWA_VARLEN_ATTN_PARAMS) {
  TORCH_CHECK_VALUE(!retrieved.has_value(), "retrieved cannot be combined with cu_seqlens: each sequence retrieves "
                    "over its own length; leave retrieved=None");
  const Packed pk = check_packed(&q, k, cu_seqlens_q, cu_seqlens_k, control_counts, control_tokens);
  check_bhnd(v, "v");
  TORCH_CHECK_VALUE(v.sizes() == k.sizes(), "v must have the shape of k ", k.sizes(), ", got ", v.sizes());
  TORCH_CHECK_VALUE(q.scalar_type() == k.scalar_type() && k.scalar_type() == v.scalar_type(),
                    "q, k and v must have the same dtype, got ", q.scalar_type(), ", ", k.scalar_type(), " and ",
                    v.scalar_type());
  TORCH_CHECK_VALUE(q.size(3) == k.size(3), "q and k must have the same head dim, got ", q.size(3), " and ", k.size(3));
  // Each sequence's checks, exactly as its own call makes them (the lambda's q, k, v, control_tokens are its own).
  auto check_one = [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t control_tokens) {
    return check_attn(RSWA_ATTN_ARGS);
  };
  std::vector<Sequence> seqs;
  std::vector<int64_t> index;
  for (int64_t s = 0; s < pk.S; ++s) {
    if (pk.nq[s] == 0) continue;  // no query rows: nothing to compute
    seqs.emplace_back();
    index.push_back(s);
    for_sequence(s, [&] {
      seqs.back().c.p = check_one(q.narrow(2, pk.q0[s], pk.nq[s]), k.narrow(2, pk.k0[s], pk.nk[s]),
                                  v.narrow(2, pk.k0[s], pk.nk[s]), pk.C[s]);
      return 0;
    });
  }
  if (prepared.has_value() && !seqs.empty()) {  // the sequences' checks passed: G and Rb are valid
    const std::vector<SequenceRows> rows = sequence_rows(pk, summary_block, retrieval_block);
    for (size_t x = 0; x < seqs.size(); ++x) {
      const int64_t s = index[x];
      for_sequence(s, [&] {
        seqs[x].context = sequence_context(*prepared, pk, rows, s, k.size(2), summary_block, retrieval_block);
        check_prepared(seqs[x].context, seqs[x].c.p, k.narrow(2, pk.k0[s], pk.nk[s]), at::kFloat,
                       /*prefix_sums=*/false, q.size(3));
        return 0;
      });
    }
  }
  at::Tensor qf = with_contiguous_rows(q.to(at::kFloat)), kf = with_contiguous_rows(k.to(at::kFloat)),
             vf = with_contiguous_rows(v.to(at::kFloat));
  const int64_t total_q = q.size(2), D = q.size(3);
  at::Tensor out = at::empty({1, q.size(1), total_q, D}, qf.options());
  at::Tensor lse = at::empty({1, q.size(1), total_q}, qf.options());
  for (size_t x = 0; x < seqs.size(); ++x) {
    const int64_t s = index[x];
    std::optional<at::TensorList> ctx;
    if (prepared.has_value()) ctx = at::TensorList(seqs[x].context);
    setup_sequence(seqs[x], qf.narrow(2, pk.q0[s], pk.nq[s]), kf.narrow(2, pk.k0[s], pk.nk[s]),
                   vf.narrow(2, pk.k0[s], pk.nk[s]), out.data_ptr<float>() + pk.q0[s] * D,
                   lse.data_ptr<float>() + pk.q0[s], total_q, std::nullopt, ctx);
  }
  run_sequences(seqs);
  return {out.to(q.scalar_type()), lse};
}

std::tuple<at::Tensor, at::Tensor> attn_cpu(RSWA_ATTN_PARAMS, std::optional<at::TensorList> prepared
                                                RSWA_VARLEN_ATTN_PARAMS) {
  if (is_packed(cu_seqlens_q, cu_seqlens_k, control_counts))
    return attn_cpu_packed(RSWA_ATTN_ARGS, prepared RSWA_VARLEN_ATTN_ARGS);
  std::vector<Sequence> seqs(1);
  Sequence& sq = seqs[0];
  sq.c.p = check_attn(RSWA_ATTN_ARGS);
  const AttnParams& p = sq.c.p;
  if (prepared.has_value()) check_prepared(*prepared, p, k, at::kFloat, /*prefix_sums=*/false, p.D);
  // fp32 inputs are read in place through their strides (views of a fused qkv projection included).
  at::Tensor qf = with_contiguous_rows(q.to(at::kFloat)), kf = with_contiguous_rows(k.to(at::kFloat)),
             vf = with_contiguous_rows(v.to(at::kFloat));
  at::Tensor out = at::empty({p.B, p.Hq, p.Nq, p.D}, qf.options());
  at::Tensor lse = at::empty({p.B, p.Hq, p.Nq}, qf.options());
  if (p.Nq == 0 || p.B == 0 || p.Hq == 0) return {out.to(q.scalar_type()), lse};
  setup_sequence(sq, qf, kf, vf, out.data_ptr<float>(), lse.data_ptr<float>(), p.Nq, retrieved, prepared);
  run_sequences(seqs);
  return {out.to(q.scalar_type()), lse};
}

// The prepared context of k and v (csrc/prepared.h): what attn_cpu's passes compute, for every KV head,
// rows from first_key on. Prefix sums are CUDA's (the CPU kernel sums straddling blocks from the keys).
std::vector<at::Tensor> prepare_one(RSWA_PREPARE_PARAMS) {
  const ContextParams cp = check_prepare(RSWA_PREPARE_ARGS);
  const Rules& R = cp.rules;
  Call c{};
  c.p.rules = R;
  c.p.rope = cp.rope;
  c.p.B = cp.B;
  c.p.Hkv = cp.Hkv;
  c.p.N = cp.N;
  c.p.C = cp.C;
  c.p.L = cp.L;
  c.p.D = cp.D;
  c.p.control_position_scale = cp.position_scale;
  at::Tensor kf = with_contiguous_rows(k.to(at::kFloat)), vf = with_contiguous_rows(v.to(at::kFloat));
  c.k = kf.data_ptr<float>();
  c.v = vf.data_ptr<float>();
  c.ks = row_strides(kf);
  c.vs = row_strides(vf);
  const int64_t L = cp.L, D = cp.D, nG = R.num_summary_blocks(), G = R.G;
  const int64_t first_block = first_key / G;
  const auto opts = kf.options();
  std::vector<at::Tensor> out;  // a fresh (empty) tensor per slot: outputs never alias each other
  for (int slot = 0; slot < kPreparedSlots; ++slot) out.push_back(at::empty({0}, opts));
  auto array = [&](int slot, bool needed, int64_t rows, int64_t row0) {
    if (!needed) return HeadRows{};
    out[slot] = at::empty({cp.B, cp.Hkv, rows - row0, D}, opts);
    return HeadRows::of(out[slot], row0);
  };
  c.k_native = array(kKeysNat, L > 0, L, first_key);
  c.k_grouped = array(kKeysGrp, cp.keys_grp && L > 0, L, first_key);
  c.k_cond = array(kKeysCond, cp.keys_cond && L > 0, L, first_key);
  c.sk_native = array(kSumKeys, cp.summaries && L > 0, nG, first_block);
  c.sv = array(kSumValues, cp.summaries && L > 0, nG, first_block);
  c.sk_grouped = array(kSumKeysGrp, cp.sums_grp && L > 0, nG, first_block);
  if (L > 0) {
    rope_tables(c);
    prepare_keys(c, 0, cp.B * cp.Hkv, first_key);
  }
  if (cp.means && L > 0) out[kKeyMeans] = key_means_float(kf, cp.C, R, first_key / R.Rb);
  const std::vector<double> sig = context_signature(R, cp.rope, cp.B, cp.Hkv, cp.C, cp.D);
  out[kSignature] = at::tensor(at::ArrayRef<double>(sig), at::TensorOptions().dtype(at::kDouble));
  return out;
}

// prepare, packed (csrc/varlen.h: each sequence's context, its rows packed) or not.
std::vector<at::Tensor> prepare_cpu(RSWA_PREPARE_PARAMS RSWA_VARLEN_PREPARE_PARAMS) {
  return prepare_packed_or_one(RSWA_PREPARE_ARGS RSWA_VARLEN_PREPARE_ARGS, /*prefix=*/false,
                               [](RSWA_PREPARE_PARAMS) { return prepare_one(RSWA_PREPARE_ARGS); });
}

}  // namespace

TORCH_LIBRARY_IMPL(rangeswa, CPU, m) {
  m.impl("attn", &attn_cpu);
  m.impl("prepare", &prepare_cpu);
}

}  // namespace rangeswa::cpu
