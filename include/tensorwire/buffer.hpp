// tensorwire/buffer.hpp — the owner of a tensor's memory.
// A Buffer names the allocation a tensor lives in (its base address and byte size, on a device) and holds
// whatever keeps that memory valid (the producer's object, a container, a mapping). Views of one buffer share it;
// the memory is released when the last view and the last Buffer reference are gone.
#pragma once

#include <cstddef>
#include <atomic>
#include <memory>

#include "tensorwire/device.hpp"

namespace tw {

class Buffer {
 public:
  /// Wraps memory owned elsewhere. `owner` is kept alive as long as this Buffer; it may be null when the
  /// caller guarantees the memory outlives every tensor (e.g. static storage).
  Buffer(void* base, size_t size, Device device, std::shared_ptr<const void> owner) noexcept
      : base_(base), size_(size), device_(device), owner_(std::move(owner)) {}

  /// Allocates `nbytes` of host memory aligned to `alignment` (a power of two >= sizeof(void*)).
  /// Throws Error(unsupported) for non-host devices and Error(overflow) when the size cannot be allocated.
  static std::shared_ptr<Buffer> allocate(size_t nbytes, size_t alignment = 64);

  void* base() const noexcept { return base_; }
  size_t size() const noexcept { return size_; }
  Device device() const noexcept { return device_; }
  const std::shared_ptr<const void>& owner() const noexcept { return owner_; }

  /// Records that a raw pointer into this memory left tensorwire's accounting (a NumPy __array_interface__, a
  /// data_ptr, a consumer that asked for a writable buffer view and may keep the pointer after releasing it).
  /// Transports that must know whether anyone can still write the memory (Publisher::send of a loan) read it.
  void mark_escaped() const noexcept { escaped_.store(true, std::memory_order_relaxed); }
  bool escaped() const noexcept { return escaped_.load(std::memory_order_relaxed); }

 private:
  void* base_;
  size_t size_;
  Device device_;
  std::shared_ptr<const void> owner_;
  mutable std::atomic<bool> escaped_{false};
};

}  // namespace tw
