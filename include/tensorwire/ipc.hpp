// tensorwire/ipc.hpp — publish/subscribe of tensors between processes on one machine, through shared memory.
// For dataflow pipelines, data loaders and model servers: a tensor in a loaned pool buffer crosses with no copy,
// any other tensor with exactly one (a dense layout of any order copied as it is, anything else packed C-contiguous),
// and dtype, shape, values and metadata arrive as sent.
//
// The protocol, step by step (see src/ipc/ipc_internal.hpp for the wire format):
//  1. A Publisher listens on the abstract Unix socket "tw/<uid>/<name>" (SOCK_SEQPACKET; nothing is created in the
//     file system or in /dev/shm) and, when created, also connects to every Subscriber of that name already waiting
//     (each waits on its own abstract socket "tw/<uid>/<name>#s<pid>.<n>"). A Subscriber created later connects to
//     the Publisher. Both sides check the peer's credentials (SO_PEERCRED): same user only, by default.
//  2. For each subscriber the publisher creates a channel — one memfd holding a ring of fixed-size message
//     descriptors and a lease counter per pool buffer — and an eventfd, and sends both with SCM_RIGHTS (WELCOME).
//     Each pool segment (a sealed, pre-faulted memfd) crosses once, before the first message that names it
//     (SEGMENT); a segment leaving the pool is announced (RETIRE) so subscribers drop their cached mapping.
//  3. send(): the tensor lives in a pool buffer (loaned, or copied there once: a dense layout as it is, anything
//     else packed by tw::copy). A descriptor — segment
//     id, allocation offset, dtype, shape, strides, byte offset, metadata — goes into every subscriber's ring, and
//     the buffer's lease count for that subscriber goes up. A full ring follows the publisher's OnFull policy.
//  4. recv(): the subscriber spins briefly, then sleeps on a futex. It maps a segment read-only once and caches the
//     mapping, and returns a read-only Tensor whose owner is the lease: when the last view is gone, the lease is
//     released and the buffer can return to the pool.
//  5. A buffer is reused when the publisher holds no loan of it and every live subscriber released it. A subscriber
//     whose socket closes (exit, crash, SIGKILL) loses its leases at once. When the publisher closes or dies, its
//     subscribers drain their ring, keep every tensor they hold valid, and then see end-of-stream.
#pragma once
#if defined(__cplusplus) && __cplusplus < 202002L && !(defined(_MSVC_LANG) && _MSVC_LANG >= 202002L)
#error "tensorwire's C++ headers need C++20 (-std=c++20); C and older C++ take the C API, tensorwire/tensorwire.h"
#endif

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tensorwire/error.hpp"
#include "tensorwire/metadata.hpp"
#include "tensorwire/net.hpp"
#include "tensorwire/tensor.hpp"

namespace tw {

/// What send() and loan() do when a subscriber's ring is full or the buffer pool is exhausted.
enum class OnFull : uint8_t {
  block = 0,    ///< Wait until the subscriber makes room (a dead subscriber is dropped, never waited for).
  drop_oldest,  ///< Drop the subscriber's oldest unread message (counted in dropped()) and enqueue the new one.
                ///< An exhausted pool drops unread messages to free a buffer, for a loan() too (sent or not);
                ///< a subscriber whose control socket is full (new buffers' announcements unread) misses the new
                ///< message instead (the old ones hold what was announced).
  raise,        ///< Throw WouldBlockError; no subscriber receives the message.
};

/// Parses "block", "drop_oldest" or "raise"; throws Error(invalid_argument) otherwise.
OnFull on_full_from_string(std::string_view s);
const char* on_full_name(OnFull f) noexcept;

/// Thrown by Publisher::send / loan under OnFull::raise when a ring is full or the pool is exhausted.
/// Python maps it to BlockingIOError.
class WouldBlockError : public Error {
 public:
  explicit WouldBlockError(const std::string& message) : Error(ErrorCode::unsupported, message) {}
};

/// Thrown by Publisher::send / loan when their timeout passes with nothing done: no subscriber received the
/// message, no buffer was taken. The message names what was waited for (a full ring, or the subscriber holding
/// the pool's buffers). Python maps it to TimeoutError.
class TimeoutError : public Error {
 public:
  explicit TimeoutError(const std::string& message) : Error(ErrorCode::timeout, message) {}
};

/// A wait bound: std::nullopt waits as long as it takes (a dead subscriber is still never waited for); zero or a
/// negative duration does not wait at all (the C ABI's negative timeouts mean "forever" instead: C has no nullopt).
using Timeout = std::optional<std::chrono::nanoseconds>;

/// One message of several tensors, delivered atomically (all or none, never interleaved with other messages):
/// an image with its boxes and mask, say. Each tensor keeps its own layout and metadata.
struct Message {
  enum class Kind : uint8_t {
    list,   ///< tensors in order (Python: a list)
    tuple,  ///< tensors in order (Python: a tuple)
    dict,   ///< tensors under `keys` (Python: a dict with str keys, in insertion order)
  };
  Kind kind = Kind::list;
  std::vector<Tensor> tensors;
  std::vector<std::string> keys;  ///< dict only: one per tensor, unique
};

/// How one send() goes (the overloads without it take the defaults).
struct SendOptions {
  /// Merged into each tensor's metadata (these win).
  Metadata metadata{};
  Timeout timeout = std::nullopt;
  /// nullopt: without a copy where a zero-copy path exists (a loan; a caller's CUDA allocation the driver can
  /// share), else exactly one copy into the pool. false: never copy — Error(copy_required) naming why, when
  /// there is no zero-copy path. true: always one copy into the pool (the caller may reuse its memory at once).
  std::optional<bool> copy = std::nullopt;
  /// CUDA tensors: the stream (a CUstream handle; 1 legacy default, 2 per-thread default) whose work wrote the
  /// tensor. The publisher records an interprocess event there before the message goes out, and subscribers'
  /// streams wait on that event (never the host). nullopt: the stream the tensor carries (Tensor::stream(), set
  /// when it was imported or made on a stream; when it has a ready event, tensorwire's own stream of the device
  /// after that event, since the producer's stream may be gone), else the legacy default. Host tensors: must be
  /// nullopt.
  std::optional<intptr_t> stream = std::nullopt;
};

struct PublisherOptions {
  /// Messages each subscriber's ring holds (>= 1).
  size_t depth = 8;
  OnFull on_full = OnFull::block;
  /// Largest metadata a message carries, in encoded bytes (see encode_metadata).
  size_t max_metadata_bytes = 64 * 1024;
  /// Pool buffers at most (each buffer is one memfd segment; each subscriber's channel has a lease counter per
  /// buffer). The pool grows until pool_bytes or this count, whichever comes first, before send/loan wait. A loan,
  /// and a copy of more than 16 KiB, takes a buffer of its own; smaller copies share 256 KiB buffers (64-byte
  /// aligned parts; a buffer is reused once no subscriber holds any of its parts).
  size_t max_buffers = 1024;
  /// Bytes of shared memory the pool may hold at once (a single buffer larger than this is still allowed, when
  /// the machine has the memory: a request it cannot have throws Error(out_of_memory) instead). A caller's CUDA
  /// allocation sent without a copy takes a buffer (of max_buffers) but none of these bytes: it is not the pool's.
  /// A message whose own tensors need more buffers than these allow is refused (Error(invalid_argument)).
  size_t pool_bytes = size_t{2} << 30;
  /// Subscribers served at once; more are refused with an error on their side.
  size_t max_subscribers = 256;
  /// Make a sent loan's memory read-only in this process until the buffer is loaned again whenever something could
  /// still write it after send() (a kept handle or view, an escaped raw pointer), so that a stale write faults
  /// instead of changing a message subscribers hold. Costs two mprotect calls, O(pages), for such loans only
  /// (bench/RESULTS.md); turn off only where nothing writes after send().
  bool protect_sent_loans = true;
  /// Accept subscribers of other users (the default accepts the publisher's own uid only).
  bool allow_other_users = false;

  // -- across machines (UCX; see "Across machines" in the README) --
  /// Also serve remote subscribers: "host:port" to listen on ("[v6]:port" only with UCX_TCP_AF_PRIO=inet6: see
  /// "Across machines" in the README; port 0 picks a free one, see
  /// Publisher::address). A missing host (":7447" or "7447") binds to loopback only. Empty: shared memory only.
  std::string listen{};
  /// A shared secret remote subscribers must prove (challenge-response; it never crosses the network). Required
  /// for a listener other machines can reach, unless `insecure`. Data is never encrypted.
  std::string token{};
  /// Allow a non-loopback listener without a token (a network you trust).
  bool insecure = false;
  /// A remote subscriber silent this long is dropped (it pings every second while alive).
  std::chrono::milliseconds keepalive{10000};
};

struct SubscriberOptions {
  /// Accept a publisher of another user (the default accepts the subscriber's own uid only).
  bool allow_other_users = false;
  /// Deliver every tensor on this device: what arrives elsewhere is copied there on receive (Device::cpu() on a
  /// machine without a GPU receives CUDA tensors as host copies). nullopt: tensors arrive where they were sent,
  /// and a CUDA tensor this process cannot open (no driver, no such GPU) is an error at recv naming why. A CUDA
  /// device here that this process does not have (no driver, no such index) is refused by the constructor, and so
  /// is a kind tensorwire does not allocate (only cpu, cuda:N and cuda_host are delivered to).
  std::optional<Device> device = std::nullopt;

  // -- across machines (UCX) --
  /// Subscribe to a remote publisher at "host:port" (its PublisherOptions::listen) instead of shared memory.
  /// The subscriber connects in the background and retries until a publisher listens there.
  std::string connect{};
  /// The publisher's token (see PublisherOptions::token). With a token the publisher must prove it too.
  std::string token{};
  /// A publisher silent this long (no message, no ping) is gone: the stream ends.
  std::chrono::milliseconds keepalive{10000};
  /// Largest message accepted from a remote publisher, in bytes (a larger one disconnects it).
  uint64_t max_message_bytes = uint64_t{1} << 34;
};

namespace ipc_detail {
class PublisherImpl;
class SubscriberImpl;
}  // namespace ipc_detail
namespace net_detail {
class Client;
}  // namespace net_detail

/// Topic names: 1 to 64 characters from [A-Za-z0-9_.:/-], not starting with '/'. Throws Error(invalid_argument)
/// naming the problem.
void validate_topic_name(std::string_view name);

/// The sending end of a topic. One publisher per name at a time (a second one throws Error(invalid_argument));
/// a new one may take the name once the old one is closed or dead. Thread-safe: send and loan may be called from
/// several threads (messages are ordered by the publisher's internal lock). In a fork()ed child every call that
/// acts throws (send, loan, fileno...; the child closes its copies of the publisher's sockets at fork: only the
/// parent publishes), and the getters report a closed publisher (closed() true, no subscribers, no address). What
/// the child writes into a loan it inherited stays in the child (its mapping of the pool is private).
///
/// Waiting: send() and loan() wait when a subscriber's ring is full (OnFull::block) or every pool buffer is held.
/// They never wait for a subscriber that hung up, and give up after their timeout (TimeoutError, nothing done).
/// Getters (subscriber_count, dropped, pool_buffers, owns) never wait for a blocked send.
class Publisher {
 public:
  /// Binds the topic and connects to waiting subscribers. Throws Error on a bad name or a name in use.
  explicit Publisher(std::string_view name, PublisherOptions options = {});
  ~Publisher();
  Publisher(Publisher&&) noexcept;
  Publisher& operator=(Publisher&&) noexcept;
  Publisher(const Publisher&) = delete;
  Publisher& operator=(const Publisher&) = delete;

  /// A writable, C-contiguous, uninitialised host tensor in a shared-memory pool buffer. Fill it, then send() it:
  /// it crosses with no copy. Write nothing through it after send(): where that is still possible its memory is
  /// read-only (see send), so the write faults instead of changing what subscribers hold; the buffer returns to the
  /// pool once this tensor (and all its views) and
  /// every subscriber's copy of it are gone. An exhausted pool follows the OnFull policy (drop_oldest waits like
  /// block when nothing can be dropped) for at most `timeout` (TimeoutError). Throws Error(out_of_memory) when the
  /// machine cannot provide the buffer.
  Tensor loan(const Shape& shape, DType dtype, Timeout timeout = std::nullopt);
  /// The same on `device`: Device::cpu() as above; Device::cuda(n) a device buffer of the publisher's IPC pool
  /// (a VMM allocation of its own, exported as a POSIX fd), ordered on the legacy default stream: fill it on any
  /// stream and send it with SendOptions::stream naming that stream. Throws Error(device_unavailable) without a
  /// driver or such a device.
  Tensor loan(const Shape& shape, DType dtype, Device device, Timeout timeout = std::nullopt);

  /// Delivers `t` to every current subscriber, or to none: with t.metadata() merged with `extra` (extra wins). A
  /// tensor that is a view of a pool buffer (from loan()) crosses with no copy, keeping its strides and offset;
  /// any other host tensor is copied into a pool buffer once: a dense layout of any order (Fortran, channels_last)
  /// as it is, with its strides, anything else packed C-contiguous (a receiver that reads the memory as C order
  /// checks is_contiguous() first). (Received tensors say "shm" or
  /// "shm-copy" in Buffer::transport; CUDA tensors "cuda-vmm", "cuda-ipc" or "cuda-copy"). A loan someone could still write after
  /// this call (this overload keeps the caller's handle) becomes read-only in this process until loaned again, so
  /// a stale write faults instead of changing what subscribers hold (PublisherOptions::protect_sent_loans).
  /// Returns the number of subscribers that got it. Throws Error(invalid_argument) when closed or in a fork()ed
  /// child, Error(unsupported) for memory other than host or CUDA, Error(invalid_argument) for oversized metadata,
  /// WouldBlockError under OnFull::raise, TimeoutError when `timeout` passes first (then nobody got it).
  size_t send(const Tensor& t, const Metadata& extra = {}, Timeout timeout = std::nullopt);
  /// Delivers several tensors as one message, atomically: a subscriber's recv_message() returns them with the same
  /// structure, each with its own layout and its metadata merged with `extra`. Loans among them cross with no copy.
  /// A message of n tensors takes n + 1 cells of a subscriber's ring (depth must be at least n + 1).
  size_t send(const Message& message, const Metadata& extra = {}, Timeout timeout = std::nullopt);
  /// The same, consuming the message (its tensors are released once it is sent; a failed send leaves it intact):
  /// loans handed over this way are not made read-only unless something else can still write them.
  size_t send(Message&& message, const Metadata& extra = {}, Timeout timeout = std::nullopt);
  /// The same, consuming the tensor: `send(std::move(loan))` leaves nothing in the caller to write through, so a
  /// loan with no other views, copies or escaped raw pointers (Buffer::escaped) is not made read-only (faster).
  /// The tensor is consumed only when the send succeeds.
  size_t send(Tensor&& t, const Metadata& extra = {}, Timeout timeout = std::nullopt);
  /// The same four with SendOptions (copy, stream). CUDA tensors cross as (allocation handle, offset, layout,
  /// device, event): see "CUDA between processes" in the README.
  size_t send(const Tensor& t, const SendOptions& options);
  size_t send(Tensor&& t, const SendOptions& options);
  size_t send(const Message& message, const SendOptions& options);
  size_t send(Message&& message, const SendOptions& options);

  /// Ends the stream: subscribers drain what is queued, then see end-of-stream. Loaned tensors stay valid.
  /// Idempotent.
  void close() noexcept;
  bool closed() const noexcept;

  const std::string& name() const noexcept;
  /// Subscribers currently connected.
  size_t subscriber_count() const;
  /// Messages dropped so far (OnFull::drop_oldest), summed over subscribers.
  uint64_t dropped() const;
  /// Segments (pool buffers) currently allocated.
  size_t pool_buffers() const;

  /// True when `t` views one of this publisher's pool buffers (a loan): send() passes it with no copy.
  bool owns(const Tensor& t) const;
  /// The address remote subscribers connect to ("host:port", the port resolved), or "" without `listen`.
  std::string address() const;
  /// Remote subscribers connected now (included in subscriber_count()).
  size_t remote_subscriber_count() const;

 private:
  std::unique_ptr<ipc_detail::PublisherImpl> impl_;
};

/// The receiving end of a topic. It may be created before or after the publisher; it receives every message sent
/// after both exist (subject to the publisher's OnFull policy). Several threads may recv() on one Subscriber (each
/// message goes to one of them; they wait without holding its lock); received tensors may be used and dropped on
/// any thread. Received tensors hold the publisher's buffers: keep copies of those you keep for long, or the
/// publisher's pool runs dry. In a fork()ed child every call that acts throws (recv, fileno...: only the parent
/// subscribes), and the getters report a closed subscriber (closed() true, connected() false).
class Subscriber {
 public:
  explicit Subscriber(std::string_view name, SubscriberOptions options = {});
  ~Subscriber();
  Subscriber(Subscriber&&) noexcept;
  Subscriber& operator=(Subscriber&&) noexcept;
  Subscriber(const Subscriber&) = delete;
  Subscriber& operator=(const Subscriber&) = delete;

  /// The next message as a read-only tensor (zero-copy; it holds a lease on the publisher's buffer), or an empty
  /// optional when `timeout` passes or at end-of-stream — tell them apart with closed().
  std::optional<Tensor> recv(std::chrono::nanoseconds timeout);
  template <class Rep, class Period>
  std::optional<Tensor> recv(std::chrono::duration<Rep, Period> timeout) {
    return recv(std::chrono::duration_cast<std::chrono::nanoseconds>(timeout));
  }
  /// Blocks until a message arrives or the stream ends.
  std::optional<Tensor> recv();
  /// Like recv(timeout), for any message: one tensor arrives as a Message of Kind::list with one tensor and
  /// `single` set; a message of several tensors with the structure it was sent with. (recv() throws
  /// Error(invalid_argument) on a message of several tensors, which it then drops: use this.)
  struct Received {
    Message message;
    bool single = true;
  };
  std::optional<Received> recv_message(std::chrono::nanoseconds timeout);
  /// recv with a zero timeout.
  std::optional<Tensor> try_recv() { return recv(std::chrono::nanoseconds(0)); }

  /// True once the stream has ended (the publisher closed or died and every queued message was received) or after
  /// close().
  bool closed() const noexcept;
  /// Once closed(): why the stream ended, in words ("the publisher (pid N) closed the topic", "... went away without
  /// closing the topic (it exited, crashed or was killed)", "the publisher at 10.0.0.1:7447 was silent for longer
  /// than the keepalive (10 s)", "this subscriber was closed", ...); "" before, or when there is nothing to add.
  std::string why_ended() const;
  /// True while connected to a live publisher. Never waits, and takes the handshake one step itself: polling it
  /// before the first recv() sees a publisher that started after this subscriber.
  bool connected() const noexcept;
  /// A descriptor that polls readable while a message (or end-of-stream) waits: for select/poll/epoll/asyncio.
  /// Owned by the Subscriber. Before a publisher exists, it also reads ready once when one connects (recv then
  /// completes the connection and may report a timeout).
  int fileno();
  /// Messages this subscriber missed because a queue was full (OnFull::drop_oldest): a remote subscriber counts
  /// those the publisher dropped for it (gaps in its numbering) and those its own queue dropped.
  uint64_t dropped() const noexcept;
  /// Disconnects and releases the channel: messages queued but not yet received are discarded (why_ended()
  /// says how many); tensors already received stay valid. Idempotent.
  void close() noexcept;
  const std::string& name() const noexcept;
  /// True for a subscriber of a remote publisher (SubscriberOptions::connect).
  bool remote() const noexcept { return remote_ != nullptr; }
  /// Why nothing can arrive yet, in words, for the message of a timeout: a remote subscriber not connected ("not
  /// connected to 10.0.0.1:7447 yet; last attempt: Destination is unreachable"); a local one with no publisher, or
  /// connected but sent nothing since it joined (a subscriber receives only what is sent after it subscribed);
  /// "" otherwise.
  std::string waiting_for() const;

  /// Internal (bindings): like recv_message(timeout), but returns early (empty) when a wait is interrupted.
  std::optional<Received> recv_interruptible(std::chrono::nanoseconds timeout, bool& interrupted);
  /// What poll_nowait found.
  enum class PollStatus : uint8_t { message, empty, ended, busy };
  /// Internal (bindings): recv with a zero timeout that never blocks — not even on the internal lock (`busy`:
  /// another thread holds it, and nothing was looked at).
  std::optional<Received> poll_nowait(PollStatus& status);

 private:
  std::unique_ptr<ipc_detail::SubscriberImpl> impl_;
  std::unique_ptr<net_detail::Client> remote_;
  std::optional<Device> remote_device_;  // SubscriberOptions::device of a remote subscriber
};

}  // namespace tw
