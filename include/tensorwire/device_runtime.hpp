// tensorwire/device_runtime.hpp — the little a host-side layer needs from a device backend, without naming it.
//
// Interop must ask "which device owns this pointer", wait for a producer's stream and make or wait on events
// (CUDA Array Interface imports, Arrow device arrays). It asks through this interface, so `interop` never calls
// a driver: the `cuda` layer implements it and tw::cuda::install_runtime() installs it (the Python module and the
// C ABI do so when they load; a C++ program that hands CUDA memory to interop calls it once). Without one
// installed, every question gets a clear "no device runtime is installed" answer, never a silent skip.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace tw {

class DeviceRuntime {
 public:
  virtual ~DeviceRuntime() = default;
  /// True when the backend can reach a device.
  virtual bool available() const noexcept = 0;
  /// Why it cannot ("libcuda.so.1 not found"), or "" when it can.
  virtual std::string status() const = 0;
  /// The device ordinal that owns `ptr`, or nullopt when unknown (no driver, not a device pointer).
  virtual std::optional<int> device_of_pointer(uintptr_t ptr) const noexcept = 0;
  /// Blocks until the work queued on `stream` is done (1, 2: the legacy and per-thread default streams).
  virtual void synchronize_stream(intptr_t stream) const = 0;
  /// An event recorded on `stream`; destroy_event releases it.
  virtual void* record_event(intptr_t stream) const = 0;
  virtual void destroy_event(void* event) const noexcept = 0;
  virtual void synchronize_event(void* event) const = 0;
};

/// The installed runtime, or one that answers "no device runtime is installed" to everything.
const DeviceRuntime& device_runtime() noexcept;
/// Whether one is installed. A layer that would skip device work because the runtime is unavailable (no driver:
/// nothing can be pending) must not skip it because none is installed: it refuses instead.
bool device_runtime_installed() noexcept;
/// Installs `r` (must outlive every later call; null restores the empty one). Thread-safe.
void install_device_runtime(const DeviceRuntime* r) noexcept;

}  // namespace tw
