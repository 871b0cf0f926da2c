// copy.hpp (private to the cuda layer) — planning and launching device copies; keeping buffers alive while
// queued work uses them.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "cuda/driver.hpp"
#include "tensorwire/buffer.hpp"
#include "tensorwire/layout.hpp"

namespace tw::cuda::detail {

/// A device copy reduced to units of `unit` bytes (1..16) and its fewest dimensions, with the kernel that runs it:
/// one cuMemcpyAsync, the tiled transpose (destination contiguous along the last dim, source along `row_dim`), or
/// the general strided kernel. Pure (no driver): unit-tested against the host engine.
struct KernelPlan {
  enum class Kind { memcpy, transpose, strided } kind = Kind::strided;
  uintptr_t src = 0;  ///< address of the first unit visited
  uintptr_t dst = 0;
  int64_t unit = 1;
  int64_t numel = 0;  ///< units
  int nd = 0;
  int row_dim = -1;
  int64_t n[kMaxRank];
  int64_t ss[kMaxRank];  ///< in units
  int64_t ds[kMaxRank];
};
KernelPlan plan_device_copy(const Layout& src, uintptr_t src_element0, const Layout& dst, uintptr_t dst_element0,
                            size_t itemsize);
/// Queues `p` on `stream` of cuda:`device` (kernels loaded on first use).
void launch(int device, const KernelPlan& p, intptr_t stream);

/// Keeps `keep` alive until the work queued so far on `stream` (cuda:`device`) is done. `scratch`: tensorwire's own
/// temporary blocks of cuda:`device`'s pool, used by that work only; once it is done they go back to the pool with
/// nothing to wait for (Pool::settle), never naming `stream` again (a caller may destroy it once the copy is queued).
void hold(int device, intptr_t stream, std::vector<std::shared_ptr<Buffer>> keep,
          std::vector<std::shared_ptr<Buffer>> scratch = {});
/// Releases the held buffers whose work is done (called on every allocation and copy).
void poll_pending() noexcept;
/// Waits for every held buffer's work and releases them all (empty_cache).
void wait_all_pending();
/// `consumer` waits for the work queued so far on `producer` (event + cuStreamWaitEvent; no host wait).
void stream_wait(int device, intptr_t producer, intptr_t consumer);
/// The same across devices: the event is recorded in the producer's context and waited on in the consumer's.
void stream_wait(int producer_device, intptr_t producer, int consumer_device, intptr_t consumer);

/// `consumer` (a stream of cuda:`device`) waits for `event`, recorded in any context; with `unless_done`, not when
/// the event has already completed.
void event_wait(int device, void* event, intptr_t consumer, bool unless_done = false);
/// A non-blocking stream per device, made on first use in that device's context and alive as long as the process
/// (forgotten when a test swaps the driver). Each user that must not be ordered after another's work has its own;
/// every instance must live as long as the process (the reset hook names it).
class DeviceStreams {
 public:
  DeviceStreams();
  DeviceStreams(const DeviceStreams&) = delete;
  DeviceStreams& operator=(const DeviceStreams&) = delete;
  intptr_t get(int device);
  /// Drops every stream (a test swapped the driver: they belong to the old one).
  void forget();

 private:
  std::mutex mu_;
  std::map<int, intptr_t> streams_;
};
/// tensorwire's own stream of cuda:`device` (a DeviceStreams of its own).
intptr_t own_stream(int device);
/// The stream allocate_idle's blocks belong to (a DeviceStreams of its own): nothing is ever queued there but their
/// free events, so a block comes back ordered after nobody's work.
intptr_t idle_stream(int device);

bool kernels_built_impl() noexcept;

}  // namespace tw::cuda::detail
