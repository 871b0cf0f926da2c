// tensorwire/cuda.hpp — the little of the CUDA driver that interop needs, loaded at run time.
// No link-time dependency on libcuda: on a machine without a driver (or without a GPU) every function reports
// that plainly instead of failing to load. Nothing here touches device memory.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace tw::cuda {

/// True when libcuda could be loaded and cuInit succeeded (at least one device is usable).
bool driver_available() noexcept;
/// Why the driver is unavailable ("libcuda.so.1 not found", "cuInit failed: 100 (no device)"), or "" when it is.
std::string driver_status();
/// The device ordinal owning `ptr` as the driver reports it, or nullopt when the driver is unavailable or the
/// pointer is unknown to it.
std::optional<int> device_of_pointer(uintptr_t ptr) noexcept;
/// Blocks until all work queued on `stream` is done. 1 and 2 are the legacy and per-thread default streams.
/// Throws Error(device_unavailable) without a driver, Error(invalid_argument) when the driver refuses the stream.
void synchronize_stream(intptr_t stream);

/// Creates a CUDA event (a CUevent, returned as a pointer) and records it on `stream` (1 and 2 as above): the
/// event completes when the work queued so far on the stream is done. Used for Arrow's `sync_event`. The caller
/// destroys it with destroy_event. Throws Error(device_unavailable) without a driver, Error(invalid_argument) when
/// the driver refuses.
void* record_event(intptr_t stream);
/// Destroys an event made by record_event; a null event or a missing driver is a no-op.
void destroy_event(void* event) noexcept;
/// Blocks until `event` (a CUevent) has completed. Throws like record_event.
void synchronize_event(void* event);

/// Installs the driver as interop's DeviceRuntime (tensorwire/device_runtime.hpp). The Python module and the C ABI
/// call it when they load; a C++ program that imports CUDA memory through interop calls it once.
void install_runtime() noexcept;

}  // namespace tw::cuda
