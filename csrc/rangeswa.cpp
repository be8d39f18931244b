// Registers every rangeswa op under torch.ops.rangeswa, with the schemas of csrc/schema.h. Kernels
// register per backend next to their code: csrc/cpu/*.cpp (CPU) and csrc/cuda/*.cu (CUDA). Argument
// meanings: python/rangeswa_ext/ops.py. The module itself has one function, cpu_capability.
#include <Python.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/GradMode.h>
#include <torch/library.h>
#include <torch/version.h>

#include "cpu/dispatch.h"
#include "schema.h"

namespace schema = rangeswa::schema;

namespace {

// _C.cpu_capability(): the instruction set of the CPU kernels in this process (cpu/dispatch.h), as the
// kernels' own table names it; a RuntimeError when RANGESWA_CPU_CAPABILITY asks for what the CPU lacks.
PyObject* cpu_capability(PyObject*, PyObject*) {
  try {
    return PyUnicode_FromString(rangeswa::cpu::capability_name(rangeswa::cpu::kernels().capability));
  } catch (const c10::Error& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
    return nullptr;
  }
}

PyMethodDef methods[] = {{"cpu_capability", cpu_capability, METH_NOARGS, "The CPU kernels' instruction set."},
                         {nullptr, nullptr, 0, nullptr}};

}  // namespace

extern "C" {
// `import rangeswa_ext._C` loads this library, whose static initialisers register the ops.
PyObject* PyInit__C(void) {
  static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, methods};
  return PyModule_Create(&module);
}
}

// The ops whose CUDA calls stage work on the host (cuda/api/host.h refuse_capture: a packed call's offsets,
// cached rope tables, given frequencies) carry the cudagraph_unsafe tag: torch.compile(mode="reduce-overhead")
// then runs them between its CUDA graphs (inductor's graph partitions) instead of capturing them.
// (torch 2.8 and newer: older ones have no such tag, nor inductor's partitions.)
TORCH_LIBRARY(rangeswa, m) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 8)
  const std::vector<at::Tag> host_staged = {at::Tag::cudagraph_unsafe};
#else
  const std::vector<at::Tag> host_staged;
#endif
  m.def(schema::kRope, host_staged);
  m.def(schema::kBlockSummary, host_staged);
  m.def(schema::kTopkBlocks);
  m.def(schema::kAttn, host_staged);
  m.def(schema::kPrepare, host_staged);
}

namespace {

// attn and block_summary are inference ops without a backward (docs/spec_decisions.md item 21). Under grad
// mode an input that requires grad is refused here, instead of an output whose gradient silently never
// comes; otherwise the call goes on to the backend kernel. rope has a backward (python/rangeswa_ext/ops.py),
// and topk_blocks returns indices, which carry no gradient (like argmax).
void inference_only(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  if (c10::GradMode::is_enabled()) {
    const auto& arguments = op.schema().arguments();
    const size_t first = stack->size() - arguments.size();
    for (size_t a = 0; a < arguments.size(); ++a) {
      const c10::IValue& value = (*stack)[first + a];
      TORCH_CHECK(!value.isTensor() || !value.toTensor().requires_grad(), op.schema().name(),
                  " is an inference op with no backward, but its argument '", arguments[a].name(),
                  "' requires grad; call it under torch.no_grad() or torch.inference_mode(), or detach the inputs");
    }
  }
  op.redispatchBoxed(keys & c10::after_autograd_keyset, stack);
}

}  // namespace

TORCH_LIBRARY_IMPL(rangeswa, Autograd, m) {
  m.impl("attn", torch::CppFunction::makeFromBoxedFunction<&inference_only>());
  m.impl("block_summary", torch::CppFunction::makeFromBoxedFunction<&inference_only>());
}
