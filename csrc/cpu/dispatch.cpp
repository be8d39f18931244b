// The choice of cpu/dispatch.h: RANGESWA_CPU_CAPABILITY when set, else ATen's capability, capped at what
// this CPU runs.
#include "cpu/dispatch.h"

#include <ATen/Version.h>
#include <c10/util/Exception.h>

#include <cstdlib>
#include <string>

namespace rangeswa::cpu {
namespace {

constexpr Capability kEvery[] = {Capability::kAvx512, Capability::kAvx2, Capability::kDefault};

Capability best_supported() {
  for (Capability c : kEvery)
    if (cpu_supports(c)) return c;
  return Capability::kDefault;
}

const KernelTable& choose() {
  const char* asked = std::getenv("RANGESWA_CPU_CAPABILITY");
  if (asked != nullptr && *asked != '\0') {
    const std::string name(asked);
    for (Capability c : kEvery) {
      if (name != capability_name(c)) continue;
      TORCH_CHECK(cpu_supports(c), "RANGESWA_CPU_CAPABILITY=", name, " asks for kernels this CPU cannot run (the best ",
                  "it runs is ", capability_name(best_supported()), "); unset it or name a capability up to that one");
      return kernel_table(c);
    }
    TORCH_CHECK(false, "RANGESWA_CPU_CAPABILITY is '", name, "'; expected avx512, avx2 or default (or unset it to ",
                "follow ATen's capability)");
  }
  // ATen's choice, after ATEN_CPU_CAPABILITY: "AVX512", "AVX2", "DEFAULT" or another architecture's names.
  const std::string aten = at::get_cpu_capability();
  Capability c = aten == "AVX512" ? Capability::kAvx512 : aten == "AVX2" ? Capability::kAvx2 : Capability::kDefault;
  while (!cpu_supports(c)) c = Capability(int(c) - 1);
  return kernel_table(c);
}

}  // namespace

const KernelTable& kernels() {
  static const KernelTable& table = choose();  // a throw leaves it unset, so the next call asks again
  return table;
}

}  // namespace rangeswa::cpu
