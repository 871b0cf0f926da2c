// tensorwire/device_runtime.hpp — the little a host-side layer needs from a device backend, without naming it.
//
// Interop must ask "which device owns this pointer", wait for a producer's stream and make or wait on events
// (CUDA Array Interface imports, Arrow device arrays). It asks through this interface, so `interop` never calls
// a driver: the `cuda` layer implements it and tw::cuda::install_runtime() installs it (the Python module and the
// C ABI do so when they load; a C++ program that hands CUDA memory to interop calls it once). Without one
// installed, every question gets a clear "no device runtime is installed" answer, never a silent skip.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "tensorwire/device.hpp"

namespace tw {

class Buffer;
class Tensor;

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

  // ---- memory and copies (Tensor::empty on a device, Tensor::to, Tensor::pin, copies of device tensors) ----
  /// Number of devices the backend can use (0 without a driver).
  virtual int device_count() const noexcept = 0;
  /// `nbytes` of memory on `device`: cuda:N from the device pool, usable in the order of `stream`; cuda_host from
  /// the pinned host pool. The Buffer's allocation is the pool block. Throws Error naming why it cannot.
  virtual std::shared_ptr<Buffer> allocate(Device device, size_t nbytes, intptr_t stream) const = 0;
  /// Copies every element of `src` into `dst` (same shape and dtype, any two layouts, dst writable and not
  /// self-overlapping) where either side is device or pinned memory, queued on `stream` after `src`'s stream.
  /// Returns once the copy is queued, except into pageable host memory, where it returns once the data is there.
  virtual void copy(const Tensor& src, const Tensor& dst, intptr_t stream) const = 0;
  /// Makes `consumer` wait for the work queued so far on `producer` (an event recorded on one and waited on by the
  /// other, on `device`), without blocking the host. Equal streams: nothing to do.
  virtual void stream_wait(Device device, intptr_t producer, intptr_t consumer) const = 0;
};

/// The installed runtime, or one that answers "no device runtime is installed" to everything.
const DeviceRuntime& device_runtime() noexcept;
/// Whether one is installed. A layer that would skip device work because the runtime is unavailable (no driver:
/// nothing can be pending) must not skip it because none is installed: it refuses instead.
bool device_runtime_installed() noexcept;
/// Installs `r` (must outlive every later call; null restores the empty one). Thread-safe.
void install_device_runtime(const DeviceRuntime* r) noexcept;

}  // namespace tw
