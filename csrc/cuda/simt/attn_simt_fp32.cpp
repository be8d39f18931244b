// attn_kernel<AttnTraits<float, 64 / 80 / 128>> through the host SIMT emulation (attn_simt.h).
#include "cuda/simt/attn_simt_impl.h"

RANGESWA_SIMT_INSTANTIATE(float)
