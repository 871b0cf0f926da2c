// ipc.hpp (private to the cuda layer) — CUDA memory and events between processes, behind tw::DeviceRuntime.
//
// Exporting: tensorwire's own publisher pool allocates each buffer as a VMM allocation of its own with a POSIX
// fd handle type (allocate_exportable), so its fd crosses a Unix socket like a memfd and exposes nothing else.
// A caller's memory (export_memory) crosses without a copy when the driver can name it: a VMM allocation made
// with a POSIX fd handle type (PyTorch's expandable segments) by that fd, a cudaMalloc allocation (PyTorch's
// caching allocator) by the legacy CUipcMemHandle of its base. Anything else says why not, and the publisher
// copies it once into its pool instead.
//
// Importing: open_memory maps a VMM fd at a fresh address range, or opens a legacy handle (older drivers refuse a
// second cuIpcOpenMemHandle of one allocation in a process, newer ones count references: either way, opens are cached
// process-wide by handle and shared until the last user goes). Events: the publisher records an interprocess event on
// the producer's stream before each message; the subscriber makes its receive stream (one non-blocking stream per
// device) wait on it, so no host thread ever waits for the device on the hot path.
//
// Devices are named by UUID across processes: ordinals differ when CUDA_VISIBLE_DEVICES does.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "tensorwire/device_runtime.hpp"

namespace tw::cuda::detail {

DeviceExport export_memory(int device, uintptr_t ptr, uint64_t span);
DeviceExport allocate_exportable(int device, size_t nbytes);
IpcEvent create_ipc_event(int device);
void record_ipc_event(const IpcEvent& event, intptr_t stream, bool chain);
IpcEvent open_ipc_event(const std::array<uint8_t, 16>& uuid, const std::array<uint8_t, 64>& handle);
DeviceImport open_memory(DeviceExport::Kind kind, const std::array<uint8_t, 16>& uuid, int fd,
                         const std::array<uint8_t, 64>& handle, uint64_t handle_offset, uint64_t bytes);
intptr_t wait_ipc_event(const IpcEvent& event);
/// DeviceRuntime::release_after_work: events are recorded on `streams` now; one thread per process (started on
/// first use) waits for them, or for the whole device when `streams` is null, in order, then drops `what`.
void release_after_work(int device, const std::vector<int64_t>* streams, std::shared_ptr<const void> what);
/// Blocks until every release queued so far is done (empty_cache; tests).
void wait_releases();
/// Tests: release_after_work behaves as when its thread cannot start (it waits on the caller's thread instead).
void fail_release_queue_for_testing(bool fail);

/// This process's ordinal of the device with `uuid`; throws Error(device_unavailable) naming the UUID when none.
int device_of_uuid(const std::array<uint8_t, 16>& uuid);
/// The UUID of cuda:`device`.
std::array<uint8_t, 16> device_uuid(int device);
/// Legacy handles open in this process now (tests: every open is closed when no lease uses it).
size_t open_legacy_handles();

}  // namespace tw::cuda::detail
