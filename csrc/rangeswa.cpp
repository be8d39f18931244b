// Every schema of the rangeswa ops, in one place. Kernels register per backend next to their code:
// csrc/cpu/*.cpp (CPU) and csrc/cuda/*.cu (CUDA). Argument meanings: python/rangeswa_ext/ops.py.
#include <Python.h>
#include <torch/library.h>

extern "C" {
// `import rangeswa_ext._C` loads this library, whose static initialisers register the ops.
PyObject* PyInit__C(void) {
  static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module);
}
}

TORCH_LIBRARY(rangeswa, m) {
  m.def("rope(Tensor x, Tensor positions, float theta, int rotary_dim, str rope_style) -> Tensor");
  m.def(
      "block_summary(Tensor k, Tensor v, Tensor? positions, int summary_block, float theta, int rotary_dim, "
      "str rope_style) -> (Tensor, Tensor)");
  m.def(
      "topk_blocks(Tensor q, Tensor k, int control_tokens, int window, int summary_block, int retrieval_block, "
      "int query_block, int topk) -> Tensor");
  m.def(
      "attn(Tensor q, Tensor k, Tensor v, Tensor? retrieved, str method, int control_tokens, int window, "
      "int summary_block, int near_range, int topk, int retrieval_block, int query_block, int train_length, "
      "int sinks, bool far_summaries, float theta, int rotary_dim, str rope_style, float scale) -> (Tensor, Tensor)");
}
