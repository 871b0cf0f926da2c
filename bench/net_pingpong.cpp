// net_pingpong — tensorwire's C++ API over UCX, measured as ucx_perftest measures its latency: a ping-pong, both
// sides polling (Subscriber::recv with a zero timeout), the figure half a round trip. `tensorwire bench --net` runs
// it in its two network namespaces beside ucx_perftest, so the library's own cost is seen without Python's.
//
// Side A listens on --listen (topic "<topic>/ping") and subscribes to B's --connect ("<topic>/pong"); side B the
// reverse. A sends a message of --size bytes (a loan: no copy on the sender; the stamp in its first 8 bytes), B
// sends one back of the same size as soon as it has it, --warmup + --iters times. A prints one JSON line:
//   {"bytes": N, "n": iters, "p50_us": ..., "p99_us": ..., "transport": "ucx"}
//
//   net_pingpong --side a|b --listen HOST:PORT --connect HOST:PORT --topic T --sizes 64,4096 --iters N
//                [--warmup N] [--token T]   (the token may also come from TW_BENCH_NET_TOKEN)
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "tensorwire/ipc.hpp"

namespace {

int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr, "net_pingpong: %s\n", why);
  std::exit(2);
}

// Polls until a message arrives; gives up (throws) after 60 s.
tw::Tensor spin(tw::Subscriber& sub) {
  const int64_t until = now_ns() + 60'000'000'000;
  for (;;) {
    if (auto t = sub.recv(std::chrono::nanoseconds(0))) return std::move(*t);
    if (now_ns() > until) throw std::runtime_error("no message within 60 s");
  }
}

void send_one(tw::Publisher& pub, int64_t size) {
  tw::Tensor t = pub.loan({size}, tw::DType::uint8(), std::chrono::seconds(60));
  const int64_t stamp = now_ns();
  std::memcpy(t.data_ptr(), &stamp, sizeof stamp);  // (sizes are at least 8 bytes)
  pub.send(std::move(t), {}, std::chrono::seconds(60));
}

}  // namespace

int main(int argc, char** argv) {
  std::string side, listen, connect, topic = "bench/net/pingpong", token;
  std::vector<int64_t> sizes;
  int iters = 1000, warmup = -1;
  if (const char* t = std::getenv("TW_BENCH_NET_TOKEN")) token = t;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) usage(("missing the value of " + a).c_str());
    const std::string v = argv[++i];
    if (a == "--side") side = v;
    else if (a == "--listen") listen = v;
    else if (a == "--connect") connect = v;
    else if (a == "--topic") topic = v;
    else if (a == "--token") token = v;
    else if (a == "--iters") iters = std::atoi(v.c_str());
    else if (a == "--warmup") warmup = std::atoi(v.c_str());
    else if (a == "--sizes") {
      for (size_t p = 0; p <= v.size();) {
        const size_t q = std::min(v.find(',', p), v.size());
        const long long n = std::atoll(v.substr(p, q - p).c_str());
        if (n < 8) usage("every size must be at least 8 bytes (the stamp)");
        sizes.push_back(n);
        p = q + 1;
      }
    } else usage(("unknown option " + a).c_str());
  }
  if ((side != "a" && side != "b") || listen.empty() || connect.empty() || sizes.empty() || iters < 1)
    usage("give --side a|b, --listen, --connect, --sizes and --iters >= 1");
  if (warmup < 0) warmup = std::max(2, iters / 10);
  try {
    const bool a = side == "a";
    tw::PublisherOptions po;
    po.listen = listen;
    po.token = token;
    tw::Publisher pub(topic + (a ? "/ping" : "/pong"), po);
    tw::SubscriberOptions so;
    so.connect = connect;
    so.token = token;
    tw::Subscriber sub(topic + (a ? "/pong" : "/ping"), so);
    const int64_t until = now_ns() + 60'000'000'000;
    while (pub.remote_subscriber_count() < 1 || !sub.connected()) {
      if (now_ns() > until) throw std::runtime_error("the other side did not connect within 60 s");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    for (const int64_t size : sizes) {
      std::vector<double> half;
      half.reserve(size_t(iters));
      for (int i = 0; i < warmup + iters; ++i) {
        if (a) {
          const int64_t t0 = now_ns();
          send_one(pub, size);
          tw::Tensor back = spin(sub);
          const int64_t t1 = now_ns();
          if (back.nbytes() != size) throw std::runtime_error("a reply of the wrong size");
          if (i >= warmup) half.push_back(double(t1 - t0) / 2000.0);
        } else {
          tw::Tensor got = spin(sub);
          if (got.nbytes() != size) throw std::runtime_error("a message of the wrong size");
          send_one(pub, size);
        }
      }
      if (a) {
        std::sort(half.begin(), half.end());
        const auto pct = [&](double p) { return half[std::min(half.size() - 1, size_t(p / 100.0 * double(half.size())))]; };
        std::printf("{\"bytes\": %lld, \"n\": %zu, \"p50_us\": %.3f, \"p99_us\": %.3f}\n", (long long)size,
                    half.size(), pct(50), pct(99));
        std::fflush(stdout);
      }
    }
    // B keeps its publisher until A, which has the last reply, has gone (at most 10 s).
    if (!a) {
      const int64_t end_by = now_ns() + 10'000'000'000;
      while (sub.connected() && now_ns() < end_by) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "net_pingpong (side %s): %s\n", side.c_str(), e.what());
    return 1;
  }
  return 0;
}
