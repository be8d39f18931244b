// One instantiation of the fused attention kernel (static_switch.h dispatches here).
#include "attn_launch.h"

RANGESWA_INSTANTIATE_ATTN(__half, 80)
