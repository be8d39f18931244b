// The device source of csrc/cuda/prepare.cu, kernels and launchers unmodified, compiled for the host SIMT
// emulation (utils.h takes its RANGESWA_SIMT branch, so its launches run through simt::launch).
#include "cuda/prepare.cu"
