// One instantiation of the fused attention kernel (attn_api.cpp dispatches here).
#include "sm80/attn_launch.h"

RANGESWA_INSTANTIATE_ATTN(__half, 64)
RANGESWA_INSTANTIATE_CONTROL_FOLD(__half, 64)
