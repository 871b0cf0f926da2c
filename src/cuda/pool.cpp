#include "cuda/pool.hpp"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <string>

#include "core/text.hpp"
#include "tensorwire/error.hpp"

namespace tw::cuda::detail {

size_t size_class(size_t n, size_t granularity) noexcept {
  if (n <= kMinClass) return kMinClass;
  if (n <= kSlabMax) return std::bit_ceil(n);
  const size_t p = std::bit_floor(n);
  const size_t step = std::max(p / 4, std::max(granularity, kMinClass));
  return (n + step - 1) / step * step;
}

namespace {

std::string mib(size_t n) { return tw::detail::bytes_text(n); }

// Blocks come back from Buffer destructors on any thread; a block whose event cannot be recorded (a driver error
// at that point) is reused only after its stream is synchronized, or dropped when even that fails.
CUevent record_on(int device, intptr_t stream) noexcept {
  try {
    const Api& a = api("pool");
    ContextGuard g(device);
    CUevent ev = nullptr;
    if (a.cuEventCreate(&ev, kEventDisableTiming) != kSuccess) return nullptr;
    if (a.cuEventRecord(ev, as_stream(stream)) != kSuccess) {
      a.cuEventDestroy(ev);
      return nullptr;
    }
    return ev;
  } catch (...) {
    return nullptr;
  }
}

}  // namespace

size_t Pool::granularity() {
  if (granularity_) return granularity_;
  const Api& a = api("device pool");
  granularity_ = kSegmentBytes;
  vmm_ = 0;
  if (device_ >= 0 && a.cuMemCreate && a.cuMemGetAllocationGranularity && a.cuMemAddressReserve && a.cuMemMap &&
      a.cuMemSetAccess && a.cuMemUnmap && a.cuMemAddressFree && a.cuMemRelease) {
    CUdevice dev = 0;
    int vmm = 0, fd = 0;
    check(a.cuDeviceGet(&dev, device_), "cuDeviceGet");
    a.cuDeviceGetAttribute(&vmm, kAttrVmmSupported, dev);
    a.cuDeviceGetAttribute(&fd, kAttrPosixFdSupported, dev);
    // Pool memory is what a network transport lands CUDA tensors in: where the device allows it, every segment is
    // made so that a NIC can read and write it (GPUDirect RDMA), as NCCL does for its VMM buffers.
    int rdma = 0;
    a.cuDeviceGetAttribute(&rdma, kAttrGpuDirectRdmaWithVmm, dev);
    rdma_ = rdma ? 1 : 0;
    if (vmm && fd) {
      MemAllocationProp prop{};
      prop.type = kMemAllocationTypePinned;
      prop.requested_handle_types = kMemHandleTypePosixFd;
      prop.location = MemLocation{kMemLocationTypeDevice, device_};
      prop.gpu_direct_rdma_capable = rdma_;
      size_t g = 0;
      if (a.cuMemGetAllocationGranularity(&g, &prop, kMemGranularityRecommended) == kSuccess && g > 0 &&
          std::has_single_bit(g)) {
        granularity_ = std::max(g, kSegmentBytes);
        vmm_ = 1;
      }
    }
  }
  return granularity_;
}

Segment* Pool::new_segment(size_t bytes, size_t slot_size) {
  const RelaxedCapture relaxed;  // (allocation and mapping: no caller's stream is involved)
  const Api& a = api(device_ >= 0 ? "allocate CUDA device memory" : "allocate pinned host memory");
  auto seg = std::make_unique<Segment>();
  seg->size = bytes;
  seg->slot_size = slot_size;
  if (device_ < 0) {
    ContextGuard g(default_device());  // portable pinned memory: any context will do
    void* p = nullptr;
    check(a.cuMemHostAlloc(&p, bytes, kMemHostAllocPortable), "cuMemHostAlloc");
    seg->base = reinterpret_cast<uintptr_t>(p);
  } else {
    ContextGuard g(device_);
    if (vmm_ == 1) {
      MemAllocationProp prop{};
      prop.type = kMemAllocationTypePinned;
      prop.requested_handle_types = kMemHandleTypePosixFd;
      prop.location = MemLocation{kMemLocationTypeDevice, device_};
      prop.gpu_direct_rdma_capable = rdma_;
      CUmemHandle h = 0;
      check(a.cuMemCreate(&h, bytes, &prop, 0), "cuMemCreate");
      CUdeviceptr va = 0;
      if (CUresult r = a.cuMemAddressReserve(&va, bytes, granularity_, 0, 0); r != kSuccess) {
        a.cuMemRelease(h);
        check(r, "cuMemAddressReserve");
      }
      CUresult r = a.cuMemMap(va, bytes, 0, h, 0);
      if (r == kSuccess) {
        MemAccessDesc acc{MemLocation{kMemLocationTypeDevice, device_}, kMemAccessReadWrite};
        r = a.cuMemSetAccess(va, bytes, &acc, 1);
        if (r != kSuccess) a.cuMemUnmap(va, bytes);
      }
      if (r != kSuccess) {
        a.cuMemAddressFree(va, bytes);
        a.cuMemRelease(h);
        check(r, "cuMemMap/cuMemSetAccess");
      }
      seg->base = static_cast<uintptr_t>(va);
      seg->handle = h;
      seg->vmm = true;
    } else {
      CUdeviceptr p = 0;
      check(a.cuMemAlloc(&p, bytes), "cuMemAlloc");
      seg->base = static_cast<uintptr_t>(p);
    }
  }
  stats_.reserved_bytes += bytes;
  segments_.push_back(std::move(seg));
  return segments_.back().get();
}

void Pool::free_segment(Segment* s) noexcept {
  const Api& a = driver().api;
  const RelaxedCapture relaxed;  // (frees are as unsafe as allocations under a global-mode capture)
  try {
    if (device_ < 0) {
      ContextGuard g(default_device());
      a.cuMemFreeHost(reinterpret_cast<void*>(s->base));
    } else {
      ContextGuard g(device_);
      if (s->vmm) {
        a.cuMemUnmap(static_cast<CUdeviceptr>(s->base), s->size);
        a.cuMemAddressFree(static_cast<CUdeviceptr>(s->base), s->size);
        a.cuMemRelease(s->handle);
      } else {
        a.cuMemFree(static_cast<CUdeviceptr>(s->base));
      }
    }
  } catch (...) {
  }
  stats_.reserved_bytes -= s->size;
  auto it = std::find_if(segments_.begin(), segments_.end(), [s](const auto& p) { return p.get() == s; });
  if (it != segments_.end()) segments_.erase(it);
}

Block* Pool::new_block(uintptr_t ptr, size_t size, Segment* seg) {
  Block* b = nullptr;
  if (!spare_.empty()) {
    b = spare_.back();
    spare_.pop_back();
  } else {
    blocks_.push_back(std::make_unique<Block>());
    b = blocks_.back().get();
  }
  *b = Block{ptr, size, seg, 0, 0, nullptr};
  return b;
}

Block* Pool::take_cached(size_t cls, intptr_t stream, bool idle, std::unique_lock<std::mutex>& lk) {
  auto it = free_.find(cls);
  if (it == free_.end() || it->second.empty()) return nullptr;
  std::vector<Block*>& v = it->second;
  const Api& a = driver().api;
  if (device_ >= 0 && idle) {
    // Only a block no queued work uses any more (a query, never a wait): the caller writes it outside any stream.
    ContextGuard g(device_);
    for (auto p = v.begin(); p != v.end(); ++p) {
      Block* b = *p;
      if (b->free_event && a.cuEventQuery(b->free_event) != kSuccess) continue;
      v.erase(p);
      if (b->free_event) a.cuEventDestroy(b->free_event);
      b->free_event = nullptr;
      return b;
    }
    return nullptr;
  }
  if (device_ >= 0) {
    // Stream-ordered: prefer a block last used on this very stream (no wait at all), else the oldest.
    auto pick = std::find_if(v.begin(), v.end(), [&](Block* b) { return b->stream == stream || !b->free_event; });
    if (pick == v.end()) pick = v.begin();
    Block* b = *pick;
    v.erase(pick);
    if (b->free_event) {
      if (b->stream != stream) {
        ContextGuard g(device_);
        if (CUresult r = a.cuStreamWaitEvent(as_stream(stream), b->free_event, 0); r != kSuccess) {
          v.insert(v.begin(), b);
          check(r, "cuStreamWaitEvent");
        }
      }
      with_context(device_, [&] { return a.cuEventDestroy(b->free_event); });
      b->free_event = nullptr;
    }
    return b;
  }
  // Pinned: the host writes it next, so only a block whose queued work is done.
  for (auto p = v.begin(); p != v.end(); ++p) {
    Block* b = *p;
    if (!b->free_event ||
        with_context(b->stream_device, [&] { return a.cuEventQuery(b->free_event); }) == kSuccess) {
      v.erase(p);
      if (b->free_event) with_context(b->stream_device, [&] { return a.cuEventDestroy(b->free_event); });
      b->free_event = nullptr;
      return b;
    }
  }
  if (stats_.reserved_bytes < kPinnedSoftLimit) return nullptr;  // grow rather than wait
  Block* b = v.front();
  v.erase(v.begin());
  CUevent ev = b->free_event;
  b->free_event = nullptr;
  ++b->segment->busy;  // in neither the cache nor the live map meanwhile: its segment must not be released
  lk.unlock();         // never hold the pool while the host waits
  const RelaxedCapture relaxed;
  CUresult r = with_context(b->stream_device, [&] { return a.cuEventSynchronize(ev); });
  with_context(b->stream_device, [&] { return a.cuEventDestroy(ev); });
  lk.lock();
  --b->segment->busy;
  if (r != kSuccess) {
    // The work that used it failed: the memory may still be touched; drop the block rather than reuse it.
    b->segment->poisoned = true;
    return nullptr;
  }
  return b;
}

namespace {
// The stream a device block's free event goes on, decided while the caller's stream is surely alive. A blocking
// stream (CUDA's default kind: CuPy's and Numba's streams, the per-thread default stream 2) is followed by the
// legacy default stream, so the event goes there and the caller's handle is never named again: the caller may
// destroy it while the memory lives. A non-blocking stream (PyTorch's side streams) is followed by nothing else:
// the event must go on it, and it must outlive the block (or the pool waits for the device when it finds it gone).
intptr_t free_stream_for(int device, intptr_t stream) noexcept {
  if (stream == 0 || stream == 1 || stream == 2) return stream == 2 ? 1 : stream;
  const Api& a = driver().api;
  if (!a.cuStreamGetFlags) return stream;
  unsigned flags = 0;
  try {
    ContextGuard g(device);
    if (a.cuStreamGetFlags(as_stream(stream), &flags) != kSuccess) return stream;
  } catch (...) {
    return stream;
  }
  return (flags & kStreamNonBlocking) ? stream : 1;
}
}  // namespace

std::shared_ptr<Buffer> Pool::allocate(size_t nbytes, intptr_t stream, bool idle) {
  if (forked_child()) (void)api("CUDA pool");  // throws, saying why, before a lock the parent may have held
  const size_t g = [&] {
    std::lock_guard lk(mu_);
    return granularity();
  }();
  const size_t cls = size_class(std::max<size_t>(nbytes, 1), g);
  if (cls < nbytes) throw Error(ErrorCode::overflow, "CUDA pool: " + std::to_string(nbytes) + " bytes cannot be allocated");
  const intptr_t free_stream = device_ >= 0 ? free_stream_for(device_, stream) : 0;
  std::unique_lock lk(mu_);
  Block* b = take_cached(cls, stream, idle, lk);
  if (b) {
    ++stats_.hits;
  } else {
    ++stats_.misses;
    try {
      b = fresh_block(cls);
    } catch (const Error& e) {
      if (e.code() != ErrorCode::out_of_memory) throw;
    }
    if (!b) {
      // The driver has no room: what this pool caches goes back to it (its pending work waited for) and the
      // allocation is tried once more, as PyTorch's caching allocator does before it reports out of memory.
      const size_t before = stats_.reserved_bytes;
      release_cached_locked(lk);
      const size_t released = before - std::min(before, stats_.reserved_bytes);
      b = take_cached(cls, stream, idle, lk);  // a block of this class whose work was pending may be free now
      if (!b) {
        try {
          b = fresh_block(cls);
        } catch (const Error& e) {
          if (e.code() != ErrorCode::out_of_memory) throw;
          const std::string where = device_ >= 0 ? "cuda:" + std::to_string(device_) : std::string("pinned host memory");
          throw Error(ErrorCode::out_of_memory,
                      "CUDA pool (" + where + "): cannot allocate " + mib(nbytes) + ": " + e.what() +
                          ", even after giving back " + mib(released) + " of the pool's cache; live tensors of this " +
                          "process hold " + mib(stats_.in_use_bytes) + " of it");
        }
      }
    }
  }
  if (b->segment->slot_size) ++b->segment->slots_out;
  b->stream = device_ >= 0 ? free_stream : 0;
  b->stream_device = std::max(device_, 0);
  live_[b->ptr] = b;
  stats_.in_use_bytes += b->size;
  lk.unlock();
  const Device dev = device_ >= 0 ? Device::cuda(device_) : Device::cuda_host();
  std::shared_ptr<void> owner(reinterpret_cast<void*>(b->ptr), [this, b](void*) { give_back(b); });
  return std::make_shared<Buffer>(reinterpret_cast<void*>(b->ptr), b->size, dev, std::move(owner));
}

void Pool::settle(uintptr_t ptr) noexcept {
  if (forked_child()) return;
  std::lock_guard lk(mu_);
  if (auto it = live_.find(ptr); it != live_.end()) it->second->stream = 0;
}

void Pool::give_back(Block* b) noexcept {
  if (forked_child()) return;  // the parent's memory: nothing here can use or free it (driver.hpp)
  // The free event goes on the stream the block was allocated on: work its user queued there through the memory
  // is done before another allocation reuses it. Stream 2 names the per-thread default stream of whichever thread
  // calls, and the last reference may go on another thread: the legacy default stream orders after every thread's
  // (they are blocking streams), so the event goes there.
  const intptr_t stream = b->stream == 2 ? 1 : b->stream;
  CUevent ev = nullptr;
  if (stream) ev = record_on(b->stream_device, stream);
  bool drop = false;
  if (stream && !ev) {
    // No event: the stream is gone (its owner destroyed it while the memory lived; the driver still runs what was
    // queued on it) or the driver failed. Wait for all of the device's work now, or never reuse the block.
    try {
      const Api& a = api("pool");
      const RelaxedCapture relaxed;
      ContextGuard g(b->stream_device);
      drop = a.cuCtxSynchronize() != kSuccess;
    } catch (...) {
      drop = true;
    }
  }
  std::lock_guard lk(mu_);
  if (auto it = live_.find(b->ptr); it == live_.end() || it->second != b) return;  // from before a reset()
  b->stream = ev ? stream : 0;  // what take_cached compares: the stream the event is on
  live_.erase(b->ptr);
  stats_.in_use_bytes -= b->size;
  if (b->segment->slot_size) --b->segment->slots_out;
  if (drop) {  // leaked on purpose: its memory may still be in use by work that failed
    b->segment->poisoned = true;
    return;
  }
  b->free_event = ev;
  free_[b->size].push_back(b);
}

std::pair<uintptr_t, size_t> Pool::find(uintptr_t ptr) const {
  if (forked_child()) return {0, 0};
  std::lock_guard lk(mu_);
  // Blocks are class-aligned within their segment only; search the live map by exact base first.
  if (auto it = live_.find(ptr); it != live_.end()) return {it->second->ptr, it->second->size};
  for (const auto& [base, b] : live_)
    if (ptr >= base && ptr < base + b->size) return {b->ptr, b->size};
  return {0, 0};
}

PoolStats Pool::stats() const {
  if (forked_child()) return {};
  std::lock_guard lk(mu_);
  PoolStats s = stats_;
  for (const auto& [cls, v] : free_) s.cached_blocks += v.size();
  return s;
}

Block* Pool::fresh_block(size_t cls) {
  if (cls <= kSlabMax) {
    const size_t seg_bytes = std::max(kSegmentBytes, granularity_);  // a multiple of the granularity
    Segment* seg = new_segment(seg_bytes, cls);
    // Every slot but the first goes to the cache.
    for (size_t off = seg_bytes; off > cls;) {
      off -= cls;
      free_[cls].push_back(new_block(seg->base + off, cls, seg));
    }
    return new_block(seg->base, cls, seg);
  }
  Segment* seg = new_segment(cls, 0);
  return new_block(seg->base, cls, seg);
}

void Pool::release_cached() {
  if (forked_child()) return;
  std::unique_lock lk(mu_);
  release_cached_locked(lk);
}

void Pool::release_cached_locked(std::unique_lock<std::mutex>& lk) {
  const Api& a = driver().api;
  // Cached blocks whose work may be pending leave the cache while the host waits for it, unlocked (their segments
  // marked busy), and come back once it is done; a block whose work failed is dropped and its segment kept.
  std::vector<Block*> waiting;
  for (auto& [cls, v] : free_)
    std::erase_if(v, [&](Block* b) {
      if (!b->free_event) return false;
      ++b->segment->busy;
      waiting.push_back(b);
      return true;
    });
  if (!waiting.empty()) {
    std::vector<bool> done(waiting.size());
    lk.unlock();
    const RelaxedCapture relaxed;
    for (size_t i = 0; i < waiting.size(); ++i) {
      const int dev = waiting[i]->stream_device;
      done[i] = with_context(dev, [&] { return a.cuEventSynchronize(waiting[i]->free_event); }) == kSuccess;
      with_context(dev, [&] { return a.cuEventDestroy(waiting[i]->free_event); });
      waiting[i]->free_event = nullptr;
    }
    lk.lock();
    for (size_t i = 0; i < waiting.size(); ++i) {
      Block* b = waiting[i];
      --b->segment->busy;
      if (done[i]) free_[b->size].push_back(b);
      else b->segment->poisoned = true;
    }
  }
  // Then every segment none of whose blocks is out goes back to the driver.
  std::vector<Segment*> idle;
  for (const auto& s : segments_) {
    if (s->busy || s->poisoned) continue;
    const bool slab_idle = s->slot_size && s->slots_out == 0;
    const bool large_idle = !s->slot_size && std::none_of(live_.begin(), live_.end(), [&](const auto& kv) {
      return kv.second->segment == s.get();
    });
    if (slab_idle || large_idle) idle.push_back(s.get());
  }
  for (auto& [cls, v] : free_) {
    std::erase_if(v, [&](Block* b) {
      if (std::find(idle.begin(), idle.end(), b->segment) == idle.end()) return false;
      spare_.push_back(b);
      return true;
    });
  }
  for (Segment* s : idle) free_segment(s);
}

void Pool::reset() noexcept {
  std::lock_guard lk(mu_);
  free_.clear();
  live_.clear();
  // Buffers handed out before the reset may still return their blocks: keep the objects (a test-only path).
  static auto* graveyard = new std::vector<std::unique_ptr<Block>>();
  for (auto& b : blocks_) graveyard->push_back(std::move(b));
  static auto* segyard = new std::vector<std::unique_ptr<Segment>>();
  for (auto& sg : segments_) segyard->push_back(std::move(sg));
  segments_.clear();
  blocks_.clear();
  spare_.clear();
  granularity_ = 0;
  vmm_ = -1;
  stats_ = PoolStats{};
}

namespace {
std::mutex g_pools_mu;
std::map<int, Pool*>& pools() {
  static auto* m = new std::map<int, Pool*>();  // never destroyed: blocks may return during exit
  return *m;
}
void reset_pools() {
  std::lock_guard lk(g_pools_mu);
  for (auto& [d, p] : pools()) p->reset();
}
const bool g_registered = (register_reset(&reset_pools), true);
}  // namespace

Pool& pool(int device) {
  (void)g_registered;
  std::lock_guard lk(g_pools_mu);
  Pool*& p = pools()[device];
  if (!p) p = new Pool(device);
  return *p;
}

}  // namespace tw::cuda::detail
