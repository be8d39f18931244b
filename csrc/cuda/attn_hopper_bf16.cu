// The warp-specialized sm_90a body kernel for __nv_bfloat16 elements, head dims 64 / 80 / 128 (attn_api.cpp dispatches
// here on compute capability 9.0; sm90/body_kernel.h). The kernel's body is compiled in the sm_90a pass
// only; the other architectures of the build get an empty kernel that is never launched.
#include "sm90/body_launch.h"

RANGESWA_INSTANTIATE_ATTN_HOPPER(__nv_bfloat16)
