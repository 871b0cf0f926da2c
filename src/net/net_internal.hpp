// net_internal.hpp (private) — tensorwire across machines: the wire format of the UCX transport and the two
// engines behind tw::Publisher (listen=) and tw::Subscriber (connect=).
//
// The protocol (one UCX endpoint per remote subscriber; active messages only):
//  1. The subscriber connects to the publisher's listener (UCX sockaddr). The publisher sends HELLO (its nonce and
//     whether a token is required). The subscriber answers AUTH: the topic it wants, its own nonce and, when it has
//     a token, HMAC-SHA256(token, "tensorwire/1 client" | topic | nonce_p | nonce_s). The token never crosses.
//     The publisher checks the topic and the proof and answers WELCOME (depth, on_full and its own proof,
//     HMAC(token, "tensorwire/1 publisher" | ...), so a subscriber with a token also knows whom it talks to) or
//     REFUSED (a reason in words), then hangs up.
//  2. DATA: the active-message header is a NetHeader and the message's descriptor — per tensor its dtype, shape,
//     strides, byte offset within its span, how its bytes travel (the span as is, the span's contiguous runs as an
//     iov, or packed C-contiguous) and its metadata. The payload is the active message's data. A descriptor too
//     large for UCX's header limit travels at the front of the data instead (kDescInData), and then no tensor of
//     that message travels as runs (the receiver could not place them before reading the descriptor).
//  3. Credits: a subscriber may hold `depth` messages. The publisher counts what it sent and the subscriber gives
//     credit back (CREDIT) when its user takes a message (block, raise) or as soon as one lands (drop_oldest: the
//     subscriber then drops its oldest unread message itself). The publisher never has more than `depth` messages
//     in flight per subscriber, and queues at most `depth` more: a slow subscriber costs bounded memory.
//  4. PING both ways after a second of silence, or a third of the shorter of the two keepalives (each side's is in
//     HELLO / AUTH) when that is sooner; a peer silent for its keepalive (10 s by default) is gone. BYE ends
//     the stream after the last message.
//
// Everything read from a peer is hostile: decode_* are pure functions of their bytes (fuzz/fuzz_net_header.cpp),
// every count and length is bounded before anything is allocated, and a peer that breaks the protocol is
// disconnected.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tensorwire/layout.hpp"
#include "tensorwire/metadata.hpp"
#include "tensorwire/tensor.hpp"

namespace tw::net_detail {

// ---- wire format ------------------------------------------------------------------------------------------------

inline constexpr uint32_t kNetMagic = 0x544E5754;  // "TWNT" little-endian
// 2: a tensor's flags byte carries cuda_origin (staged CUDA tensors); 3: and cuda_direct (device 0..31); 4: HELLO
// and AUTH carry each side's keepalive, and each side pings often enough for the shorter of the two
inline constexpr uint16_t kNetVersion = 4;
/// Active-message ids: publisher -> subscriber, subscriber -> publisher.
inline constexpr unsigned kAmToSubscriber = 0x7731;
inline constexpr unsigned kAmToPublisher = 0x7732;

enum class NetType : uint16_t {
  hello = 1,    ///< P->S: nonce, token required?
  auth = 2,     ///< S->P: topic, nonce, proof
  welcome = 3,  ///< P->S: depth, on_full, proof
  refused = 4,  ///< P->S: reason (text)
  data = 5,     ///< P->S: a message
  credit = 6,   ///< S->P: n messages taken
  ping = 7,     ///< both ways
  bye = 8,      ///< P->S: end of stream
};

/// Header flags.
inline constexpr uint32_t kDescInData = 1;  ///< DATA: the descriptor is at the front of the data, not in the header

/// The fixed front of every active-message header (little-endian, packed by hand: no struct crosses as is).
struct NetHeader {
  NetType type = NetType::ping;
  uint32_t flags = 0;
  uint64_t sequence = 0;    ///< DATA: the message's number for this subscriber (1, 2, ...: those the publisher
                            ///< dropped for it included, so a gap says how many); CREDIT: messages taken
  uint32_t body_bytes = 0;  ///< bytes after the header (in the header, or at the front of the data: kDescInData)
  uint64_t payload_bytes = 0;  ///< DATA: bytes of tensor data (after the descriptor when kDescInData)
};
inline constexpr size_t kNetHeaderBytes = 32;

/// What the publisher does when a subscriber's credit is spent (the numbering of tw::OnFull, which the ipc layer
/// above converts from).
enum class Policy : uint8_t { block = 0, drop_oldest = 1, raise = 2 };

/// A received message: one tensor (`single`), or a group with its structure (kind: 0 list, 1 tuple, 2 dict — the
/// numbering of tw::Message::Kind).
struct Delivered {
  bool single = true;
  uint8_t kind = 0;
  std::vector<std::string> keys;
  std::vector<Tensor> tensors;
  std::vector<int> cuda_origin;  ///< per tensor: WireTensor::cuda_origin
};
/// What Client::poll found (the numbering of tw::Subscriber::PollStatus).
enum class PollResult : uint8_t { message = 0, empty = 1, ended = 2, busy = 3 };
void encode_header(const NetHeader& h, uint8_t* out);  // writes kNetHeaderBytes
/// The whole active-message header of a control message: a NetHeader, then `body`.
std::vector<uint8_t> control_message(NetType type, std::string_view body, uint64_t sequence = 0);
/// Throws Error(invalid_argument) naming the problem (magic, version, type, flags).
NetHeader decode_header(std::span<const uint8_t> bytes);

inline constexpr size_t kNonceBytes = 32;
using Nonce = std::array<uint8_t, kNonceBytes>;
using Proof = std::array<uint8_t, 32>;

/// A keepalive as it crosses (milliseconds), within what both ends accept: 0.1 s to a day.
inline constexpr uint32_t kMinKeepaliveMs = 100, kMaxKeepaliveMs = 86'400'000;
/// A keepalive for HELLO / AUTH: a longer one than a day says a day (the peer pings at most every second anyway).
inline uint32_t keepalive_on_wire(std::chrono::milliseconds k) {
  return static_cast<uint32_t>(std::clamp<int64_t>(k.count(), kMinKeepaliveMs, kMaxKeepaliveMs));
}
struct Hello {
  Nonce nonce{};
  bool token_required = false;
  uint32_t keepalive_ms = 10000;  ///< the publisher's: the subscriber is silent for less than a third of it
};
struct Auth {
  std::string topic;
  uint32_t keepalive_ms = 10000;  ///< the subscriber's: the publisher is silent for less than a third of it
  Nonce nonce{};
  bool has_proof = false;
  Proof proof{};
};
struct Welcome {
  uint32_t depth = 0;
  Policy on_full = Policy::block;
  bool has_proof = false;
  Proof proof{};
};

std::string encode_hello(const Hello& h);
std::string encode_auth(const Auth& a);
std::string encode_welcome(const Welcome& w);
/// A refusal's reason, at most kMaxReasonBytes of UTF-8.
inline constexpr size_t kMaxReasonBytes = 512;
std::string encode_refused(std::string_view reason);
Hello decode_hello(std::span<const uint8_t> body);
Auth decode_auth(std::span<const uint8_t> body);
Welcome decode_welcome(std::span<const uint8_t> body);
std::string decode_refused(std::span<const uint8_t> body);

/// The proofs of the token challenge: HMAC-SHA256(token, label | topic | nonce_p | nonce_s).
Proof client_proof(std::string_view token, std::string_view topic, const Nonce& publisher, const Nonce& subscriber);
Proof publisher_proof(std::string_view token, std::string_view topic, const Nonce& publisher,
                      const Nonce& subscriber);

/// How one tensor's bytes travel.
enum class Carry : uint8_t {
  span = 0,    ///< the tensor's byte span, as is: dense layouts in any order, negative strides (layout kept)
  runs = 1,    ///< the span's contiguous runs as an iov: gaps are not sent; the receiver places each run (layout kept)
  packed = 2,  ///< packed C-contiguous by the sender (the receiver's tensor is dense)
};

/// One tensor of a DATA message, as described on the wire. `layout.byte_offset` is element 0's distance from the
/// start of the tensor's span (the lowest byte any element touches).
struct WireTensor {
  Layout layout;
  Carry carry = Carry::span;
  uint64_t span_bytes = 0;  ///< bytes the receiver reserves for this tensor
  Metadata metadata;
  std::string metadata_bytes;  ///< encoder side: the encoded metadata
  /// The sender's CUDA device (0..kMaxNetDevice) when the tensor was there (carry packed: dense), else -1.
  int cuda_origin = -1;
  /// With cuda_origin: the sender's UCX read the bytes from device memory (it has CUDA transports); else they were
  /// staged through pinned host memory first. On the wire, in the tensor's flags byte: bit 1 set for a CUDA origin,
  /// the device in bits 2-6, bit 7 for direct.
  bool cuda_direct = false;
};
inline constexpr int kMaxNetDevice = 31;
/// The deepest queue a remote subscriber accepts (its credit: what the publisher may have in flight to it).
inline constexpr uint32_t kMaxNetDepth = 4096;

/// A DATA message's descriptor.
struct WireMessage {
  /// 0: one tensor; else a group (Delivered::kind + 1).
  uint8_t kind = 0;
  std::vector<std::string> keys;  ///< dict groups
  std::vector<WireTensor> tensors;
};

inline constexpr uint32_t kMaxGroup = 256;

/// Limits a receiver enforces (SubscriberOptions) before it allocates anything.
struct Limits {
  uint64_t max_message_bytes = uint64_t{1} << 34;  ///< landing bytes of one message (16 GiB)
  uint32_t max_metadata_bytes = 1u << 20;          ///< encoded metadata of one tensor
  uint32_t max_tensors = kMaxGroup;
  uint64_t max_runs = 1u << 20;                    ///< iov entries of one message
};

/// Encodes a descriptor (tensors' metadata_bytes already filled).
std::string encode_message(const WireMessage& m);
/// Validates and decodes a descriptor: every layout inside its span, spans and run counts within `limits`, the
/// metadata. Throws Error naming the problem.
WireMessage decode_message(std::span<const uint8_t> body, const Limits& limits);

/// Bytes of `t` on the wire (span_bytes, or the sum of the runs).
uint64_t wire_bytes(const WireTensor& t);
/// The contiguous runs of a layout whose span starts at byte 0 (byte_offset from the span start): calls
/// run(offset, bytes) for each, in C order of the outer dimensions, merging adjacent ones. Returns the count.
uint64_t for_each_run(const Layout& layout, const std::function<void(uint64_t, uint64_t)>& run);
/// Number of runs and the smallest run's size, without listing them.
struct RunStats {
  uint64_t count = 0;
  uint64_t bytes = 0;  ///< each run's size (all runs of a layout are equal)
};
RunStats run_stats(const Layout& layout);

/// Parses "host:port", "[v6]:port", ":port" or "port"; a missing host is loopback. Throws Error(invalid_argument).
struct HostPort {
  std::string host;  ///< as written ("" when absent)
  uint16_t port = 0;
};
HostPort parse_host_port(std::string_view s, const char* what);

// ---- the engines ------------------------------------------------------------------------------------------------

/// UCX, loaded at run time: the reason it cannot be used, or "" when it can.
std::string ucx_unavailable_reason();

/// What the publisher hands the network side for one message: the descriptor, and where each tensor's bytes are.
/// `keep` holds the memory until every remote subscriber's send of it completed or was abandoned.
struct OutTensor {
  const char* span_begin = nullptr;  ///< the tensor's lowest byte
  WireTensor wire;
};
struct OutMessage {
  std::string descriptor;  ///< encode_message
  std::vector<OutTensor> tensors;
  uint64_t payload_bytes = 0;
  std::vector<std::shared_ptr<const void>> keep;
  /// Every tensor's bytes are in CUDA device memory, which UCX reads itself (Server::cuda_direct); the descriptor
  /// then travels in UCX's header.
  bool device_memory = false;
};

struct ServerOptions {
  std::string listen;
  std::string token;
  bool insecure = false;
  uint32_t depth = 8;
  Policy on_full = Policy::block;
  size_t max_subscribers = 256;
  std::chrono::milliseconds keepalive{10000};
  /// Subscribers the publisher serves through shared memory now (max_subscribers counts both kinds).
  std::function<size_t()> local_count;
};

/// The publisher's remote side: a thread that owns a UCX worker and listener, authenticates subscribers and sends
/// each message to every one of them in order, under credits.
class Server {
 public:
  static std::unique_ptr<Server> create(std::string topic, ServerOptions options);
  virtual ~Server() = default;
  /// The address the listener is bound to ("host:port", the port resolved when 0 was asked for).
  virtual std::string address() const = 0;
  /// Authenticated subscribers now.
  virtual size_t active() const = 0;
  /// Whether strided views should cross as the iov of their runs: true when every remote subscriber's transport
  /// moves an iov without staging it (RDMA, shared memory); false over TCP, where packing is faster.
  virtual bool runs_worthwhile() const = 0;
  /// Largest active-message header UCX carries (a descriptor larger than that travels in the data).
  virtual size_t max_header() const = 0;
  /// Whether this process's UCX reads CUDA device memory itself (ucx_cuda_path, as it was when the publisher was
  /// made): then a message of CUDA tensors is sent from device memory, not staged through pinned host memory.
  virtual bool cuda_direct() const = 0;
  /// Whether every remote subscriber can take `n` more messages now; when not, `who` describes the one that
  /// cannot. drop_oldest always has room (the oldest queued message of a slow subscriber is dropped).
  virtual bool room(size_t n, std::string& who) = 0;
  /// Queues a message for every remote subscriber. Returns how many it was queued for.
  virtual size_t enqueue(std::shared_ptr<OutMessage> m) = 0;
  /// drop_oldest on an exhausted pool: drops the oldest message not yet sent to the remote subscriber with the
  /// most queued (its pool buffer is then free); false when nothing is queued.
  virtual bool drop_oldest_pending() = 0;
  /// Messages dropped (drop_oldest) for remote subscribers so far.
  virtual uint64_t dropped() const = 0;
  /// Sends what is queued (bounded wait), says BYE and stops; every OutMessage is released on return.
  virtual void close() noexcept = 0;
};

struct ClientOptions {
  std::string connect;
  std::string token;
  std::chrono::milliseconds keepalive{10000};
  Limits limits;
  /// SubscriberOptions::device: where the subscriber wants tensors. With UCX that moves CUDA memory
  /// (ucx_cuda_path), a message of CUDA tensors lands straight on that device (or, when none was asked for, on the
  /// device its tensors came from, when this process has it).
  std::optional<Device> device;
};

/// The subscriber's remote side: a thread that owns a UCX worker, connects (retrying until the publisher is
/// there), lands each message in memory of its own and queues it for recv.
class Client {
 public:
  static std::unique_ptr<Client> create(std::string topic, ClientOptions options);
  virtual ~Client() = default;
  /// The next message, or nullopt on timeout or end of stream (ended() tells). Throws Error when the connection
  /// failed for good (refused, wrong token, protocol violation).
  virtual std::optional<Delivered> recv(std::chrono::nanoseconds timeout) = 0;
  /// Never blocks, not even on the queue's lock (busy).
  virtual std::optional<Delivered> poll(PollResult& status) = 0;
  virtual bool ended() const noexcept = 0;
  /// Once ended: why, in words ("" when nothing is known).
  virtual std::string why_ended() const = 0;
  virtual bool connected() const noexcept = 0;
  virtual int fileno() = 0;
  virtual uint64_t dropped() const noexcept = 0;
  virtual void close() noexcept = 0;
  virtual const std::string& name() const noexcept = 0;
  /// "" when connected; else what it waits for and the last attempt's failure, in words.
  virtual std::string waiting_for() const = 0;
};

}  // namespace tw::net_detail
