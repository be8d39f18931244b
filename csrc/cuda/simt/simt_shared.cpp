// Shared memory and cp.async in the host SIMT runtime (simt_runtime.h). Shared memory is one buffer per OS
// thread, reused by its CTAs, filled with 0xff bytes at each CTA start (Options::poison_shared: NaN as
// float / bf16 / half, -1 as int) so that a read of shared memory no thread wrote shows up in the results;
// static shared variables are keyed by their declaration. cp.async copies land at the issuing thread's
// cp.async.wait_group 0, the latest point PTX allows; with Options::check_races, a shadow of the dynamic shared
// memory (per 16 bytes) reports an ldmatrix that reads bytes a cp.async has not landed yet, or that another
// warp's cp.async landed without a CTA barrier since (simt_warp.cpp), and a cp.async issued onto bytes another
// warp read with ldmatrix since the last CTA barrier (plain loads and stores of shared memory are not tracked).
// Torch-free.
#include <sstream>

#include "cuda/simt/simt_runtime.h"

namespace simt::runtime {

bool Worker::in_static(const unsigned char* p, size_t n) const {
  for (const StaticVar& v : statics) {
    const unsigned char* b = static_storage.data() + v.offset;
    if (p >= b && p + n <= b + v.bytes) return true;
  }
  return false;
}

std::string Worker::where(const unsigned char* p) const {
  std::ostringstream s;
  s << static_cast<const void*>(p);
  if (p >= dyn && p < dyn + dyn_size + 4096) s << " (dynamic shared offset " << (p - dyn) << " of " << dyn_size << ")";
  return s.str();
}

void* Worker::static_shared(const void* key, size_t bytes, size_t align) {
  for (const StaticVar& v : statics)
    if (v.key == key) return static_storage.data() + v.offset;
  align = std::max<size_t>(align, 16);
  const size_t offset = (static_used + align - 1) / align * align;
  if (offset + bytes > static_storage.size() || dyn_size + offset + bytes > opts.max_shared_bytes)
    fail("simt: static shared memory exceeds the CTA's shared memory limit");
  static_used = offset + bytes;
  statics.push_back({key, offset, bytes});
  return static_storage.data() + offset;
}

void Worker::cp_async(void* dst_, const void* src_, bool valid, Site site) {
  Fiber* f = t_fiber;
  auto* dst = static_cast<unsigned char*>(dst_);
  const auto* src = static_cast<const unsigned char*>(src_);
  if (reinterpret_cast<uintptr_t>(dst) % 16 || reinterpret_cast<uintptr_t>(src) % 16)
    fail("simt: cp.async 16 at " + site.str() + " by " + who(f->tid) + ": misaligned address (shared " + where(dst) +
         ", global " + [&] { std::ostringstream s; s << src_; return s.str(); }() + "; both must be 16-byte aligned)");
  if (!in_dynamic(dst, 16) && !in_static(dst, 16))
    fail("simt: cp.async 16 at " + site.str() + " by " + who(f->tid) + ": destination " + where(dst) +
         " outside the CTA's shared memory");
  if (valid && src == nullptr) fail("simt: cp.async 16 at " + site.str() + " by " + who(f->tid) + " reads a null pointer");
  ::simt::hopper::check_async_overwrite(dst, 16, site);  // a stage that a wgmma in flight still reads
  if (opts.check_races && in_dynamic(dst, 16)) {
    Chunk& c = shadow[(dst - dyn) / 16];
    if (c.inflight && c.inflight != f->tid + 1)
      fail("simt: cp.async at " + site.str() + " by " + who(f->tid) + " writes " + where(dst) + ", which " +
           who(c.inflight - 1) + "'s cp.async is still writing");
    if (c.read_gen == gen && c.reader != 0 && c.reader != f->tid / 32 + 1)
      fail("simt: cp.async at " + site.str() + " by " + who(f->tid) + " overwrites " + where(dst) + ", which " +
           (c.reader > 0 ? "warp " + std::to_string(c.reader - 1) : std::string("several warps")) +
           " read with ldmatrix since the last __syncthreads() (write-after-read race)");
    c.inflight = f->tid + 1;
  }
  f->uncommitted.push_back({dst, src, valid});
  if (opts.eager_copies) {  // the data is there at once; the bookkeeping (and the race checks) stay
    if (valid) std::memcpy(dst, src, 16);
    else std::memset(dst, 0, 16);
  }
  ++stats.cp_async;
}

void Worker::cp_commit() {
  Fiber* f = t_fiber;
  f->committed.insert(f->committed.end(), f->uncommitted.begin(), f->uncommitted.end());
  f->uncommitted.clear();
  f->group_ends.push_back(f->committed.size());  // an empty commit is an empty group (PTX)
}

void Worker::cp_wait_group(int pending) {
  Fiber* f = t_fiber;
  const size_t groups = f->group_ends.size();
  if (groups <= size_t(pending)) return;
  const size_t landed = f->group_ends[groups - size_t(pending) - 1];
  for (size_t i = 0; i < landed; ++i) {
    const Copy& c = f->committed[i];
    if (c.valid) std::memcpy(c.dst, c.src, 16);
    else std::memset(c.dst, 0, 16);
    if (opts.check_races && in_dynamic(c.dst, 16)) {
      Chunk& s = shadow[(c.dst - dyn) / 16];
      s.inflight = 0;
      s.landed = f->tid + 1;
      s.landed_gen = gen;
    }
  }
  f->committed.erase(f->committed.begin(), f->committed.begin() + std::ptrdiff_t(landed));
  f->group_ends.erase(f->group_ends.begin(), f->group_ends.end() - pending);
  for (size_t& end : f->group_ends) end -= landed;
}

}  // namespace simt::runtime

namespace simt {

using runtime::worker;

void cp_async_16(void* smem, const void* gmem, bool valid, Site site) { worker().cp_async(smem, gmem, valid, site); }
void cp_async_commit() { worker().cp_commit(); }
void cp_async_wait_all(Site) { worker().cp_wait_all(); }
void cp_async_wait_group(int pending, Site) { worker().cp_wait_group(pending); }
unsigned char* dynamic_shared() { return worker().dyn; }
size_t dynamic_shared_bytes() { return worker().dyn_size; }
int cp_async_in_flight(const void* shared) {
  runtime::Worker& w = worker();
  const auto* p = static_cast<const unsigned char*>(shared);
  return w.opts.check_races && w.in_dynamic(p, 1) ? w.shadow[size_t(p - w.dyn) / 16].inflight : 0;
}
void* static_shared(const void* key, size_t bytes, size_t align) { return worker().static_shared(key, bytes, align); }

}  // namespace simt
