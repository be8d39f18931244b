// Fibers of the host SIMT runtime (simt_runtime.h): one per CUDA thread, on its own mmap'd stack with a guard
// page below it, switched by a 6-register stack switch on x86-64 (swapcontext elsewhere, or with
// -DRANGESWA_SIMT_UCONTEXT). Torch-free.
#include <sys/mman.h>
#include <unistd.h>

#include "cuda/simt/simt_runtime.h"

namespace simt::runtime {

#if !defined(RSWA_SIMT_UCONTEXT)
// A new fiber's stack holds a frame whose return address is rswa_simt_start, which calls fn(arg) (r13, r12)
// with the stack 16-byte aligned.
extern "C" void rswa_simt_start();
asm(R"(
  .text
  .p2align 4
  .globl rswa_simt_switch
  .hidden rswa_simt_switch
  .type rswa_simt_switch,@function
rswa_simt_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size rswa_simt_switch,.-rswa_simt_switch

  .p2align 4
  .globl rswa_simt_start
  .hidden rswa_simt_start
  .type rswa_simt_start,@function
rswa_simt_start:
  movq %r12, %rdi
  callq *%r13
  ud2
  .size rswa_simt_start,.-rswa_simt_start
)");

void make_context(Context& c, char* stack, size_t size, void (*fn)(void*), void* arg) {
  const uintptr_t top = (reinterpret_cast<uintptr_t>(stack) + size) & ~uintptr_t(15);
  void** sp = reinterpret_cast<void**>(top) - 7;
  sp[0] = nullptr;                                       // r15
  sp[1] = nullptr;                                       // r14
  sp[2] = reinterpret_cast<void*>(fn);                   // r13
  sp[3] = arg;                                           // r12
  sp[4] = nullptr;                                       // rbx
  sp[5] = nullptr;                                       // rbp
  sp[6] = reinterpret_cast<void*>(&rswa_simt_start);     // return address
  c.sp = sp;
}
#else
namespace {

void (*g_entry)(void*) = nullptr;
void ucontext_entry(unsigned lo, unsigned hi) {
  void* arg = reinterpret_cast<void*>((uintptr_t(hi) << 32) | uintptr_t(lo));
  g_entry(arg);
}

}  // namespace

void make_context(Context& c, char* stack, size_t size, void (*fn)(void*), void* arg) {
  g_entry = fn;
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = size;
  c.uc.uc_link = nullptr;
  const uintptr_t a = reinterpret_cast<uintptr_t>(arg);
  makecontext(&c.uc, reinterpret_cast<void (*)()>(&ucontext_entry), 2, unsigned(a), unsigned(a >> 32));
}
#endif

Fiber::~Fiber() {
  if (stack) munmap(stack - page(), mapped);
}

size_t Fiber::page() {
  static const size_t p = size_t(sysconf(_SC_PAGESIZE));
  return p;
}

void Fiber::allocate(size_t bytes) {
  bytes = (bytes + page() - 1) / page() * page();
  mapped = bytes + page();
  void* m = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) throw Error("simt: cannot map a fiber stack");
  mprotect(m, page(), PROT_NONE);  // overflow faults instead of corrupting the neighbour
  stack = static_cast<char*>(m) + page();
}

}  // namespace simt::runtime
