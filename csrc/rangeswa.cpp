// Registers every rangeswa op under torch.ops.rangeswa, with the schemas of csrc/schema.h. Kernels
// register per backend next to their code: csrc/cpu/*.cpp (CPU) and csrc/cuda/*.cu (CUDA). Argument
// meanings: python/rangeswa_ext/ops.py.
#include <Python.h>
#include <torch/library.h>

#include "schema.h"

namespace schema = rangeswa::schema;

extern "C" {
// `import rangeswa_ext._C` loads this library, whose static initialisers register the ops.
PyObject* PyInit__C(void) {
  static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module);
}
}

TORCH_LIBRARY(rangeswa, m) {
  m.def(schema::kRope);
  m.def(schema::kBlockSummary);
  m.def(schema::kTopkBlocks);
  m.def(schema::kAttn);
  m.def(schema::kPrepare);
}
