// net_leakcheck.cpp — a user's program built with AddressSanitizer that uses listen= / connect= and exits: its leak
// check at exit must run and find nothing. (With GCC 12/13's LeakSanitizer it needs ASAN_OPTIONS to hold
// intercept_tls_get_addr=0, as README "Across machines" says: that runtime guesses the size of a dlopened library's
// thread-local block, UCX's here, from the bytes before it and crashes its tracer when the guess is garbage.)
// ctest runs it with UCX_MEM_EVENTS unset, UCX's default; exit status 77 is "skipped" (no UCX here).
#include <chrono>
#include <cstdio>
#include <thread>

#include "tensorwire/tensorwire.hpp"

int main() {
  using namespace std::chrono_literals;
  const std::string why = tw::net::ucx_unavailable_reason();
  if (!why.empty()) {
    std::printf("skipped: UCX cannot run here: %s\n", why.c_str());
    return 77;
  }
  const std::string topic = "twnet-leakcheck-" + std::to_string(::getpid());
  tw::Publisher pub(topic, tw::PublisherOptions{.listen = "127.0.0.1:0"});
  tw::Subscriber sub(topic, tw::SubscriberOptions{.connect = pub.address()});
  const auto until = std::chrono::steady_clock::now() + 30s;
  while (pub.remote_subscriber_count() == 0) {
    if (std::chrono::steady_clock::now() > until) {
      std::printf("the subscriber did not connect within 30 s\n");
      return 1;
    }
    std::this_thread::sleep_for(1ms);
  }
  // (a strided view that is not dense: packed once, the copy path with the most steps)
  pub.send(tw::Tensor::zeros({3, 8}, tw::DType::float32()).slice(1, 0, 8, 2).transpose(0, 1), {}, 10s);
  const std::optional<tw::Tensor> t = sub.recv(10s);
  if (!t || t->shape() != tw::Shape{4, 3}) {
    std::printf("nothing, or the wrong shape, arrived\n");
    return 1;
  }
  std::printf("received %s over %s; exiting into the leak check\n", t->shape().str().c_str(), t->buffer().transport());
  return 0;  // the sanitizer's leak check runs after this, with UCX loaded
}
