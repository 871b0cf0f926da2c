#include "thread_pool.hpp"

#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "tensorwire/copy.hpp"
#include "tensorwire/error.hpp"

namespace tw {
namespace detail {
namespace {

// Read once: sysconf(_SC_NPROCESSORS_ONLN) opens and parses /sys/devices/system/cpu/online, ~9 us, and every
// copy asks for the thread count.
int hardware_threads() noexcept {
  static const int n = [] {
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    return c > 0 ? static_cast<int>(c) : 1;
  }();
  return n;
}

std::atomic<int> g_requested{0};  // 0 = hardware default

class Pool {
 public:
  explicit Pool(int workers) : requested_(static_cast<size_t>(workers)) {
    try {
      for (int i = 0; i < workers; ++i) threads_.emplace_back([this] { work(); });
    } catch (const std::exception&) {  // std::system_error (EAGAIN), or std::bad_alloc for the thread's state
      // The system gave fewer threads than asked for (a thread or memory limit): copies run on those it gave
      // (and the caller), never fail for it.
    }
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  size_t workers() const noexcept { return threads_.size(); }
  /// The workers asked for (workers() may be fewer: those the system gave).
  size_t requested() const noexcept { return requested_; }

  // Caller holds job_mu_. Returns when every index ran and no worker still references the job.
  void run(int64_t n, const std::function<void(int64_t)>& fn) {
    Job job{&fn, n};
    {
      std::lock_guard<std::mutex> lk(mu_);
      current_ = &job;
      ++generation_;
    }
    cv_.notify_all();
    drain(job);
    std::unique_lock<std::mutex> lk(mu_);
    current_ = nullptr;
    done_cv_.wait(lk, [&] { return job.active == 0; });
  }

  std::mutex job_mu_;

 private:
  struct Job {
    const std::function<void(int64_t)>* fn;
    int64_t n;
    std::atomic<int64_t> next{0};
    int active = 0;  // workers inside drain(job); guarded by mu_
  };

  static void drain(Job& job) {
    for (int64_t i; (i = job.next.fetch_add(1)) < job.n;) (*job.fn)(i);
  }

  void work() {
    uint64_t seen = 0;
    for (;;) {
      Job* job;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || (generation_ != seen && current_ != nullptr); });
        if (stop_) return;
        seen = generation_;
        job = current_;
        ++job->active;
      }
      drain(*job);
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (--job->active == 0) done_cv_.notify_all();
      }
    }
  }

  size_t requested_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  Job* current_ = nullptr;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

std::mutex g_pool_mu;
Pool* g_pool = nullptr;  // leaked on purpose at exit and abandoned after fork (its threads are gone in the child)

void after_fork_child() noexcept {
  g_pool = nullptr;  // never touch the parent's pool: its mutexes may be held by threads that no longer exist
  new (&g_pool_mu) std::mutex();
}

void install_fork_handler() {
  static std::once_flag once;
  std::call_once(once, [] { pthread_atfork(nullptr, nullptr, after_fork_child); });
}

}  // namespace

int num_threads() noexcept {
  int r = g_requested.load();
  return r > 0 ? r : hardware_threads();
}

void parallel_for(int64_t n, const std::function<void(int64_t)>& fn) {
  const int want = num_threads();
  if (n <= 1 || want <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  install_fork_handler();
  Pool* pool;
  std::unique_lock<std::mutex> jl;
  {
    // The job lock is taken while g_pool_mu is held, and a pool is only deleted under both: no caller can be
    // left holding a pointer to a deleted pool.
    std::lock_guard<std::mutex> lk(g_pool_mu);
    if (g_pool && g_pool->requested() != static_cast<size_t>(want - 1)) {
      std::unique_lock<std::mutex> resize(g_pool->job_mu_, std::try_to_lock);
      if (resize.owns_lock()) {
        resize.unlock();
        delete g_pool;
        g_pool = nullptr;
      }
    }
    if (!g_pool) g_pool = new Pool(want - 1);
    pool = g_pool;
    jl = std::unique_lock<std::mutex>(pool->job_mu_, std::try_to_lock);
  }
  if (!jl.owns_lock()) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  pool->run(n, fn);
}

}  // namespace detail

void set_num_threads(int n) {
  if (n > kMaxThreads)
    throw Error(ErrorCode::invalid_argument, "set_num_threads: at most " + std::to_string(kMaxThreads) +
                                                 " threads (the calling thread included), not " + std::to_string(n));
  detail::g_requested.store(n > 0 ? n : 0);
}
int get_num_threads() noexcept { return detail::num_threads(); }

}  // namespace tw
