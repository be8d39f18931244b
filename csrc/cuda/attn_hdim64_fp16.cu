// One instantiation of the fused attention kernel (static_switch.h dispatches here).
#include "attn_launch.h"

template cudaError_t rangeswa::cuda::run_attn<__half, 64>(const rangeswa::cuda::AttnKernelParams&, cudaStream_t);
