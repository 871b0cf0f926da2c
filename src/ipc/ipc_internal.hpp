// ipc_internal.hpp (private) — the wire format of tensorwire IPC and the small RAII pieces it is built from.
//
// Shared memory is a wire format: every struct placed in it is trivially copyable, holds offsets (never pointers),
// starts with a magic and a version, and has its layout frozen by static_asserts here and offsetof tests in
// tests/cpp/test_ipc.cpp. Fields written by one process and read by another are accessed only via std::atomic_ref.
// Everything read from a peer is validated before use: decode_message, decode_control and validate_channel are
// pure functions of their input so a fuzzer can feed them hostile bytes (fuzz/fuzz_ipc_message.cpp).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "os/os_internal.hpp"
#include "tensorwire/ipc.hpp"
#include "tensorwire/layout.hpp"
#include "tensorwire/metadata.hpp"

namespace tw::ipc_detail {

// ---- the OS layer, as the transport uses it --------------------------------------------------------------------

using os::add_seals;
using os::check_memory_available;
using os::check_sealed;
using os::connect_abstract;
using os::Fd;
using os::find_listening;
using os::futex_wait;
using os::futex_wake_all;
using os::is_eventfd;
using os::kMaxPrefaultBytes;
using os::listen_abstract;
using os::make_memfd;
using os::Mapping;
using os::memory_headroom;
using os::peer_credentials;
using os::PeerCred;
using os::prefault_allowed;
using os::recv_packet;
using os::send_packet;
using os::SendResult;
using os::throw_errno;

/// Abstract-namespace address of a topic's publisher: "tw/<uid>/<name>".
std::string publisher_address(std::string_view name);
/// Prefix of the addresses on which waiting subscribers listen: "tw/<uid>/<name>#s".
std::string subscriber_address_prefix(std::string_view name);

// ---- wire format ------------------------------------------------------------------------------------------------

inline constexpr uint32_t kMagic = 0x50495754;  // "TWIP" little-endian
inline constexpr uint16_t kWireVersion = 3;  // 2: groups of tensors, memory kind; 3: CUDA segments, kPacked
inline constexpr size_t kCacheLine = 64;

/// Descriptor flags. A message of several tensors (a group) is one header cell (kGroupHead; `group` = the number
/// of tensors; its metadata says the structure) followed by that many tensor cells (kGroupPart; `group` = the
/// tensor's index). The publisher commits a group's cells last-first, so a subscriber that sees the header sees
/// every part; a publisher dropping the oldest drops whole groups.
inline constexpr uint16_t kGroupHead = 1;
inline constexpr uint16_t kGroupPart = 2;
/// The publisher copied the tensor into the pool buffer (it was not a loan or a zero-copy export): received
/// tensors say "shm-copy" / "cuda-copy" in Tensor::transport.
inline constexpr uint16_t kPacked = 4;
inline constexpr uint16_t kKnownFlags = kGroupHead | kGroupPart | kPacked;
/// Tensors in one message at most.
inline constexpr uint32_t kMaxGroup = 256;

/// Which memory a descriptor's segment is: a host memfd (SEGMENT) or a CUDA allocation (CUDA_SEGMENT).
enum class MemoryKind : uint8_t { host = 0, cuda = 1 };

/// How a subscriber opens a CUDA segment: a VMM allocation's POSIX fd (crossing with SCM_RIGHTS; tensorwire's own
/// pool, or a caller's cuMemCreate memory such as PyTorch's expandable segments), or a legacy CUipcMemHandle of a
/// cudaMalloc allocation's base (PyTorch's caching allocator), opened once per process with cuIpcOpenMemHandle.
enum class CudaHandle : uint8_t { vmm = 1, legacy = 2 };

/// One message: which allocation, and the tensor's layout relative to it. Fixed size, trivially copyable; the
/// encoded metadata follows it in the ring cell.
struct MessageDescriptor {
  uint32_t magic;           ///< kMagic
  uint16_t version;         ///< kWireVersion
  uint16_t flags;           ///< kGroupHead / kGroupPart, else 0
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
  uint16_t group;           ///< kGroupHead: tensors in the message; kGroupPart: this tensor's index; else 0
  uint8_t memory_kind;      ///< MemoryKind of the segment
  uint8_t reserved;         ///< 0
  int64_t shape[kMaxRank];
  int64_t strides[kMaxRank];  ///< in elements
};
static_assert(std::is_trivially_copyable_v<MessageDescriptor> && std::is_standard_layout_v<MessageDescriptor>);
static_assert(offsetof(MessageDescriptor, segment_id) == 16);
static_assert(offsetof(MessageDescriptor, byte_offset) == 40);
static_assert(offsetof(MessageDescriptor, lease_slot) == 48);
static_assert(offsetof(MessageDescriptor, dtype_code) == 56);
static_assert(offsetof(MessageDescriptor, metadata_bytes) == 64);
static_assert(offsetof(MessageDescriptor, group) == 68);
static_assert(offsetof(MessageDescriptor, memory_kind) == 70);
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
  uint32_t producer_cpu;        ///< the CPU the publisher last pushed from (a hint for the subscriber's spin)
  uint8_t pad1[kCacheLine - 32];
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
static_assert(offsetof(ChannelHeader, producer_cpu) == 92);
static_assert(offsetof(ChannelHeader, head) == 128);
static_assert(sizeof(ChannelHeader) == 192);

/// Sizes of a channel for a depth, metadata capacity and lease table; fills a header (magic, version, layout).
ChannelHeader make_channel_header(size_t depth, size_t max_metadata_bytes, size_t lease_slots, uint32_t pid);
/// Validates a channel header read from a peer against the mapping's size; throws Error(invalid_argument).
/// Call it on a private copy, and build the Ring from that copy.
void validate_channel(const ChannelHeader& h, uint64_t mapped_bytes);

/// Control messages, one SOCK_SEQPACKET packet each (publisher -> subscriber).
enum class ControlType : uint16_t {
  welcome = 1,  ///< fds: channel memfd, eventfd; size: channel bytes
  segment = 2,  ///< fds: segment memfd; id, size: segment id and bytes
  retire = 3,   ///< id: a segment that leaves the pool (drop the cached mapping)
  bye = 4,      ///< the publisher closes the stream
  refused = 5,  ///< the publisher turns this subscriber away; id: a RefuseReason
  cuda_segment = 6,  ///< a CudaSegmentWire; fds: the VMM fd (CudaHandle::vmm) or none (legacy); id, size as SEGMENT
};

/// Why a publisher refused a subscriber (ControlType::refused).
enum class RefuseReason : uint64_t {
  too_many_subscribers = 1,  ///< PublisherOptions::max_subscribers reached
  no_resources = 2,          ///< the publisher ran out of fds or memory making the channel
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

/// A CUDA segment's announcement: the memory (a device allocation, or the part of one a slot exports) and the
/// IPC event the publisher records on the producer's stream before each message naming the segment.
struct CudaSegmentWire {
  ControlWire head;          ///< type cuda_segment; id; size: the bytes a subscriber may address
  int32_t device;            ///< the publisher's CUDA ordinal (subscribers on the same machine see the same GPUs)
  uint8_t handle_kind;       ///< CudaHandle
  uint8_t reserved0;
  uint16_t reserved1;
  uint64_t handle_offset;    ///< legacy: where the segment starts in the allocation the handle opens
  uint8_t device_uuid[16];   ///< the device's UUID: ordinals differ between processes (CUDA_VISIBLE_DEVICES)
  uint8_t mem_handle[64];    ///< legacy: the CUipcMemHandle (vmm: zero; the fd crosses with SCM_RIGHTS)
  uint8_t event_handle[64];  ///< the CUipcEventHandle of the segment's event
};
static_assert(std::is_trivially_copyable_v<CudaSegmentWire> && std::is_standard_layout_v<CudaSegmentWire>);
static_assert(offsetof(CudaSegmentWire, device) == 32);
static_assert(offsetof(CudaSegmentWire, handle_offset) == 40);
static_assert(offsetof(CudaSegmentWire, device_uuid) == 48);
static_assert(offsetof(CudaSegmentWire, mem_handle) == 64);
static_assert(offsetof(CudaSegmentWire, event_handle) == 128);
static_assert(sizeof(CudaSegmentWire) == 192);

/// What a valid CUDA_SEGMENT says beyond id and size.
struct CudaSegmentInfo {
  int device = 0;
  CudaHandle handle = CudaHandle::vmm;
  uint64_t handle_offset = 0;
  std::array<uint8_t, 16> device_uuid{};
  std::array<uint8_t, 64> mem_handle{};
  std::array<uint8_t, 64> event_handle{};
};

struct ControlMessage {
  ControlType type;
  uint64_t id = 0;
  uint64_t size = 0;
  uint32_t pid = 0;
  CudaSegmentInfo cuda;  ///< cuda_segment only
};
ControlWire encode_control(ControlType type, uint64_t id, uint64_t size);
CudaSegmentWire encode_cuda_segment(uint64_t id, uint64_t size, const CudaSegmentInfo& info);
/// Validates one received control packet (a ControlWire, or a CudaSegmentWire) and the number of fds that came
/// with it; throws Error(invalid_argument) naming the problem.
ControlMessage decode_control(std::span<const uint8_t> bytes, size_t nfds);

/// What a valid message says (one tensor cell).
struct DecodedMessage {
  MemoryKind memory = MemoryKind::host;
  bool packed = false;  ///< kPacked: the publisher copied the tensor
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

/// Fills a descriptor for `layout` in an allocation (a tensor cell: `flags` 0 or kGroupPart with `group` = index).
void encode_message(MessageDescriptor& d, const Layout& layout, uint64_t sequence, uint64_t segment_id,
                    uint64_t alloc_offset, uint64_t alloc_bytes, uint32_t lease_slot, uint32_t metadata_bytes,
                    uint16_t flags = 0, uint16_t group = 0, MemoryKind memory = MemoryKind::host);
/// Fills a group header cell: `count` tensor cells follow; `metadata_bytes` of structure follow the descriptor.
void encode_group_head(MessageDescriptor& d, uint64_t sequence, uint16_t count, uint32_t metadata_bytes);

/// What a valid group header says: how many tensors follow and the message's structure.
struct DecodedGroupHead {
  uint64_t sequence = 0;
  uint32_t count = 0;
  Metadata structure;  ///< {"kind": "list"|"tuple"|"dict", "keys": [str, ...] for a dict}
};
/// Validates a group header cell (magic, version, flags, count, metadata); throws Error(invalid_argument).
DecodedGroupHead decode_group_head(const MessageDescriptor& d, std::string_view metadata, uint32_t max_metadata_bytes);

// ---- the ring ---------------------------------------------------------------------------------------------------

template <class T>
inline std::atomic_ref<T> aref(T& x) noexcept {
  return std::atomic_ref<T>(x);
}

/// What a pop found.
enum class Pop : uint8_t {
  empty,    ///< nothing queued
  popped,   ///< a message was claimed and read
  corrupt,  ///< the ring's words contradict the protocol (a peer rewrote them): drop that peer
};

/// A view of a mapped channel: the ring operations both sides use. Single producer (the publisher); consumers are
/// the subscriber and, to drop the oldest message, the publisher. Cells are claimed by CAS on `head` before being
/// read, so no cell is ever read while it is written.
///
/// The geometry (depth, cells, cell size, offsets, lease slots) is a private copy taken from a header validated
/// once (or built by make_channel_header); it is never read from shared memory again, so a peer that rewrites the
/// header cannot make an index or a division go wrong here. Only the protocol words (head, tail, seq, counters)
/// are read from shared memory, and each is treated as hostile.
class Ring {
 public:
  Ring() = default;
  /// `base` points at the mapped channel; `validated` is a private copy of its header that passed
  /// validate_channel (or came from make_channel_header).
  Ring(char* base, const ChannelHeader& validated) noexcept
      : base_(base),
        h_(reinterpret_cast<ChannelHeader*>(base)),
        cells_offset_(validated.cells_offset),
        cell_bytes_(validated.cell_bytes),
        leases_offset_(validated.leases_offset),
        cells_(validated.cells),
        depth_(validated.depth),
        lease_slots_(validated.lease_slots),
        max_metadata_bytes_(validated.max_metadata_bytes) {}

  /// The shared header: only its protocol words may be used (the geometry is in the accessors below).
  ChannelHeader& header() const noexcept { return *h_; }
  uint32_t depth() const noexcept { return depth_; }
  uint32_t lease_slots() const noexcept { return lease_slots_; }
  uint32_t max_metadata_bytes() const noexcept { return max_metadata_bytes_; }
  CellHeader& cell(uint64_t pos) const noexcept {
    return *reinterpret_cast<CellHeader*>(base_ + cells_offset_ + (pos % cells_) * cell_bytes_);
  }
  char* cell_metadata(CellHeader& c) const noexcept { return reinterpret_cast<char*>(&c) + sizeof(CellHeader); }
  /// The release counter of `slot`, or nullptr when `slot` is outside the lease table.
  uint32_t* released(uint32_t slot) const noexcept {
    if (slot >= lease_slots_) return nullptr;
    return reinterpret_cast<uint32_t*>(base_ + leases_offset_) + slot;
  }
  /// Publisher side: whether head and tail are consistent (head <= tail <= head + cells). A subscriber that moved
  /// head past tail, or far behind, broke the protocol.
  bool sane() const noexcept;

  /// Initialises cells' sequence words (publisher, before the channel is shared).
  void init_cells() noexcept;

  // -- producer --
  /// Messages queued (pushed, not yet claimed).
  uint64_t queued() const noexcept;
  bool full() const noexcept { return queued() >= depth_; }
  /// The cell for the next push, or nullptr when the ring is full or a reader still copies out of that cell.
  CellHeader* begin_push() noexcept;
  /// Publishes the cell from begin_push; wakes a sleeping subscriber. Returns true when the subscriber asked for
  /// eventfd notification.
  bool commit_push() noexcept;
  /// Whether `k` consecutive cells are free for a push (k <= depth).
  bool room_for(uint32_t k) const noexcept;
  /// Pushes `k` cells at once (room_for(k) first): fill(i, cell) writes each; they are published last-first, so a
  /// reader that sees the first sees all. Returns true when the subscriber asked for eventfd notification.
  template <class F>
  bool push_n(uint32_t k, F&& fill) noexcept;
  /// Marks the stream closed and wakes the subscriber.
  void close() noexcept;

  // -- consumers --
  /// Claims the oldest message and calls read(CellHeader&) on it before freeing the cell. Bounded: never spins
  /// on a cell whose sequence word contradicts head.
  template <class F>
  Pop try_pop(F&& read) {
    return try_pop_if([](const CellHeader&) { return true; }, read);
  }
  /// The same, claiming the oldest cell only when accept(cell) says so (Pop::empty otherwise). The cell is read
  /// before it is claimed: safe for the producer (nobody rewrites a written cell but the producer itself).
  template <class P, class F>
  Pop try_pop_if(P&& accept, F&& read);
  bool empty() const noexcept;
  /// After a pop: tells a publisher waiting for room.
  void signal_space() noexcept;
  bool closed() const noexcept { return aref(h_->closed).load(std::memory_order_acquire) != 0; }

 private:
  bool publish(uint64_t new_tail) noexcept;  // tail, futex word, wake-up
  char* base_ = nullptr;
  ChannelHeader* h_ = nullptr;
  uint64_t cells_offset_ = 0, cell_bytes_ = 0, leases_offset_ = 0;
  uint32_t cells_ = 1, depth_ = 0, lease_slots_ = 0, max_metadata_bytes_ = 0;
};

template <class F>
bool Ring::push_n(uint32_t k, F&& fill) noexcept {
  const uint64_t pos = aref(h_->tail).load(std::memory_order_relaxed);
  for (uint32_t i = 0; i < k; ++i) fill(i, cell(pos + i));
  for (uint32_t i = k; i-- > 0;) aref(cell(pos + i).seq).store(pos + i + 1, std::memory_order_seq_cst);
  return publish(pos + k);
}

template <class P, class F>
Pop Ring::try_pop_if(P&& accept, F&& read) {
  auto head = aref(h_->head);
  // Two consumers at most (the subscriber, and the publisher dropping the oldest): a lost CAS means the other one
  // made progress, so a bounded number of rounds is plenty; more means someone rewrites head under us.
  for (int round = 0; round < 1024; ++round) {
    uint64_t h = head.load(std::memory_order_seq_cst);
    CellHeader& c = cell(h);
    const uint64_t seq = aref(c.seq).load(std::memory_order_acquire);
    const int64_t diff = static_cast<int64_t>(seq - (h + 1));
    if (diff < 0) return Pop::empty;  // not yet written
    if (diff > 0) {                   // another consumer claimed h meanwhile: reload head
      if (head.load(std::memory_order_seq_cst) == h) return Pop::corrupt;  // ...or a cell ahead of head
      continue;
    }
    if (!accept(static_cast<const CellHeader&>(c))) return Pop::empty;
    if (!head.compare_exchange_weak(h, h + 1, std::memory_order_acq_rel, std::memory_order_relaxed)) continue;
    read(c);
    aref(c.seq).store(h + cells_, std::memory_order_release);
    return Pop::popped;
  }
  return Pop::corrupt;
}

/// Callers' CUDA allocations that closed publishers keep alive for subscribers still reading them (publisher.cpp).
size_t lingering_foreign_allocations();

}  // namespace tw::ipc_detail
