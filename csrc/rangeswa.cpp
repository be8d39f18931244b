// Registers every rangeswa op under torch.ops.rangeswa, with the schemas of csrc/schema.h. Kernels
// register per backend next to their code: csrc/cpu/*.cpp (CPU) and csrc/cuda/*.cu (CUDA). Argument
// meanings: python/rangeswa_ext/ops.py. The module itself has one function, cpu_capability.
#include <Python.h>
#include <torch/library.h>

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

TORCH_LIBRARY(rangeswa, m) {
  m.def(schema::kRope);
  m.def(schema::kBlockSummary);
  m.def(schema::kTopkBlocks);
  m.def(schema::kAttn);
}
