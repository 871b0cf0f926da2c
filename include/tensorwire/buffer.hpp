// tensorwire/buffer.hpp — the owner of a tensor's memory.
// A Buffer names the allocation a tensor lives in (its base address and byte size, on a device) and holds
// whatever keeps that memory valid (the producer's object, a container, a mapping). Views of one buffer share it;
// the memory is released when the last view and the last Buffer reference are gone.
#pragma once
#if defined(__cplusplus) && __cplusplus < 202002L && !(defined(_MSVC_LANG) && _MSVC_LANG >= 202002L)
#error "tensorwire's C++ headers need C++20 (-std=c++20); C and older C++ take the C API, tensorwire/tensorwire.h"
#endif

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "tensorwire/device.hpp"

namespace tw {

/// The device streams on which consumers may still use a buffer's memory. An export that names the consumer's
/// stream (DLPack `stream=`) notes that stream; one that names none (the CUDA Array Interface, a raw data pointer,
/// DLPack `stream=-1`) notes "any stream". A transport that must know that this work is done before the memory
/// goes back to another process (a received CUDA tensor's lease) reads it when the last view goes. Thread-safe.
class StreamUses {
 public:
  static constexpr size_t kMaxStreams = 8;  ///< more distinct streams than this count as "any stream"
  /// Notes `stream` (a CUDA stream handle; 1 the legacy default stream); -1 (or the per-thread default stream, 2,
  /// which names a different stream on every thread) means any stream.
  void note(int64_t stream) noexcept;
  /// The streams noted, or nullopt when some use may be on any stream.
  std::optional<std::vector<int64_t>> streams() const;

 private:
  mutable std::mutex mu_;
  std::array<int64_t, kMaxStreams> s_{};
  size_t n_ = 0;
  bool any_ = false;
};

class Buffer {
 public:
  /// Wraps memory owned elsewhere. `owner` is kept alive as long as this Buffer; it may be null when the
  /// caller guarantees the memory outlives every tensor (e.g. static storage).
  Buffer(void* base, size_t size, Device device, std::shared_ptr<const void> owner) noexcept
      : base_(base), size_(size), device_(device), owner_(std::move(owner)) {}

  /// Allocates `nbytes` of host memory aligned to `alignment` (a power of two >= sizeof(void*)). Blocks of 32 MiB
  /// and more are mapped on 2 MiB boundaries (transparent huge pages) and come from the buffer cache when a
  /// recently freed block of the same rounded size is there (see set_buffer_cache_limit).
  /// Throws Error(overflow) when the size cannot be represented, Error(out_of_memory) when it cannot be had.
  static std::shared_ptr<Buffer> allocate(size_t nbytes, size_t alignment = 64);

  void* base() const noexcept { return base_; }
  size_t size() const noexcept { return size_; }
  Device device() const noexcept { return device_; }
  const std::shared_ptr<const void>& owner() const noexcept { return owner_; }

  /// Records that a raw pointer into this memory left tensorwire's accounting (a NumPy __array_interface__, a
  /// data_ptr, a consumer that asked for a writable buffer view and may keep the pointer after releasing it).
  /// Transports that must know whether anyone can still write the memory (Publisher::send of a loan) read it.
  /// A raw device pointer is read on streams nobody names: a tracked buffer notes "any stream" too.
  void mark_escaped() const noexcept {
    escaped_.store(true, std::memory_order_relaxed);
    if (uses_) uses_->note(-1);
  }
  bool escaped() const noexcept { return escaped_.load(std::memory_order_relaxed); }

  /// Makes every tensor over this memory read-only from now on (Tensor::readonly()): a loan sent while a handle to
  /// it lived on, whose pages the publisher write-protects. tensorwire's own writes (copy into it, data<T>(), the C
  /// ABI) then fail with Error(read_only) instead of faulting. One way: a buffer is never unsealed.
  void seal() const noexcept { sealed_.store(true, std::memory_order_release); }
  bool sealed() const noexcept { return sealed_.load(std::memory_order_acquire); }

  /// How this memory arrived, when a transport made it: "shm" (a publisher's loan, no copy), "shm-copy",
  /// "cuda-ipc", "cuda-vmm", "cuda-copy" (CUDA memory between processes), "ucx" (across machines, layout kept),
  /// "ucx-packed" (across machines, packed by the sender), "ucx-cuda" (a CUDA tensor, device memory to device
  /// memory), "ucx-staged" (a CUDA tensor through host memory); nullptr otherwise.
  const char* transport() const noexcept { return transport_; }
  /// Sets transport(); `t` must be a string with static storage (a literal).
  void set_transport(const char* t) noexcept { transport_ = t; }

  /// Device memory whose owner must know where consumers use it (a received CUDA tensor: its lease goes back to
  /// the publisher only after that work): exports note their consumers' streams in `uses` from now on.
  void track_stream_uses(std::shared_ptr<StreamUses> uses) noexcept { uses_ = std::move(uses); }
  /// Notes that a consumer may queue work on `stream` that uses this memory (see StreamUses::note); nothing when the
  /// buffer is not tracked.
  void note_stream_use(int64_t stream) const noexcept {
    if (uses_) uses_->note(stream);
  }

 private:
  void* base_;
  size_t size_;
  Device device_;
  std::shared_ptr<const void> owner_;
  mutable std::atomic<bool> escaped_{false};
  mutable std::atomic<bool> sealed_{false};
  const char* transport_ = nullptr;
  std::shared_ptr<StreamUses> uses_;
};

/// The buffer cache: large host blocks (>= 32 MiB) whose last tensor died are kept mapped, up to `limit` bytes in
/// all, for the next allocation of the same size; the least recently freed go first, and memory above the limit
/// returns to the OS at once. A loop of same-sized copies (contiguous(), copy=True imports, copies of received
/// tensors) then writes into warm pages instead of faulting fresh ones.
inline constexpr size_t kDefaultBufferCacheLimit = size_t(256) << 20;  ///< 256 MiB

struct BufferCacheStats {
  size_t limit = 0;     ///< bytes the cache may hold
  size_t bytes = 0;     ///< bytes it holds now
  size_t blocks = 0;    ///< blocks it holds now
  uint64_t hits = 0;    ///< large allocations served from the cache
  uint64_t misses = 0;  ///< large allocations that mapped fresh memory
};

/// Sets the limit (0 disables the cache and unmaps what it holds). Thread-safe.
void set_buffer_cache_limit(size_t bytes) noexcept;
size_t buffer_cache_limit() noexcept;
BufferCacheStats buffer_cache_stats() noexcept;

}  // namespace tw
