// Memory faults in the host SIMT runtime (simt_runtime.h): a SIGSEGV / SIGBUS of a fiber is the GPU's
// "illegal memory access", reported with the faulting address, the instruction and (addr2line, the build's
// -g1) the source line; GuardedCopy puts a global array against an inaccessible page so that an access past
// its end faults. Torch-free.
#include <dlfcn.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <mutex>
#include <sstream>

#include "cuda/simt/simt_runtime.h"

namespace simt::runtime {

std::string Worker::fault_report() const {
  std::ostringstream s;
  s << "illegal memory access (signal) at address " << fault_addr << ", pc " << fault_pc;
  Dl_info info{};
  if (fault_pc && dladdr(fault_pc, &info) && info.dli_fname) {
    const uintptr_t offset = reinterpret_cast<uintptr_t>(fault_pc) - reinterpret_cast<uintptr_t>(info.dli_fbase);
    s << " = " << info.dli_fname << " + 0x" << std::hex << offset << std::dec;
    if (info.dli_sname) s << " (" << info.dli_sname << ")";
    // Source line, when addr2line is there and the library has line tables (-g1).
    char cmd[1024];
    std::snprintf(cmd, sizeof cmd, "addr2line -C -f -i -e '%s' 0x%lx 2>/dev/null", info.dli_fname,
                  static_cast<unsigned long>(offset));
    if (FILE* pipe = popen(cmd, "r")) {
      char line[1024];
      std::string where;
      while (std::fgets(line, sizeof line, pipe)) where += line;
      pclose(pipe);
      for (char& c : where)
        if (c == '\n') c = ' ';
      if (!where.empty() && where.find("??") != 0) s << "; addr2line: " << where;
    }
  }
  return s.str();
}

namespace {

// SIGSEGV / SIGBUS in a fiber: recorded as the CTA's error, and the fiber leaves for the scheduler at once (its
// stack is abandoned, like the rest of the failed CTA). Outside fibers the previous handler runs.
struct sigaction g_old_segv, g_old_bus;

void fault_handler(int sig, siginfo_t* info, void* uctx) {
  Worker* w = t_worker;
  Fiber* f = t_fiber;
  if (w == nullptr || f == nullptr) {
    const struct sigaction& old = sig == SIGSEGV ? g_old_segv : g_old_bus;
    if (old.sa_flags & SA_SIGINFO) {
      if (old.sa_sigaction) old.sa_sigaction(sig, info, uctx);
      return;
    }
    if (old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN && old.sa_handler != nullptr) {
      old.sa_handler(sig);
      return;
    }
    signal(sig, SIG_DFL);  // re-faults into the default action
    return;
  }
  w->faulted = true;
  w->fault_addr = info->si_addr;
#if defined(__x86_64__)
  w->fault_pc = reinterpret_cast<const void*>(static_cast<ucontext_t*>(uctx)->uc_mcontext.gregs[REG_RIP]);
#endif
  if (w->error.empty()) w->error = w->who(f->tid) + ": ";
  f->state = State::kExited;
  ++w->exited;
  switch_context(f->ctx, w->sched);  // never returns (SA_NODEFER: the signal stays unblocked)
}

}  // namespace

void install_fault_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = &fault_handler;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_old_segv);
    sigaction(SIGBUS, &sa, &g_old_bus);
  });
}

}  // namespace simt::runtime

namespace simt {

GuardedCopy::GuardedCopy(const void* data, size_t bytes) : bytes_(bytes) {
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  const size_t padded = (bytes + 15) / 16 * 16;
  mapped_ = (padded + page - 1) / page * page + page;
  map_ = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (map_ == MAP_FAILED) throw Error("simt: cannot map a guarded copy");
  char* guard = static_cast<char*>(map_) + mapped_ - page;
  mprotect(guard, page, PROT_NONE);
  data_ = guard - padded;
  if (bytes) std::memcpy(data_, data, bytes);
}

GuardedCopy::~GuardedCopy() {
  if (map_ && map_ != MAP_FAILED) munmap(map_, mapped_);
}

}  // namespace simt
