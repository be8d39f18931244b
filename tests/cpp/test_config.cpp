// csrc/cuda/api/config.h: choose_config against the decisions the op (attn_api.cpp check_call, use_hopper_kernel)
// and the emulations (emulator/host_call.h build, simt_ops.cpp body_kernel_of) made before it, written out here as
// they were, on a grid of call shapes, devices and switches; and overrides_from_env against the switches' former
// readers (attn_setup.h span_budget, kv_stages_forced, body_kernel_forced, env_is).
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda/api/config.h"

using namespace rangeswa::cuda;

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
  if (ok) return;
  ++failures;
  if (failures <= 20) std::fprintf(stderr, "FAIL: %s\n", what.c_str());
}

// The switches as the former readers took them from the environment (the strings themselves).
struct Env {
  const char* kernel;  // RANGESWA_CUDA_KERNEL (nullptr: unset)
  const char* stages;  // RANGESWA_CUDA_STAGES
  const char* spans;   // RANGESWA_CUDA_SPANS
  bool masked, copy_values, copy_cond, no_fold;
};

BodyKernel old_kernel(const Env& e) {
  if (e.kernel == nullptr) return BodyKernel::kAuto;
  const std::string v(e.kernel);
  return v == "mma" ? BodyKernel::kMma : v == "hopper" ? BodyKernel::kHopper : BodyKernel::kAuto;
}
int32_t old_stages(const Env& e) {
  if (e.stages == nullptr || *e.stages == 0) return 0;
  return std::atoi(e.stages) == 3 ? 3 : 2;
}
int32_t old_span_budget(const Env& e, int32_t room) {
  if (e.spans == nullptr || *e.spans == 0) return room;
  return std::max(1, std::min(room, int32_t(std::atoi(e.spans))));
}

// The former choose_body_kernel.
struct OldChoice {
  bool hopper = false, refused = false, why = false;
};
OldChoice old_body_kernel(BodyKernel forced, bool sixteen_bit, bool device_runs_it, size_t hopper_smem, size_t limit) {
  OldChoice c;
  const bool wanted = forced == BodyKernel::kHopper || (forced == BodyKernel::kAuto && kHopperByDefault);
  if (!wanted || !sixteen_bit) return c;
  if (!device_runs_it) {
    c.refused = forced == BodyKernel::kHopper;
    c.why = true;
    return c;
  }
  if (hopper_smem > limit) {
    c.why = true;
    return c;
  }
  c.hopper = true;
  return c;
}

struct Old {
  OldChoice kernel;
  int32_t stages, span_budget, tile_cols;
  bool bands, window_sums;
  size_t smem;
};

// The op's former check_call on a device.
Old old_op(const CallShape& c, const DeviceCaps& d, const Env& e) {
  Old o{};
  o.span_budget = old_span_budget(e, c.max_spans);
  const auto ctas = [&](size_t bytes) {
    return bytes <= d.smem_opt_in ? std::min<size_t>(2, d.smem_per_sm / (bytes + 1024)) : 0;
  };
  const bool band = c.mma_smem[1][0] <= d.smem_opt_in && ctas(c.mma_smem[1][0]) >= ctas(c.mma_smem[0][0]);
  const bool bands = band && !e.masked;
  const bool third = c.sixteen_bit && ctas(c.mma_smem[bands][1]) >= std::max<size_t>(1, ctas(c.mma_smem[bands][0]));
  const int32_t forced = old_stages(e);
  o.stages = forced != 0 ? forced : third ? 3 : 2;
  // The op counted the bands' buffers here even where RANGESWA_CUDA_EDGES=masked left them out of the kernel's
  // allotment; choose_config counts what the kernel allots (mma_smem[bands]), as the emulations did.
  o.smem = c.mma_smem[bands][o.stages - 2];
  o.kernel = old_body_kernel(old_kernel(e), c.sixteen_bit, d.runs_hopper, c.hopper_smem[bands], d.smem_opt_in);
  o.tile_cols = body_tile_cols(c.sixteen_bit, c.Dp, o.kernel.hopper);
  o.bands = bands;
  o.window_sums = !e.masked && c.G == 16 && o.tile_cols == 64;
  return o;
}

// The SIMT emulation's former body_kernel_of and build (the bands always, two stages unless told three); with
// `census`, the plan census's build (the sm_90a kernel exactly where RANGESWA_CUDA_KERNEL=hopper and 16-bit).
Old old_emulator(const CallShape& c, size_t limit, const Env& e, bool census) {
  Old o{};
  o.span_budget = old_span_budget(e, c.max_spans);
  o.stages = old_stages(e) == 3 ? 3 : 2;
  o.bands = !e.masked;
  o.smem = c.mma_smem[o.bands][o.stages - 2];
  if (census) o.kernel.hopper = c.sixteen_bit && old_kernel(e) == BodyKernel::kHopper;
  else o.kernel = old_body_kernel(old_kernel(e), c.sixteen_bit, true, c.hopper_smem[o.bands], limit);
  o.tile_cols = body_tile_cols(c.sixteen_bit, c.Dp, o.kernel.hopper);
  o.window_sums = !e.masked && c.G == 16 && o.tile_cols == 64;
  return o;
}

void set(const char* name, const char* value) {
  if (value == nullptr) unsetenv(name);
  else setenv(name, value, 1);
}

Overrides from(const Env& e) {
  set("RANGESWA_CUDA_KERNEL", e.kernel);
  set("RANGESWA_CUDA_STAGES", e.stages);
  set("RANGESWA_CUDA_SPANS", e.spans);
  set("RANGESWA_CUDA_EDGES", e.masked ? "masked" : "tiles");
  set("RANGESWA_CUDA_VALUES", e.copy_values ? "copy" : nullptr);
  set("RANGESWA_CUDA_COND", e.copy_cond ? "copy" : "");
  set("RANGESWA_CUDA_FOLD", e.no_fold ? "off" : "on");
  return overrides_from_env();
}

void compare(const Old& o, const Config& n, bool device_op, const std::string& at) {
  expect(n.hopper == o.kernel.hopper, at + ": hopper");
  expect(n.refused == o.kernel.refused, at + ": refused");
  expect(!n.why.empty() == o.kernel.why || !device_op, at + ": why");
  expect(n.kv_stages == o.stages, at + ": stages " + std::to_string(n.kv_stages) + " vs " + std::to_string(o.stages));
  expect(n.span_budget == o.span_budget, at + ": span budget");
  expect(n.tile_cols == o.tile_cols, at + ": tile cols");
  expect(n.bands == o.bands, at + ": bands");
  expect(n.window_sums == o.window_sums, at + ": window sums");
  expect(n.smem == o.smem, at + ": smem");
}

}  // namespace

int main() {
  // Devices: an A100 (163 KB opt-in, 164 KB per SM), an H100 (227 KB, 228 KB), a small one; runs the sm_90a kernel
  // or not.
  const std::vector<std::pair<size_t, size_t>> memories = {{166912, 167936}, {232448, 233472}, {49152, 65536}};
  // Shared memory per CTA of the two kernels: [bands][stages - 2] and [bands], from 30 KB to 290 KB.
  std::vector<CallShape> shapes;
  for (int sixteen = 0; sixteen < 2; ++sixteen)
    for (int32_t Dp : {64, 80, 128})
      for (int32_t G : {8, 16, 32})
        for (int32_t room : {3, 40})
          for (size_t base : {30000, 70000, 110000, 160000})
            for (size_t band_extra : {0, 40000})
              for (size_t stage_extra : {8000, 60000}) {
                CallShape c;
                c.sixteen_bit = sixteen == 1;
                c.Dp = Dp;
                c.G = G;
                c.max_spans = room;
                for (int b = 0; b < 2; ++b) {
                  c.mma_smem[b][0] = base + b * band_extra;
                  c.mma_smem[b][1] = base + b * band_extra + stage_extra;
                  c.hopper_smem[b] = base + 30000 + b * band_extra;
                }
                shapes.push_back(c);
              }
  std::vector<Env> envs;
  for (const char* kernel : {(const char*)nullptr, "mma", "hopper", "auto", "bogus", ""})
    for (const char* stages : {(const char*)nullptr, "", "2", "3", "4", "x"})
      for (const char* spans : {(const char*)nullptr, "", "1", "7", "x"})
        for (int flags = 0; flags < 16; flags += 5)  // masked, copy values, copy cond, no fold: a spread
          envs.push_back(Env{kernel, stages, spans, (flags & 1) != 0, (flags & 2) != 0, (flags & 4) != 0,
                             (flags & 8) != 0});
  int64_t checked = 0;
  for (const Env& e : envs) {
    const Overrides ov = from(e);
    // The switches as their former readers took them.
    expect(ov.kernel == old_kernel(e), "kernel switch");
    expect(ov.stages == old_stages(e), "stages switch");
    expect(ov.masked_edges == e.masked && ov.copy_values == e.copy_values && ov.copy_cond == e.copy_cond &&
               ov.no_fold == e.no_fold,
           "A/B switches");
    const Overrides emu = emulator_overrides(ov);
    for (const CallShape& c : shapes) {
      const std::string at = std::string("kernel=") + (e.kernel ? e.kernel : "unset") + " stages=" +
                             (e.stages ? e.stages : "unset") + " spans=" + (e.spans ? e.spans : "unset") +
                             " masked=" + std::to_string(e.masked) + " Dp=" + std::to_string(c.Dp) +
                             " smem=" + std::to_string(c.mma_smem[0][0]);
      for (const auto& [opt_in, per_sm] : memories)
        for (int runs = 0; runs < 2; ++runs) {
          const DeviceCaps d{runs == 1, opt_in, per_sm};
          const Config n = choose_config(c, d, ov);
          compare(old_op(c, d, e), n, true, "op " + at);
          expect(n.values_in_place == !e.copy_values && n.cond_in_place == !e.copy_cond, at + ": in place");
          expect(n.fold == (!e.no_fold && n.hopper), at + ": fold");
          ++checked;
        }
      const size_t limit = 232448;
      compare(old_emulator(c, limit, e, false), choose_config(c, DeviceCaps{true, limit, 0}, emu), true, "simt " + at);
      compare(old_emulator(c, 0, e, true), choose_config(c, DeviceCaps{true, SIZE_MAX, 0}, emu), false, "census " + at);
      checked += 2;
    }
  }
  if (failures != 0) {
    std::fprintf(stderr, "%d of %lld decisions differ\n", failures, (long long)checked);
    return 1;
  }
  std::printf("%lld configurations decided as before\n", (long long)checked);
  return 0;
}
