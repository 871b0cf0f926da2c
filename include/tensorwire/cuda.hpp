// tensorwire/cuda.hpp — CUDA, through the driver API loaded at run time.
// No link-time dependency on libcuda or libcudart: on a machine without a driver (or without a GPU) everything
// host-side works and every CUDA call throws Error(device_unavailable) naming why. Entry points are resolved with
// cuGetProcAddress at a fixed API version, so a newer driver never hands tensorwire an older ABI.
//
// Memory: device tensors come from a per-device pool of VMM allocations (cuMemCreate with POSIX file-descriptor
// handles, so that a block can later cross processes) with stream-ordered reuse; pinned host tensors come from a
// pool of cuMemHostAlloc blocks in size classes. Copies: dense layouts through the driver's copies, every other
// layout through tensorwire's strided kernels (built by nvcc into the library, loaded with the module API).
// Tensor::to, Tensor::pin, Tensor::empty(..., device) and copies of device tensors reach this layer through
// tw::DeviceRuntime (installed when the library loads).
#pragma once
#if defined(__cplusplus) && __cplusplus < 202002L && !(defined(_MSVC_LANG) && _MSVC_LANG >= 202002L)
#error "tensorwire's C++ headers need C++20 (-std=c++20); C and older C++ take the C API, tensorwire/tensorwire.h"
#endif

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace tw::cuda {

/// DLPack's and the CUDA Array Interface's names for the default streams.
inline constexpr intptr_t kLegacyStream = 1;     ///< CU_STREAM_LEGACY
inline constexpr intptr_t kPerThreadStream = 2;  ///< CU_STREAM_PER_THREAD

/// True when the driver loaded, cuInit succeeded and at least one device is visible.
bool is_available() noexcept;
/// When is_available(), what is there ("1 CUDA device, driver 13.0"); otherwise why not, in words ("no NVIDIA
/// driver (libcuda.so.1 could not be loaded)", "cuInit failed: CUDA_ERROR_NO_DEVICE (100): ...").
std::string status();
/// Devices visible to this process (0 without a driver).
int device_count() noexcept;
/// The driver's CUDA version as major * 1000 + minor * 10 (13000 for 13.0), 0 without a driver.
int driver_version() noexcept;
/// True when the library carries its strided-copy kernels (the build had nvcc). Without them, copies between
/// two layouts that the driver's dense copies cannot express throw Error(unsupported) saying so.
bool kernels_built() noexcept;

/// One pool's counters.
struct PoolStats {
  size_t reserved_bytes = 0;  ///< bytes the pool holds from the driver (in use + cached)
  size_t in_use_bytes = 0;    ///< bytes in blocks handed out and not yet returned
  size_t cached_blocks = 0;   ///< free blocks kept for reuse
  uint64_t hits = 0;          ///< allocations served from a cached block
  uint64_t misses = 0;        ///< allocations that went to the driver
};
/// The pinned host pool's counters.
PoolStats pinned_pool_stats() noexcept;
/// The device pool's counters for cuda:`device`.
PoolStats device_pool_stats(int device) noexcept;
/// Returns every cached (free, no longer in use by queued work) block of both pools to the driver.
void empty_cache();

/// True when libcuda could be loaded and cuInit succeeded (at least one device is usable).
bool driver_available() noexcept;
/// Why the driver is unavailable ("libcuda.so.1 not found", "cuInit failed: 100 (no device)"), or "" when it is.
std::string driver_status();
/// The device ordinal owning `ptr` as the driver reports it, or nullopt when the driver is unavailable or the
/// pointer is unknown to it.
std::optional<int> device_of_pointer(uintptr_t ptr) noexcept;
/// Blocks until all work queued on `stream` is done. 1 and 2 are the legacy and per-thread default streams of
/// cuda:`device` (-1: of the calling thread's current context, else cuda:0's); a stream handle names its own
/// context, whatever `device` says. Throws Error(device_unavailable) without a driver, Error(invalid_argument) when
/// the driver refuses the stream.
void synchronize_stream(intptr_t stream, int device = -1);

/// Creates a CUDA event (a CUevent, returned as a pointer) in the context of `stream` (chosen as above) and
/// records it there: the event completes when the work queued so far on the stream is done. Used for Arrow's
/// `sync_event`. The caller destroys it with destroy_event. Throws Error(device_unavailable) without a driver,
/// Error(invalid_argument) when the driver refuses.
void* record_event(intptr_t stream, int device = -1);
/// Destroys an event made by record_event; a null event or a missing driver is a no-op.
void destroy_event(void* event) noexcept;
/// Blocks until `event` (a CUevent) has completed. Throws like record_event.
void synchronize_event(void* event);

/// Installs the driver as the DeviceRuntime (tensorwire/device_runtime.hpp). Loading the library does it (a static
/// initialiser in this layer); the Python module and the C ABI call it again, and a C++ program linking the static
/// library without naming anything of tw::cuda calls it once. Idempotent.
void install_runtime() noexcept;

}  // namespace tw::cuda
