// Unit tests of csrc/rules.h against the numbers SPEC (docs/spec.md) states and small hand-checked cases.
#include <cstdio>
#include <cstdlib>
#include <initializer_list>

#include "rules.h"

using namespace rangeswa;

static int failures = 0;
#define EXPECT(cond)                                                    \
  do {                                                                  \
    if (!(cond)) {                                                      \
      std::fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                       \
    }                                                                   \
  } while (0)

static Rules paper(int64_t L, int64_t window) {
  return make_rules(Method::kRangeSwa, L, window, 16, 512, 8, 64, 128, 1024, 0, true);
}

int main() {
  // Section 3: g = 4, 8, 16 at L = 2k, 4k, 8k; none when Hn >= T.
  EXPECT(group_size(2048, 1024, 512) == 4);
  EXPECT(group_size(4096, 1024, 512) == 8);
  EXPECT(group_size(8192, 1024, 512) == 16);
  EXPECT(group_size(5000, 1024, 1024) == 0);
  for (int64_t L = 1025; L < 20000; L += 997) {
    int64_t g = group_size(L, 1024, 512);
    EXPECT((L - 1) / g + 512 - 512 / g <= 1023);
    EXPECT(g == 1 || (L - 1) / (g - 1) + 512 - 512 / (g - 1) > 1023);
  }

  // Extrapolation switches on only past T and only for the correcting methods.
  EXPECT(!paper(1024, 256).extrapolating && paper(1025, 256).extrapolating);
  EXPECT(!make_rules(Method::kSwa, 4096, 256, 16, 512, 0, 64, 128, 1024, 4, true).extrapolating);
  EXPECT(make_rules(Method::kSelfExtend, 4096, 256, 16, 512, 0, 64, 128, 1024, 0, true).extrapolating);

  // Position classes: native within Hn, grouped beyond, by side.
  Rules r = paper(8192, 256);
  EXPECT(r.pos_class(1000, 488) == PosClass::kNative);
  EXPECT(r.pos_class(1000, 487) == PosClass::kGroupedLeft);
  EXPECT(r.pos_class(1000, 1513) == PosClass::kGroupedRight);
  EXPECT(paper(1000, 256).pos_class(999, 0) == PosClass::kNative);

  // Rule 2: block-aligned window, r = 128: row 200 sees [72, 328] -> blocks 4..20.
  EXPECT(r.window_first_block(200) == 4 && r.window_last_block(200) == 20);
  EXPECT(r.in_window(200, 4) && !r.in_window(200, 3) && !r.in_window(200, 21));
  EXPECT(r.window_first_block(5) == 0 && paper(100, 256).window_last_block(99) == 6);

  // Rule 3: query block 1 (rows 128..255) windows cover blocks 0..23 -> tokens [0, 384).
  EXPECT(r.union_lo(1) == 0 && r.union_hi(1) == 384);
  EXPECT(!r.is_candidate(1, 5) && r.is_candidate(1, 6));
  Rules ragged = paper(1000, 256);
  EXPECT(ragged.num_key_blocks() == 16 && ragged.num_query_blocks() == 8 && ragged.num_summary_blocks() == 63);
  EXPECT(ragged.block_size(62) == 8);

  // Rule 4: near when every token is within Hn.
  EXPECT(r.is_near(1000, 31) && !r.is_near(1000, 30));  // block 30 = [480, 495] has 487 < 488
  EXPECT(r.block_role(1000, 62, false) == Role::kExact);
  EXPECT(r.block_role(1000, 10, true) == Role::kExact);
  EXPECT(r.block_role(1000, 10, false) == Role::kSummary);
  Rules lite = make_rules(Method::kRangeSwa, 8192, 256, 16, 1024, 0, 64, 128, 1024, 0, false);
  EXPECT(lite.block_role(3000, 100, false) == Role::kHidden);
  EXPECT(lite.block_role(3000, 130, false) == Role::kSummary);
  EXPECT(!lite.grouping());

  // The near range equals the near predicate, ragged last block included.
  for (int64_t L : {1, 15, 16, 17, 100, 333}) {
    for (int64_t Hn : {0, 5, 16, 40, 400}) {
      Rules n = make_rules(Method::kRangeSwa, L, 32, 16, Hn, 0, 64, 128, 64, 0, false);
      for (int64_t i = 0; i < L; ++i)
        for (int64_t b = 0; b < n.num_summary_blocks(); ++b)
          EXPECT(n.is_near(i, b) == (b >= n.near_first(i) && b <= n.near_last(i)));
    }
  }

  // Far ranges: blocks left of far_left_end(i) / from far_right_begin(i) on hold no token within Hn of i,
  // and every block between holds at least one (so only those can be near or straddle Hn).
  for (int64_t L : {1, 15, 16, 17, 100, 333}) {
    for (int64_t Hn : {0, 5, 16, 40, 400}) {
      Rules n = make_rules(Method::kRangeSwa, L, 32, 16, Hn, 0, 64, 128, 64, 0, false);
      for (int64_t i = 0; i < L; ++i)
        for (int64_t b = 0; b < n.num_summary_blocks(); ++b) {
          bool any_within = false;
          for (int64_t j = n.block_start(b); j < n.block_end(b); ++j) any_within |= (j > i ? j - i : i - j) <= Hn;
          EXPECT(any_within == (b >= n.far_left_end(i) && b < n.far_right_begin(i)));
        }
    }
  }

  // Block classes: the pos_class of every token when they agree, kMixed when they do not.
  for (int64_t L : {1500, 2049, 3001}) {
    Rules g = make_rules(Method::kRangeSwa, L, 64, 16, 40, 4, 32, 64, 512, 0, true);
    EXPECT(g.grouping());
    for (int64_t i = 0; i < L; i += 37)
      for (int64_t b = 0; b < g.num_summary_blocks(); ++b) {
        const PosClass first = g.pos_class(i, g.block_start(b));
        bool same = true;
        for (int64_t j = g.block_start(b); j < g.block_end(b); ++j) same &= g.pos_class(i, j) == first;
        EXPECT(g.block_class(i, b) == (same ? BlockClass(first) : BlockClass::kMixed));
      }
  }
  EXPECT(paper(1024, 256).block_class(1000, 3) == BlockClass::kNative);  // no grouping within T

  // The conditioning correction's extra rotations: extrapolating with control tokens only.
  EXPECT(conditioned(paper(2048, 256), 12) && !conditioned(paper(2048, 256), 0));
  EXPECT(!conditioned(paper(1024, 256), 12));
  EXPECT(!conditioned(make_rules(Method::kSwa, 4096, 256, 16, 512, 0, 64, 128, 1024, 4, true), 12));

  // swa: |i - j| <= (W - S) / 2 plus sinks.
  Rules swa = make_rules(Method::kSwa, 4096, 256, 16, 512, 0, 64, 128, 1024, 4, true);
  EXPECT(swa.radius == 126);
  EXPECT(swa.swa_sees(1000, 874) && !swa.swa_sees(1000, 873) && swa.swa_sees(1000, 3));
  EXPECT(swa.token_role(1000, 4) == Role::kHidden);
  // The radius is SPEC's floor division (docs/spec_decisions.md item 19): W - S = -1 leaves the sinks only.
  EXPECT(floor_div(-1, 2) == -1 && floor_div(-4, 2) == -2 && floor_div(-5, 2) == -3 && floor_div(5, 2) == 2);
  Rules sinks_only = make_rules(Method::kSwa, 10, 1, 16, 512, 0, 64, 128, 1024, 2, true);
  EXPECT(sinks_only.radius == -1);
  EXPECT(!sinks_only.swa_sees(5, 5) && sinks_only.swa_sees(5, 1) && !sinks_only.swa_sees(5, 2));

  if (failures) {
    std::fprintf(stderr, "%d rule checks failed\n", failures);
    return EXIT_FAILURE;
  }
  std::printf("all rule checks passed\n");
  return EXIT_SUCCESS;
}
