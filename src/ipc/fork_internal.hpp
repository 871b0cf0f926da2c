// fork_internal.hpp (private) — what a fork()ed child does with the parent's publishers and subscribers.
//
// A child made by fork() without exec() inherits copies of every socket and eventfd; kept open, they would keep the
// parent's topic names bound and its leases alive after the parent is gone. Every live Publisher/Subscriber
// implementation registers here; around fork() (pthread_atfork):
//  1. prepare: take the registry's lock and each object's state lock (only ever held briefly), so the child sees
//     consistent state;
//  2. parent: release them;
//  3. child: call on_fork_child() on each (it closes its copies and marks the object unusable), then release.
// `Impl` provides `std::mutex& mutex()` and `void on_fork_child() noexcept`.
#pragma once

#include <pthread.h>

#include <mutex>
#include <set>

namespace tw::ipc_detail {

template <class Impl>
class ForkRegistry {
 public:
  static void add(Impl* p) {
    static std::once_flag once;
    std::call_once(once, [] { ::pthread_atfork(prepare, parent, child); });
    std::lock_guard lock(get().mu_);
    get().live_.insert(p);
  }
  static void remove(Impl* p) noexcept {
    std::lock_guard lock(get().mu_);
    get().live_.erase(p);
  }

 private:
  static ForkRegistry& get() noexcept {
    static auto* r = new ForkRegistry();  // never destroyed: atfork handlers may run during exit
    return *r;
  }
  static void prepare() noexcept {
    auto& r = get();
    r.mu_.lock();
    for (Impl* p : r.live_) p->mutex().lock();
  }
  static void parent() noexcept {
    auto& r = get();
    for (Impl* p : r.live_) p->mutex().unlock();
    r.mu_.unlock();
  }
  static void child() noexcept {
    auto& r = get();
    for (Impl* p : r.live_) {
      p->on_fork_child();
      p->mutex().unlock();
    }
    r.mu_.unlock();
  }

  std::mutex mu_;
  std::set<Impl*> live_;
};

}  // namespace tw::ipc_detail
