// pool.hpp (private to the cuda layer) — tensorwire's device and pinned memory pools.
//
// One pool per device (VMM blocks: cuMemCreate with a POSIX file-descriptor handle type where the device supports
// it, so that issue 10 can pass a segment over a Unix socket like a memfd; cuMemAlloc where it does not) and one
// pinned host pool (cuMemHostAlloc, portable). Sizes are rounded to classes; requests up to kSlabMax bytes are
// carved from 2 MiB segments in slots of their class, larger ones get a segment each. A returned block is cached
// for reuse, given back to the driver by empty_cache() or when the driver runs out of memory (the pool's idle
// segments are released and the allocation tried once more).
//
// Ordering. A block returns with an event recorded on the stream it was allocated for (queued work there may
// still use it) — or, when that stream is a blocking one (the per-thread default stream 2, a caller's stream made
// without CU_STREAM_NON_BLOCKING), on the legacy default stream, which orders after every blocking stream and so
// never names a caller's handle that may be destroyed by then. A copy's scratch block returns with no event once
// its copy is done (settle). A stream found gone makes the pool wait for the device instead. Device reuse is
// stream-ordered: on the same stream at once, on another stream after a cuStreamWaitEvent on that event — the host
// never waits. Pinned memory is written by the host, so a pinned block
// is reused only once its event has completed (a block still in flight is skipped; only when the pool is over its
// soft limit does the host wait for the oldest).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "cuda/driver.hpp"
#include "tensorwire/buffer.hpp"
#include "tensorwire/cuda.hpp"

namespace tw::cuda::detail {

inline constexpr size_t kSegmentBytes = size_t(2) << 20;  ///< slab segment size (and the usual VMM granularity)
inline constexpr size_t kSlabMax = size_t(1) << 20;       ///< larger requests get a segment of their own
inline constexpr size_t kMinClass = 512;                  ///< smallest class (also the alignment of every block)

/// The class a request of `n` bytes is served from: powers of two from kMinClass up to kSlabMax, then multiples of
/// a quarter of the enclosing power of two (at least `granularity`). Pure: unit-tested.
size_t size_class(size_t n, size_t granularity) noexcept;

/// A driver allocation: a slab segment or one large block.
struct Segment {
  uintptr_t base = 0;
  size_t size = 0;
  CUmemHandle handle = 0;  ///< VMM handle (0: cuMemAlloc / cuMemHostAlloc memory)
  bool vmm = false;
  size_t slots_out = 0;    ///< slab slots handed out (slab segments only)
  size_t slot_size = 0;    ///< 0 for a large block
  size_t busy = 0;         ///< its blocks out of both the cache and the live map while the host waits for their work
  bool poisoned = false;   ///< work on one of its blocks failed: that memory may still be touched, never freed
};

struct Block {
  uintptr_t ptr = 0;
  size_t size = 0;            ///< class size
  Segment* segment = nullptr;
  intptr_t stream = 0;          ///< where its free event goes (0: none, host-only use so far); see Ordering
  int stream_device = 0;        ///< the device `stream` belongs to
  CUevent free_event = nullptr; ///< recorded on `stream` when it came back; null when nothing can be pending
};

class Pool {
 public:
  /// device >= 0: cuda:device; -1: the pinned host pool.
  explicit Pool(int device) : device_(device) {}
  ~Pool() = default;  // pools live for the process (never destroyed: the driver may be gone at exit)
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  /// A Buffer of `nbytes` (its allocation: the block) whose last reference returns the block, with an event
  /// recorded on `stream` (device blocks; pinned blocks are host memory: whoever queues device work on one keeps
  /// its Buffer until that work is done, see hold() in copy.cpp).
  /// With `idle` (device pools), only a cached block whose free event has completed is reused, else a fresh one
  /// is made: for a writer outside any stream (no cuStreamWaitEvent could order it), with no host wait (except
  /// when the driver is out of memory: then the cache goes back to it once its pending work is done, as always).
  std::shared_ptr<Buffer> allocate(size_t nbytes, intptr_t stream, bool idle = false);
  /// The block containing [ptr, ptr + 1) handed out by this pool, as (block base, block size), or (0, 0).
  std::pair<uintptr_t, size_t> find(uintptr_t ptr) const;
  /// The live block at `ptr` has no work pending any more (a scratch block whose copy completed, see hold()): it
  /// comes back with no event, and its stream (a caller's, perhaps destroyed since) is never named again.
  void settle(uintptr_t ptr) noexcept;
  PoolStats stats() const;
  /// Gives every cached block whose work is done back to the driver (waiting for pending work first).
  void release_cached();
  /// Forgets everything without calling the driver (a fake driver was swapped in).
  void reset() noexcept;

  int device() const noexcept { return device_; }

 private:
  void give_back(Block* b) noexcept;
  Segment* new_segment(size_t bytes, size_t slot_size);
  /// A block of class `cls` from a new segment (slab slots but the first go to the cache).
  Block* fresh_block(size_t cls);
  /// Gives back to the driver every segment none of whose blocks is in use, after waiting (with the pool unlocked)
  /// for the work of its cached blocks.
  void release_cached_locked(std::unique_lock<std::mutex>& lk);
  Block* new_block(uintptr_t ptr, size_t size, Segment* seg);  // a Block object (reused from spare_) for a slot
  void free_segment(Segment* s) noexcept;
  Block* take_cached(size_t cls, intptr_t stream, bool idle, std::unique_lock<std::mutex>& lk);
  size_t granularity();

  const int device_;
  mutable std::mutex mu_;
  std::map<size_t, std::vector<Block*>> free_;          // class -> cached blocks (oldest first)
  std::unordered_map<uintptr_t, Block*> live_;          // handed-out blocks by address
  std::vector<std::unique_ptr<Segment>> segments_;
  std::vector<std::unique_ptr<Block>> blocks_;          // every Block object, reused
  std::vector<Block*> spare_;                           // Block objects not in use
  size_t granularity_ = 0;
  unsigned char rdma_ = 0;  // VMM memory of this device can be made readable and writable by NICs (GPUDirect RDMA)
  int vmm_ = -1;                                        // -1 unknown, 0 cuMemAlloc, 1 VMM with POSIX fd
  PoolStats stats_{};
};

/// cuda:device's pool (device >= 0) or the pinned pool (-1). Valid devices only (check_device first).
Pool& pool(int device);

/// The pinned pool's soft limit: beyond it an allocation waits for in-flight blocks rather than growing.
inline constexpr size_t kPinnedSoftLimit = size_t(1) << 30;

}  // namespace tw::cuda::detail
