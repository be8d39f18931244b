// Unit tests of the dispatched CPU kernels (csrc/cpu/kernels_body.h), every build this CPU runs
// (default, AVX2, AVX-512) in one process: each against a double-precision formula on ragged shapes
// (row and column tails of the micro tiles, strided rows), without writes outside the output, and the
// builds against each other. Prints the builds it ran.
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "cpu/dispatch.h"

using namespace rangeswa::cpu;

static int failures = 0;
#define EXPECT(cond, ...)                                                        \
  do {                                                                           \
    if (!(cond)) {                                                               \
      std::fprintf(stderr, "%s:%d: expected %s: ", __FILE__, __LINE__, #cond);   \
      std::fprintf(stderr, __VA_ARGS__);                                         \
      std::fprintf(stderr, "\n");                                                \
      ++failures;                                                                \
    }                                                                            \
  } while (0)

static std::mt19937 rng(20261130);
static const float kNaN = std::numeric_limits<float>::quiet_NaN();
static const float kInf = std::numeric_limits<float>::infinity();

static std::vector<float> random_floats(size_t n) {
  std::normal_distribution<float> normal;
  std::vector<float> x(n);
  for (float& e : x) e = normal(rng);
  return x;
}

// C (ldc > n, NaN around the m x n result) against sum_p A[i, p] B(p, j) in double, within 1e-5 of the
// sum of |terms|; entries outside the result must still be NaN.
template <class BAt>
static void check_product(const char* what, const KernelTable& t, int64_t m, int64_t n, int64_t k,
                          const std::vector<float>& A, int64_t lda, BAt b_at, const std::vector<float>& C, int64_t ldc,
                          const std::vector<float>& C0, float beta) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < ldc; ++j) {
      const float got = C[i * ldc + j];
      if (j >= n) {
        EXPECT(std::isnan(got), "%s %s wrote outside the result at (%ld, %ld) of %ldx%ld", what,
               capability_name(t.capability), long(i), long(j), long(m), long(n));
        continue;
      }
      double want = beta == 0.f ? 0.0 : double(beta) * C0[i * ldc + j], scale = std::fabs(want);
      for (int64_t p = 0; p < k; ++p) {
        want += double(A[i * lda + p]) * b_at(p, j);
        scale += std::fabs(double(A[i * lda + p]) * b_at(p, j));
      }
      EXPECT(std::fabs(got - want) <= 1e-5 * scale + 1e-30, "%s %s m=%ld n=%ld k=%ld (%ld, %ld): %g vs %g", what,
             capability_name(t.capability), long(m), long(n), long(k), long(i), long(j), double(got), want);
    }
}

static void test_gemm_nt(const KernelTable& t) {
  for (int64_t m : {1, 2, 3, 5, 6, 7, 13, 64})  // 1 and 2: the decode rows dotted without packing
    for (int64_t n : {1, 7, 8, 16, 17, 63, 64, 65, 130})
      for (int64_t k : {2, 6, 16, 40, 64, 72, 96}) {
        const int64_t lda = k + 3, ldb = k + 5, ldc = n + 4;
        std::vector<float> A = random_floats(m * lda), B = random_floats(n * ldb), C(m * ldc, kNaN);
        t.gemm_nt(m, n, k, A.data(), lda, B.data(), ldb, C.data(), ldc);
        check_product("gemm_nt", t, m, n, k, A, lda, [&](int64_t p, int64_t j) { return double(B[j * ldb + p]); }, C,
                      ldc, C, 0.f);
      }
}

static void test_gemm_nn(const KernelTable& t) {
  for (int64_t m : {1, 4, 6, 7, 13, 64})
    for (int64_t n : {2, 6, 8, 16, 24, 40, 64, 72, 96, 128})
      for (int64_t k : {1, 3, 17, 64, 130})
        for (float beta : {0.f, 1.f, 0.5f}) {
          const int64_t lda = k + 3, ldb = n + 5, ldc = n + 4;
          std::vector<float> A = random_floats(m * lda), B = random_floats(k * ldb), C = random_floats(m * ldc);
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = n; j < ldc; ++j) C[i * ldc + j] = kNaN;
          if (beta == 0.f)  // not read
            for (int64_t i = 0; i < m; ++i)
              for (int64_t j = 0; j < n; ++j) C[i * ldc + j] = kNaN;
          const std::vector<float> C0 = C;
          t.gemm_nn(m, n, k, A.data(), lda, B.data(), ldb, C.data(), ldc, beta);
          check_product("gemm_nn", t, m, n, k, A, lda, [&](int64_t p, int64_t j) { return double(B[p * ldb + j]); }, C,
                        ldc, C0, beta);
        }
}

static void test_softmax_pieces(const KernelTable& t) {
  EXPECT(t.row_max(nullptr, 0) == -kInf, "%s: max of nothing", capability_name(t.capability));
  for (int64_t n : {1, 3, 15, 16, 17, 100, 512}) {
    std::vector<float> x = random_floats(n);
    for (int64_t i = 0; i < n; i += 3) x[i] = -kInf;  // hidden keys
    x[n / 2] = 3.5f;
    float want_max = -kInf;
    for (float e : x) want_max = std::max(want_max, e);
    EXPECT(t.row_max(x.data(), n) == want_max, "%s: max of %ld", capability_name(t.capability), long(n));
    x[n - 1] = -200.f;  // underflows to 0
    const float shift = 1.25f;
    std::vector<float> e = x;
    const float sum = t.exp_shifted(e.data(), n, shift);
    double want_sum = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      const double want = std::exp(double(x[i]) - shift);
      want_sum += want;
      EXPECT(std::fabs(e[i] - want) <= 4e-7 * want + 1e-38, "%s: exp(%g - %g) = %g", capability_name(t.capability),
             double(x[i]), double(shift), double(e[i]));
    }
    EXPECT(std::fabs(sum - want_sum) <= 1e-6 * want_sum + 1e-37, "%s: sum %g vs %g", capability_name(t.capability), double(sum),
           want_sum);
  }
}

static void test_rotate_and_means(const KernelTable& t) {
  const int64_t D = 40;
  for (int64_t rotary : {40, 24})
    for (bool interleaved : {true, false}) {
      const std::vector<float> x = random_floats(D), cos = random_floats(rotary / 2), sin = random_floats(rotary / 2);
      std::vector<float> out(D, kNaN);
      t.rotate_row(x.data(), out.data(), cos.data(), sin.data(), D, rotary, interleaved, 0.5f);
      for (int64_t c = 0; c < D; ++c) {
        double want = 0.5 * x[c];
        if (c < rotary) {
          const int64_t pair = interleaved ? c / 2 : c % (rotary / 2);
          const bool first = interleaved ? c % 2 == 0 : c < rotary / 2;
          const int64_t a = interleaved ? 2 * pair : pair, b = interleaved ? 2 * pair + 1 : pair + rotary / 2;
          want = first ? 0.5 * (double(x[a]) * cos[pair] - double(x[b]) * sin[pair])
                       : 0.5 * (double(x[a]) * sin[pair] + double(x[b]) * cos[pair]);
        }
        EXPECT(std::fabs(out[c] - want) <= 1e-6 * (std::fabs(x[c]) + 1), "%s: rotate_row dim %ld",
               capability_name(t.capability), long(c));
      }
    }
  const int64_t L = 37, G = 16, ld = D + 2;
  const std::vector<float> x = random_floats(L * ld);
  std::vector<float> out(3 * D, kNaN);
  t.block_means(x.data(), ld, L, G, D, out.data());
  for (int64_t b = 0; b < 3; ++b)
    for (int64_t c = 0; c < D; ++c) {
      double want = 0.0;
      const int64_t end = std::min(L, b * G + G);
      for (int64_t r = b * G; r < end; ++r) want += x[r * ld + c];
      want /= double(end - b * G);
      EXPECT(float(want) == out[b * D + c], "%s: block_means (%ld, %ld)", capability_name(t.capability), long(b),
             long(c));
    }
}

// Every build gives the same attention-shaped products within fp32 rounding of the default build's.
static void test_builds_agree(const std::vector<const KernelTable*>& tables) {
  const int64_t m = 64, n = 512, k = 64;
  const std::vector<float> A = random_floats(m * k), B = random_floats(n * k);
  std::vector<float> base(m * n);
  tables[0]->gemm_nt(m, n, k, A.data(), k, B.data(), k, base.data(), n);
  for (const KernelTable* t : tables) {
    std::vector<float> C(m * n);
    t->gemm_nt(m, n, k, A.data(), k, B.data(), k, C.data(), n);
    double worst = 0.0;
    for (int64_t i = 0; i < m * n; ++i) worst = std::max(worst, double(std::fabs(C[i] - base[i])));
    EXPECT(worst <= 1e-5 * 8.0 * 8.0, "%s vs %s: %g", capability_name(t->capability),
           capability_name(tables[0]->capability), worst);
  }
}

int main() {
  std::vector<const KernelTable*> tables;
  for (Capability c : {Capability::kDefault, Capability::kAvx2, Capability::kAvx512}) {
    if (!cpu_supports(c)) {
      std::printf("skipped %s: this CPU cannot run it\n", capability_name(c));
      continue;
    }
    const KernelTable& t = kernel_table(c);
    EXPECT(t.capability == c, "the %s table says %s", capability_name(c), capability_name(t.capability));
    test_gemm_nt(t);
    test_gemm_nn(t);
    test_softmax_pieces(t);
    test_rotate_and_means(t);
    tables.push_back(&t);
    std::printf("ran %s\n", capability_name(c));
  }
  test_builds_agree(tables);
  if (failures) std::fprintf(stderr, "%d failures\n", failures);
  return failures ? 1 : 0;
}
