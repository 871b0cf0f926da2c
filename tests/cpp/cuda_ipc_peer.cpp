// cuda_ipc_peer — the other process of tw_test_cuda_ipc (test_cuda_ipc_gpu.cpp): a subscriber or a publisher of
// CUDA tensors on a real GPU. The test starts it with fork + exec (a process that has initialised CUDA cannot use
// it in a fork()ed child) and reads its stdout, one line per event.
//
//   tw_cuda_ipc_peer recv TOPIC N [hold]
//       Subscribes to TOPIC, prints READY once connected, receives N messages (20 s each) and prints for each
//         MSG transport=T device=D dtype=N shape=A,B strides=X,Y step=S bytes=B
//       where step is the message's metadata "step" (or -) and bytes its elements in C order, brought to the host:
//       hex when at most 4 KiB, else fnv:<FNV-1a 64 of them, hex>. With `hold` it then prints HOLDING and sleeps,
//       holding every message's lease, until it is killed; otherwise it exits 0.
//   tw_cuda_ipc_peer publish TOPIC NBYTES
//       Publishes TOPIC, prints READY, waits (20 s) for a subscriber, sends a device loan (cuda:0) of NBYTES uint8
//       whose byte i is (i * 7 + 3) & 0xFF, prints SENT, and sleeps until it is killed.
// Any failure: a line "ERROR <what>" and exit status 1.
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tensorwire/device_runtime.hpp"
#include "tensorwire/ipc.hpp"
#include "tensorwire/tensorwire.hpp"
#include "tw_test_cuda.hpp"

namespace {

void say(const std::string& line) {
  std::fputs((line + "\n").c_str(), stdout);
  std::fflush(stdout);
}

using tw_test::bytes_of;
using tw_test::join;

[[noreturn]] void sleep_until_killed() {
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

int recv_side(const std::string& topic, int n, bool hold) {
  tw::Subscriber sub(topic);
  if (!sub.connected()) throw std::runtime_error("not connected to " + topic);
  say("READY");
  std::vector<tw::Tensor> held;
  for (int i = 0; i < n; ++i) {
    auto t = sub.recv(std::chrono::seconds(20));
    if (!t) throw std::runtime_error("message " + std::to_string(i) + " did not come within 20 s");
    const tw::Value* step = t->metadata().find("step");
    say(std::string("MSG transport=") + (t->buffer().transport() ? t->buffer().transport() : "-") +
        " device=" + t->device().str() + " dtype=" + t->dtype().name() + " shape=" +
        join(t->shape().vec()) + " strides=" +
        join(t->strides().vec()) +
        " step=" + (step ? std::to_string(step->as_int()) : std::string("-")) +
        " bytes=" + bytes_of(*t));
    if (hold) held.push_back(std::move(*t));
  }
  if (hold) {
    say("HOLDING");
    sleep_until_killed();
  }
  return 0;
}

int publish_side(const std::string& topic, int64_t nbytes, bool close_and_exit = false) {
  tw::Publisher pub(topic);
  say("READY");
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (pub.subscriber_count() < 1) {
    if (std::chrono::steady_clock::now() > until) throw std::runtime_error("no subscriber within 20 s");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  tw::Tensor src = tw::Tensor::empty({nbytes}, tw::DType::uint8());
  auto* p = static_cast<unsigned char*>(src.data_ptr());
  for (int64_t i = 0; i < nbytes; ++i) p[i] = static_cast<unsigned char>((i * 7 + 3) & 0xFF);
  tw::Tensor loan = pub.loan({nbytes}, tw::DType::uint8(), tw::Device::cuda(0), std::chrono::seconds(20));
  tw::device_runtime().copy(src, loan, 1);
  tw::SendOptions o;
  o.stream = 1;  // the copy's stream: the subscriber waits on its event
  o.timeout = std::chrono::seconds(20);
  if (pub.send(std::move(loan), o) != 1) throw std::runtime_error("the message reached no subscriber");
  if (close_and_exit) {  // no synchronize of our own: close() must finish the event's work before its BYE
    pub.close();
    say("CLOSED");
    return 0;
  }
  // The copy and the interprocess event recorded after it done before the test may kill this process: what the
  // killed-publisher test checks is that a finished message outlives its publisher, not a half-written one.
  tw::device_runtime().synchronize_stream(tw::Device::cuda(0), 1);
  say("SENT");
  sleep_until_killed();
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::vector<std::string> a(argv + 1, argv + argc);
    if (a.size() >= 3 && a[0] == "recv") return recv_side(a[1], std::atoi(a[2].c_str()), a.size() > 3 && a[3] == "hold");
    if (a.size() == 3 && a[0] == "publish") return publish_side(a[1], std::atoll(a[2].c_str()));
    if (a.size() == 3 && a[0] == "publish-close") return publish_side(a[1], std::atoll(a[2].c_str()), true);
    say("ERROR usage: tw_cuda_ipc_peer recv TOPIC N [hold] | publish TOPIC NBYTES | publish-close TOPIC NBYTES");
    return 2;
  } catch (const std::exception& e) {
    say(std::string("ERROR ") + e.what());
    return 1;
  }
}
