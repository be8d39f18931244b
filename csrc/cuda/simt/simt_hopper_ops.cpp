// torch.ops.rangeswa_simt's Hopper test ops (a TORCH_LIBRARY_FRAGMENT of simt_ops.cpp's namespace): the
// emulated sm_90a kernels of hopper_tile.cu, the fragment-layout and misuse probes, the TMA probe, the
// descriptor's addressing and encoding, and the emulation's counters (simt_hopper_tests.cpp, simt_hopper.cpp).
// tests/test_simt_hopper.py calls them. Not part of the extension.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "cuda/sm90/hopper.h"
#include "cuda/simt/simt.h"
#include "cuda/simt/simt_hopper_tests.h"

namespace rangeswa::cuda {
namespace {

template <typename F>
auto simt_errors(const F& f) {
  try {
    return f();
  } catch (const ::simt::Error& e) {
    throw std::runtime_error(e.what());
  }
}

uint16_t* bits(const at::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr()); }

// which 0: q k^T, 1: q k (hopper_tile.cu tile_kernel).
at::Tensor hopper_tile(const at::Tensor& q, const at::Tensor& k, int64_t which, int64_t swizzle, bool a_regs) {
  TORCH_CHECK(q.sizes() == at::IntArrayRef({64, 64}) && k.sizes() == at::IntArrayRef({64, 64}),
              "hopper_tile: x and y [64, 64]");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() &&
                  (q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kHalf),
              "hopper_tile: bfloat16 or float16");
  const at::Tensor qc = q.contiguous(), kc = k.contiguous();
  at::Tensor out = at::full({64, 64}, NAN, q.options().dtype(at::kFloat));
  simt_errors([&] {
    simt_hopper_tests::tile(int(which), q.scalar_type() == at::kBFloat16 ? 1 : 2, int(swizzle), a_regs, bits(qc),
                            bits(kc), out.data_ptr<float>());
    return 0;
  });
  return out;
}

at::Tensor hopper_ring(const at::Tensor& q, const at::Tensor& k, int64_t mode) {
  TORCH_CHECK(q.sizes() == at::IntArrayRef({64, 64}) && k.dim() == 2 && k.size(1) == 64 && k.size(0) % 64 == 0,
              "hopper_ring: q [64, 64], k [tiles * 64, 64]");
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 && k.scalar_type() == at::kBFloat16, "hopper_ring: bfloat16");
  const at::Tensor qc = q.contiguous(), kc = k.contiguous();
  const int tiles = int(k.size(0) / 64);
  at::Tensor out = at::full({tiles, 64, 64}, NAN, q.options().dtype(at::kFloat));
  simt_errors([&] {
    simt_hopper_tests::qk_ring(tiles, int(mode), bits(qc), bits(kc), out.data_ptr<float>());
    return 0;
  });
  return out;
}

at::Tensor hopper_tma(int64_t swizzle, int64_t c0, int64_t c1, int64_t box0, int64_t box1, int64_t dim0, int64_t dim1,
                      bool oob_nan) {
  const std::vector<int32_t> out = simt_errors([&] {
    return simt_hopper_tests::tma_probe(int(swizzle), int(c0), int(c1), int(box0), int(box1), int(dim0), int(dim1),
                                        oob_nan);
  });
  return at::tensor(out, at::kInt);
}

at::Tensor hopper_probe(c10::string_view name, const std::optional<at::Tensor>& input) {
  std::vector<float> in;
  if (input.has_value()) {
    const at::Tensor x = input->to(at::kFloat).contiguous();
    in.assign(x.data_ptr<float>(), x.data_ptr<float>() + x.numel());
  }
  const std::vector<float> out = simt_errors([&] { return simt_hopper_tests::probe(std::string(name), in); });
  return at::tensor(out, at::kFloat);
}

// The emulated shared address of element (mn, k) for mn < rows, k < 16 of a K-major (or MN-major) operand of
// 16-bit elements.
at::Tensor hopper_desc_address(int64_t desc, int64_t rows, bool mn_major) {
  at::Tensor out = at::empty({rows, 16}, at::kLong);
  auto a = out.accessor<int64_t, 2>();
  simt_errors([&] {
    for (int64_t r = 0; r < rows; ++r)
      for (int k = 0; k < 16; ++k) a[r][k] = ::simt::hopper::descriptor_address(uint64_t(desc), int(r), k, mn_major);
    return 0;
  });
  return out;
}

// sm90/hopper.h make_smem_desc, as a signed 64-bit integer.
int64_t hopper_make_desc(int64_t addr, int64_t lbo, int64_t sbo, int64_t swizzle, int64_t base_offset) {
  return int64_t(hopper::make_smem_desc(uint32_t(addr), uint32_t(lbo), uint32_t(sbo), hopper::Swizzle(uint32_t(swizzle)),
                                        uint32_t(base_offset)));
}

// wgmma, groups, TMA copies, TMA bytes, arrivals, completed phases, blocked waits, proxy fences since the last
// call (which resets them).
std::vector<int64_t> hopper_stats() {
  const ::simt::hopper::Stats s = ::simt::hopper::last_stats();
  ::simt::hopper::reset_stats();
  return {s.wgmma, s.wgmma_groups, s.tma, s.tma_bytes, s.arrivals, s.phases, s.blocked_waits, s.proxy_fences};
}

}  // namespace
}  // namespace rangeswa::cuda

TORCH_LIBRARY_FRAGMENT(rangeswa_simt, m) {
  m.def("hopper_tile(Tensor x, Tensor y, int which=0, int swizzle=128, bool a_regs=False) -> Tensor");
  m.def("hopper_ring(Tensor q, Tensor k, int mode=0) -> Tensor");
  m.def("hopper_tma(int swizzle, int c0, int c1, int box0, int box1, int dim0, int dim1, bool oob_nan=False) -> Tensor",
        &rangeswa::cuda::hopper_tma);
  m.def("hopper_probe(str name, Tensor? input=None) -> Tensor", &rangeswa::cuda::hopper_probe);
  m.def("hopper_desc_address(int desc, int rows, bool mn_major=False) -> Tensor", &rangeswa::cuda::hopper_desc_address);
  m.def("hopper_make_desc(int addr, int lbo, int sbo, int swizzle, int base_offset=0) -> int",
        &rangeswa::cuda::hopper_make_desc);
  m.def("hopper_stats() -> int[]", &rangeswa::cuda::hopper_stats);
}

TORCH_LIBRARY_IMPL(rangeswa_simt, CPU, m) {
  m.impl("hopper_tile", &rangeswa::cuda::hopper_tile);
  m.impl("hopper_ring", &rangeswa::cuda::hopper_ring);
}
