// Copies involving CUDA memory: host (pageable or pinned) <-> device and device <-> device, any two layouts.
//
// Dense pairs whose strides agree are one cuMemcpyAsync. Other layouts: on the device, tensorwire's kernels
// (kernels.cu, see kernel_abi.h) after the same dimension simplification as the host engine (copy/plan.hpp); on the
// host, the host copy engine into or out of pinned staging, so that the bytes crossing the bus are always dense.
// Every asynchronous step keeps the Buffers it reads or writes alive until an event recorded after it completes
// (hold()), so a caller may drop its tensors as soon as the copy is queued.
#include "cuda/copy.hpp"

#include <algorithm>
#include <deque>
#include <map>
#include <mutex>
#include <vector>

#include "copy/plan.hpp"
#include "cuda/kernel_abi.h"
#include "cuda/pool.hpp"
#include "tensorwire/copy.hpp"
#include "tensorwire/error.hpp"

namespace tw::cuda::detail {
namespace {

// ---- keep-alive of buffers used by queued work -----------------------------------------------------------------
struct Pending {
  CUevent event = nullptr;
  std::vector<std::shared_ptr<Buffer>> keep;
  int device = 0;
  std::vector<std::shared_ptr<Buffer>> scratch;  // blocks of pool(device), settled when the event is done
};
std::mutex g_pending_mu;
std::deque<Pending>* g_pending = new std::deque<Pending>();  // never destroyed: buffers may be held at exit

void reset_pending() {
  std::lock_guard lk(g_pending_mu);
  g_pending->clear();  // a fake driver swap: events of the old one mean nothing
}
const bool g_registered = (register_reset(&reset_pending), true);

}  // namespace

void poll_pending() noexcept {
  (void)g_registered;
  if (forked_child()) return;  // (the parent's work and lock: driver.hpp)
  std::vector<Pending> done;
  std::vector<bool> ok;  // the work succeeded: its scratch blocks are free of it
  {
    std::lock_guard lk(g_pending_mu);
    if (g_pending->empty()) return;
    const Api& a = driver().api;
    for (auto it = g_pending->begin(); it != g_pending->end();) {
      if (const CUresult r = with_context(it->device, [&] { return a.cuEventQuery(it->event); }); r != kErrorNotReady) {
        ok.push_back(r == kSuccess);
        done.push_back(std::move(*it));
        it = g_pending->erase(it);
      } else {
        ++it;
      }
    }
  }
  for (size_t i = 0; i < done.size(); ++i) {
    Pending& p = done[i];
    with_context(p.device, [&] { return driver().api.cuEventDestroy(p.event); });
    // (Failed work may still touch its scratch: those keep their stream, and the pool's failure path drops them.)
    if (ok[i])
      for (const auto& b : p.scratch) pool(p.device).settle(reinterpret_cast<uintptr_t>(b->base()));
  }
  // the buffers go back to their owners here, outside the lock
}

void hold(int device, intptr_t stream, std::vector<std::shared_ptr<Buffer>> keep,
          std::vector<std::shared_ptr<Buffer>> scratch) {
  const Api& a = api("CUDA copy");
  ContextGuard g(device);
  CUevent ev = nullptr;
  if (CUresult r = a.cuEventCreate(&ev, kEventDisableTiming); r != kSuccess) {
    a.cuStreamSynchronize(as_stream(stream));  // (as below: no event, so the work is waited for before `keep` goes)
    check(r, "cuEventCreate");
  }
  if (CUresult r = a.cuEventRecord(ev, as_stream(stream)); r != kSuccess) {
    a.cuEventDestroy(ev);
    // Cannot tell when the work is done: wait for it now rather than free memory it may still use.
    a.cuStreamSynchronize(as_stream(stream));
    check(r, "cuEventRecord");
  }
  std::lock_guard lk(g_pending_mu);
  g_pending->push_back(Pending{ev, std::move(keep), device, std::move(scratch)});
}

void wait_all_pending() {
  if (forked_child()) return;
  std::deque<Pending> all;
  {
    std::lock_guard lk(g_pending_mu);
    all.swap(*g_pending);
  }
  const Api& a = driver().api;
  const RelaxedCapture relaxed;
  for (auto& p : all) {
    const bool done = with_context(p.device, [&] { return a.cuEventSynchronize(p.event); }) == kSuccess;
    with_context(p.device, [&] { return a.cuEventDestroy(p.event); });
    if (done)
      for (const auto& b : p.scratch) pool(p.device).settle(reinterpret_cast<uintptr_t>(b->base()));
  }
}

void stream_wait(int device, intptr_t producer, intptr_t consumer) { stream_wait(device, producer, device, consumer); }

void stream_wait(int producer_device, intptr_t producer, int consumer_device, intptr_t consumer) {
  if (producer == consumer && producer_device == consumer_device) return;
  const Api& a = api("order CUDA streams");
  CUevent ev = nullptr;
  CUresult r = kSuccess;
  {
    ContextGuard g(producer_device);
    check(a.cuEventCreate(&ev, kEventDisableTiming), "cuEventCreate");
    r = a.cuEventRecord(ev, as_stream(producer));
  }
  if (r == kSuccess) {
    ContextGuard g(consumer_device);  // a stream may wait on another device's event
    r = a.cuStreamWaitEvent(as_stream(consumer), ev, 0);
  }
  with_context(producer_device, [&] { return a.cuEventDestroy(ev); });  // (the wait already captured it)
  check(r, "cuEventRecord/cuStreamWaitEvent");
}

void event_wait(int device, void* event, intptr_t consumer, bool unless_done) {
  const Api& a = api("wait for a CUDA event");
  ContextGuard g(device);
  if (unless_done && a.cuEventQuery(static_cast<CUevent>(event)) == kSuccess) return;
  check(a.cuStreamWaitEvent(as_stream(consumer), static_cast<CUevent>(event), 0), "cuStreamWaitEvent");
}

namespace {
// Every DeviceStreams (each lives as long as the process), for the reset hook. The hook is registered at load time,
// never under g_streams_mu: a driver swap holds the reset lock while it calls the hook, which takes g_streams_mu.
std::mutex g_streams_mu;
std::vector<DeviceStreams*>* g_streams = new std::vector<DeviceStreams*>();  // never destroyed
void reset_device_streams() {
  std::lock_guard lk(g_streams_mu);
  for (DeviceStreams* d : *g_streams) d->forget();  // a fake driver swap: the old one's streams mean nothing
}
const bool g_streams_registered = (register_reset(&reset_device_streams), true);
}  // namespace

DeviceStreams::DeviceStreams() {
  (void)g_streams_registered;
  std::lock_guard lk(g_streams_mu);
  g_streams->push_back(this);
}

void DeviceStreams::forget() {
  std::lock_guard lk(mu_);
  streams_.clear();
}

intptr_t DeviceStreams::get(int device) {
  const Api& a = api("make a CUDA stream");
  std::lock_guard lk(mu_);
  auto it = streams_.find(device);
  if (it != streams_.end()) return it->second;
  if (!a.cuStreamCreate) throw Error(ErrorCode::unsupported, "the NVIDIA driver lacks cuStreamCreate");
  ContextGuard g(device);
  CUstream s = nullptr;
  check(a.cuStreamCreate(&s, kStreamNonBlocking), "cuStreamCreate");
  streams_.emplace(device, reinterpret_cast<intptr_t>(s));
  return reinterpret_cast<intptr_t>(s);
}

intptr_t own_stream(int device) {
  static auto* own = new DeviceStreams();  // never destroyed: the streams outlive exit
  return own->get(device);
}

intptr_t idle_stream(int device) {
  static auto* idle = new DeviceStreams();  // never destroyed: the streams outlive exit
  return idle->get(device);
}

// ---- kernels -----------------------------------------------------------------------------------------------------
namespace {

constexpr const char* kStridedNames[5] = {"tw_strided_copy_u1", "tw_strided_copy_u2", "tw_strided_copy_u4",
                                          "tw_strided_copy_u8", "tw_strided_copy_u16"};
constexpr const char* kTransposeNames[4] = {"tw_transpose_u1", "tw_transpose_u2", "tw_transpose_u4", "tw_transpose_u8"};

struct Module {
  CUmodule module = nullptr;
  CUfunction strided[5] = {};
  CUfunction transpose[4] = {};
};
std::mutex g_mod_mu;
std::deque<Module>* g_modules = new std::deque<Module>();  // grows at the end: references stay valid

void reset_modules() {
  std::lock_guard lk(g_mod_mu);
  g_modules->clear();
}
const bool g_mod_registered = (register_reset(&reset_modules), true);

const Module& module_for(int device) {
  (void)g_mod_registered;
  if (!kernels_built())
    throw Error(ErrorCode::unsupported,
                "this layout needs tensorwire's CUDA copy kernels, and this build of tensorwire has none (it was "
                "built without nvcc); copy through a dense layout first (contiguous() on the host)");
  std::lock_guard lk(g_mod_mu);
  if (g_modules->size() <= static_cast<size_t>(device)) g_modules->resize(static_cast<size_t>(device) + 1);
  Module& m = (*g_modules)[static_cast<size_t>(device)];
  if (!m.module) {
    const Api& a = api("load tensorwire's CUDA kernels");
    ContextGuard g(device);
    CUmodule mod = nullptr;
    if (CUresult r = a.cuModuleLoadData(&mod, tw_cuda_fatbin); r != kSuccess)
      throw Error(ErrorCode::unsupported,
                  "loading tensorwire's CUDA kernels on cuda:" + std::to_string(device) + " failed: " +
                      result_name(r) + " (they are built for " + tw_cuda_fatbin_archs +
                      ", which the driver compiles for newer GPUs; PTX of this nvcc needs a driver at least as new as "
                      "its toolkit)");
    // A module missing a kernel is unloaded (not kept half-resolved, nor leaked: the next call loads it afresh).
    Module found;
    auto lookup = [&](CUfunction* f, const char* name) {
      if (CUresult r = a.cuModuleGetFunction(f, mod, name); r != kSuccess) {
        if (a.cuModuleUnload) a.cuModuleUnload(mod);
        throw Error(ErrorCode::unsupported, std::string("tensorwire's CUDA kernels on cuda:") + std::to_string(device) +
                                                " lack " + name + ": " + result_name(r) +
                                                " (the embedded image does not match this build)");
      }
    };
    for (int i = 0; i < 5; ++i) lookup(&found.strided[i], kStridedNames[i]);
    for (int i = 0; i < 4; ++i) lookup(&found.transpose[i], kTransposeNames[i]);
    found.module = mod;
    m = found;
  }
  return m;
}

int log2_unit(int64_t w) { return w == 1 ? 0 : w == 2 ? 1 : w == 4 ? 2 : w == 8 ? 3 : 4; }

}  // namespace

bool kernels_built_impl() noexcept { return tw_cuda_fatbin_size > 0; }

KernelPlan plan_device_copy(const Layout& src, uintptr_t src0, const Layout& dst, uintptr_t dst0, size_t isz) {
  const tw::detail::CopyDims c = tw::detail::simplify_copy(src, dst, isz);
  KernelPlan p;
  p.src = src0 + static_cast<uintptr_t>(c.src_start);
  p.dst = dst0 + static_cast<uintptr_t>(c.dst_start);
  // The widest unit every address and stride allows.
  int64_t w = 16;
  auto fits = [&](int64_t x) { return x % w == 0; };
  while (w > 1) {
    const auto uw = static_cast<uintptr_t>(w);
    bool ok = static_cast<int64_t>(isz) % w == 0 && p.src % uw == 0 && p.dst % uw == 0;
    for (int i = 0; ok && i < c.nd; ++i) ok = fits(c.ss[i]) && fits(c.ds[i]);
    if (ok) break;
    w /= 2;
  }
  p.unit = w;
  int nd = 0;
  for (int i = 0; i < c.nd; ++i) {
    p.n[nd] = c.n[i];
    p.ss[nd] = c.ss[i] / w;
    p.ds[nd] = c.ds[i] / w;
    ++nd;
  }
  const int64_t per = static_cast<int64_t>(isz) / w;
  if (per > 1) {
    // An element wider than a unit: an inner dimension of units, merged with the innermost when contiguous.
    if (nd > 0 && p.ss[nd - 1] == per && p.ds[nd - 1] == per) {
      p.n[nd - 1] *= per;
      p.ss[nd - 1] = 1;
      p.ds[nd - 1] = 1;
    } else {
      if (nd >= static_cast<int>(kMaxRank))
        throw Error(ErrorCode::unsupported, "CUDA copy: rank " + std::to_string(nd) + " with wide elements exceeds " +
                                                std::to_string(kMaxRank) + " dimensions after simplification");
      p.n[nd] = per;
      p.ss[nd] = 1;
      p.ds[nd] = 1;
      ++nd;
    }
  }
  p.nd = nd;
  p.numel = 1;
  for (int i = 0; i < nd; ++i) p.numel *= p.n[i];
  if (nd == 1 && p.ss[0] == 1 && p.ds[0] == 1) {
    p.kind = KernelPlan::Kind::memcpy;
    return p;
  }
  // Transpose: the destination contiguous innermost, the source contiguous along another dimension.
  const int in = nd - 1;
  if (w <= 8 && nd >= 2 && p.ds[in] == 1 && p.ss[in] != 0 && p.ss[in] != 1 && p.n[in] >= 8) {
    for (int k = nd - 2; k >= 0; --k)
      if (p.ss[k] == 1 && p.n[k] >= 8) {
        p.kind = KernelPlan::Kind::transpose;
        p.row_dim = k;
        break;
      }
  }
  if (p.kind != KernelPlan::Kind::transpose) p.kind = KernelPlan::Kind::strided;
  return p;
}

void launch(int device, const KernelPlan& p, intptr_t stream) {
  const Api& a = api("CUDA copy");
  ContextGuard g(device);
  if (p.kind == KernelPlan::Kind::memcpy) {
    check(a.cuMemcpyAsync(static_cast<CUdeviceptr>(p.dst), static_cast<CUdeviceptr>(p.src),
                          static_cast<size_t>(p.numel * p.unit), as_stream(stream)),
          "cuMemcpyAsync");
    return;
  }
  const Module& m = module_for(device);
  const int u = log2_unit(p.unit);
  if (p.kind == KernelPlan::Kind::transpose) {
    tw_cuda_transpose_params t{};
    t.src = p.src;
    t.dst = p.dst;
    const int r = p.row_dim, c = p.nd - 1;
    t.rows = p.n[r];
    t.cols = p.n[c];
    t.src_row_stride = p.ss[r];
    t.src_col_stride = p.ss[c];
    t.dst_row_stride = p.ds[r];
    t.dst_col_stride = p.ds[c];
    t.batch = 1;
    int b = 0;
    for (int i = 0; i < p.nd - 1; ++i) {
      if (i == r) continue;
      t.batch_shape[b] = p.n[i];
      t.batch_src_stride[b] = p.ss[i];
      t.batch_dst_stride[b] = p.ds[i];
      t.batch *= p.n[i];
      ++b;
    }
    t.batch_ndim = b;
    void* args[] = {&t};
    const auto gx = static_cast<unsigned>((t.cols + TW_CUDA_TILE - 1) / TW_CUDA_TILE);
    const auto gy = static_cast<unsigned>((t.rows + TW_CUDA_TILE - 1) / TW_CUDA_TILE);
    if ((t.cols + TW_CUDA_TILE - 1) / TW_CUDA_TILE > 0x7fffffff || (t.rows + TW_CUDA_TILE - 1) / TW_CUDA_TILE > 65535) {
      KernelPlan q = p;
      q.kind = KernelPlan::Kind::strided;
      launch(device, q, stream);
      return;
    }
    const auto gz = static_cast<unsigned>(std::min<int64_t>(t.batch, 65535));
    check(a.cuLaunchKernel(m.transpose[u], gx, gy, gz, TW_CUDA_TILE, TW_CUDA_TILE_ROWS, 1, 0, as_stream(stream), args,
                           nullptr),
          kTransposeNames[u]);
    return;
  }
  tw_cuda_strided_params s{};
  s.src = p.src;
  s.dst = p.dst;
  s.numel = p.numel;
  s.ndim = p.nd;
  for (int i = 0; i < p.nd; ++i) {
    s.shape[i] = p.n[i];
    s.src_stride[i] = p.ss[i];
    s.dst_stride[i] = p.ds[i];
  }
  void* args[] = {&s};
  const auto grid = static_cast<unsigned>(std::clamp<int64_t>((p.numel + TW_CUDA_COPY_BLOCK - 1) / TW_CUDA_COPY_BLOCK,
                                                              1, 65535 * 4));
  check(a.cuLaunchKernel(m.strided[u], grid, 1, 1, TW_CUDA_COPY_BLOCK, 1, 1, 0, as_stream(stream), args, nullptr),
        kStridedNames[u]);
}

}  // namespace tw::cuda::detail

namespace tw::cuda {
bool kernels_built() noexcept { return detail::kernels_built_impl(); }
}  // namespace tw::cuda
