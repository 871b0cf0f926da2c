// ipc_internal.hpp (private) — the wire format of tensorwire IPC and the small RAII pieces it is built from.
//
// Shared memory is a wire format: every struct placed in it is trivially copyable, holds offsets (never pointers),
// starts with a magic and a version, and has its layout frozen by static_asserts here and offsetof tests in
// tests/cpp/test_ipc.cpp. Fields written by one process and read by another are accessed only via std::atomic_ref.
// Everything read from a peer is validated before use: decode_message, decode_control and validate_channel are
// pure functions of their input so a fuzzer can feed them hostile bytes (fuzz/fuzz_ipc_message.cpp).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "tensorwire/ipc.hpp"
#include "tensorwire/layout.hpp"
#include "tensorwire/metadata.hpp"

namespace tw::ipc_detail {

// ---- OS handles -------------------------------------------------------------------------------------------------

/// A file descriptor: move-only, closed on destruction or reset().
class Fd {
 public:
  Fd() noexcept = default;
  explicit Fd(int fd) noexcept : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) reset(o.release());
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }

  int get() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }
  int release() noexcept {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset(int fd = -1) noexcept;

 private:
  int fd_ = -1;
};

/// A memory mapping: move-only, unmapped on destruction or reset().
class Mapping {
 public:
  Mapping() noexcept = default;
  Mapping(void* p, size_t n) noexcept : p_(p), n_(n) {}
  Mapping(Mapping&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  Mapping& operator=(Mapping&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = o.p_, n_ = o.n_;
      o.p_ = nullptr, o.n_ = 0;
    }
    return *this;
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() { reset(); }

  /// Maps `size` bytes of `fd` shared; read-only unless `writable`. MAP_POPULATE when `prefault`.
  static Mapping map(int fd, size_t size, bool writable, bool prefault);

  char* data() const noexcept { return static_cast<char*>(p_); }
  size_t size() const noexcept { return n_; }
  explicit operator bool() const noexcept { return p_ != nullptr; }
  void reset() noexcept;

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

/// A sealed memfd of `size` bytes (F_SEAL_SHRINK | F_SEAL_GROW; the caller adds more seals after mapping).
Fd make_memfd(const std::string& debug_name, size_t size);
/// Adds seals; throws Error(internal) on failure.
void add_seals(int fd, int seals);
/// Checks that `fd` is a memfd sealed against shrinking whose size is at least `size`; throws Error otherwise.
void check_sealed(int fd, uint64_t size);

/// Errors from the OS: Error(internal) with strerror(errno) and the call.
[[noreturn]] void throw_errno(const std::string& what);

// ---- sockets ----------------------------------------------------------------------------------------------------

/// Abstract-namespace address of a topic's publisher: "tw/<uid>/<name>".
std::string publisher_address(std::string_view name);
/// Prefix of the addresses on which waiting subscribers listen: "tw/<uid>/<name>#s".
std::string subscriber_address_prefix(std::string_view name);

/// A non-blocking SOCK_SEQPACKET socket bound to the abstract `address`, listening. Returns an empty Fd when the
/// address is in use.
Fd listen_abstract(const std::string& address);
/// Connects a SOCK_SEQPACKET socket to the abstract `address`. Returns an empty Fd when nobody listens there.
Fd connect_abstract(const std::string& address);
/// Abstract addresses in /proc/net/unix that start with `prefix` and belong to listening sockets.
std::vector<std::string> find_listening(const std::string& prefix);
/// The peer's uid and pid (SO_PEERCRED).
struct PeerCred {
  uint32_t uid = 0;
  int32_t pid = 0;
};
PeerCred peer_credentials(int sock);

/// Sends one packet with up to 4 fds. Waits for room up to `timeout_ms`; returns false when the peer is gone or
/// stays full.
bool send_packet(int sock, const void* data, size_t n, std::span<const int> fds, int timeout_ms);
/// Receives one packet without blocking. Returns: >0 bytes read (fds appended to `fds`, each owned),
/// 0 when the peer closed, -1 when nothing waits, -2 for a truncated packet (too long or too many fds).
long recv_packet(int sock, void* buf, size_t cap, std::vector<Fd>& fds);

// ---- futex ------------------------------------------------------------------------------------------------------

/// Sleeps while *word == expected, at most `timeout_ns` (>= 0). Returns false when interrupted by a signal.
bool futex_wait(uint32_t* word, uint32_t expected, int64_t timeout_ns) noexcept;
void futex_wake_all(uint32_t* word) noexcept;

// ---- wire format ------------------------------------------------------------------------------------------------

inline constexpr uint32_t kMagic = 0x50495754;  // "TWIP" little-endian
inline constexpr uint16_t kWireVersion = 1;
inline constexpr size_t kCacheLine = 64;

/// One message: which allocation, and the tensor's layout relative to it. Fixed size, trivially copyable; the
/// encoded metadata follows it in the ring cell.
struct MessageDescriptor {
  uint32_t magic;           ///< kMagic
  uint16_t version;         ///< kWireVersion
  uint16_t flags;           ///< reserved, 0
  uint64_t sequence;        ///< per-publisher message number (ordering, diagnostics)
  uint64_t segment_id;      ///< the pool segment holding the allocation (announced by a SEGMENT control message)
  uint64_t alloc_offset;    ///< start of the allocation, in bytes from the segment start
  uint64_t alloc_bytes;     ///< size of the allocation in bytes
  int64_t byte_offset;      ///< element (0, ..., 0), in bytes from the allocation start
  uint32_t lease_slot;      ///< index of the lease counter this message holds
  uint32_t ndim;            ///< entries used in shape / strides
  uint8_t dtype_code;       ///< DLPack dtype (code, bits, lanes)
  uint8_t dtype_bits;
  uint16_t dtype_lanes;
  uint32_t subbyte_padded;  ///< 1 when a sub-byte dtype stores one element per byte
  uint32_t metadata_bytes;  ///< encoded metadata following this descriptor
  uint32_t reserved;
  int64_t shape[kMaxRank];
  int64_t strides[kMaxRank];  ///< in elements
};
static_assert(std::is_trivially_copyable_v<MessageDescriptor> && std::is_standard_layout_v<MessageDescriptor>);
static_assert(offsetof(MessageDescriptor, segment_id) == 16);
static_assert(offsetof(MessageDescriptor, byte_offset) == 40);
static_assert(offsetof(MessageDescriptor, lease_slot) == 48);
static_assert(offsetof(MessageDescriptor, dtype_code) == 56);
static_assert(offsetof(MessageDescriptor, metadata_bytes) == 64);
static_assert(offsetof(MessageDescriptor, shape) == 72);
static_assert(sizeof(MessageDescriptor) == 72 + 2 * 8 * kMaxRank);

/// A ring cell: a Vyukov sequence word, the descriptor, then up to max_metadata_bytes of metadata.
struct CellHeader {
  uint64_t seq;  ///< atomic: == pos when free for position pos, pos + 1 when it holds message pos
  uint64_t pad;
  MessageDescriptor msg;
};
static_assert(std::is_trivially_copyable_v<CellHeader> && offsetof(CellHeader, msg) == 16);

/// The head of a channel (one memfd per subscriber). Offsets are from the channel's start.
struct ChannelHeader {
  uint32_t magic;               ///< kMagic
  uint16_t version;             ///< kWireVersion
  uint16_t header_bytes;        ///< sizeof(ChannelHeader)
  uint32_t depth;               ///< messages the ring holds
  uint32_t cells;               ///< cells in the ring (max(depth, 2))
  uint64_t cell_bytes;          ///< stride between cells (a multiple of 64)
  uint64_t cells_offset;
  uint32_t max_metadata_bytes;
  uint32_t lease_slots;         ///< counters in the lease table
  uint64_t leases_offset;       ///< uint32_t released[lease_slots]: bumped by the subscriber on each release
  uint64_t total_bytes;
  uint32_t publisher_pid;
  uint32_t reserved0;
  // -- written by the publisher --
  uint64_t tail;                ///< next position the publisher writes
  uint64_t dropped;             ///< messages dropped for this subscriber
  uint32_t futex_word;          ///< bumped on every push and on close; the subscriber sleeps on it
  uint32_t closed;              ///< 1 once the publisher closed the stream
  uint32_t producer_waiting;    ///< 1 while the publisher sleeps on space_word for room in the ring
  uint8_t pad1[kCacheLine - 28];
  // -- written by the subscriber (and by the publisher when it drops) --
  uint64_t head;                ///< next position to read
  uint32_t waiters;             ///< subscriber threads asleep on futex_word
  uint32_t want_eventfd;        ///< 1: the publisher also writes the eventfd on every push
  uint32_t detached;            ///< 1: the subscriber closed; deliver nothing more, but its leases still hold
  uint32_t space_word;          ///< bumped after every pop; the publisher sleeps on it when the ring is full
  uint8_t pad2[kCacheLine - 24];
};
static_assert(std::is_trivially_copyable_v<ChannelHeader> && std::is_standard_layout_v<ChannelHeader>);
static_assert(offsetof(ChannelHeader, cell_bytes) == 16);
static_assert(offsetof(ChannelHeader, leases_offset) == 40);
static_assert(offsetof(ChannelHeader, tail) == 64);
static_assert(offsetof(ChannelHeader, futex_word) == 80);
static_assert(offsetof(ChannelHeader, head) == 128);
static_assert(sizeof(ChannelHeader) == 192);

/// Sizes of a channel for a depth, metadata capacity and lease table; fills a header (magic, version, layout).
ChannelHeader make_channel_header(size_t depth, size_t max_metadata_bytes, size_t lease_slots, uint32_t pid);
/// Validates a channel header read from a peer against the mapping's size; throws Error(invalid_argument).
void validate_channel(const ChannelHeader& h, uint64_t mapped_bytes);

/// Control messages, one SOCK_SEQPACKET packet each (publisher -> subscriber).
enum class ControlType : uint16_t {
  welcome = 1,  ///< fds: channel memfd, eventfd; size: channel bytes
  segment = 2,  ///< fds: segment memfd; id, size: segment id and bytes
  retire = 3,   ///< id: a segment that leaves the pool (drop the cached mapping)
  bye = 4,      ///< the publisher closes the stream
};
struct ControlWire {
  uint32_t magic;
  uint16_t version;
  uint16_t type;
  uint64_t id;
  uint64_t size;
  uint32_t pid;
  uint32_t reserved;
};
static_assert(std::is_trivially_copyable_v<ControlWire> && sizeof(ControlWire) == 32);

struct ControlMessage {
  ControlType type;
  uint64_t id = 0;
  uint64_t size = 0;
  uint32_t pid = 0;
};
ControlWire encode_control(ControlType type, uint64_t id, uint64_t size);
/// Validates one received control packet and the number of fds that came with it; throws Error(invalid_argument)
/// naming the problem.
ControlMessage decode_control(std::span<const uint8_t> bytes, size_t nfds);

/// What a valid message says.
struct DecodedMessage {
  uint64_t sequence = 0;
  uint64_t segment_id = 0;
  uint64_t alloc_offset = 0;
  uint64_t alloc_bytes = 0;
  uint32_t lease_slot = 0;
  Layout layout;
  Metadata metadata;
};

/// Validates a descriptor and the metadata bytes that follow it: magic, version, dtype, rank, layout (overflow),
/// the allocation inside its segment (`segment_bytes`: the size of the segment it names, 0 if unknown) and the
/// tensor's span inside the allocation, the lease slot below `lease_slots`, the metadata. Throws
/// Error(invalid_argument) (or another Error code from the layout checks) naming the problem.
DecodedMessage decode_message(const MessageDescriptor& d, std::string_view metadata, uint64_t segment_bytes,
                              uint32_t lease_slots, uint32_t max_metadata_bytes);

/// Fills a descriptor for `layout` in an allocation.
void encode_message(MessageDescriptor& d, const Layout& layout, uint64_t sequence, uint64_t segment_id,
                    uint64_t alloc_offset, uint64_t alloc_bytes, uint32_t lease_slot, uint32_t metadata_bytes);

// ---- the ring ---------------------------------------------------------------------------------------------------

template <class T>
inline std::atomic_ref<T> aref(T& x) noexcept {
  return std::atomic_ref<T>(x);
}

/// A view of a mapped channel: the ring operations both sides use. Single producer (the publisher); consumers are
/// the subscriber and, to drop the oldest message, the publisher. Cells are claimed by CAS on `head` before being
/// read, so no cell is ever read while it is written.
class Ring {
 public:
  Ring() = default;
  /// `base` points at a channel whose header has been validated (or built by make_channel_header).
  explicit Ring(char* base) noexcept : base_(base), h_(reinterpret_cast<ChannelHeader*>(base)) {}

  ChannelHeader& header() const noexcept { return *h_; }
  CellHeader& cell(uint64_t pos) const noexcept {
    return *reinterpret_cast<CellHeader*>(base_ + h_->cells_offset + (pos % h_->cells) * h_->cell_bytes);
  }
  char* cell_metadata(CellHeader& c) const noexcept { return reinterpret_cast<char*>(&c) + sizeof(CellHeader); }
  uint32_t& released(uint32_t slot) const noexcept {
    return reinterpret_cast<uint32_t*>(base_ + h_->leases_offset)[slot];
  }

  /// Initialises cells' sequence words (publisher, before the channel is shared).
  void init_cells() noexcept;

  // -- producer --
  /// Messages queued (pushed, not yet claimed).
  uint64_t queued() const noexcept;
  bool full() const noexcept { return queued() >= h_->depth; }
  /// The cell for the next push, or nullptr when the ring is full or a reader still copies out of that cell.
  CellHeader* begin_push() noexcept;
  /// Publishes the cell from begin_push; wakes a sleeping subscriber. Returns true when the subscriber asked for
  /// eventfd notification.
  bool commit_push() noexcept;
  /// Marks the stream closed and wakes the subscriber.
  void close() noexcept;

  // -- consumers --
  /// Claims the oldest message and calls read(CellHeader&) on it before freeing the cell. False when empty.
  template <class F>
  bool try_pop(F&& read);
  bool empty() const noexcept;
  /// After a pop: tells a publisher waiting for room.
  void signal_space() noexcept;
  bool closed() const noexcept { return aref(h_->closed).load(std::memory_order_acquire) != 0; }

 private:
  char* base_ = nullptr;
  ChannelHeader* h_ = nullptr;
};

template <class F>
bool Ring::try_pop(F&& read) {
  auto head = aref(h_->head);
  for (;;) {
    uint64_t h = head.load(std::memory_order_seq_cst);
    CellHeader& c = cell(h);
    const uint64_t seq = aref(c.seq).load(std::memory_order_acquire);
    const int64_t diff = static_cast<int64_t>(seq - (h + 1));
    if (diff < 0) return false;  // not yet written: empty
    if (diff > 0) {              // another consumer claimed h meanwhile: reload head
      if (head.load(std::memory_order_seq_cst) == h) return false;  // ...or a corrupt cell: never spin on it
      continue;
    }
    if (!head.compare_exchange_weak(h, h + 1, std::memory_order_acq_rel, std::memory_order_relaxed)) continue;
    read(c);
    aref(c.seq).store(h + h_->cells, std::memory_order_release);
    return true;
  }
}

}  // namespace tw::ipc_detail
