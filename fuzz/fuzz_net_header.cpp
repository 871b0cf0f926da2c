// fuzz_net_header — what a hostile network peer can send the UCX transport: active-message headers, DATA
// descriptors and the handshake messages (src/net/wire.cpp).
//
// Input: byte 0 selects the decoder (low three bits); the rest is the message.
//   0: header   — a NetHeader (32 bytes) and, behind it, a DATA descriptor (as in an active-message header)
//   1: hello  2: auth  3: welcome  4: refused — one handshake body
// Properties checked:
//  1. Only tw::Error escapes; no sanitizer report; nothing is allocated beyond the limits given.
//  2. An accepted descriptor is safe to land: every tensor's elements and every run lie inside its span, the spans
//     fit the message limit, and the runs are as many and as long as wire_bytes says. Re-encoding it decodes to
//     the same layouts.
#include <cstdint>
#include <cstring>
#include <span>

#include "../src/net/net_internal.hpp"
#include "fuzz_util.hpp"

namespace net = tw::net_detail;

namespace {

void fuzz_data(std::span<const uint8_t> in) {
  net::Limits lim;
  lim.max_message_bytes = uint64_t{1} << 24;
  lim.max_runs = 4096;
  lim.max_metadata_bytes = 4096;
  net::WireMessage m;
  try {
    const net::NetHeader h = net::decode_header(in);
    (void)h;
    m = net::decode_message(in.subspan(net::kNetHeaderBytes), lim);
  } catch (const tw::Error&) {
    return;
  }
  uint64_t total = 0;
  for (const net::WireTensor& t : m.tensors) {
    total += t.span_bytes;
    TW_FUZZ_CHECK(t.span_bytes <= lim.max_message_bytes, "span of %llu", (unsigned long long)t.span_bytes);
    if (t.layout.numel() > 0) {
      const tw::ByteSpan sp = t.layout.byte_span();
      TW_FUZZ_CHECK(t.layout.byte_offset + sp.begin >= 0 &&
                        static_cast<uint64_t>(t.layout.byte_offset + sp.end) <= t.span_bytes,
                    "elements outside the span");
    }
    if (t.carry == net::Carry::runs) {
      uint64_t bytes = 0;
      const uint64_t n = net::for_each_run(t.layout, [&](uint64_t off, uint64_t len) {
        TW_FUZZ_CHECK(off + len <= t.span_bytes, "run [%llu, +%llu) outside a span of %llu", (unsigned long long)off,
                      (unsigned long long)len, (unsigned long long)t.span_bytes);
        bytes += len;
      });
      TW_FUZZ_CHECK(n <= lim.max_runs, "%llu runs", (unsigned long long)n);
      TW_FUZZ_CHECK(bytes == net::wire_bytes(t), "runs of %llu bytes, wire_bytes %llu", (unsigned long long)bytes,
                    (unsigned long long)net::wire_bytes(t));
    }
  }
  TW_FUZZ_CHECK(total <= lim.max_message_bytes, "message of %llu", (unsigned long long)total);
  for (net::WireTensor& t : m.tensors) t.metadata_bytes = t.metadata.empty() ? std::string() : tw::encode_metadata(t.metadata);
  const std::string again = net::encode_message(m);
  const net::WireMessage m2 =
      net::decode_message({reinterpret_cast<const uint8_t*>(again.data()), again.size()}, lim);
  TW_FUZZ_CHECK(m2.tensors.size() == m.tensors.size(), "re-encoding changed the count");
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    TW_FUZZ_CHECK(m2.tensors[i].layout.shape == m.tensors[i].layout.shape &&
                      m2.tensors[i].layout.strides == m.tensors[i].layout.strides &&
                      m2.tensors[i].layout.byte_offset == m.tensors[i].layout.byte_offset &&
                      m2.tensors[i].span_bytes == m.tensors[i].span_bytes,
                  "re-encoding changed tensor %zu", i);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::span<const uint8_t> in(data + 1, size - 1);
  try {
    switch (data[0] & 7) {
      case 0: fuzz_data(in); break;
      case 1: (void)net::decode_hello(in); break;
      case 2: (void)net::decode_auth(in); break;
      case 3: (void)net::decode_welcome(in); break;
      case 4: (void)net::decode_refused(in); break;
      default: (void)net::decode_header(in); break;
    }
  } catch (const tw::Error&) {
  }
  return 0;
}
