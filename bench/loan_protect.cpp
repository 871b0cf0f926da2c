// What protecting sent loans costs: loan -> write -> send -> recv -> release cycles in one process. A loan handed
// over whole (send(std::move(loan))) is not protected; one whose handle the caller keeps (send(loan)) is made
// read-only until loaned again (two mprotect calls per cycle). Built with -DTW_BUILD_BENCH=ON; run
// build/<dir>/bench/loan_protect.
#include <chrono>
#include <cstdio>
#include <string>

#include "tensorwire/ipc.hpp"

int main() {
  using Clock = std::chrono::steady_clock;
  std::printf("%-22s %10s %14s\n", "send", "bytes", "us per cycle");
  for (bool protect : {false, true}) {
    for (int64_t n : {int64_t{64}, int64_t{4096}, int64_t{65536}, int64_t{1} << 20, int64_t{16} << 20}) {
      const std::string name = "bench/loan_protect/" + std::to_string(n) + (protect ? "/on" : "/off");
      tw::Publisher pub(name);
      tw::Subscriber sub(name);
      auto cycle = [&] {
        tw::Tensor t = pub.loan({n}, tw::DType::uint8());
        t.data<uint8_t>()[0] = 1;
        if (protect)
          pub.send(t);  // the caller keeps its handle: protected
        else
          pub.send(std::move(t));
        return sub.recv(std::chrono::seconds(1)).has_value();
      };
      for (int i = 0; i < 1000; ++i) cycle();
      const int reps = n >= (int64_t{1} << 20) ? 2000 : 20000;
      const auto t0 = Clock::now();
      for (int i = 0; i < reps; ++i) cycle();
      const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / reps;
      std::printf("%-22s %10lld %14.2f\n", protect ? "send(loan): protected" : "send(std::move(loan))",
                  static_cast<long long>(n), us);
    }
  }
}
