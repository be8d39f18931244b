#include "cpu/kernels.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <algorithm>
#include <mutex>
#include <tuple>
#include <cstring>

// MKL / OpenBLAS ship in torch's CPU library; weak so that a torch without a Fortran BLAS symbol
// still loads, falling back to the plain loops below.
extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                       const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
                       const float* beta, float* c, const int* ldc) __attribute__((weak));

namespace rangeswa::cpu {

RopeTable::RopeTable(const RopeParams& rope, double first, double step, int64_t count) {
  std::vector<double> pos(count);
  for (int64_t s = 0; s < count; ++s) pos[s] = first + double(s) * step;
  fill(rope, pos.data(), count);
}

RopeTable::RopeTable(const RopeParams& rope, const double* positions, int64_t count) {
  fill(rope, positions, count);
}

void RopeTable::fill(const RopeParams& rope, const double* positions, int64_t count) {
  half_ = rope.rotary_dim / 2;
  cos_.resize(count * half_);
  sin_.resize(count * half_);
  std::vector<double> inv_freq(half_);
  for (int64_t k = 0; k < half_; ++k) inv_freq[k] = std::pow(rope.theta, -2.0 * double(k) / double(rope.rotary_dim));
  at::parallel_for(0, count, 1024, [&](int64_t begin, int64_t end) {
    for (int64_t s = begin; s < end; ++s) {
      for (int64_t k = 0; k < half_; ++k) {
        double angle = positions[s] * inv_freq[k];
        cos_[s * half_ + k] = float(std::cos(angle));
        sin_[s * half_ + k] = float(std::sin(angle));
      }
    }
  });
}

std::shared_ptr<const RopeTable> rope_table(const RopeParams& rope, double first, double step, int64_t count) {
  using Key = std::tuple<double, int64_t, double, double, int64_t>;
  static std::mutex mutex;
  static std::vector<std::pair<Key, std::shared_ptr<const RopeTable>>> recent;  // newest last
  constexpr size_t kKeep = 8;
  const Key key{rope.theta, rope.rotary_dim, first, step, count};
  {
    std::lock_guard<std::mutex> lock(mutex);
    for (const auto& entry : recent)
      if (entry.first == key) return entry.second;
  }
  auto table = std::make_shared<const RopeTable>(rope, first, step, count);
  std::lock_guard<std::mutex> lock(mutex);
  if (recent.size() == kKeep) recent.erase(recent.begin());
  recent.emplace_back(key, table);
  return table;
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void rotate_row(const float* x, float* out, const float* cos, const float* sin, int64_t D, const RopeParams& rope,
                float mul) {
  int64_t half = rope.rotary_dim / 2;
  if (rope.interleaved) {
#pragma omp simd
    for (int64_t k = 0; k < half; ++k) {
      float a = x[2 * k], b = x[2 * k + 1];
      out[2 * k] = mul * (a * cos[k] - b * sin[k]);
      out[2 * k + 1] = mul * (a * sin[k] + b * cos[k]);
    }
  } else {
#pragma omp simd
    for (int64_t k = 0; k < half; ++k) {
      float a = x[k], b = x[k + half];
      out[k] = mul * (a * cos[k] - b * sin[k]);
      out[k + half] = mul * (a * sin[k] + b * cos[k]);
    }
  }
  for (int64_t c = rope.rotary_dim; c < D; ++c) out[c] = mul * x[c];
}

void gemm_nt(int64_t m, int64_t n, int64_t k, const float* A, int64_t lda, const float* B, int64_t ldb, float* C,
             int64_t ldc, float alpha, float beta) {
  if (m == 0 || n == 0) return;
  if (sgemm_ != nullptr) {
    // Column-major view: C^T[n, m] = B[n, k] . A^T[k, m], i.e. op(B) = B as stored transposed.
    int M = int(n), N = int(m), K = int(k), LDA = int(ldb), LDB = int(lda), LDC = int(ldc);
    sgemm_("T", "N", &M, &N, &K, &alpha, B, &LDA, A, &LDB, &beta, C, &LDC);
    return;
  }
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      float acc = 0.f;
      for (int64_t c = 0; c < k; ++c) acc += A[i * lda + c] * B[j * ldb + c];
      C[i * ldc + j] = alpha * acc + (beta == 0.f ? 0.f : beta * C[i * ldc + j]);
    }
}

void gemm_nn(int64_t m, int64_t n, int64_t k, const float* A, int64_t lda, const float* B, int64_t ldb, float* C,
             int64_t ldc, float beta) {
  if (m == 0 || n == 0) return;
  if (sgemm_ != nullptr) {
    int M = int(n), N = int(m), K = int(k), LDA = int(ldb), LDB = int(lda), LDC = int(ldc);
    float alpha = 1.f;
    sgemm_("N", "N", &M, &N, &K, &alpha, B, &LDA, A, &LDB, &beta, C, &LDC);
    return;
  }
  for (int64_t i = 0; i < m; ++i) {
    float* c = C + i * ldc;
    for (int64_t j = 0; j < n; ++j) c[j] = beta == 0.f ? 0.f : beta * c[j];
    for (int64_t p = 0; p < k; ++p) {
      float a = A[i * lda + p];
      if (a == 0.f) continue;
      const float* b = B + p * ldb;
      for (int64_t j = 0; j < n; ++j) c[j] += a * b[j];
    }
  }
}

// exp by range reduction x = n ln2 + r, |r| <= ln2/2, and a degree-6 polynomial for e^r (the Cephes
// expf coefficients); branch-free so the compiler vectorises it, with an AVX2 clone picked at load.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void exp_shifted(float* x, int64_t n, float shift) {
#pragma omp simd
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
  }
}

void block_means(const float* x, int64_t ldx, int64_t L, int64_t G, int64_t D, float* out) {
  std::vector<double> acc(D);
  for (int64_t start = 0, b = 0; start < L; start += G, ++b) {
    int64_t end = std::min(L, start + G);
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t t = start; t < end; ++t)
      for (int64_t c = 0; c < D; ++c) acc[c] += x[t * ldx + c];
    for (int64_t c = 0; c < D; ++c) out[b * D + c] = float(acc[c] / double(end - start));
  }
}

}  // namespace rangeswa::cpu
