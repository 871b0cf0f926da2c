// engine.cpp — the process's UCX worker and its thread (engine.hpp).
#include "net/engine.hpp"

#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "net/net_internal.hpp"
#include "tensorwire/device_runtime.hpp"
#include "tensorwire/error.hpp"

namespace tw::net_detail {

namespace {
constexpr auto kCloseFlush = std::chrono::seconds(2);  // a graceful endpoint close flushes this long at most
constexpr int kIdleWaitMs = 50;                          // sessions are ticked at least this often
// The spin hint (note_poll): a caller spins once it polled and found nothing this many times in a row, each poll
// within kSpinGap of the last. While it does, the engine thread naps kSpinNap at a time without watching the worker.
// An event that arrives just after a spinner stops (without waiting in recv, which says so) waits for the engine
// thread at most kSpinNap + kSpinGap. (A gap of 100 us let the engine thread miss the spin now and then — a
// round trip that took longer — and go back to waking beside the spinner for every message.)
constexpr uint32_t kSpinPolls = 4;
constexpr int64_t kSpinGapNs = 1'000'000;
constexpr int64_t kSpinNapNs = 250'000;

int64_t steady_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}
}  // namespace

Engine& Engine::get() {
  static std::mutex mu;
  static Engine* engine = nullptr;
  static pid_t owner = 0;
  std::lock_guard lock(mu);
  if (engine && owner == ::getpid()) return *engine;
  // (An engine inherited over fork() is abandoned: its worker and sockets belong to the parent, its thread did not
  // come along.)
  engine = new Engine();
  owner = ::getpid();
  return *engine;
}

Engine::Engine() {
  wake_ = os::Fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_) throw Error(ErrorCode::unsupported, std::string("tensorwire net: eventfd: ") + std::strerror(errno));
}

void Engine::open_worker() {
  const UcxApi& api = ucx();
  // UCX's CUDA transports call the driver from the threads that create and drive the worker, without making a
  // context current: those threads get one while they do (bind_cuda).
  bind_cuda_ = ucx_cuda_transports() && device_runtime().available();
  const CudaScope cuda(*this);
  ucp_worker_params_t p{};
  p.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  // One thread at a time: made by the thread that starts the engine, then used by the engine's thread only.
  p.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  ucp_worker_h w = nullptr;
  ucs_status_t st = api.worker_create(ucx_context_for_worker(), &p, &w);
  if (st != UCS_OK) {
    ucx_worker_gone();
    throw Error(ErrorCode::unsupported, "tensorwire net: creating a UCX worker failed: " + ucx_status(st));
  }
  const auto fail = [&](const std::string& what) {
    api.worker_destroy(w);
    ucx_worker_gone();
    throw Error(ErrorCode::unsupported, "tensorwire net: " + what);
  };
  int efd = -1;
  st = api.worker_get_efd(w, &efd);
  if (st != UCS_OK) fail("the UCX worker has no event fd: " + ucx_status(st));
  for (const unsigned id : {kAmToPublisher, kAmToSubscriber}) {
    ucp_am_handler_param_t hp{};
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    hp.id = id;
    hp.cb = id == kAmToPublisher ? &Engine::on_am_publisher : &Engine::on_am_subscriber;
    hp.arg = this;
    st = api.set_am_recv_handler(w, &hp);
    if (st != UCS_OK) fail("setting an active-message handler failed: " + ucx_status(st));
  }
  ucp_worker_attr_t a{};
  a.field_mask = UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER;
  max_am_header_ = api.worker_query(w, &a) == UCS_OK ? a.max_am_header : 0;
  worker_ = w;
  efd_ = efd;
}

void Engine::wake() noexcept {
  uint64_t one = 1;
  [[maybe_unused]] ssize_t r = ::write(wake_.get(), &one, sizeof one);
}

void Engine::attach(Session* s, const std::function<void()>& fn) {
  Task task;
  task.fn = fn;
  task.session = s;
  {
    std::unique_lock worker_lock(wmu_, std::defer_lock);  // (wmu_ before mu_, as everywhere)
    std::unique_lock lock(mu_);
    if (running_ && std::this_thread::get_id() == thread_id_)
      throw Error(ErrorCode::internal, "tensorwire net: a session attached from the engine's own thread");
    if (!running_) {
      lock.unlock();
      worker_lock.lock();
      lock.lock();
    }
    if (!running_) {
      // (A previous thread destroyed the worker and decided to end under wmu_ and mu_, and touches nothing of the
      // engine after that: it is detached.)
      open_worker();
      std::thread t([this] { run(); });
      thread_id_ = t.get_id();
      t.detach();
      running_ = true;
    }
    tasks_.push_back(&task);
  }
  wake();
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return task.done; });
  if (task.error) std::rethrow_exception(task.error);
}

void Engine::detach(Session* s) {
  std::unique_lock lock(mu_);
  if (running_ && std::this_thread::get_id() == thread_id_) return;  // (never: sessions finish on their own)
  wake();
  // The last session also waits for the worker to go (its endpoints closed: at most kCloseFlush), so a process
  // that closed everything holds nothing of UCX's once close() returns.
  cv_.wait(lock, [&] {
    return std::find(sessions_.begin(), sessions_.end(), s) == sessions_.end() &&
           (!running_ || !sessions_.empty() || !tasks_.empty());
  });
}

ucs_status_t Engine::create_ep(Session* s, ucp_ep_params_t params, ucp_ep_h* ep) {
  params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &Engine::on_ep_error;
  params.err_handler.arg = this;
  const ucs_status_t st = ucx().ep_create(worker_, &params, ep);
  if (st == UCS_OK) eps_[*ep] = s;
  return st;
}

void Engine::close_ep(ucp_ep_h ep, bool force) {
  if (!ep) return;
  eps_.erase(ep);
  ucp_request_param_t rp{};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  rp.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  const ucs_status_ptr_t r = ucx().ep_close_nbx(ep, &rp);
  if (r && !UCS_PTR_IS_ERR(r)) closing_.push_back(Closing{r, Clock::now() + kCloseFlush});
}

void Engine::on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* self = static_cast<Engine*>(arg);
  auto it = self->eps_.find(ep);
  if (it != self->eps_.end()) it->second->on_ep_error(ep, status);
}

ucs_status_t Engine::on_am_publisher(void* arg, const void* header, size_t header_length, void* data, size_t length,
                                     const ucp_am_recv_param_t* param) {
  return static_cast<Engine*>(arg)->dispatch(kAmToPublisher, header, header_length, data, length, param);
}

ucs_status_t Engine::on_am_subscriber(void* arg, const void* header, size_t header_length, void* data, size_t length,
                                      const ucp_am_recv_param_t* param) {
  return static_cast<Engine*>(arg)->dispatch(kAmToSubscriber, header, header_length, data, length, param);
}

ucs_status_t Engine::dispatch(unsigned id, const void* header, size_t header_length, void* data, size_t length,
                              const ucp_am_recv_param_t* param) {
  // Both sides send with UCP_AM_SEND_FLAG_REPLY: the reply endpoint is the local endpoint the message came in on,
  // which says whose it is. Anything else (an endpoint being closed, not one of ours) is ignored.
  if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) return UCS_OK;
  auto it = eps_.find(param->reply_ep);
  if (it == eps_.end()) return UCS_OK;
  return it->second->on_am(id, param->reply_ep, header, header_length, data, length, param);
}

void Engine::progress() {
  const UcxApi& api = ucx();
  for (int i = 0; i < 64 && api.worker_progress(worker_) != 0; ++i) {
  }
}

void Engine::note_poll(bool found) noexcept {
  // (Relaxed and racy between pollers by design: a hint, never a correctness condition. Whatever it says, a waiter
  // is served: note_waiter wakes a napping engine thread.)
  if (found) {
    empty_polls_.store(0, std::memory_order_relaxed);
    return;
  }
  const int64_t now = steady_ns();
  const int64_t last = last_empty_poll_ns_.exchange(now, std::memory_order_relaxed);
  uint32_t n = 1;
  if (now - last <= kSpinGapNs) {
    n = empty_polls_.fetch_add(1, std::memory_order_relaxed) + 1;
  } else {
    empty_polls_.store(1, std::memory_order_relaxed);
  }
  // (The streak restarts at each message found, so the engine thread, which wakes when a message arrives, would
  // mostly see a short one: what counts is that a streak reached kSpinPolls, and the last empty poll, recently.)
  if (n >= kSpinPolls) spun_ns_.store(now, std::memory_order_relaxed);
}

void Engine::note_waiter(bool waiting) noexcept {
  if (!waiting) {
    waiters_.fetch_sub(1, std::memory_order_seq_cst);
    return;
  }
  // (seq_cst with the engine's napping_/waiters_ pair: either it sees this waiter before it naps, or this sees it
  // napping and wakes it.)
  waiters_.fetch_add(1, std::memory_order_seq_cst);
  if (napping_.load(std::memory_order_seq_cst)) wake();
}

bool Engine::spinning(int64_t now_ns) const noexcept {
  return now_ns - spun_ns_.load(std::memory_order_relaxed) <= kSpinGapNs;
}

bool Engine::try_progress() {
  std::unique_lock lock(wmu_, std::try_to_lock);
  if (!lock.owns_lock() || !worker_) return false;
  const CudaScope cuda(*this);
  progress();
  return true;
}

void Engine::reap_closing(Clock::time_point now) {
  const UcxApi& api = ucx();
  for (auto it = closing_.begin(); it != closing_.end();) {
    // A request freed before it completes is released by UCX when it does.
    if (api.request_check_status(it->request) != UCS_INPROGRESS || now >= it->until) {
      api.request_free(it->request);
      it = closing_.erase(it);
    } else {
      ++it;
    }
  }
}

bool Engine::bind_cuda() const noexcept { return bind_cuda_ && device_runtime().bind_thread(); }

void Engine::unbind_cuda() const noexcept { device_runtime().unbind_thread(); }

void Engine::run() {
  ::pthread_setname_np(::pthread_self(), "tensorwire-net");  // (15 characters at most)
  std::vector<Session*> sessions;
  for (;;) {
    std::unique_lock worker_lock(wmu_);
    bind_cuda();  // (this thread keeps the context once it has one: then this only looks)
    progress();
    std::deque<Task*> tasks;
    {
      std::lock_guard lock(mu_);
      tasks.swap(tasks_);
    }
    for (Task* t : tasks) {
      try {
        t->fn();
      } catch (...) {
        t->error = std::current_exception();
      }
      std::lock_guard lock(mu_);
      if (!t->error && t->session) sessions_.push_back(t->session);
      t->done = true;
      cv_.notify_all();
    }
    const auto now = Clock::now();
    {
      std::lock_guard lock(mu_);
      sessions = sessions_;
    }
    for (Session* s : sessions) {
      bool more = true;
      try {
        more = s->tick(now);
      } catch (...) {  // (sessions do not throw from tick; a bad_alloc tries again next round)
      }
      if (more) continue;
      // Endpoints it left open are closed without it.
      for (auto it = eps_.begin(); it != eps_.end();) {
        if (it->second == s) {
          const ucp_ep_h ep = it->first;
          it = eps_.erase(it);
          close_ep(ep, true);
        } else {
          ++it;
        }
      }
      std::lock_guard lock(mu_);
      sessions_.erase(std::remove(sessions_.begin(), sessions_.end(), s), sessions_.end());
      cv_.notify_all();
    }
    reap_closing(Clock::now());
    {
      std::lock_guard lock(mu_);
      if (sessions_.empty() && tasks_.empty() && closing_.empty()) {
        // Nothing left: the worker goes too (its sockets, shared memory and threads), and attach() makes a new
        // one when it needs one. (Only one worker is ever alive: the one UCX 1.13 could confuse with another is
        // gone, with its queue of missed events, before the next exists.)
        eps_.clear();
        ucx().worker_destroy(worker_);
        ucx_worker_gone();
        worker_ = nullptr;
        efd_ = -1;
        running_ = false;
        cv_.notify_all();
        return;
      }
    }
    // Sleep until UCX has events, someone wakes the engine, or the next tick is due. Other threads may take the
    // worker meanwhile (try_run): then the events may be theirs, and this thread wakes for nothing, or later.
    // A caller spinning on the worker lands what arrives: nap without watching the worker (note_poll).
    napping_.store(true, std::memory_order_seq_cst);
    if (waiters_.load(std::memory_order_seq_cst) == 0 && spinning(steady_ns())) {
      worker_lock.unlock();
      // Until woken, a waiter comes, the spinner stops, or sessions are due a tick: only the clock and this thread's
      // eventfd are looked at meanwhile (taking the worker would make the spinner's try_progress skip a round).
      const int64_t tick_by = steady_ns() + int64_t{kIdleWaitMs} * 1'000'000;
      for (;;) {
        pollfd fd{wake_.get(), POLLIN, 0};
        const timespec nap{0, kSpinNapNs};
        if (::ppoll(&fd, 1, &nap, nullptr) > 0) {
          uint64_t v;
          [[maybe_unused]] ssize_t r = ::read(wake_.get(), &v, sizeof v);
          break;
        }
        const int64_t t = steady_ns();
        if (waiters_.load(std::memory_order_seq_cst) != 0 || !spinning(t) || t >= tick_by) break;
      }
      napping_.store(false, std::memory_order_relaxed);
      continue;
    }
    napping_.store(false, std::memory_order_relaxed);
    const int ms = closing_.empty() ? kIdleWaitMs : 5;
    // (UCX's CUDA transports query their events when arming: a first device receive this round may have left
    // the thread without the context it binds; binding again only looks once it has one)
    bind_cuda();
    const bool armed = ucx().worker_arm(worker_) == UCS_OK;  // BUSY: events arrived meanwhile
    const int efd = efd_;
    worker_lock.unlock();
    if (!armed) continue;
    event_sleeps_.fetch_add(1, std::memory_order_relaxed);
    pollfd fds[2] = {{efd, POLLIN, 0}, {wake_.get(), POLLIN, 0}};
    (void)::poll(fds, 2, ms);
    if (fds[1].revents & POLLIN) {
      uint64_t v;
      [[maybe_unused]] ssize_t r = ::read(wake_.get(), &v, sizeof v);
    }
  }
}

}  // namespace tw::net_detail
