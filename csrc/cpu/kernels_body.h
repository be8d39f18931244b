// The CPU kernels' hot loops, written once and compiled once per instruction set, as ATen compiles its
// kernels once per CPU capability: kernels_avx512.cpp and kernels_avx2.cpp define RANGESWA_VEC_AVX512 /
// RANGESWA_VEC_AVX2 and include this file, which compiles everything below under that target (a
// pragma, so the build flags stay the baseline's); kernels_default.cpp includes it bare. Each build
// lives in its own namespace (avx512, avx2, generic) and defines its KernelTable there
// (cpu/dispatch.h). The plain loops are left to the compiler's vectoriser; the GEMMs use Vec. Torch-free.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "cpu/dispatch.h"

#if defined(RANGESWA_VEC_AVX512) || defined(RANGESWA_VEC_AVX2)
#include <immintrin.h>
#endif

#if defined(RANGESWA_VEC_AVX512)
#define RANGESWA_ISA avx512
#define RANGESWA_ISA_CAPABILITY Capability::kAvx512
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")
#endif
#elif defined(RANGESWA_VEC_AVX2)
#define RANGESWA_ISA avx2
#define RANGESWA_ISA_CAPABILITY Capability::kAvx2
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif
#else
#define RANGESWA_ISA generic
#define RANGESWA_ISA_CAPABILITY Capability::kDefault
#endif

#include "cpu/vec.h"

namespace rangeswa::cpu::RANGESWA_ISA {
namespace {

constexpr int64_t kLanes = Vec::kLanes;
constexpr int64_t kPanel = kMicroVecs * kLanes;  // columns of C per micro tile, at most

// C[r, 0:cols] = A[r, 0:k] . B[0:k, 0:cols] + beta * C[r, 0:cols] for r < R, cols <= V * kLanes; beta = 0
// ignores C. B's rows hold V full vectors when Padded, only their first cols floats otherwise.
template <int64_t R, int64_t V, bool Padded>
void micro_tile(int64_t k, const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc,
                int64_t cols, float beta) {
  Vec acc[R][V];
  for (int64_t r = 0; r < R; ++r)
    for (int64_t v = 0; v < V; ++v)
      acc[r][v] = beta == 0.f ? Vec::zero() : Vec::splat(beta) * Vec::load(C + r * ldc + v * kLanes, cols - v * kLanes);
  for (int64_t p = 0; p < k; ++p) {
    Vec b[V];
    for (int64_t v = 0; v < V; ++v)
      b[v] = Padded ? Vec::load(B + p * ldb + v * kLanes) : Vec::load(B + p * ldb + v * kLanes, cols - v * kLanes);
    for (int64_t r = 0; r < R; ++r) {
      const Vec a = Vec::splat(A[r * lda + p]);
      for (int64_t v = 0; v < V; ++v) acc[r][v] = fma(a, b[v], acc[r][v]);
    }
  }
  for (int64_t r = 0; r < R; ++r)
    for (int64_t v = 0; v < V; ++v) acc[r][v].store(C + r * ldc + v * kLanes, cols - v * kLanes);
}

// micro_tile for rows <= R and cols <= V * kLanes, with as few rows and vectors as they need.
template <int64_t R, int64_t V, bool Padded>
void tile(int64_t rows, int64_t cols, int64_t k, const float* A, int64_t lda, const float* B, int64_t ldb, float* C,
          int64_t ldc, float beta) {
  if constexpr (R > 1) {
    if (rows < R) return tile<R - 1, V, Padded>(rows, cols, k, A, lda, B, ldb, C, ldc, beta);
  }
  if constexpr (V > 1) {
    if (cols <= (V - 1) * kLanes) return tile<R, V - 1, Padded>(rows, cols, k, A, lda, B, ldb, C, ldc, beta);
  }
  micro_tile<R, V, Padded>(k, A, lda, B, ldb, C, ldc, cols, beta);
}

void gemm_nn(int64_t m, int64_t n, int64_t k, const float* A, int64_t lda, const float* B, int64_t ldb, float* C,
             int64_t ldc, float beta) {
  for (int64_t j0 = 0; j0 < n; j0 += kPanel) {
    const int64_t cols = std::min(kPanel, n - j0);
    for (int64_t i0 = 0; i0 < m; i0 += kMicroRows) {
      const int64_t rows = std::min(kMicroRows, m - i0);
      const float* a = A + i0 * lda;
      float* c = C + i0 * ldc + j0;
      if (cols % kLanes == 0) tile<kMicroRows, kMicroVecs, true>(rows, cols, k, a, lda, B + j0, ldb, c, ldc, beta);
      else tile<kMicroRows, kMicroVecs, false>(rows, cols, k, a, lda, B + j0, ldb, c, ldc, beta);
    }
  }
}

// panel[p * kPanel + j] = B[j * ldb + p] for j < cols, p < k, zero for cols <= j < cols rounded up to
// whole vectors; rows k .. k rounded up to kLanes are scratch.
void pack_transposed(const float* B, int64_t ldb, int64_t cols, int64_t k, float* panel) {
  for (int64_t j0 = 0; j0 < cols; j0 += kLanes)
    for (int64_t p0 = 0; p0 < k; p0 += kLanes) {
      const int64_t rows = std::min(kLanes, cols - j0), depth = std::min(kLanes, k - p0);
      if (rows == kLanes && depth == kLanes) {
        transpose_block(B + j0 * ldb + p0, ldb, panel + p0 * kPanel + j0, kPanel);
        continue;
      }
      float edge[kLanes * kLanes] = {};
      for (int64_t r = 0; r < rows; ++r) std::copy_n(B + (j0 + r) * ldb + p0, depth, edge + r * kLanes);
      transpose_block(edge, kLanes, panel + p0 * kPanel + j0, kPanel);
    }
}

// C[i, j] = A[i] . B[j] for the m <= kDotRows rows of a decode call's query: each row of B is read once
// and dotted with them; packing B for so few rows of A would cost more than the product itself.
constexpr int64_t kDotRows = 2;

void dot_rows(int64_t m, int64_t n, int64_t k, const float* A, int64_t lda, const float* B, int64_t ldb, float* C,
              int64_t ldc) {
  for (int64_t j = 0; j < n; ++j) {
    const float* b = B + j * ldb;
    for (int64_t i = 0; i < m; ++i) {
      const float* a = A + i * lda;
      Vec acc = Vec::zero();
      for (int64_t p = 0; p < k; p += kLanes) acc = fma(Vec::load(a + p, k - p), Vec::load(b + p, k - p), acc);
      C[i * ldc + j] = acc.sum();
    }
  }
}

void gemm_nt(int64_t m, int64_t n, int64_t k, const float* A, int64_t lda, const float* B, int64_t ldb, float* C,
             int64_t ldc) {
  if (m <= kDotRows) return dot_rows(m, n, k, A, lda, B, ldb, C, ldc);
  thread_local std::vector<float> panel;  // up to kPanel rows of B, transposed
  const int64_t depth = (k + kLanes - 1) / kLanes * kLanes;
  if (panel.size() < size_t(depth * kPanel)) panel.resize(depth * kPanel);
  for (int64_t j0 = 0; j0 < n; j0 += kPanel) {
    const int64_t cols = std::min(kPanel, n - j0);
    pack_transposed(B + j0 * ldb, ldb, cols, k, panel.data());
    for (int64_t i0 = 0; i0 < m; i0 += kMicroRows)
      tile<kMicroRows, kMicroVecs, true>(std::min(kMicroRows, m - i0), cols, k, A + i0 * lda, lda, panel.data(), kPanel,
                                         C + i0 * ldc + j0, ldc, 0.f);
  }
}

float row_max(const float* x, int64_t n) {
  float mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
  for (int64_t i = 0; i < n; ++i) mx = x[i] > mx ? x[i] : mx;
  return mx;
}

// exp by range reduction x = n ln2 + r, |r| <= ln2/2, and a degree-6 polynomial for e^r (the Cephes
// expf coefficients); branch-free so that the compiler vectorises it.
float exp_shifted(float* x, int64_t n, float shift) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i] - shift;
    float c = v > 88.0f ? 88.0f : v;
    c = c < -87.0f ? -87.0f : c;  // -inf and underflow clamp here, and are zeroed below
    const float fn = (c * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to nearest
    const float r = c - fn * 0.693359375f + fn * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const int32_t bits = (static_cast<int32_t>(fn) + 127) << 23;  // 2^fn as float bits (C++17: no bit_cast)
    float scale;
    std::memcpy(&scale, &bits, sizeof scale);
    x[i] = v < -87.0f ? 0.0f : p * scale;
    sum += x[i];
  }
  return sum;
}

void rotate_row(const float* x, float* out, const float* cos, const float* sin, int64_t D, int64_t rotary_dim,
                bool interleaved, float mul) {
  const int64_t half = rotary_dim / 2;
  if (interleaved) {
#pragma omp simd
    for (int64_t k = 0; k < half; ++k) {
      const float a = x[2 * k], b = x[2 * k + 1];
      out[2 * k] = mul * (a * cos[k] - b * sin[k]);
      out[2 * k + 1] = mul * (a * sin[k] + b * cos[k]);
    }
  } else {
#pragma omp simd
    for (int64_t k = 0; k < half; ++k) {
      const float a = x[k], b = x[k + half];
      out[k] = mul * (a * cos[k] - b * sin[k]);
      out[k + half] = mul * (a * sin[k] + b * cos[k]);
    }
  }
  for (int64_t c = rotary_dim; c < D; ++c) out[c] = mul * x[c];
}

void block_means(const float* x, int64_t ldx, int64_t L, int64_t G, int64_t D, float* out) {
  std::vector<double> acc(D);
  for (int64_t start = 0, b = 0; start < L; start += G, ++b) {
    const int64_t end = std::min(L, start + G);
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t t = start; t < end; ++t)
#pragma omp simd
      for (int64_t c = 0; c < D; ++c) acc[c] += x[t * ldx + c];
    for (int64_t c = 0; c < D; ++c) out[b * D + c] = float(acc[c] / double(end - start));
  }
}

}  // namespace

extern const KernelTable kTable = {RANGESWA_ISA_CAPABILITY, gemm_nt, gemm_nn, row_max, exp_shifted, rotate_row, block_means};

}  // namespace rangeswa::cpu::RANGESWA_ISA

#if defined(RANGESWA_VEC_AVX512) || defined(RANGESWA_VEC_AVX2)
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif
