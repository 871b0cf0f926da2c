#include "tensorwire/device_runtime.hpp"

#include <atomic>

#include "tensorwire/error.hpp"
#include "tensorwire/tensor.hpp"

namespace tw {
namespace {

class NoRuntime final : public DeviceRuntime {
 public:
  bool available() const noexcept override { return false; }
  std::string status() const override {
    return "no device runtime is installed: call tw::cuda::install_runtime(), or link the static libtensorwire.a "
           "with -Wl,--undefined=tensorwire_cuda_runtime_anchor (CMake's tensorwire::tensorwire target adds it; the "
           "shared library needs neither)";
  }
  std::optional<int> device_of_pointer(uintptr_t) const noexcept override { return std::nullopt; }
  void synchronize_stream(Device, intptr_t) const override { fail(); }
  void* record_event(Device, intptr_t) const override { fail(); }
  void destroy_event(void*) const noexcept override {}
  void synchronize_event(void*) const override { fail(); }
  int device_count() const noexcept override { return 0; }
  std::shared_ptr<Buffer> allocate(Device, size_t, intptr_t) const override { fail(); }
  void copy(const Tensor&, const Tensor&, intptr_t) const override { fail(); }
  void stream_wait(Device, intptr_t, intptr_t) const override { fail(); }

 private:
  [[noreturn]] void fail() const { throw Error(ErrorCode::device_unavailable, status()); }
};

const NoRuntime g_none;
std::atomic<const DeviceRuntime*> g_runtime{nullptr};

[[noreturn]] void no_ipc(const DeviceRuntime& r, const char* what) {
  const std::string st = r.status();
  throw Error(ErrorCode::device_unavailable, std::string(what) + ": this device runtime has no CUDA IPC" +
                                                 (st.empty() ? std::string() : " (" + st + ")"));
}

[[noreturn]] void no_device(const DeviceRuntime& r, const char* what) {
  const std::string st = r.status();
  throw Error(ErrorCode::device_unavailable,
              std::string(what) + ": this device runtime cannot" + (st.empty() ? std::string() : " (" + st + ")"));
}

bool orders_streams(const Tensor& t) {
  const DLDeviceType d = t.device().type;
  return d == kDLCUDA || d == kDLCUDAManaged;
}

}  // namespace

void set_producer_stream(Tensor& t, intptr_t stream) {
  const DeviceRuntime& rt = device_runtime();
  const bool host_reads = t.device().is_host_accessible();  // pinned or managed: read by the host at once
  if (!rt.available() || (!orders_streams(t) && !host_reads)) {
    t.set_stream(stream);
    return;
  }
  if (stream == 1) {  // the legacy default stream lives as long as its context
    if (host_reads) rt.synchronize_stream(t.device(), stream);
    t.set_stream(stream);
    return;
  }
  std::shared_ptr<void> ev = rt.capture_event(t.device(), stream);
  if (host_reads) {
    // The host may read it as soon as this returns (NumPy, the buffer protocol, host copies): wait now. Later uses
    // still wait on the (completed) event, never on the stream.
    if (ev) rt.synchronize_event(ev.get());
    else rt.synchronize_stream(t.device(), stream);
  }
  t.set_stream(stream, std::move(ev));
}

void order_after(const Tensor& t, intptr_t consumer) {
  if (consumer == -1 || !orders_streams(t) || !t.stream()) return;
  const DeviceRuntime& rt = device_runtime();
  if (!rt.available()) return;  // no driver: no work can be pending
  if (void* ev = t.ready_event()) {
    rt.wait_event(t.device(), ev, consumer);  // even for an equal handle: 2 is each thread's own stream
  } else if (consumer != *t.stream()) {
    rt.stream_wait(t.device(), *t.stream(), consumer);
  }
}

std::optional<intptr_t> stream_for_consumers(const Tensor& t) {
  if (!t.stream()) return std::nullopt;
  if (void* ev = t.ready_event()) return device_runtime().stream_after_event(t.device(), ev);
  return t.stream();
}

DeviceExport DeviceRuntime::export_memory(Device, uintptr_t, uint64_t) const {
  DeviceExport e;
  e.why = "this device runtime has no CUDA IPC";
  return e;
}
DeviceExport DeviceRuntime::allocate_exportable(Device, size_t) const { no_ipc(*this, "allocate shareable device memory"); }
IpcEvent DeviceRuntime::create_ipc_event(Device) const { no_ipc(*this, "create an interprocess event"); }
void DeviceRuntime::record_ipc_event(const IpcEvent&, intptr_t, bool) const { no_ipc(*this, "record an interprocess event"); }
IpcEvent DeviceRuntime::open_ipc_event(const std::array<uint8_t, 16>&, const std::array<uint8_t, 64>&) const {
  no_ipc(*this, "open another process's event");
}
DeviceImport DeviceRuntime::open_memory(DeviceExport::Kind, const std::array<uint8_t, 16>&, int,
                                        const std::array<uint8_t, 64>&, uint64_t, uint64_t) const {
  no_ipc(*this, "open another process's device memory");
}
intptr_t DeviceRuntime::wait_ipc_event(const IpcEvent&) const { no_ipc(*this, "wait for another process's event"); }
std::shared_ptr<void> DeviceRuntime::capture_event(Device, intptr_t) const { return nullptr; }  // the stream alone
void DeviceRuntime::wait_event(Device, void*, intptr_t) const { no_device(*this, "wait for a CUDA event"); }
intptr_t DeviceRuntime::stream_after_event(Device, void*) const { no_device(*this, "order a stream after an event"); }
void DeviceRuntime::release_after_work(Device, const std::vector<int64_t>*, std::shared_ptr<const void> what) const {
  what.reset();
}
std::shared_ptr<Buffer> DeviceRuntime::allocate_idle(Device, size_t, bool) const {
  no_device(*this, "allocate device memory for a writer outside any stream");
}
bool DeviceRuntime::bind_thread() const noexcept { return false; }
void DeviceRuntime::unbind_thread() const noexcept {}

const DeviceRuntime& device_runtime() noexcept {
  const DeviceRuntime* r = g_runtime.load(std::memory_order_acquire);
  return r ? *r : g_none;
}

void install_device_runtime(const DeviceRuntime* r) noexcept { g_runtime.store(r, std::memory_order_release); }

bool device_runtime_installed() noexcept { return g_runtime.load(std::memory_order_acquire) != nullptr; }

}  // namespace tw
