// The CUDA layer behind tw::DeviceRuntime: memory from the pools and copies between any two of pageable host,
// pinned host and device memory, in any two layouts (see copy.cpp for the device side).
#include <algorithm>

#include "copy/plan.hpp"
#include "cuda/copy.hpp"
#include "cuda/driver.hpp"
#include "cuda/ipc.hpp"
#include "cuda/pool.hpp"
#include "tensorwire/copy.hpp"
#include "tensorwire/cuda.hpp"
#include "tensorwire/device_runtime.hpp"
#include "tensorwire/error.hpp"
#include "tensorwire/tensor.hpp"

namespace tw::cuda {
namespace detail {
namespace {

enum class Mem { pageable, pinned, device };

Mem kind_of(Device d) {
  switch (d.type) {
    case kDLCPU: return Mem::pageable;
    case kDLCUDAHost: return Mem::pinned;
    case kDLCUDA:
    case kDLCUDAManaged: return Mem::device;
    default:
      throw Error(ErrorCode::unsupported, "CUDA copy: memory on " + d.str() + " is neither host nor CUDA memory");
  }
}

/// Dense, no negative strides: element 0 is the lowest byte and nbytes bytes hold every element.
bool plain_dense(const Layout& l) {
  if (!l.is_dense()) return false;
  for (size_t i = 0; i < l.ndim(); ++i)
    if (l.strides[i] < 0 && l.shape[i] > 1) return false;
  return true;
}

/// Both plain dense with the same strides: one byte copy moves every element to its place.
bool same_dense(const Layout& a, const Layout& b) {
  if (!plain_dense(a) || !plain_dense(b)) return false;
  for (size_t i = 0; i < a.ndim(); ++i)
    if (a.shape[i] > 1 && a.strides[i] != b.strides[i]) return false;
  return true;
}

/// A dense layout of `l`'s shape and dtype with the dimension order of `like` when that is dense, else C order.
Layout dense_like(const Layout& l, const Layout& like) {
  Layout out{l.dtype, l.shape, {}, 0, l.subbyte_padded};
  out.strides = Layout::contiguous_strides(l.shape);
  if (like.is_dense() && !like.is_packed_subbyte()) {
    Strides s = like.strides;
    for (size_t i = 0; i < s.size(); ++i) s[i] = like.shape[i] == 1 ? 1 : (s[i] < 0 ? -s[i] : s[i]);
    Layout cand{l.dtype, l.shape, s, 0, l.subbyte_padded};
    if (cand.is_dense()) out.strides = std::move(s);
  }
  return out;
}

int64_t dense_bytes(const Layout& l) { return l.subbyte_padded ? l.numel() : l.nbytes(); }

Tensor temp(Device d, const Layout& l, intptr_t stream) {
  const int dev = d.type == kDLCUDAHost ? -1 : d.id;
  auto buf = pool(dev).allocate(static_cast<size_t>(std::max<int64_t>(dense_bytes(l), 1)), stream);
  return Tensor::make(std::move(buf), l, false);
}

uintptr_t addr(const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()); }

void byte_copy_async(int device, const Tensor& src, const Tensor& dst, intptr_t stream) {
  const Api& a = api("CUDA copy");
  ContextGuard g(device);
  check(a.cuMemcpyAsync(static_cast<CUdeviceptr>(addr(dst)), static_cast<CUdeviceptr>(addr(src)),
                        static_cast<size_t>(dense_bytes(src.layout())), as_stream(stream)),
        "cuMemcpyAsync");
}

void kernel_copy(int device, const Tensor& src, const Tensor& dst, intptr_t stream) {
  if (src.layout().is_packed_subbyte() || dst.layout().is_packed_subbyte())
    throw Error(ErrorCode::unsupported, "CUDA copy: packed sub-byte elements (" + src.dtype().name() +
                                            ") can be copied between identical dense layouts only");
  launch(device, plan_device_copy(src.layout(), addr(src), dst.layout(), addr(dst),
                                  static_cast<size_t>(src.dtype().itemsize())),
         stream);
}

void synchronize(int device, intptr_t stream) {
  const Api& a = api("CUDA copy");
  ContextGuard g(device);
  check(a.cuStreamSynchronize(as_stream(stream)), "cuStreamSynchronize");
}

// Pinned memory with work queued on its stream: the host waits for it (on its ready event when it has one: the
// stream may be gone).
void host_wait(const Tensor& t) {
  if (t.device().type != kDLCUDAHost || !t.stream()) return;
  if (t.ready_event()) cuda::synchronize_event(t.ready_event());
  else if (*t.stream() != kLegacyStream && *t.stream() != kPerThreadStream) synchronize(default_device(), *t.stream());
  else {  // a default stream of a device the tensor does not name: that of each device in use (cuda:0 before any)
    std::vector<int> devices = retained_devices();
    if (devices.empty()) devices.push_back(0);
    for (const int d : devices) synchronize(d, *t.stream());
  }
}

void validate_pair(const Tensor& src, const Tensor& dst) {
  if (!(src.dtype() == dst.dtype()))
    throw Error(ErrorCode::type_mismatch, "copy: dtypes differ (" + src.dtype().name() + " -> " + dst.dtype().name() + ")");
  if (!(src.shape() == dst.shape()))
    throw Error(ErrorCode::invalid_argument, "copy: shapes differ (" + src.shape().str() + " -> " + dst.shape().str() + ")");
  if (dst.readonly()) throw Error(ErrorCode::read_only, "copy: the destination is read-only");
  if (dst.layout().may_overlap())
    throw Error(ErrorCode::invalid_argument, "copy: the destination's elements overlap (stride 0 or overlapping "
                                             "strides); one element would be written twice");
}

}  // namespace

void copy_any(const Tensor& src, const Tensor& dst, intptr_t stream) {
  validate_pair(src, dst);
  const Mem sk = kind_of(src.device()), dk = kind_of(dst.device());
  if (src.numel() == 0) return;
  poll_pending();
  // The device whose stream orders the copy.
  const int dev = dk == Mem::device ? dst.device().id : sk == Mem::device ? src.device().id : 0;
  if (sk != Mem::pageable || dk != Mem::pageable) {
    if (sk == Mem::device) check_device(src.device(), "copy");
    if (dk == Mem::device) check_device(dst.device(), "copy");
    if (sk == Mem::pinned || dk == Mem::pinned) api("copy pinned memory");
  }
  if (sk != Mem::device && dk != Mem::device) {
    // Host to host: wait for queued device work on pinned memory first (the stream it was produced on).
    for (const Tensor* t : {&src, &dst}) host_wait(*t);
    tw::copy(src, dst);
    return;
  }
  check_stream(dev, stream, "copy");
  // The copy's stream waits for the source's (a stream handle is relative to its device's context).
  if (sk == Mem::device && src.stream() && src.device().id == dev) {
    if (src.ready_event()) event_wait(dev, src.ready_event(), stream);  // the producer's stream may be gone
    else stream_wait(dev, *src.stream(), dev, stream);
  }
  const Layout& sl = src.layout();
  const Layout& dl = dst.layout();

  if (sk == Mem::device && dk == Mem::device) {
    const int sdev = src.device().id;
    if (sdev == dev) {
      if (src.data_ptr() == dst.data_ptr() && sl.strides == dl.strides) return;  // the same elements: nothing to do
      if (tw::detail::spans_overlap(src.data_ptr(), sl, dst.data_ptr(), dl)) {
        // Through a temporary: the kernel's threads (or the driver's copy) would overwrite elements of the source
        // before others read them.
        Tensor tmp = temp(dst.device(), dense_like(sl, dl), stream);
        copy_any(src, tmp, stream);
        copy_any(tmp, dst, stream);
        return;
      }
      if (same_dense(sl, dl)) byte_copy_async(dev, src, dst, stream);
      else kernel_copy(dev, src, dst, stream);
      hold(dev, stream, {src.buffer_ptr(), dst.buffer_ptr()});
      return;
    }
    // Across devices: through pinned host memory, dense, in the destination's order where it is dense. The
    // source side runs on its own device's legacy stream (a stream handle names one context) after the source's
    // stream, and the host waits for it before the destination side reads the staging buffer. Peer access is
    // not assumed (VMM blocks are mapped for their own device only). Slower than a peer copy; correct everywhere.
    const Layout mid = dense_like(sl, dl);
    Tensor staged = temp(Device::cuda_host(), mid, 0);
    copy_any(src, staged, kLegacyStream);  // device -> pinned: returns with the data there
    copy_any(staged, dst, stream);
    return;
  }

  if (dk == Mem::device) {  // host -> device
    host_wait(src);
    const Layout mid = dense_like(sl, dl);
    Tensor staged = src;
    if (!(sk == Mem::pinned && same_dense(sl, mid))) {
      staged = temp(Device::cuda_host(), mid, 0);
      tw::copy(src, staged);  // packs any host layout, pageable or pinned
    }
    Tensor landing = same_dense(mid, dl) ? dst : temp(dst.device(), mid, stream);
    byte_copy_async(dev, staged, landing, stream);
    if (landing.buffer_ptr() != dst.buffer_ptr()) kernel_copy(dev, landing, dst, stream);
    std::vector<std::shared_ptr<Buffer>> scratch;
    if (landing.buffer_ptr() != dst.buffer_ptr()) scratch.push_back(landing.buffer_ptr());
    hold(dev, stream, {src.buffer_ptr(), dst.buffer_ptr(), staged.buffer_ptr()}, std::move(scratch));
    return;
  }

  // device -> host
  const Layout mid = dense_like(sl, dl);
  Tensor packed = same_dense(sl, mid) ? src : temp(src.device(), mid, stream);
  if (packed.buffer_ptr() != src.buffer_ptr()) kernel_copy(dev, src, packed, stream);
  if (dk == Mem::pinned && same_dense(mid, dl)) {
    // Pinned memory is host memory: every host reader (NumPy, the buffer protocol) reads it at once, so the copy
    // into it completes before this returns, like one into pageable memory (but at full DMA speed).
    byte_copy_async(dev, packed, dst, stream);
    synchronize(dev, stream);
    return;
  }
  if (dk == Mem::pageable && same_dense(mid, dl)) {
    byte_copy_async(dev, packed, dst, stream);  // the driver stages pageable memory itself
    synchronize(dev, stream);
    return;
  }
  Tensor staged = temp(Device::cuda_host(), mid, 0);
  byte_copy_async(dev, packed, staged, stream);
  synchronize(dev, stream);
  host_wait(dst);
  tw::copy(staged, dst);
}

std::shared_ptr<Buffer> allocate_on(Device d, size_t nbytes, intptr_t stream) {
  poll_pending();
  if (d.type == kDLCUDAHost) {
    api("allocate pinned host memory");
    if (device_count() == 0) check_device(Device::cuda(0), "allocate pinned host memory");
    return pool(-1).allocate(nbytes, 0);
  }
  check_device(d, "allocate CUDA memory");
  if (d.type == kDLCUDAManaged)
    throw Error(ErrorCode::unsupported, "tensorwire does not allocate CUDA managed memory; use cuda:N or pinned memory");
  check_stream(d.id, stream, "allocate CUDA memory");
  return pool(d.id).allocate(nbytes, stream);
}

namespace {

// The device whose default streams 1 and 2 a call means: cuda:N's (managed memory: N's too); -1 for host memory
// (pinned or not), whose streams are those of the caller's current context.
int device_index(Device d) noexcept { return d.type == kDLCUDA || d.type == kDLCUDAManaged ? static_cast<int>(d.id) : -1; }

class CudaRuntime final : public DeviceRuntime {
 public:
  bool available() const noexcept override { return driver_available(); }
  std::string status() const override { return driver_status(); }
  std::optional<int> device_of_pointer(uintptr_t ptr) const noexcept override { return cuda::device_of_pointer(ptr); }
  void synchronize_stream(Device device, intptr_t stream) const override {
    cuda::synchronize_stream(stream, device_index(device));
  }
  void* record_event(Device device, intptr_t stream) const override {
    return cuda::record_event(stream, device_index(device));
  }
  void destroy_event(void* event) const noexcept override { cuda::destroy_event(event); }
  void synchronize_event(void* event) const override { cuda::synchronize_event(event); }
  int device_count() const noexcept override { return cuda::device_count(); }
  std::shared_ptr<Buffer> allocate(Device device, size_t nbytes, intptr_t stream) const override {
    return allocate_on(device, nbytes, stream);
  }
  void copy(const Tensor& src, const Tensor& dst, intptr_t stream) const override { copy_any(src, dst, stream); }
  void stream_wait(Device device, intptr_t producer, intptr_t consumer) const override {
    check_device(device, "order CUDA streams");
    check_stream(device.id, consumer, "order CUDA streams");
    detail::stream_wait(device.id, producer, consumer);
  }
  std::shared_ptr<void> capture_event(Device device, intptr_t stream) const override {
    return std::shared_ptr<void>(cuda::record_event(stream, device_index(device)), &cuda::destroy_event);
  }
  void wait_event(Device device, void* event, intptr_t consumer) const override {
    check_device(device, "wait for a CUDA event");
    check_stream(device.id, consumer, "wait for a CUDA event");
    detail::event_wait(device.id, event, consumer);
  }
  intptr_t stream_after_event(Device device, void* event) const override {
    check_device(device, "order a stream after a CUDA event");
    // One stream serves every such consumer, so each wait holds up all later users of it: an event already
    // complete is not waited for at all.
    const intptr_t s = own_stream(device.id);
    detail::event_wait(device.id, event, s, true);
    return s;
  }
  DeviceExport export_memory(Device device, uintptr_t ptr, uint64_t span) const override {
    check_device(device, "export CUDA memory");
    return detail::export_memory(device.id, ptr, span);
  }
  DeviceExport allocate_exportable(Device device, size_t nbytes) const override {
    check_device(device, "allocate shareable CUDA memory");
    return detail::allocate_exportable(device.id, nbytes);
  }
  IpcEvent create_ipc_event(Device device) const override {
    check_device(device, "create an interprocess CUDA event");
    return detail::create_ipc_event(device.id);
  }
  void record_ipc_event(const IpcEvent& event, intptr_t stream, bool chain) const override {
    detail::record_ipc_event(event, stream, chain);
  }
  IpcEvent open_ipc_event(const std::array<uint8_t, 16>& uuid, const std::array<uint8_t, 64>& handle) const override {
    return detail::open_ipc_event(uuid, handle);
  }
  DeviceImport open_memory(DeviceExport::Kind kind, const std::array<uint8_t, 16>& uuid, int fd,
                           const std::array<uint8_t, 64>& handle, uint64_t handle_offset,
                           uint64_t bytes) const override {
    return detail::open_memory(kind, uuid, fd, handle, handle_offset, bytes);
  }
  intptr_t wait_ipc_event(const IpcEvent& event) const override { return detail::wait_ipc_event(event); }
  void release_after_work(Device device, const std::vector<int64_t>* streams,
                          std::shared_ptr<const void> what) const override {
    detail::release_after_work(device.id, streams, std::move(what));
  }
  std::shared_ptr<Buffer> allocate_idle(Device device, size_t nbytes, bool any_stream_readers) const override {
    if (device.type != kDLCUDA)
      throw Error(ErrorCode::invalid_argument, "allocate_idle: " + device.str() + " is not a CUDA device");
    check_device(device, "allocate CUDA memory");
    // A cached block whose users' work is done (its free event has completed), else a fresh one: nothing to
    // order and nothing to wait for (the net thread, which lands messages here, serves every session). It belongs
    // to a stream nothing else uses, where its free event goes when it returns.
    poll_pending();
    std::shared_ptr<Buffer> block = pool(device.id).allocate(nbytes, idle_stream(device.id), /*idle=*/true);
    void* const base = block->base();
    std::shared_ptr<const void> owner = block;  // (back with an event on its own idle stream: complete at once)
    if (any_stream_readers) {
      const int dev = device.id;
      owner = std::shared_ptr<const void>(base, [block, dev](const void*) mutable {
        // Its readers' kernels may run on any stream: back to the pool once the device's work so far is done.
        detail::release_after_work(dev, nullptr, std::move(block));
      });
    }
    return std::make_shared<Buffer>(base, nbytes, device, std::move(owner));
  }
  bool bind_thread() const noexcept override {
    if (!driver().status.empty()) return false;
    const Api& a = driver().api;
    CUcontext current = nullptr;
    if (a.cuCtxGetCurrent(&current) != kSuccess || current) return false;
    const CUcontext c = first_retained_context();
    return c && a.cuCtxSetCurrent(c) == kSuccess;
  }
  void unbind_thread() const noexcept override {
    if (driver().status.empty()) driver().api.cuCtxSetCurrent(nullptr);
  }
};
const CudaRuntime g_runtime;

}  // namespace
}  // namespace detail

void install_runtime() noexcept { install_device_runtime(&detail::g_runtime); }

namespace {
// Loading the library installs the runtime (no driver is touched until a CUDA call is made).
const bool g_installed = (install_runtime(), true);
}  // namespace

}  // namespace tw::cuda

// Named by the static library's link interface (-Wl,--undefined), so that a program linking libtensorwire.a gets
// this object, and with it the installed runtime, even when it names nothing of tw::cuda itself.
extern "C" const bool tensorwire_cuda_runtime_anchor = true;

namespace tw::cuda {

PoolStats pinned_pool_stats() noexcept {
  (void)g_installed;
  try {
    return detail::pool(-1).stats();
  } catch (...) {
    return {};
  }
}

PoolStats device_pool_stats(int device) noexcept {
  if (device < 0 || device >= device_count()) return {};
  try {
    return detail::pool(device).stats();
  } catch (...) {
    return {};
  }
}

void empty_cache() {
  if (!driver_available()) return;
  detail::wait_releases();
  detail::wait_all_pending();
  detail::pool(-1).release_cached();
  for (int d = 0; d < device_count(); ++d) detail::pool(d).release_cached();
}

}  // namespace tw::cuda
