// hopper_attn_kernel<HopperTraits<__nv_bfloat16, 64 / 80 / 128>> (with its control CTAs on attn_kernel) through the
// host SIMT emulation (attn_simt.h).
#include "cuda/simt/attn_simt_hopper_impl.h"

RANGESWA_SIMT_INSTANTIATE_HOPPER(__nv_bfloat16)
