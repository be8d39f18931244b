// One SIMD register of floats for the instruction set cpu/kernels_body.h is being compiled for, and the
// shape of the GEMM micro tile that fits that register file: AVX-512 or AVX2 intrinsics under
// RANGESWA_VEC_AVX512 / RANGESWA_VEC_AVX2 (included under the matching target pragma, after
// <immintrin.h>), else 4 lanes of the compiler's vector extensions, for the baseline of whatever CPU it
// builds for. Only what cpu/kernels_body.h uses. Torch-free.
#pragma once

#include <cstdint>
#include <cstring>
#include <initializer_list>

namespace rangeswa::cpu::RANGESWA_ISA {

#if defined(RANGESWA_VEC_AVX512)

struct Vec {
  static constexpr int64_t kLanes = 16;
  __m512 v;

  static __mmask16 mask(int64_t n) { return n <= 0 ? 0 : n >= kLanes ? 0xffff : __mmask16((1u << n) - 1); }
  static Vec zero() { return {_mm512_setzero_ps()}; }
  static Vec splat(float x) { return {_mm512_set1_ps(x)}; }
  static Vec load(const float* p) { return {_mm512_loadu_ps(p)}; }
  // The first n lanes from p (none for n <= 0, all for n >= kLanes), zeros after them.
  static Vec load(const float* p, int64_t n) { return {_mm512_maskz_loadu_ps(mask(n), p)}; }
  void store(float* p, int64_t n) const { _mm512_mask_storeu_ps(p, mask(n), v); }
  // The sum of the lanes: halves, quarters, ... swapped and added (by permutex2var: GCC 12 warns of an
  // uninitialized operand inside reduce_add, shuffle_f32x4 and permute_ps).
  float sum() const {
    const __m512i half = _mm512_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
    const __m512i quarter = _mm512_setr_epi32(4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3);
    const __m512i pair = _mm512_setr_epi32(2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1);
    const __m512i lane = _mm512_setr_epi32(1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0);
    __m512 s = v;
    for (const __m512i& swap : {half, quarter, pair, lane}) s = _mm512_add_ps(s, _mm512_permutex2var_ps(s, swap, s));
    return _mm512_cvtss_f32(s);
  }
};

inline Vec operator*(Vec a, Vec b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline Vec fma(Vec a, Vec b, Vec c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }  // a * b + c

// 6 x 4 accumulators of the 32 zmm registers, 4 for a row of B and 1 for a broadcast of A.
constexpr int64_t kMicroRows = 6, kMicroVecs = 4;

// Permute indices into (row i, row i + s) that swap the off-diagonal s x s blocks of a 2s x 2s block:
// row i keeps its columns with bit s clear and takes row i + s's first s columns (16 + j: row i + s,
// column j), row i + s the other way round.
struct SwapIndices {
  int32_t upper[16], lower[16];
};
constexpr SwapIndices swap_indices(int s) {
  SwapIndices x{};
  for (int j = 0; j < 16; ++j) {
    x.upper[j] = (j & s) ? 16 + j - s : j;
    x.lower[j] = (j & s) ? 16 + j : j + s;
  }
  return x;
}

template <int S>
inline void swap_off_diagonal(__m512 (&r)[16]) {
  static constexpr SwapIndices kIndices = swap_indices(S);
  const __m512i upper = _mm512_loadu_si512(kIndices.upper), lower = _mm512_loadu_si512(kIndices.lower);
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i)
    if (!(i & S)) {
      const __m512 a = r[i], b = r[i + S];
      r[i] = _mm512_permutex2var_ps(a, upper, b);
      r[i + S] = _mm512_permutex2var_ps(a, lower, b);
    }
}

// dst[c * ldd + r] = src[r * lds + c] for r, c < 16: each swap of off-diagonal blocks exchanges one
// bit of the row index with the same bit of the column index.
inline void transpose_block(const float* src, int64_t lds, float* dst, int64_t ldd) {
  __m512 r[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * lds);
  swap_off_diagonal<8>(r);
  swap_off_diagonal<4>(r);
  swap_off_diagonal<2>(r);
  swap_off_diagonal<1>(r);
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) _mm512_storeu_ps(dst + i * ldd, r[i]);
}

#elif defined(RANGESWA_VEC_AVX2)

struct Vec {
  static constexpr int64_t kLanes = 8;
  __m256 v;

  static __m256i mask(int64_t n) {
    const int count = n <= 0 ? 0 : n >= kLanes ? int(kLanes) : int(n);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(count), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static Vec zero() { return {_mm256_setzero_ps()}; }
  static Vec splat(float x) { return {_mm256_set1_ps(x)}; }
  static Vec load(const float* p) { return {_mm256_loadu_ps(p)}; }
  static Vec load(const float* p, int64_t n) { return {_mm256_maskload_ps(p, mask(n))}; }
  void store(float* p, int64_t n) const {
    if (n >= kLanes) _mm256_storeu_ps(p, v);
    else _mm256_maskstore_ps(p, mask(n), v);
  }
  float sum() const {  // of the lanes
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
  }
};

inline Vec operator*(Vec a, Vec b) { return {_mm256_mul_ps(a.v, b.v)}; }
inline Vec fma(Vec a, Vec b, Vec c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }

// 6 x 2 accumulators of the 16 ymm registers, 2 for a row of B and 1 for a broadcast of A.
constexpr int64_t kMicroRows = 6, kMicroVecs = 2;

// dst[c * ldd + r] = src[r * lds + c] for r, c < 8.
inline void transpose_block(const float* src, int64_t lds, float* dst, int64_t ldd) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * lds);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int g = 0; g < 8; g += 4) {  // r[g + c]: columns c and 4 + c of rows g .. g + 3, one per lane
    r[g] = _mm256_shuffle_ps(t[g], t[g + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[g + 1] = _mm256_shuffle_ps(t[g], t[g + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[g + 2] = _mm256_shuffle_ps(t[g + 1], t[g + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[g + 3] = _mm256_shuffle_ps(t[g + 1], t[g + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int c = 0; c < 4; ++c) {
    _mm256_storeu_ps(dst + c * ldd, _mm256_permute2f128_ps(r[c], r[4 + c], 0x20));
    _mm256_storeu_ps(dst + (4 + c) * ldd, _mm256_permute2f128_ps(r[c], r[4 + c], 0x31));
  }
}

#else

// GCC / clang vector extensions: SSE2 on any x86-64, NEON on arm64.
struct Vec {
  static constexpr int64_t kLanes = 4;
  typedef float Lanes __attribute__((vector_size(16)));
  Lanes v;

  static Vec zero() { return splat(0.f); }
  static Vec splat(float x) { return {Lanes{x, x, x, x}}; }
  static Vec load(const float* p) {
    Vec r;
    std::memcpy(&r.v, p, sizeof r.v);
    return r;
  }
  static Vec load(const float* p, int64_t n) {
    Vec r = zero();
    for (int64_t i = 0; i < kLanes && i < n; ++i) r.v[i] = p[i];
    return r;
  }
  void store(float* p, int64_t n) const {
    if (n >= kLanes) std::memcpy(p, &v, sizeof v);
    else
      for (int64_t i = 0; i < n; ++i) p[i] = v[i];
  }
  float sum() const { return (v[0] + v[2]) + (v[1] + v[3]); }  // of the lanes
};

inline Vec operator*(Vec a, Vec b) { return {a.v * b.v}; }
inline Vec fma(Vec a, Vec b, Vec c) { return {a.v * b.v + c.v}; }  // one instruction where the target has FMA

// 4 x 2 accumulators: 16 SSE registers on x86-64, 32 NEON registers on arm64.
constexpr int64_t kMicroRows = 4, kMicroVecs = 2;

inline void transpose_block(const float* src, int64_t lds, float* dst, int64_t ldd) {
  for (int64_t r = 0; r < Vec::kLanes; ++r)
    for (int64_t c = 0; c < Vec::kLanes; ++c) dst[c * ldd + r] = src[r * lds + c];
}

#endif

}  // namespace rangeswa::cpu::RANGESWA_ISA
