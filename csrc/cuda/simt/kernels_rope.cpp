// The device source of csrc/cuda/rope.cu, kernels and launchers unmodified, compiled for the host SIMT
// emulation (the build force-includes simt.h, so its launches run through simt::launch).
#include "cuda/rope.cu"
