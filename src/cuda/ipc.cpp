// CUDA memory and events between processes (see ipc.hpp).
#include "cuda/ipc.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "cuda/copy.hpp"
#include "cuda/driver.hpp"
#include "tensorwire/error.hpp"

namespace tw::cuda::detail {
namespace {

std::string uuid_text(const std::array<uint8_t, 16>& u) {
  // The form nvidia-smi prints: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx.
  std::string s = "GPU-";
  char b[3];
  for (size_t i = 0; i < u.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s += '-';
    std::snprintf(b, sizeof b, "%02x", u[i]);
    s += b;
  }
  return s;
}

template <class T>
bool pointer_attr(const Api& a, int attr, uintptr_t ptr, T& out) {
  out = T{};
  return a.cuPointerGetAttribute(&out, attr, static_cast<CUdeviceptr>(ptr)) == kSuccess;
}

DeviceExport refuse(std::string why) {
  DeviceExport e;
  e.why = std::move(why);
  return e;
}

// Process-wide state, reset when a test swaps the driver.
struct State {
  std::mutex mu;
  // Legacy handles open in this process, by handle bytes: cuIpcOpenMemHandle opens one allocation once per process.
  std::map<std::array<uint8_t, 64>, std::weak_ptr<void>> legacy;
  // Device memory mapped here from another process's handle (open_memory), by base: its end and device. Such
  // memory is that process's: export_memory refuses to pass it on, whoever wraps it here (a received tensor, a
  // framework's view of one), so it is copied once instead.
  struct Imported {
    uintptr_t end = 0;
    int device = -1;
  };
  std::map<uintptr_t, Imported> imported;
};
State& state() {
  static State* s = [] {
    auto* st = new State();  // never destroyed: received tensors may outlive static destruction
    register_reset([] {
      std::lock_guard lk(state().mu);
      state().legacy.clear();
      state().imported.clear();
    });
    return st;
  }();
  return *s;
}

// The driver's exported fd is this process's until it crosses: a child started with fork + exec must not inherit it
// (it would keep the device memory alive). The driver does not promise FD_CLOEXEC.
void close_on_exec(int fd) noexcept {
  const int flags = ::fcntl(fd, F_GETFD);
  if (flags >= 0 && !(flags & FD_CLOEXEC)) ::fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
}

// Owns a VMM mapping made here (reserved range, mapped handle): the last owner unmaps it, frees the range and
// releases the handle, under the device's context (never throws).
std::shared_ptr<void> mapping_owner(int device, CUdeviceptr va, size_t bytes, CUmemHandle h) {
  return std::shared_ptr<void>(reinterpret_cast<void*>(va), [device, bytes, h](void* p) {
    try {
      const Api& a = driver().api;
      if (!a.cuMemUnmap) return;
      const RelaxedCapture relaxed;
      ContextGuard g(device);
      a.cuMemUnmap(reinterpret_cast<CUdeviceptr>(p), bytes);
      a.cuMemAddressFree(reinterpret_cast<CUdeviceptr>(p), bytes);
      a.cuMemRelease(h);
    } catch (...) {
    }
  });
}

// Owns a mapping of another process's memory: registered as imported (State::imported) until the last owner goes,
// then `inner` releases it.
std::shared_ptr<void> imported_owner(std::shared_ptr<void> inner, int device, uintptr_t base, uint64_t bytes) {
  State& st = state();
  {
    std::lock_guard lk(st.mu);
    st.imported[base] = State::Imported{base + static_cast<uintptr_t>(bytes), device};
  }
  void* p = inner.get();
  return std::shared_ptr<void>(p, [inner = std::move(inner), base](void*) mutable {
    if (forked_child()) {  // the parent's mapping and lock (driver.hpp): left as they are
      new std::shared_ptr<void>(std::move(inner));
      return;
    }
    {
      State& s2 = state();
      std::lock_guard lk(s2.mu);
      s2.imported.erase(base);
    }
    inner.reset();
  });
}

// Whether `ptr` lies in memory mapped here from another process (State::imported).
bool is_imported(int device, uintptr_t ptr) {
  if (forked_child()) return false;
  State& st = state();
  std::lock_guard lk(st.mu);
  auto it = st.imported.upper_bound(ptr);
  if (it == st.imported.begin()) return false;
  --it;
  return ptr < it->second.end && it->second.device == device;
}

}  // namespace

std::array<uint8_t, 16> device_uuid(int device) {
  const Api& a = api("CUDA device UUID");
  if (!a.cuDeviceGetUuid) throw Error(ErrorCode::device_unavailable, "the NVIDIA driver lacks cuDeviceGetUuid");
  CUdevice dev = 0;
  check(a.cuDeviceGet(&dev, device), "cuDeviceGet");
  Uuid u{};
  check(a.cuDeviceGetUuid(&u, dev), "cuDeviceGetUuid");
  std::array<uint8_t, 16> out{};
  std::memcpy(out.data(), u.bytes, out.size());
  return out;
}

int device_of_uuid(const std::array<uint8_t, 16>& uuid) {
  const int n = driver().devices;
  for (int i = 0; i < n; ++i)
    if (device_uuid(i) == uuid) return i;
  throw Error(ErrorCode::device_unavailable,
              "the publisher's GPU " + uuid_text(uuid) + " is not visible to this process (" + std::to_string(n) +
                  " CUDA device" + (n == 1 ? "" : "s") +
                  " here; check CUDA_VISIBLE_DEVICES, or subscribe with device='cpu' to receive copies)");
}

DeviceExport export_memory(int device, uintptr_t ptr, uint64_t span) {
  const Api& a = api("export CUDA memory to another process");
  if (is_imported(device, ptr))
    return refuse("it is memory this process received from another process's publisher (that process's allocation, "
                  "mapped here), which is not passed on");
  ContextGuard g(device);
  uintptr_t pool = 0;
  if (pointer_attr(a, kPointerAttrMempoolHandle, ptr, pool) && pool != 0)
    return refuse("it comes from a stream-ordered memory pool (cudaMallocAsync), which has no IPC handle per allocation");
  DeviceExport e;
  e.device = device;
  e.device_uuid = device_uuid(device);
  // Legacy-IPC-capable memory (cudaMalloc / cuMemAlloc, PyTorch's caching allocator) is asked about first and never
  // taken through the VMM path, whatever cuMemRetainAllocationHandle would answer for it; VMM memory says 0 here.
  int legacy_capable = 0;
  const bool legacy_known = pointer_attr(a, kPointerAttrLegacyIpcCapable, ptr, legacy_capable);
  CUmemHandle h = 0;
  if (!(legacy_known && legacy_capable == 1) && a.cuMemRetainAllocationHandle &&
      a.cuMemRetainAllocationHandle(&h, reinterpret_cast<void*>(ptr)) == kSuccess) {  // VMM memory
    struct Release {
      const Api& a;
      CUmemHandle h;
      ~Release() { a.cuMemRelease(h); }
    } release{a, h};
    unsigned long long allowed = 0;
    if (!pointer_attr(a, kPointerAttrAllowedHandleTypes, ptr, allowed) || !(allowed & kMemHandleTypePosixFd))
      return refuse("its VMM allocation was made without a POSIX file-descriptor handle type");
    uintptr_t base = 0;
    size_t size = 0;
    if (!pointer_attr(a, kPointerAttrMappingBase, ptr, base) || !pointer_attr(a, kPointerAttrMappingSize, ptr, size) ||
        size == 0)
      return refuse("the driver cannot say which VMM mapping holds it");
    if (ptr < base || span > size || ptr - base > size - span)
      return refuse("it spans more than one VMM allocation");
    if (!a.cuMemExportToShareableHandle) return refuse("the NVIDIA driver lacks cuMemExportToShareableHandle");
    int fd = -1;
    if (CUresult r = a.cuMemExportToShareableHandle(&fd, h, kMemHandleTypePosixFd, 0); r != kSuccess || fd < 0)
      return refuse("cuMemExportToShareableHandle failed: " + result_name(r));
    close_on_exec(fd);
    e.kind = DeviceExport::Kind::vmm;
    e.fd = fd;
    e.base = base;
    e.bytes = size;
    return e;
  }
  if (!a.cuIpcGetMemHandle) return refuse("the NVIDIA driver lacks cuIpcGetMemHandle");
  if (legacy_known && legacy_capable == 0)
    return refuse("the driver says its allocation cannot be shared with a CUDA IPC handle (memory opened from "
                  "another process's handle, or allocated by a mechanism without one)");
  CUdeviceptr base = 0;
  size_t size = 0;
  if (CUresult r = a.cuMemGetAddressRange(&base, &size, static_cast<CUdeviceptr>(ptr)); r != kSuccess || size == 0)
    return refuse("cuMemGetAddressRange failed: " + result_name(r));
  if (ptr < base || span > size || ptr - base > size - span) return refuse("it spans more than one allocation");
  IpcHandle ih{};
  if (CUresult r = a.cuIpcGetMemHandle(&ih, base); r != kSuccess)
    return refuse("cuIpcGetMemHandle failed: " + result_name(r));
  e.kind = DeviceExport::Kind::legacy;
  std::memcpy(e.handle.data(), ih.bytes, e.handle.size());
  e.base = static_cast<uintptr_t>(base);
  e.bytes = size;
  return e;
}

DeviceExport allocate_exportable(int device, size_t nbytes) {
  const RelaxedCapture relaxed;  // (allocation and mapping: no caller's stream is involved)
  const Api& a = api("allocate shareable CUDA memory");
  if (!a.cuMemCreate || !a.cuMemGetAllocationGranularity || !a.cuMemAddressReserve || !a.cuMemMap ||
      !a.cuMemSetAccess || !a.cuMemUnmap || !a.cuMemAddressFree || !a.cuMemRelease || !a.cuMemExportToShareableHandle)
    throw Error(ErrorCode::unsupported, "the NVIDIA driver lacks the virtual memory management API");
  ContextGuard g(device);
  CUdevice dev = 0;
  check(a.cuDeviceGet(&dev, device), "cuDeviceGet");
  int vmm = 0, fds = 0, rdma = 0;
  a.cuDeviceGetAttribute(&vmm, kAttrVmmSupported, dev);
  a.cuDeviceGetAttribute(&fds, kAttrPosixFdSupported, dev);
  a.cuDeviceGetAttribute(&rdma, kAttrGpuDirectRdmaWithVmm, dev);  // (as the pool's segments: pool.cpp)
  if (!vmm || !fds)
    throw Error(ErrorCode::unsupported, "cuda:" + std::to_string(device) +
                                            " does not support VMM allocations with POSIX file-descriptor handles");
  MemAllocationProp prop{};
  prop.type = kMemAllocationTypePinned;
  prop.requested_handle_types = kMemHandleTypePosixFd;
  prop.location = MemLocation{kMemLocationTypeDevice, device};
  prop.gpu_direct_rdma_capable = rdma ? 1 : 0;
  // (Asked before anything is made: nothing below may throw between cuMemCreate and the owner that frees it.)
  const std::array<uint8_t, 16> uuid = device_uuid(device);
  size_t gran = 0;
  check(a.cuMemGetAllocationGranularity(&gran, &prop, kMemGranularityRecommended), "cuMemGetAllocationGranularity");
  if (gran == 0) gran = size_t{2} << 20;
  const size_t bytes = (std::max<size_t>(nbytes, 1) + gran - 1) / gran * gran;
  CUmemHandle h = 0;
  check(a.cuMemCreate(&h, bytes, &prop, 0), "cuMemCreate");
  CUdeviceptr va = 0;
  CUresult r = a.cuMemAddressReserve(&va, bytes, gran, 0, 0);
  if (r != kSuccess) {
    a.cuMemRelease(h);
    check(r, "cuMemAddressReserve");
  }
  r = a.cuMemMap(va, bytes, 0, h, 0);
  if (r == kSuccess) {
    MemAccessDesc acc{MemLocation{kMemLocationTypeDevice, device}, kMemAccessReadWrite};
    r = a.cuMemSetAccess(va, bytes, &acc, 1);
    if (r != kSuccess) a.cuMemUnmap(va, bytes);
  }
  int fd = -1;
  if (r == kSuccess) {
    r = a.cuMemExportToShareableHandle(&fd, h, kMemHandleTypePosixFd, 0);
    if (r != kSuccess) a.cuMemUnmap(va, bytes);
    else close_on_exec(fd);
  }
  if (r != kSuccess) {
    a.cuMemAddressFree(va, bytes);
    a.cuMemRelease(h);
    check(r, "cuMemMap/cuMemSetAccess/cuMemExportToShareableHandle");
  }
  DeviceExport e;
  e.kind = DeviceExport::Kind::vmm;
  e.device = device;
  e.device_uuid = uuid;
  e.base = static_cast<uintptr_t>(va);
  e.bytes = bytes;
  e.fd = fd;
  // The last owner frees it: the caller orders that after every use (the publisher, once no lease holds it and the
  // work recorded on its event is done).
  e.owner = mapping_owner(device, va, bytes, h);
  return e;
}

IpcEvent create_ipc_event(int device) {
  const Api& a = api("create an interprocess CUDA event");
  if (!a.cuIpcGetEventHandle) throw Error(ErrorCode::unsupported, "the NVIDIA driver lacks cuIpcGetEventHandle");
  ContextGuard g(device);
  CUevent ev = nullptr;
  check(a.cuEventCreate(&ev, kEventDisableTiming | kEventInterprocess), "cuEventCreate(interprocess)");
  IpcEvent out;
  out.device = device;
  out.event = std::shared_ptr<void>(ev, [device](void* e) {
    try {
      ContextGuard g2(device);
      driver().api.cuEventDestroy(static_cast<CUevent>(e));
    } catch (...) {
    }
  });
  IpcHandle h{};
  check(a.cuIpcGetEventHandle(&h, ev), "cuIpcGetEventHandle");
  std::memcpy(out.handle.data(), h.bytes, out.handle.size());
  return out;
}

void record_ipc_event(const IpcEvent& event, intptr_t stream, bool chain) {
  const Api& a = api("record an interprocess CUDA event");
  ContextGuard g(event.device);
  auto* ev = static_cast<CUevent>(event.event.get());
  if (chain) check(a.cuStreamWaitEvent(as_stream(stream), ev, 0), "cuStreamWaitEvent");
  check(a.cuEventRecord(ev, as_stream(stream)), "cuEventRecord");
}

IpcEvent open_ipc_event(const std::array<uint8_t, 16>& uuid, const std::array<uint8_t, 64>& handle) {
  const Api& a = api("open another process's CUDA event");
  if (!a.cuIpcOpenEventHandle) throw Error(ErrorCode::unsupported, "the NVIDIA driver lacks cuIpcOpenEventHandle");
  const int device = device_of_uuid(uuid);
  ContextGuard g(device);
  IpcHandle h{};
  std::memcpy(h.bytes, handle.data(), handle.size());
  CUevent ev = nullptr;
  if (CUresult r = a.cuIpcOpenEventHandle(&ev, h); r != kSuccess)
    throw Error(ErrorCode::invalid_argument, "the publisher's CUDA event handle cannot be opened (" + result_name(r) +
                                                 "): a forged or stale handle, or a publisher that is gone");
  IpcEvent out;
  out.device = device;
  out.handle = handle;
  out.event = std::shared_ptr<void>(ev, [device](void* e) {
    try {
      ContextGuard g2(device);
      driver().api.cuEventDestroy(static_cast<CUevent>(e));
    } catch (...) {
    }
  });
  return out;
}

DeviceImport open_memory(DeviceExport::Kind kind, const std::array<uint8_t, 16>& uuid, int fd,
                         const std::array<uint8_t, 64>& handle, uint64_t handle_offset, uint64_t bytes) {
  const Api& a = api("open another process's CUDA memory");
  const int device = device_of_uuid(uuid);
  ContextGuard g(device);
  DeviceImport out;
  out.device = device;
  out.bytes = bytes;
  if (kind == DeviceExport::Kind::vmm) {
    if (!a.cuMemImportFromShareableHandle || !a.cuMemAddressReserve || !a.cuMemMap || !a.cuMemSetAccess)
      throw Error(ErrorCode::unsupported, "the NVIDIA driver lacks cuMemImportFromShareableHandle");
    CUmemHandle h = 0;
    if (CUresult r = a.cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                                                      kMemHandleTypePosixFd);
        r != kSuccess)
      throw Error(ErrorCode::invalid_argument, "the publisher's CUDA memory fd cannot be imported (" + result_name(r) +
                                                   "): not a CUDA allocation, or one of another device");
    const auto sz = static_cast<size_t>(bytes);
    CUdeviceptr va = 0;
    CUresult r = a.cuMemAddressReserve(&va, sz, 0, 0, 0);
    if (r == kSuccess) {
      r = a.cuMemMap(va, sz, 0, h, 0);
      if (r == kSuccess) {
        MemAccessDesc acc{MemLocation{kMemLocationTypeDevice, device}, kMemAccessReadWrite};
        r = a.cuMemSetAccess(va, sz, &acc, 1);
        if (r != kSuccess) a.cuMemUnmap(va, sz);
      }
      if (r != kSuccess) a.cuMemAddressFree(va, sz);
    }
    if (r != kSuccess) {
      a.cuMemRelease(h);
      throw Error(ErrorCode::invalid_argument, "the publisher's CUDA allocation of " + std::to_string(bytes) +
                                                   " bytes cannot be mapped (" + result_name(r) +
                                                   "): its announced size does not match the allocation");
    }
    out.base = static_cast<uintptr_t>(va);
    out.owner = imported_owner(mapping_owner(device, va, sz, h), device, out.base, bytes);
    return out;
  }
  if (kind != DeviceExport::Kind::legacy) throw Error(ErrorCode::invalid_argument, "open_memory: no handle to open");
  if (!a.cuIpcOpenMemHandle || !a.cuIpcCloseMemHandle)
    throw Error(ErrorCode::unsupported, "the NVIDIA driver lacks cuIpcOpenMemHandle");
  State& st = state();
  std::shared_ptr<void> opened;  // (before the lock: its deleter takes the lock, should a throw below drop it)
  std::unique_lock lk(st.mu);
  // An entry whose last owner just went has a close pending: its deleter waits for this lock. Opening the handle
  // again before that close is an error for drivers that refuse a second open of one handle in one process
  // (CUDA_ERROR_ALREADY_MAPPED), so the close goes first (it takes microseconds; the wait is bounded regardless).
  for (const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);;) {
    const auto it = st.legacy.find(handle);
    if (it == st.legacy.end()) break;
    opened = it->second.lock();
    if (opened || std::chrono::steady_clock::now() >= until) break;
    lk.unlock();
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    lk.lock();
  }
  if (!opened) {
    IpcHandle h{};
    std::memcpy(h.bytes, handle.data(), handle.size());
    CUdeviceptr p = 0;
    if (CUresult r = a.cuIpcOpenMemHandle(&p, h, kIpcLazyPeerAccess); r != kSuccess) {
      st.legacy.erase(handle);
      throw Error(ErrorCode::invalid_argument, "the publisher's CUDA IPC memory handle cannot be opened (" +
                                                   result_name(r) +
                                                   "): a forged or stale handle, or memory that was freed");
    }
    opened = std::shared_ptr<void>(reinterpret_cast<void*>(p), [device, handle](void* q) {
      if (forked_child()) return;  // the parent's mapping and lock (driver.hpp)
      State& s2 = state();
      // (Between the last owner going and this lock, an open_memory may have found the entry expired and opened
      // the handle again: then the entry, and the record of its mapping if the driver gave the same address, are
      // the new opening's.)
      std::shared_ptr<void> again;  // (let go after the lock: it may be the last owner of that new opening)
      std::lock_guard lk2(s2.mu);
      try {
        ContextGuard g2(device);
        driver().api.cuIpcCloseMemHandle(reinterpret_cast<CUdeviceptr>(q));
      } catch (...) {
      }
      auto it = s2.legacy.find(handle);
      if (it != s2.legacy.end()) again = it->second.lock();
      if (it != s2.legacy.end() && !again) s2.legacy.erase(it);
      if (again.get() != q) s2.imported.erase(reinterpret_cast<uintptr_t>(q));
    });
    st.legacy[handle] = opened;
  }
  {  // (the handle names the allocation's base; the driver knows its size, else the announcement is taken)
    const auto p = reinterpret_cast<uintptr_t>(opened.get());
    CUdeviceptr base = 0;
    size_t size = 0;
    State::Imported& im = st.imported[p];
    im.device = device;
    if (a.cuMemGetAddressRange(&base, &size, static_cast<CUdeviceptr>(p)) == kSuccess && base == p && size > 0)
      im.end = p + size;
    else
      im.end = std::max<uintptr_t>(im.end, p + static_cast<uintptr_t>(handle_offset + bytes));
  }
  // The size the allocation really has is not known here; the publisher's announcement is trusted only as far as
  // the driver maps (an out-of-bounds read is a device fault in this process, never another process's memory).
  out.base = reinterpret_cast<uintptr_t>(opened.get()) + handle_offset;
  out.owner = std::move(opened);
  return out;
}

intptr_t wait_ipc_event(const IpcEvent& event) {
  const Api& a = api("wait for another process's CUDA event");
  // This process's receive streams. Not own_stream() (copy.cpp), on which imports' ready events are waited: one
  // stream for both would make every received tensor's consumer wait for unrelated producers' kernels.
  static auto* receive = new DeviceStreams();  // never destroyed: received tensors may outlive static destruction
  const intptr_t s = receive->get(event.device);
  ContextGuard g(event.device);
  check(a.cuStreamWaitEvent(as_stream(s), static_cast<CUevent>(event.event.get()), 0), "cuStreamWaitEvent");
  return s;
}

// ---- releases ordered after the consumer's work ------------------------------------------------------------------
namespace {

std::atomic<bool> g_queue_fails_for_testing{false};

struct Release {
  int device = 0;
  bool whole_device = false;             // wait for everything queued on the device (a use on an unnamed stream)
  std::vector<CUevent> events;           // recorded on the streams the consumer named
  std::shared_ptr<const void> what;
};

// One thread per process waits for the device on behalf of the threads that drop received tensors, so that the
// caller (often holding the GIL) never blocks. Never destroyed: releases may be queued at exit.
struct Releaser {
  std::mutex mu;
  std::condition_variable cv, idle;
  std::deque<Release> queue;
  size_t busy = 0;   // taken from the queue, not done yet
  bool running = false;

  void run() {
    for (;;) {
      // Everything queued by now, at once: one device synchronize covers every whole-device release of the batch
      // (each asked for the work queued before it was queued), so a busy device costs one wait, not one each.
      std::deque<Release> batch;
      {
        std::unique_lock lk(mu);
        cv.wait(lk, [&] { return !queue.empty(); });
        batch.swap(queue);
        busy += batch.size();
      }
      const size_t n = batch.size();
      wait_for(batch);
      batch.clear();  // the leases go back to their publishers here, after the work that used their memory
      std::lock_guard lk(mu);
      busy -= n;
      if (queue.empty() && busy == 0) idle.notify_all();
    }
  }

  // Waits for `r`'s events and destroys them; false when its device is gone (no context can be made current:
  // nothing it ran can still read the memory).
  static bool wait_events(const Api& a, Release& r) noexcept {
    try {
      ContextGuard g(r.device);
      for (CUevent e : r.events) {
        if (a.cuEventSynchronize(e) != kSuccess) r.whole_device = true;
        a.cuEventDestroy(e);
      }
      r.events.clear();
      return true;
    } catch (...) {
      return false;
    }
  }

  // What the thread does for one release, on the caller's thread (when it cannot be queued).
  static void finish_now(Release& r) noexcept {
    const Api& a = driver().api;
    const RelaxedCapture relaxed;
    if (wait_events(a, r) && r.whole_device) {
      try {
        ContextGuard g(r.device);
        a.cuCtxSynchronize();
      } catch (...) {
      }
    }
    r.what.reset();
  }

  static void wait_for(std::deque<Release>& batch) noexcept {
    const Driver& drv = driver();
    if (!drv.status.empty()) return;  // no driver: nothing can be queued
    const Api& a = drv.api;
    const RelaxedCapture relaxed;  // (a user's graph capture in global mode must not fail on this thread's waits)
    std::vector<int> whole;  // devices to synchronize once each
    for (Release& r : batch) {
      if (!wait_events(a, r)) continue;
      if (!r.whole_device) {
        r.what.reset();  // its own streams' work is done: it need not wait for the batch's device synchronize
        continue;
      }
      if (std::find(whole.begin(), whole.end(), r.device) == whole.end()) whole.push_back(r.device);
    }
    for (const int d : whole) {
      try {
        ContextGuard g(d);
        a.cuCtxSynchronize();
      } catch (...) {
      }
    }
  }
};

Releaser& releaser() {
  static auto* r = [] {
    auto* q = new Releaser();
    // fork() while the thread holds the lock would leave it locked forever in the child: hold it across fork().
    ::pthread_atfork([] { releaser().mu.lock(); }, [] { releaser().mu.unlock(); },
                     [] {
                       Releaser& c = releaser();
                       new std::deque<Release>(std::move(c.queue));  // the parent's releases are not the child's
                       c.queue.clear();
                       c.busy = 0;
                       c.running = false;  // the parent's thread is not in this process
                       c.mu.unlock();
                     });
    return q;
  }();
  return *r;
}

}  // namespace

void release_after_work(int device, const std::vector<int64_t>* streams, std::shared_ptr<const void> what) {
  const Driver& drv = driver();
  if (!drv.status.empty()) return;  // no driver: no work can be queued; `what` goes now
  const Api& a = drv.api;
  Release r;
  r.device = device;
  r.whole_device = streams == nullptr;
  r.what = std::move(what);
  try {
    if (streams) {
      r.events.reserve(streams->size());
      ContextGuard g(device);
      for (int64_t s : *streams) {
        CUevent e = nullptr;
        if (a.cuEventCreate(&e, kEventDisableTiming) != kSuccess) {
          r.whole_device = true;
          continue;
        }
        if (a.cuEventRecord(e, as_stream(static_cast<intptr_t>(s))) != kSuccess) {
          a.cuEventDestroy(e);  // a stream that no longer exists: wait for the whole device instead
          r.whole_device = true;
          continue;
        }
        r.events.push_back(e);
      }
    }
    if (g_queue_fails_for_testing) throw std::system_error(EAGAIN, std::generic_category(), "thread");
    Releaser& q = releaser();
    std::lock_guard lk(q.mu);
    if (!q.running) {  // first use, or in a fork()ed child
      std::thread([&q] { q.run(); }).detach();
      q.running = true;
    }
    q.queue.push_back(std::move(r));
    q.cv.notify_one();
  } catch (...) {
    // No thread or no memory to queue it: the caller waits instead. Its events are destroyed, and the memory is
    // never handed back while work may still read it (a stream left without an event: the whole device).
    if (streams && r.events.size() < streams->size()) r.whole_device = true;
    Releaser::finish_now(r);
  }
}

void fail_release_queue_for_testing(bool fail) { g_queue_fails_for_testing = fail; }

void wait_releases() {
  Releaser& q = releaser();
  std::unique_lock lk(q.mu);
  if (!q.running) return;
  q.idle.wait(lk, [&] { return q.queue.empty() && q.busy == 0; });
}

size_t open_legacy_handles() {
  State& st = state();
  std::lock_guard lk(st.mu);
  size_t n = 0;
  for (const auto& [h, w] : st.legacy) n += w.expired() ? 0u : 1u;
  return n;
}

}  // namespace tw::cuda::detail
