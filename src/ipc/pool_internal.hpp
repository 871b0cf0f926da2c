// pool_internal.hpp (private) — the publisher's buffer pool: segments of one memory kind, reused by size class.
//
// A pool buffer is one segment: memory this process maps, and a descriptor (an fd) a subscriber maps once. Where
// the memory comes from is a SegmentSource: host memfds today; a CUDA source (VMM allocations exported as POSIX
// fds) plugs in as a second kind without the pool or the send policy changing, since its fd crosses the same way.
//
// The pool decides which buffer a request gets — an exact size class, a larger one within 4x, a new segment while
// the budget allows, or else it retires a free buffer of another size to make room — but not who holds a buffer:
// leases live in the subscribers' channels, so the publisher answers `held(slot)` and hears of each retirement
// (`on_retire`) to tell the subscribers that mapped it.
//
// Small copies share buffers: a send's packed copy of at most kSharedMax bytes goes at the end of a shared host
// buffer (kSharedBytes, 64-byte aligned parts) after earlier messages' copies, and a shared buffer is written from
// its start again once nothing holds any of it. Each buffer is announced to each subscriber once over its control
// socket (an fd, a mapping), so a buffer per small message made a deep ring of unread small messages cost hundreds
// of announcements, fds and mappings; shared, 4 KiB messages take one per 64. A subscriber's lease holds the
// whole buffer, so one kept small tensor keeps kSharedBytes from reuse.
//
// Not thread-safe: the publisher's state lock guards it, except Slot::loans, which loaned tensors release from any
// thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ipc/ipc_internal.hpp"
#include "os/os_internal.hpp"
#include "tensorwire/device_runtime.hpp"
#include "tensorwire/tensor.hpp"

namespace tw::ipc_detail {

/// One segment's memory: the fd a peer maps, and this process's mapping of it — or, for CUDA memory, the device
/// range, how a peer opens it, and the interprocess event recorded before each message that names it.
struct Segment {
  os::Fd fd;
  os::Mapping map;
  // -- CUDA (device >= 0) --
  int device = -1;
  uintptr_t device_base = 0;
  uint64_t device_bytes = 0;
  CudaSegmentInfo cuda;                      ///< what CUDA_SEGMENT tells subscribers
  IpcEvent event;                            ///< recorded on the producer's stream before each message
  bool recorded = false;                     ///< the event was recorded at least once
  std::shared_ptr<void> owner;  ///< the pool's allocation (allocate_exportable); foreign: local_legacy_base's token
  std::vector<std::shared_ptr<const Buffer>> keep;  ///< foreign: the sent tensors' buffers (one per range), until no
                                                    ///< lease holds them
  bool foreign = false;                      ///< a caller's allocation (zero-copy): never handed out by try_take
  size_t size() const noexcept { return device >= 0 ? static_cast<size_t>(device_bytes) : map.size(); }
  char* data() const noexcept { return device >= 0 ? reinterpret_cast<char*>(device_base) : map.data(); }
  ~Segment();
  Segment() = default;
  Segment(Segment&&) noexcept = default;
  Segment& operator=(Segment&&) noexcept;
};

/// Where a pool's memory comes from (see the top of this file).
class SegmentSource {
 public:
  virtual ~SegmentSource() = default;
  virtual MemoryKind kind() const noexcept = 0;
  /// A new segment of `bytes`, writable here, sealed so that peers can only ever map it read-only. Throws
  /// Error(out_of_memory) when this process cannot have the memory (never leaves it to the OOM killer).
  virtual Segment create(size_t bytes, const std::string& debug_name) = 0;
  /// Makes this process's view of a segment read-only or writable again; false when the OS refused.
  virtual bool protect(Segment& s, bool writable) noexcept = 0;
};

/// Host memory: sealed memfds, pre-faulted within bounds.
std::unique_ptr<SegmentSource> host_segment_source();

class Pool : public std::enable_shared_from_this<Pool> {
 public:
  struct Slot {
    uint64_t segment_id = 0;        ///< 0: empty slot
    Segment seg;
    std::atomic<int32_t> loans{0};  ///< loaned tensors (and their views) alive in this process
    std::atomic<int32_t> holds{0};  ///< transports still reading it (remote sends in flight)
    bool writable = true;           ///< false once a loan of it was sent and protected: read-only here
    bool reserved = false;          ///< packed by the send in progress, not yet pushed
    bool shared = false;            ///< holds several messages' small copies (try_take_small)
    size_t used = 0;                ///< shared: bytes handed out from the start (the rest was never written since)
    size_t size() const noexcept { return seg.size(); }
    char* data() const noexcept { return seg.data(); }
  };

  Pool(std::unique_ptr<SegmentSource> source, size_t max_buffers, size_t pool_bytes, std::string name);

  size_t capacity() const noexcept { return count_; }
  /// 1 + the highest slot index that ever held a segment: scans stop there.
  size_t end() const noexcept { return end_; }
  Slot& slot(size_t i) noexcept { return slots_[i]; }
  const Slot& slot(size_t i) const noexcept { return slots_[i]; }
  /// Buffers (segments) allocated now, and their bytes.
  size_t buffers() const noexcept;
  uint64_t bytes() const noexcept;
  size_t max_bytes() const noexcept { return max_bytes_; }

  /// The slot whose mapping holds all of `b`, or -1; `off` gets the buffer's offset in the segment.
  long find(const Buffer& b, size_t& off) const noexcept;
  /// Whether slot i may be handed out: a segment no loan, no send in progress and (per `held`) no subscriber uses.
  bool is_free(size_t i, const std::function<bool(size_t)>& held) const;

  /// One attempt, never waiting: a free slot of at least `nbytes`, reusing, creating or (to make room) retiring
  /// segments; nullopt when every buffer is in use. `what` names the caller in errors (out_of_memory).
  std::optional<size_t> try_take(size_t nbytes, const std::function<bool(size_t)>& held,
                                 const std::function<void(size_t, uint64_t)>& on_retire, const std::string& what,
                                 int device = -1);
  /// Room for a small copy (<= kSharedMax bytes) in a shared buffer: (slot, offset of the part), 64-byte aligned.
  /// The same one attempt as try_take, never waiting; nullopt when no shared buffer has room and none can be made
  /// within pool_bytes (then the caller asks try_take for a buffer of the copy's own size). The part is the
  /// caller's from then on (nothing else is handed out of that range until the buffer is free again: no loan,
  /// lease, hold or reservation of it).
  std::optional<std::pair<size_t, size_t>> try_take_small(size_t nbytes, const std::function<bool(size_t)>& held,
                                                         const std::function<void(size_t, uint64_t)>& on_retire,
                                                         const std::string& what);
  static constexpr size_t kSharedMax = size_t{16} << 10;
  static constexpr size_t kSharedBytes = size_t{256} << 10;
  static constexpr size_t kSharedAlign = 64;
  /// The bytes of a shared buffer a small copy of `nbytes` takes (its part, up to where the next one may start).
  static constexpr size_t shared_part_bytes(size_t nbytes) noexcept {
    return nbytes <= kSharedAlign ? kSharedAlign : (nbytes + kSharedAlign - 1) / kSharedAlign * kSharedAlign;
  }

  /// Whether every buffer there is is reserved by the send in progress (at least one): when try_take finds no
  /// room then, none can come (the send's own parts hold it all).
  bool only_reserved() const noexcept;
  /// The slot exporting a caller's CUDA allocation at (device, base), or -1.
  long find_foreign(int device, uintptr_t base) const noexcept;
  /// A slot for a caller's CUDA allocation (zero-copy): an empty slot, retiring free ones to make room; nullopt
  /// when every slot is in use. The segment keeps nothing of the caller's alive yet (the caller adds to seg.keep).
  std::optional<size_t> adopt(DeviceExport e, const std::function<bool(size_t)>& held,
                              const std::function<void(size_t, uint64_t)>& on_retire);
  /// Retires every free foreign slot (no lease, no hold): their tensors are let go and subscribers close them.
  void release_free_foreign(const std::function<bool(size_t)>& held,
                            const std::function<void(size_t, uint64_t)>& on_retire);

  /// A writable, C-contiguous tensor over slot i (a loan): the slot's loan count holds it until the last view goes.
  /// A CUDA slot's loan is ordered on the legacy default stream (send(stream=) names another).
  Tensor loan(size_t i, Layout layout);
  /// Keeps slot i out of reuse (and mapped) while the returned object lives: a transport still reading it.
  std::shared_ptr<const void> hold(size_t i);
  /// Makes slot i writable again here (before a loan or packing into it). Throws Error when the OS refuses.
  void make_writable(size_t i);
  /// Makes slot i read-only here (a sent loan someone could still write through).
  void protect_sent(size_t i) noexcept;
  /// Gives back every segment no loan uses (the publisher closes; loans keep theirs until they go).
  void release_unloaned() noexcept;
  /// Waits for the work last recorded on every CUDA segment's event (a closing publisher, before its BYE: a
  /// subscriber that has the BYE then needs no event, which may be destroyed by then).
  void synchronize_events() noexcept;

 private:
  Segment device_segment(int device, size_t bytes);  // a VMM allocation with its fd and event
  std::unique_ptr<SegmentSource> source_;
  std::unique_ptr<Slot[]> slots_;
  size_t count_, end_ = 0, max_bytes_;
  std::string name_;
  uint64_t next_segment_id_ = 1;
};

// ---- a subscriber in the publisher's own process ----------------------------------------------------------------
// The driver refuses to open an IPC event handle, or a legacy memory handle, in the process that exported it
// (CUDA_ERROR_INVALID_CONTEXT). A subscriber of a publisher in its own process finds them here instead, by the
// handle bytes it was sent. (VMM memory is imported from its fd as from any other process.)

/// Registers a CUDA segment's interprocess event (held weakly: found while the segment lives) and, for a legacy
/// handle, where its allocation is (found while `alive` lives: the segment's owner, which the publisher keeps with
/// the segment's tensors after close until the last subscriber lets go).
void register_local_cuda_segment(const Segment& seg, const std::shared_ptr<const void>& alive);
/// The event of a segment this process exported (`known`); `event` is null once the segment is gone (its
/// destructor waited for the work last recorded on it, so nothing is left to wait for). Not `known`: a handle this
/// copy of tensorwire did not export (another copy in the process keeps its own registry), or one of the oldest
/// gone segments once thousands have gone (the registry forgets those first).
struct LocalEvent {
  bool known = false;
  std::shared_ptr<void> event;
};
LocalEvent local_ipc_event(const std::array<uint8_t, 64>& event_handle);
/// Where the legacy-handle allocation this process exported starts; nullopt when unknown.
std::optional<uintptr_t> local_legacy_base(const std::array<uint8_t, 64>& mem_handle);
/// Tests with a fake driver, whose handles open in any process, turn this off to exercise the open path.
void set_local_shortcut(bool on) noexcept;
bool local_shortcut() noexcept;

}  // namespace tw::ipc_detail
