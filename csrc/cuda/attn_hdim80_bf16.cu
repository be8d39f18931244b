// One instantiation of the fused attention kernel (attn_api.cpp dispatches here).
#include "sm80/attn_launch.h"

RANGESWA_INSTANTIATE_ATTN(__nv_bfloat16, 80)
