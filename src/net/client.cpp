// client.cpp — the subscriber's remote side (net_internal.hpp): one endpoint on the process's UCX engine
// (engine.hpp), whose thread does all of the following.
//
// It connects (and retries every 200 ms until a publisher listens there), answers the token challenge,
// then lands each DATA message in a buffer of its own — straight into place by UCX (rendezvous, an iov that puts
// each run where the layout wants it) or copied out of UCX's eager buffer — and queues it in arrival order. recv()
// takes from that queue under mu_ and gives credit back. Nothing UCX owns is ever handed to the user.
#include <netinet/in.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "core/text.hpp"
#include "net/engine.hpp"
#include "net/net_internal.hpp"
#include "net/sha256.hpp"
#include "tensorwire/device_runtime.hpp"

namespace tw::net_detail {

sockaddr_storage resolve(const HostPort& hp, bool passive, const std::string& what);
bool is_loopback(const sockaddr_storage& ss);

namespace {

constexpr auto kRetryEvery = std::chrono::milliseconds(200);

uint64_t align64(uint64_t n) { return (n + 63) & ~uint64_t{63}; }

// Memory messages land in: blocks in power-of-two size classes, kept (up to kLandingCache bytes per subscriber)
// when the last tensor of a message is gone, so a stream of same-sized messages lands in warm pages instead of
// faulting fresh ones for every message (at 16 MiB that was a third of the receive time).
constexpr size_t kLandingCache = size_t{256} << 20;

class LandingPool : public std::enable_shared_from_this<LandingPool> {
 public:
  std::shared_ptr<Buffer> get(size_t n) {
    const size_t cls = std::bit_ceil(std::max<size_t>(n, 4096));
    void* p = nullptr;
    {
      std::lock_guard lock(mu_);
      auto it = free_.find(cls);
      if (it != free_.end()) {
        p = it->second;
        free_.erase(it);
        cached_ -= cls;
      }
    }
    if (!p) {
      p = std::aligned_alloc(4096, cls);
      if (!p)
        throw Error(ErrorCode::out_of_memory, "tensorwire net: cannot allocate " + std::to_string(cls) +
                                                  " bytes for a received message");
    }
    std::shared_ptr<void> owner(p, [self = shared_from_this(), cls](void* q) { self->put(q, cls); });
    return std::make_shared<Buffer>(p, n, Device::cpu(), std::move(owner));
  }
  ~LandingPool() {
    for (auto& [cls, p] : free_) std::free(p);
  }

 private:
  void put(void* p, size_t cls) {
    {
      std::lock_guard lock(mu_);
      if (cached_ + cls <= kLandingCache) {
        free_.emplace(cls, p);
        cached_ += cls;
        return;
      }
    }
    std::free(p);
  }
  std::mutex mu_;
  std::multimap<size_t, void*> free_;
  size_t cached_ = 0;
};

class ClientImpl;

// One message on its way in.
struct Landing {
  ClientImpl* owner = nullptr;
  uint64_t desc_bytes = 0;    // kDescInData: the descriptor's size at the front of the data
  std::shared_ptr<Buffer> buffer;
  WireMessage msg;
  uint64_t data_offset = 0;   // where the first tensor's region starts (after a descriptor carried in the data)
  bool desc_in_data = false;  // the descriptor is decoded once the data is in
  bool ready = false;
  std::string error;          // the receive failed
  bool lost = false;          // ... because the connection went
  int device = -1;            // the CUDA device it lands on (UCX writes device memory), or -1: host memory
  std::vector<ucp_dt_iov_t> iov;
};

class ClientImpl final : public Client, public Session {
 public:
  ClientImpl(std::string topic, ClientOptions o) : topic_(std::move(topic)), opt_(std::move(o)) {
    hp_ = parse_host_port(opt_.connect, "connect");
    if (hp_.port == 0)
      throw Error(ErrorCode::invalid_argument, "connect='" + opt_.connect + "': port 0 is not an address a publisher "
                                               "can be at (a publisher given port 0 says its real one in address)");
    if (opt_.keepalive < std::chrono::milliseconds(100))
      throw Error(ErrorCode::invalid_argument, "keepalive must be at least 0.1 s");
    ping_every_ = std::min<std::chrono::milliseconds>(kPingEvery, opt_.keepalive / 3);
    addr_ = resolve(hp_, false, "connect='" + opt_.connect + "'");
    // A subscriber of a loopback publisher opens no UCX port on other interfaces (UCX_NET_DEVICES=lo).
    ucx_require_scope(is_loopback(addr_) ? UcxScope::loopback : UcxScope::any, "connect='" + opt_.connect + "'");
    engine_ = &Engine::get();
    cuda_path_ = ucx_cuda_path();
    event_ = os::Fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!event_) os::throw_errno("eventfd");
    engine_->attach(this, [] {});  // it connects from its first tick
  }

  ~ClientImpl() override { close(); }

  const std::string& name() const noexcept override { return topic_; }

  std::optional<Delivered> recv(std::chrono::nanoseconds timeout) override {
    const auto until = Clock::now() + std::min(timeout, std::chrono::nanoseconds(std::chrono::hours(24 * 365)));
    credit_back();
    {
      std::unique_lock lock(mu_);
      if (queue_.empty() && !ended_ && !closed_) {
        // A message UCX has for us is landed by this thread when the worker is free: no hand-off to the engine's
        // thread on the way in (a caller polling with timeout=0 gets it with no context switch at all).
        lock.unlock();
        engine_->try_progress();
      }
    }
    std::optional<Delivered> r;
    if (timeout <= std::chrono::nanoseconds::zero()) {
      std::unique_lock lock(mu_);
      r = take(lock);
      engine_->note_poll(r.has_value());
    } else {
      std::unique_lock lock(mu_);
      const auto ready = [&] { return !queue_.empty() || ended_ || closed_; };
      if (!ready()) {
        // The engine thread lands what this waits for: it must watch the worker's events (not nap beside a spinner).
        engine_->note_waiter(true);
        cv_.wait_until(lock, until, ready);
        engine_->note_waiter(false);
      }
      r = take(lock);
    }
    return r;
  }

  std::optional<Delivered> poll(PollResult& status) override {
    credit_back();
    std::optional<Delivered> r;
    {
      std::unique_lock lock(mu_, std::try_to_lock);
      if (lock.owns_lock() && queue_.empty() && !ended_ && !closed_) {
        lock.unlock();
        engine_->try_progress();  // (never waits for the worker: skipped when another thread has it)
        lock.try_lock();
      }
      if (!lock.owns_lock()) {
        status = PollResult::busy;
        return std::nullopt;
      }
      r = take(lock);
      status = r ? PollResult::message
                 : (ended_ || closed_) ? PollResult::ended : PollResult::empty;
    }
    engine_->note_poll(r.has_value());
    return r;
  }

  bool ended() const noexcept override {
    std::lock_guard lock(mu_);
    return closed_ || (ended_ && queue_.empty());
  }
  std::string why_ended() const override {
    std::lock_guard lock(mu_);
    if (closed_) return tw::detail::closed_subscriber_text(discarded_);
    return why_ended_;
  }
  bool connected() const noexcept override { return connected_.load(std::memory_order_acquire); }
  std::string waiting_for() const override {
    if (connected()) return "";
    std::lock_guard lock(mu_);
    if (ended_ || closed_) return "";
    return "not connected to " + opt_.connect + " yet" + (attempt_.empty() ? std::string() : "; last attempt: " + attempt_);
  }
  int fileno() override {
    std::lock_guard lock(mu_);
    if (!fd_mode_) {
      fd_mode_ = true;  // from now on the eventfd reads as set while a message (or the end) waits
      if (!queue_.empty() || ended_ || closed_) signal_locked();
    }
    return event_.get();
  }
  uint64_t dropped() const noexcept override { return dropped_.load(std::memory_order_relaxed); }

  void close() noexcept override {
    {
      std::lock_guard lock(mu_);
      if (!closed_) discarded_ = queue_.size();  // (one entry per message)
      closed_ = true;
      queue_.clear();
      signal_locked();
    }
    cv_.notify_all();
    stop_.store(true);
    engine_->detach(this);  // bounded: at most 2 s for receives UCX has in flight
  }

 private:
  friend struct Landing;
  enum class State { idle, connecting, auth_sent, active, ended };

  // Under mu_: the next queued message; credit for it; the fatal error once the queue is empty.
  std::optional<Delivered> take(std::unique_lock<std::mutex>&) {
    if (!queue_.empty()) {
      Delivered r = std::move(queue_.front());
      queue_.pop_front();
      if (on_full_ != Policy::drop_oldest) credits_.fetch_add(1, std::memory_order_relaxed);
      if (queue_.empty() && !ended_ && !closed_ && signaled_) {
        uint64_t v;
        [[maybe_unused]] ssize_t n = ::read(event_.get(), &v, sizeof v);
        signaled_ = false;
      }
      return r;
    }
    if (!fatal_.empty() && !closed_) throw Error(fatal_code_, fatal_);
    return std::nullopt;
  }

  // Not under mu_, at the start of each recv() and poll(): the credit taken messages earned goes back from this
  // thread when the worker is free, once there is half the depth of it. (One CREDIT per message would wake the
  // publisher's engine thread for each message, right when its user sends the next one. Half cannot stall the
  // publisher: it holds `depth` unacked only when this side holds them, and taking half of them earns the credit.
  // It goes at the next recv or poll — not between taking a message and returning it, where the send would delay
  // the message — or at the engine's next tick, 10 ms later, when the caller stops receiving.)
  void credit_back() {
    if (credits_.load(std::memory_order_relaxed) < credit_batch_.load(std::memory_order_relaxed)) return;
    if (!engine_->try_run([this] { send_credits(); })) engine_->wake();
  }

  // Holding the worker.
  void send_credits() {
    if (state_ != State::active || !ep_) return;
    if (const uint32_t n = credits_.exchange(0, std::memory_order_relaxed)) {
      send_control(NetType::credit, {}, n);
      last_credit_ = Clock::now();
    }
  }

  void note_attempt(std::string why) {
    std::lock_guard lock(mu_);
    attempt_ = std::move(why);
  }

  // Under mu_: the eventfd reads as set — only once someone asked for fileno(), and written once per set (two
  // syscalls per message otherwise, for a descriptor nobody watches).
  void signal_locked() {
    if (!fd_mode_ || signaled_) return;
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(event_.get(), &one, sizeof one);
    signaled_ = true;
  }

  // The end of a stream that raises nothing: `why` says what happened, for the end-of-stream message.
  void end_because(std::string why) {
    {
      std::lock_guard lock(mu_);
      if (why_ended_.empty()) why_ended_ = std::move(why);
    }
    end_stream();
  }

  void end_stream(const std::string& fatal = {}, ErrorCode code = ErrorCode::invalid_argument) {
    {
      std::lock_guard lock(mu_);
      if (!fatal.empty() && fatal_.empty()) {
        fatal_ = fatal;
        fatal_code_ = code;
      }
      ended_ = true;
      signal_locked();
    }
    connected_.store(false, std::memory_order_release);
    cv_.notify_all();
    state_ = State::ended;
  }

  std::string who() const { return "tensorwire.Subscriber('" + topic_ + "', connect='" + opt_.connect + "')"; }

  // ---- UCX callbacks ----------------------------------------------------------------------------------------------

  void on_ep_error(ucp_ep_h ep, ucs_status_t st) override {
    if (ep != ep_) return;
    ep_failed_ = true;
    ep_error_ = ucx_status(st);
  }

  ucs_status_t on_am(unsigned id, ucp_ep_h ep, const void* header, size_t header_length, void* data, size_t length,
                     const ucp_am_recv_param_t* param) override {
    if (ep != ep_ || state_ == State::ended || ep_failed_) return UCS_OK;
    try {
      if (id != kAmToSubscriber) throw Error(ErrorCode::invalid_argument, "a message only subscribers send");
      const auto bytes = std::span<const uint8_t>(static_cast<const uint8_t*>(header), header_length);
      const NetHeader h = decode_header(bytes);
      last_heard_ = Clock::now();
      if (h.type == NetType::data) {
        on_data(h, bytes.subspan(kNetHeaderBytes), data, length, param);
        return UCS_OK;
      }
      if (length != 0) throw Error(ErrorCode::invalid_argument, "a control message with data");
      if (h.body_bytes != header_length - kNetHeaderBytes)
        throw Error(ErrorCode::invalid_argument, "body size disagrees with the header");
      on_control(h, bytes.subspan(kNetHeaderBytes));
    } catch (const Error& e) {
      violation(e.what(), e.code() == ErrorCode::version_mismatch ? e.code() : ErrorCode::invalid_argument);
    } catch (const std::exception& e) {
      violation(e.what(), ErrorCode::internal);
    }
    return UCS_OK;
  }

  void violation(const std::string& what, ErrorCode code) {
    end_stream(who() + ": the publisher broke the protocol and was disconnected: " + what, code);
  }

  void on_control(const NetHeader& h, std::span<const uint8_t> body) {
    switch (h.type) {
      case NetType::hello: {
        if (state_ != State::connecting) throw Error(ErrorCode::invalid_argument, "a second HELLO");
        const Hello hello = decode_hello(body);
        if (!opt_.token.empty() && !hello.token_required) {
          end_stream(who() + ": a token was given, but the publisher there does not use one; it cannot prove who "
                             "it is, so nothing is received from it (drop token=, or give the publisher the token)");
          return;
        }
        if (opt_.token.empty() && hello.token_required) {
          end_stream(who() + ": the publisher requires a token; give token=... (the same secret as the publisher's)");
          return;
        }
        publisher_nonce_ = hello.nonce;
        // Silent for less than a third of the shorter keepalive: the publisher's may be shorter than this one's.
        // From scratch on each HELLO: a restarted publisher may keep a longer keepalive than the one before.
        ping_every_ = std::min({kPingEvery, opt_.keepalive / 3,
                                 std::chrono::milliseconds(hello.keepalive_ms) / 3});
        random_bytes(nonce_);
        Auth a;
        a.topic = topic_;
        a.keepalive_ms = keepalive_on_wire(opt_.keepalive);
        a.nonce = nonce_;
        if (!opt_.token.empty()) {
          a.has_proof = true;
          a.proof = client_proof(opt_.token, topic_, publisher_nonce_, nonce_);
        }
        send_control(NetType::auth, encode_auth(a));
        state_ = State::auth_sent;
        return;
      }
      case NetType::welcome: {
        if (state_ != State::auth_sent) throw Error(ErrorCode::invalid_argument, "WELCOME out of turn");
        const Welcome w = decode_welcome(body);
        if (!opt_.token.empty()) {
          const Proof want = publisher_proof(opt_.token, topic_, publisher_nonce_, nonce_);
          if (!w.has_proof || !equal_constant_time(want, w.proof)) {
            end_stream(who() + ": the publisher could not prove it knows the token; disconnected");
            return;
          }
        }
        if (w.depth > kMaxNetDepth)
          throw Error(ErrorCode::invalid_argument, "a depth of " + std::to_string(w.depth) + " (at most " +
                                                       std::to_string(kMaxNetDepth) + ")");
        depth_ = w.depth;
        credit_batch_.store(std::max<uint32_t>(1, w.depth / 2), std::memory_order_relaxed);
        {
          std::lock_guard lock(mu_);
          on_full_ = w.on_full;
        }
        state_ = State::active;
        connected_.store(true, std::memory_order_release);
        return;
      }
      case NetType::refused: {
        const std::string why = decode_refused(body);
        end_stream(who() + ": the publisher refused this subscriber: " + why);
        return;
      }
      case NetType::ping:
        return;
      case NetType::bye:
        if (state_ != State::active) throw Error(ErrorCode::invalid_argument, "BYE before WELCOME");
        bye_ = true;
        return;
      default:
        throw Error(ErrorCode::invalid_argument, "unexpected message type " + std::to_string(static_cast<int>(h.type)));
    }
  }

  // The CUDA device a message lands on when this process's UCX writes device memory: a single tensor that came from
  // a CUDA device, going to a device this process has (SubscriberOptions::device, else the one it came from).
  // -1: host memory (a host tensor, a group — whose regions UCX would need as an iov of device memory —, a
  // subscriber that asked for "cpu", a device that is not here: Subscriber::recv then moves the tensors or says
  // why it cannot).
  int landing_device(const WireMessage& m) const {
    if (!cuda_path_.direct || m.tensors.size() != 1 || m.tensors[0].cuda_origin < 0) return -1;
    int dev = m.tensors[0].cuda_origin;
    if (opt_.device) {
      if (opt_.device->type != kDLCUDA) return -1;
      dev = opt_.device->id;
    }
    return dev < device_runtime().device_count() ? dev : -1;
  }

  void on_data(const NetHeader& h, std::span<const uint8_t> body, void* data, size_t length,
               const ucp_am_recv_param_t* param) {
    if (state_ != State::active || bye_) throw Error(ErrorCode::invalid_argument, "DATA out of turn");
    if (length != h.payload_bytes) throw Error(ErrorCode::invalid_argument, "data size disagrees with the header");
    // The publisher numbers this subscriber's messages 1, 2, ..., the ones it dropped for it included: a gap is
    // what it dropped (drop_oldest), counted in dropped() like those this side drops from its own queue.
    if (h.sequence <= last_sequence_)
      throw Error(ErrorCode::invalid_argument, "message " + std::to_string(h.sequence) + " after message " +
                                                   std::to_string(last_sequence_));
    dropped_.fetch_add(h.sequence - last_sequence_ - 1, std::memory_order_relaxed);
    last_sequence_ = h.sequence;
    if (h.payload_bytes > opt_.limits.max_message_bytes) {
      abandon_after_ = who() + ": the publisher sent a message of " + std::to_string(h.payload_bytes) +
                       " bytes, more than this subscriber's max_message_bytes (" +
                       std::to_string(opt_.limits.max_message_bytes) + "); disconnected";
      end_stream(abandon_after_);
      return;
    }
    // Credit: the publisher may have `depth` messages unread here (block, raise) or in flight (drop_oldest).
    {
      std::lock_guard lock(mu_);
      const size_t held = landing_.size() + (on_full_ == Policy::drop_oldest ? 0 : queue_.size());
      if (held >= depth_) throw Error(ErrorCode::invalid_argument, "more messages than its credit allows");
    }
    const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    auto l = std::make_unique<Landing>();
    l->owner = this;
    if (h.flags & kDescInData) {
      if (!body.empty()) throw Error(ErrorCode::invalid_argument, "a descriptor in both header and data");
      if (h.body_bytes > h.payload_bytes) throw Error(ErrorCode::invalid_argument, "descriptor larger than the data");
      l->desc_in_data = true;
      l->data_offset = align64(h.body_bytes);
      l->buffer = landing_pool_->get(std::max<size_t>(static_cast<size_t>(h.payload_bytes), 1));
      l->desc_bytes = h.body_bytes;
      l->iov.push_back(ucp_dt_iov_t{l->buffer->base(), static_cast<size_t>(h.payload_bytes)});
    } else {
      if (h.body_bytes != body.size()) throw Error(ErrorCode::invalid_argument, "body size disagrees with the header");
      l->msg = decode_message(body, opt_.limits);
      uint64_t total = 0, wire = 0;
      for (const WireTensor& t : l->msg.tensors) {
        total += align64(t.span_bytes);
        wire += wire_bytes(t);
      }
      if (wire != h.payload_bytes)
        throw Error(ErrorCode::invalid_argument, "the descriptor accounts for " + std::to_string(wire) +
                                                     " bytes of data, the message has " + std::to_string(h.payload_bytes));
      // Only a rendezvous lands in device memory: an eager message's bytes are already in host memory (UCX's),
      // and copying them to the device is left to recv, on the caller's thread (the message says "ucx-staged").
      l->device = rndv ? landing_device(l->msg) : -1;
      if (l->device >= 0) {
        // Device memory from the pool, idle: UCX writes it outside any stream (a block no queued work uses, or fresh
        // memory: the host never waits here, since this thread serves every session of the process). Its readers
        // may use any stream: it goes back once the device's work by then is done.
        try {
          l->buffer = device_runtime().allocate_idle(Device::cuda(l->device),
                                                      std::max<size_t>(static_cast<size_t>(total), 1), true);
        } catch (const Error&) {  // (out of device memory: it lands in host memory, and recv says what goes wrong)
          l->device = -1;
          l->buffer.reset();
        }
      }
      if (!l->buffer) l->buffer = landing_pool_->get(std::max<size_t>(static_cast<size_t>(total), 1));
      char* base = static_cast<char*>(l->buffer->base());
      uint64_t region = 0;
      for (const WireTensor& t : l->msg.tensors) {
        if (t.carry == Carry::runs) {
          for_each_run(t.layout, [&](uint64_t off, uint64_t n) {
            l->iov.push_back(ucp_dt_iov_t{base + region + off, static_cast<size_t>(n)});
          });
        } else if (t.span_bytes) {
          l->iov.push_back(ucp_dt_iov_t{base + region, static_cast<size_t>(t.span_bytes)});
        }
        region += align64(t.span_bytes);
      }
    }
    Landing* lp = l.get();
    landing_.push_back(std::move(l));
    if (!rndv) {
      const char* src = static_cast<const char*>(data);
      for (const ucp_dt_iov_t& e : lp->iov) {
        std::memcpy(e.buffer, src, e.length);
        src += e.length;
      }
      complete(lp, UCS_OK);
      return;
    }
    ucp_request_param_t rp{};
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    rp.cb.recv_am = &ClientImpl::recv_done;
    rp.user_data = lp;
    rp.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMORY_TYPE;  // (said, as the publisher does: see Server::post)
    rp.memory_type = lp->device >= 0 ? cuda_path_.memory_type : UCS_MEMORY_TYPE_HOST;
    const void* buf = nullptr;
    size_t count = 0;
    if (lp->iov.size() == 1) {
      buf = lp->iov[0].buffer;
      count = lp->iov[0].length;
    } else if (lp->iov.size() > 1) {
      rp.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
      rp.datatype = ucp_dt_make_iov();
      buf = lp->iov.data();
      count = lp->iov.size();
    }
    ++receiving_;
    ucs_status_t st;
    const ucs_status_ptr_t r = ucx().am_recv_data_nbx(engine_->worker(), data, const_cast<void*>(buf), count, &rp);
    if (done_now(r, st)) {
      --receiving_;
      complete(lp, st);
    }
  }

  static void recv_done(void* request, ucs_status_t st, size_t, void* user) noexcept {
    auto* lp = static_cast<Landing*>(user);
    if (!lp->owner) {  // its subscriber finished without it (abandon_landing): only the Landing is left
      delete lp;
      if (request) ucx().request_free(request);
      return;
    }
    --lp->owner->receiving_;
    try {
      lp->owner->complete(lp, st);
    } catch (...) {  // out of memory delivering it: the stream ends (never through UCX's C frames)
      lp->owner->end_stream(lp->owner->who() + ": out of memory receiving a message", ErrorCode::out_of_memory);
    }
    if (request) ucx().request_free(request);
  }

  void complete(Landing* lp, ucs_status_t st) {
    if (st != UCS_OK) {
      lp->lost = true;  // the connection went while the data was on its way: the stream ends, nobody broke it
      lp->error = "receiving a message failed: " + ucx_status(st);
    } else if (lp->desc_in_data) {
      try {
        const uint64_t n = lp->desc_bytes;
        const auto* b = static_cast<const uint8_t*>(lp->buffer->base());
        lp->msg = decode_message({b, static_cast<size_t>(n)}, opt_.limits);
        uint64_t need = lp->data_offset;
        for (const WireTensor& t : lp->msg.tensors) {
          if (t.carry == Carry::runs) throw Error(ErrorCode::invalid_argument, "runs with the descriptor in the data");
          need += align64(t.span_bytes);
        }
        if (need > lp->buffer->size() + 63 || need < lp->buffer->size())
          throw Error(ErrorCode::invalid_argument, "the descriptor disagrees with the data's size");
        uint64_t region = lp->data_offset;
        for (const WireTensor& t : lp->msg.tensors) {
          if (region + t.span_bytes > lp->buffer->size())
            throw Error(ErrorCode::invalid_argument, "a tensor beyond the data");
          region += align64(t.span_bytes);
        }
      } catch (const Error& e) {
        lp->error = e.what();
      }
    }
    lp->ready = true;
    deliver();
  }

  // Moves landed messages, in arrival order, to the user's queue.
  void deliver() {
    while (!abandoned_ && !landing_.empty() && landing_.front()->ready) {
      std::unique_ptr<Landing> l = std::move(landing_.front());
      landing_.pop_front();
      if (l->lost) {
        end_because("the connection to the publisher at " + opt_.connect + " was lost while a message arrived");
        return;
      }
      if (!l->error.empty()) {
        violation(l->error, ErrorCode::invalid_argument);
        return;
      }
      Delivered r;
      r.single = l->msg.kind == 0;
      r.kind = r.single ? uint8_t{0} : static_cast<uint8_t>(l->msg.kind - 1);
      r.keys = std::move(l->msg.keys);
      uint64_t region = l->data_offset;
      char* base = static_cast<char*>(l->buffer->base());
      const Device where = l->device >= 0 ? Device::cuda(l->device) : Device::cpu();
      for (WireTensor& t : l->msg.tensors) {
        // Each tensor its own Buffer (its region), all owning the landed allocation.
        auto b = std::make_shared<Buffer>(base + region, static_cast<size_t>(t.span_bytes), where,
                                          std::shared_ptr<const void>(l->buffer, l->buffer.get()));
        // "ucx-cuda": device memory to device memory, each side's UCX moving it; "ucx-staged": through host
        // memory on at least one side.
        b->set_transport(t.cuda_origin >= 0 ? (t.cuda_direct && l->device >= 0 ? "ucx-cuda" : "ucx-staged")
                         : t.carry == Carry::packed ? "ucx-packed" : "ucx");
        Tensor x = Tensor::make(std::move(b), std::move(t.layout), true);
        if (!t.metadata.empty()) x.metadata() = std::move(t.metadata);
        r.tensors.push_back(std::move(x));
        r.cuda_origin.push_back(t.cuda_origin);
        region += align64(t.span_bytes);
      }
      {
        std::lock_guard lock(mu_);
        if (closed_) return;
        queue_.push_back(std::move(r));
        if (on_full_ == Policy::drop_oldest) {
          credits_.fetch_add(1, std::memory_order_relaxed);
          while (queue_.size() > depth_) {
            queue_.pop_front();
            dropped_.fetch_add(1, std::memory_order_relaxed);
          }
        }
        signal_locked();
      }
      cv_.notify_one();
    }
    if (credits_.load(std::memory_order_relaxed) >= credit_batch_.load(std::memory_order_relaxed)) send_credits();
  }

  // ---- sending (the thread) ---------------------------------------------------------------------------------------

  struct SendCtx {
    std::vector<uint8_t> header;
  };

  static void send_done(void* request, ucs_status_t, void* user) {
    delete static_cast<SendCtx*>(user);
    if (request) ucx().request_free(request);
  }

  void send_control(NetType type, const std::string& body, uint64_t seq = 0) {
    if (!ep_) return;
    auto* ctx = new SendCtx{control_message(type, body, seq)};
    ucp_request_param_t rp{};
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    rp.cb.send = &ClientImpl::send_done;
    rp.user_data = ctx;
    rp.flags = UCP_AM_SEND_FLAG_REPLY;  // the publisher tells its subscribers apart by the reply endpoint
    last_sent_ = Clock::now();
    ucs_status_t st;
    const ucs_status_ptr_t r =
        ucx().am_send_nbx(ep_, kAmToPublisher, ctx->header.data(), ctx->header.size(), nullptr, 0, &rp);
    if (done_now(r, st)) delete ctx;
  }

  // ---- the thread -------------------------------------------------------------------------------------------------

  void connect() {
    ucp_ep_params_t p{};
    p.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
    p.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    p.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr_);
    p.sockaddr.addrlen = addr_.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
    ep_failed_ = false;
    const ucs_status_t st = engine_->create_ep(this, p, &ep_);
    if (st != UCS_OK) {
      ep_ = nullptr;
      note_attempt(ucx_status(st));
      return;
    }
    state_ = State::connecting;
    since_ = last_heard_ = last_sent_ = Clock::now();
  }

  // The engine closes it in the background; nothing about it reaches this session any more.
  void close_ep(bool force) {
    engine_->close_ep(ep_, force);
    ep_ = nullptr;
  }

  bool tick(Clock::time_point now) override {
    if (stop_.load()) {
      if (!stopping_) {
        stopping_ = true;
        stop_by_ = now + std::chrono::seconds(2);
        abandon_landing();
      }
      if (receiving_ > 0 && now < stop_by_) return true;  // UCX fails them once the endpoint is closed
      // A receive UCX still has is left to it: its Landing (and buffer) goes when it completes, if ever.
      for (auto& l : landing_)
        if (!l->ready) {
          l->owner = nullptr;
          (void)l.release();
        }
      landing_.clear();
      receiving_ = 0;
      return false;
    }
    if (state_ == State::idle && now >= next_try_) {
      connect();
      next_try_ = now + kRetryEvery;
    }
    if (ep_failed_ && ep_) {
      if (state_ == State::active) {
        // Lost after it was up: what landed whole was delivered already, received tensors stay valid, and the
        // stream ends.
        // (After its BYE, with everything landed, the publisher's hang-up is the close it announced.)
        const bool said_bye = bye_ && landing_.empty();
        abandon_landing();
        end_because(said_bye ? "the publisher at " + opt_.connect + " closed the topic"
                             : "the connection to the publisher at " + opt_.connect + " was lost (" + ep_error_ + ")");
      } else if (state_ != State::ended) {
        note_attempt(ep_error_ + (state_ == State::connecting ? " (is a publisher listening there?)" : ""));
        close_ep(true);
        state_ = State::idle;  // not there yet (or it went during the handshake): try again
      } else {
        close_ep(true);
      }
    }
    if ((state_ == State::connecting || state_ == State::auth_sent) && now - since_ > kHandshakeTimeout) {
      note_attempt("no answer to the handshake within 5 s (is it a tensorwire publisher?)");
      close_ep(true);
      state_ = State::idle;
    }
    if (state_ == State::active) {
      // A batch is due, or a remainder has waited 10 ms (e.g. a publisher that stopped sending).
      if (credits_.load(std::memory_order_relaxed) >= credit_batch_.load(std::memory_order_relaxed) ||
          now - last_credit_ >= std::chrono::milliseconds(10))
        send_credits();
      if (bye_ && landing_.empty()) {
        close_ep(false);
        end_because("the publisher at " + opt_.connect + " closed the topic");
      } else if (now - last_heard_ > opt_.keepalive) {
        abandon_landing();
        char secs[32];
        std::snprintf(secs, sizeof secs, "%g", static_cast<double>(opt_.keepalive.count()) / 1000.0);
        // the publisher went silent: its machine or the link is gone
        end_because("the publisher at " + opt_.connect + " was silent for longer than the keepalive (" + secs +
                    " s): its process, its machine or the link is gone");
      } else if (now - last_sent_ >= ping_every_) {
        send_control(NetType::ping, {});
      }
    }
    if (state_ == State::ended && ep_) close_ep(true);
    return true;
  }

  // Closes the endpoint (UCX then fails the receives in flight) and delivers nothing more: the messages still
  // landing are dropped when this session finishes (never freed under UCX's feet while a receive is in flight).
  void abandon_landing() {
    close_ep(true);
    abandoned_ = true;
  }

  std::string topic_;
  ClientOptions opt_;
  HostPort hp_;
  sockaddr_storage addr_{};
  Engine* engine_ = nullptr;
  os::Fd event_;
  bool fd_mode_ = false;   // under mu_: fileno() was asked for
  bool signaled_ = false;  // under mu_: event_ is set
  std::atomic<bool> stop_{false};
  // -- holding the worker (engine.hpp) --
  bool stopping_ = false, abandoned_ = false;
  Clock::time_point stop_by_{}, next_try_{}, last_credit_{};
  ucp_ep_h ep_ = nullptr;
  bool ep_failed_ = false;
  std::string ep_error_;
  State state_ = State::idle;
  Nonce nonce_{}, publisher_nonce_{};
  uint32_t depth_ = 1;
  bool bye_ = false;
  Clock::time_point since_{}, last_heard_{}, last_sent_{};
  // A second, or a third of the shorter of the two keepalives (this one's, and the publisher's from HELLO).
  std::chrono::milliseconds ping_every_{kPingEvery};
  std::deque<std::unique_ptr<Landing>> landing_;
  CudaPath cuda_path_;  // (set before the engine runs anything of ours)
  std::shared_ptr<LandingPool> landing_pool_ = std::make_shared<LandingPool>();
  size_t receiving_ = 0;
  std::string abandon_after_;
  std::atomic<uint32_t> credits_{0};
  std::atomic<uint32_t> credit_batch_{1};  // credit goes back in batches of this many (half the depth)
  std::atomic<bool> connected_{false};
  std::atomic<uint64_t> dropped_{0};
  uint64_t last_sequence_ = 0;  // the last DATA's number (holding the worker)
  // -- under mu_ --
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Delivered> queue_;
  Policy on_full_ = Policy::block;
  bool ended_ = false, closed_ = false;
  uint64_t discarded_ = 0;  // messages close() found queued and discarded unread
  std::string fatal_;
  std::string attempt_;  // why the last connection attempt failed
  std::string why_ended_;  // why the stream ended (under mu_)
  ErrorCode fatal_code_ = ErrorCode::invalid_argument;
};

}  // namespace

std::unique_ptr<Client> Client::create(std::string topic, ClientOptions options) {
  return std::make_unique<ClientImpl>(std::move(topic), std::move(options));
}

}  // namespace tw::net_detail
