// The rules of SPEC sections 2-3 as small inline functions, shared by every kernel (CPU and CUDA)
// and unit-tested on their own (tests/cpp/test_rules.cpp). Nothing here touches tensors.
//
// Indices: i is a body query row, j a body key, both in [0, L). G-blocks ("summary blocks") hold
// keys [b*G, min(L, b*G + G)); retrieval key blocks hold [kb*Rb, min(L, kb*Rb + Rb)); query blocks
// hold rows [qb*Qb, min(L, qb*Qb + Qb)).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define RSWA_HD __host__ __device__ __forceinline__
#else
#define RSWA_HD inline
#endif

// A loop the compiler keeps rolled (cold setup code: the kernel's instruction footprint stays small).
#if defined(__CUDACC__)
#define RSWA_ROLLED _Pragma("unroll 1")
#else
#define RSWA_ROLLED
#endif

namespace rangeswa {

// The attention methods the op implements (SPEC section 4). rangeswa_lite is rangeswa with
// far_summaries off, topk 0 and near_range 1024: a configuration, not a method of its own.
enum class Method : int32_t { kFull = 0, kSwa = 1, kSelfExtend = 2, kRangeSwa = 3 };

// What row i does with a key (or with a whole G-block).
enum class Role : uint8_t { kHidden = 0, kExact = 1, kSummary = 2 };

// Which rotation pair a (query, key) pair uses (SPEC section 3), so that q and k can be rotated
// separately: native (q at i, k at j), grouped with the key on the left (q at i/g + c, k at j/g)
// or grouped with the key on the right (q at i/g - c, k at j/g), where c = Hn - Hn/g.
enum class PosClass : uint8_t { kNative = 0, kGroupedLeft = 1, kGroupedRight = 2 };

// Position class of a whole G-block for row i. The first three equal PosClass; kMixed: the block
// straddles distance Hn, so its summary logit is the mean of exact logits under each token's own class
// (docs/spec_decisions.md item 9).
enum class BlockClass : uint8_t { kNative = 0, kLeft = 1, kRight = 2, kMixed = 3 };

RSWA_HD int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
// a // b rounded toward -infinity like Python's (C++ truncates toward 0); b > 0.
RSWA_HD int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
RSWA_HD int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
RSWA_HD int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
RSWA_HD int32_t imin(int32_t a, int32_t b) { return a < b ? a : b; }
RSWA_HD int32_t imax(int32_t a, int32_t b) { return a > b ? a : b; }

// Section 3: the Self-Extend group size, the smallest g >= 1 with (L-1)/g + Hn - Hn/g <= T-1.
// Returns 0 when no g exists (Hn >= T): then every body pair keeps its native position.
RSWA_HD int64_t group_size(int64_t L, int64_t T, int64_t Hn) {
  if (Hn >= T) return 0;
  // Not monotone in g because of the floors, so scan; g = L + Hn + 1 always satisfies it
  // ((L-1)/g = 0 and Hn/g = 0 leave Hn <= T-1), and the scan stops near L / (T - Hn).
  int64_t g = 1;
  while ((L - 1) / g + Hn - Hn / g > T - 1) ++g;
  return g;
}

// All the per-call numbers the rules depend on.
struct Rules {
  Method method;
  int64_t L;              // body tokens
  int64_t window;         // W
  int64_t radius;         // r = W // 2 (rangeswa) or (W - S) // 2 (swa; floor, so W - S = -1 gives -1)
  int64_t G;              // summary_block
  int64_t Hn;             // near_range
  int64_t topk;           // K
  int64_t Rb;             // retrieval_block
  int64_t Qb;             // query_block
  int64_t T;              // train_length
  int64_t sinks;          // S (swa only)
  bool far_summaries;
  bool summaries;         // rule 4 at all (off: the paper's ablation without summaries)
  int64_t cb;             // section 7's causal block, 0 = bidirectional
  bool cond_correction;   // section 3's conditioning correction is applied when extrapolating
  bool extrapolating;     // L > T and the method corrects positions (self_extend, rangeswa)
  int64_t g;              // group size, 0 = none (no grouped positions)
  int64_t group_offset;   // c = Hn - Hn / g

  RSWA_HD int64_t num_summary_blocks() const { return ceil_div(L, G); }
  RSWA_HD int64_t num_key_blocks() const { return ceil_div(L, Rb); }
  RSWA_HD int64_t num_query_blocks() const { return ceil_div(L, Qb); }
  RSWA_HD int64_t block_start(int64_t b) const { return b * G; }
  RSWA_HD int64_t block_end(int64_t b) const { return min64(L, b * G + G); }  // exclusive
  RSWA_HD int64_t block_size(int64_t b) const { return block_end(b) - block_start(b); }

  // Section 3: grouped coordinates apply only when extrapolating, a group size exists and the pair
  // is farther apart than Hn.
  RSWA_HD bool grouping() const { return extrapolating && g > 0; }
  RSWA_HD PosClass pos_class(int64_t i, int64_t j) const {
    int64_t dist = i > j ? i - j : j - i;
    if (!grouping() || dist <= Hn) return PosClass::kNative;
    return j < i ? PosClass::kGroupedLeft : PosClass::kGroupedRight;
  }

  // Section 2 rule 2: the G-blocks of row i's local window, [first, last] inclusive.
  RSWA_HD int64_t window_first_block(int64_t i) const { return max64(0, i - radius) / G; }
  RSWA_HD int64_t window_last_block(int64_t i) const { return min64(L - 1, i + radius) / G; }
  RSWA_HD bool in_window(int64_t i, int64_t b) const {
    return b >= window_first_block(i) && b <= window_last_block(i);
  }

  // Section 2 rule 3: the union of the windows of query block qb, as a token range [lo, hi).
  RSWA_HD int64_t union_lo(int64_t qb) const { return window_first_block(qb * Qb) * G; }
  RSWA_HD int64_t union_hi(int64_t qb) const {
    return min64(L, (window_last_block(min64(L, qb * Qb + Qb) - 1) + 1) * G);
  }
  // Section 7 adds: under a causal block every key of kb must be visible to every row of qb.
  RSWA_HD bool is_candidate(int64_t qb, int64_t kb) const {
    int64_t s = kb * Rb, e = min64(L, s + Rb);
    return (e <= union_lo(qb) || s >= union_hi(qb)) && (cb == 0 || e <= visible_end(qb * Qb));
  }

  // Section 7: row i sees body keys [0, visible_end(i)) (all L without a causal block); every rule
  // above decides first, then the pairs past visible_end are dropped.
  RSWA_HD int64_t visible_end(int64_t i) const { return cb == 0 ? L : min64(L, (i / cb + 1) * cb); }
  RSWA_HD bool visible(int64_t i, int64_t j) const { return j < visible_end(i); }

  // Section 2 rule 4: block b is near row i when every one of its tokens is within Hn of i.
  RSWA_HD bool is_near(int64_t i, int64_t b) const {
    return block_start(b) >= i - Hn && block_end(b) - 1 <= i + Hn;
  }
  // The same as a range: the near blocks of row i are [near_first(i), near_last(i)] (maybe empty).
  // Blocks [0, far_left_end(i)) lie wholly farther than Hn left of row i and [far_right_begin(i), nG)
  // wholly farther right; only the blocks between can be near, or straddle distance Hn.
  RSWA_HD int64_t near_first(int64_t i) const { return i - Hn <= 0 ? 0 : ceil_div(i - Hn, G); }
  RSWA_HD int64_t near_last(int64_t i) const {
    return i + Hn >= L - 1 ? num_summary_blocks() - 1 : (i + Hn + 1) / G - 1;
  }
  RSWA_HD int64_t far_left_end(int64_t i) const { return i - Hn > 0 ? (i - Hn) / G : 0; }
  RSWA_HD int64_t far_right_begin(int64_t i) const { return min64(num_summary_blocks(), (i + Hn) / G + 1); }

  // Sections 2-3: the position class of G-block b for row i (pos_class of all its tokens, or kMixed).
  RSWA_HD BlockClass block_class(int64_t i, int64_t b) const {
    if (!grouping() || is_near(i, b)) return BlockClass::kNative;
    if (block_end(b) - 1 < i - Hn) return BlockClass::kLeft;
    if (block_start(b) > i + Hn) return BlockClass::kRight;
    return BlockClass::kMixed;
  }

  // Section 2 rule 5 and the swa baseline (section 4): token-exact window plus sinks.
  RSWA_HD bool swa_sees(int64_t i, int64_t j) const {
    int64_t dist = i > j ? i - j : j - i;
    return dist <= radius || j < sinks;
  }

  // Sections 2 and 4: what body row i does with G-block b (rangeswa), given whether b lies in a
  // block retrieved for i's query block.
  RSWA_HD Role block_role(int64_t i, int64_t b, bool retrieved) const {
    if (in_window(i, b) || retrieved) return Role::kExact;
    if (summaries && (far_summaries || is_near(i, b))) return Role::kSummary;
    return Role::kHidden;
  }

  // What body row i does with body key j for the token-level methods.
  RSWA_HD Role token_role(int64_t i, int64_t j) const {
    if (method == Method::kSwa) return swa_sees(i, j) ? Role::kExact : Role::kHidden;
    return Role::kExact;  // full, self_extend
  }
};

// Section 3's conditioning correction with C control tokens: body rows score the control keys with
// queries rotated to i*T/L, and control rows score body keys rotated to j*T/L (logits - log(L/T)).
// Both need those extra rotations exactly when the call extrapolates and has control tokens.
// The correction can be switched off (the paper's ablation without it), positions staying corrected.
RSWA_HD bool conditioned(const Rules& R, int64_t C) { return R.extrapolating && R.cond_correction && C > 0; }

// Builds the rules for one call; radius and the extrapolation switch depend on the method.
RSWA_HD Rules make_rules(Method method, int64_t L, int64_t window, int64_t G, int64_t Hn, int64_t topk,
                         int64_t Rb, int64_t Qb, int64_t T, int64_t sinks, bool far_summaries,
                         int64_t causal_block = 0, bool cond_correction = true, bool summaries = true) {
  Rules r{};
  r.method = method;
  r.L = L;
  r.window = window;
  r.radius = method == Method::kSwa ? floor_div(window - sinks, 2) : window / 2;
  r.G = G;
  r.Hn = Hn;
  r.topk = method == Method::kRangeSwa ? topk : 0;
  r.Rb = Rb;
  r.Qb = Qb;
  r.T = T;
  r.sinks = method == Method::kSwa ? sinks : 0;
  r.far_summaries = far_summaries;
  r.summaries = summaries;
  r.cb = causal_block;
  r.cond_correction = cond_correction;
  r.extrapolating = L > T && (method == Method::kSelfExtend || method == Method::kRangeSwa);
  r.g = r.extrapolating ? group_size(L, T, Hn) : 0;
  r.group_offset = r.g > 0 ? Hn - Hn / r.g : 0;
  return r;
}

}  // namespace rangeswa
