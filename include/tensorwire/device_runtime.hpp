// tensorwire/device_runtime.hpp — the little a host-side layer needs from a device backend, without naming it.
//
// Interop must ask "which device owns this pointer", wait for a producer's stream and make or wait on events
// (CUDA Array Interface imports, Arrow device arrays). It asks through this interface, so `interop` never calls
// a driver: the `cuda` layer implements it and tw::cuda::install_runtime() installs it (the Python module and the
// C ABI do so when they load; a C++ program that hands CUDA memory to interop calls it once). Without one
// installed, every question gets a clear "no device runtime is installed" answer, never a silent skip.
#pragma once
#if defined(__cplusplus) && __cplusplus < 202002L && !(defined(_MSVC_LANG) && _MSVC_LANG >= 202002L)
#error "tensorwire's C++ headers need C++20 (-std=c++20); C and older C++ take the C API, tensorwire/tensorwire.h"
#endif

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>
#include <optional>
#include <string>

#include "tensorwire/device.hpp"

namespace tw {

class Buffer;
class Tensor;

/// Device memory another process can open (CUDA IPC; the publish/subscribe transport's device path).
struct DeviceExport {
  enum class Kind : uint8_t {
    none = 0,    ///< no zero-copy path: `why` says why (a stream-ordered pool, memory another process exported...)
    vmm = 1,     ///< a VMM allocation exported as a POSIX fd (`fd`, owned by the caller)
    legacy = 2,  ///< a cudaMalloc allocation, by its CUipcMemHandle (`handle`, of the allocation's base)
  };
  Kind kind = Kind::none;
  int device = -1;
  uintptr_t base = 0;          ///< where the exported range starts in this process
  uint64_t bytes = 0;          ///< its size
  uint64_t handle_offset = 0;  ///< legacy: `base` minus the start of the allocation the handle opens (vmm: 0)
  int fd = -1;                 ///< vmm: the caller closes it
  std::array<uint8_t, 64> handle{};
  std::array<uint8_t, 16> device_uuid{};
  std::shared_ptr<void> owner;  ///< allocate_exportable: frees the memory when the last copy goes (null otherwise)
  std::string why;
};

/// An interprocess event: created here (its handle crosses to another process) or opened from such a handle.
struct IpcEvent {
  std::shared_ptr<void> event;  ///< the CUevent (get()); destroyed with the last copy
  std::array<uint8_t, 64> handle{};
  int device = -1;
};

/// Memory another process exported, opened here.
struct DeviceImport {
  uintptr_t base = 0;           ///< the exported range, in this process
  uint64_t bytes = 0;
  int device = -1;              ///< this process's ordinal of the device
  std::shared_ptr<void> owner;  ///< closes the handle (unmaps) when the last copy goes
};

class DeviceRuntime {
 public:
  virtual ~DeviceRuntime() = default;
  /// True when the backend can reach a device.
  virtual bool available() const noexcept = 0;
  /// Why it cannot ("libcuda.so.1 not found"), or "" when it can.
  virtual std::string status() const = 0;
  /// The device ordinal that owns `ptr`, or nullopt when unknown (no driver, not a device pointer).
  virtual std::optional<int> device_of_pointer(uintptr_t ptr) const noexcept = 0;
  /// Blocks until the work queued on `stream` of `device` is done (1, 2: that device's legacy and per-thread
  /// default streams; a stream handle belongs to its own device).
  virtual void synchronize_stream(Device device, intptr_t stream) const = 0;
  /// An event recorded on `stream` of `device` (as above); destroy_event releases it.
  virtual void* record_event(Device device, intptr_t stream) const = 0;
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

  // ---- a foreign producer's ordering. The defaults answer "no device runtime". ----
  /// An event recorded now on `stream` of `device` (as for record_event), destroyed with the last copy of the
  /// result: what set_producer_stream keeps in a tensor. The default returns null (the tensor keeps the stream alone).
  virtual std::shared_ptr<void> capture_event(Device device, intptr_t stream) const;
  /// Makes `consumer` (a stream of `device`; 1, 2: its default streams) wait for `event`, without blocking the host.
  virtual void wait_event(Device device, void* event, intptr_t consumer) const;
  /// tensorwire's own stream of `device` (non-blocking, alive as long as the process), made to wait for `event`
  /// first: for a consumer that takes a stream handle rather than an event.
  virtual intptr_t stream_after_event(Device device, void* event) const;

  // ---- between processes (CUDA IPC). The defaults answer "not supported by this runtime". ----
  /// How another process can open the allocation holding [ptr, ptr + span) on `device` without a copy: a VMM fd, a
  /// legacy handle, or Kind::none with the reason (memory from a stream-ordered pool, a range that crosses
  /// allocations, memory this process opened from another's handle, a driver without IPC).
  virtual DeviceExport export_memory(Device device, uintptr_t ptr, uint64_t span) const;
  /// A device allocation of its own (never shared with other blocks) that export_memory can send: VMM with a POSIX
  /// fd. `owner` in the result frees it. Throws Error naming why (out_of_memory, no VMM support).
  virtual DeviceExport allocate_exportable(Device device, size_t nbytes) const;
  /// An interprocess event on `device` (timing disabled), with its handle.
  virtual IpcEvent create_ipc_event(Device device) const;
  /// Records `event` on `stream`; with `chain`, `stream` first waits for the event's previous record, so the new
  /// record completes only after everything it covered before (an event re-recorded while a consumer may still
  /// wait on it never covers less).
  virtual void record_ipc_event(const IpcEvent& event, intptr_t stream, bool chain) const;
  /// Opens another process's event on the device with `uuid`.
  virtual IpcEvent open_ipc_event(const std::array<uint8_t, 16>& uuid, const std::array<uint8_t, 64>& handle) const;
  /// Opens another process's export (`fd` for vmm, borrowed; `handle` + `handle_offset` for legacy) of `bytes` on
  /// the device with `uuid`. Throws Error(device_unavailable) when this process has no such device.
  virtual DeviceImport open_memory(DeviceExport::Kind kind, const std::array<uint8_t, 16>& uuid, int fd,
                                   const std::array<uint8_t, 64>& handle, uint64_t handle_offset,
                                   uint64_t bytes) const;
  /// Makes this process's receive stream of the event's device wait for `event` (queued: the host never waits);
  /// returns that stream, on which received tensors are ordered.
  virtual intptr_t wait_ipc_event(const IpcEvent& event) const;
  /// Lets `what` go (drops this reference) once the work queued so far on `streams` of `device` is done, or all the
  /// work queued so far on the device when `streams` is null, without blocking the caller. A received tensor's
  /// lease goes through here: the publisher may reuse the memory only after the consumer's kernels read it. The
  /// default drops it at once (with no device runtime no work can be queued).
  virtual void release_after_work(Device device, const std::vector<int64_t>* streams,
                                  std::shared_ptr<const void> what) const;
  /// `nbytes` of cuda:N pool memory for a writer outside any stream (a network transport lands a message there):
  /// the work of its previous users is done (a cached block is reused only when its event says so, else fresh
  /// memory is allocated: the host never waits). Once the last reference goes it returns to the pool: with
  /// `any_stream_readers`, when all the work queued on the device by then is done (its readers may have used any
  /// stream); without, at once (its users waited for their own device work before letting go). The default says
  /// "not supported".
  virtual std::shared_ptr<Buffer> allocate_idle(Device device, size_t nbytes, bool any_stream_readers) const;
  /// For a thread about to call into a library that drives the device itself without making a context current
  /// first (UCX's CUDA transports, progressed on tensorwire's net thread): when the thread has no current context,
  /// makes current the context of the lowest-numbered device this process has already used through tensorwire
  /// (never creating one: a process that uses no device, or only cuda:1, gets no context on cuda:0) and returns
  /// true; unbind_thread() makes the thread context-less again. Never throws; the defaults do nothing.
  virtual bool bind_thread() const noexcept;
  virtual void unbind_thread() const noexcept;
};

/// Records that `t` (CUDA memory a foreign producer made, or a device result of tensorwire's own work) is ordered
/// on `stream` (1, 2: the default streams, or a handle): sets t.stream() and, for any stream but the legacy
/// default, keeps an event recorded on it now (Tensor::ready_event), so that later uses never touch that stream
/// again. The producer may destroy its stream while the tensor lives, and the per-thread default stream means
/// another stream on another thread. Memory the host can read (pinned, managed) is waited for now, since host
/// readers cannot wait on an event. Without a driver (nothing can be pending) only the stream is set.
void set_producer_stream(Tensor& t, intptr_t stream);
/// Makes `consumer` (a stream of t's device; -1: none, nothing to do) wait for t's data: for its ready event, else
/// for an event recorded on its stream now (nothing when that is `consumer` itself or it has no stream).
void order_after(const Tensor& t, intptr_t consumer);
/// The stream a consumer that takes a stream handle (the CUDA Array Interface) should wait for to read t: its
/// stream, or, when it has a ready event, tensorwire's stream ordered after that event; nullopt when t names none.
std::optional<intptr_t> stream_for_consumers(const Tensor& t);

/// The installed runtime, or one that answers "no device runtime is installed" to everything.
const DeviceRuntime& device_runtime() noexcept;
/// Whether one is installed. A layer that would skip device work because the runtime is unavailable (no driver:
/// nothing can be pending) must not skip it because none is installed: it refuses instead.
bool device_runtime_installed() noexcept;
/// Installs `r` (must outlive every later call; null restores the empty one). Thread-safe.
void install_device_runtime(const DeviceRuntime* r) noexcept;

}  // namespace tw
