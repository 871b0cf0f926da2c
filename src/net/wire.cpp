// wire.cpp (net) — the UCX transport's wire format (net_internal.hpp): little-endian fields written one by one, and
// decoders that treat every byte as hostile. Pure functions: fuzz/fuzz_net_header.cpp feeds them garbage.
#include <algorithm>
#include <cstring>
#include <unordered_set>

#include "core/checked.hpp"
#include "core/utf8.hpp"
#include "net/net_internal.hpp"
#include "net/sha256.hpp"

namespace tw::net_detail {

namespace {

[[noreturn]] void bad(const std::string& what) {
  throw Error(ErrorCode::invalid_argument, "tensorwire net: malformed message from the peer: " + what);
}

class Writer {
 public:
  template <class T>
  void put(T v) {
    static_assert(std::is_integral_v<T>);
    uint8_t b[sizeof(T)];
    for (size_t i = 0; i < sizeof(T); ++i) b[i] = static_cast<uint8_t>(static_cast<uint64_t>(v) >> (8 * i));
    out.append(reinterpret_cast<const char*>(b), sizeof(T));
  }
  void bytes(const void* p, size_t n) { out.append(static_cast<const char*>(p), n); }
  void str(std::string_view s) {
    put(static_cast<uint32_t>(s.size()));
    bytes(s.data(), s.size());
  }
  std::string out;
};

class Reader {
 public:
  explicit Reader(std::span<const uint8_t> b) : b_(b) {}
  template <class T>
  T get(const char* what) {
    static_assert(std::is_integral_v<T>);
    need(sizeof(T), what);
    uint64_t v = 0;
    for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<uint64_t>(b_[pos_ + i]) << (8 * i);
    pos_ += sizeof(T);
    return static_cast<T>(v);
  }
  std::span<const uint8_t> take(size_t n, const char* what) {
    need(n, what);
    auto s = b_.subspan(pos_, n);
    pos_ += n;
    return s;
  }
  std::string str(size_t max, const char* what) {
    const uint32_t n = get<uint32_t>(what);
    if (n > max) bad(std::string(what) + " of " + std::to_string(n) + " bytes (at most " + std::to_string(max) + ")");
    auto s = take(n, what);
    std::string r(reinterpret_cast<const char*>(s.data()), s.size());
    if (!detail::valid_utf8(r)) bad(std::string(what) + " is not UTF-8");
    return r;
  }
  void end(const char* what) const {
    if (pos_ != b_.size())
      bad(std::string(what) + ": " + std::to_string(b_.size() - pos_) + " bytes left over");
  }
  size_t left() const { return b_.size() - pos_; }

 private:
  void need(size_t n, const char* what) const {
    if (b_.size() - pos_ < n) bad(std::string(what) + " is cut short");
  }
  std::span<const uint8_t> b_;
  size_t pos_ = 0;
};

std::span<const uint8_t> as_bytes(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

Proof proof(std::string_view label, std::string_view token, std::string_view topic, const Nonce& p, const Nonce& s) {
  Writer w;
  w.str(label);
  w.str(topic);
  w.bytes(p.data(), p.size());
  w.bytes(s.data(), s.size());
  return hmac_sha256(as_bytes(token), as_bytes(w.out));
}

}  // namespace

void encode_header(const NetHeader& h, uint8_t* out) {
  Writer w;
  w.put(kNetMagic);
  w.put(kNetVersion);
  w.put(static_cast<uint16_t>(h.type));
  w.put(h.flags);
  w.put(h.body_bytes);
  w.put(h.sequence);
  w.put(h.payload_bytes);
  std::memcpy(out, w.out.data(), kNetHeaderBytes);
  static_assert(kNetHeaderBytes == 4 + 2 + 2 + 4 + 4 + 8 + 8);
}

std::vector<uint8_t> control_message(NetType type, std::string_view body, uint64_t sequence) {
  NetHeader h;
  h.type = type;
  h.sequence = sequence;
  h.body_bytes = static_cast<uint32_t>(body.size());
  std::vector<uint8_t> out(kNetHeaderBytes + body.size());
  encode_header(h, out.data());
  if (!body.empty()) std::memcpy(out.data() + kNetHeaderBytes, body.data(), body.size());
  return out;
}

NetHeader decode_header(std::span<const uint8_t> bytes) {
  if (bytes.size() < kNetHeaderBytes) bad("a header of " + std::to_string(bytes.size()) + " bytes");
  Reader r(bytes.first(kNetHeaderBytes));
  if (r.get<uint32_t>("magic") != kNetMagic) bad("not a tensorwire header (magic)");
  const uint16_t version = r.get<uint16_t>("version");
  if (version != kNetVersion)
    throw Error(ErrorCode::version_mismatch, "tensorwire net: the peer speaks protocol version " +
                                                 std::to_string(version) + ", this build speaks " +
                                                 std::to_string(kNetVersion));
  NetHeader h;
  const uint16_t type = r.get<uint16_t>("type");
  if (type < static_cast<uint16_t>(NetType::hello) || type > static_cast<uint16_t>(NetType::bye))
    bad("message type " + std::to_string(type));
  h.type = static_cast<NetType>(type);
  h.flags = r.get<uint32_t>("flags");
  if ((h.flags & ~kDescInData) != 0 || (h.flags != 0 && h.type != NetType::data))
    bad("flags " + std::to_string(h.flags));
  h.body_bytes = r.get<uint32_t>("body size");
  h.sequence = r.get<uint64_t>("sequence");
  h.payload_bytes = r.get<uint64_t>("payload size");
  if (h.type != NetType::data && h.payload_bytes != 0) bad("a control message with a payload");
  return h;
}

// ---- handshake --------------------------------------------------------------------------------------------------

std::string encode_hello(const Hello& h) {
  Writer w;
  w.bytes(h.nonce.data(), h.nonce.size());
  w.put(static_cast<uint8_t>(h.token_required));
  w.put(h.keepalive_ms);
  return w.out;
}

namespace {
uint32_t read_keepalive(Reader& r) {
  const uint32_t ms = r.get<uint32_t>("keepalive");
  if (ms < kMinKeepaliveMs || ms > kMaxKeepaliveMs) bad("keepalive " + std::to_string(ms) + " ms");
  return ms;
}
}  // namespace

Hello decode_hello(std::span<const uint8_t> body) {
  Reader r(body);
  Hello h;
  auto n = r.take(kNonceBytes, "nonce");
  std::copy(n.begin(), n.end(), h.nonce.begin());
  const uint8_t t = r.get<uint8_t>("token flag");
  if (t > 1) bad("token flag " + std::to_string(t));
  h.token_required = t != 0;
  h.keepalive_ms = read_keepalive(r);
  r.end("hello");
  return h;
}

std::string encode_auth(const Auth& a) {
  Writer w;
  w.str(a.topic);
  w.bytes(a.nonce.data(), a.nonce.size());
  w.put(static_cast<uint8_t>(a.has_proof));
  if (a.has_proof) w.bytes(a.proof.data(), a.proof.size());
  w.put(a.keepalive_ms);
  return w.out;
}

Auth decode_auth(std::span<const uint8_t> body) {
  Reader r(body);
  Auth a;
  a.topic = r.str(64, "topic");
  auto n = r.take(kNonceBytes, "nonce");
  std::copy(n.begin(), n.end(), a.nonce.begin());
  const uint8_t p = r.get<uint8_t>("proof flag");
  if (p > 1) bad("proof flag " + std::to_string(p));
  a.has_proof = p != 0;
  if (a.has_proof) {
    auto pr = r.take(a.proof.size(), "proof");
    std::copy(pr.begin(), pr.end(), a.proof.begin());
  }
  a.keepalive_ms = read_keepalive(r);
  r.end("auth");
  return a;
}

std::string encode_welcome(const Welcome& wl) {
  Writer w;
  w.put(wl.depth);
  w.put(static_cast<uint8_t>(wl.on_full));
  w.put(static_cast<uint8_t>(wl.has_proof));
  if (wl.has_proof) w.bytes(wl.proof.data(), wl.proof.size());
  return w.out;
}

Welcome decode_welcome(std::span<const uint8_t> body) {
  Reader r(body);
  Welcome wl;
  wl.depth = r.get<uint32_t>("depth");
  if (wl.depth < 1 || wl.depth > (1u << 20)) bad("depth " + std::to_string(wl.depth));
  const uint8_t f = r.get<uint8_t>("on_full");
  if (f > static_cast<uint8_t>(Policy::raise)) bad("on_full " + std::to_string(f));
  wl.on_full = static_cast<Policy>(f);
  const uint8_t p = r.get<uint8_t>("proof flag");
  if (p > 1) bad("proof flag " + std::to_string(p));
  wl.has_proof = p != 0;
  if (wl.has_proof) {
    auto pr = r.take(wl.proof.size(), "proof");
    std::copy(pr.begin(), pr.end(), wl.proof.begin());
  }
  r.end("welcome");
  return wl;
}

std::string encode_refused(std::string_view reason) {
  // Cut at a character boundary.
  size_t n = std::min(reason.size(), kMaxReasonBytes);
  while (n > 0 && n < reason.size() && (static_cast<unsigned char>(reason[n]) & 0xC0) == 0x80) --n;
  Writer w;
  w.str(reason.substr(0, n));
  return w.out;
}

std::string decode_refused(std::span<const uint8_t> body) {
  Reader r(body);
  std::string s = r.str(kMaxReasonBytes, "reason");
  r.end("refusal");
  return s;
}

Proof client_proof(std::string_view token, std::string_view topic, const Nonce& p, const Nonce& s) {
  return proof("tensorwire/1 client", token, topic, p, s);
}
Proof publisher_proof(std::string_view token, std::string_view topic, const Nonce& p, const Nonce& s) {
  return proof("tensorwire/1 publisher", token, topic, p, s);
}

// ---- runs -------------------------------------------------------------------------------------------------------

namespace {

// Trailing dimensions that form one contiguous block (size-1 dimensions skipped): the first outer dimension and the
// block's bytes. Requires non-negative strides, no broadcast and unpacked elements.
void inner_block(const Layout& l, size_t& outer_dims, uint64_t& block) {
  const uint64_t elem = l.element_bytes();
  block = elem;
  size_t k = l.ndim();
  while (k > 0) {
    const int64_t n = l.shape[k - 1], st = l.strides[k - 1];
    if (n == 1) {
      --k;
      continue;
    }
    if (st < 0 || static_cast<uint64_t>(st) * elem != block) break;
    block *= static_cast<uint64_t>(n);
    --k;
  }
  outer_dims = k;
}

}  // namespace

RunStats run_stats(const Layout& l) {
  RunStats s;
  if (l.numel() == 0) return s;
  size_t k;
  inner_block(l, k, s.bytes);
  s.count = 1;
  for (size_t i = 0; i < k; ++i) s.count *= static_cast<uint64_t>(l.shape[i]);
  return s;
}

uint64_t for_each_run(const Layout& l, const std::function<void(uint64_t, uint64_t)>& run) {
  if (l.numel() == 0) return 0;
  size_t k;
  uint64_t block;
  inner_block(l, k, block);
  const int64_t elem = static_cast<int64_t>(l.element_bytes());
  std::vector<int64_t> idx(k, 0);
  uint64_t n = 0;
  int64_t off = l.byte_offset;
  for (;;) {  // an odometer over the outer dimensions, in C order
    run(static_cast<uint64_t>(off), block);
    ++n;
    for (size_t d = k;;) {
      if (d == 0) return n;
      --d;
      if (++idx[d] < l.shape[d]) {
        off += l.strides[d] * elem;
        break;
      }
      off -= (l.shape[d] - 1) * l.strides[d] * elem;
      idx[d] = 0;
    }
  }
}

uint64_t wire_bytes(const WireTensor& t) {
  if (t.carry != Carry::runs) return t.span_bytes;
  const RunStats s = run_stats(t.layout);
  return s.count * s.bytes;
}

// ---- messages ---------------------------------------------------------------------------------------------------

std::string encode_message(const WireMessage& m) {
  Writer w;
  w.put(m.kind);
  w.put(uint8_t{0});
  w.put(static_cast<uint16_t>(m.tensors.size()));
  w.put(static_cast<uint32_t>(m.keys.size()));
  for (const std::string& k : m.keys) w.str(k);
  for (const WireTensor& t : m.tensors) {
    const DLDataType dt = t.layout.dtype.to_dlpack();
    w.put(dt.code);
    w.put(dt.bits);
    w.put(dt.lanes);
    w.put(static_cast<uint8_t>(t.carry));
    // Flags: bit 0 sub-byte padding; bit 1 from a CUDA device, whose index is bits 2-6; bit 7 read by UCX from
    // device memory (else staged through host memory).
    uint8_t flags = t.layout.subbyte_padded ? 1 : 0;
    if (t.cuda_origin >= 0) {
      if (t.cuda_origin > kMaxNetDevice || t.carry != Carry::packed)
        throw Error(ErrorCode::internal, "encode_message: a CUDA tensor must be packed, from cuda:0..31");
      flags = static_cast<uint8_t>(flags | 2u | static_cast<unsigned>(t.cuda_origin) << 2 | (t.cuda_direct ? 0x80u : 0u));
    } else if (t.cuda_direct) {
      throw Error(ErrorCode::internal, "encode_message: cuda_direct without a CUDA device");
    }
    w.put(flags);
    w.put(static_cast<uint16_t>(t.layout.ndim()));
    w.put(t.layout.byte_offset);
    w.put(t.span_bytes);
    w.put(static_cast<uint32_t>(t.metadata_bytes.size()));
    for (int64_t x : t.layout.shape) w.put(x);
    for (int64_t x : t.layout.strides) w.put(x);
    w.bytes(t.metadata_bytes.data(), t.metadata_bytes.size());
  }
  return w.out;
}

WireMessage decode_message(std::span<const uint8_t> body, const Limits& limits) {
  Reader r(body);
  WireMessage m;
  m.kind = r.get<uint8_t>("kind");
  if (m.kind > 3) bad("message kind " + std::to_string(m.kind));
  if (r.get<uint8_t>("reserved") != 0) bad("reserved byte");
  const uint16_t count = r.get<uint16_t>("tensor count");
  if (count < 1 || count > limits.max_tensors || (m.kind == 0 && count != 1))
    bad(std::to_string(count) + " tensors in a message of kind " + std::to_string(m.kind));
  const uint32_t nkeys = r.get<uint32_t>("key count");
  const bool dict = m.kind == 3;  // 1 + Delivered::kind 2
  if (nkeys != (dict ? count : 0u)) bad(std::to_string(nkeys) + " keys for " + std::to_string(count) + " tensors");
  std::unordered_set<std::string> seen;
  for (uint32_t i = 0; i < nkeys; ++i) {
    m.keys.push_back(r.str(64 * 1024, "key"));
    if (!seen.insert(m.keys.back()).second) bad("the key '" + m.keys.back() + "' twice");
  }
  uint64_t total = 0, runs = 0;
  for (uint16_t i = 0; i < count; ++i) {
    WireTensor t;
    const uint8_t code = r.get<uint8_t>("dtype code"), bits = r.get<uint8_t>("dtype bits");
    const uint16_t lanes = r.get<uint16_t>("dtype lanes");
    const uint8_t carry = r.get<uint8_t>("carry"), flags = r.get<uint8_t>("tensor flags");
    const uint8_t padded = flags & 1u;
    const uint16_t ndim = r.get<uint16_t>("rank");
    if (carry > static_cast<uint8_t>(Carry::packed)) bad("carry " + std::to_string(carry));
    if (flags & 2u) {
      if (carry != static_cast<uint8_t>(Carry::packed)) bad("a tensor from a CUDA device that is not packed");
      t.cuda_origin = (flags >> 2) & 31;
      t.cuda_direct = (flags & 0x80u) != 0;
    } else if (flags > 1) {
      bad("tensor flags " + std::to_string(flags));
    }
    if (ndim > kMaxRank) bad("rank " + std::to_string(ndim));
    t.carry = static_cast<Carry>(carry);
    t.layout.dtype = DType::from_dlpack(DLDataType{code, bits, lanes});
    t.layout.subbyte_padded = padded != 0 && t.layout.dtype.is_subbyte();
    t.layout.byte_offset = r.get<int64_t>("byte offset");
    t.span_bytes = r.get<uint64_t>("span size");
    const uint32_t meta = r.get<uint32_t>("metadata size");
    if (meta > limits.max_metadata_bytes)
      bad("metadata of " + std::to_string(meta) + " bytes (at most " + std::to_string(limits.max_metadata_bytes) + ")");
    t.layout.shape.resize(ndim);
    t.layout.strides.resize(ndim);
    for (uint16_t d = 0; d < ndim; ++d) t.layout.shape[d] = r.get<int64_t>("shape");
    for (uint16_t d = 0; d < ndim; ++d) t.layout.strides[d] = r.get<int64_t>("strides");
    t.layout.validate();  // negative sizes, overflow of numel and offsets
    if (t.span_bytes > limits.max_message_bytes)
      bad("a tensor of " + std::to_string(t.span_bytes) + " bytes (at most " +
          std::to_string(limits.max_message_bytes) + ")");
    if (t.layout.numel() == 0) {
      if (t.span_bytes != 0 || t.layout.byte_offset != 0) bad("an empty tensor with bytes");
    } else {
      const ByteSpan sp = t.layout.byte_span();
      const int64_t lo = detail::add(t.layout.byte_offset, sp.begin, "tensor span"),
                    hi = detail::add(t.layout.byte_offset, sp.end, "tensor span");
      if (lo != 0 || static_cast<uint64_t>(hi) != t.span_bytes)
        bad("a tensor spanning bytes [" + std::to_string(lo) + ", " + std::to_string(hi) + ") of a span of " +
            std::to_string(t.span_bytes));
      if (t.carry == Carry::packed &&
          (!t.layout.is_contiguous() || static_cast<uint64_t>(t.layout.nbytes()) != t.span_bytes))
        bad("a packed tensor that is not C-contiguous");
      if (t.carry == Carry::runs) {
        if (t.layout.is_packed_subbyte() || t.layout.has_broadcast() || t.layout.has_negative_stride() ||
            t.layout.may_overlap())
          bad("runs of a layout that has none");
        const RunStats s = run_stats(t.layout);
        runs += s.count;
        if (runs > limits.max_runs)
          bad("more than " + std::to_string(limits.max_runs) + " runs in one message");
      }
    }
    auto md = r.take(meta, "metadata");
    if (!md.empty()) t.metadata = decode_metadata({reinterpret_cast<const char*>(md.data()), md.size()});
    total += (t.span_bytes + 63) & ~uint64_t{63};
    if (total > limits.max_message_bytes)
      bad("a message of more than " + std::to_string(limits.max_message_bytes) + " bytes");
    m.tensors.push_back(std::move(t));
  }
  r.end("message");
  return m;
}

// ---- addresses --------------------------------------------------------------------------------------------------

HostPort parse_host_port(std::string_view s, const char* what) {
  const auto fail = [&](const std::string& why) -> HostPort {
    throw Error(ErrorCode::invalid_argument, std::string(what) + "='" + std::string(s) + "': " + why +
                                                 " (expected 'host:port', '[ipv6]:port' or ':port')");
  };
  if (s.empty()) return fail("empty address");
  HostPort hp;
  std::string_view port;
  if (s.front() == '[') {
    const size_t close = s.find(']');
    if (close == std::string_view::npos) return fail("an unclosed '['");
    hp.host = std::string(s.substr(1, close - 1));
    if (close + 1 >= s.size() || s[close + 1] != ':') return fail("no port after the IPv6 address");
    port = s.substr(close + 2);
  } else {
    const size_t colon = s.rfind(':');
    if (colon == std::string_view::npos) {
      port = s;
    } else {
      if (s.substr(0, colon).find(':') != std::string_view::npos) return fail("an IPv6 address needs [brackets]");
      hp.host = std::string(s.substr(0, colon));
      port = s.substr(colon + 1);
    }
  }
  if (port.empty() || port.size() > 5 || !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return fail("the port must be a number from 0 to 65535");
  const unsigned long v = std::stoul(std::string(port));
  if (v > 65535) return fail("the port must be a number from 0 to 65535");
  hp.port = static_cast<uint16_t>(v);
  return hp;
}

}  // namespace tw::net_detail
