// The kernels of cpu/kernels_body.h for the baseline of the CPU the extension is built for
// (RANGESWA_CPU_CAPABILITY=default): any x86-64, or other architectures, where it is the only build.
#include "cpu/kernels_body.h"
