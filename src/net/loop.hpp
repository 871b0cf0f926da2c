// loop.hpp (private) — the piece both UCX engines share: one worker owned by one thread, which sleeps on the
// worker's event fd and on an eventfd other threads write to wake it.
#pragma once

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>

#include "net/ucx.hpp"
#include "os/os_internal.hpp"
#include "tensorwire/error.hpp"

namespace tw::net_detail {

using Clock = std::chrono::steady_clock;

/// How often a silent link says PING, and how long a handshake may take.
inline constexpr auto kPingEvery = std::chrono::milliseconds(1000);
inline constexpr auto kHandshakeTimeout = std::chrono::milliseconds(5000);

class Loop {
 public:
  Loop() {
    const UcxApi& api = ucx();
    ucp_worker_params_t p{};
    p.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    p.thread_mode = UCS_THREAD_MODE_SINGLE;  // only the owning thread calls into it
    ucs_status_t st = api.worker_create(ucx_context(), &p, &worker_);
    if (st != UCS_OK) throw Error(ErrorCode::unsupported, "tensorwire net: creating a UCX worker failed: " + ucx_status(st));
    st = api.worker_get_efd(worker_, &efd_);
    if (st != UCS_OK) {
      api.worker_destroy(worker_);
      throw Error(ErrorCode::unsupported, "tensorwire net: UCX worker has no event fd: " + ucx_status(st));
    }
    wake_ = os::Fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!wake_) {
      api.worker_destroy(worker_);
      os::throw_errno("eventfd");
    }
    ucp_worker_attr_t a{};
    a.field_mask = UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER;
    max_am_header_ = api.worker_query(worker_, &a) == UCS_OK ? a.max_am_header : 0;
  }
  ~Loop() {
    if (worker_) ucx().worker_destroy(worker_);
  }
  Loop(const Loop&) = delete;
  Loop& operator=(const Loop&) = delete;

  ucp_worker_h worker() const noexcept { return worker_; }
  size_t max_am_header() const noexcept { return max_am_header_; }
  /// Any thread: wakes the owner.
  void wake() noexcept {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t r = ::write(wake_.get(), &one, sizeof one);
  }
  /// Progresses until idle (bounded), then sleeps up to `ms` unless something is pending.
  void run_once(int ms) {
    const UcxApi& api = ucx();
    for (int i = 0; i < 64 && api.worker_progress(worker_) != 0; ++i) {
    }
    if (ms <= 0) return;
    const ucs_status_t st = api.worker_arm(worker_);
    if (st == UCS_ERR_BUSY) return;  // events arrived meanwhile
    pollfd fds[2] = {{efd_, POLLIN, 0}, {wake_.get(), POLLIN, 0}};
    (void)::poll(fds, 2, ms);
    if (fds[1].revents & POLLIN) {
      uint64_t v;
      [[maybe_unused]] ssize_t r = ::read(wake_.get(), &v, sizeof v);
    }
  }

 private:
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1;
  os::Fd wake_;
  size_t max_am_header_ = 0;
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
