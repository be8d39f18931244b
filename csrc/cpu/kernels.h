// Building blocks of the CPU kernels: RoPE tables, row rotation, small GEMMs and a vectorisable exp.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "checks.h"
#include "cpu/dispatch.h"

namespace rangeswa::cpu {

// cos/sin of pos * inv_freq[k] for a run of positions, formed in double and stored as float, so that
// positions up to ~1e6 keep full float precision in the rotation.
class RopeTable {
 public:
  RopeTable() = default;
  RopeTable(const RopeParams& rope, const double* positions, int64_t count);
  const float* cos(int64_t s) const { return cos_.data() + s * half_; }
  const float* sin(int64_t s) const { return sin_.data() + s * half_; }

 private:
  int64_t half_ = 0;
  std::vector<float> cos_, sin_;
};

// The table of positions first + s * step, s < count (it may hold more rows), or of the given positions,
// shared between calls: a model calls the ops with the same positions in every layer, so the few most
// recent tables are kept (found by their progression or exact positions, frequencies (theta or inv_freq)
// and rotary dim) and each is built once per network call at most; a progression's table also serves
// later, longer calls, as decoding makes them, and grows by doubling.
std::shared_ptr<const RopeTable> rope_table(const RopeParams& rope, double first, double step, int64_t count);
std::shared_ptr<const RopeTable> rope_table(const RopeParams& rope, std::vector<double> positions);

// The hot loops below run the build for this CPU's instruction set (cpu/dispatch.h).

// out[0:D] = mul * R x, with R the rotation whose cos/sin rows are given; dims past rotary_dim copied.
inline void rotate_row(const float* x, float* out, const float* cos, const float* sin, int64_t D,
                       const RopeParams& rope, float mul) {
  kernels().rotate_row(x, out, cos, sin, D, rope.rotary_dim, rope.interleaved, mul);
}

// Row-major C[m, n] = A[m, k] . B[n, k]^T.
inline void gemm_nt(int64_t m, int64_t n, int64_t k, const float* A, int64_t lda, const float* B, int64_t ldb,
                    float* C, int64_t ldc) {
  kernels().gemm_nt(m, n, k, A, lda, B, ldb, C, ldc);
}
// Row-major C[m, n] = A[m, k] . B[k, n] + beta * C (beta = 0: C is not read).
inline void gemm_nn(int64_t m, int64_t n, int64_t k, const float* A, int64_t lda, const float* B, int64_t ldb,
                    float* C, int64_t ldc, float beta) {
  kernels().gemm_nn(m, n, k, A, lda, B, ldb, C, ldc, beta);
}

// The largest of n entries (-inf for none).
inline float row_max(const float* x, int64_t n) { return kernels().row_max(x, n); }

// x[i] = exp(x[i] - shift) for n entries, -inf mapping to 0 (relative error about 2e-7); returns their sum.
inline float exp_shifted(float* x, int64_t n, float shift) { return kernels().exp_shifted(x, n, shift); }

// out[b, :] = mean of rows [b*G, min(L, b*G + G)) of x [L, D] (row stride ldx), for every block b
// (accumulated in double); out is contiguous [ceil(L/G), D].
inline void block_means(const float* x, int64_t ldx, int64_t L, int64_t G, int64_t D, float* out) {
  kernels().block_means(x, ldx, L, G, D, out);
}

// Rule 3 on float [B, H, N, D] inputs with contiguous rows (any batch / head / row strides): int32 [B, H_kv, nQb, K], best first, ties to the lower block,
// -1 padding. Shared by the topk_blocks op and attn.
// key_means: the per key-block means of the body keys (float64 [B, H_kv, nKb, D], a prepared context's), or
// undefined to compute them from kf.
at::Tensor topk_blocks_float(const at::Tensor& qf, const at::Tensor& kf, int64_t control_tokens, const Rules& rules,
                             const at::Tensor& key_means = at::Tensor());

// Rule 3's key-block means of the body keys of float [B, H, N, D] k (contiguous rows), pre-RoPE, float64
// [B, H_kv, nKb - first_block, D] for key blocks [first_block, nKb) (the prepare op's key_means).
at::Tensor key_means_float(const at::Tensor& kf, int64_t control_tokens, const Rules& rules, int64_t first_block);

}  // namespace rangeswa::cpu
