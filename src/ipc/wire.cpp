// wire.cpp — encoding and validation of what crosses between processes: channel headers, ring cells, message
// descriptors and control packets. Decoders are pure functions of their input (fuzzed by fuzz_ipc_message).
#include <sched.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>

#include "core/checked.hpp"
#include "ipc_internal.hpp"

namespace tw {

OnFull on_full_from_string(std::string_view s) {
  if (s == "block") return OnFull::block;
  if (s == "drop_oldest") return OnFull::drop_oldest;
  if (s == "raise") return OnFull::raise;
  throw Error(ErrorCode::invalid_argument,
              "on_full must be 'block', 'drop_oldest' or 'raise', not '" + std::string(s) + "'");
}

const char* on_full_name(OnFull f) noexcept {
  switch (f) {
    case OnFull::block: return "block";
    case OnFull::drop_oldest: return "drop_oldest";
    case OnFull::raise: return "raise";
  }
  return "?";
}

namespace {

// A name as an error message can show it: printable ASCII as it is, any other byte as \xNN (a newline or a
// UTF-8 sequence printed raw garbled the message).
std::string shown(std::string_view name) {
  std::string out;
  for (const char c : name) {
    const auto b = static_cast<unsigned char>(c);
    if (b >= 0x20 && b < 0x7f && c != '\\') {
      out += c;
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", b);
      out += buf;
    }
  }
  return out;
}

}  // namespace

void validate_topic_name(std::string_view name) {
  constexpr const char* kRule = "letters, digits and _ - . / : (ASCII)";
  if (name.empty()) throw Error(ErrorCode::invalid_argument, "topic name is empty");
  if (name.size() > 64)
    throw Error(ErrorCode::invalid_argument, "topic name '" + shown(name.substr(0, 64)) + "...' is " +
                                                 std::to_string(name.size()) + " bytes long; at most 64 of " + kRule +
                                                 " are allowed");
  if (name[0] == '/')
    throw Error(ErrorCode::invalid_argument, "topic name '" + shown(name) + "' must not start with '/'");
  for (const char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                    c == '-' || c == '.' || c == '/' || c == ':';
    if (!ok) {
      const auto b = static_cast<unsigned char>(c);
      const std::string what = b >= 0x20 && b < 0x7f ? "'" + std::string(1, c) + "'"
                               : b >= 0x80           ? "a non-ASCII character"
                                                     : "a control character (" + shown(std::string_view(&c, 1)) + ")";
      throw Error(ErrorCode::invalid_argument,
                  "topic name '" + shown(name) + "' contains " + what + "; use " + kRule);
    }
  }
}

namespace ipc_detail {

std::string publisher_address(std::string_view name) {
  return "tw/" + std::to_string(::getuid()) + "/" + std::string(name);
}

std::string subscriber_address_prefix(std::string_view name) { return publisher_address(name) + "#s"; }

namespace {

[[noreturn]] void bad(const std::string& what) {
  throw Error(ErrorCode::invalid_argument, "tensorwire ipc: malformed message from peer: " + what);
}

constexpr uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

}  // namespace

// ---- channel ----------------------------------------------------------------------------------------------------

ChannelHeader make_channel_header(size_t depth, size_t max_metadata_bytes, size_t lease_slots, uint32_t pid) {
  if (depth < 1 || depth > (1u << 20))
    throw Error(ErrorCode::invalid_argument, "depth must be between 1 and 1048576, not " + std::to_string(depth));
  if (max_metadata_bytes > (64u << 20))
    throw Error(ErrorCode::invalid_argument, "max_metadata_bytes must be at most 64 MiB, not " +
                                                 std::to_string(max_metadata_bytes));
  if (lease_slots < 1 || lease_slots > (1u << 16))
    throw Error(ErrorCode::invalid_argument, "max_buffers must be between 1 and 65536, not " + std::to_string(lease_slots));
  ChannelHeader h{};
  h.magic = kMagic;
  h.version = kWireVersion;
  h.header_bytes = sizeof(ChannelHeader);
  h.depth = static_cast<uint32_t>(depth);
  h.cells = static_cast<uint32_t>(depth < 2 ? 2 : depth);  // a Vyukov ring needs two cells to tell full from empty
  h.max_metadata_bytes = static_cast<uint32_t>(max_metadata_bytes);
  h.cell_bytes = round_up(sizeof(CellHeader) + max_metadata_bytes, kCacheLine);
  h.cells_offset = sizeof(ChannelHeader);
  h.lease_slots = static_cast<uint32_t>(lease_slots);
  h.leases_offset = h.cells_offset + h.cells * h.cell_bytes;
  h.total_bytes = round_up(h.leases_offset + lease_slots * sizeof(uint32_t), 4096);
  h.publisher_pid = pid;
  return h;
}

void validate_channel(const ChannelHeader& h, uint64_t mapped_bytes) {
  if (mapped_bytes < sizeof(ChannelHeader)) bad("channel of " + std::to_string(mapped_bytes) + " bytes");
  if (h.magic != kMagic) bad("channel magic");
  if (h.version != kWireVersion)
    throw Error(ErrorCode::version_mismatch, "tensorwire ipc: the publisher speaks wire version " +
                                                 std::to_string(h.version) + ", this build speaks " +
                                                 std::to_string(kWireVersion) + "; use the same tensorwire version");
  if (h.header_bytes != sizeof(ChannelHeader)) bad("channel header size");
  if (h.depth < 1 || h.cells < 2 || h.cells < h.depth) bad("ring depth");
  if (h.max_metadata_bytes > (64u << 20)) bad("metadata capacity");
  if (h.cell_bytes < sizeof(CellHeader) + h.max_metadata_bytes || h.cell_bytes % kCacheLine) bad("cell size");
  if (h.cells_offset < sizeof(ChannelHeader) || h.cells_offset % kCacheLine) bad("cells offset");
  if (h.lease_slots < 1 || h.lease_slots > (1u << 16)) bad("lease table size");
  unsigned __int128 cells_end = static_cast<unsigned __int128>(h.cells) * h.cell_bytes + h.cells_offset;
  if (cells_end > h.leases_offset || h.leases_offset % alignof(uint32_t)) bad("lease table offset");
  unsigned __int128 end = static_cast<unsigned __int128>(h.lease_slots) * sizeof(uint32_t) + h.leases_offset;
  if (end > h.total_bytes || h.total_bytes > mapped_bytes) bad("channel size");
}

// ---- ring -------------------------------------------------------------------------------------------------------

void Ring::init_cells() noexcept {
  for (uint64_t i = 0; i < cells_; ++i) aref(cell(i).seq).store(i, std::memory_order_relaxed);
}

bool Ring::sane() const noexcept {
  const uint64_t t = aref(h_->tail).load(std::memory_order_relaxed);
  const uint64_t hd = aref(h_->head).load(std::memory_order_acquire);
  return hd <= t && t - hd <= cells_;
}

uint64_t Ring::queued() const noexcept {
  const uint64_t t = aref(h_->tail).load(std::memory_order_relaxed);
  const uint64_t hd = aref(h_->head).load(std::memory_order_acquire);
  return t >= hd ? t - hd : 0;  // a head beyond tail (a hostile peer) reads as empty
}

CellHeader* Ring::begin_push() noexcept {
  const uint64_t pos = aref(h_->tail).load(std::memory_order_relaxed);
  if (queued() >= depth_) return nullptr;
  CellHeader& c = cell(pos);
  if (aref(c.seq).load(std::memory_order_acquire) != pos) return nullptr;  // a reader is still copying out
  return &c;
}

bool Ring::commit_push() noexcept {
  const uint64_t pos = aref(h_->tail).load(std::memory_order_relaxed);
  aref(cell(pos).seq).store(pos + 1, std::memory_order_seq_cst);
  return publish(pos + 1);
}

bool Ring::room_for(uint32_t k) const noexcept {
  if (k == 0 || k > depth_ || queued() + k > depth_) return false;
  const uint64_t pos = aref(h_->tail).load(std::memory_order_relaxed);
  for (uint32_t i = 0; i < k; ++i)
    if (aref(cell(pos + i).seq).load(std::memory_order_acquire) != pos + i) return false;  // a reader copies out
  return true;
}

bool Ring::publish(uint64_t new_tail) noexcept {
  const int cpu = ::sched_getcpu();
  aref(h_->producer_cpu).store(cpu < 0 ? UINT32_MAX : static_cast<uint32_t>(cpu), std::memory_order_relaxed);
  aref(h_->tail).store(new_tail, std::memory_order_release);
  aref(h_->futex_word).fetch_add(1, std::memory_order_seq_cst);
  if (aref(h_->waiters).load(std::memory_order_seq_cst) != 0) futex_wake_all(&h_->futex_word);
  return aref(h_->want_eventfd).load(std::memory_order_relaxed) != 0;
}

void Ring::close() noexcept {
  aref(h_->closed).store(1, std::memory_order_seq_cst);
  aref(h_->futex_word).fetch_add(1, std::memory_order_seq_cst);
  futex_wake_all(&h_->futex_word);
}

void Ring::signal_space() noexcept {
  aref(h_->space_word).fetch_add(1, std::memory_order_seq_cst);
  if (aref(h_->producer_waiting).load(std::memory_order_seq_cst) != 0) futex_wake_all(&h_->space_word);
}

bool Ring::empty() const noexcept {
  const uint64_t h = aref(h_->head).load(std::memory_order_seq_cst);
  const uint64_t seq = aref(cell(h).seq).load(std::memory_order_acquire);
  return static_cast<int64_t>(seq - (h + 1)) < 0;
}

// ---- messages ---------------------------------------------------------------------------------------------------

void encode_message(MessageDescriptor& d, const Layout& layout, uint64_t sequence, uint64_t segment_id,
                    uint64_t alloc_offset, uint64_t alloc_bytes, uint32_t lease_slot, uint32_t metadata_bytes,
                    uint16_t flags, uint16_t group, MemoryKind memory) {
  d.magic = kMagic;
  d.version = kWireVersion;
  d.flags = flags;
  d.group = group;
  d.memory_kind = static_cast<uint8_t>(memory);
  d.sequence = sequence;
  d.segment_id = segment_id;
  d.alloc_offset = alloc_offset;
  d.alloc_bytes = alloc_bytes;
  d.byte_offset = layout.byte_offset;
  d.lease_slot = lease_slot;
  d.ndim = static_cast<uint32_t>(layout.ndim());
  d.dtype_code = layout.dtype.code;
  d.dtype_bits = layout.dtype.bits;
  d.dtype_lanes = layout.dtype.lanes;
  d.subbyte_padded = layout.subbyte_padded ? 1 : 0;
  d.metadata_bytes = metadata_bytes;
  d.reserved = 0;
  for (size_t i = 0; i < layout.ndim(); ++i) {
    d.shape[i] = layout.shape[i];
    d.strides[i] = layout.strides[i];
  }
}

void encode_group_head(MessageDescriptor& d, uint64_t sequence, uint16_t count, uint32_t metadata_bytes) {
  std::memset(&d, 0, sizeof d);
  d.magic = kMagic;
  d.version = kWireVersion;
  d.flags = kGroupHead;
  d.group = count;
  d.sequence = sequence;
  d.lease_slot = UINT32_MAX;
  d.metadata_bytes = metadata_bytes;
}

DecodedGroupHead decode_group_head(const MessageDescriptor& d, std::string_view metadata,
                                   uint32_t max_metadata_bytes) {
  if (d.magic != kMagic) bad("descriptor magic");
  if (d.version != kWireVersion) bad("descriptor version " + std::to_string(d.version));
  if (d.flags != kGroupHead) bad("group header flags " + std::to_string(d.flags));
  if (d.group < 1 || d.group > kMaxGroup) bad("a group of " + std::to_string(d.group) + " tensors");
  if (d.metadata_bytes > max_metadata_bytes || d.metadata_bytes != metadata.size() || metadata.empty())
    bad("group structure of " + std::to_string(d.metadata_bytes) + " bytes");
  DecodedGroupHead g;
  g.sequence = d.sequence;
  g.count = d.group;
  g.structure = decode_metadata(metadata);
  const Value* kind = g.structure.find("kind");
  if (!kind || kind->kind() != Value::Kind::string) bad("group structure without a kind");
  const std::string& k = kind->as_string();
  if (k == "dict") {
    const Value* keys = g.structure.find("keys");
    if (!keys || keys->kind() != Value::Kind::list || keys->items().size() != g.count) bad("group keys");
    for (const Value& key : keys->items())
      if (key.kind() != Value::Kind::string) bad("a group key that is not a string");
  } else if (k != "list" && k != "tuple") {
    bad("group kind '" + k + "'");
  }
  return g;
}

DecodedMessage decode_message(const MessageDescriptor& d, std::string_view metadata, uint64_t segment_bytes,
                              uint32_t lease_slots, uint32_t max_metadata_bytes) {
  if (d.magic != kMagic) bad("descriptor magic");
  if (d.version != kWireVersion) bad("descriptor version " + std::to_string(d.version));
  if ((d.flags & ~kKnownFlags) != 0 || (d.flags & kGroupHead)) bad("descriptor flags " + std::to_string(d.flags));
  if (d.memory_kind > static_cast<uint8_t>(MemoryKind::cuda)) bad("memory kind " + std::to_string(d.memory_kind));
  if (d.reserved != 0) bad("reserved descriptor byte");
  if (d.ndim > kMaxRank) bad("rank " + std::to_string(d.ndim));
  if (d.lease_slot >= lease_slots) bad("lease slot " + std::to_string(d.lease_slot));
  if (d.metadata_bytes > max_metadata_bytes || d.metadata_bytes != metadata.size())
    bad("metadata of " + std::to_string(d.metadata_bytes) + " bytes");
  if (segment_bytes == 0) bad("segment " + std::to_string(d.segment_id) + " was never announced");
  if (d.alloc_offset > segment_bytes || d.alloc_bytes > segment_bytes - d.alloc_offset)
    bad("allocation [" + std::to_string(d.alloc_offset) + ", +" + std::to_string(d.alloc_bytes) +
        ") outside its segment of " + std::to_string(segment_bytes) + " bytes");
  if (d.alloc_bytes > static_cast<uint64_t>(INT64_MAX)) bad("allocation size");
  DecodedMessage m;
  m.memory = static_cast<MemoryKind>(d.memory_kind);
  m.packed = (d.flags & kPacked) != 0;
  m.sequence = d.sequence;
  m.segment_id = d.segment_id;
  m.alloc_offset = d.alloc_offset;
  m.alloc_bytes = d.alloc_bytes;
  m.lease_slot = d.lease_slot;
  m.layout.dtype = DType::from_dlpack(DLDataType{d.dtype_code, d.dtype_bits, d.dtype_lanes});
  if (d.subbyte_padded > 1) bad("subbyte_padded flag");
  m.layout.subbyte_padded = d.subbyte_padded != 0 && m.layout.dtype.is_subbyte();
  m.layout.shape = Shape(d.shape, d.ndim);
  m.layout.strides = Strides(d.strides, d.ndim);
  m.layout.byte_offset = d.byte_offset;
  m.layout.validate();  // negative sizes, overflow of numel and offsets
  if (m.layout.numel() > 0) {
    const ByteSpan sp = m.layout.byte_span();
    const int64_t lo = detail::add(m.layout.byte_offset, sp.begin, "tensor span"),
                  hi = detail::add(m.layout.byte_offset, sp.end, "tensor span");
    if (lo < 0 || static_cast<uint64_t>(hi) > d.alloc_bytes)
      bad("tensor spans bytes [" + std::to_string(lo) + ", " + std::to_string(hi) + ") of an allocation of " +
          std::to_string(d.alloc_bytes));
  }
  if (!metadata.empty()) m.metadata = decode_metadata(metadata);
  return m;
}

// ---- control ----------------------------------------------------------------------------------------------------

ControlWire encode_control(ControlType type, uint64_t id, uint64_t size) {
  ControlWire w{};
  w.magic = kMagic;
  w.version = kWireVersion;
  w.type = static_cast<uint16_t>(type);
  w.id = id;
  w.size = size;
  w.pid = static_cast<uint32_t>(::getpid());
  return w;
}

CudaSegmentWire encode_cuda_segment(uint64_t id, uint64_t size, const CudaSegmentInfo& info) {
  CudaSegmentWire w{};
  w.head = encode_control(ControlType::cuda_segment, id, size);
  w.device = info.device;
  w.handle_kind = static_cast<uint8_t>(info.handle);
  w.handle_offset = info.handle_offset;
  std::memcpy(w.device_uuid, info.device_uuid.data(), sizeof w.device_uuid);
  std::memcpy(w.mem_handle, info.mem_handle.data(), sizeof w.mem_handle);
  std::memcpy(w.event_handle, info.event_handle.data(), sizeof w.event_handle);
  return w;
}

ControlMessage decode_control(std::span<const uint8_t> bytes, size_t nfds) {
  if (bytes.size() != sizeof(ControlWire) && bytes.size() != sizeof(CudaSegmentWire))
    bad("control packet of " + std::to_string(bytes.size()) + " bytes");
  ControlWire w;
  std::memcpy(&w, bytes.data(), sizeof w);
  if (w.magic != kMagic) bad("control magic");
  if (w.version != kWireVersion)
    throw Error(ErrorCode::version_mismatch, "tensorwire ipc: the peer speaks wire version " + std::to_string(w.version) +
                                                 ", this build speaks " + std::to_string(kWireVersion));
  ControlMessage m;
  m.id = w.id;
  m.size = w.size;
  m.pid = w.pid;
  size_t want = 0;
  switch (w.type) {
    case static_cast<uint16_t>(ControlType::welcome):
      m.type = ControlType::welcome;
      want = 2;
      if (w.size < sizeof(ChannelHeader) || w.size > (uint64_t{1} << 40)) bad("channel size " + std::to_string(w.size));
      break;
    case static_cast<uint16_t>(ControlType::segment):
      m.type = ControlType::segment;
      want = 1;
      if (w.id == 0) bad("segment id 0");
      if (w.size == 0 || w.size > (uint64_t{1} << 46)) bad("segment size " + std::to_string(w.size));
      break;
    case static_cast<uint16_t>(ControlType::cuda_segment): {
      m.type = ControlType::cuda_segment;
      if (bytes.size() != sizeof(CudaSegmentWire)) bad("a CUDA segment packet of " + std::to_string(bytes.size()) + " bytes");
      CudaSegmentWire c;
      std::memcpy(&c, bytes.data(), sizeof c);
      if (w.id == 0) bad("segment id 0");
      if (w.size == 0 || w.size > (uint64_t{1} << 46)) bad("segment size " + std::to_string(w.size));
      if (c.device < 0 || c.device > 1023) bad("CUDA device " + std::to_string(c.device));
      if (c.handle_kind != static_cast<uint8_t>(CudaHandle::vmm) && c.handle_kind != static_cast<uint8_t>(CudaHandle::legacy))
        bad("CUDA handle kind " + std::to_string(c.handle_kind));
      if (c.reserved0 != 0 || c.reserved1 != 0) bad("reserved CUDA segment fields");
      m.cuda.device = c.device;
      m.cuda.handle = static_cast<CudaHandle>(c.handle_kind);
      want = m.cuda.handle == CudaHandle::vmm ? 1 : 0;
      if (m.cuda.handle == CudaHandle::vmm && c.handle_offset != 0) bad("a VMM segment with a handle offset");
      if (c.handle_offset > (uint64_t{1} << 46)) bad("CUDA handle offset " + std::to_string(c.handle_offset));
      m.cuda.handle_offset = c.handle_offset;
      std::memcpy(m.cuda.device_uuid.data(), c.device_uuid, sizeof c.device_uuid);
      std::memcpy(m.cuda.mem_handle.data(), c.mem_handle, sizeof c.mem_handle);
      std::memcpy(m.cuda.event_handle.data(), c.event_handle, sizeof c.event_handle);
      break;
    }
    case static_cast<uint16_t>(ControlType::retire): m.type = ControlType::retire; break;
    case static_cast<uint16_t>(ControlType::bye): m.type = ControlType::bye; break;
    case static_cast<uint16_t>(ControlType::refused): m.type = ControlType::refused; break;
    default: bad("control type " + std::to_string(w.type));
  }
  if (bytes.size() != sizeof(ControlWire) && m.type != ControlType::cuda_segment)
    bad("control packet of " + std::to_string(bytes.size()) + " bytes");
  if (nfds != want) bad("control packet with " + std::to_string(nfds) + " fds, expected " + std::to_string(want));
  return m;
}

}  // namespace ipc_detail
}  // namespace tw
