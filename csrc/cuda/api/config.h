// How one fused attention call runs on CUDA: which body kernel, how many K/V stages, whether the plan has the Hn
// bands and window sums, how many tile spans a plan may write, and which in-place reads and preparation folds are
// allowed. One pure function decides it (choose_config) from three explicit inputs: the call's shape and its kernels'
// shared memory (CallShape), the device (DeviceCaps) and the A/B switches (Overrides). The op (attn_api.cpp
// check_call) and both emulations (emulator/host_call.h: the SIMT emulation and the plan census) call it; the
// environment is read in one function, overrides_from_env, at their boundary. Torch- and CUDA-free
// (tests/cpp/test_config.cpp).
//
// The run-time switches (for tests and the first GPU run's A/B measurements; unset = the device's choice):
//   RANGESWA_CUDA_KERNEL=mma|hopper|auto  the body kernel (hopper: an error where the device cannot run it)
//   RANGESWA_CUDA_STAGES=2|3              the K/V pipeline stages (anything else but empty: 2)
//   RANGESWA_CUDA_SPANS=n                 at most n (>= 1) tile spans per plan (tests of plans that pass it)
//   RANGESWA_CUDA_EDGES=masked            no edge-free records: every window and Hn edge a masked tile
//   RANGESWA_CUDA_VALUES=copy             the body values from a padded copy, never v in place
//   RANGESWA_CUDA_COND=copy               the control rows' body keys from the preparation's k_cond, never k
//   RANGESWA_CUDA_FOLD=off                no preparation folded into the control CTAs
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>

#include "cuda/kernel_traits.h"

namespace rangeswa::cuda {

// The body kernel asked for: "mma" the mma.sync kernel on every device, "hopper" the warp-specialized sm_90a kernel
// (sm90/body_kernel.h; an error where it cannot run: compute capability 9.0, 16-bit elements, a build with its
// sm_90a code, its shared memory within the device's), "auto" the device's choice (the sm_90a kernel where it can
// run when kHopperByDefault, else the mma.sync kernel).
//
// kHopperByDefault is false until a GPU run has checked the Hopper kernel's answers and its time against the
// mma.sync kernel's on the same calls (scripts/gpu_check.sh runs both): it has run only in the SIMT emulation, and
// the offline time model (benchmarks/cuda_time_model.py) predicts it issue-bound behind the mma.sync kernel at head
// dim 64 (docs/cuda.md, "The sm_90a body kernel").
enum class BodyKernel : int { kAuto = 0, kMma = 1, kHopper = 2 };
inline constexpr bool kHopperByDefault = false;

// The A/B switches of one call (see the top of this file); the defaults are the device's choice.
struct Overrides {
  BodyKernel kernel = BodyKernel::kAuto;
  int32_t stages = 0;                 // 0: the device's choice; else 2 or 3
  std::optional<int32_t> spans;       // at most this many spans (clamped to [1, the plan's room])
  bool masked_edges = false;
  bool copy_values = false;
  bool copy_cond = false;
  bool no_fold = false;
  // Not a switch: the Hn bands' buffers whatever they cost per multiprocessor (the emulations, which have no
  // multiprocessor to weigh them on: emulator_overrides).
  bool bands = false;
};

// The one place the environment is read: the switches of the current process.
inline Overrides overrides_from_env() {
  auto get = [](const char* name) -> std::string {
    const char* env = std::getenv(name);
    return env == nullptr ? std::string() : std::string(env);
  };
  Overrides o;
  const std::string kernel = get("RANGESWA_CUDA_KERNEL"), stages = get("RANGESWA_CUDA_STAGES"),
                    spans = get("RANGESWA_CUDA_SPANS");
  o.kernel = kernel == "mma" ? BodyKernel::kMma : kernel == "hopper" ? BodyKernel::kHopper : BodyKernel::kAuto;
  if (!stages.empty()) o.stages = std::atoi(stages.c_str()) == 3 ? 3 : 2;
  if (!spans.empty()) o.spans = int32_t(std::atoi(spans.c_str()));
  o.masked_edges = get("RANGESWA_CUDA_EDGES") == "masked";
  o.copy_values = get("RANGESWA_CUDA_VALUES") == "copy";
  o.copy_cond = get("RANGESWA_CUDA_COND") == "copy";
  o.no_fold = get("RANGESWA_CUDA_FOLD") == "off";
  return o;
}

// The emulations' overrides: they have no device whose shared memory per multiprocessor would weigh the bands or a
// third stage, so they plan the bands always and run two K/V stages unless RANGESWA_CUDA_STAGES says 3.
inline Overrides emulator_overrides(Overrides o) {
  o.bands = true;
  if (o.stages == 0) o.stages = 2;
  return o;
}

inline bool hopper_wanted(const Overrides& o) {
  return o.kernel == BodyKernel::kHopper || (o.kernel == BodyKernel::kAuto && kHopperByDefault);
}

// The device a call runs on: the op reads it from CUDA (attn_api.cpp device_caps), the emulations give their own.
struct DeviceCaps {
  bool runs_hopper = false;  // compute capability 9.0 with the build's sm_90a code for the call's element type
  size_t smem_opt_in = 0;    // shared memory a CTA may opt in to
  size_t smem_per_sm = 0;    // a multiprocessor's (unused where the overrides fix the bands and the stages)
};

// What choose_config reads of a call: its element type, padded head dim, rule 4's block G, the plan's room of tile
// spans, and each kernel's shared memory per CTA for the configurations it weighs (attn_setup.h call_shape fills
// them from the kernels' layouts).
struct CallShape {
  bool sixteen_bit = false;
  int32_t Dp = 64, G = 16, max_spans = 0;
  size_t mma_smem[2][2] = {};  // the mma.sync kernel's: [Hn bands][K/V stages - 2]
  size_t hopper_smem[2] = {};  // the sm_90a kernel's: [Hn bands]
};

// How the call runs.
struct Config {
  bool hopper = false;   // the body tiles on the sm_90a kernel (its control CTAs on the mma.sync kernel's)
  bool refused = false;  // RANGESWA_CUDA_KERNEL=hopper where the device cannot run it at all: an error
  std::string why;       // why the sm_90a kernel asked for does not run the call (the op warns)
  int32_t kv_stages = 2;
  int32_t span_budget = 0;    // the tile spans a plan may write (tile.h plan_spans)
  int32_t tile_cols = 64;     // keys per KV tile of the body kernel (the plan's, geo.tile_cols)
  bool bands = false;         // the Hn bands planned and their buffers allotted (geo.band_ok)
  bool window_sums = false;   // edge-free window sums planned (geo.window_sums_ok)
  size_t smem = 0;            // the mma.sync kernel's shared memory per CTA (the launch's check, launch_refusal)
  // Allowed where the arrays allow it (attn_setup.h values_in_place, cond_keys_in_place, fold_allowed): v read in
  // place, the control rows' body keys rotated from k, the preparation folded into the control CTAs.
  bool values_in_place = true, cond_in_place = true, fold = false;
};

// The one function that decides how a call runs.
// - Hn bands: the plan's band records when their buffers cost no CTA per multiprocessor (on an H100 / H200 always,
//   on an A100 at head dims whose tiles leave room), or always (o.bands); never with RANGESWA_CUDA_EDGES=masked.
// - K/V stages: a third (sm80/mainloop.h: tiles n + 1 and n + 2 in flight) where it too costs no CTA per
//   multiprocessor: on an H100 / H200 (228 KB per SM) at head dim 64 beside the bands' buffers, at every head dim
//   without them, two CTAs; on an A100 (164 KB) at none (docs/cuda.md). RANGESWA_CUDA_STAGES forces it.
// - The body kernel: the sm_90a kernel when it is asked for, the inputs are 16-bit and its shared memory per CTA is
//   within the device's opt-in; else the mma.sync kernel, which takes every call the sm_90a kernel takes and more
//   (fp32: its FFMA path). Where the sm_90a kernel was asked for and the call keeps it out, `why` says so; where the
//   device cannot run it at all, `refused` when it was asked for by name.
// - The plan's KV tile is the body kernel's (kernel_traits.h body_tile_cols); its window sums need G = 16 on 64-key
//   tiles (each lane of the kernel then holds one whole G-block of a row, common/kv_copy.h tile_column).
inline Config choose_config(const CallShape& c, const DeviceCaps& d, const Overrides& o) {
  Config cfg;
  cfg.span_budget = !o.spans.has_value() ? c.max_spans : std::max(1, std::min(c.max_spans, *o.spans));
  // CTAs of `bytes` of shared memory a multiprocessor holds (the kernel runs up to 2; 1 KB reserved per CTA).
  const auto ctas = [&](size_t bytes) {
    return bytes <= d.smem_opt_in ? std::min<size_t>(2, d.smem_per_sm / (bytes + 1024)) : 0;
  };
  const bool band =
      o.bands || (c.mma_smem[1][0] <= d.smem_opt_in && ctas(c.mma_smem[1][0]) >= ctas(c.mma_smem[0][0]));
  const bool edges = !o.masked_edges;
  cfg.bands = band && edges;
  const bool third = c.sixteen_bit && ctas(c.mma_smem[cfg.bands][1]) >= std::max<size_t>(1, ctas(c.mma_smem[cfg.bands][0]));
  cfg.kv_stages = o.stages != 0 ? o.stages : third ? 3 : 2;
  cfg.smem = c.mma_smem[cfg.bands][cfg.kv_stages == 3 ? 1 : 0];
  if (hopper_wanted(o) && c.sixteen_bit) {
    if (!d.runs_hopper) {
      cfg.refused = o.kernel == BodyKernel::kHopper;
      cfg.why = "the sm_90a body kernel needs compute capability 9.0 and a build with the 90a target "
                "(RANGESWA_CUDA_ARCHS)";
    } else if (c.hopper_smem[cfg.bands] > d.smem_opt_in) {
      cfg.why = "the sm_90a body kernel needs " + std::to_string(c.hopper_smem[cfg.bands]) +
                " bytes of shared memory per CTA for this call (its plan's room grows with topk), more than the "
                "device's " + std::to_string(d.smem_opt_in) + "; its body tiles run on the mma.sync kernel";
    } else {
      cfg.hopper = true;
    }
  }
  cfg.tile_cols = body_tile_cols(c.sixteen_bit, c.Dp, cfg.hopper);
  cfg.window_sums = edges && c.G == 16 && cfg.tile_cols == 64;
  cfg.values_in_place = !o.copy_values;
  cfg.cond_in_place = !o.copy_cond;
  cfg.fold = !o.no_fold && cfg.hopper;
  return cfg;
}

}  // namespace rangeswa::cuda
