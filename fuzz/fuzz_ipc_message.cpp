// fuzz_ipc_message — what a hostile IPC peer can send: ring descriptors, control packets and channel headers.
//
// Input: byte 0 selects the decoder (low two bits) and, for control packets, the number of fds (bits 2-4).
//   0: message  — a MessageDescriptor (zero-padded when short), then the segment size (u64 LE), then metadata bytes
//   1: control  — the rest is one control packet
//   2: channel  — a ChannelHeader (zero-padded), then the mapped size (u64 LE)
//   3: group    — a MessageDescriptor as a group header (zero-padded), then its structure metadata
// Properties checked:
//  1. Only tw::Error escapes; no sanitizer report.
//  2. An accepted message's tensor lies inside its allocation, and the allocation inside its segment; re-encoding
//     the decoded message decodes to the same layout.
//  3. An accepted channel header can be used: every ring cell and lease counter it names lies inside the mapping
//     (the ring is exercised over a real buffer of that size, so ASan sees any stray access).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

#include "../src/ipc/ipc_internal.hpp"
#include "fuzz_util.hpp"

namespace ipc = tw::ipc_detail;

namespace {

template <class T>
T take(const uint8_t*& p, size_t& n) {
  T out{};
  const size_t k = n < sizeof(T) ? n : sizeof(T);
  std::memcpy(&out, p, k);
  p += k;
  n -= k;
  return out;
}

void fuzz_message(const uint8_t* p, size_t n) {
  const auto d = take<ipc::MessageDescriptor>(p, n);
  const auto segment_bytes = take<uint64_t>(p, n);
  const std::string_view meta(reinterpret_cast<const char*>(p), n);
  ipc::DecodedMessage m;
  try {
    m = ipc::decode_message(d, meta, segment_bytes, 64, 4096);
  } catch (const tw::Error&) {
    return;
  }
  TW_FUZZ_CHECK(m.alloc_offset <= segment_bytes && m.alloc_bytes <= segment_bytes - m.alloc_offset,
        "allocation [%llu, +%llu) outside a segment of %llu", (unsigned long long)m.alloc_offset,
        (unsigned long long)m.alloc_bytes, (unsigned long long)segment_bytes);
  TW_FUZZ_CHECK(m.lease_slot < 64, "lease slot %u", m.lease_slot);
  if (m.layout.numel() > 0) {
    const tw::ByteSpan sp = m.layout.byte_span();
    TW_FUZZ_CHECK(m.layout.byte_offset + sp.begin >= 0 &&
              static_cast<uint64_t>(m.layout.byte_offset + sp.end) <= m.alloc_bytes,
          "span [%lld, %lld) outside an allocation of %llu", (long long)(m.layout.byte_offset + sp.begin),
          (long long)(m.layout.byte_offset + sp.end), (unsigned long long)m.alloc_bytes);
  }
  ipc::MessageDescriptor again{};
  const std::string enc = m.metadata.empty() ? std::string() : tw::encode_metadata(m.metadata);
  ipc::encode_message(again, m.layout, m.sequence, m.segment_id, m.alloc_offset, m.alloc_bytes, m.lease_slot,
                      static_cast<uint32_t>(enc.size()));
  ipc::DecodedMessage back;
  try {
    back = ipc::decode_message(again, enc, segment_bytes, 64, 1u << 20);
  } catch (const tw::Error& e) {
    TW_FUZZ_CHECK(false, "a re-encoded accepted message is refused: %s", e.what());
  }
  TW_FUZZ_CHECK(back.layout.shape == m.layout.shape && back.layout.strides == m.layout.strides &&
            back.layout.byte_offset == m.layout.byte_offset && back.layout.dtype == m.layout.dtype &&
            back.metadata == m.metadata,
        "re-encoding changed the message");
}

void fuzz_control(const uint8_t* p, size_t n, size_t nfds) {
  try {
    ipc::ControlMessage m = ipc::decode_control(std::span<const uint8_t>(p, n), nfds);
    TW_FUZZ_CHECK(n == (m.type == ipc::ControlType::cuda_segment ? sizeof(ipc::CudaSegmentWire) : sizeof(ipc::ControlWire)),
                  "accepted a packet of %zu bytes", n);
    if (m.type == ipc::ControlType::cuda_segment)
      TW_FUZZ_CHECK(m.id != 0 && m.size != 0 && nfds == (m.cuda.handle == ipc::CudaHandle::vmm ? 1u : 0u) &&
                        m.cuda.device >= 0,
                    "a CUDA segment with id 0, size 0, a negative device or the wrong fds");
    if (m.type == ipc::ControlType::segment) TW_FUZZ_CHECK(nfds == 1 && m.id != 0, "segment without fd or with id 0");
    if (m.type == ipc::ControlType::welcome) TW_FUZZ_CHECK(nfds == 2, "welcome without its two fds");
  } catch (const tw::Error&) {
  }
}

void fuzz_channel(const uint8_t* p, size_t n) {
  const auto h = take<ipc::ChannelHeader>(p, n);
  const auto mapped = take<uint64_t>(p, n);
  try {
    ipc::validate_channel(h, mapped);
  } catch (const tw::Error&) {
    return;
  }
  if (mapped > (4u << 20)) return;  // accepted, but too large to exercise here
  std::vector<char> mem(mapped);
  std::memcpy(mem.data(), &h, sizeof h);
  ipc::Ring ring(mem.data(), h);
  ring.init_cells();
  for (uint32_t i = 0; i < h.lease_slots; ++i) ipc::aref(*ring.released(i)).fetch_add(1);
  TW_FUZZ_CHECK(ring.released(h.lease_slots) == nullptr, "a lease counter past the table");
  // Push and pop around the ring more than once: every cell is touched.
  for (uint64_t i = 0; i < 2ull * h.cells + 1; ++i) {
    if (ipc::CellHeader* c = ring.begin_push()) {
      c->msg.sequence = i;
      if (h.max_metadata_bytes) ring.cell_metadata(*c)[h.max_metadata_bytes - 1] = 1;
      ring.commit_push();
    }
    ring.try_pop([](ipc::CellHeader& c) { (void)c.msg.sequence; });
  }
}

void fuzz_group(const uint8_t* p, size_t n) {
  const auto d = take<ipc::MessageDescriptor>(p, n);
  const std::string_view meta(reinterpret_cast<const char*>(p), n);
  try {
    const ipc::DecodedGroupHead g = ipc::decode_group_head(d, meta, 4096);
    TW_FUZZ_CHECK(g.count >= 1 && g.count <= ipc::kMaxGroup, "a group of %u", g.count);
    const std::string& kind = g.structure.at("kind").as_string();
    if (kind == "dict") TW_FUZZ_CHECK(g.structure.at("keys").items().size() == g.count, "keys do not match the count");
  } catch (const tw::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  switch (mode & 3) {
    case 0: fuzz_message(data + 1, size - 1); break;
    case 1: fuzz_control(data + 1, size - 1, (mode >> 2) & 7); break;
    case 2: fuzz_channel(data + 1, size - 1); break;
    default: fuzz_group(data + 1, size - 1); break;
  }
  return 0;
}
