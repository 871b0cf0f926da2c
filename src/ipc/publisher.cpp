// publisher.cpp — the sending end: buffer pool, subscriber channels, the monitor thread that accepts subscribers
// and notices when they go away.
//
// Locking: one mutex guards the subscriber list and the pool. send() and loan() hold it for the whole operation
// (messages are thereby ordered); the monitor takes it to add or remove a subscriber, and marks a subscriber dead
// with an atomic flag *before* taking it, so a send() waiting on a dead subscriber's ring never waits for the
// monitor. Loaned tensors release their loan with an atomic decrement, from any thread, without the lock.
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>
#include <fcntl.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <mutex>
#include <thread>

#include "tensorwire/copy.hpp"
#include "ipc_internal.hpp"

namespace tw {
namespace ipc_detail {

namespace {

constexpr size_t kMinSegment = 4096;
using Clock = std::chrono::steady_clock;

// One pool buffer = one segment (memfd). Slots never move: loaned tensors point at them.
struct Slot {
  uint64_t segment_id = 0;  // 0: empty slot
  Fd fd;
  Mapping map;
  std::atomic<int32_t> loans{0};  // loaned tensors (and their views) alive in this process
};

struct Pool {
  explicit Pool(size_t n) : slots(new Slot[n]), count(n) {}
  std::unique_ptr<Slot[]> slots;
  size_t count;
};

// Owner of a loaned tensor's Buffer: keeps the mapping alive and returns the loan when the last view is gone.
struct LoanRef {
  LoanRef(std::shared_ptr<Pool> p, size_t s) : pool(std::move(p)), slot(s) {}
  LoanRef(const LoanRef&) = delete;
  LoanRef& operator=(const LoanRef&) = delete;
  ~LoanRef() { pool->slots[slot].loans.fetch_sub(1, std::memory_order_release); }
  std::shared_ptr<Pool> pool;
  size_t slot;
};

struct Sub {
  Fd sock;
  Fd efd;
  Mapping chan;
  Ring ring;
  std::vector<uint32_t> sent;       // per slot: messages pushed holding that slot, minus those the publisher dropped
  std::vector<uint64_t> announced;  // per slot: the segment id this subscriber was told about
  std::atomic<bool> dead{false};
  int32_t pid = 0;

  bool detached() const noexcept { return aref(ring.header().detached).load(std::memory_order_acquire) != 0; }
  uint32_t released(size_t slot) const noexcept {
    return aref(ring.released(static_cast<uint32_t>(slot))).load(std::memory_order_acquire);
  }
  bool holds(size_t slot) const noexcept { return sent[slot] != released(slot); }
  void notify() noexcept {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t r = ::write(efd.get(), &one, sizeof one);
  }
  // True when the peer hung up (checked without blocking).
  bool hung_up() noexcept {
    if (dead.load(std::memory_order_acquire)) return true;
    pollfd p{sock.get(), POLLRDHUP, 0};
    if (::poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLERR | POLLRDHUP))) dead.store(true);
    return dead.load(std::memory_order_acquire);
  }
};

// Waits with a growing pause: spin, then yield, then sleep up to 1 ms. Calls the hook about every 50 ms.
class Backoff {
 public:
  explicit Backoff(const std::function<void()>* hook) : hook_(hook), last_hook_(Clock::now()) {}
  void pause() {
    ++n_;
    if (n_ < 64) {
      __builtin_ia32_pause();
    } else if (n_ < 128) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(std::min<int>(1000, 20 * (n_ - 127))));
    }
    if ((n_ & 15) == 0) tick_hook();
  }
  // Calls the hook when 50 ms passed since the last call.
  void tick_hook() {
    if (!hook_ || !*hook_) return;
    auto now = Clock::now();
    if (now - last_hook_ > std::chrono::milliseconds(50)) {
      last_hook_ = now;
      (*hook_)();
    }
  }

 private:
  const std::function<void()>* hook_;
  Clock::time_point last_hook_;
  int n_ = 0;
};

}  // namespace

class PublisherImpl {
 public:
  PublisherImpl(std::string_view name, PublisherOptions opt) : name_(name), opt_(opt) {
    validate_topic_name(name);
    channel_proto_ = make_channel_header(opt_.depth, opt_.max_metadata_bytes, opt_.max_buffers,
                                         static_cast<uint32_t>(::getpid()));
    pool_ = std::make_shared<Pool>(opt_.max_buffers);
    listener_ = listen_abstract(publisher_address(name_));
    if (!listener_)
      throw Error(ErrorCode::invalid_argument, "a publisher of topic '" + name_ +
                                                   "' is already running for this user; close it first or pick "
                                                   "another name");
    wake_ = Fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!wake_) throw_errno("eventfd");
    {
      // Subscribers created before us wait on their own sockets: connect to each (they accept when they next
      // look), so they see every message from the first one on.
      std::lock_guard lock(mu_);
      for (const std::string& addr : find_listening(subscriber_address_prefix(name_))) {
        try {
          if (Fd s = connect_abstract(addr)) add_subscriber(std::move(s));
        } catch (const Error&) {
          // that subscriber is gone or this process is out of fds: skip it
        }
      }
    }
    monitor_ = std::thread([this] { monitor(); });
  }

  ~PublisherImpl() { close(); }

  const std::string& name() const noexcept { return name_; }
  bool closed() const noexcept { return closed_.load(std::memory_order_acquire); }

  void close() noexcept {
    if (closed_.exchange(true)) return;
    stop_.store(true);
    uint64_t one = 1;
    [[maybe_unused]] ssize_t r = ::write(wake_.get(), &one, sizeof one);
    if (monitor_.joinable()) monitor_.join();
    std::lock_guard lock(mu_);
    const ControlWire bye = encode_control(ControlType::bye, 0, 0);
    for (auto& s : subs_) {
      s->ring.close();
      s->notify();
      send_packet(s->sock.get(), &bye, sizeof bye, {}, 0);
    }
    subs_.clear();
    listener_.reset();
    wake_.reset();
    // Give back every segment no loaned tensor still uses: a closed publisher holds no fds or mappings beyond
    // those (the rest go with the last loan).
    for (size_t i = 0; i < pool_->count; ++i) {
      Slot& sl = pool_->slots[i];
      if (sl.segment_id && sl.loans.load(std::memory_order_acquire) == 0) {
        sl.segment_id = 0;
        sl.map.reset();
        sl.fd.reset();
      }
    }
  }

  size_t subscriber_count() {
    std::lock_guard lock(mu_);
    reap();
    size_t n = 0;
    for (auto& s : subs_) n += s->detached() ? 0u : 1u;
    return n;
  }

  uint64_t dropped() {
    std::lock_guard lock(mu_);
    uint64_t n = dropped_gone_;
    for (auto& s : subs_) n += aref(s->ring.header().dropped).load(std::memory_order_relaxed);
    return n;
  }

  size_t pool_buffers() {
    std::lock_guard lock(mu_);
    size_t n = 0;
    for (size_t i = 0; i < pool_->count; ++i) n += pool_->slots[i].segment_id ? 1u : 0u;
    return n;
  }

  void set_wait_hook(std::function<void()> hook) {
    std::lock_guard lock(mu_);
    hook_ = std::move(hook);
  }

  Tensor loan(const Shape& shape, DType dtype) {
    Layout l{dtype, shape, Layout::contiguous_strides(shape), 0, false};
    l.validate();
    std::lock_guard lock(mu_);
    check_open("loan");
    reap();
    const size_t slot = acquire_slot(static_cast<size_t>(l.nbytes()));
    Slot& s = pool_->slots[slot];
    s.loans.fetch_add(1, std::memory_order_relaxed);
    auto owner = std::make_shared<LoanRef>(pool_, slot);
    auto buf = std::make_shared<Buffer>(s.map.data(), s.map.size(), Device::cpu(), std::move(owner));
    return Tensor::make(std::move(buf), std::move(l), false);
  }

  bool owns(const Tensor& t) {
    if (!t.defined()) return false;
    std::lock_guard lock(mu_);
    size_t off;
    return find_slot_of(t.buffer(), off) >= 0;
  }

  size_t send(const Tensor& t, const Metadata& extra) {
    if (!t.defined()) throw Error(ErrorCode::invalid_argument, "Publisher::send: the tensor is undefined");
    if (t.device().type != kDLCPU && t.device().type != kDLCUDAHost)
      throw Error(ErrorCode::unsupported, "Publisher::send: a tensor on " + t.device().str() +
                                              " cannot be published through shared memory; copy it to the host first");
    std::string meta;
    if (!t.metadata().empty() || !extra.empty()) {
      Metadata m = t.metadata();
      for (size_t i = 0; i < extra.size(); ++i) m.set(extra.keys()[i], extra.values()[i]);
      meta = encode_metadata(m);
      if (meta.size() > opt_.max_metadata_bytes)
        throw Error(ErrorCode::invalid_argument, "Publisher::send: the metadata encodes to " +
                                                     std::to_string(meta.size()) + " bytes, more than max_metadata_bytes (" +
                                                     std::to_string(opt_.max_metadata_bytes) + ")");
    }
    std::lock_guard lock(mu_);
    check_open("send");
    reap();
    size_t alloc_offset = 0;
    long found = find_slot_of(t.buffer(), alloc_offset);
    Layout layout;
    size_t slot, alloc_bytes;
    if (found >= 0) {  // a view of a pool buffer: crosses as it is, with no copy
      slot = static_cast<size_t>(found);
      layout = t.layout();
      alloc_bytes = t.buffer().size();
    } else {
      if (active_count() == 0) return 0;
      check_ring_room_for_raise();
      layout = Layout{t.dtype(), t.shape(), Layout::contiguous_strides(t.shape()), 0, t.subbyte_padded()};
      slot = acquire_slot(static_cast<size_t>(layout.nbytes()));
      Slot& s = pool_->slots[slot];
      alloc_bytes = s.map.size();
      if (t.numel() > 0 && t.is_contiguous()) {
        // One memcpy: tw::copy would plan (costly for small messages) and split large copies across its thread
        // pool, which competes with busy-polling peers for the same cores.
        std::memcpy(s.map.data(), t.data_ptr(), static_cast<size_t>(layout.nbytes()));
      } else if (t.numel() > 0) {
        auto dst_buf = std::make_shared<Buffer>(s.map.data(), s.map.size(), Device::cpu(), nullptr);
        copy(t, Tensor::make(std::move(dst_buf), layout, false));
      }
    }
    if (active_count() == 0) return 0;
    const uint64_t seg = pool_->slots[slot].segment_id;
    for (auto& s : subs_) {
      if (s->detached() || s->announced[slot] == seg) continue;
      announce(*s, slot);
    }
    reap();
    check_ring_room_for_raise();
    const uint64_t seqno = ++sequence_;
    size_t delivered = 0;
    for (auto& s : subs_) {
      if (s->detached() || s->dead.load()) continue;
      delivered += push(*s, layout, seqno, seg, alloc_offset, alloc_bytes, slot, meta) ? 1u : 0u;
    }
    return delivered;
  }

 private:
  void check_open(const char* what) const {
    if (closed_.load())
      throw Error(ErrorCode::invalid_argument, std::string("Publisher::") + what + ": the publisher of '" + name_ +
                                                   "' is closed");
  }

  size_t active_count() const {
    size_t n = 0;
    for (auto& s : subs_) n += (!s->detached() && !s->dead.load()) ? 1u : 0u;
    return n;
  }

  void check_ring_room_for_raise() {
    if (opt_.on_full != OnFull::raise) return;
    for (auto& s : subs_)
      if (!s->detached() && !s->dead.load() && s->ring.full())
        throw WouldBlockError("Publisher::send: a subscriber of '" + name_ + "' has " +
                              std::to_string(opt_.depth) + " unread messages (on_full='raise')");
  }

  // The slot whose mapping contains the buffer, or -1. `off` receives the buffer's offset in the segment.
  long find_slot_of(const Buffer& b, size_t& off) const {
    const char* base = static_cast<const char*>(b.base());
    for (size_t i = 0; i < pool_->count; ++i) {
      const Slot& s = pool_->slots[i];
      if (!s.segment_id) continue;
      const char* lo = s.map.data();
      if (base >= lo && base < lo + s.map.size() && b.size() <= static_cast<size_t>(lo + s.map.size() - base)) {
        off = static_cast<size_t>(base - lo);
        return static_cast<long>(i);
      }
    }
    return -1;
  }

  bool slot_free(size_t i) const {
    const Slot& s = pool_->slots[i];
    if (s.loans.load(std::memory_order_acquire) != 0) return false;
    for (auto& sub : subs_)
      if (!sub->dead.load() && sub->holds(i)) return false;
    return true;
  }

  // A free pool slot of at least `nbytes`, creating or replacing segments as the budget allows; follows the OnFull
  // policy when the pool is exhausted.
  size_t acquire_slot(size_t nbytes) {
    const size_t cls = std::bit_ceil(std::max(nbytes, kMinSegment));
    Backoff backoff(&hook_);
    for (;;) {
      long empty = -1, exact = -1, larger = -1, other = -1;
      size_t total = 0;
      for (size_t i = 0; i < pool_->count; ++i) {
        Slot& s = pool_->slots[i];
        if (!s.segment_id) {
          if (empty < 0) empty = static_cast<long>(i);
          continue;
        }
        total += s.map.size();
        if (!slot_free(i)) continue;
        if (s.map.size() == cls) {
          exact = static_cast<long>(i);
          break;
        }
        if (s.map.size() > cls && s.map.size() <= 4 * cls && larger < 0) larger = static_cast<long>(i);
        else if (other < 0) other = static_cast<long>(i);
      }
      if (exact >= 0) return static_cast<size_t>(exact);
      if (larger >= 0) return static_cast<size_t>(larger);
      if (empty >= 0 && (total + cls <= opt_.pool_bytes || total == 0)) return create_segment(static_cast<size_t>(empty), cls);
      if (other >= 0) {  // make room: retire a free segment of another size
        retire(static_cast<size_t>(other));
        continue;
      }
      // Exhausted: every buffer is loaned, queued or held by a subscriber.
      if (opt_.on_full == OnFull::raise)
        throw WouldBlockError("tensorwire publisher '" + name_ + "': the buffer pool is exhausted (" +
                              std::to_string(pool_->count) + " buffers, pool_bytes " + std::to_string(opt_.pool_bytes) +
                              "); subscribers hold every buffer (on_full='raise')");
      if (opt_.on_full == OnFull::drop_oldest && drop_one_queued()) continue;
      backoff.pause();
      reap();
    }
  }

  size_t create_segment(size_t i, size_t bytes) {
    Slot& s = pool_->slots[i];
    const uint64_t id = next_segment_id_++;
    Fd fd = make_memfd("tensorwire:" + name_ + ":" + std::to_string(id), bytes);
    Mapping map = Mapping::map(fd.get(), bytes, true, true);  // pre-faulted: a fresh page costs ~10 us later
    // Readers map it read-only, and no peer can ever map it writable again (our mapping stays writable).
    add_seals(fd.get(), F_SEAL_FUTURE_WRITE | F_SEAL_SEAL);
    s.fd = std::move(fd);
    s.map = std::move(map);
    s.segment_id = id;
    return i;
  }

  void retire(size_t i) {
    Slot& s = pool_->slots[i];
    const ControlWire w = encode_control(ControlType::retire, s.segment_id, 0);
    for (auto& sub : subs_)
      if (sub->announced[i] == s.segment_id) {
        if (!send_packet(sub->sock.get(), &w, sizeof w, {}, 1000)) sub->dead.store(true);
        sub->announced[i] = 0;
      }
    s.segment_id = 0;
    s.map.reset();
    s.fd.reset();
  }

  void announce(Sub& sub, size_t slot) {
    const Slot& s = pool_->slots[slot];
    const ControlWire w = encode_control(ControlType::segment, s.segment_id, s.map.size());
    const int fd = s.fd.get();
    if (send_packet(sub.sock.get(), &w, sizeof w, std::span<const int>(&fd, 1), 1000))
      sub.announced[slot] = s.segment_id;
    else
      sub.dead.store(true);
  }

  // Drops the oldest queued message of the subscriber with the most queued (drop_oldest on an exhausted pool).
  bool drop_one_queued() {
    Sub* victim = nullptr;
    uint64_t most = 0;
    for (auto& s : subs_) {
      if (s->dead.load()) continue;
      uint64_t q = s->ring.queued();
      if (q > most) most = q, victim = s.get();
    }
    return victim && drop_oldest(*victim);
  }

  bool drop_oldest(Sub& s) {
    uint32_t slot = UINT32_MAX;
    if (!s.ring.try_pop([&](CellHeader& c) { slot = c.msg.lease_slot; })) return false;
    if (slot < s.sent.size()) --s.sent[slot];
    aref(s.ring.header().dropped).fetch_add(1, std::memory_order_relaxed);
    return true;
  }

  bool push(Sub& s, const Layout& layout, uint64_t seqno, uint64_t seg, size_t alloc_offset, size_t alloc_bytes,
            size_t slot, const std::string& meta) {
    Backoff backoff(&hook_);
    for (int attempt = 0;; ++attempt) {
      if (CellHeader* c = s.ring.begin_push()) {
        encode_message(c->msg, layout, seqno, seg, alloc_offset, alloc_bytes, static_cast<uint32_t>(slot),
                       static_cast<uint32_t>(meta.size()));
        if (!meta.empty()) std::memcpy(s.ring.cell_metadata(*c), meta.data(), meta.size());
        ++s.sent[slot];
        if (s.ring.commit_push()) s.notify();
        return true;
      }
      if (s.hung_up() || s.detached()) return false;
      if (opt_.on_full == OnFull::drop_oldest && s.ring.full()) {
        drop_oldest(s);
        continue;
      }
      if (attempt < 128) {  // a reader still copying out of the cell, or a ring about to drain
        backoff.pause();
        continue;
      }
      // Sleep until the subscriber pops (it bumps space_word), in slices that re-check its liveness.
      ChannelHeader& h = s.ring.header();
      const uint32_t seen = aref(h.space_word).load(std::memory_order_seq_cst);
      aref(h.producer_waiting).store(1, std::memory_order_seq_cst);
      if (!s.ring.begin_push()) futex_wait(&h.space_word, seen, 2'000'000);
      aref(h.producer_waiting).store(0, std::memory_order_relaxed);
      backoff.tick_hook();
    }
  }

  // Removes subscribers marked dead; their leases go with them.
  void reap() {
    for (auto it = subs_.begin(); it != subs_.end();) {
      if ((*it)->dead.load()) {
        dropped_gone_ += aref((*it)->ring.header().dropped).load(std::memory_order_relaxed);
        it = subs_.erase(it);
      } else {
        ++it;
      }
    }
  }

  void add_subscriber(Fd sock) {
    const PeerCred cred = peer_credentials(sock.get());
    if (!opt_.allow_other_users && cred.uid != ::getuid()) return;  // refused: closing the socket tells the peer
    auto sub = std::make_shared<Sub>();
    sub->pid = cred.pid;
    const ChannelHeader& proto = channel_proto_;
    Fd chan_fd = make_memfd("tensorwire:" + name_ + ":channel", proto.total_bytes);
    sub->chan = Mapping::map(chan_fd.get(), proto.total_bytes, true, true);
    std::memcpy(sub->chan.data(), &proto, sizeof proto);
    add_seals(chan_fd.get(), F_SEAL_SEAL);
    sub->ring = Ring(sub->chan.data());
    sub->ring.init_cells();
    sub->efd = Fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!sub->efd) throw_errno("eventfd");
    sub->sock = std::move(sock);
    sub->sent.assign(pool_->count, 0);
    sub->announced.assign(pool_->count, 0);
    const ControlWire w = encode_control(ControlType::welcome, 0, proto.total_bytes);
    const int fds[2] = {chan_fd.get(), sub->efd.get()};
    if (!send_packet(sub->sock.get(), &w, sizeof w, fds, 1000)) return;
    subs_.push_back(std::move(sub));
    uint64_t one = 1;
    [[maybe_unused]] ssize_t r = ::write(wake_.get(), &one, sizeof one);
  }

  void monitor() {
    std::vector<pollfd> fds;
    std::vector<std::shared_ptr<Sub>> watched;
    while (!stop_.load()) {
      fds.clear();
      watched.clear();
      fds.push_back({wake_.get(), POLLIN, 0});
      fds.push_back({listener_.get(), POLLIN, 0});
      {
        std::lock_guard lock(mu_);
        for (auto& s : subs_) {
          fds.push_back({s->sock.get(), POLLIN | POLLRDHUP, 0});
          watched.push_back(s);
        }
      }
      if (::poll(fds.data(), fds.size(), -1) < 0) continue;
      if (fds[0].revents) {
        uint64_t v;
        [[maybe_unused]] ssize_t r = ::read(wake_.get(), &v, sizeof v);
      }
      if (stop_.load()) break;
      // First mark the dead (no lock: a send() may be waiting on one of them), then take the lock.
      bool any_dead = false;
      for (size_t i = 0; i < watched.size(); ++i) {
        const short ev = fds[i + 2].revents;
        if (!ev) continue;
        bool gone = ev & (POLLHUP | POLLERR | POLLRDHUP);
        if (!gone && (ev & POLLIN)) {  // subscribers send nothing today: read and discard, EOF means gone
          char buf[64];
          std::vector<Fd> junk;
          gone = recv_packet(fds[i + 2].fd, buf, sizeof buf, junk) == 0;
        }
        if (gone) {
          watched[i]->dead.store(true);
          any_dead = true;
        }
      }
      watched.clear();
      if (any_dead) {
        std::lock_guard lock(mu_);
        reap();
      }
      if (fds[1].revents & POLLIN) {
        for (;;) {
          Fd s(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
          if (!s) break;
          std::lock_guard lock(mu_);
          try {
            add_subscriber(std::move(s));
          } catch (const Error&) {
            // out of fds or memory for this subscriber: it sees its socket close
          }
        }
      }
    }
  }

  std::string name_;
  PublisherOptions opt_;
  ChannelHeader channel_proto_{};
  std::shared_ptr<Pool> pool_;
  Fd listener_, wake_;
  std::mutex mu_;
  std::vector<std::shared_ptr<Sub>> subs_;
  std::function<void()> hook_;
  uint64_t next_segment_id_ = 1, sequence_ = 0, dropped_gone_ = 0;
  std::atomic<bool> closed_{false}, stop_{false};
  std::thread monitor_;
};

}  // namespace ipc_detail

Publisher::Publisher(std::string_view name, PublisherOptions options)
    : impl_(std::make_unique<ipc_detail::PublisherImpl>(name, options)) {}
Publisher::~Publisher() = default;
Publisher::Publisher(Publisher&&) noexcept = default;
Publisher& Publisher::operator=(Publisher&&) noexcept = default;

namespace {
ipc_detail::PublisherImpl& get(const std::unique_ptr<ipc_detail::PublisherImpl>& p, const char* what) {
  if (!p) throw Error(ErrorCode::invalid_argument, std::string("Publisher::") + what + ": moved-from publisher");
  return *p;
}
}  // namespace

Tensor Publisher::loan(const Shape& shape, DType dtype) { return get(impl_, "loan").loan(shape, dtype); }
size_t Publisher::send(const Tensor& t, const Metadata& extra) { return get(impl_, "send").send(t, extra); }
void Publisher::close() noexcept {
  if (impl_) impl_->close();
}
bool Publisher::closed() const noexcept { return !impl_ || impl_->closed(); }
const std::string& Publisher::name() const noexcept {
  static const std::string empty;
  return impl_ ? impl_->name() : empty;
}
size_t Publisher::subscriber_count() const { return get(impl_, "subscriber_count").subscriber_count(); }
uint64_t Publisher::dropped() const { return get(impl_, "dropped").dropped(); }
size_t Publisher::pool_buffers() const { return get(impl_, "pool_buffers").pool_buffers(); }
bool Publisher::owns(const Tensor& t) const { return impl_ && impl_->owns(t); }
void Publisher::set_wait_hook(std::function<void()> hook) { get(impl_, "set_wait_hook").set_wait_hook(std::move(hook)); }

}  // namespace tw
