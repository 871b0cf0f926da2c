// pool.cpp — the publisher's buffer pool (pool_internal.hpp) and its host-memory segment source.
#include <fcntl.h>

#include <algorithm>
#include <bit>

#include "ipc/pool_internal.hpp"

namespace tw::ipc_detail {

namespace {

constexpr size_t kMinSegment = 4096;

class HostSegments final : public SegmentSource {
 public:
  MemoryKind kind() const noexcept override { return MemoryKind::host; }
  Segment create(size_t bytes, const std::string& debug_name) override {
    os::check_memory_available(bytes, debug_name);
    Segment s;
    s.fd = os::make_memfd(debug_name, bytes);
    s.map = os::Mapping::map(s.fd.get(), bytes, true, true);  // pre-faulted within bounds: a fresh page costs ~10 us
    // Readers map it read-only, and no peer can ever map it writable again (our mapping stays writable).
    os::add_seals(s.fd.get(), F_SEAL_FUTURE_WRITE | F_SEAL_SEAL);
    return s;
  }
  bool protect(Segment& s, bool writable) noexcept override { return s.map.protect(writable); }
};

// One count on a slot for as long as it lives — a loan (Slot::loans: the owner of a loaned tensor's Buffer) or a
// transport's hold (Slot::holds) — keeping the pool, and so the mapping, alive meanwhile.
struct SlotRef {
  SlotRef(std::shared_ptr<Pool> p, size_t s, std::atomic<int32_t> Pool::Slot::*c) : pool(std::move(p)), slot(s), count(c) {
    (pool->slot(slot).*count).fetch_add(1, std::memory_order_relaxed);
  }
  SlotRef(const SlotRef&) = delete;
  SlotRef& operator=(const SlotRef&) = delete;
  ~SlotRef() { (pool->slot(slot).*count).fetch_sub(1, std::memory_order_release); }
  std::shared_ptr<Pool> pool;
  size_t slot;
  std::atomic<int32_t> Pool::Slot::*count;
};

}  // namespace

std::shared_ptr<const void> Pool::hold(size_t i) {
  return std::make_shared<SlotRef>(shared_from_this(), i, &Slot::holds);
}

std::unique_ptr<SegmentSource> host_segment_source() { return std::make_unique<HostSegments>(); }

Pool::Pool(std::unique_ptr<SegmentSource> source, size_t max_buffers, size_t pool_bytes, std::string name)
    : source_(std::move(source)), slots_(new Slot[max_buffers]), count_(max_buffers), max_bytes_(pool_bytes),
      name_(std::move(name)) {}

size_t Pool::buffers() const noexcept {
  size_t n = 0;
  for (size_t i = 0; i < end_; ++i) n += slots_[i].segment_id ? 1u : 0u;
  return n;
}

uint64_t Pool::bytes() const noexcept {
  uint64_t n = 0;
  for (size_t i = 0; i < end_; ++i) n += slots_[i].segment_id ? slots_[i].size() : 0u;
  return n;
}

long Pool::find(const Buffer& b, size_t& off) const noexcept {
  const char* base = static_cast<const char*>(b.base());
  for (size_t i = 0; i < end_; ++i) {
    const Slot& s = slots_[i];
    if (!s.segment_id) continue;
    const char* lo = s.data();
    if (base >= lo && base < lo + s.size() && b.size() <= static_cast<size_t>(lo + s.size() - base)) {
      off = static_cast<size_t>(base - lo);
      return static_cast<long>(i);
    }
  }
  return -1;
}

bool Pool::is_free(size_t i, const std::function<bool(size_t)>& held) const {
  const Slot& s = slots_[i];
  return s.segment_id && !s.reserved && s.loans.load(std::memory_order_acquire) == 0 &&
         s.holds.load(std::memory_order_acquire) == 0 && !held(i);
}

std::optional<size_t> Pool::try_take(size_t nbytes, const std::function<bool(size_t)>& held,
                                     const std::function<void(size_t, uint64_t)>& on_retire, const std::string& what) {
  const size_t cls = std::bit_ceil(std::max(nbytes, kMinSegment));
  for (;;) {
    long empty = -1, exact = -1, larger = -1, other = -1;
    uint64_t total = 0;
    for (size_t i = 0; i < count_; ++i) {
      Slot& s = slots_[i];
      if (!s.segment_id) {
        if (empty < 0) empty = static_cast<long>(i);
        if (i >= end_) break;  // nothing beyond
        continue;
      }
      total += s.size();
      if (!is_free(i, held)) continue;
      if (s.size() == cls) {
        exact = static_cast<long>(i);
        break;
      }
      if (s.size() > cls && s.size() <= 4 * cls && larger < 0) larger = static_cast<long>(i);
      else if (other < 0) other = static_cast<long>(i);
    }
    if (exact >= 0) return static_cast<size_t>(exact);
    if (larger >= 0) return static_cast<size_t>(larger);
    if (empty >= 0 && (total + cls <= max_bytes_ || total == 0)) {
      const size_t i = static_cast<size_t>(empty);
      Slot& s = slots_[i];
      const uint64_t id = next_segment_id_++;
      s.seg = source_->create(cls, "tensorwire:" + name_ + ":" + std::to_string(id) + " (" + what + ")");
      s.segment_id = id;
      s.writable = true;
      end_ = std::max(end_, i + 1);
      return i;
    }
    if (other < 0) return std::nullopt;  // exhausted: every buffer is loaned, queued or held
    // Make room: retire a free segment of another size.
    Slot& s = slots_[static_cast<size_t>(other)];
    on_retire(static_cast<size_t>(other), s.segment_id);
    s.segment_id = 0;
    s.seg = Segment();
    s.writable = true;
  }
}

Tensor Pool::loan(size_t i, Layout layout) {
  Slot& s = slots_[i];
  make_writable(i);
  auto owner = std::make_shared<SlotRef>(shared_from_this(), i, &Slot::loans);
  auto buf = std::make_shared<Buffer>(s.data(), s.size(), Device::cpu(), std::move(owner));
  return Tensor::make(std::move(buf), std::move(layout), false);
}

void Pool::make_writable(size_t i) {
  Slot& s = slots_[i];
  if (s.writable) return;
  if (!source_->protect(s.seg, true)) os::throw_errno("mprotect of a pool buffer");
  s.writable = true;
}

void Pool::protect_sent(size_t i) noexcept {
  Slot& s = slots_[i];
  if (s.writable && source_->protect(s.seg, false)) s.writable = false;
}

void Pool::release_unloaned() noexcept {
  for (size_t i = 0; i < end_; ++i) {
    Slot& s = slots_[i];
    if (s.segment_id && s.loans.load(std::memory_order_acquire) == 0 && s.holds.load(std::memory_order_acquire) == 0) {
      s.segment_id = 0;
      s.seg = Segment();
    }
  }
}

}  // namespace tw::ipc_detail
