// The CUDA driver API, resolved with dlopen so tensorwire loads on machines without one.
#include <dlfcn.h>

#include <mutex>

#include "tensorwire/cuda.hpp"
#include "tensorwire/device_runtime.hpp"
#include "tensorwire/error.hpp"

namespace tw::cuda {
namespace {

using CUresult = int;
using CUdevice = int;
// Values from the CUDA driver API reference: CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9.
constexpr int kPointerAttributeDeviceOrdinal = 9;

struct Driver {
  void* lib = nullptr;
  std::string status;
  CUresult (*cuInit)(unsigned) = nullptr;
  CUresult (*cuPointerGetAttribute)(void*, int, unsigned long long) = nullptr;
  CUresult (*cuStreamSynchronize)(void*) = nullptr;
  // Events (Arrow's sync_event): optional, resolved when present.
  CUresult (*cuEventCreate)(void**, unsigned) = nullptr;
  CUresult (*cuEventRecord)(void*, void*) = nullptr;
  CUresult (*cuEventDestroy)(void*) = nullptr;
  CUresult (*cuEventSynchronize)(void*) = nullptr;
};

const Driver& driver() {
  static Driver d;
  static std::once_flag once;
  std::call_once(once, [] {
    d.lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!d.lib) {
      d.status = "libcuda.so.1 could not be loaded (no NVIDIA driver on this machine)";
      return;
    }
    d.cuInit = reinterpret_cast<decltype(d.cuInit)>(dlsym(d.lib, "cuInit"));
    d.cuPointerGetAttribute = reinterpret_cast<decltype(d.cuPointerGetAttribute)>(dlsym(d.lib, "cuPointerGetAttribute"));
    d.cuStreamSynchronize = reinterpret_cast<decltype(d.cuStreamSynchronize)>(dlsym(d.lib, "cuStreamSynchronize"));
    d.cuEventCreate = reinterpret_cast<decltype(d.cuEventCreate)>(dlsym(d.lib, "cuEventCreate"));
    d.cuEventRecord = reinterpret_cast<decltype(d.cuEventRecord)>(dlsym(d.lib, "cuEventRecord"));
    d.cuEventDestroy = reinterpret_cast<decltype(d.cuEventDestroy)>(dlsym(d.lib, "cuEventDestroy_v2"));
    d.cuEventSynchronize = reinterpret_cast<decltype(d.cuEventSynchronize)>(dlsym(d.lib, "cuEventSynchronize"));
    if (!d.cuInit || !d.cuPointerGetAttribute || !d.cuStreamSynchronize) {
      d.status = "libcuda.so.1 lacks cuInit/cuPointerGetAttribute/cuStreamSynchronize";
      return;
    }
    if (CUresult r = d.cuInit(0); r != 0) d.status = "cuInit failed with CUresult " + std::to_string(r);
  });
  return d;
}

}  // namespace

bool driver_available() noexcept {
  try {
    return driver().status.empty();
  } catch (...) {
    return false;
  }
}

std::string driver_status() { return driver().status; }

std::optional<int> device_of_pointer(uintptr_t ptr) noexcept {
  if (!driver_available()) return std::nullopt;
  int ordinal = -1;
  CUresult r = driver().cuPointerGetAttribute(&ordinal, kPointerAttributeDeviceOrdinal, ptr);
  if (r != 0 || ordinal < 0) return std::nullopt;
  return ordinal;
}

void synchronize_stream(intptr_t stream) {
  if (!driver_available())
    throw Error(ErrorCode::device_unavailable, "cannot synchronize CUDA stream: " + driver_status());
  CUresult r = driver().cuStreamSynchronize(reinterpret_cast<void*>(stream));
  if (r != 0)
    throw Error(ErrorCode::invalid_argument,
                "cuStreamSynchronize(" + std::to_string(stream) + ") failed with CUresult " + std::to_string(r));
}

namespace {
const Driver& event_driver(const char* what) {
  if (!driver_available())
    throw Error(ErrorCode::device_unavailable, std::string(what) + ": no CUDA driver: " + driver_status());
  const Driver& d = driver();
  if (!d.cuEventCreate || !d.cuEventRecord || !d.cuEventDestroy || !d.cuEventSynchronize)
    throw Error(ErrorCode::device_unavailable, std::string(what) + ": libcuda.so.1 lacks the cuEvent* functions");
  return d;
}
}  // namespace

void* record_event(intptr_t stream) {
  const Driver& d = event_driver("record_event");
  void* ev = nullptr;
  constexpr unsigned kDisableTiming = 0x2;  // CU_EVENT_DISABLE_TIMING: the cheapest event to record and wait on
  if (CUresult r = d.cuEventCreate(&ev, kDisableTiming); r != 0)
    throw Error(ErrorCode::invalid_argument, "cuEventCreate failed with CUresult " + std::to_string(r));
  if (CUresult r = d.cuEventRecord(ev, reinterpret_cast<void*>(stream)); r != 0) {
    d.cuEventDestroy(ev);
    throw Error(ErrorCode::invalid_argument, "cuEventRecord on stream " + std::to_string(stream) +
                                                 " failed with CUresult " + std::to_string(r));
  }
  return ev;
}

void destroy_event(void* event) noexcept {
  if (!event || !driver_available() || !driver().cuEventDestroy) return;
  driver().cuEventDestroy(event);
}

void synchronize_event(void* event) {
  const Driver& d = event_driver("synchronize_event");
  if (CUresult r = d.cuEventSynchronize(event); r != 0)
    throw Error(ErrorCode::invalid_argument, "cuEventSynchronize failed with CUresult " + std::to_string(r));
}

namespace {
// The driver behind interop's DeviceRuntime interface (tensorwire/device_runtime.hpp).
class DriverRuntime final : public DeviceRuntime {
 public:
  bool available() const noexcept override { return driver_available(); }
  std::string status() const override { return driver_status(); }
  std::optional<int> device_of_pointer(uintptr_t ptr) const noexcept override { return cuda::device_of_pointer(ptr); }
  void synchronize_stream(intptr_t stream) const override { cuda::synchronize_stream(stream); }
  void* record_event(intptr_t stream) const override { return cuda::record_event(stream); }
  void destroy_event(void* event) const noexcept override { cuda::destroy_event(event); }
  void synchronize_event(void* event) const override { cuda::synchronize_event(event); }
};
const DriverRuntime g_runtime;
}  // namespace

void install_runtime() noexcept { install_device_runtime(&g_runtime); }

}  // namespace tw::cuda
