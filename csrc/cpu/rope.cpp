// The rope op and block_summary op on the CPU (SPEC sections 1 and 5).
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <vector>

#include "cpu/kernels.h"

namespace rangeswa::cpu {
namespace {

std::vector<double> positions_as_double(const at::Tensor& positions) {
  at::Tensor p = positions.to(at::kCPU, at::kDouble).contiguous();
  return std::vector<double>(p.data_ptr<double>(), p.data_ptr<double>() + p.numel());
}

// Rotates every row of a float [B, H, n, D] tensor (contiguous rows, any strides) at the table's
// positions into a contiguous float buffer.
void rotate_all(const at::Tensor& x, float* out, const RopeTable& table, const RopeParams& rope) {
  const int64_t H = x.size(1), n = x.size(2), D = x.size(3);
  const RowStrides st = row_strides(x);
  const float* data = x.data_ptr<float>();
  at::parallel_for(0, x.size(0) * H * n, 256, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t s = r % n, bh = r / n;
      rotate_row(data + st.at(bh / H, bh % H, s), out + r * D, table.cos(s), table.sin(s), D, rope, 1.f);
    }
  });
}

at::Tensor rope_cpu(const at::Tensor& x, const at::Tensor& positions, double theta, std::optional<int64_t> rotary_dim,
                    c10::string_view rope_style, const std::optional<at::Tensor>& inv_freq) {
  check_bhnd(x, "x");
  RopeParams rope = check_rope(x.size(3), theta, rotary_dim, rope_style, inv_freq, x.device());
  check_positions(positions, x.size(2), x, "token of x");
  const auto table = rope_table(rope, positions_as_double(positions));
  at::Tensor xf = with_contiguous_rows(x.to(at::kFloat));
  at::Tensor out = at::empty(x.sizes(), xf.options());
  rotate_all(xf, out.data_ptr<float>(), *table, rope);
  return out.to(x.scalar_type());
}

std::tuple<at::Tensor, at::Tensor> block_summary_cpu(const at::Tensor& k, const at::Tensor& v,
                                                     const std::optional<at::Tensor>& positions,
                                                     int64_t summary_block, double theta,
                                                     std::optional<int64_t> rotary_dim, c10::string_view rope_style,
                                                     const std::optional<at::Tensor>& inv_freq) {
  RopeParams rope = check_block_summary(k, v, summary_block, theta, rotary_dim, rope_style, inv_freq);
  const int64_t BH = k.size(0) * k.size(1), L = k.size(2), D = k.size(3);
  const int64_t nG = (L + summary_block - 1) / summary_block;
  at::Tensor kf = with_contiguous_rows(k.to(at::kFloat)), vf = with_contiguous_rows(v.to(at::kFloat));
  if (positions.has_value()) {
    check_positions(*positions, L, k, "body key");
    const auto table = rope_table(rope, positions_as_double(*positions));
    at::Tensor rotated = at::empty(k.sizes(), kf.options());
    rotate_all(kf, rotated.data_ptr<float>(), *table, rope);
    kf = rotated;
  }
  at::Tensor ks = at::empty({k.size(0), k.size(1), nG, D}, kf.options());
  at::Tensor vs = at::empty_like(ks);
  const RowStrides kst = row_strides(kf), vst = row_strides(vf);
  const int64_t H = k.size(1);
  at::parallel_for(0, BH, 1, [&](int64_t begin, int64_t end) {
    for (int64_t bh = begin; bh < end; ++bh) {
      block_means(kf.data_ptr<float>() + kst.at(bh / H, bh % H, 0), kst.row, L, summary_block, D,
                  ks.data_ptr<float>() + bh * nG * D);
      block_means(vf.data_ptr<float>() + vst.at(bh / H, bh % H, 0), vst.row, L, summary_block, D,
                  vs.data_ptr<float>() + bh * nG * D);
    }
  });
  return {ks.to(k.scalar_type()), vs.to(v.scalar_type())};
}

}  // namespace

TORCH_LIBRARY_IMPL(rangeswa, CPU, m) {
  m.impl("rope", &rope_cpu);
  m.impl("block_summary", &block_summary_cpu);
}

}  // namespace rangeswa::cpu
