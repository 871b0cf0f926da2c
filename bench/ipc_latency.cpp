// ipc_latency — C++ one-way latency of tw::Publisher -> tw::Subscriber between two processes (fork), with a busy
// subscriber (try_recv in a loop). The publisher stamps CLOCK_MONOTONIC into the payload just before loan() (or
// before send() of a packed copy); the subscriber subtracts it from its own clock when it can read the payload.
// One message in flight: the subscriber acknowledges through an atomic in shared anonymous memory.
//
//   ipc_latency [iterations=20000] [--json]
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tensorwire/ipc.hpp"

namespace {

int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

struct Shared {
  std::atomic<int64_t> acked{0};
  std::atomic<int> ready{0};
  int64_t lat[1];  // iterations entries follow
};

}  // namespace

int main(int argc, char** argv) {
  int iters = 20000;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) json = true;
    else iters = std::atoi(argv[i]);
  }
  const std::vector<size_t> sizes = {64, 4096, 65536, 1 << 20, 16 << 20};
  if (json) std::printf("[");
  bool first = true;
  for (int loan = 0; loan < 2; ++loan) {
    for (size_t size : sizes) {
      const int n = size >= (1 << 20) ? std::max(200, iters / 20) : iters;
      const size_t shm_bytes = sizeof(Shared) + sizeof(int64_t) * size_t(n);
      void* mem = mmap(nullptr, shm_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
      auto* sh = new (mem) Shared();
      const std::string name = "bench/ipc_latency/" + std::to_string(getpid()) + "/" + std::to_string(size) +
                               (loan ? "/loan" : "/send");
      pid_t child = fork();
      if (child == 0) {
        tw::Subscriber sub(name);
        sh->ready.store(1);
        for (int i = 0; i < n; ++i) {
          std::optional<tw::Tensor> t;
          while (!(t = sub.try_recv())) {
          }
          const int64_t t1 = now_ns();
          int64_t t0;
          std::memcpy(&t0, t->data_ptr(), sizeof t0);
          sh->lat[i] = t1 - t0;
          t.reset();
          sh->acked.store(i + 1, std::memory_order_release);
        }
        _exit(0);
      }
      while (!sh->ready.load()) usleep(100);
      tw::Publisher pub(name);
      while (pub.subscriber_count() < 1) usleep(100);
      tw::Tensor src = tw::Tensor::zeros({int64_t(size)}, tw::DType::uint8());
      for (int i = 0; i < n; ++i) {
        int64_t t0 = now_ns();
        if (loan) {
          tw::Tensor buf = pub.loan({int64_t(size)}, tw::DType::uint8());
          std::memcpy(buf.data_ptr(), &t0, sizeof t0);
          pub.send(buf);
        } else {
          std::memcpy(src.data_ptr(), &t0, sizeof t0);
          pub.send(src);
        }
        while (sh->acked.load(std::memory_order_acquire) < i + 1) {
        }
      }
      int status;
      waitpid(child, &status, 0);
      std::vector<int64_t> v(sh->lat + n / 10, sh->lat + n);  // drop the warm-up tenth
      std::sort(v.begin(), v.end());
      const double p50 = double(v[v.size() / 2]) / 1000.0, p99 = double(v[v.size() * 99 / 100]) / 1000.0;
      if (json)
        std::printf("%s\n {\"method\": \"cpp-%s\", \"bytes\": %zu, \"n\": %zu, \"p50_us\": %.3f, \"p99_us\": %.3f}",
                    first ? "" : ",", loan ? "loan" : "send", size, v.size(), p50, p99);
      else
        std::printf("cpp-%s %9zu B: p50 %8.2f us  p99 %8.2f us  (n=%zu)\n", loan ? "loan" : "send", size, p50, p99,
                    v.size());
      first = false;
      std::fflush(stdout);
      munmap(mem, shm_bytes);
    }
  }
  if (json) std::printf("\n]\n");
  return 0;
}
