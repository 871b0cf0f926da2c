// server.cpp — the publisher's remote side (net_internal.hpp): a listener and one endpoint per remote subscriber,
// on the process's UCX engine (engine.hpp).
//
// Threads: the publisher's send() only touches the queues, under mu_, and wakes the engine; every UCX call is made
// on the engine's thread. A remote subscriber is a Peer: handshake, then active; dead once UCX reports its endpoint failed,
// it broke the protocol or it went silent past the keepalive. A dead peer's queued messages are released at once
// (and with them their hold on pool buffers), so it never stalls the publisher or the other subscribers.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <atomic>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "net/engine.hpp"
#include "net/net_internal.hpp"
#include "net/sha256.hpp"

namespace tw::net_detail {

namespace {

constexpr size_t kMaxHandshakes = 64;  // connections not yet authenticated, at once
constexpr auto kCloseDrain = std::chrono::milliseconds(5000);
const uint8_t kZeros[64] = {};

std::string sockaddr_str(const sockaddr_storage& ss) {
  char host[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    port = ntohs(a->sin_port);
    return std::string(host) + ":" + std::to_string(port);
  }
  if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    port = ntohs(a->sin6_port);
    std::string r = "[";
    r += host;
    r += "]:";
    r += std::to_string(port);
    return r;
  }
  return "?";
}

// Whether UCX moves an iov without staging it on this endpoint: RDMA (verbs) or shared-memory transports. Over TCP
// it sends each entry on its own, and packing first was faster at every run size measured (bench/RESULTS.md,
// "Across machines"). UCX 1.13 has no query for an endpoint's transports: its own description is read instead.
bool zero_copy_iov(ucp_ep_h ep) {
  // TW_NET_IOV=1 / 0 overrides the choice (measurements, tests of the runs path over any transport).
  if (const char* force = std::getenv("TW_NET_IOV"); force && (*force == '0' || *force == '1')) return *force == '1';
  char* text = nullptr;
  size_t len = 0;
  FILE* f = ::open_memstream(&text, &len);
  if (!f) return false;
  ucx().ep_print_info(ep, f);
  std::fclose(f);
  const std::string s(text ? text : "", len);
  std::free(text);
  if (std::getenv("TW_NET_DEBUG")) std::fprintf(stderr, "tensorwire net: endpoint lanes:\n%s\n", s.c_str());
  for (const char* tl : {"rc_verbs", "rc_mlx5", "dc_mlx5", "ud_verbs", "ud_mlx5", "cma/", "knem/", "xpmem/"})
    if (s.find(tl) != std::string::npos) return true;
  return false;
}

}  // namespace

bool is_loopback(const sockaddr_storage& ss) {
  if (ss.ss_family == AF_INET)
    return (ntohl(reinterpret_cast<const sockaddr_in*>(&ss)->sin_addr.s_addr) >> 24) == 127;
  if (ss.ss_family == AF_INET6) return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_addr);
  return false;
}

/// The address family of UCX's TCP interfaces: the first of UCX_TCP_AF_PRIO ("inet,inet6" when unset: IPv4).
int ucx_tcp_family() {
  const char* prio = std::getenv("UCX_TCP_AF_PRIO");
  std::string first = prio ? std::string(prio).substr(0, std::string(prio).find(',')) : "";
  first.erase(std::remove_if(first.begin(), first.end(), [](char c) { return c == ' ' || c == '\t'; }), first.end());
  return first == "inet6" ? AF_INET6 : AF_INET;
}

/// Resolves a listen or connect address (numeric or a name); a missing host is loopback (127.0.0.1, or ::1 with
/// IPv6 interfaces). Only addresses of the
/// family of UCX's TCP interfaces are taken: when the connection manager's family differs from theirs, UCX's TCP
/// transport reads a peer's IPv4 interface address as an IPv6 one and corrupts the heap (UCX 1.13 and 1.22, both
/// ends, as soon as a subscriber connects); with IPv6 interfaces (UCX_TCP_AF_PRIO=inet6), an IPv4 connection
/// never completes. A name resolves in that family; an address of the other one is refused saying so.
sockaddr_storage resolve(const HostPort& hp, bool passive, const std::string& what) {
  const int family = ucx_tcp_family();
  addrinfo hints{};
  hints.ai_family = family;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  const std::string host = hp.host.empty() ? (family == AF_INET6 ? "::1" : "127.0.0.1") : hp.host;
  const std::string port = std::to_string(hp.port);
  const int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0 || !res) {
    addrinfo other = hints;
    other.ai_family = family == AF_INET6 ? AF_INET : AF_INET6;
    addrinfo* o = nullptr;
    if (::getaddrinfo(host.c_str(), port.c_str(), &other, &o) == 0 && o) {
      ::freeaddrinfo(o);
      if (family == AF_INET)
        throw Error(ErrorCode::invalid_argument,
                    what + ": '" + host + "' is an IPv6 address (or a name with IPv6 addresses only), but UCX's TCP "
                    "transport uses IPv4 interfaces here, and UCX corrupts its memory when the two families differ. "
                    "For IPv6, set UCX_TCP_AF_PRIO=inet6 in the environment of every process before its first "
                    "listen=/connect= (UCX 1.22 then works; 1.13 does not; IPv4 addresses are refused then)");
      throw Error(ErrorCode::invalid_argument,
                  what + ": '" + host + "' is an IPv4 address (or a name with IPv4 addresses only), but "
                  "UCX_TCP_AF_PRIO=" + std::getenv("UCX_TCP_AF_PRIO") + " gives UCX's TCP transport IPv6 interfaces, "
                  "with which an IPv4 connection never completes; use an IPv6 address, or unset UCX_TCP_AF_PRIO");
    }
    throw Error(ErrorCode::invalid_argument, what + ": cannot resolve host '" + host + "': " + ::gai_strerror(rc));
  }
  sockaddr_storage ss{};
  std::memcpy(&ss, res->ai_addr, std::min<size_t>(res->ai_addrlen, sizeof ss));
  ::freeaddrinfo(res);
  return ss;
}

namespace {

class ServerImpl final : public Server, public Session {
 public:
  ServerImpl(std::string topic, ServerOptions o) : topic_(std::move(topic)), opt_(std::move(o)) {
    const HostPort hp = parse_host_port(opt_.listen, "listen");
    const sockaddr_storage ss = resolve(hp, true, "listen='" + opt_.listen + "'");
    if (!is_loopback(ss) && opt_.token.empty() && !opt_.insecure)
      throw Error(ErrorCode::invalid_argument,
                  "listen='" + opt_.listen + "' accepts subscribers from other machines: give token=... (a shared "
                  "secret every subscriber must prove; it never crosses the network) or, on a network you trust, "
                  "insecure=True. Data is never encrypted either way");
    if (opt_.depth < 1) throw Error(ErrorCode::invalid_argument, "depth must be at least 1");
    if (opt_.depth > kMaxNetDepth)
      throw Error(ErrorCode::invalid_argument, "a publisher with listen= has a depth of at most " +
                                                   std::to_string(kMaxNetDepth) + " (remote subscribers take no more "
                                                   "messages in flight), not " + std::to_string(opt_.depth));
    if (opt_.keepalive < std::chrono::milliseconds(100))
      throw Error(ErrorCode::invalid_argument, "keepalive must be at least 0.1 s");
    ping_every_ = std::min<std::chrono::milliseconds>(kPingEvery, opt_.keepalive / 3);
    // A loopback listener's process opens no UCX port on other interfaces either (UCX_NET_DEVICES=lo).
    ucx_require_scope(is_loopback(ss) ? UcxScope::loopback : UcxScope::any, "listen='" + opt_.listen + "'");
    engine_ = &Engine::get();
    cuda_path_ = ucx_cuda_path();
    // The listener is made on the engine's thread, which from then on serves it.
    engine_->attach(this, [&] {
      max_header_ = engine_->max_am_header();
      const UcxApi& api = ucx();
      ucp_listener_params_t lp{};
      lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
      lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&ss);
      lp.sockaddr.addrlen = ss.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
      lp.conn_handler.cb = &ServerImpl::on_conn;
      lp.conn_handler.arg = this;
      const ucs_status_t st = api.listener_create(engine_->worker(), &lp, &listener_);
      if (st != UCS_OK)
        throw Error(st == UCS_ERR_BUSY ? ErrorCode::invalid_argument : ErrorCode::unsupported,
                    "tensorwire.Publisher('" + topic_ + "'): cannot listen on '" + opt_.listen + "': " +
                        ucx_status(st) + (st == UCS_ERR_BUSY ? " (the address is in use)" : ""));
      ucp_listener_attr_t la{};
      la.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
      address_ = api.listener_query(listener_, &la) == UCS_OK ? sockaddr_str(la.sockaddr) : opt_.listen;
    });
  }

  ~ServerImpl() override { close(); }

  std::string address() const override { return address_; }
  size_t max_header() const override { return max_header_; }
  bool cuda_direct() const override { return cuda_path_.direct; }

  size_t active() const override {
    std::lock_guard lock(mu_);
    size_t n = 0;
    for (auto& [id, p] : peers_) n += p->state == State::active ? 1u : 0u;
    return n;
  }

  bool runs_worthwhile() const override {
    std::lock_guard lock(mu_);
    bool any = false;
    for (auto& [id, p] : peers_) {
      if (p->state != State::active) continue;
      if (!p->iov_ok) return false;
      any = true;
    }
    return any;
  }

  bool room(size_t n, std::string& who) override {
    if (opt_.on_full == Policy::drop_oldest) return true;
    std::lock_guard lock(mu_);
    for (auto& [id, p] : peers_) {
      if (p->state != State::active) continue;
      if (p->pending.size() + p->unacked + n > opt_.depth) {
        who = "a remote subscriber (" + p->where + ") has " + std::to_string(p->pending.size() + p->unacked) +
              " unread messages of depth " + std::to_string(opt_.depth);
        return false;
      }
    }
    return true;
  }

  size_t enqueue(std::shared_ptr<OutMessage> m) override {
    size_t n = 0;
    {
      std::lock_guard lock(mu_);
      if (closing_) return 0;
      for (auto& [id, p] : peers_) {
        if (p->state != State::active) continue;
        if (opt_.on_full == Policy::drop_oldest && p->pending.size() >= opt_.depth) {
          p->pending.pop_front();
          ++p->dropped;
          ++dropped_;
        }
        p->pending.push_back(m);
        ++n;
      }
    }
    // Posted from this thread when the worker is free (no hand-off to the engine's thread), else by the engine.
    if (n && !engine_->try_run([this] { post_all(); })) engine_->wake();
    return n;
  }

  uint64_t dropped() const override { return dropped_.load(std::memory_order_relaxed); }

  bool drop_oldest_pending() override {
    std::lock_guard lock(mu_);
    Peer* victim = nullptr;
    for (auto& [id, p] : peers_)
      if (p->state == State::active && !p->pending.empty() && (!victim || p->pending.size() > victim->pending.size()))
        victim = p.get();
    if (!victim) return false;
    victim->pending.pop_front();  // releases its hold on the pool buffer
    ++victim->dropped;
    ++dropped_;
    return true;
  }

  void close() noexcept override {
    {
      std::lock_guard lock(mu_);
      closing_ = true;
    }
    engine_->detach(this);  // its own deadlines bound the wait (kCloseDrain, then 2 s for UCX)
  }

 private:
  enum class State { hello_sent, active, closing, dead };

  struct Peer {
    uint64_t id = 0;
    ucp_ep_h ep = nullptr;
    std::string where;
    std::atomic<State> state{State::hello_sent};
    Nonce nonce{};
    Clock::time_point since{}, last_heard{}, last_sent{};
    std::chrono::milliseconds ping_every{kPingEvery};  // the publisher's, or a third of the subscriber's keepalive
    // -- under mu_ (send() reads and appends) --
    std::deque<std::shared_ptr<OutMessage>> pending;
    uint32_t unacked = 0;  // posted, not yet credited back
    uint64_t dropped = 0;
    uint64_t sent = 0;  // DATA posted (with `dropped`, what numbers the next one: NetHeader::sequence)
    bool iov_ok = false;  // its transport moves an iov without staging it
    // -- holding the worker (engine.hpp) --
    size_t requests = 0;  // UCX sends in flight
    bool bye_sent = false;
    bool closed = false;  // its endpoint is closed (or closing, in the engine's hands)
    std::string why;  // why it went (diagnostics)
  };

  // (It touches nothing of the ServerImpl: a send UCX completes after the publisher gave up waiting for it finds
  // its peer and message still alive.)
  struct SendCtx {
    std::shared_ptr<Peer> peer;
    std::shared_ptr<OutMessage> msg;
    std::vector<uint8_t> header;
    std::vector<ucp_dt_iov_t> iov;
  };

  // ---- UCX callbacks (on the engine thread, inside progress) ---------------------------------------------------

  static void on_conn(ucp_conn_request_h req, void* arg) noexcept {
    try {
      accept(static_cast<ServerImpl*>(arg), req);
    } catch (...) {  // out of memory: the connection is not taken
    }
  }

  static void accept(ServerImpl* self, ucp_conn_request_h req) {
    const UcxApi& api = ucx();
    size_t handshakes = 0, total = 0;
    {
      std::lock_guard lock(self->mu_);
      for (auto& [id, p] : self->peers_) {
        handshakes += p->state == State::hello_sent ? 1u : 0u;
        ++total;
      }
      if (self->closing_ || handshakes >= kMaxHandshakes || total >= self->opt_.max_subscribers + kMaxHandshakes) {
        api.listener_reject(self->listener_, req);
        return;
      }
    }
    auto peer = std::make_shared<Peer>();
    peer->id = ++self->next_id_;
    ucp_conn_request_attr_t ca{};
    ca.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
    peer->where = api.conn_request_query(req, &ca) == UCS_OK ? sockaddr_str(ca.client_address) : "?";
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST;
    ep.conn_request = req;
    if (self->engine_->create_ep(self, ep, &peer->ep) != UCS_OK) return;
    peer->since = peer->last_heard = peer->last_sent = Clock::now();
    try {
      random_bytes(peer->nonce);
    } catch (const Error&) {
      peer->state = State::dead;
    }
    {
      std::lock_guard lock(self->mu_);
      self->peers_[peer->id] = peer;
      self->by_ep_[peer->ep] = peer->id;
    }
    if (peer->state == State::dead) return;
    Hello h;
    h.nonce = peer->nonce;
    h.token_required = !self->opt_.token.empty();
    h.keepalive_ms = keepalive_on_wire(self->opt_.keepalive);
    self->send_control(peer, NetType::hello, encode_hello(h));
  }

  std::shared_ptr<Peer> peer_of(ucp_ep_h ep) {
    std::lock_guard lock(mu_);
    auto it = by_ep_.find(ep);
    if (it == by_ep_.end()) return nullptr;
    auto pit = peers_.find(it->second);
    return pit == peers_.end() ? nullptr : pit->second;
  }

  void on_ep_error(ucp_ep_h ep, ucs_status_t st) override {
    const std::shared_ptr<Peer> p = peer_of(ep);
    if (p && p->state != State::dead) {
      p->why = "connection lost: " + ucx_status(st);
      p->state = State::dead;
    }
  }

  ucs_status_t on_am(unsigned id, ucp_ep_h ep, const void* header, size_t header_length, void*, size_t length,
                     const ucp_am_recv_param_t*) override {
    const std::shared_ptr<Peer> peer = peer_of(ep);
    if (!peer || peer->state == State::dead) return UCS_OK;
    try {
      if (id != kAmToPublisher) throw Error(ErrorCode::invalid_argument, "a message only publishers send");
      if (length != 0) throw Error(ErrorCode::invalid_argument, "a subscriber sent data");
      const auto bytes = std::span<const uint8_t>(static_cast<const uint8_t*>(header), header_length);
      const NetHeader h = decode_header(bytes);
      if (h.body_bytes != header_length - kNetHeaderBytes)
        throw Error(ErrorCode::invalid_argument, "body size disagrees with the header");
      on_message(peer, h, bytes.subspan(kNetHeaderBytes));
    } catch (const std::exception& e) {
      drop(peer, std::string("protocol violation: ") + e.what());
    }
    return UCS_OK;
  }

  void on_message(const std::shared_ptr<Peer>& p, const NetHeader& h, std::span<const uint8_t> body) {
    p->last_heard = Clock::now();
    switch (h.type) {
      case NetType::auth: {
        if (p->state != State::hello_sent) throw Error(ErrorCode::invalid_argument, "a second AUTH");
        const Auth a = decode_auth(body);
        p->ping_every = std::min(ping_every_, std::chrono::milliseconds(a.keepalive_ms) / 3);
        std::string refuse;
        if (a.topic != topic_) {
          refuse = "this publisher serves topic '" + topic_ + "', not '" + a.topic + "'";
        } else if (!opt_.token.empty()) {
          const Proof want = client_proof(opt_.token, topic_, p->nonce, a.nonce);
          if (!a.has_proof)
            refuse = "the publisher of '" + topic_ + "' requires a token (give token=... to the Subscriber)";
          else if (!equal_constant_time(want, a.proof))
            refuse = "wrong token for the publisher of '" + topic_ + "'";
        }
        if (refuse.empty()) {
          const size_t local = opt_.local_count ? opt_.local_count() : 0;
          std::lock_guard lock(mu_);
          size_t n = local;
          for (auto& [id, q] : peers_) n += q->state == State::active ? 1u : 0u;
          if (n >= opt_.max_subscribers)
            refuse = "the publisher of '" + topic_ + "' serves " + std::to_string(n) +
                     " subscribers already (max_subscribers)";
        }
        if (!refuse.empty()) {
          send_control(p, NetType::refused, encode_refused(refuse));
          p->why = refuse;
          p->state = State::closing;  // hang up once the refusal is out
          return;
        }
        Welcome w;
        w.depth = opt_.depth;
        w.on_full = opt_.on_full;
        if (!opt_.token.empty()) {
          w.has_proof = true;
          w.proof = publisher_proof(opt_.token, topic_, p->nonce, a.nonce);
        }
        send_control(p, NetType::welcome, encode_welcome(w));
        const bool iov = zero_copy_iov(p->ep);
        std::lock_guard lock(mu_);
        p->iov_ok = iov;
        p->state = State::active;
        return;
      }
      case NetType::credit: {
        if (p->state != State::active) throw Error(ErrorCode::invalid_argument, "CREDIT before WELCOME");
        std::lock_guard lock(mu_);
        if (h.sequence > p->unacked)
          throw Error(ErrorCode::invalid_argument, "credit for " + std::to_string(h.sequence) + " messages, " +
                                                       std::to_string(p->unacked) + " were sent");
        p->unacked -= static_cast<uint32_t>(h.sequence);
        return;
      }
      case NetType::ping:
        return;
      default:
        throw Error(ErrorCode::invalid_argument, "unexpected message type " + std::to_string(static_cast<int>(h.type)));
    }
  }

  static void send_done(void* request, ucs_status_t st, void* user) noexcept {
    auto* ctx = static_cast<SendCtx*>(user);
    try {
      finish_send(ctx, st);
    } catch (...) {  // (out of memory describing the failure: never through UCX's C frames)
    }
    if (request) ucx().request_free(request);
  }

  static void finish_send(SendCtx* ctx, ucs_status_t st) {
    Peer& p = *ctx->peer;
    --p.requests;
    if (st != UCS_OK && st != UCS_ERR_CANCELED && p.state != State::dead) {
      p.why = "send failed: " + ucx_status(st);
      p.state = State::dead;
    }
    delete ctx;
  }

  // ---- sending ----------------------------------------------------------------------------------------------------

  void post(SendCtx* ctx, const void* buffer, size_t count, bool iov) {
    Peer& p = *ctx->peer;
    ucp_request_param_t rp{};
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    rp.cb.send = &ServerImpl::send_done;
    rp.user_data = ctx;
    rp.flags = UCP_AM_SEND_FLAG_REPLY;  // the subscriber's engine tells its sessions apart by the reply endpoint
    if (count > 0) {
      // Said, never left to UCX to detect: a declared host type is trusted as it is (no lookup per send), and a
      // device one is checked by UCX against what it knows of the address.
      rp.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMORY_TYPE;
      rp.memory_type = ctx->msg && ctx->msg->device_memory ? cuda_path_.memory_type : UCS_MEMORY_TYPE_HOST;
    }
    if (iov) {
      rp.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
      rp.datatype = ucp_dt_make_iov();
    }
    ++p.requests;
    p.last_sent = Clock::now();
    ucs_status_t st;
    const ucs_status_ptr_t r = ucx().am_send_nbx(p.ep, kAmToSubscriber, ctx->header.data(), ctx->header.size(),
                                                 buffer, count, &rp);
    if (done_now(r, st)) finish_send(ctx, st);
  }

  void send_control(const std::shared_ptr<Peer>& p, NetType type, const std::string& body, uint64_t seq = 0) {
    auto* ctx = new SendCtx{p, nullptr, control_message(type, body, seq), {}};
    post(ctx, nullptr, 0, false);
  }

  void send_data(const std::shared_ptr<Peer>& p, std::shared_ptr<OutMessage> m, uint64_t number) {
    auto* ctx = new SendCtx{p, std::move(m), {}, {}};
    const OutMessage& msg = *ctx->msg;
    NetHeader h;
    h.type = NetType::data;
    h.sequence = number;
    h.body_bytes = static_cast<uint32_t>(msg.descriptor.size());
    const bool in_header = kNetHeaderBytes + msg.descriptor.size() <= max_header_;
    if (msg.device_memory && !in_header) {  // (remote_message checked: the padding below is host memory)
      drop(p, "internal error: a message in device memory whose descriptor does not fit UCX's header");
      delete ctx;
      return;
    }
    auto& iov = ctx->iov;
    const auto add = [&iov](const void* ptr, size_t n) {
      if (n == 0) return;
      iov.push_back(ucp_dt_iov_t{const_cast<void*>(ptr), n});
    };
    uint64_t payload = 0;
    if (in_header) {
      ctx->header.resize(kNetHeaderBytes + msg.descriptor.size());
      std::memcpy(ctx->header.data() + kNetHeaderBytes, msg.descriptor.data(), msg.descriptor.size());
      for (const OutTensor& t : msg.tensors) {
        if (t.wire.carry == Carry::runs) {
          for_each_run(t.wire.layout, [&](uint64_t off, uint64_t n) { add(t.span_begin + off, n); });
        } else {
          add(t.span_begin, t.wire.span_bytes);
        }
        payload += wire_bytes(t.wire);
      }
    } else {
      // Too large for UCX's header: the descriptor leads the data, each part padded to 64 bytes, so the receiver
      // can land everything in one buffer before it reads the descriptor.
      h.flags = kDescInData;
      ctx->header.resize(kNetHeaderBytes);
      const auto pad = [&](uint64_t n) {
        const uint64_t r = (64 - n % 64) % 64;
        add(kZeros, r);
        payload += r;
      };
      add(msg.descriptor.data(), msg.descriptor.size());
      payload += msg.descriptor.size();
      pad(msg.descriptor.size());
      for (const OutTensor& t : msg.tensors) {
        add(t.span_begin, t.wire.span_bytes);
        payload += t.wire.span_bytes;
        pad(t.wire.span_bytes);
      }
    }
    h.payload_bytes = payload;
    encode_header(h, ctx->header.data());
    if (iov.size() == 1) {
      const ucp_dt_iov_t one = iov[0];
      post(ctx, one.buffer, one.length, false);
    } else if (iov.empty()) {
      post(ctx, nullptr, 0, false);
    } else {
      post(ctx, iov.data(), iov.size(), true);
    }
  }

  void drop(const std::shared_ptr<Peer>& p, const std::string& why) {
    if (p->state == State::dead) return;
    p->why = why;
    p->state = State::dead;
  }

  // ---- the engine thread ---------------------------------------------------------------------------------------

  bool tick(Clock::time_point now) override {
    {
      std::lock_guard lock(mu_);
      if (closing_ && !closing_seen_) {
        closing_seen_ = true;
        close_by_ = now + kCloseDrain;
      }
    }
    const bool closing = closing_seen_;
    if (closing && listener_) {
      ucx().listener_destroy(listener_);
      listener_ = nullptr;
    }
    std::vector<std::shared_ptr<Peer>> peers;
    {
      std::lock_guard lock(mu_);
      for (auto& [id, p] : peers_) peers.push_back(p);
    }
    for (auto& p : peers) service(p, now, closing, closing && now >= close_by_);
    // Forget peers whose endpoint is closed and whose sends all completed.
    bool any_left = false;
    {
      std::lock_guard lock(mu_);
      for (auto it = peers_.begin(); it != peers_.end();) {
        Peer& p = *it->second;
        if (p.closed && p.requests == 0) {
          // (UCX reuses a freed endpoint's address: a newer peer may own this key already.)
          if (auto e = by_ep_.find(p.ep); e != by_ep_.end() && e->second == p.id) by_ep_.erase(e);
          it = peers_.erase(it);
        } else {
          ++it;
        }
      }
      any_left = !peers_.empty();
    }
    if (!closing) return true;
    if (any_left && now < close_by_ + std::chrono::seconds(2)) return true;
    // Done (or UCX did not complete in time: what it still holds is left to it, and its completions touch only
    // their peer and message). Release every queued message.
    for (auto& p : peers)
      if (!p->closed) {
        engine_->close_ep(p->ep, true);
        p->closed = true;
      }
    std::lock_guard lock(mu_);
    for (auto& [id, p] : peers_) p->pending.clear();
    peers_.clear();
    by_ep_.clear();
    return false;
  }

  // Holding the worker: posts what credits allow to one active peer, or to every one.
  void post_ready(const std::shared_ptr<Peer>& p) {
    while (p->state == State::active && !p->closed) {
      std::shared_ptr<OutMessage> m;
      uint64_t number = 0;
      {
        std::lock_guard lock(mu_);
        if (p->pending.empty() || p->unacked >= opt_.depth) break;
        m = std::move(p->pending.front());
        p->pending.pop_front();
        ++p->unacked;
        number = ++p->sent + p->dropped;  // (drops only ever take the oldest pending: they precede this one)
      }
      send_data(p, std::move(m), number);
    }
  }
  void post_all() {
    std::vector<std::shared_ptr<Peer>> peers;
    {
      std::lock_guard lock(mu_);
      if (closing_) return;
      for (auto& [id, p] : peers_) peers.push_back(p);
    }
    for (auto& p : peers) post_ready(p);
  }

  void service(const std::shared_ptr<Peer>& p, Clock::time_point now, bool closing, bool force) {
    if (p->closed) return;
    if (p->state == State::hello_sent && now - p->since > kHandshakeTimeout) drop(p, "no AUTH within the handshake timeout");
    if ((p->state == State::active || p->state == State::hello_sent) && now - p->last_heard > opt_.keepalive)
      drop(p, "silent for longer than the keepalive");
    if (force && p->state != State::dead) drop(p, "the publisher closed before it could deliver everything");
    if (p->state == State::active) {
      post_ready(p);
      if (closing && p->state == State::active) {
        bool drained;
        {
          std::lock_guard lock(mu_);
          drained = p->pending.empty();
        }
        if (drained && !p->bye_sent) {
          send_control(p, NetType::bye, std::string());
          p->bye_sent = true;
        }
        if (p->bye_sent && p->requests == 0) p->state = State::closing;
      } else if (now - p->last_sent >= p->ping_every) {
        send_control(p, NetType::ping, std::string());
      }
    }
    if (p->state == State::hello_sent && closing) drop(p, "the publisher closed");
    if (p->state == State::closing && p->requests == 0) {
      engine_->close_ep(p->ep, false);  // flushes what is still on its way
      p->closed = true;
    }
    if (p->state == State::dead) {
      {
        std::lock_guard lock(mu_);
        p->pending.clear();  // releases the messages (and their pool buffers) at once
        p->unacked = 0;
      }
      engine_->close_ep(p->ep, true);
      p->closed = true;
    }
  }

  std::string topic_;
  ServerOptions opt_;
  std::string address_;
  size_t max_header_ = 0;
  CudaPath cuda_path_;  // (set before the engine runs anything of ours)
  std::chrono::milliseconds ping_every_{kPingEvery};  // a third of the keepalive at most
  Engine* engine_ = nullptr;
  ucp_listener_h listener_ = nullptr;  // engine thread only (after the constructor)
  bool closing_seen_ = false;          // engine thread only
  Clock::time_point close_by_{};       // engine thread only
  mutable std::mutex mu_;
  bool closing_ = false;
  std::map<uint64_t, std::shared_ptr<Peer>> peers_;
  std::map<ucp_ep_h, uint64_t> by_ep_;
  uint64_t next_id_ = 0;
  std::atomic<uint64_t> dropped_{0};
};

}  // namespace

std::unique_ptr<Server> Server::create(std::string topic, ServerOptions options) {
  return std::make_unique<ServerImpl>(std::move(topic), std::move(options));
}

}  // namespace tw::net_detail
