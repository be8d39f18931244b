// attn_kernel<AttnTraits<__nv_bfloat16, 64 / 80 / 128>> through the host SIMT emulation (attn_simt.h).
#include "cuda/simt/attn_simt_impl.h"

RANGESWA_SIMT_INSTANTIATE(__nv_bfloat16)
