// subscriber.cpp — the receiving end: connection (or waiting for a publisher), the channel, cached segment
// mappings, leases, and the wait strategy (a short spin that yields the core, then a futex sleep in slices that
// also watch the socket).
//
// Locking: mu_ guards the connection state and the segment cache and orders takes from the ring. It is held only
// for short steps and never while waiting: threads in recv() sleep on the ring's futex without it, so several
// threads may wait in recv() on one Subscriber, and getters never wait for a sleeping recv().
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <exception>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <set>
#include <unordered_map>

#include "core/text.hpp"
#include "ipc/fork_internal.hpp"
#include "net/net_internal.hpp"
#include "ipc/ipc_internal.hpp"
#include "ipc/pool_internal.hpp"
#include "tensorwire/device_runtime.hpp"

namespace tw {
namespace ipc_detail {

namespace {
// A received tensor copied to `to` (SubscriberOptions::device, or back to the device a staged tensor came from),
// still saying how it came and with its metadata. Leaves `t` as it was when the copy fails.
void move_received(Tensor& t, const Device& to) {
  Tensor moved = t.to(to);
  moved.buffer_ptr()->set_transport(t.buffer().transport());
  moved.metadata() = std::move(t.metadata());
  t = std::move(moved);
}

using Clock = std::chrono::steady_clock;
constexpr auto kSpin = std::chrono::microseconds(50);  // busy hand-off window before sleeping
constexpr int64_t kSliceNs = 50'000'000;                  // futex sleeps in slices that check the socket
constexpr size_t kMaxSegments = 1 << 16;                  // mappings a publisher may make us cache

// The channel and the connection, shared by the subscriber and every lease: the socket stays open (so the
// publisher keeps our leases) until the subscriber is closed *and* the last received tensor is gone.
struct Channel {
  Fd conn;
  Mapping map;
  Ring ring;
  pid_t pid = ::getpid();  // the process whose leases these are: a fork()ed child never releases them
};

// Owner of a received tensor's Buffer.
struct Lease {
  Lease(std::shared_ptr<Channel> c, std::shared_ptr<const void> s, uint32_t sl)
      : chan(std::move(c)), segment(std::move(s)), slot(sl) {}
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  ~Lease() {
    if (os::current_pid() != chan->pid) return;  // a fork()ed child's copy of the parent's tensor: not its lease
    // This process's mapping goes first (for CUDA, cuIpcCloseMemHandle): once the release below is seen, the
    // publisher may free the allocation, and freeing it before an importer closed its handle is undefined.
    segment.reset();
    if (uint32_t* r = chan->ring.released(slot)) aref(*r).fetch_add(1, std::memory_order_release);
  }
  std::shared_ptr<Channel> chan;
  std::shared_ptr<const void> segment;  // the host mapping, or the opened CUDA memory
  uint32_t slot;
};

// A received CUDA tensor's lease: when its last view goes, the consumer's kernels may still be reading the memory
// (on the receive stream, on the streams its exports named, or on any stream when one named none). The Lease, and
// with it the publisher's right to reuse the memory and this process's mapping of it, goes only after that work,
// through the device runtime's release thread: the thread dropping the tensor never waits.
struct CudaLease {
  CudaLease(std::shared_ptr<Lease> l, int dev, intptr_t stream, std::shared_ptr<StreamUses> u)
      : lease(std::move(l)), device(dev), receive_stream(stream), uses(std::move(u)) {}
  CudaLease(const CudaLease&) = delete;
  CudaLease& operator=(const CudaLease&) = delete;
  ~CudaLease() {
    if (os::current_pid() != lease->chan->pid) return;
    try {
      std::optional<std::vector<int64_t>> streams = uses->streams();
      if (streams) streams->push_back(receive_stream);
      device_runtime().release_after_work(Device::cuda(device), streams ? &*streams : nullptr, std::move(lease));
    } catch (...) {
      // out of memory queueing it: the lease went as the call unwound (nothing better can be done here)
    }
  }
  std::shared_ptr<Lease> lease;
  int device;
  intptr_t receive_stream;
  std::shared_ptr<StreamUses> uses;
};

// A CUDA segment the publisher announced: how to open it, opened while any lease uses it (then closed), and its
// event (opened once).
struct CudaSegment {
  CudaSegmentInfo info;
  uint64_t size = 0;
  Fd fd;                                // VMM: the allocation's fd (kept to reopen it)
  std::weak_ptr<const DeviceImport> opened;
  IpcEvent event;
};

struct SegmentRef {
  std::shared_ptr<Mapping> host;
  std::shared_ptr<CudaSegment> cuda;
  uint64_t size() const noexcept { return host ? host->size() : cuda ? cuda->size : 0; }
};

std::atomic<uint32_t> g_listener_counter{0};

[[noreturn]] void broken(const std::string& name, const std::string& what) {
  throw Error(ErrorCode::invalid_argument,
              "Subscriber('" + name + "'): the publisher broke the protocol (" + what + "); its stream is ended");
}

}  // namespace

class SubscriberImpl;
using SubscriberForks = ForkRegistry<SubscriberImpl>;

using PollStatus = Subscriber::PollStatus;
using Received = Subscriber::Received;

class SubscriberImpl {
 public:
  SubscriberImpl(std::string_view name, SubscriberOptions opt) : name_(name), opt_(opt), pid_(::getpid()) {
    validate_topic_name(name);
    epfd_ = Fd(::epoll_create1(EPOLL_CLOEXEC));
    if (!epfd_) throw_errno("epoll_create1");
    // Listen first, then try the publisher: a publisher starting in between finds our socket (no lost race).
    const std::string prefix = subscriber_address_prefix(name_);
    for (int attempt = 0; !listener_ && attempt < 100; ++attempt) {
      char tail[32];
      std::snprintf(tail, sizeof tail, "%x.%x", static_cast<unsigned>(::getpid()), g_listener_counter.fetch_add(1));
      listener_ = listen_abstract(prefix + tail);
    }
    if (!listener_) throw Error(ErrorCode::internal, "Subscriber: no free socket address for topic '" + name_ + "'");
    watch(listener_.get(), EPOLLIN);
    SubscriberForks::add(this);
    try {
      std::lock_guard lock(mu_);
      if (Fd c = connect_abstract(publisher_address(name_))) {
        adopt_connection(std::move(c));
        // Wait for the publisher's welcome so every message sent after this constructor returns reaches us.
        const auto deadline = Clock::now() + std::chrono::seconds(2);
        while (!welcomed_ && !peer_gone_ && Clock::now() < deadline) {
          pollfd p{chan_->conn.get(), POLLIN, 0};
          ::poll(&p, 1, 20);
          process_control();
        }
      }
    } catch (...) {
      SubscriberForks::remove(this);
      throw;
    }
  }

  ~SubscriberImpl() {
    close();
    SubscriberForks::remove(this);
  }

  const std::string& name() const noexcept { return name_; }

  void close() noexcept {
    std::lock_guard lock(mu_);
    if (user_closed_) return;
    // A publisher that already counted us (its sends returned 1) while we never polled: finish the handshake
    // (accept, then the welcome, when they are waiting) so that what it queued is released and counted below.
    for (int i = 0; i < 2 && !welcomed_ && !peer_gone_ && !forked_ && !eos_ && os::current_pid() == pid_; ++i) {
      try {
        wait_for_publisher(0);
      } catch (...) {  // (a refusal or a broken protocol: nothing of ours to release)
        break;
      }
    }
    user_closed_ = true;
    user_closed_flag_.store(true, std::memory_order_release);
    if (chan_ && welcomed_ && !forked_) {
      dropped_ = aref(chan_->ring.header().dropped).load(std::memory_order_relaxed);
      // Tell the publisher to deliver nothing more; release what is queued. Leases of tensors still alive keep the
      // socket (and with it our claim on their buffers) open until they are gone.
      aref(chan_->ring.header().detached).store(1, std::memory_order_seq_cst);
      for (int i = 0; i < (1 << 20); ++i) {
        // (a message of n tensors is a head cell and n part cells: one message)
        const auto pop = chan_->ring.try_pop([&](CellHeader& c) {
          if (!(c.msg.flags & kGroupPart)) ++discarded_;
          release_slot(c.msg.lease_slot);
        });
        if (pop != Pop::popped) break;
      }
      chan_->ring.signal_space();
      // Wake every thread asleep in recv(): they see the subscriber closed.
      aref(chan_->ring.header().futex_word).fetch_add(1, std::memory_order_seq_cst);
      futex_wake_all(&chan_->ring.header().futex_word);
    }
    chan_.reset();
    segments_.clear();
    listener_.reset();
    efd_.reset();
    epfd_.reset();
  }

  bool closed() const noexcept {
    std::lock_guard lock(mu_);
    return closed_locked();
  }

  std::string why_ended() const {
    std::lock_guard lock(mu_);
    if (!closed_locked()) return "";
    const std::string pub = "the publisher (pid " + std::to_string(publisher_pid_) + ")";
    if (user_closed_) return tw::detail::closed_subscriber_text(discarded_);
    if (forked_) return "";  // (every use says whose it is)
    if (!refused_.empty()) return pub + " refused this subscriber: " + refused_;
    if (broken_) return pub + " broke the protocol";
    if (!welcomed_) return "";
    if (bye_ || (chan_ && chan_->ring.closed())) return pub + " closed the topic";
    return pub + " went away without closing the topic (it exited, crashed or was killed)";
  }

  // Also takes the handshake one step (never waiting): a caller that polls connected() before its first recv
  // would otherwise wait forever, while the publisher already counts it and sends to it.
  bool connected() noexcept {
    std::lock_guard lock(mu_);
    if (!welcomed_ && !peer_gone_ && !user_closed_ && !forked_ && !eos_ && os::current_pid() == pid_) {
      try {
        wait_for_publisher(0);
      } catch (...) {  // (a refusal, or a publisher that broke the protocol: the next recv / fileno raises it)
        pending_error_ = std::current_exception();
      }
    }
    return !user_closed_ && !forked_ && !eos_ && welcomed_ && !peer_gone_ && chan_ && !chan_->ring.closed();
  }

  // Why nothing has arrived, for a timeout's message (Subscriber::waiting_for).
  std::string waiting_for() const {
    std::lock_guard lock(mu_);
    if (user_closed_ || eos_) return "";
    if (!welcomed_) return "no publisher of '" + name_ + "' is running";
    if (received_ == 0)
      return "connected to its publisher (pid " + std::to_string(publisher_pid_) + "), which has sent nothing since "
             "this subscriber joined: a subscriber receives only the messages sent after it subscribed";
    return "";
  }

  uint64_t dropped() const noexcept {
    std::lock_guard lock(mu_);
    if (!chan_ || !welcomed_) return dropped_;  // kept at close() and end-of-stream: the count stays readable
    return aref(chan_->ring.header().dropped).load(std::memory_order_relaxed);
  }

  int fileno() {
    std::lock_guard lock(mu_);
    check_usable("fileno");
    if (user_closed_) throw Error(ErrorCode::invalid_argument, "Subscriber::fileno: the subscriber is closed");
    raise_pending();
    // A publisher that already connected to our waiting socket: take it now, so that socket does not read as a
    // message waiting. (One that connects later makes the descriptor readable once; recv then handles it.)
    if (!welcomed_ && !peer_gone_) wait_for_publisher(0);
    if (!fd_mode_) {
      fd_mode_ = true;
      if (welcomed_ && chan_) arm_eventfd();
    }
    return epfd_.get();
  }

  // One look, never waiting for anything — not even for the lock (`busy`: another thread holds it, nothing was
  // looked at). For callers that must not block: the Python binding's busy-poll path, with the GIL held.
  std::optional<Received> poll_nowait(PollStatus& status) {
    std::unique_lock lock(mu_, std::try_to_lock);
    if (!lock.owns_lock()) {
      status = PollStatus::busy;
      return std::nullopt;
    }
    check_usable("recv");
    std::optional<Received> out;
    const Step st = step_locked(out, true);
    status = st == Step::message ? PollStatus::message : st == Step::ended ? PollStatus::ended : PollStatus::empty;
    return out;
  }

  std::optional<Received> recv(Clock::time_point deadline, bool interruptible, bool& interrupted) {
    interrupted = false;
    bool spun = false;
    for (;;) {
      std::shared_ptr<Channel> chan;
      int wait_fd = -1;
      {
        std::lock_guard lock(mu_);
        check_usable("recv");
        std::optional<Received> out;
        const Step st = step_locked(out, Clock::now() >= deadline);
        if (st == Step::message) return out;
        if (st != Step::wait) return std::nullopt;
        if (!welcomed_) {
          wait_fd = chan_ ? chan_->conn.get() : listener_.get();
        } else {
          chan = chan_;
        }
      }
      // Wait without the lock.
      if (!chan) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
        pollfd p{wait_fd, POLLIN, 0};
        if (::poll(&p, 1, static_cast<int>(std::clamp<int64_t>(left, 1, 50))) < 0 && errno == EINTR && interruptible) {
          interrupted = true;
          return std::nullopt;
        }
        continue;
      }
      Ring& ring = chan->ring;
      if (!spun) {
        // Busy hand-off: poll the ring for a short while before sleeping. When the publisher last ran on this very
        // core, spinning cannot help (it would starve the process we wait for until the scheduler preempts us,
        // ~100 µs later): then each round yields the core to it instead. On another core, spin.
        spun = true;
        const auto spin_end = std::min(deadline, Clock::now() + kSpin);
        bool yield = false;
        for (unsigned i = 0;; ++i) {
          if (!ring.empty() || ring.closed()) break;
          if ((i & 15) == 0) {
            if (Clock::now() >= spin_end) break;
            const uint32_t peer = aref(ring.header().producer_cpu).load(std::memory_order_relaxed);
            const int me = ::sched_getcpu();
            yield = me >= 0 && peer == static_cast<uint32_t>(me);
          }
          if (yield) ::sched_yield();
          else __builtin_ia32_pause();
        }
        continue;
      }
      // Sleep on the futex: announce ourselves, re-check, then wait while the word is unchanged.
      ChannelHeader& h = ring.header();
      const uint32_t seen = aref(h.futex_word).load(std::memory_order_seq_cst);
      aref(h.waiters).fetch_add(1, std::memory_order_seq_cst);
      bool ok = true;
      if (ring.empty() && !ring.closed() && !user_closed_flag_.load(std::memory_order_acquire)) {
        const int64_t left = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - Clock::now()).count();
        ok = futex_wait(&h.futex_word, seen, std::clamp<int64_t>(left, 0, kSliceNs));
      }
      aref(h.waiters).fetch_sub(1, std::memory_order_seq_cst);
      if (!ok && interruptible) {
        interrupted = true;
        return std::nullopt;
      }
      if (ring.empty()) {
        std::lock_guard lock(mu_);
        if (chan_ == chan) check_peer();
      }
    }
  }

  // In a fork()ed child (ForkRegistry, with mu_ held): drop the copies of the
  // parent's connection, so the publisher sees the parent's hang-up, not a child keeping its leases alive.
  void on_fork_child() noexcept {
    forked_ = true;
    if (chan_) chan_->conn.reset();
    listener_.reset();
    efd_.reset();
    epfd_.reset();
  }
  std::mutex& mutex() noexcept { return mu_; }

 private:
  enum class Step : uint8_t {
    message,  ///< `out` holds a message
    ended,    ///< closed, or end-of-stream: nothing will arrive
    empty,    ///< nothing now, and the deadline has passed
    wait,     ///< nothing now: wait (without the lock) and look again
  };

  // What recv does under the lock each round: take a message, notice the end of the stream, or say to wait.
  // Bounded: every `continue` follows a state change that the next round settles.
  // What connected() caught while taking a handshake step (it cannot throw): raised by the next call that can.
  void raise_pending() {
    if (!pending_error_) return;
    std::exception_ptr e;
    std::swap(e, pending_error_);
    std::rethrow_exception(e);
  }

  Step step_locked(std::optional<Received>& out, bool at_deadline) {
    raise_pending();
    for (int round = 0; round < 8; ++round) {
      if (user_closed_ || eos_) return Step::ended;
      if (broken_) {  // reported once; afterwards the stream has simply ended
        set_eos();
        return Step::ended;
      }
      if (!welcomed_ && !peer_gone_) wait_for_publisher(0);  // accept / read the welcome without blocking
      if (welcomed_) {
        if ((out = try_take())) {
          ++received_;
          return Step::message;
        }
        if (peer_gone_ || chan_->ring.closed()) {
          if (chan_->ring.empty()) {
            set_eos();
            return Step::ended;
          }
          continue;
        }
      } else if (peer_gone_) {
        set_eos();
        return Step::ended;
      }
      if (!at_deadline) return Step::wait;
      // Notice a dead publisher even when polled with zero timeouts, without a syscall on every poll.
      const auto now = Clock::now();
      if (chan_ && (fd_mode_ || now - last_peer_check_ > std::chrono::milliseconds(5))) {
        last_peer_check_ = now;
        process_control();
      }
      if (fd_mode_ && welcomed_) settle_eventfd();
      if (welcomed_ && !chan_->ring.empty()) continue;
      return Step::empty;
    }
    return at_deadline ? Step::empty : Step::wait;
  }

  void check_usable(const char* what) const {
    if (forked_ || os::current_pid() != pid_)
      throw Error(ErrorCode::invalid_argument, std::string("Subscriber::") + what + ": this subscriber of '" + name_ +
                                                   "' belongs to process " + std::to_string(pid_) +
                                                   "; a fork()ed child cannot use it (create a new Subscriber there)");
  }

  bool closed_locked() const noexcept {
    if (user_closed_ || eos_ || forked_ || broken_) return true;
    if (!peer_gone_ && !(welcomed_ && chan_ && chan_->ring.closed())) return false;
    return !welcomed_ || !chan_ || chan_->ring.empty();
  }

  // End of stream: nothing more will arrive. The channel and the cached segment mappings go now, not at close():
  // tensors still alive keep what they use (their leases hold the channel and their segment).
  void set_eos() {
    if (eos_) return;
    eos_ = true;
    if (chan_ && welcomed_) dropped_ = aref(chan_->ring.header().dropped).load(std::memory_order_relaxed);
    // The ring is closed only by the publisher's close() (then its BYE, which may still be unread on the socket):
    // kept, since the channel goes below and why_ended() must still say the topic was closed.
    if (chan_ && welcomed_ && chan_->ring.closed()) bye_ = true;
    segments_.clear();
    if (efd_) {  // fileno() users: readable from now on (recv reports end-of-stream)
      uint64_t one = 1;
      [[maybe_unused]] ssize_t r = ::write(efd_.get(), &one, sizeof one);
    }
    if (chan_) {
      if (epfd_) ::epoll_ctl(epfd_.get(), EPOLL_CTL_DEL, chan_->conn.get(), nullptr);
      chan_.reset();
    }
  }

  void watch(int fd, uint32_t events) {
    epoll_event ev{};
    ev.events = events;
    ev.data.fd = fd;
    if (::epoll_ctl(epfd_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) throw_errno("epoll_ctl");
  }

  void adopt_connection(Fd c) {
    const PeerCred cred = peer_credentials(c.get());
    if (!opt_.allow_other_users && cred.uid != ::getuid())
      throw Error(ErrorCode::invalid_argument,
                  "Subscriber: the socket of topic '" + name_ + "' is held by a process of another user (uid " +
                      std::to_string(cred.uid) + ", pid " + std::to_string(cred.pid) +
                      "), not by a publisher of this user; refused (abstract sockets have no permissions, so any local "
                      "user can squat a name: pick another topic name)");
    chan_ = std::make_shared<Channel>();
    chan_->conn = std::move(c);
    publisher_pid_ = cred.pid;
    watch(chan_->conn.get(), EPOLLIN | EPOLLRDHUP);
    if (listener_) {
      ::epoll_ctl(epfd_.get(), EPOLL_CTL_DEL, listener_.get(), nullptr);
      listener_.reset();
    }
  }

  // Not yet connected, or connected and waiting for the welcome: wait on the sockets.
  void wait_for_publisher(int timeout_ms) {
    const int fd = chan_ ? chan_->conn.get() : listener_.get();
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) <= 0) return;
    if (!chan_) {
      Fd c(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
      if (!c) return;
      try {
        adopt_connection(std::move(c));
      } catch (const Error&) {
        chan_.reset();  // a publisher of another user: ignore it, keep waiting
        return;
      }
    }
    process_control();
  }

  // Whether the publisher hung up (checked when the ring is empty after a sleep slice).
  void check_peer() {
    if (!chan_) return;
    pollfd p{chan_->conn.get(), POLLIN | POLLRDHUP, 0};
    if (::poll(&p, 1, 0) > 0) process_control();
  }

  // Reads every control packet waiting on the connection (bounded: a flood is read in later calls).
  void process_control() {
    if (!chan_ || peer_gone_) return;
    for (int i = 0; i < 4096; ++i) {
      alignas(8) uint8_t buf[sizeof(CudaSegmentWire) + 8];
      std::vector<Fd> fds;
      const long n = recv_packet(chan_->conn.get(), buf, sizeof buf, fds);
      if (n == -1) return;
      if (n == 0) {
        peer_gone_ = true;
        return;
      }
      try {
        if (n < 0) broken(name_, "an oversized control packet");
        handle(decode_control(std::span<const uint8_t>(buf, static_cast<size_t>(n)), fds.size()), fds);
      } catch (const Error& e) {
        // A hostile or broken publisher: stop listening to it (end-of-stream) and report the error once. (A
        // refusal is the publisher's word, not a broken protocol: why_ended says which.)
        peer_gone_ = true;
        if (refused_.empty()) broken_ = true;
        if (e.code() == ErrorCode::invalid_argument || e.code() == ErrorCode::version_mismatch) throw;
        throw Error(ErrorCode::invalid_argument, "Subscriber('" + name_ + "'): the publisher (pid " +
                                                     std::to_string(publisher_pid_) + ") sent what cannot be used: " +
                                                     e.what());
      }
    }
  }

  void handle(const ControlMessage& m, std::vector<Fd>& fds) {
    switch (m.type) {
      case ControlType::welcome: {
        if (welcomed_) broken(name_, "a second welcome");
        if (!is_eventfd(fds[1].get())) broken(name_, "its wake-up descriptor is not an eventfd");
        check_sealed(fds[0].get(), m.size);
        Mapping map = Mapping::map(fds[0].get(), m.size, true, true);
        ChannelHeader h;  // the private copy: validated once, never read from shared memory again
        std::memcpy(&h, map.data(), sizeof h);
        validate_channel(h, m.size);
        chan_->map = std::move(map);
        chan_->ring = Ring(chan_->map.data(), h);
        efd_ = std::move(fds[1]);
        // Ours to poll and read without blocking, whatever the publisher set.
        const int fl = ::fcntl(efd_.get(), F_GETFL);
        if (fl < 0 || ::fcntl(efd_.get(), F_SETFL, fl | O_NONBLOCK) != 0) throw_errno("fcntl(O_NONBLOCK) on the eventfd");
        watch(efd_.get(), EPOLLIN);
        welcomed_ = true;
        if (fd_mode_) arm_eventfd();
        break;
      }
      case ControlType::segment: {
        if (segments_.size() >= kMaxSegments) broken(name_, "more than 65536 segments announced");
        check_sealed(fds[0].get(), m.size);
        segments_[m.id] = SegmentRef{std::make_shared<Mapping>(Mapping::map(fds[0].get(), m.size, false, true)), {}};
        break;
      }
      case ControlType::cuda_segment: {
        if (segments_.size() >= kMaxSegments) broken(name_, "more than 65536 segments announced");
        auto cs = std::make_shared<CudaSegment>();
        cs->info = m.cuda;
        cs->size = m.size;
        if (!fds.empty()) cs->fd = std::move(fds[0]);
        segments_[m.id] = SegmentRef{{}, std::move(cs)};  // opened when a message names it
        break;
      }
      case ControlType::retire: segments_.erase(m.id); break;
      case ControlType::bye: peer_gone_ = bye_ = true; break;
      case ControlType::refused: {
        peer_gone_ = true;
        const bool full = m.id == static_cast<uint64_t>(RefuseReason::too_many_subscribers);
        refused_ = full ? "it already serves its max_subscribers" : "it is out of file descriptors or memory";
        // (max_subscribers is the caller's configuration: invalid_argument, a ValueError in Python; the other is
        // a shortage on the publisher's side)
        throw Error(full ? ErrorCode::invalid_argument : ErrorCode::out_of_memory,
                    "Subscriber('" + name_ + "'): the publisher (pid " + std::to_string(publisher_pid_) +
                        ") refused this subscriber: " + refused_);
      }
    }
  }

  void release_slot(uint32_t slot) noexcept {
    if (uint32_t* r = chan_->ring.released(slot)) aref(*r).fetch_add(1, std::memory_order_release);
  }

  // Pops one cell into private copies (never re-read from shared memory). Returns empty when the ring is.
  bool pop_copy(MessageDescriptor& d, std::string& meta) {
    const uint32_t cap = chan_->ring.max_metadata_bytes();
    meta.clear();
    const Pop r = chan_->ring.try_pop([&](CellHeader& c) {
      std::memcpy(&d, &c.msg, sizeof d);
      const size_t n = std::min<size_t>(d.metadata_bytes, cap);
      if (n) meta.assign(chan_->ring.cell_metadata(c), n);
    });
    if (r == Pop::corrupt) {
      peer_gone_ = broken_ = true;
      broken(name_, "a ring cell whose sequence word is ahead of the ring's head");
    }
    return r == Pop::popped;
  }

  // Builds the tensor of a popped tensor cell (its lease is ours: released on any failure).
  Tensor take_tensor(const MessageDescriptor& d, const std::string& meta) {
    SegmentRef seg;
    auto it = segments_.find(d.segment_id);
    if (it == segments_.end()) {  // announced just before the message: read the socket
      try {
        process_control();
      } catch (...) {
        release_slot(d.lease_slot);
        throw;
      }
      it = segments_.find(d.segment_id);
    }
    if (it != segments_.end()) seg = it->second;
    DecodedMessage m;
    try {
      m = decode_message(d, meta, seg.size(), chan_->ring.lease_slots(), chan_->ring.max_metadata_bytes());
      if ((m.memory == MemoryKind::cuda) != (seg.cuda != nullptr))
        bad_message("a message whose memory kind differs from its segment's");
    } catch (const Error& e) {
      release_slot(d.lease_slot);
      peer_gone_ = broken_ = true;  // one malformed message ends the stream: the publisher cannot be trusted
      throw Error(e.code(), "Subscriber('" + name_ + "'): " + e.what() + "; the stream is ended");
    }
    Tensor t;
    if (seg.cuda) {
      try {
        t = cuda_tensor(*seg.cuda, m);
      } catch (const Error& e) {
        release_slot(m.lease_slot);  // this message is dropped; the stream goes on
        throw Error(e.code(), "Subscriber('" + name_ + "'): a CUDA tensor arrived that this process cannot open: " +
                                  e.what());
      }
    } else {
      char* base = seg.host->data() + m.alloc_offset;
      auto lease = std::make_shared<Lease>(chan_, std::move(seg.host), m.lease_slot);
      auto buf = std::make_shared<Buffer>(base, static_cast<size_t>(m.alloc_bytes), Device::cpu(), std::move(lease));
      buf->set_transport(m.packed ? "shm-copy" : "shm");
      t = Tensor::make(std::move(buf), std::move(m.layout), true);
    }
    t.metadata() = std::move(m.metadata);
    if (opt_.device && !(t.device() == *opt_.device)) move_received(t, *opt_.device);  // one copy, here
    return t;
  }

  [[noreturn]] static void bad_message(const std::string& what) {
    throw Error(ErrorCode::invalid_argument, "tensorwire ipc: malformed message (" + what + ")");
  }

  // A CUDA tensor over the segment's memory (opened now, or still open for another lease), ordered on this
  // process's receive stream after the publisher's event.
  Tensor cuda_tensor(CudaSegment& cs, DecodedMessage& m) {
    const DeviceRuntime& rt = device_runtime();
    if (!rt.available()) throw Error(ErrorCode::device_unavailable, rt.status());
    // The driver opens no handle in the process that exported it: a publisher in this process is found by its
    // handles instead (pool_internal.hpp). VMM memory is imported from its fd all the same.
    const bool local = publisher_pid_ == os::current_pid() && local_shortcut();
    std::shared_ptr<const DeviceImport> opened = cs.opened.lock();
    if (!opened) {
      const auto kind = cs.info.handle == CudaHandle::vmm ? DeviceExport::Kind::vmm : DeviceExport::Kind::legacy;
      std::optional<uintptr_t> here;
      if (local && kind == DeviceExport::Kind::legacy) {
        here = local_legacy_base(cs.info.mem_handle);
        if (!here)
          throw Error(ErrorCode::invalid_argument, "Subscriber('" + name_ + "'): the publisher in this process sent "
                                                   "a CUDA allocation it does not hold (a stale or forged handle)");
      }
      DeviceImport imp;
      if (here) {
        // Valid for as long as this message's lease: the publisher keeps the allocation until every lease is back.
        if (cs.info.device < 0 || cs.info.device >= rt.device_count())
          throw Error(ErrorCode::invalid_argument, "Subscriber('" + name_ + "'): the publisher in this process named "
                                                   "cuda:" + std::to_string(cs.info.device) + ", which it does not have");
        imp.base = *here + cs.info.handle_offset;
        imp.bytes = cs.size;
        imp.device = cs.info.device;
      } else {
        imp = rt.open_memory(kind, cs.info.device_uuid, cs.fd.get(), cs.info.mem_handle, cs.info.handle_offset,
                             cs.size);
      }
      opened = std::make_shared<DeviceImport>(std::move(imp));
      cs.opened = opened;
    }
    // A closed ring (or its BYE): the publisher finished every event's work before closing it and may destroy
    // the events at any time after (opening or waiting on one then is undefined behaviour), so none is needed.
    // (A close that begins after this check can still destroy an event this thread is about to open: a window
    // of a few driver calls, not closed here.)
    bool gone = bye_ || chan_->ring.closed();  // or a segment of a publisher in this process that is gone (below)
    if (!gone && !cs.event.event) {
      const LocalEvent le = local ? local_ipc_event(cs.info.event_handle) : LocalEvent{};
      if (le.event) {
        cs.event.event = le.event;  // the publisher's own event
        cs.event.handle = cs.info.event_handle;
        cs.event.device = cs.info.device;
      } else if (le.known) {
        gone = true;  // (its segment waited for its event when it went: nothing is left to wait for)
      } else {
        // (a handle this process did not export: opened as from another process, which fails loudly if it was)
        cs.event = rt.open_ipc_event(cs.info.device_uuid, cs.info.event_handle);
      }
    }
    const intptr_t stream = gone ? 1 : rt.wait_ipc_event(cs.event);
    auto* base = reinterpret_cast<char*>(opened->base) + m.alloc_offset;
    const int device = opened->device;
    auto uses = std::make_shared<StreamUses>();
    auto lease = std::make_shared<CudaLease>(std::make_shared<Lease>(chan_, std::move(opened), m.lease_slot), device,
                                             stream, uses);
    auto buf = std::make_shared<Buffer>(base, static_cast<size_t>(m.alloc_bytes), Device::cuda(device), std::move(lease));
    buf->track_stream_uses(std::move(uses));
    buf->set_transport(m.packed ? "cuda-copy" : cs.info.handle == CudaHandle::vmm ? "cuda-vmm" : "cuda-ipc");
    Tensor t = Tensor::make(std::move(buf), std::move(m.layout), true);
    t.set_stream(stream);
    return t;
  }

  std::optional<Received> try_take() {
    MessageDescriptor d;
    std::string meta;
    // Parts whose group header the publisher dropped meanwhile (drop_oldest races us for the oldest cells) are
    // orphans: release them and look further. Bounded by the ring's size.
    for (uint32_t skipped = 0;; ++skipped) {
      if (!pop_copy(d, meta)) return std::nullopt;
      if (!(d.flags & kGroupPart)) break;
      release_slot(d.lease_slot);
      if (skipped > chan_->ring.depth()) {
        peer_gone_ = broken_ = true;
        broken(name_, "a run of group parts without their header");
      }
    }
    chan_->ring.signal_space();
    if (fd_mode_) settle_eventfd();
    Received out;
    if (!(d.flags & kGroupHead)) {
      out.message.tensors.push_back(take_tensor(d, meta));
      return out;
    }
    DecodedGroupHead g;
    try {
      g = decode_group_head(d, meta, chan_->ring.max_metadata_bytes());
    } catch (const Error&) {
      peer_gone_ = broken_ = true;
      throw;
    }
    out.single = false;
    const std::string& kind = g.structure.at("kind").as_string();
    out.message.kind = kind == "dict" ? Message::Kind::dict : kind == "tuple" ? Message::Kind::tuple : Message::Kind::list;
    if (out.message.kind == Message::Kind::dict)
      for (const Value& k : g.structure.at("keys").items()) out.message.keys.push_back(k.as_string());
    out.message.tensors.reserve(g.count);
    for (uint32_t i = 0; i < g.count; ++i) {
      // Committed before their header, and never dropped once we hold it (drop_oldest takes whole messages from
      // their header on): every part is there, or the publisher broke the protocol.
      if (!pop_copy(d, meta)) {
        peer_gone_ = broken_ = true;
        broken(name_, "a message of " + std::to_string(g.count) + " tensors whose part " + std::to_string(i) +
                          " never arrived");
      }
      if (!(d.flags & kGroupPart) || d.group != i) {
        if (d.lease_slot != UINT32_MAX) release_slot(d.lease_slot);
        peer_gone_ = broken_ = true;
        broken(name_, "a message of " + std::to_string(g.count) + " tensors whose part " + std::to_string(i) +
                          " is missing");
      }
      out.message.tensors.push_back(take_tensor(d, meta));
    }
    chan_->ring.signal_space();
    return out;
  }

  // fileno() mode: the eventfd reads as set exactly while a message (or end-of-stream) waits.
  void arm_eventfd() {
    aref(chan_->ring.header().want_eventfd).store(1, std::memory_order_seq_cst);
    settle_eventfd();
  }

  void settle_eventfd() {
    if (!efd_ || !chan_) return;
    const bool pending = !chan_->ring.empty() || chan_->ring.closed() || peer_gone_;
    if (pending) {
      uint64_t one = 1;
      [[maybe_unused]] ssize_t r = ::write(efd_.get(), &one, sizeof one);
      return;
    }
    uint64_t v;
    [[maybe_unused]] ssize_t r = ::read(efd_.get(), &v, sizeof v);
    // A push between our check and the read was consumed by the read: look again.
    if (!chan_->ring.empty() || chan_->ring.closed()) {
      uint64_t one = 1;
      r = ::write(efd_.get(), &one, sizeof one);
    }
  }

  std::string name_;
  SubscriberOptions opt_;
  pid_t pid_;
  mutable std::mutex mu_;
  Fd listener_, efd_, epfd_;
  std::shared_ptr<Channel> chan_;
  std::unordered_map<uint64_t, SegmentRef> segments_;
  Clock::time_point last_peer_check_{};
  uint64_t dropped_ = 0;
  uint64_t discarded_ = 0;  // queued messages close() released unread
  int32_t publisher_pid_ = 0;
  std::atomic<bool> user_closed_flag_{false};
  uint64_t received_ = 0;  // messages taken (for waiting_for)
  bool welcomed_ = false, peer_gone_ = false, user_closed_ = false, eos_ = false, fd_mode_ = false, forked_ = false;
  bool broken_ = false;  // the publisher broke the protocol: reported once, then end-of-stream
  std::string refused_;  // why the publisher refused this subscriber (then end-of-stream)
  bool bye_ = false;     // the publisher said BYE (it closed the topic) before its socket closed
  std::exception_ptr pending_error_;  // caught by connected(), raised by the next recv / fileno
};

}  // namespace ipc_detail

namespace {
ipc_detail::SubscriberImpl& get(const std::unique_ptr<ipc_detail::SubscriberImpl>& p, const char* what) {
  if (!p) throw Error(ErrorCode::invalid_argument, std::string("Subscriber::") + what + ": moved-from subscriber");
  return *p;
}
std::chrono::steady_clock::time_point deadline_after(std::chrono::nanoseconds timeout) {
  const auto now = std::chrono::steady_clock::now();
  if (timeout > std::chrono::hours(24 * 365 * 100)) return std::chrono::steady_clock::time_point::max();
  return now + std::max(timeout, std::chrono::nanoseconds(0));
}
}  // namespace

namespace {
// SubscriberOptions::device must be a device this process can hold tensors on: refused when the subscriber is made,
// not at the first recv (the device cannot appear later).
void check_wanted_device(std::string_view name, const std::optional<Device>& want) {
  if (!want || want->type == kDLCPU) return;
  const std::string who = "Subscriber('" + std::string(name) + "', device=" + want->str() + ")";
  const bool cuda = want->type == kDLCUDA || want->type == kDLCUDAHost;  // (tensorwire allocates no managed memory)
  if (!cuda)
    throw Error(ErrorCode::unsupported,
                who + ": a subscriber delivers to cpu, cuda:N or cuda_host (pinned), not to " + want->str());
  const DeviceRuntime& rt = device_runtime();
  if (!rt.available()) throw Error(ErrorCode::device_unavailable, who + ": CUDA is unavailable: " + rt.status());
  const int n = rt.device_count();
  if (want->type == kDLCUDA && (want->id < 0 || want->id >= n))
    throw Error(ErrorCode::invalid_argument, who + ": " + want->str() + " does not exist (this process sees " +
                                                 std::to_string(n) + " CUDA device" + (n == 1 ? "" : "s") + ")");
}
}  // namespace

Subscriber::Subscriber(std::string_view name, SubscriberOptions options) {
  check_wanted_device(name, options.device);
  if (!options.connect.empty()) {
    net_detail::ClientOptions o;
    o.connect = options.connect;
    o.token = options.token;
    o.keepalive = options.keepalive;
    o.limits.max_message_bytes = options.max_message_bytes;
    o.device = options.device;
    validate_topic_name(name);
    remote_ = net_detail::Client::create(std::string(name), std::move(o));
    remote_device_ = options.device;
    return;
  }
  if (!options.token.empty())
    throw Error(ErrorCode::invalid_argument, "Subscriber('" + std::string(name) +
                                                 "'): token= is for a remote publisher (give connect= too)");
  impl_ = std::make_unique<ipc_detail::SubscriberImpl>(name, options);
}
Subscriber::~Subscriber() = default;
Subscriber::Subscriber(Subscriber&&) noexcept = default;
Subscriber& Subscriber::operator=(Subscriber&&) noexcept = default;

namespace {
// A remote message, with each tensor where the subscriber wants it: on SubscriberOptions::device when it gave one;
// else a tensor that was on a CUDA device at the publisher (and crossed staged through host memory) goes back to
// the device of that index here, and one that cannot is an error naming why.
std::optional<Subscriber::Received> received(std::optional<net_detail::Delivered> d, const std::optional<Device>& want,
                                             const std::string& name) {
  if (!d) return std::nullopt;
  Subscriber::Received r;
  r.single = d->single;
  r.message.kind = static_cast<Message::Kind>(d->kind);
  r.message.keys = std::move(d->keys);
  r.message.tensors = std::move(d->tensors);
  for (size_t i = 0; i < r.message.tensors.size(); ++i) {
    Tensor& t = r.message.tensors[i];
    const int origin = i < d->cuda_origin.size() ? d->cuda_origin[i] : -1;
    const std::optional<Device> to = want ? want : origin >= 0 ? std::optional<Device>(Device::cuda(origin)) : std::nullopt;
    if (!to || t.device() == *to) continue;
    try {
      ipc_detail::move_received(t, *to);
    } catch (const Error& e) {
      if (want) throw;
      throw Error(e.code(), "Subscriber('" + name + "'): a CUDA tensor (on cuda:" + std::to_string(origin) +
                                " at the publisher) arrived staged through host memory, and cannot go to " + to->str() +
                                " here: " + e.what() +
                                "; subscribe with device='cpu' (SubscriberOptions::device) to receive it in host memory");
    }
  }
  return r;
}
static_assert(static_cast<int>(Message::Kind::dict) == 2 && static_cast<int>(Message::Kind::tuple) == 1);
static_assert(static_cast<int>(Subscriber::PollStatus::busy) == static_cast<int>(net_detail::PollResult::busy) &&
              static_cast<int>(Subscriber::PollStatus::ended) == static_cast<int>(net_detail::PollResult::ended) &&
              static_cast<int>(Subscriber::PollStatus::empty) == static_cast<int>(net_detail::PollResult::empty));

std::optional<Tensor> single(std::optional<Subscriber::Received> r, const std::string& name) {
  if (!r) return std::nullopt;
  if (!r->single) {
    const auto k = r->message.kind;
    const size_t n = r->message.tensors.size();
    throw Error(ErrorCode::invalid_argument,
                "Subscriber('" + name + "')::recv: the message was sent as a " +
                    (k == Message::Kind::dict ? "dict" : k == Message::Kind::tuple ? "tuple" : "list") + " of " +
                    std::to_string(n) + (n == 1 ? " tensor" : " tensors") + "; receive such messages with recv_message()");
  }
  return std::move(r->message.tensors.front());
}
}  // namespace

std::optional<Tensor> Subscriber::recv(std::chrono::nanoseconds timeout) {
  if (remote_) return single(received(remote_->recv(timeout), remote_device_, name()), name());
  bool interrupted;
  return single(get(impl_, "recv").recv(deadline_after(timeout), false, interrupted), name());
}
std::optional<Tensor> Subscriber::recv() {
  if (remote_) {
    for (;;) {
      auto r = remote_->recv(std::chrono::hours(1));
      if (r || remote_->ended()) return single(received(std::move(r), remote_device_, name()), name());
    }
  }
  bool interrupted;
  return single(get(impl_, "recv").recv(std::chrono::steady_clock::time_point::max(), false, interrupted), name());
}
std::optional<Subscriber::Received> Subscriber::recv_message(std::chrono::nanoseconds timeout) {
  if (remote_) return received(remote_->recv(timeout), remote_device_, name());
  bool interrupted;
  return get(impl_, "recv").recv(deadline_after(timeout), false, interrupted);
}
std::optional<Subscriber::Received> Subscriber::recv_interruptible(std::chrono::nanoseconds timeout,
                                                                   bool& interrupted) {
  if (remote_) {
    interrupted = false;
    return received(remote_->recv(timeout), remote_device_, name());
  }
  return get(impl_, "recv").recv(deadline_after(timeout), true, interrupted);
}
std::optional<Subscriber::Received> Subscriber::poll_nowait(PollStatus& status) {
  if (remote_) {
    net_detail::PollResult r;
    auto d = remote_->poll(r);
    status = static_cast<PollStatus>(r);
    return received(std::move(d), remote_device_, name());
  }
  return get(impl_, "recv").poll_nowait(status);
}
bool Subscriber::closed() const noexcept {
  if (remote_) return remote_->ended();
  return !impl_ || impl_->closed();
}
std::string Subscriber::why_ended() const {
  if (remote_) return remote_->ended() ? remote_->why_ended() : "";
  return impl_ ? impl_->why_ended() : "this subscriber was closed";
}
bool Subscriber::connected() const noexcept {
  if (remote_) return remote_->connected();
  return impl_ && impl_->connected();
}
int Subscriber::fileno() {
  if (remote_) return remote_->fileno();
  return get(impl_, "fileno").fileno();
}
uint64_t Subscriber::dropped() const noexcept {
  if (remote_) return remote_->dropped();
  return impl_ ? impl_->dropped() : 0;
}
void Subscriber::close() noexcept {
  if (remote_) remote_->close();
  if (impl_) impl_->close();
}
std::string Subscriber::waiting_for() const {
  if (remote_) return remote_->waiting_for();
  return impl_ ? impl_->waiting_for() : std::string();
}
const std::string& Subscriber::name() const noexcept {
  static const std::string empty;
  if (remote_) return remote_->name();
  return impl_ ? impl_->name() : empty;
}

}  // namespace tw
