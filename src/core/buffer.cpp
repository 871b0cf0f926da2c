// Host allocation for tensors, and the bounded cache of recently freed large blocks (tensorwire/buffer.hpp).
#include <algorithm>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <string>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "tensorwire/buffer.hpp"
#include "tensorwire/error.hpp"

namespace tw {
namespace {

// Large blocks (mapped by Buffer::allocate on 2 MiB boundaries) are not unmapped when their last tensor dies but
// kept, up to a byte limit, for the next allocation of the same rounded size: a fresh page costs more to fault in
// than copying into it (a 64 MiB contiguous() into fresh memory ran at 43% of memcpy; into warm memory at 81%).
// Least recently freed blocks go first when the limit is reached; nothing above the limit stays mapped.
class HostCache {
 public:
  // A keep-alive that returns the block to the cache (or unmaps it) when the last Buffer goes.
  // (If the control block cannot be allocated, shared_ptr's constructor runs the deleter itself: nothing leaks.)
  std::shared_ptr<const void> owner(void* p, size_t len) {
    return std::shared_ptr<void>(p, [this, len](void* q) { give_back(q, len); });
  }

  void* take(size_t len) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it) {  // most recently freed first: warmest in cache
      if (it->len == len) {
        void* p = it->p;
        bytes_ -= len;
        blocks_.erase(std::next(it).base());
        ++hits_;
        return p;
      }
    }
    ++misses_;
    return nullptr;
  }

  // Nothing here allocates but the cache's own push (inside a try): a deleter must not throw, even out of memory.
  void give_back(void* p, size_t len) noexcept {
    bool kept = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (len <= limit_) {
        try {
          blocks_.push_back({p, len});
          bytes_ += len;
          kept = true;
        } catch (...) {
        }
      }
    }
    if (!kept) unmap(p, len);
    trim();
  }

  void set_limit(size_t limit) noexcept {
    {
      std::lock_guard<std::mutex> lock(mu_);
      limit_ = limit;
    }
    trim();
  }

  // Evicts the least recently freed blocks until the cache is within its limit, one at a time, each unmapped
  // outside the lock (munmap of 64 MiB is not free).
  void trim() noexcept {
    for (;;) {
      Block b{};
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (bytes_ <= limit_ || blocks_.empty()) return;
        b = blocks_.front();
        blocks_.pop_front();
        bytes_ -= b.len;
      }
      unmap(b.p, b.len);
    }
  }

  BufferCacheStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return BufferCacheStats{limit_, bytes_, blocks_.size(), hits_, misses_};
  }

 private:
  struct Block {
    void* p;
    size_t len;
  };
  static void unmap(void* p, size_t len) noexcept {
#if defined(__linux__)
    munmap(p, len);
#else
    (void)p;
    (void)len;
#endif
  }

  std::mutex mu_;
  std::deque<Block> blocks_;  // oldest first
  size_t bytes_ = 0;
  size_t limit_ = kDefaultBufferCacheLimit;
  uint64_t hits_ = 0, misses_ = 0;
};

// Never destroyed: Buffers released during static destruction still find it.
HostCache& cache() {
  static HostCache* c = new HostCache();
  return *c;
}

}  // namespace

void set_buffer_cache_limit(size_t bytes) noexcept { cache().set_limit(bytes); }
size_t buffer_cache_limit() noexcept { return cache().stats().limit; }
BufferCacheStats buffer_cache_stats() noexcept { return cache().stats(); }

void StreamUses::note(int64_t stream) noexcept {
  std::lock_guard lock(mu_);
  if (any_) return;
  if (stream == -1 || stream == 2 || stream == 0) {
    any_ = true;
    return;
  }
  for (size_t i = 0; i < n_; ++i)
    if (s_[i] == stream) return;
  if (n_ == kMaxStreams) {
    any_ = true;
    return;
  }
  s_[n_++] = stream;
}

std::optional<std::vector<int64_t>> StreamUses::streams() const {
  std::lock_guard lock(mu_);
  if (any_) return std::nullopt;
  return std::vector<int64_t>(s_.begin(), s_.begin() + static_cast<std::ptrdiff_t>(n_));
}

std::shared_ptr<Buffer> Buffer::allocate(size_t nbytes, size_t alignment) {
  if (alignment < sizeof(void*) || (alignment & (alignment - 1)) != 0)
    throw Error(ErrorCode::invalid_argument, "Buffer::allocate: alignment " + std::to_string(alignment) +
                                                 " is not a power of two >= " + std::to_string(sizeof(void*)));
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  // Transparent huge pages for large blocks: a fresh 4 KiB page costs microseconds to fault in (several under a
  // hypervisor), which for a 64 MiB copy is most of the time; a 2 MiB page faults 512x less often.
  //  - From 32 MiB glibc maps every block afresh anyway (its mmap threshold tops out there): map it ourselves on a
  //    2 MiB boundary, so all of it can be huge pages.
  //  - Below that, glibc reuses freed heap blocks, which costs no faults at all: keep malloc (a 2 MiB alignment
  //    request would defeat that reuse) and only advise the 2 MiB-aligned interior, as NumPy does from 4 MiB.
  constexpr size_t kHugePage = size_t(2) << 20, kAdviseBytes = size_t(4) << 20, kMapBytes = size_t(32) << 20;
  if (nbytes >= kMapBytes && alignment <= kHugePage && nbytes <= SIZE_MAX - 2 * kHugePage) {
    const size_t len = (nbytes + kHugePage - 1) / kHugePage * kHugePage;
    if (void* warm = cache().take(len))  // a recently freed block of this size: its pages are already faulted in
      return std::make_shared<Buffer>(warm, nbytes, Device::cpu(), cache().owner(warm, len));
    void* m = mmap(nullptr, len + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
      throw Error(ErrorCode::out_of_memory, "Buffer::allocate: out of memory mapping " + std::to_string(nbytes) + " bytes");
    const uintptr_t lo = reinterpret_cast<uintptr_t>(m), a = (lo + kHugePage - 1) & ~uintptr_t(kHugePage - 1);
    if (a > lo) munmap(m, a - lo);                                       // the unaligned head
    if (lo + kHugePage > a) munmap(reinterpret_cast<void*>(a + len), lo + kHugePage - a);  // and tail
    void* p = reinterpret_cast<void*>(a);
    (void)madvise(p, len, MADV_HUGEPAGE);  // advice only: without THP the memory is just as good
    return std::make_shared<Buffer>(p, nbytes, Device::cpu(), cache().owner(p, len));
  }
#endif
  size_t rounded = (std::max<size_t>(nbytes, 1) + alignment - 1) / alignment * alignment;
  if (rounded < nbytes) throw Error(ErrorCode::overflow, "Buffer::allocate: size overflows");
  void* p = std::aligned_alloc(alignment, rounded);
  if (!p)
    throw Error(ErrorCode::out_of_memory, "Buffer::allocate: out of memory allocating " + std::to_string(nbytes) + " bytes");
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (nbytes >= kAdviseBytes) {
    const uintptr_t lo = reinterpret_cast<uintptr_t>(p), hi = lo + nbytes;
    const uintptr_t a = (lo + kHugePage - 1) & ~uintptr_t(kHugePage - 1), e = hi & ~uintptr_t(kHugePage - 1);
    if (e > a) (void)madvise(reinterpret_cast<void*>(a), e - a, MADV_HUGEPAGE);
  }
#endif
  std::shared_ptr<void> owner(p, [](void* q) { std::free(q); });
  return std::make_shared<Buffer>(p, nbytes, Device::cpu(), std::move(owner));
}

}  // namespace tw
