// pool.cpp — the publisher's buffer pool (pool_internal.hpp) and its host-memory segment source.
#include <fcntl.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <map>
#include <mutex>

#include "ipc/pool_internal.hpp"

namespace tw::ipc_detail {

namespace {

constexpr size_t kMinSegment = 4096;
constexpr size_t kMinDeviceSegment = size_t{2} << 20;  // the usual VMM granularity

class HostSegments final : public SegmentSource {
 public:
  MemoryKind kind() const noexcept override { return MemoryKind::host; }
  Segment create(size_t bytes, const std::string& debug_name) override {
    // (The segment's name is "tensorwire:<topic>:<id> (<who asked>)": the error names who asked.)
    const size_t open = debug_name.find(" (");
    os::check_memory_available(bytes, open != std::string::npos && debug_name.back() == ')'
                                          ? debug_name.substr(open + 2, debug_name.size() - open - 3)
                                          : debug_name);
    Segment s;
    s.fd = os::make_memfd(debug_name, bytes);
    s.map = os::Mapping::map(s.fd.get(), bytes, true, true);  // pre-faulted within bounds: a fresh page costs ~10 us
    // Readers map it read-only, and no peer can ever map it writable again (our mapping stays writable).
    os::add_seals(s.fd.get(), F_SEAL_FUTURE_WRITE | F_SEAL_SEAL);
    s.map.private_in_forked_children(s.fd.get());  // (a fork()ed child's loans are its own copies)
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

// A CUDA segment leaves only after the work last recorded on its event is done (the producer may still be
// writing it); the allocation itself goes with `owner`.
Segment::~Segment() {
  if (device >= 0 && recorded && event.event) {
    try {
      device_runtime().synchronize_event(event.event.get());
    } catch (...) {
    }
  }
}

Segment& Segment::operator=(Segment&& o) noexcept {
  if (this == &o) return *this;
  Segment old(std::move(*this));  // destroyed (synchronised) here
  fd = std::move(o.fd);
  map = std::move(o.map);
  device = o.device;
  device_base = o.device_base;
  device_bytes = o.device_bytes;
  cuda = o.cuda;
  event = std::move(o.event);
  recorded = o.recorded;
  owner = std::move(o.owner);
  keep = std::move(o.keep);
  foreign = o.foreign;
  o.device = -1;
  o.recorded = false;
  return *this;
}

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
  // (A foreign slot's keep list is cleared by release_free_foreign, which is what frees it.)
  return s.segment_id && !s.reserved && s.loans.load(std::memory_order_acquire) == 0 &&
         s.holds.load(std::memory_order_acquire) == 0 && !held(i);
}

std::optional<size_t> Pool::try_take(size_t nbytes, const std::function<bool(size_t)>& held,
                                     const std::function<void(size_t, uint64_t)>& on_retire, const std::string& what,
                                     int device) {
  const size_t cls = std::bit_ceil(std::max(nbytes, device >= 0 ? kMinDeviceSegment : kMinSegment));
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
      if (!s.seg.foreign) total += s.size();  // (a caller's allocation is not the pool's memory: no budget of it)
      if (!is_free(i, held)) continue;
      if (s.seg.foreign || s.seg.device != device) {  // free, but not for this request: room to make
        if (other < 0) other = static_cast<long>(i);
        continue;
      }
      if (s.size() == cls) {
        exact = static_cast<long>(i);
        break;
      }
      if (s.size() > cls && s.size() <= 4 * cls && larger < 0) larger = static_cast<long>(i);
      else if (other < 0) other = static_cast<long>(i);
    }
    const auto whole = [this](long li) {  // (a shared buffer that was free is one message's again)
      const auto i = static_cast<size_t>(li);
      slots_[i].shared = false;
      slots_[i].used = 0;
      return static_cast<size_t>(i);
    };
    if (exact >= 0) return whole(exact);
    if (larger >= 0) return whole(larger);
    if (empty >= 0 && (total + cls <= max_bytes_ || total == 0)) {
      const size_t i = static_cast<size_t>(empty);
      Slot& s = slots_[i];
      const uint64_t id = next_segment_id_++;
      if (device >= 0) {
        s.seg = device_segment(device, cls);
      } else {
        s.seg = source_->create(cls, "tensorwire:" + name_ + ":" + std::to_string(id) + " (" + what + ")");
      }
      s.segment_id = id;
      s.writable = true;
      s.shared = false;
      s.used = 0;
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

std::optional<std::pair<size_t, size_t>> Pool::try_take_small(size_t nbytes, const std::function<bool(size_t)>& held,
                                                             const std::function<void(size_t, uint64_t)>& on_retire,
                                                             const std::string& what) {
  if (nbytes > kSharedMax) return std::nullopt;
  const size_t need = shared_part_bytes(nbytes);
  long appending = -1, reset = -1;
  uint64_t total = 0;
  for (size_t i = 0; i < end_; ++i) {
    const Slot& s = slots_[i];
    if (s.segment_id && !s.seg.foreign) total += s.size();
    if (!s.segment_id || !s.shared || s.seg.device >= 0 || s.seg.foreign) continue;
    if (is_free(i, held)) {  // nothing reads any of it: all of it is room again (and warm from its last use)
      if (reset < 0) reset = static_cast<long>(i);
    } else if (s.loans.load(std::memory_order_acquire) == 0 && s.used + need <= s.size()) {
      if (appending < 0 || s.used > slots_[static_cast<size_t>(appending)].used) appending = static_cast<long>(i);
    }
  }
  // A free one first: its start is the memory the last small messages used (a subscriber that keeps up gets the
  // same warm bytes every time, as with a buffer per message).
  long pick = reset >= 0 ? reset : appending;
  if (reset >= 0) slots_[static_cast<size_t>(reset)].used = 0;
  if (pick < 0) {
    // A new shared buffer only within the budget; else the caller takes a buffer of the message's own size.
    if (total + kSharedBytes > max_bytes_) return std::nullopt;
    const auto fresh = try_take(kSharedBytes, held, on_retire, what);
    if (!fresh) return std::nullopt;
    Slot& s = slots_[*fresh];  // (at least kSharedBytes: try_take never gives less than it was asked)
    s.shared = true;
    s.used = 0;
    pick = static_cast<long>(*fresh);
  }
  Slot& s = slots_[static_cast<size_t>(pick)];
  const size_t offset = s.used;
  s.used += need;
  return std::make_pair(static_cast<size_t>(pick), offset);
}

Tensor Pool::loan(size_t i, Layout layout) {
  Slot& s = slots_[i];
  make_writable(i);
  auto owner = std::make_shared<SlotRef>(shared_from_this(), i, &Slot::loans);
  const Device dev = s.seg.device >= 0 ? Device::cuda(s.seg.device) : Device::cpu();
  auto buf = std::make_shared<Buffer>(s.data(), s.size(), dev, std::move(owner));
  Tensor t = Tensor::make(std::move(buf), std::move(layout), false);
  if (s.seg.device >= 0) t.set_stream(1);
  return t;
}

namespace {
struct LocalSegments {
  std::mutex mu;
  // An event's entry, and when it was registered (the purge forgets the oldest gone ones first).
  struct Event {
    std::weak_ptr<void> event;
    uint64_t seq = 0;
  };
  std::map<std::array<uint8_t, 64>, Event> events;
  uint64_t next_seq = 0;
  struct Legacy {
    uintptr_t base = 0;
    // One per segment exporting the allocation (several publishers may send the same tensor): valid while any is.
    std::vector<std::weak_ptr<const void>> alive;
    bool expired() const {
      return std::all_of(alive.begin(), alive.end(), [](const auto& w) { return w.expired(); });
    }
  };
  std::map<std::array<uint8_t, 64>, Legacy> legacy;
  size_t purge_at = 64;
  // How many gone segments' events are remembered: a message a publisher of this process queued before it closed
  // names such an event, which says "gone" (its segment waited for it when it went) where an unknown handle is
  // opened as another process's, and fails. A subscriber reading a closed publisher's message after this many
  // other segments of the process came and went would see that error. (Unknown cannot mean gone: another copy of
  // tensorwire in this process keeps a registry of its own, and its events are alive.)
  static constexpr size_t kGoneEvents = 4096;
  // (mu held) Once the maps have doubled since the last purge: drops gone legacy allocations, and gone events
  // beyond the newest kGoneEvents.
  void purge() {
    if (events.size() + legacy.size() < purge_at) return;
    std::erase_if(legacy, [](const auto& kv) { return kv.second.expired(); });
    std::vector<uint64_t> gone;
    for (const auto& [h, e] : events)
      if (e.event.expired()) gone.push_back(e.seq);
    if (gone.size() > kGoneEvents) {
      std::nth_element(gone.begin(), gone.end() - kGoneEvents, gone.end());
      const uint64_t keep_from = *(gone.end() - kGoneEvents);
      std::erase_if(events, [&](const auto& kv) { return kv.second.event.expired() && kv.second.seq < keep_from; });
    }
    purge_at = std::max<size_t>(64, 2 * (events.size() + legacy.size()));
  }
};
LocalSegments& local_segments() {
  static auto* l = new LocalSegments();  // never destroyed: subscribers may look up at exit
  return *l;
}
std::atomic<bool> g_local_shortcut{true};
}  // namespace

void register_local_cuda_segment(const Segment& seg, const std::shared_ptr<const void>& alive) {
  LocalSegments& l = local_segments();
  std::lock_guard lk(l.mu);
  l.purge();
  if (seg.event.event) l.events[seg.event.handle] = LocalSegments::Event{seg.event.event, l.next_seq++};
  if (seg.cuda.handle == CudaHandle::legacy && alive) {
    LocalSegments::Legacy& e = l.legacy[seg.cuda.mem_handle];
    const uintptr_t base = seg.device_base - seg.cuda.handle_offset;
    if (e.base != base) e.alive.clear();  // (a handle names one allocation: a stale entry)
    e.base = base;
    std::erase_if(e.alive, [](const auto& w) { return w.expired(); });
    e.alive.push_back(alive);
  }
}

LocalEvent local_ipc_event(const std::array<uint8_t, 64>& event_handle) {
  LocalSegments& l = local_segments();
  std::lock_guard lk(l.mu);
  auto it = l.events.find(event_handle);
  if (it == l.events.end()) return LocalEvent{};
  LocalEvent out;
  out.known = true;
  out.event = it->second.event.lock();
  return out;
}

std::optional<uintptr_t> local_legacy_base(const std::array<uint8_t, 64>& mem_handle) {
  LocalSegments& l = local_segments();
  std::lock_guard lk(l.mu);
  auto it = l.legacy.find(mem_handle);
  if (it == l.legacy.end() || it->second.expired()) return std::nullopt;
  return it->second.base;
}

void set_local_shortcut(bool on) noexcept { g_local_shortcut.store(on); }
bool local_shortcut() noexcept { return g_local_shortcut.load(); }

Segment Pool::device_segment(int device, size_t bytes) {
  const DeviceRuntime& rt = device_runtime();
  DeviceExport e = rt.allocate_exportable(Device::cuda(device), bytes);
  Segment seg;
  seg.fd = os::Fd(e.fd);
  seg.device = device;
  seg.device_base = e.base;
  seg.device_bytes = e.bytes;
  seg.owner = std::move(e.owner);
  seg.cuda.device = device;
  seg.cuda.handle = CudaHandle::vmm;
  seg.cuda.device_uuid = e.device_uuid;
  seg.event = rt.create_ipc_event(Device::cuda(device));
  seg.cuda.event_handle = seg.event.handle;
  register_local_cuda_segment(seg, nullptr);
  return seg;
}

long Pool::find_foreign(int device, uintptr_t base) const noexcept {
  for (size_t i = 0; i < end_; ++i) {
    const Slot& s = slots_[i];
    if (s.segment_id && s.seg.foreign && s.seg.device == device && s.seg.device_base == base) return static_cast<long>(i);
  }
  return -1;
}

std::optional<size_t> Pool::adopt(DeviceExport e, const std::function<bool(size_t)>& held,
                                  const std::function<void(size_t, uint64_t)>& on_retire) {
  os::Fd fd(e.fd);  // ours from here, whatever happens
  long empty = -1;
  for (size_t i = 0; i < count_ && empty < 0; ++i)
    if (!slots_[i].segment_id) empty = static_cast<long>(i);
  if (empty < 0) {  // make room: a free segment goes
    for (size_t i = 0; i < end_ && empty < 0; ++i)
      if (is_free(i, held)) {
        on_retire(i, slots_[i].segment_id);
        slots_[i].segment_id = 0;
        slots_[i].seg = Segment();
        slots_[i].writable = true;
        empty = static_cast<long>(i);
      }
  }
  if (empty < 0) return std::nullopt;
  const auto i = static_cast<size_t>(empty);
  Slot& s = slots_[i];
  Segment seg;
  seg.fd = std::move(fd);
  seg.device = e.device;
  seg.device_base = e.base;
  seg.device_bytes = e.bytes;
  seg.foreign = true;
  seg.cuda.device = e.device;
  seg.cuda.handle = e.kind == DeviceExport::Kind::vmm ? CudaHandle::vmm : CudaHandle::legacy;
  seg.cuda.device_uuid = e.device_uuid;
  seg.cuda.mem_handle = e.handle;
  seg.cuda.handle_offset = e.handle_offset;
  seg.event = device_runtime().create_ipc_event(Device::cuda(e.device));
  seg.cuda.event_handle = seg.event.handle;
  // Lives with the segment, and with the tensors it keeps when they linger after close while a subscriber still
  // reads them: a subscriber in this process finds the allocation exactly as long as it may use it.
  auto alive = std::make_shared<int>(0);
  register_local_cuda_segment(seg, alive);
  seg.owner = std::move(alive);
  s.seg = std::move(seg);
  s.segment_id = next_segment_id_++;
  s.writable = true;
  end_ = std::max(end_, i + 1);
  return i;
}

bool Pool::only_reserved() const noexcept {
  bool any = false;
  for (size_t i = 0; i < end_; ++i) {
    if (!slots_[i].segment_id) continue;
    if (!slots_[i].reserved) return false;
    any = true;
  }
  return any;
}

void Pool::release_free_foreign(const std::function<bool(size_t)>& held,
                                const std::function<void(size_t, uint64_t)>& on_retire) {
  for (size_t i = 0; i < end_; ++i) {
    Slot& s = slots_[i];
    if (s.segment_id && s.seg.foreign && is_free(i, held)) {
      on_retire(i, s.segment_id);
      s.segment_id = 0;
      s.seg = Segment();
    }
  }
}

void Pool::make_writable(size_t i) {
  Slot& s = slots_[i];
  if (s.writable || s.seg.device >= 0) return;  // (device memory cannot be protected from the host)
  if (!source_->protect(s.seg, true)) os::throw_errno("mprotect of a pool buffer");
  s.writable = true;
}

void Pool::protect_sent(size_t i) noexcept {
  Slot& s = slots_[i];
  if (s.seg.device < 0 && s.writable && source_->protect(s.seg, false)) s.writable = false;
}

void Pool::synchronize_events() noexcept {
  for (size_t i = 0; i < end_; ++i) {
    const Segment& seg = slots_[i].seg;
    if (seg.device < 0 || !seg.recorded || !seg.event.event) continue;
    try {
      device_runtime().synchronize_event(seg.event.event.get());
    } catch (...) {  // (a failing device: each segment's destructor tries again)
    }
  }
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
