// engine.hpp (private) — the one UCX worker of a process, and the one thread that drives it, shared by every
// net publisher (Server) and subscriber (Client) in the process.
//
// Why one: UCX registers every socket of every worker in one process-wide table keyed by fd, and, before UCX 1.18,
// left a worker's queued "missed" event for a socket behind when that socket was closed. When another worker then
// got the same fd number, the first worker's next progress found the other worker's handler under it and aborted
// (async.c: "Assertion `handler->async == async' failed"; fixed upstream in 1.18.0 by openucx/ucx PR 9942; Debian
// ships 1.13). With one worker per process, no fd can move between workers. One thread also serves any number of
// publishers and subscribers: a process with 50 subscribers runs one net thread, not 50.
//
// Sessions (Server, Client) do their UCX work holding the worker lock: in their callbacks (active messages,
// endpoint errors, connection requests, completions) and in tick(), which the engine thread calls after each round
// of progress and at least every 50 ms, and — on the hot path — from the caller's own thread when the worker is
// free (try_run: a send posted by send() itself, a message landed by the recv() that waits for it), which saves
// two thread hand-offs per message. Other threads talk to a session through its own mutex and Engine::wake().
// The thread and the worker live while any session is attached or any endpoint is still closing, and end when
// there is none, so a process whose publishers and subscribers are all closed holds no tensorwire thread, socket
// or UCX resource.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "net/ucx.hpp"
#include "os/os_internal.hpp"

namespace tw::net_detail {

using Clock = std::chrono::steady_clock;

/// How often a silent link says PING, and how long a handshake may take.
inline constexpr auto kPingEvery = std::chrono::milliseconds(1000);
inline constexpr auto kHandshakeTimeout = std::chrono::milliseconds(5000);

/// A publisher's or subscriber's network side, as the engine sees it. Every method runs on the engine thread.
class Session {
 public:
  virtual ~Session() = default;
  /// An active message that arrived on one of this session's endpoints (`ep`).
  virtual ucs_status_t on_am(unsigned id, ucp_ep_h ep, const void* header, size_t header_length, void* data,
                             size_t length, const ucp_am_recv_param_t* param) = 0;
  /// UCX reports `ep` (one of this session's) failed.
  virtual void on_ep_error(ucp_ep_h ep, ucs_status_t status) = 0;
  /// Periodic work. Returns false once the session has finished (the engine then forgets it, and
  /// Engine::detach returns).
  virtual bool tick(Clock::time_point now) = 0;
};

class Engine {
 public:
  /// The process's engine (created on first use, and anew in a fork()ed child). Throws Error(unsupported) when
  /// UCX cannot be used.
  static Engine& get();

  /// The worker: on the engine thread, and in an attach() fn.
  ucp_worker_h worker() const noexcept { return worker_; }
  /// The largest active-message header the worker carries: on the engine thread, and in an attach() fn.
  size_t max_am_header() const noexcept { return max_am_header_; }

  /// Any thread: the engine thread does a round now (ticks every session).
  void wake() noexcept;

  /// Any thread but the engine's: runs `fn` on the engine thread, then ticks `s` until its tick returns false.
  /// `fn` may create what callbacks need (a listener); what it throws is rethrown here, and `s` is not attached.
  void attach(Session* s, const std::function<void()>& fn);
  /// Any thread but the engine's: blocks until `s` has finished (its tick returned false) and, when it was the
  /// last session, until the worker is gone; at once when it is not attached. The session must have been asked to
  /// finish; its own deadlines bound the wait.
  void detach(Session* s);

  /// Any thread: runs `fn` holding the worker, unless another thread holds it now (then returns false at once).
  /// This is how a caller's thread posts a send or lands a message itself, with no hand-off to the engine's
  /// thread: `fn` may do what a session does in a callback or tick.
  template <class F>
  bool try_run(F&& fn) {
    std::unique_lock lock(wmu_, std::try_to_lock);
    if (!lock.owns_lock() || !worker_) return false;
    const CudaScope cuda(*this);
    fn();
    return true;
  }
  /// Any thread: progresses the worker (its callbacks run on this thread) unless another thread holds it.
  bool try_progress();

  /// Any thread, after a poll that waits for nothing (recv(timeout=0), poll()): `found` says whether it returned a
  /// message. A caller that keeps polling and finding nothing is spinning on the worker: its progress lands every
  /// session's messages, so while it spins the engine thread does not sleep on the worker's events (each would wake
  /// it beside the spinner: two context switches per message, on the spinner's own cores). It looks again every
  /// kSpinNap, and sleeps on the events again once nobody has polled for kSpinGap. One empty poll between messages
  /// (a caller that then waits on fileno(), as asyncio does) never counts as spinning.
  void note_poll(bool found) noexcept;
  /// Any thread: a caller starts (true) or stops (false) waiting for a message only the engine thread would land
  /// (a blocking recv): while one waits, the engine thread sleeps on the worker's events whoever else polls.
  void note_waiter(bool waiting) noexcept;
  /// How many times the engine thread has slept watching the worker's events (for tests of the spin hint).
  uint64_t event_sleeps() const noexcept { return event_sleeps_.load(std::memory_order_relaxed); }

  // ---- holding the worker (the engine thread, a callback, a tick, a try_run fn) ----
  /// Creates an endpoint for `s`; errors are reported to `s`. Returns the status of ucp_ep_create.
  ucs_status_t create_ep(Session* s, ucp_ep_params_t params, ucp_ep_h* ep);
  /// Closes `ep` (force: without flushing): from now on nothing about it reaches its session. The close
  /// completes in the background (at most 2 s of flushing).
  void close_ep(ucp_ep_h ep, bool force);

  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

 private:
  Engine();
  ~Engine() = default;  // never destroyed (a thread may be finishing its last round)
  void open_worker();   // under wmu_ and mu_, while no thread runs

  static ucs_status_t on_am_publisher(void* arg, const void* header, size_t header_length, void* data,
                                      size_t length, const ucp_am_recv_param_t* param);
  static ucs_status_t on_am_subscriber(void* arg, const void* header, size_t header_length, void* data,
                                       size_t length, const ucp_am_recv_param_t* param);
  ucs_status_t dispatch(unsigned id, const void* header, size_t header_length, void* data, size_t length,
                        const ucp_am_recv_param_t* param);
  static void on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t status);

  void run();
  // Holding the worker, where UCX has CUDA transports: a thread with no current CUDA context gets the one of the
  // first device this process uses through tensorwire (none before it uses one: UCX has no CUDA work to do then).
  // The engine's thread keeps it; a caller's thread has it for the call only (CudaScope).
  bool bind_cuda() const noexcept;
  void unbind_cuda() const noexcept;
  struct CudaScope {
    explicit CudaScope(const Engine& e) : engine(e), bound(e.bind_cuda()) {}
    ~CudaScope() {
      if (bound) engine.unbind_cuda();
    }
    CudaScope(const CudaScope&) = delete;
    CudaScope& operator=(const CudaScope&) = delete;
    const Engine& engine;
    const bool bound;
  };
  bool spinning(int64_t now_ns) const noexcept;
  void progress();
  void reap_closing(Clock::time_point now);

  struct Task {
    std::function<void()> fn;
    Session* session = nullptr;  // attached once fn returns
    std::exception_ptr error;
    bool done = false;
  };
  struct Closing {
    void* request;
    Clock::time_point until;
  };

  // -- set under mu_ and wmu_ while no engine thread runs; then under wmu_ --
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1;
  size_t max_am_header_ = 0;
  bool bind_cuda_ = false;  // UCX has CUDA transports: threads that drive the worker need a CUDA context
  os::Fd wake_;

  // The worker lock: held by whoever calls into UCX on the worker (UCS_THREAD_MODE_SERIALIZED) — the engine
  // thread for each round of progress, tasks and ticks (never while it sleeps), or a caller's thread in try_run.
  // Everything a session keeps for "the engine thread" is under it. Order: wmu_, then mu_, then a session's own.
  std::mutex wmu_;
  std::mutex mu_;
  std::condition_variable cv_;  // tasks done, sessions finished
  std::deque<Task*> tasks_;
  std::vector<Session*> sessions_;
  bool running_ = false;
  std::thread::id thread_id_;

  // -- the spin hint (note_poll, note_waiter) --
  std::atomic<int64_t> last_empty_poll_ns_{0};
  std::atomic<uint32_t> empty_polls_{0};  // empty polls in a row, each within kSpinGap of the previous one
  std::atomic<int64_t> spun_ns_{INT64_MIN / 2};  // the last empty poll that made kSpinPolls in a row
  std::atomic<uint32_t> waiters_{0};
  std::atomic<bool> napping_{false};     // the engine thread sleeps without watching the worker's events
  std::atomic<uint64_t> event_sleeps_{0};

  // -- under wmu_ --
  std::unordered_map<ucp_ep_h, Session*> eps_;
  std::vector<Closing> closing_;
};

/// A UCX send/receive request's completion: NULL (done now), an error pointer, or a request to wait for.
inline bool done_now(ucs_status_ptr_t r, ucs_status_t& st) {
  if (r == nullptr) {
    st = UCS_OK;
    return true;
  }
  if (UCS_PTR_IS_ERR(r)) {
    st = UCS_PTR_STATUS(r);
    return true;
  }
  return false;
}

}  // namespace tw::net_detail
