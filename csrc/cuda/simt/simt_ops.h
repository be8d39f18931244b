// What the files of torch.ops.rangeswa_simt share (not part of the extension; tests/cuda_emulator.py builds them):
//   simt_ops.cpp        the schemas (TORCH_LIBRARY), the small ops (topk_blocks, rope, block_summary), the
//                       emulation's test ops, configure and stats
//   simt_attn_ops.h     the attn and prepare ops, one sequence and packed
//   simt_launches.h     a call's small kernels as the device runs them (CallKernels), the selection's launch
//   simt_guard.h        the kernels' arrays on guarded copies
// Here: what the last attn call did (stats), the faults tests inject (plan_fault, guard_cut,
// packed_launch_seqs), and the ops' errors. Defined in simt_ops.cpp.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

#include "cuda/attn_params.h"
#include "cuda/simt/simt.h"

namespace rangeswa::cuda::simt_ops {

// What the last attn call did (stats): seconds spent in its kernel launch, its dynamic shared memory per CTA,
extern double g_kernel_seconds;
extern int64_t g_smem_bytes;
extern int64_t g_values_in_place;  // whether it read its body values from v itself
extern int64_t g_cond_raw;         // ... and its control rows' body keys from k itself (attn_setup.h cond_from_keys)
extern int64_t g_folded;           // ... whether its control CTAs did Lite's preparation (attn_setup.h
                                   // nat_keys_from_control)
extern int64_t g_attn_launches;    // launches of the attention kernels (a packed call: one, or one per sequence
                                   // where attn_params.h packed_per_sequence holds)
extern int64_t g_hopper;           // whether its body ran on the sm_90a kernel (one sequence's did)
// The faults and limits tests set (simt_ops.cpp plan_fault, guard_cut, packed_launch_seqs).
extern int g_plan_fault;
extern int g_guard_cut;
extern int32_t g_packed_seqs;

// A launcher's cudaError_t: its own refusals (grid limits, shared memory) as errors of the op.
void check_launch(cudaError_t err, const char* what);

// f(), its simt::Error as the op's RuntimeError.
template <typename F>
auto simt_errors_as_runtime_errors(const F& f) {
  try {
    return f();
  } catch (const ::simt::Error& e) {
    TORCH_CHECK(false, e.what());
  }
}

}  // namespace rangeswa::cuda::simt_ops
