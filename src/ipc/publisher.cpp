// publisher.cpp — the sending end: the send policy (room in every ring, drops, deadlines, all or none), the list of
// subscriber channels and the monitor thread that accepts subscribers and notices when they go away. The buffer
// pool is ipc/pool.cpp (behind a SegmentSource: host memory today); one subscriber's channel is ipc/channel.cpp.
//
// Locking, two mutexes, always taken in this order:
//  - send_mu_ orders send() and loan(): held for a whole operation, waits included, and taken within the caller's
//    timeout (a send queued behind another one that waits for a slow subscriber times out too). Nothing else
//    takes it but close().
//  - mu_ guards the subscriber list and the pool's slot table. Held only for short steps that never wait: not
//    across a sleep, a copy of the payload or a blocking syscall. Getters and the monitor take only mu_, so a
//    send() blocked on a full subscriber never blocks them, and no caller can hold mu_ while waiting for anything
//    a getter's caller holds (the Python GIL included).
// A waiting send() watches the subscribers it waits for itself (a zero-timeout poll for hang-up), so a SIGKILLed
// subscriber releases it without help from the monitor.
//
// Delivery is all or none: send() first waits until every live subscriber's ring has a free cell (or makes room
// under drop_oldest), packs, tells every subscriber about the buffers the message names (waiting, under block, for
// one whose control socket is full), then pushes to all of them in one critical section. A timeout, an
// interrupted wait or WouldBlockError leaves every ring as it was.
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>
#include <fcntl.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_set>

#include "tensorwire/copy.hpp"
#include "core/text.hpp"
#include "ipc/ipc_internal.hpp"
#include "ipc/channel_internal.hpp"
#include "ipc/fork_internal.hpp"
#include "ipc/pool_internal.hpp"
#include "net/net_internal.hpp"

namespace tw {
namespace ipc_detail {

namespace {

using Clock = std::chrono::steady_clock;

using Sub = SubscriberChannel;

// A deadline from a Timeout.
struct Deadline {
  explicit Deadline(Timeout t) : forever(!t) {
    if (t) at = Clock::now() + std::clamp(*t, std::chrono::nanoseconds(0), std::chrono::nanoseconds(std::chrono::hours(24 * 365)));
  }
  bool expired() const { return !forever && Clock::now() >= at; }
  int64_t left_ns() const {
    if (forever) return INT64_MAX;
    return std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::nanoseconds>(at - Clock::now()).count());
  }
  bool forever;
  Clock::time_point at{};
};

// A growing pause: spin, then yield, then sleep up to 1 ms (never past the deadline).
class Backoff {
 public:
  void pause(const Deadline& d) {
    ++n_;
    if (n_ < 64) {
      __builtin_ia32_pause();
    } else if (n_ < 128) {
      std::this_thread::yield();
    } else {
      const int64_t us = std::min<int64_t>({1000, 20 * (n_ - 127), d.left_ns() / 1000 + 1});
      std::this_thread::sleep_for(std::chrono::microseconds(us));
    }
  }
  int rounds() const { return n_; }

 private:
  int n_ = 0;
};

std::string mib(uint64_t bytes) { return tw::detail::bytes_text(bytes); }

// Callers' CUDA allocations (sent zero-copy) that subscribers of a closed publisher still read. The publisher is
// gone, so nothing else watches their leases: one thread, running only while there is something to watch, lets each
// allocation go once every subscriber that held it has released it or hung up (its socket closes with its last
// lease, or with its process). Until then the caller's memory cannot be freed or reused under a reader.
// Never destroyed (the thread is detached and may outlive static destruction); in a fork()ed child the parent's
// entries are dropped without freeing anything.
class Lingering {
 public:
  struct Entry {
    std::vector<std::shared_ptr<Sub>> subs;          // subscribers that held the slot at close
    size_t slot = 0;
    std::vector<std::shared_ptr<const void>> keep;  // the sent tensors' buffers
  };

  static Lingering& get() {
    static Lingering* r = [] {
      auto* l = new Lingering();
      ForkRegistry<Lingering>::add(l);
      return l;
    }();
    return *r;
  }

  void add(Entry e) {
    std::lock_guard lock(mu_);
    entries_.push_back(std::move(e));
    if (!running_) {
      running_ = true;
      std::thread([this] { run(); }).detach();
    }
  }

  size_t size() {
    std::lock_guard lock(mu_);
    return entries_.size();
  }

  std::mutex& mutex() noexcept { return mu_; }
  void on_fork_child() noexcept {
    // The parent's thread is not here; its entries are the parent's. Our copies of the subscribers' sockets close
    // (so the parent's subscribers see only the parent), the callers' buffers are left alone.
    for (auto& e : entries_) {
      e.subs.clear();
      new std::vector<std::shared_ptr<const void>>(std::move(e.keep));  // leaked on purpose: not this process's
    }
    entries_.clear();
    running_ = false;
  }

 private:
  void run() {
    for (;;) {
      std::vector<std::shared_ptr<const void>> gone;  // freed outside the lock (a deleter may take the GIL)
      std::vector<pollfd> fds;
      {
        std::lock_guard lock(mu_);
        for (auto it = entries_.begin(); it != entries_.end();) {
          auto& subs = it->subs;
          std::erase_if(subs, [&](const std::shared_ptr<Sub>& s) { return s->hung_up() || !s->holds(it->slot); });
          if (subs.empty()) {
            for (auto& k : it->keep) gone.push_back(std::move(k));
            it = entries_.erase(it);
            continue;
          }
          for (auto& s : subs) fds.push_back(pollfd{s->socket(), POLLRDHUP, 0});
          ++it;
        }
        if (entries_.empty() && gone.empty()) {
          running_ = false;
          return;
        }
      }
      gone.clear();
      // A hang-up wakes us at once; a lease released through the channel is seen within 20 ms.
      if (!fds.empty()) ::poll(fds.data(), fds.size(), 20);
    }
  }

  std::mutex mu_;
  std::vector<Entry> entries_;
  bool running_ = false;
};

}  // namespace

size_t lingering_foreign_allocations() { return Lingering::get().size(); }

class PublisherImpl;
using PublisherForks = ForkRegistry<PublisherImpl>;

class PublisherImpl {
 public:
  PublisherImpl(std::string_view name, PublisherOptions opt) : name_(name), opt_(opt), pid_(::getpid()) {
    validate_topic_name(name);
    if (opt_.max_subscribers < 1)
      throw Error(ErrorCode::invalid_argument, "max_subscribers must be at least 1");
    if (opt_.pool_bytes < 1)  // (as max_buffers: a pool of nothing served one buffer at a time, whatever depth said)
      throw Error(ErrorCode::invalid_argument, "pool_bytes must be at least 1");
    if (opt_.on_full != OnFull::block && opt_.on_full != OnFull::drop_oldest && opt_.on_full != OnFull::raise)
      throw Error(ErrorCode::invalid_argument, "on_full must be OnFull::block, drop_oldest or raise, not " +
                                                   std::to_string(static_cast<int>(opt_.on_full)));
    channel_proto_ = make_channel_header(opt_.depth, opt_.max_metadata_bytes, opt_.max_buffers,
                                         static_cast<uint32_t>(pid_));
    pool_ = std::make_shared<Pool>(host_segment_source(), opt_.max_buffers, opt_.pool_bytes, name_);
    if (!opt_.listen.empty()) {
      net_detail::ServerOptions so;
      so.listen = opt_.listen;
      so.token = opt_.token;
      so.insecure = opt_.insecure;
      so.depth = static_cast<uint32_t>(std::min<size_t>(opt_.depth, 1u << 20));
      so.on_full = static_cast<net_detail::Policy>(opt_.on_full);
      so.max_subscribers = opt_.max_subscribers;
      so.keepalive = opt_.keepalive;
      so.local_count = [this] { return local_count_.load(std::memory_order_relaxed); };
      net_ = net_detail::Server::create(name_, std::move(so));
    } else if (!opt_.token.empty() || opt_.insecure) {
      throw Error(ErrorCode::invalid_argument, "Publisher('" + name_ + "'): token= and insecure= are for remote "
                                               "subscribers (give listen= too)");
    }
    listener_ = listen_abstract(publisher_address(name_));
    if (!listener_) throw name_in_use();
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
    monitor_ = std::make_unique<std::thread>([this] { monitor(); });
    PublisherForks::add(this);  // last: a constructor that throws never leaves a dangling registration
  }

  ~PublisherImpl() {
    close();
    PublisherForks::remove(this);
    // The thread does not exist in a fork()ed child: never join it there (the handle is leaked on purpose).
    if (forked_ || os::current_pid() != pid_) (void)monitor_.release();
  }

  const std::string& name() const noexcept { return name_; }
  bool closed() const noexcept { return closed_.load(std::memory_order_acquire); }

  void close() noexcept {
    if (closed_.exchange(true)) return;
    if (forked_ || os::current_pid() != pid_) return;  // a child's copy: the parent's subscribers are not ours to end
    stop_.store(true);
    uint64_t one = 1;
    [[maybe_unused]] ssize_t r = ::write(wake_.get(), &one, sizeof one);
    if (monitor_ && monitor_->joinable()) monitor_->join();
    std::lock_guard send_lock(send_mu_);  // no send is half done past this point
    // Remote subscribers get what is queued (bounded), then BYE; their holds on pool buffers go with the thread.
    if (net_) net_->close();
    std::lock_guard lock(mu_);
    reap();
    linger_foreign();
    // Every event's work is done before BYE: a subscriber that has the BYE reads what is left in its ring without
    // opening or waiting on an event (release_unloaned destroys most of them just after, which makes opening one
    // undefined behaviour: cuIpcOpenEventHandle's contract).
    pool_->synchronize_events();
    for (auto& s : subs_) s->bye();
    subs_.clear();
    listener_.reset();
    wake_.reset();
    // Give back every segment no loaned tensor still uses: a closed publisher holds no fds or mappings beyond
    // those (the rest go with the last loan).
    pool_->release_unloaned();
  }

  size_t subscriber_count() {
    std::lock_guard lock(mu_);
    // Each socket is asked now whether its subscriber hung up, not left to the monitor thread: the count then agrees
    // with everything that happened before this call. (A subscriber that connected to this publisher while the
    // constructor connected to its waiting socket closes that socket: the second channel is dead from then on, but
    // was counted until the monitor next ran, 6 subscribers for 4 under ASan on a loaded machine. A send sees it at
    // once: announcing a segment to it fails.)
    for (auto& s : subs_) (void)s->hung_up();
    reap();
    size_t n = 0;
    for (auto& s : subs_) n += s->active() ? 1u : 0u;
    return n + remote_count();
  }

  size_t remote_count() const { return net_ && !closed() ? net_->active() : 0; }
  std::string address() const { return net_ ? net_->address() : std::string(); }

  uint64_t dropped() {
    std::lock_guard lock(mu_);
    uint64_t n = dropped_gone_ + (net_ ? net_->dropped() : 0);
    for (auto& s : subs_) n += aref(s->ring.header().dropped).load(std::memory_order_relaxed);
    return n;
  }

  size_t pool_buffers() {
    std::lock_guard lock(mu_);
    return pool_->buffers();
  }

  Tensor loan(const Shape& shape, DType dtype, Device device, Timeout timeout) {
    Layout l{dtype, shape, Layout::contiguous_strides(shape), 0, false};
    l.validate();
    const int dev = device_index(device, "loan");
    const Deadline deadline(timeout);
    check_usable("loan");  // before send_mu_: in a fork()ed child it may be held by a thread that is not there
    const SendLock send_lock(*this, deadline, "loan");
    std::unique_lock lock(mu_);
    check_usable("loan");
    const size_t slot = acquire_slot(static_cast<size_t>(l.nbytes()), deadline, lock, "loan", dev);
    Segment& seg = pool_->slot(slot).seg;
    // A device buffer loaned again: whatever last wrote it is done before the caller writes it on any stream
    // (usually long ago: its subscribers let it go).
    if (seg.device >= 0 && seg.recorded) device_runtime().synchronize_event(seg.event.event.get());
    return pool_->loan(slot, std::move(l));
  }

  // -1 for host memory, the ordinal for a CUDA device this process has; throws naming what is wrong.
  static int device_index(Device d, const char* what) {
    if (d.type == kDLCPU) return -1;
    if (d.type != kDLCUDA)
      throw Error(ErrorCode::unsupported, std::string("Publisher::") + what + ": " + d.str() +
                                              " memory cannot be published (host and CUDA memory can)");
    const DeviceRuntime& rt = device_runtime();
    if (!rt.available())
      throw Error(ErrorCode::device_unavailable, std::string("Publisher::") + what + " on " + d.str() + ": " + rt.status());
    if (d.id < 0 || d.id >= rt.device_count())
      throw Error(ErrorCode::device_unavailable, std::string("Publisher::") + what + ": " + d.str() + " does not exist (" +
                                                     std::to_string(rt.device_count()) + " CUDA devices)");
    return d.id;
  }

  bool owns(const Tensor& t) {
    if (!t.defined()) return false;
    std::lock_guard lock(mu_);
    size_t off;
    return pool_->find(t.buffer(), off) >= 0;
  }

  // `consumed`: the caller hands its handle over (send(Tensor&&)); otherwise it may keep writing through it.
  size_t send(const Tensor& t, const SendOptions& o, bool consumed) {
    const Tensor* one = &t;
    return send_parts(std::span<const Tensor* const>(&one, 1), nullptr, nullptr, o, consumed);
  }

  size_t send(const Message& m, const SendOptions& o, bool consumed) {
    if (m.tensors.empty()) throw Error(ErrorCode::invalid_argument, "Publisher::send: a message of no tensors");
    if (m.tensors.size() > kMaxGroup)
      throw Error(ErrorCode::invalid_argument, "Publisher::send: a message of " + std::to_string(m.tensors.size()) +
                                                   " tensors; at most " + std::to_string(kMaxGroup));
    Metadata structure;
    if (m.kind == Message::Kind::dict) {
      if (m.keys.size() != m.tensors.size())
        throw Error(ErrorCode::invalid_argument, "Publisher::send: a dict message of " +
                                                     std::to_string(m.tensors.size()) + " tensors has " +
                                                     std::to_string(m.keys.size()) + " keys");
      std::vector<Value> keys(m.keys.begin(), m.keys.end());
      structure.set("kind", "dict");
      structure.set("keys", Value::list(std::move(keys)));
      std::unordered_set<std::string_view> seen;
      for (const std::string& k : m.keys)
        if (!seen.insert(k).second)
          throw Error(ErrorCode::invalid_argument, "Publisher::send: the message has the key '" + k + "' twice");
    } else {
      if (!m.keys.empty())  // (they were dropped: the receiver got a list without the names the sender gave)
        throw Error(ErrorCode::invalid_argument,
                    std::string("Publisher::send: a ") + (m.kind == Message::Kind::tuple ? "tuple" : "list") +
                        " message has no keys, and this one has " + std::to_string(m.keys.size()) +
                        "; make it Message::Kind::dict to send them");
      structure.set("kind", m.kind == Message::Kind::tuple ? "tuple" : "list");
    }
    const std::string head = encode_metadata(structure);
    std::vector<const Tensor*> ts;
    for (const Tensor& t : m.tensors) ts.push_back(&t);
    return send_parts(ts, &head, &m, o, consumed);
  }

  // Holds send_mu_, taken before the deadline. Without one it simply waits: the holder notices close() within
  // milliseconds. With one it polls (try_lock and short sleeps: a timed lock on the steady clock is
  // pthread_mutex_clocklock, which ThreadSanitizer does not model).
  struct SendLock {
    SendLock(PublisherImpl& p, const Deadline& deadline, const char* what) : mu(p.send_mu_) {
      if (deadline.forever) {
        mu.lock();
        return;
      }
      Backoff backoff;
      while (!mu.try_lock()) {
        if (deadline.expired()) {
          std::string why;
          {
            std::lock_guard lock(p.mu_);
            why = p.waiting_for_;
          }
          throw TimeoutError("Publisher::" + std::string(what) + " on '" + p.name_ +
                             "' timed out behind another send or loan on this publisher" +
                             (why.empty() ? std::string() : ", which waits because " + why));
        }
        backoff.pause(deadline);
      }
    }
    ~SendLock() { mu.unlock(); }
    SendLock(const SendLock&) = delete;
    SendLock& operator=(const SendLock&) = delete;
    std::mutex& mu;
  };

 private:
  // One tensor of a message on its way out.
  struct Part {
    const Tensor* t = nullptr;
    std::string meta;
    Layout layout;
    size_t slot = 0, alloc_offset = 0, alloc_bytes = 0;
    bool loan = false;
    bool packed = false;   // copied into the pool (kPacked)
    int device = -1;       // CUDA ordinal, -1 for host memory
    intptr_t stream = 1;   // CUDA: the producer's stream
    bool remote_only = false;  // CUDA, with no local subscriber: staged for the remote ones, no pool slot here
  };

  // Runs f with mu_ released, and takes it back however f ends (the caller's cleanup runs with it held).
  template <class F>
  static void unlocked(std::unique_lock<std::mutex>& lock, F&& f) {
    lock.unlock();
    try {
      f();
    } catch (...) {
      lock.lock();
      throw;
    }
    lock.lock();
  }

  // copy=False with nobody to send to: the same refusal a send with subscribers would give.
  void check_zero_copy(std::vector<Part>& parts) {
    for (Part& p : parts) {
      size_t off;
      if (pool_->find(p.t->buffer(), off) >= 0) continue;
      if (p.device < 0)
        throw Error(ErrorCode::copy_required,
                    "Publisher::send: copy=False, but this tensor is not in the publisher's pool (only a loan() "
                    "crosses host memory without a copy); loan, fill and send it, or allow the copy");
      const std::string why = zero_copy_refusal(*p.t);
      if (!why.empty())
        throw Error(ErrorCode::copy_required, "Publisher::send: this CUDA tensor has no zero-copy path (" + why +
                                                  "); send with copy=None to copy it once into the pool");
    }
  }

  // Why a caller's CUDA tensor cannot cross without a copy ("" when it can).
  static std::string zero_copy_refusal(const Tensor& t) {
    if (t.numel() == 0) return "";
    uintptr_t lo = 0;
    DeviceExport e = export_of(t, lo);
    if (e.fd >= 0) ::close(e.fd);
    return e.kind == DeviceExport::Kind::none ? e.why : "";
  }

  // How another process could open the allocation under a caller's CUDA tensor (Kind::none with why when it
  // cannot); `lo` gets the address of the tensor's lowest byte.
  static DeviceExport export_of(const Tensor& t, uintptr_t& lo) {
    const ByteSpan sp = t.layout().byte_span();
    lo = reinterpret_cast<uintptr_t>(t.data_ptr()) + static_cast<uintptr_t>(sp.begin);
    return device_runtime().export_memory(t.device(), lo, static_cast<uint64_t>(sp.size()));
  }

  // Sends a caller's CUDA tensor by the handle of its allocation: a slot exporting that allocation (found or
  // adopted) keeps the tensor's memory alive until no lease holds it. False (with why) when it cannot.
  bool adopt_foreign(Part& p, std::string& why) {
    const Tensor& t = *p.t;
    const ByteSpan sp = t.layout().byte_span();
    uintptr_t lo = 0;
    DeviceExport e = export_of(t, lo);
    if (e.kind == DeviceExport::Kind::none) {
      why = e.why;
      return false;
    }
    long slot = pool_->find_foreign(p.device, e.base);
    if (slot >= 0 && pool_->slot(static_cast<size_t>(slot)).size() != e.bytes) {
      // The allocator freed that allocation and made another at the same address: a new segment.
      const auto old = static_cast<size_t>(slot);
      if (held(old)) slot = -1;  // (subscribers still read the old one: it stays until they let go)
      else {
        retired(old, pool_->slot(old).segment_id);
        pool_->slot(old).segment_id = 0;
        pool_->slot(old).seg = Segment();
        slot = -1;
      }
    }
    if (slot >= 0) {
      if (e.fd >= 0) ::close(e.fd);
    } else {
      const auto is_held = [this](size_t i) { return held(i); };
      const auto on_retire = [this](size_t i, uint64_t segment_id) { retired(i, segment_id); };
      const auto taken = pool_->adopt(std::move(e), is_held, on_retire);
      if (!taken) {
        why = "every pool slot is in use";
        return false;
      }
      slot = static_cast<long>(*taken);
    }
    Pool::Slot& s = pool_->slot(static_cast<size_t>(slot));
    keep_foreign(s, t);
    p.slot = static_cast<size_t>(slot);
    p.alloc_offset = static_cast<size_t>(lo - s.seg.device_base);
    p.alloc_bytes = static_cast<size_t>(sp.size());
    p.layout = t.layout();
    p.layout.byte_offset = -sp.begin;
    return true;
  }

  // A foreign slot keeps each tensor sent from it alive until no lease holds the slot: the caller may drop it at
  // once, and its allocator must not hand that memory to another tensor under a reader (PyTorch's caching allocator
  // packs many tensors into one allocation, so a tensor found in an adopted allocation needs keeping too).
  // Not when a buffer kept already covers its memory: that one lives while any lease holds the slot, the new
  // message's included, and keeps the memory from being freed or reused. This also bounds the list (every send from
  // Python imports the tensor into a new Buffer) and breaks the cycle a tensor received from this slot in this
  // process would make (its lease holds the slot, so keeping it, or anything that holds it, would hold the slot for
  // ever): its memory lies within what was kept when it was first sent, whatever wraps it since.
  static void keep_foreign(Pool::Slot& s, const Tensor& t) {
    const Buffer& b = t.buffer();
    const auto lo = reinterpret_cast<uintptr_t>(b.base());
    const uintptr_t hi = lo + b.size();
    const auto covers = [&](const std::shared_ptr<const Buffer>& k) {
      const auto klo = reinterpret_cast<uintptr_t>(k->base());
      return klo <= lo && hi <= klo + k->size();
    };
    if (std::none_of(s.seg.keep.begin(), s.seg.keep.end(), covers)) s.seg.keep.push_back(t.buffer_ptr());
  }

  // At close (mu_ held): a caller's CUDA allocation that a subscriber still reads outlives this publisher, in
  // Lingering, until every such subscriber lets go. Its slot then leaves the pool like any other.
  void linger_foreign() {
    for (size_t i = 0; i < pool_->end(); ++i) {
      Pool::Slot& s = pool_->slot(i);
      if (!s.segment_id || !s.seg.foreign || s.seg.keep.empty()) continue;
      Lingering::Entry e;
      for (auto& sub : subs_)
        if (!sub->dead.load() && sub->holds(i)) e.subs.push_back(sub);
      if (e.subs.empty()) continue;
      e.slot = i;
      e.keep.assign(s.seg.keep.begin(), s.seg.keep.end());
      e.keep.push_back(std::move(s.seg.owner));  // (local_legacy_base's token: the allocation is still there)
      s.seg.keep.clear();
      Lingering::get().add(std::move(e));
    }
  }

  // Lets go of callers' CUDA allocations no subscriber holds any more.
  void release_foreign() {
    const auto is_held = [this](size_t i) { return held(i); };
    const auto on_retire = [this](size_t i, uint64_t segment_id) { retired(i, segment_id); };
    pool_->release_free_foreign(is_held, on_retire);
  }

  // Slots taken by a send in progress (packed, not yet pushed) stay out of acquire_slot's reach until it ends.
  struct Reservation {
    PublisherImpl& p;
    std::vector<size_t> slots;
    ~Reservation() {
      for (size_t s : slots) p.pool_->slot(s).reserved = false;
    }
  };

  // A strided view of a loan crosses to remote subscribers as the iov of its contiguous runs when they are at least
  // this long (shorter runs cost UCX more per byte than packing them: bench/RESULTS.md, "Across machines").
  static constexpr uint64_t kMinRunBytes = 2048;
  static constexpr uint64_t kMaxRunsPerMessage = 1u << 16;

  // The remote side of a message: each tensor's bytes where they already are (a pool buffer, held until every
  // remote send of it completes), as its span or its runs; a loan view whose runs are too short is packed here,
  // once, for all remote subscribers. Called with mu_ held (dropped around packing).
  std::shared_ptr<net_detail::OutMessage> remote_message(std::vector<Part>& parts, const Message* group,
                                                         const Deadline& deadline, Reservation& reserved,
                                                         std::unique_lock<std::mutex>& lock,
                                                         std::optional<bool> copy_option) {
    using namespace net_detail;
    auto out = std::make_shared<OutMessage>();
    WireMessage wm;
    if (group) {
      wm.kind = static_cast<uint8_t>(1 + static_cast<int>(group->kind));
      if (group->kind == Message::Kind::dict) wm.keys = group->keys;
    }
    std::vector<const char*> bases(parts.size());
    std::vector<size_t> held_at(parts.size(), SIZE_MAX);  // where in out->keep each part's pool slot is held
    uint64_t runs = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      Part& p = parts[i];
      if (p.device >= 0) {  // sent dense, from device memory or staged through host memory (below)
        WireTensor w;
        w.metadata_bytes = p.meta;
        w.carry = Carry::packed;
        w.cuda_origin = p.device;
        // Its layout now (dense, as staged), so that `fits` below measures the descriptor that will be sent.
        const Tensor& t = *p.t;
        w.layout = Layout{t.dtype(), t.shape(), Layout::contiguous_strides(t.shape()), 0, t.subbyte_padded()};
        wm.tensors.push_back(std::move(w));
        continue;
      }
      const Pool::Slot& slot = pool_->slot(p.slot);
      bases[i] = slot.data() + p.alloc_offset;
      held_at[i] = out->keep.size();
      out->keep.push_back(pool_->hold(p.slot));
      WireTensor w;
      w.layout = p.layout;
      w.metadata_bytes = p.meta;
      const Layout& l = p.layout;
      if (l.numel() == 0) {
        w.layout.byte_offset = 0;
        w.carry = Carry::span;
      } else {
        // (a copy in the pool: C-contiguous when packed from a strided view, which the wire says; a dense layout of
        // another order was copied as it is and crosses as a span with its strides)
        if (!p.loan) w.carry = p.t->is_contiguous() || !l.is_contiguous() ? Carry::span : Carry::packed;
        else if (!l.may_overlap() && l.byte_span().size() == l.nbytes()) w.carry = Carry::span;  // dense, any signs
        else {
          const RunStats rs = l.is_packed_subbyte() || l.has_broadcast() || l.has_negative_stride() || l.may_overlap()
                                  ? RunStats{} : run_stats(l);
          if (rs.bytes >= kMinRunBytes && runs + rs.count <= kMaxRunsPerMessage) {
            w.carry = Carry::runs;
            runs += rs.count;
          } else {
            w.carry = Carry::packed;
          }
        }
        const ByteSpan sp = l.byte_span();
        bases[i] += l.byte_offset + sp.begin;
        w.layout.byte_offset = -sp.begin;
        w.span_bytes = static_cast<uint64_t>(sp.size());
      }
      wm.tensors.push_back(std::move(w));
    }
    // Runs need the descriptor in UCX's header (the receiver places them before it has the data), and a transport
    // that moves an iov without staging it (over TCP, packing is faster).
    const bool any_runs = std::any_of(wm.tensors.begin(), wm.tensors.end(),
                                      [](const WireTensor& w) { return w.carry == Carry::runs; });
    const bool fits = any_runs && net_->runs_worthwhile() &&
                      kNetHeaderBytes + encode_message(wm).size() <= net_->max_header();
    // A CUDA tensor sent alone, when this process's UCX reads device memory itself (a build with CUDA transports),
    // is sent from device memory (t.transport "ucx-cuda" where the receiver lands it on a device too): dense from
    // where it is, anything else packed once into device memory. UCX has no way to wait on a CUDA event, so the
    // host waits for the producer's stream before UCX reads. A group (whose parts UCX would need as an iov of device
    // memory), or a descriptor too large for UCX's header, is staged instead.
    const bool direct = parts.size() == 1 && parts[0].device >= 0 && net_->cuda_direct() &&
                        kNetHeaderBytes + encode_message(wm).size() <= net_->max_header();
    // Else CUDA tensors cross staged: packed into pinned host memory on their producers' streams (a copy into pinned
    // memory returns with the data there, since UCX reads the bytes with no way to wait on a CUDA event). The
    // receiver puts them back on a device (t.transport "ucx-staged"). Their pool slots, loans or callers'
    // allocations are untouched.
    std::vector<size_t> to_stage;
    for (size_t i = 0; i < parts.size(); ++i) {
      if (parts[i].device < 0) continue;
      if (parts[i].device > kMaxNetDevice)
        throw Error(ErrorCode::unsupported, "Publisher::send: remote subscribers receive CUDA tensors from cuda:0 "
                                            "to cuda:" + std::to_string(kMaxNetDevice) + " only");
      to_stage.push_back(i);
    }
    std::vector<std::shared_ptr<Buffer>> staged(to_stage.size());
    std::vector<const char*> device_bases(to_stage.size(), nullptr);
    if (direct) {
      for (size_t k = 0; k < to_stage.size(); ++k) {
        const Part& p = parts[to_stage[k]];
        const Tensor& t = *p.t;
        if (t.numel() == 0) continue;
        // Dense where it is (anything else is copied below, once, into device memory of its own). With local
        // subscribers the message's memory is its pool slot (a loan, a caller's allocation adopted, or the dense
        // copy made for them), held like a host slot, exactly as they hold it. With remote subscribers only, the
        // same holds for a loan of the pool's own memory; a caller's memory is copied, as it would be staged:
        // the caller may change or free it once send returns (copy=True promises so), its last reference must
        // not go on the net thread (a Python owner takes the GIL), and memory opened from another process's
        // handle may not be registrable by UCX.
        if (!p.remote_only) {
          if (!p.layout.is_contiguous()) continue;
          device_bases[k] = pool_->slot(p.slot).data() + p.alloc_offset + p.layout.byte_offset;
          out->keep.push_back(pool_->hold(p.slot));
        } else if (t.is_contiguous() && copy_option != true) {
          size_t off = 0;
          const long slot = pool_->find(t.buffer(), off);
          if (slot < 0 || pool_->slot(static_cast<size_t>(slot)).seg.foreign) continue;
          device_bases[k] = static_cast<const char*>(t.data_ptr());
          out->keep.push_back(pool_->hold(static_cast<size_t>(slot)));
        }
      }
    }
    if (!to_stage.empty()) {
      unlocked(lock, [&] {
        const DeviceRuntime& rt = device_runtime();
        for (size_t k = 0; k < to_stage.size(); ++k) {
          const Part& p = parts[to_stage[k]];
          const Layout& dense = wm.tensors[to_stage[k]].layout;  // (made dense above)
          if (direct) {
            if (p.t->numel() == 0) continue;
            if (!device_bases[k]) {
              // Idle memory, so that the pool never names stream= again: the block goes back from the net thread
              // once the remote sends are done, when the caller may have destroyed that stream. Nothing on the
              // device reads it after that (the host waits for the copy below; UCX's own copies are done when
              // the sends complete): it returns at once, not after the device's other work.
              staged[k] = rt.allocate_idle(Device::cuda(p.device), static_cast<size_t>(dense.nbytes()), false);
              rt.copy(*p.t, Tensor::make(staged[k], dense, false), p.stream);  // (after the tensor's own producer)
            } else {
              // UCX reads it from where it is once the host has waited for stream=: a loan filled on a stream (or
              // with a ready event) other than stream= is ordered there first, with local subscribers or without.
              order_after(*p.t, p.stream);
            }
            rt.synchronize_stream(Device::cuda(p.device), p.stream);
            continue;
          }
          staged[k] = rt.allocate(Device::cuda_host(), std::max<size_t>(static_cast<size_t>(dense.nbytes()), 1),
                                  p.stream);
          if (p.t->numel() > 0) rt.copy(*p.t, Tensor::make(staged[k], dense, false), p.stream);
        }
      });
      check_usable("send");
    }
    out->device_memory = direct;
    for (size_t i = 0, k = 0; i < parts.size(); ++i) {
      WireTensor& w = wm.tensors[i];
      if (parts[i].device >= 0) {
        w.span_bytes = static_cast<uint64_t>(w.layout.nbytes());
        w.cuda_direct = direct;
        if (device_bases[k]) {
          bases[i] = device_bases[k++];
          continue;
        }
        bases[i] = staged[k] ? static_cast<const char*>(staged[k]->base()) : nullptr;
        if (staged[k]) out->keep.push_back(std::move(staged[k]));
        ++k;
        continue;
      }
      if (w.carry == Carry::runs && !fits) w.carry = Carry::packed;
      if (w.carry != Carry::packed || !parts[i].loan) continue;
      // Pack the loan view for the remote side, into a pool buffer of its own (warm memory, reused like any other;
      // local subscribers still get the loan with no copy).
      const Tensor& t = *parts[i].t;
      Layout dense{t.dtype(), t.shape(), Layout::contiguous_strides(t.shape()), 0, t.subbyte_padded()};
      const size_t slot = acquire_slot(static_cast<size_t>(dense.nbytes()), deadline, lock, "send");
      pool_->slot(slot).reserved = true;
      reserved.slots.push_back(slot);
      pool_->make_writable(slot);
      char* dst = pool_->slot(slot).data();
      const size_t cap = pool_->slot(slot).size();
      unlocked(lock, [&] { copy(t, Tensor::make(std::make_shared<Buffer>(dst, cap, Device::cpu(), nullptr), dense, false)); });
      check_usable("send");
      bases[i] = dst;
      w.span_bytes = static_cast<uint64_t>(dense.nbytes());
      w.layout = std::move(dense);
      // The remote sends read the packed copy only: the loan goes back to the pool as soon as its local subscribers
      // and its caller are done with it, not when the slowest remote subscriber has its bytes (holding it doubled
      // the pool a burst of packed views needed, and its growth cost page faults: bench/RESULTS.md).
      if (held_at[i] >= out->keep.size())
        throw Error(ErrorCode::internal, "Publisher::send: a packed loan view held no pool slot");
      out->keep[held_at[i]] = pool_->hold(slot);
    }
    out->descriptor = encode_message(wm);
    for (size_t i = 0; i < parts.size(); ++i) {
      out->payload_bytes += wire_bytes(wm.tensors[i]);
      out->tensors.push_back(OutTensor{bases[i], std::move(wm.tensors[i])});
    }
    return out;
  }


  // The send path of one tensor (head == nullptr) or of a group (head: the encoded structure).
  // `group`: the message the tensors come from (its kind and keys), with `head` its encoded structure.
  size_t send_parts(std::span<const Tensor* const> ts, const std::string* head, const Message* group,
                    const SendOptions& o, bool consumed) {
    const Metadata& extra = o.metadata;
    std::vector<Part> parts(ts.size());
    for (size_t i = 0; i < ts.size(); ++i) {
      const Tensor& t = *ts[i];
      const std::string which = head ? " (tensor " + std::to_string(i) + " of the message)" : "";
      if (!t.defined())
        throw Error(ErrorCode::invalid_argument, "Publisher::send: the tensor" + which +
                                                     " is undefined (a loan can be sent once: send consumes it)");
      const Device dev = t.device();
      if (dev.type == kDLCUDA) {
        parts[i].device = device_index(dev, "send");  // (its stream is found once there is someone to send to)
      } else if (dev.type != kDLCPU && dev.type != kDLCUDAHost) {
        throw Error(ErrorCode::unsupported, "Publisher::send: a tensor on " + dev.str() + which +
                                                " cannot be published: host and CUDA device memory can; copy it to "
                                                "the host first");
      } else if (o.stream) {
        throw Error(ErrorCode::invalid_argument, "Publisher::send: stream= orders CUDA work, but the tensor" + which +
                                                     " is in host memory (" + dev.str() + "); leave stream unset");
      }
      parts[i].t = &t;
      if (!t.metadata().empty() || !extra.empty()) {
        Metadata m = t.metadata();
        m.update(extra);
        parts[i].meta = encode_metadata(m);
        if (parts[i].meta.size() > opt_.max_metadata_bytes)
          throw Error(ErrorCode::invalid_argument, "Publisher::send: the metadata" + which + " encodes to " +
                                                       std::to_string(parts[i].meta.size()) +
                                                       " bytes, more than max_metadata_bytes (" +
                                                       std::to_string(opt_.max_metadata_bytes) + ")");
      }
    }
    if (head && head->size() > opt_.max_metadata_bytes)
      throw Error(ErrorCode::invalid_argument, "Publisher::send: the message's keys encode to " +
                                                   std::to_string(head->size()) + " bytes, more than max_metadata_bytes (" +
                                                   std::to_string(opt_.max_metadata_bytes) + ")");
    const uint32_t cells = static_cast<uint32_t>(parts.size() + (head ? 1 : 0));
    if (cells > opt_.depth)
      throw Error(ErrorCode::invalid_argument, "Publisher::send: a message of " +
                                                   tw::detail::counted(int64_t(parts.size()), "tensor") + " takes " +
                                                   std::to_string(cells) +
                                                   " ring cells, more than depth (" + std::to_string(opt_.depth) +
                                                   "); create the publisher with depth >= " + std::to_string(cells));
    const Deadline deadline(o.timeout);
    check_usable("send");  // before send_mu_: in a fork()ed child it may be held by a thread that is not there
    const SendLock send_lock(*this, deadline, "send");
    std::unique_lock lock(mu_);
    check_usable("send");
    reap();
    release_foreign();
    if (active_count() == 0 && remote_count() == 0) {
      if (o.copy == false) check_zero_copy(parts);  // the same answer with or without subscribers
      return 0;
    }
    // 1. Room in every ring first (nothing is packed twice when a wait is retried). Subscribers may come and go
    //    while it waits: who is there is counted after it.
    wait_for_room(deadline, lock, cells);
    const bool local = active_count() > 0;
    const bool remote = remote_count() > 0;
    if (!local && !remote) {
      if (o.copy == false) check_zero_copy(parts);
      return 0;
    }
    for (Part& p : parts) {
      if (p.device < 0) continue;
      // The producer's work: on stream= when given, else the tensor's own (its ready event, when it has one: the
      // producer's stream may be gone).
      p.stream = o.stream ? *o.stream : p.t->stream() ? *stream_for_consumers(*p.t) : 1;
      // Remote subscribers only: a CUDA tensor is staged for them straight from where it is (remote_message), with
      // no device copy into the pool, no handle exported and no event recorded for subscribers that are not here.
      p.remote_only = !local;
    }
    if (!local && o.copy == false) check_zero_copy(parts);  // the answer local subscribers would get
    // 2. The buffers: loans as they are, a caller's CUDA allocation by its handle, anything else packed into pool
    //    buffers reserved until pushed.
    Reservation reserved{*this, {}};
    const DeviceRuntime& rt = device_runtime();
    for (Part& p : parts) {
      const Tensor& t = *p.t;
      if (p.remote_only) continue;
      const long found = o.copy == true ? -1 : pool_->find(t.buffer(), p.alloc_offset);
      // A slot this message names is reserved until pushed: a later part's acquire_slot or adopt must not retire
      // it to make room (a caller's allocation slot has no loan, lease or hold to keep it before the push).
      const auto reserve = [&](size_t slot) {
        pool_->slot(slot).reserved = true;
        reserved.slots.push_back(slot);
      };
      if (found >= 0) {  // a view of a pool buffer: crosses as it is, with no copy
        p.loan = true;
        p.slot = static_cast<size_t>(found);
        reserve(p.slot);
        if (pool_->slot(p.slot).seg.foreign) {  // another tensor of a caller's allocation sent before
          keep_foreign(pool_->slot(p.slot), t);
          if (o.stream) order_after(t, *o.stream);  // (see adopt_foreign below)
        }
        p.layout = t.layout();
        p.alloc_bytes = t.buffer().size();
        continue;
      }
      if (p.device >= 0 && o.copy != true && t.numel() > 0) {  // a caller's CUDA memory: zero-copy if it can be
        std::string why;
        if (adopt_foreign(p, why)) {
          reserve(p.slot);
          // stream= names where the caller last wrote it; the tensor's own producer work (its ready event, or
          // the stream it was imported on) comes first there too, as it does on the copy path. (A loan of the
          // pool's own memory is not ordered here: it was ordered when exported to the code that filled it.)
          if (o.stream) order_after(t, *o.stream);
          continue;
        }
        if (o.copy == false)
          throw Error(ErrorCode::copy_required, "Publisher::send: this CUDA tensor has no zero-copy path (" + why +
                                                    "); send with copy=None to copy it once into the pool");
      } else if (o.copy == false && p.device < 0) {  // (an empty CUDA tensor has nothing to copy)
        throw Error(ErrorCode::copy_required,
                    "Publisher::send: copy=False, but this tensor is not in the publisher's pool (only a loan() "
                    "crosses host memory without a copy); loan, fill and send it, or allow the copy");
      }
      p.packed = true;
      // A host tensor dense in another order (Fortran, channels_last, any permutation of C) keeps its strides:
      // its bytes are one span, copied as they are (one memcpy, cheaper than packing). Anything else is packed
      // C-contiguous (CUDA tensors too: remote subscribers are sent the pool's dense copy as it is).
      const bool keeps_order = p.device < 0 && t.numel() > 0 && !t.is_contiguous() &&
                               !t.layout().is_packed_subbyte() && t.layout().is_dense();
      p.layout = Layout{t.dtype(), t.shape(), keeps_order ? t.strides() : Layout::contiguous_strides(t.shape()), 0,
                        t.subbyte_padded()};
      size_t offset = 0;
      p.slot = acquire_slot(static_cast<size_t>(p.layout.nbytes()), deadline, lock, "send", p.device, &offset);
      Pool::Slot& s = pool_->slot(p.slot);
      s.reserved = true;
      reserved.slots.push_back(p.slot);
      pool_->make_writable(p.slot);
      p.alloc_offset = offset;
      // (A part of a shared buffer is all its subscribers may read of it.)
      p.alloc_bytes = s.shared ? Pool::shared_part_bytes(static_cast<size_t>(p.layout.nbytes())) : s.size();
      char* dst = s.data() + offset;
      if (p.device >= 0) {
        // One device copy on the producer's stream, after whatever last wrote this buffer.
        if (s.seg.recorded) rt.record_ipc_event(s.seg.event, p.stream, true);
        if (t.numel() > 0) {
          auto dst_buf = std::make_shared<Buffer>(dst, p.alloc_bytes, Device::cuda(p.device), nullptr);
          rt.copy(t, Tensor::make(std::move(dst_buf), p.layout, false), p.stream);
        }
        continue;
      }
      // The slot is ours until pushed (reserved, and send_mu_ orders every taker): pack without mu_.
      unlocked(lock, [&] {
        if (t.numel() > 0 && (t.is_contiguous() || keeps_order)) {  // (dense: its lowest byte is element 0's)
          // One memcpy: tw::copy would plan (costly for small messages) and split large copies across its thread
          // pool, which competes with busy-polling peers for the same cores.
          std::memcpy(dst, t.data_ptr(), static_cast<size_t>(p.layout.nbytes()));
        } else if (t.numel() > 0) {
          auto dst_buf = std::make_shared<Buffer>(dst, p.alloc_bytes, Device::cpu(), nullptr);
          copy(t, Tensor::make(std::move(dst_buf), p.layout, false));
        }
      });
      check_usable("send");
    }
    // 2a. CUDA parts: the producer's work is recorded on the segment's interprocess event before any subscriber
    //     can see the message. Re-recorded while a subscriber may still wait on the previous record, the stream
    //     first waits for that record, so the event never covers less than it did.
    for (Part& p : parts) {
      if (p.device < 0 || p.remote_only) continue;
      Segment& seg = pool_->slot(p.slot).seg;
      rt.record_ipc_event(seg.event, p.stream, seg.recorded && held(p.slot));
      seg.recorded = true;
    }
    // 2b. What remote subscribers get: the same buffers, held until every remote send of them is done.
    std::shared_ptr<net_detail::OutMessage> out;
    if (remote) out = remote_message(parts, group, deadline, reserved, lock, o.copy);
    // 2c. Every local subscriber is told about the buffers this message names before anything is pushed: one whose
    //     control socket is full is waited for, refused or skipped by the on_full policy, as a full ring is.
    std::vector<const Sub*> skipped;
    if (local) announce_segments(parts, deadline, lock, skipped);
    // 3. Push to every live subscriber in one critical section. Rings only gain room while we hold send_mu_, and a
    //    subscriber that joined meanwhile has an empty ring (and was told about the buffers by 2c, which waits,
    //    if at all, before its last round over the subscribers, made without letting go of mu_).
    reap();
    for (Part& p : parts) {
      if (p.loan && opt_.protect_sent_loans &&
          (!consumed || p.t->buffer_ptr().use_count() > 1 || p.t->buffer().escaped())) {
        // Someone could still write the loan after this send: the caller keeps its handle, another view or copy
        // is alive, or a raw pointer escaped (an __array_interface__ consumer, torch.frombuffer). The loan's
        // memory is read-only here from now on (until loaned again), so such a write faults instead of changing
        // what subscribers hold. A loan handed over whole (send(std::move(loan)), Python's send) skips the two
        // mprotect calls, which cost O(pages) (bench/RESULTS.md). Every tensor over the loan reads as read-only
        // from now on, so tensorwire's own writes into it fail with an error instead of faulting (device loans,
        // which the host cannot protect, too: nothing of tensorwire's writes a message subscribers hold).
        pool_->protect_sent(p.slot);
        p.t->buffer().seal();
      }
    }
    const uint64_t seqno = ++sequence_;
    size_t delivered = 0;
    // (A local subscriber that joined while this send was preparing it for remote subscribers only has nothing to
    // read in it: it joined after the message was made.)
    const bool any_remote_only = std::any_of(parts.begin(), parts.end(), [](const Part& p) { return p.remote_only; });
    for (auto& sp : subs_) {
      Sub& sub = *sp;
      if (!sub.active() || any_remote_only) continue;
      const bool told = std::all_of(parts.begin(), parts.end(), [&](const Part& p) {
        return sub.knows(p.slot, pool_->slot(p.slot).segment_id);
      });
      // Skipped by 2c under drop_oldest (its control socket is full): this message is dropped for it. (Not told
      // otherwise, or no room, cannot happen after 2c and wait_for_room.)
      if (!told || !sub.ring.room_for(cells)) {
        if (std::find(skipped.begin(), skipped.end(), &sub) != skipped.end())
          aref(sub.ring.header().dropped).fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      const uint32_t first = head ? 1u : 0u;
      const bool wants_eventfd = sub.ring.push_n(cells, [&](uint32_t i, CellHeader& c) {
        if (head && i == 0) {
          encode_group_head(c.msg, seqno, static_cast<uint16_t>(parts.size()), static_cast<uint32_t>(head->size()));
          std::memcpy(sub.ring.cell_metadata(c), head->data(), head->size());
          return;
        }
        const Part& p = parts[i - first];
        encode_message(c.msg, p.layout, seqno, pool_->slot(p.slot).segment_id, p.alloc_offset, p.alloc_bytes,
                       static_cast<uint32_t>(p.slot), static_cast<uint32_t>(p.meta.size()),
                       static_cast<uint16_t>((head ? kGroupPart : 0) | (p.packed ? kPacked : 0)),
                       static_cast<uint16_t>(i - first), p.device >= 0 ? MemoryKind::cuda : MemoryKind::host);
        if (!p.meta.empty()) std::memcpy(sub.ring.cell_metadata(c), p.meta.data(), p.meta.size());
        ++sub.sent[p.slot];
      });
      if (wants_eventfd) sub.notify();
      ++delivered;
    }
    if (out) delivered += net_->enqueue(std::move(out));
    return delivered;
  }

 public:

  // In a fork()ed child (ForkRegistry, with mu_ held): drop the copies of the parent's sockets and eventfds, so the
  // parent's subscribers see the parent's hang-up and nothing of the child. send_mu_ is not taken around fork(): a
  // send blocked on a slow subscriber must not hold fork() up; the child never takes it (it checks first).
  void on_fork_child() noexcept {
    forked_ = true;
    closed_.store(true);
    subs_.clear();  // closes this process's copies of their sockets and eventfds
    (void)net_.release();  // its thread is not in this process: never join or destroy it here
    listener_.reset();
    wake_.reset();
  }
  std::mutex& mutex() noexcept { return mu_; }

 private:
  Error name_in_use() const {
    // Abstract sockets have no permissions: tell another user's squatter from our own running publisher.
    std::string who;
    try {
      if (Fd c = connect_abstract(publisher_address(name_))) {
        const PeerCred cred = peer_credentials(c.get());
        if (cred.uid != ::getuid())
          return Error(ErrorCode::invalid_argument,
                       "the socket of topic '" + name_ + "' is held by a process of another user (uid " +
                           std::to_string(cred.uid) + ", pid " + std::to_string(cred.pid) +
                           "): abstract sockets have no permissions, so any local user can squat a name; pick "
                           "another topic name");
        who = " (pid " + std::to_string(cred.pid) + ")";
      }
    } catch (const Error&) {
    }
    return Error(ErrorCode::invalid_argument, "a publisher of topic '" + name_ + "' is already running for this user" +
                                                  who + "; close it first or pick another name");
  }

  void check_usable(const char* what) const {
    if (forked_ || os::current_pid() != pid_)
      throw Error(ErrorCode::invalid_argument, std::string("Publisher::") + what + ": this publisher of '" + name_ +
                                                   "' belongs to process " + std::to_string(pid_) +
                                                   "; a fork()ed child cannot use it (create a new Publisher there)");
    if (closed_.load())
      throw Error(ErrorCode::invalid_argument, std::string("Publisher::") + what + ": the publisher of '" + name_ +
                                                   "' is closed");
  }

  size_t active_count() const {
    size_t n = 0;
    for (auto& s : subs_) n += s->active() ? 1u : 0u;
    return n;
  }

  // Whether a live subscriber still holds slot i (pushed messages minus its releases).
  bool held(size_t i) const {
    for (auto& sub : subs_)
      if (!sub->dead.load() && sub->holds(i)) return true;
    return false;
  }

  // Who holds the pool's buffers ("subscriber pid N holds ..., 2 loans alive in this process"), and how many
  // buffers there are.
  std::string pool_holders(uint64_t* buffers_out = nullptr) const {
    std::map<int32_t, std::pair<uint64_t, uint64_t>> by_pid;  // pid -> (buffers held, messages queued unread)
    uint64_t loaned = 0, buffers = 0;
    for (size_t i = 0; i < pool_->end(); ++i) {
      const Pool::Slot& s = pool_->slot(i);
      if (!s.segment_id) continue;
      ++buffers;
      if (s.loans.load(std::memory_order_relaxed) != 0) ++loaned;
      for (auto& sub : subs_)
        if (!sub->dead.load() && sub->holds(i)) by_pid[sub->pid].first += 1;
    }
    for (auto& sub : subs_)
      if (!sub->dead.load() && by_pid.count(sub->pid) && sub->ring.sane()) by_pid[sub->pid].second += sub->ring.queued();
    if (buffers_out) *buffers_out = buffers;
    std::string holders;
    // (A buffer is held by a message still queued unread as much as by a received tensor kept: which one says
    // whether the subscriber reads too slowly or keeps what it read.)
    for (auto& [pid, n] : by_pid)
      holders += (holders.empty() ? "" : ", ") +
                 ("subscriber pid " + std::to_string(pid) + " holds " + tw::detail::counted(int64_t(n.first), "buffer") +
                  (n.second ? ", some for messages it has not read yet (" +
                                  tw::detail::counted(int64_t(n.second), "ring cell") + " queued)"
                            : " of received tensors it keeps"));
    if (loaned) holders += (holders.empty() ? "" : ", ") + tw::detail::counted(int64_t(loaned), "loan") + " alive in this process";
    return holders;
  }

  // Says who holds the pool's buffers: the message of a timeout on an exhausted pool.
  std::string exhausted_message(const char* what, uint64_t total, uint64_t nbytes) const {
    uint64_t buffers = 0;
    const std::string holders = pool_holders(&buffers);
    std::string m = "Publisher::" + std::string(what) + " on '" + name_ + "' timed out: the buffer pool is exhausted (" +
                    tw::detail::counted(int64_t(buffers), "buffer") + ", " + mib(total) + "; max_buffers " +
                    std::to_string(opt_.max_buffers) + ", pool_bytes " + mib(opt_.pool_bytes) + ")";
    if (!holders.empty()) m += ": " + holders;
    if (nbytes > opt_.pool_bytes)  // served only by an empty pool (a buffer larger than pool_bytes stands alone)
      m += ". This request alone (" + mib(nbytes) + ") is larger than pool_bytes: it is served once the pool holds "
           "no other buffer";
    return m + ". A subscriber that keeps received tensors for long should keep copies (np.array(t) in Python, "
               "copy() in C++ and Rust, tw_tensor_clone in C) so their buffers return to the pool, and one that "
               "reads too slowly holds a buffer per unread message; or raise max_buffers/pool_bytes";
  }

  // A free pool slot of at least `nbytes` (the pool reuses, creates or retires segments as its budget allows);
  // follows the OnFull policy when the pool is exhausted, waiting (without mu_) until the deadline. With
  // `shared_offset`, a small host copy may take part of a shared buffer (Pool::try_take_small): its offset there
  // is stored (0 for a buffer of its own).
  size_t acquire_slot(size_t nbytes, const Deadline& deadline, std::unique_lock<std::mutex>& lock, const char* what,
                      int device = -1, size_t* shared_offset = nullptr) {
    const auto is_held = [this](size_t i) { return held(i); };
    const auto on_retire = [this](size_t i, uint64_t segment_id) { retired(i, segment_id); };
    const std::string who = std::string("Publisher::") + what + " on '" + name_ + "'";
    Backoff backoff;
    for (;;) {
      reap();
      if (shared_offset && device < 0 && nbytes <= Pool::kSharedMax) {
        if (const auto part = pool_->try_take_small(nbytes, is_held, on_retire, who)) {
          waiting_for_.clear();
          *shared_offset = part->second;
          return part->first;
        }
      }
      if (const auto slot = pool_->try_take(nbytes, is_held, on_retire, who, device)) {
        waiting_for_.clear();
        if (shared_offset) *shared_offset = 0;
        return *slot;
      }
      // Exhausted: every buffer is loaned, queued or held by a subscriber.
      if (device < 0 && nbytes > pool_->bytes()) {  // (only then can it be beyond all the memory there is)
        // A request no wait can serve (beyond the memory this process can get, counting the pool's own, which
        // released buffers would give back) fails now, as it does with an empty pool: waiting would never end.
        const uint64_t room = os::memory_headroom(), pool_bytes = pool_->bytes();
        if (room != UINT64_MAX && nbytes > room && nbytes - room > pool_bytes)
          throw Error(ErrorCode::out_of_memory,
                      who + " needs " + std::to_string(nbytes) + " bytes of shared memory but this process can get "
                      "about " + std::to_string(room + pool_bytes) + " (available memory and the pool's own " +
                      std::to_string(pool_bytes) + "; cgroup and address-space limits), however long it waits; ask "
                      "for less");
      }
      if (pool_->only_reserved())  // by this message's own parts: waiting cannot make room
        throw Error(ErrorCode::invalid_argument,
                    "Publisher::" + std::string(what) + " on '" + name_ + "': this message's tensors need more pool "
                    "buffers than max_buffers (" + std::to_string(opt_.max_buffers) + ") and pool_bytes (" +
                    mib(opt_.pool_bytes) + ") allow together; raise them, or send the tensors apart");
      if (opt_.on_full == OnFull::raise) {
        const std::string holders = pool_holders();
        throw WouldBlockError("tensorwire publisher '" + name_ + "': the buffer pool is exhausted (" +
                              tw::detail::counted(int64_t(pool_->capacity()), "buffer") + " at most, pool_bytes " +
                              std::to_string(opt_.pool_bytes) + "); " +
                              (holders.empty() ? std::string("messages still queued hold every buffer") : holders) +
                              " (on_full='raise')");
      }
      if (opt_.on_full == OnFull::drop_oldest && (drop_one_queued() || (net_ && net_->drop_oldest_pending())))
        continue;
      // Never wait for the dead: look at the holders ourselves (the monitor may be busy).
      bool any_died = false;
      for (auto& sub : subs_)
        if (!sub->dead.load() && sub->hung_up()) any_died = true;
      if (any_died) continue;
      waiting_for_ = "the buffer pool is exhausted";
      if (deadline.expired()) {
        waiting_for_.clear();
        throw TimeoutError(exhausted_message(what, pool_->bytes(), nbytes));
      }
      lock.unlock();
      backoff.pause(deadline);
      lock.lock();
      check_usable(what);
    }
  }

  // The pool retired a segment to make room: subscribers that mapped it drop their mapping.
  void retired(size_t i, uint64_t segment_id) {
    for (auto& sub : subs_) sub->retire(i, segment_id);
  }

  // A send is about to wait for a slow subscriber (`why`, which getters report meanwhile): or, past the deadline,
  // it throws TimeoutError saying so.
  void about_to_wait_for(const Deadline& deadline, std::string why) {
    if (deadline.expired()) {
      waiting_for_.clear();
      throw TimeoutError("Publisher::send on '" + name_ + "' timed out: " + why +
                         "; nobody received this message. Use on_full='drop_oldest' to never wait for a slow "
                         "subscriber");
    }
    waiting_for_ = std::move(why);
  }

  // Waits until every active subscriber's ring has `cells` free cells, applying the OnFull policy to full ones.
  void wait_for_room(const Deadline& deadline, std::unique_lock<std::mutex>& lock, uint32_t cells) {
    Backoff backoff;
    for (;;) {
      reap();
      std::shared_ptr<Sub> blocked;
      for (auto& sp : subs_) {
        Sub& s = *sp;
        if (!s.active()) continue;
        if (!s.ring.sane()) {
          s.drop_broken();
          continue;
        }
        if (s.ring.room_for(cells)) continue;
        if (s.ring.queued() + cells > s.ring.depth()) {  // full (not just a reader still copying out)
          if (opt_.on_full == OnFull::raise)
            throw WouldBlockError("Publisher::send: a subscriber of '" + name_ + "' (pid " + std::to_string(s.pid) +
                                  ") has " + std::to_string(s.ring.queued()) + " unread ring cells of " +
                                  std::to_string(opt_.depth) + " (on_full='raise')");
          if (opt_.on_full == OnFull::drop_oldest) {
            bool broke = false;
            while (s.ring.queued() + cells > s.ring.depth()) {
              const Pop r = drop_oldest(s);
              if (r == Pop::corrupt) broke = true;
              if (r != Pop::popped) break;
            }
            if (broke) {
              s.drop_broken();
              continue;
            }
            if (s.ring.room_for(cells)) continue;
          }
        }
        blocked = sp;
        break;
      }
      if (!blocked) {
        std::string who;
        if (!net_ || net_->room(1, who)) {
          waiting_for_.clear();
          return;
        }
        // A remote subscriber has `depth` unread messages (its credit is spent).
        if (opt_.on_full == OnFull::raise)
          throw WouldBlockError("Publisher::send: " + who + " on '" + name_ + "' (on_full='raise')");
        about_to_wait_for(deadline, who);
        lock.unlock();
        backoff.pause(deadline);
        lock.lock();
        check_usable("send");
        continue;
      }
      if (blocked->hung_up()) continue;
      about_to_wait_for(deadline, "subscriber pid " + std::to_string(blocked->pid) + " has " +
                                      std::to_string(blocked->ring.queued()) + " unread messages (depth " +
                                      std::to_string(opt_.depth) + ")");
      lock.unlock();
      if (backoff.rounds() < 128) {
        backoff.pause(deadline);  // a reader still copying out of the cell, or a ring about to drain
      } else {
        // Sleep until the subscriber pops (it bumps space_word), in slices that re-check its liveness.
        ChannelHeader& h = blocked->ring.header();
        const uint32_t seen = aref(h.space_word).load(std::memory_order_seq_cst);
        aref(h.producer_waiting).store(1, std::memory_order_seq_cst);
        if (!blocked->ring.room_for(cells))
          futex_wait(&h.space_word, seen, std::min<int64_t>(deadline.left_ns(), 2'000'000));
        aref(h.producer_waiting).store(0, std::memory_order_relaxed);
      }
      blocked.reset();
      lock.lock();
      check_usable("send");
    }
  }

  // Tells every active local subscriber about each buffer `parts` names that it has not mapped yet (SEGMENT, after
  // its pending RETIREs). A subscriber reads its control socket when a message names a buffer it does not know, so
  // one that reads slowly while many new buffers are made (a large depth of unread messages with buffers of their
  // own) can have a full socket: under block the send waits for it (bounded by the deadline, watching for its
  // hang-up), under raise it throws, under drop_oldest this message is dropped for it (`skipped`). Nothing is
  // pushed before every subscriber not skipped knows every buffer, so the send stays all or none. Returns with mu_
  // held, after a last round over the subscribers made without letting go of it.
  void announce_segments(const std::vector<Part>& parts, const Deadline& deadline, std::unique_lock<std::mutex>& lock,
                         std::vector<const Sub*>& skipped) {
    if (std::any_of(parts.begin(), parts.end(), [](const Part& p) { return p.remote_only; })) return;
    for (;;) {
      skipped.clear();
      std::shared_ptr<Sub> blocked;
      for (auto& sp : subs_) {
        Sub& sub = *sp;
        if (!sub.active()) continue;
        SendResult r = SendResult::sent;
        for (const Part& p : parts) {
          const Pool::Slot& ps = pool_->slot(p.slot);
          r = ps.seg.device >= 0 ? sub.announce_cuda(p.slot, ps.segment_id, ps.size(), ps.seg.cuda, ps.seg.fd.get())
                                 : sub.announce(p.slot, ps.segment_id, ps.size(), ps.seg.fd.get());
          if (r != SendResult::sent) break;
        }
        if (r != SendResult::full) continue;  // told, or gone (dead: reaped before the push)
        if (opt_.on_full == OnFull::drop_oldest) {
          skipped.push_back(&sub);
          continue;
        }
        if (opt_.on_full == OnFull::raise)
          throw WouldBlockError("Publisher::send: a subscriber of '" + name_ + "' (pid " + std::to_string(sub.pid) +
                                ") " + kUnreadAnnouncements + " (on_full='raise')");
        blocked = sp;
        break;
      }
      if (!blocked) {
        waiting_for_.clear();
        return;
      }
      about_to_wait_for(deadline, "subscriber pid " + std::to_string(blocked->pid) + " " + kUnreadAnnouncements);
      lock.unlock();
      // Room comes when it reads its socket; a full count of fds in flight (ETOOMANYREFS) clears with no event on
      // this socket, so the wait is also a sleep of a few milliseconds.
      blocked->wait_writable(static_cast<int>(std::min<int64_t>(deadline.left_ns() / 1'000'000 + 1, 5)));
      std::this_thread::sleep_for(std::chrono::microseconds(std::min<int64_t>(deadline.left_ns() / 1000, 200)));
      blocked.reset();
      lock.lock();
      check_usable("send");
      reap();
    }
  }
  static constexpr const char* kUnreadAnnouncements =
      "has not read the announcements of new pool buffers that fill its control socket (a subscriber reads them as "
      "it receives the messages that use them)";

  // Drops the oldest queued message of the subscriber with the most queued (drop_oldest on an exhausted pool).
  bool drop_one_queued() {
    Sub* victim = nullptr;
    uint64_t most = 0;
    for (auto& s : subs_) {
      if (!s->active()) continue;
      uint64_t q = s->ring.queued();
      if (q > most) most = q, victim = s.get();
    }
    if (!victim) return false;
    const Pop r = drop_oldest(*victim);
    if (r == Pop::corrupt) victim->drop_broken();
    return r != Pop::empty;
  }

  // Which cells pop_cell takes.
  enum class Take : uint8_t {
    any,        ///< whatever is oldest (a detached subscriber's ring is emptied)
    message,    ///< a single tensor or a group header: never a part of a group the subscriber is reading
    part_of,    ///< a part of the group whose header we just took (same sequence number)
  };

  // Pops one cell and forgets its lease (the lease slot and flags read back from the ring are hostile: checked
  // before use; a group header holds no lease). Sets `group` to the number of parts a group header announces.
  Pop pop_cell(Sub& s, uint32_t& group, Take take = Take::any, uint64_t* sequence = nullptr) {
    uint32_t slot = UINT32_MAX;
    uint16_t flags = 0, n = 0;
    const auto accept = [take, sequence](const CellHeader& c) {
      auto& m = const_cast<MessageDescriptor&>(c.msg);
      const bool part = (aref(m.flags).load(std::memory_order_relaxed) & kGroupPart) != 0;
      if (take == Take::any) return true;
      if (take == Take::message) return !part;
      return part && aref(m.sequence).load(std::memory_order_relaxed) == *sequence;
    };
    const Pop r = s.ring.try_pop_if(accept, [&](CellHeader& c) {
      slot = aref(c.msg.lease_slot).load(std::memory_order_relaxed);
      flags = aref(c.msg.flags).load(std::memory_order_relaxed);
      n = aref(c.msg.group).load(std::memory_order_relaxed);
      if (sequence) *sequence = aref(c.msg.sequence).load(std::memory_order_relaxed);
    });
    group = 0;
    if (r != Pop::popped) return r;
    if (flags & kGroupHead) group = std::min<uint32_t>(n, kMaxGroup);
    else if (slot < s.sent.size() && s.sent[slot] != 0) --s.sent[slot];
    return r;
  }

  // Drops the subscriber's oldest unread message: one cell, or a group header and its parts. When the oldest cell
  // is a part, the subscriber holds that group's header and is reading it: nothing is dropped (Pop::empty; the
  // reader frees those cells in a moment). After taking a header, only its own parts are taken (same sequence
  // number): those the reader claimed first (it releases them as orphans) are simply not there, and the next
  // message — which the reader may already be reading — is never touched.
  Pop drop_oldest(Sub& s) {
    uint32_t group = 0;
    uint64_t sequence = 0;
    const Pop r = pop_cell(s, group, Take::message, &sequence);
    if (r != Pop::popped) return r;
    for (uint32_t i = 0; i < group; ++i) {
      uint32_t ignored;
      uint64_t seq = sequence;
      const Pop part = pop_cell(s, ignored, Take::part_of, &seq);
      if (part == Pop::corrupt) return Pop::corrupt;
      if (part == Pop::empty) break;
    }
    aref(s.ring.header().dropped).fetch_add(1, std::memory_order_relaxed);
    return r;
  }

  // Removes subscribers marked dead; their leases go with them. A detached subscriber (closed, still holding
  // tensors) delivers nothing more: a message pushed after it detached is taken back here so its lease is not lost.
  void reap() {
    for (auto it = subs_.begin(); it != subs_.end();) {
      Sub& s = **it;
      if (s.dead.load()) {
        dropped_gone_ += aref(s.ring.header().dropped).load(std::memory_order_relaxed);
        it = subs_.erase(it);
        continue;
      }
      if (s.detached()) {
        uint32_t group;
        for (int i = 0; i < 4096; ++i)
          if (pop_cell(s, group) != Pop::popped) break;
      }
      ++it;
    }
    local_count_.store(subs_.size(), std::memory_order_relaxed);
  }

  void add_subscriber(Fd sock) {
    const PeerCred cred = peer_credentials(sock.get());
    if (!opt_.allow_other_users && cred.uid != ::getuid()) return;  // refused: closing the socket tells the peer
    reap();
    if (subs_.size() + (net_ ? net_->active() : 0) >= opt_.max_subscribers) {  // local and remote together
      SubscriberChannel::refuse(sock, RefuseReason::too_many_subscribers);
      return;
    }
    std::shared_ptr<Sub> sub;
    try {
      sub = SubscriberChannel::open(sock, channel_proto_, pool_->capacity(), cred.pid, name_);
    } catch (const Error&) {
      SubscriberChannel::refuse(sock, RefuseReason::no_resources);
      return;
    }
    if (!sub) return;
    subs_.push_back(std::move(sub));
    local_count_.store(subs_.size(), std::memory_order_relaxed);
    uint64_t one = 1;
    [[maybe_unused]] ssize_t r = ::write(wake_.get(), &one, sizeof one);
  }

  void monitor() {
    std::vector<pollfd> fds;
    std::vector<std::shared_ptr<Sub>> watched;
    Clock::time_point accept_paused_until{};
    while (!stop_.load()) {
      fds.clear();
      watched.clear();
      const bool accepting = Clock::now() >= accept_paused_until;
      fds.push_back({wake_.get(), POLLIN, 0});
      fds.push_back({accepting ? listener_.get() : -1, POLLIN, 0});
      {
        std::lock_guard lock(mu_);
        for (auto& s : subs_) {
          fds.push_back({s->socket(), POLLIN | POLLRDHUP, 0});
          watched.push_back(s);
        }
      }
      if (::poll(fds.data(), fds.size(), accepting ? -1 : 100) < 0) continue;
      if (fds[0].revents) {
        uint64_t v;
        [[maybe_unused]] ssize_t r = ::read(wake_.get(), &v, sizeof v);
      }
      if (stop_.load()) break;
      // First mark the dead (no lock needed), then take the lock to remove them.
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
      if (accepting && (fds[1].revents & POLLIN)) {
        for (int n = 0; n < 64; ++n) {
          Fd s(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
          if (!s) {
            // Out of fds: the connection stays queued and the listener stays readable; pause accepting for a
            // while instead of spinning on it.
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
              accept_paused_until = Clock::now() + std::chrono::milliseconds(100);
            break;
          }
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
  pid_t pid_;
  ChannelHeader channel_proto_{};
  std::shared_ptr<Pool> pool_;
  Fd listener_, wake_;
  std::mutex send_mu_, mu_;
  std::string waiting_for_;  // (mu_) what the send or loan holding send_mu_ waits for, in words
  std::vector<std::shared_ptr<Sub>> subs_;
  uint64_t sequence_ = 0, dropped_gone_ = 0;
  std::atomic<bool> closed_{false}, stop_{false};
  bool forked_ = false;
  std::unique_ptr<std::thread> monitor_;
  std::unique_ptr<net_detail::Server> net_;  // remote subscribers (PublisherOptions::listen)
  std::atomic<size_t> local_count_{0};        // subs_.size(), for the net thread's max_subscribers check
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

namespace {
SendOptions with(const Metadata& extra, Timeout timeout) {
  SendOptions o;
  o.metadata = extra;
  o.timeout = timeout;
  return o;
}
}  // namespace

Tensor Publisher::loan(const Shape& shape, DType dtype, Timeout timeout) {
  return get(impl_, "loan").loan(shape, dtype, Device::cpu(), timeout);
}
Tensor Publisher::loan(const Shape& shape, DType dtype, Device device, Timeout timeout) {
  return get(impl_, "loan").loan(shape, dtype, device, timeout);
}
size_t Publisher::send(const Tensor& t, const Metadata& extra, Timeout timeout) {
  return send(t, with(extra, timeout));
}
size_t Publisher::send(const Message& message, const Metadata& extra, Timeout timeout) {
  return send(message, with(extra, timeout));
}
size_t Publisher::send(Message&& message, const Metadata& extra, Timeout timeout) {
  return send(std::move(message), with(extra, timeout));
}
size_t Publisher::send(Tensor&& t, const Metadata& extra, Timeout timeout) {
  return send(std::move(t), with(extra, timeout));
}
size_t Publisher::send(const Tensor& t, const SendOptions& options) {
  return get(impl_, "send").send(t, options, false);
}
size_t Publisher::send(const Message& message, const SendOptions& options) {
  return get(impl_, "send").send(message, options, false);
}
size_t Publisher::send(Message&& message, const SendOptions& options) {
  const size_t n = get(impl_, "send").send(message, options, true);
  message.tensors.clear();  // consumed only once delivered
  message.keys.clear();
  return n;
}
size_t Publisher::send(Tensor&& t, const SendOptions& options) {
  const size_t n = get(impl_, "send").send(t, options, true);
  t = Tensor();  // consumed only once delivered: a failed send leaves the caller's tensor usable
  return n;
}
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
std::string Publisher::address() const { return impl_ ? impl_->address() : std::string(); }
size_t Publisher::remote_subscriber_count() const { return impl_ ? impl_->remote_count() : 0; }

}  // namespace tw
