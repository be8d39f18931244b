// The host SIMT runtime behind simt.h: fibers (one per CUDA thread, on their own stacks), a scheduler per OS
// thread that runs one CTA at a time, the warp collectives and CTA barriers as rendezvous, and the PTX
// semantics of shfl.sync, ldmatrix, mma.sync and cp.async. Torch-free. This file is the scheduler: the
// launch, one CTA's run, CTA barriers, exits and the deadlock report; simt_runtime.h has the shared state and
// names the other parts (fibers, warp collectives, shared memory and cp.async, memory faults).
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "cuda/simt/simt_runtime.h"

namespace simt {

std::string Site::str() const {
  const char* base = std::strrchr(file, '/');
  return std::string(base ? base + 1 : file) + ":" + std::to_string(line);
}

Options& options() {
  static Options o;
  return o;
}

std::vector<Extension>& extensions() {
  static std::vector<Extension> list;
  return list;
}

void add_extension(const Extension& e) { extensions().push_back(e); }

namespace runtime {

constinit __attribute__((tls_model("initial-exec"))) thread_local Worker* t_worker = nullptr;
constinit __attribute__((tls_model("initial-exec"))) thread_local Fiber* t_fiber = nullptr;

const char* barrier_name(Barrier b) {
  switch (b) {
    case Barrier::kSync: return "__syncthreads";
    case Barrier::kOr: return "__syncthreads_or";
    case Barrier::kAnd: return "__syncthreads_and";
    default: return "__syncthreads_count";
  }
}

std::string thread_list(const std::vector<int>& ids) {
  std::ostringstream s;
  for (size_t x = 0; x < ids.size();) {
    size_t y = x;
    while (y + 1 < ids.size() && ids[y + 1] == ids[y] + 1) ++y;
    if (x) s << ", ";
    s << ids[x];
    if (y > x) s << "-" << ids[y];
    x = y + 1;
  }
  return s.str();
}

// ---- CTA barriers (bar.sync 0 / bar.red): every thread of the CTA, at the same barrier ----
int Worker::barrier(Barrier kind, int pred, Site site) {
  Fiber* f = t_fiber;
  if (exited > 0) {
    std::vector<int> gone;
    for (int t = 0; t < nthreads; ++t)
      if (fibers[t]->state == State::kExited) gone.push_back(t);
    fail("simt: deadlock: " + who(f->tid) + " reached " + barrier_name(kind) + " at " + site.str() + ", but threads " +
         thread_list(gone) + " of the CTA have exited (a barrier in code not every thread runs)");
  }
  if (bar_arrived == 0) {
    bar_kind = kind;
    bar_site = site;
    bar_acc = kind == Barrier::kAnd ? 1 : 0;
  } else if (kind != bar_kind || !(site == bar_site)) {
    std::vector<int> waiting;
    for (int t = 0; t < nthreads; ++t)
      if (fibers[t]->state == State::kBarrier) waiting.push_back(t);
    fail("simt: divergent barrier (deadlock or undefined behaviour): " + who(f->tid) + " reached " +
         barrier_name(kind) + " at " + site.str() + " while threads " + thread_list(waiting) + " wait at " +
         barrier_name(bar_kind) + " at " + bar_site.str());
  }
  switch (kind) {
    case Barrier::kOr: bar_acc |= pred; break;
    case Barrier::kAnd: bar_acc &= pred; break;
    case Barrier::kCount: bar_acc += pred; break;
    default: break;
  }
  f->site = site;
  if (++bar_arrived < nthreads) {
    f->state = State::kBarrier;
    yield(f);
    return bar_result;
  }
  bar_arrived = 0;
  bar_result = bar_acc;
  ++gen;
  ++stats.barriers;
  for (int t = 0; t < nthreads; ++t)
    if (t != f->tid) release(t);
  return bar_result;
}

// ---- exits ----
void Worker::on_exit(Fiber* f) {
  f->state = State::kExited;
  ++exited;
  WarpSlot& ws = warps[f->tid / 32];
  ++ws.exited;
  if (!error.empty()) return;
  if (ws.arrived > 0) {
    std::vector<int> waiting;
    for (int l = 0; l < 32 && (f->tid / 32) * 32 + l < nthreads; ++l)
      if (fibers[(f->tid / 32) * 32 + l]->state == State::kWarp) waiting.push_back(l);
    error = who(f->tid) + " exited while lanes " + thread_list(waiting) + " of its warp wait at " +
            kind_name(ws.kind, ws.sub) + " at " + ws.site.str() + " (the full-warp collective would hang)";
  } else if (bar_arrived > 0) {
    std::vector<int> waiting;
    for (int t = 0; t < nthreads; ++t)
      if (fibers[t]->state == State::kBarrier) waiting.push_back(t);
    error = "deadlock: " + who(f->tid) + " exited while threads " + thread_list(waiting) + " wait at " +
            barrier_name(bar_kind) + " at " + bar_site.str();
  }
}

std::string Worker::stall_report() const {
  std::ostringstream s;
  s << "deadlock: no thread can run;";
  std::vector<int> exit_ids;
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (int t = 0; t < nthreads; ++t) {
    const Fiber& f = *fibers[t];
    std::string what;
    if (f.state == State::kExited) {
      exit_ids.push_back(t);
      continue;
    }
    if (f.state == State::kBarrier) what = std::string(barrier_name(bar_kind)) + " at " + f.site.str();
    else if (f.state == State::kPoll) what = f.poll_what + " at " + f.site.str();
    else what = std::string(kind_name(warps[t / 32].kind, warps[t / 32].sub)) + " at " + f.site.str();
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == what; });
    if (it == groups.end()) groups.push_back({what, {t}});
    else it->second.push_back(t);
  }
  for (const auto& g : groups) s << " threads " << thread_list(g.second) << " wait at " << g.first << ";";
  if (!exit_ids.empty()) s << " threads " << thread_list(exit_ids) << " exited;";
  return s.str();
}

// ---- one CTA ----
void Worker::prepare(dim3 g, dim3 b, size_t smem) {
  grid = g;
  block = b;
  nthreads = int(b.x * b.y * b.z);
  const size_t stack = std::max<size_t>(opts.stack_bytes, 64 * 1024);
  while (int(fibers.size()) < nthreads) {
    fibers.push_back(std::make_unique<Fiber>());
    fibers.back()->allocate(stack);
    fibers.back()->worker = this;
  }
  warps.assign((nthreads + 31) / 32, WarpSlot{});
  dyn_size = smem;
  dyn_storage.assign(smem + 128, 0);
  dyn = dyn_storage.data() + (128 - reinterpret_cast<uintptr_t>(dyn_storage.data()) % 128) % 128;
  static_storage.assign(64 * 1024, 0);
  shadow.assign((smem + 15) / 16, Chunk{});
}

void Worker::run_cta(int64_t b) {
  linear_block = b;
  bidx = uint3{unsigned(b % grid.x), unsigned((b / grid.x) % grid.y), unsigned(b / (int64_t(grid.x) * grid.y))};
  exited = 0;
  bar_arrived = 0;
  gen = 1;
  error.clear();
  for (WarpSlot& w : warps) w = WarpSlot{};
  for (const Extension& e : extensions())
    if (e.cta_start) e.cta_start();
  statics.clear();
  static_used = 0;
  if (opts.poison_shared) {
    std::memset(dyn, 0xff, dyn_size);
    std::memset(static_storage.data(), 0xff, static_storage.size());
  }
  if (opts.check_races) std::fill(shadow.begin(), shadow.end(), Chunk{});
  order.resize(nthreads);
  for (int t = 0; t < nthreads; ++t) order[t] = t;
  for (int t = 0; t < nthreads; ++t) {
    Fiber& f = *fibers[t];
    f.tid = t;
    f.idx = uint3{unsigned(t % block.x), unsigned((t / block.x) % block.y), unsigned(t / (block.x * block.y))};
    f.state = State::kReady;
    f.uncommitted.clear();
    f.committed.clear();
    f.group_ends.clear();
    make_context(f.ctx, f.stack, f.stack_size(), &fiber_main, &f);
  }
  uint64_t rng = opts.schedule_seed * 0x9E3779B97F4A7C15ull + uint64_t(b);
  while (exited < nthreads) {
    if (opts.schedule_seed != 0) {  // a random order of the threads for this pass (Fisher-Yates)
      for (int t = nthreads - 1; t > 0; --t) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        std::swap(order[t], order[int((rng >> 33) % uint64_t(t + 1))]);
      }
    }
    // One pass: the ready fibers in order, each handing over to the next (leave()); back here at its end.
    cursor = -1;
    Context& first = leave();
    if (&first == &sched) {
      // Nobody can run: an extension may still make progress (the hopper emulation lands a TMA copy).
      bool progressed = false;
      try {
        for (const Extension& e : extensions())
          if (!progressed && e.idle) progressed = e.idle();
      } catch (const std::exception& e) {
        throw Error(context() + e.what());
      }
      if (progressed) continue;
      throw Error(context() + stall_report());
    }
    switch_context(sched, first);
    t_fiber = nullptr;
    if (faulted) throw Error(context() + error + fault_report());
    if (!error.empty()) throw Error(context() + error);
  }
  try {
    for (const Extension& e : extensions())
      if (e.cta_end) e.cta_end();
  } catch (const std::exception& e) {
    throw Error(context() + e.what());
  }
  ++stats.ctas;
}

std::string Worker::context() const {
  std::ostringstream s;
  s << "simt: CTA blockIdx (" << bidx.x << ", " << bidx.y << ", " << bidx.z << ") of grid (" << grid.x << ", "
    << grid.y << ", " << grid.z << "), " << nthreads << " threads: ";
  return s.str();
}

void fiber_main(void* arg) {
  Fiber* f = static_cast<Fiber*>(arg);
  Worker* w = f->worker;
  {
    std::string err;
    try {
      (*w->body)();
    } catch (const std::exception& e) {
      err = e.what();
    } catch (...) {
      err = "unknown exception";
    }
    if (!err.empty()) {
      if (w->error.empty()) w->error = w->who(f->tid) + ": " + err;
      f->state = State::kExited;
      ++w->exited;
    } else {
      w->on_exit(f);
    }
  }
  switch_context(f->ctx, w->leave());
  std::abort();  // an exited fiber is never resumed
}

}  // namespace runtime

namespace {

std::mutex g_stats_mutex;
Stats g_last_stats;

}  // namespace

using namespace runtime;

void device_fail(const char* format, ...) {
  char message[1024];
  va_list args;
  va_start(args, format);
  std::vsnprintf(message, sizeof message, format, args);
  va_end(args);
  std::string text(message);
  while (!text.empty() && text.back() == '\n') text.pop_back();
  throw Error("device-side assertion: " + text);
}

uint3 thread_idx() {
  worker();
  return t_fiber->idx;
}
uint3 block_idx() { return worker().bidx; }
dim3 block_dim() { return worker().block; }
dim3 grid_dim() { return worker().grid; }

int barrier(Barrier kind, int predicate, Site site) { return worker().barrier(kind, predicate, site); }


int thread_rank() {
  worker();
  return t_fiber->tid;
}
int block_threads() { return worker().nthreads; }
std::pair<const char*, const char*> thread_stack() {
  worker();
  return {t_fiber->stack, t_fiber->stack + t_fiber->stack_size()};
}

void wait_until(const std::function<bool()>& ready, const std::string& what, Site site) {
  Worker& w = worker();
  if (ready()) return;
  Fiber* f = t_fiber;
  f->poll = &ready;
  f->poll_what = what;
  f->site = site;
  f->state = State::kPoll;
  w.yield(f);  // back here once the scheduler found ready() true
  f->poll = nullptr;
}

void launch_body(dim3 grid, dim3 block, size_t smem, const std::function<void()>& body) {
  const Options opts = options();
  const int64_t ctas = int64_t(grid.x) * grid.y * grid.z;
  const int64_t threads = int64_t(block.x) * block.y * block.z;
  if (threads <= 0 || threads > 1024) throw Error("simt: " + std::to_string(threads) + " threads per CTA (1..1024)");
  if (grid.y > 65535 || grid.z > 65535)  // the device's limits (grid.x is an unsigned below 2^31 by its type's use)
    throw Error("simt: grid (" + std::to_string(grid.x) + ", " + std::to_string(grid.y) + ", " + std::to_string(grid.z) +
                ") exceeds the device's 65535 CTAs in y or z");
  if (smem > opts.max_shared_bytes)
    throw Error("simt: " + std::to_string(smem) + " bytes of dynamic shared memory per CTA exceed the limit of " +
                std::to_string(opts.max_shared_bytes));
  if (t_fiber != nullptr) throw Error("simt: launch from inside a kernel");
  Stats total;
  if (ctas > 0) {
    int workers = opts.workers;
    if (workers <= 0) {
      const char* env = std::getenv("RANGESWA_SIMT_THREADS");
      workers = env ? std::atoi(env) : int(std::thread::hardware_concurrency());
    }
    workers = int(std::max<int64_t>(1, std::min<int64_t>(std::max(workers, 1), ctas)));
    std::atomic<int64_t> next{0};
    std::atomic<bool> stop{false};
    std::mutex m;
    int64_t error_block = -1;
    std::string error;
    install_fault_handler();
    auto work = [&] {
      Worker w(opts);
      w.body = &body;
      // The fault handler's stack, for this OS thread while it runs CTAs.
      w.altstack.assign(64 * 1024, 0);
      stack_t alt{}, old_alt{};
      alt.ss_sp = w.altstack.data();
      alt.ss_size = w.altstack.size();
      sigaltstack(&alt, &old_alt);
      Worker* saved = t_worker;
      t_worker = &w;
      try {
        w.prepare(grid, block, smem);
        for (;;) {
          if (stop.load(std::memory_order_relaxed)) break;
          const int64_t b = next.fetch_add(1);
          if (b >= ctas) break;
          try {
            w.run_cta(b);
          } catch (const std::exception& e) {
            std::lock_guard<std::mutex> lock(m);
            if (error_block < 0 || b < error_block) {
              error_block = b;
              error = e.what();
            }
            stop = true;
            break;
          }
        }
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(m);
        if (error.empty()) error = e.what();
        stop = true;
      }
      t_worker = saved;
      sigaltstack(&old_alt, nullptr);
      std::lock_guard<std::mutex> lock(m);
      total.ctas += w.stats.ctas;
      total.switches += w.stats.switches;
      total.warp_collectives += w.stats.warp_collectives;
      total.barriers += w.stats.barriers;
      total.mmas += w.stats.mmas;
      total.ldmatrix += w.stats.ldmatrix;
      total.cp_async += w.stats.cp_async;
    };
    if (workers == 1) {
      work();
    } else {
      std::vector<std::thread> pool;
      for (int x = 0; x < workers; ++x) pool.emplace_back(work);
      for (std::thread& t : pool) t.join();
    }
    for (const Extension& e : extensions())
      if (e.launch_end) e.launch_end();
    if (!error.empty()) throw Error(error);
  }
  std::lock_guard<std::mutex> lock(g_stats_mutex);
  g_last_stats = total;
}

Stats last_stats() {
  std::lock_guard<std::mutex> lock(g_stats_mutex);
  return g_last_stats;
}

}  // namespace simt
