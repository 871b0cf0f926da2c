// CUDA tensors between processes on a real GPU, through the C++ API (issue 10): the other process is
// tw_cuda_ipc_peer (cuda_ipc_peer.cpp), started with fork + exec, so each side has a CUDA context of its own as two
// applications would. What arrives is compared bit for bit with what was sent: the stacked plane of a driver
// allocation (legacy IPC, with its offset), every layout of a device loan (VMM), four subscribers, a copy still
// running on the producer's stream when send() returns, and SIGKILL of either side (the publisher reclaims a dead
// subscriber's lease and frees its device memory; a subscriber's received tensor stays readable after the
// publisher died). scripts/test-gpu.sh also runs this binary under compute-sanitizer (--target-processes all).
//
// Every test skips on a machine without a CUDA device, naming why; TW_REQUIRE_CUDA=1 turns that into a failure.
// The fake-driver tests of the same bookkeeping (no GPU needed) are in test_cuda_host.cpp.
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cuda/driver.hpp"
#include "tensorwire/cuda.hpp"
#include "tensorwire/device_runtime.hpp"
#include "tensorwire/ipc.hpp"
#include "tw_test_cuda.hpp"
#include "tw_test_util.hpp"

namespace {

namespace d = tw::cuda::detail;
using tw::Device;
using tw::DType;
using tw::Shape;
using tw::Tensor;
using namespace std::chrono_literals;

using tw_test::bytes_of;
using tw_test::join;

std::string topic(const char* what) {
  return "tw-test-cuda-ipc-" + std::to_string(::getpid()) + "-" + what;
}

// tw_cuda_ipc_peer, built next to this test.
std::string peer_path() {
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return "tw_cuda_ipc_peer";
  std::string p(self, static_cast<size_t>(n));
  return p.substr(0, p.rfind('/') + 1) + "tw_cuda_ipc_peer";
}

// A running peer: its pid and the read end of its stdout. Killed (SIGKILL) and reaped when it goes.
class Peer {
 public:
  explicit Peer(const std::vector<std::string>& args) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
    const std::string path = peer_path();
    std::vector<std::string> all{path};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {  // (async-signal-safe calls only until exec)
      ::dup2(fds[1], 1);
      ::execv(path.c_str(), argv.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    out_ = fds[0];
    if (pid_ < 0) throw std::runtime_error("fork failed");
  }
  ~Peer() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      int st = 0;
      ::waitpid(pid_, &st, 0);
    }
    if (out_ >= 0) ::close(out_);
  }
  Peer(const Peer&) = delete;
  Peer& operator=(const Peer&) = delete;

  // The next line it printed, or nullopt when none came within `within` (or it closed its stdout).
  std::optional<std::string> line(std::chrono::milliseconds within = 30s) {
    const auto until = std::chrono::steady_clock::now() + within;
    for (;;) {
      const size_t nl = buf_.find('\n');
      if (nl != std::string::npos) {
        std::string l = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return l;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
      if (left.count() <= 0) return std::nullopt;
      pollfd p{out_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char chunk[4096];
      const ssize_t r = ::read(out_, chunk, sizeof chunk);
      if (r <= 0) return std::nullopt;
      buf_.append(chunk, static_cast<size_t>(r));
    }
  }
  // The next line, which must be `what` (anything else, or nothing, fails the test through the returned text).
  ::testing::AssertionResult expect(const std::string& what, std::chrono::milliseconds within = 30s) {
    const auto l = line(within);
    if (!l) return ::testing::AssertionFailure() << "the peer printed no '" << what << "' line";
    if (*l != what) return ::testing::AssertionFailure() << "the peer printed '" << *l << "', not '" << what << "'";
    return ::testing::AssertionSuccess();
  }
  // Its exit status (128 + signal when killed), waiting at most `within`; -1 when it had not ended (then killed).
  int wait(std::chrono::milliseconds within = 30s) {
    const auto until = std::chrono::steady_clock::now() + within;
    for (;;) {
      int st = 0;
      const pid_t r = ::waitpid(pid_, &st, WNOHANG);
      if (r == pid_) {
        pid_ = -1;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
      if (std::chrono::steady_clock::now() > until) return -1;  // (the destructor kills it)
      std::this_thread::sleep_for(2ms);
    }
  }
  void kill() const { ::kill(pid_, SIGKILL); }

 private:
  pid_t pid_ = -1;
  int out_ = -1;
  std::string buf_;
};

// "MSG k=v k=v ..." -> {k: v}; empty when the line is not a MSG line.
std::map<std::string, std::string> fields(const std::optional<std::string>& l) {
  std::map<std::string, std::string> f;
  if (!l || l->rfind("MSG ", 0) != 0) return f;
  std::istringstream in(l->substr(4));
  std::string kv;
  while (in >> kv) {
    const size_t eq = kv.find('=');
    if (eq != std::string::npos) f[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return f;
}

// What the peer must print for `sent`, received through `transport`.
void expect_arrived(const std::map<std::string, std::string>& got, const Tensor& sent, const std::string& transport,
                    const std::string& step = "-") {
  ASSERT_FALSE(got.empty()) << "no MSG line from the peer";
  EXPECT_EQ(got.at("transport"), transport);
  EXPECT_EQ(got.at("device"), sent.device().str());
  EXPECT_EQ(got.at("dtype"), sent.dtype().name());
  EXPECT_EQ(got.at("shape"), join(sent.shape().vec()));
  EXPECT_EQ(got.at("strides"), join(sent.strides().vec()));
  EXPECT_EQ(got.at("step"), step);
  EXPECT_EQ(got.at("bytes"), bytes_of(sent)) << "the values that arrived differ from those sent";
}

// Waits (bounded) until `pub` has exactly `n` subscribers.
::testing::AssertionResult has_subscribers(const tw::Publisher& pub, size_t n) {
  const auto until = std::chrono::steady_clock::now() + 20s;
  while (pub.subscriber_count() != n) {  // (exactly: a peer that exited is gone first)
    if (std::chrono::steady_clock::now() > until)
      return ::testing::AssertionFailure() << pub.subscriber_count() << " subscribers after 20 s, not " << n;
    std::this_thread::sleep_for(2ms);
  }
  return ::testing::AssertionSuccess();
}

// Host values -> a new tensor on cuda:0 (the copy done when this returns).
Tensor on_device(const Tensor& host) {
  Tensor t = host.to(Device::cuda(0));
  tw::device_runtime().synchronize_stream(Device::cuda(0), 1);
  return t;
}

Tensor arange_f32(int64_t n) {
  Tensor h = Tensor::empty({n}, DType::float32());
  for (int64_t i = 0; i < n; ++i) h.data<float>()[i] = static_cast<float>(i);
  return h;
}

// Free device memory on cuda:0 (cuMemGetInfo), after this process gave back what it caches.
size_t free_device_bytes() {
  tw::cuda::empty_cache();
  d::ContextGuard g(0);
  size_t free_b = 0, total = 0;
  d::check(d::driver().api.cuMemGetInfo(&free_b, &total), "cuMemGetInfo");
  return free_b;
}

// What the driver's own bookkeeping may move between two readings. cuMemGetInfo sees the whole device: these
// tests run alone (RUN_SERIAL in tests/cpp/CMakeLists.txt), and leak 64 MiB allocations if they leak.
// (32 MiB: the driver may keep state it made lazily during a test, in 2 MiB pages: streams, the IPC event pool, page
// tables of mappings; the leaks these tests look for are 64 MiB and more)
constexpr size_t kMemSlack = size_t{32} << 20;

// Free device memory plus the slack, read until it is back to `before` or 10 s have passed: a SIGKILLed peer's
// context and a released import are torn down by the driver and our releaser thread, which may finish a little after
// waitpid returns. A leak stays short for the whole 10 s and fails the caller's check.
size_t free_device_bytes_once_back_to(size_t before) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  size_t now = free_device_bytes() + kMemSlack;
  while (now < before && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    now = free_device_bytes() + kMemSlack;
  }
  return now;
}

TEST(CudaIpcPeer, HostLoansCrossThroughThePeerAndAKilledHolderIsReclaimed) {
  // The harness itself, on any machine: the peer, its lines and the comparison, with host memory (what the GPU
  // tests below rely on, proven where there is no GPU).
  const std::string name = topic("host");
  tw::Publisher pub(name, tw::PublisherOptions{.max_buffers = 2});
  Peer peer({"recv", name, "2", "hold"});
  ASSERT_TRUE(peer.expect("READY"));
  ASSERT_TRUE(has_subscribers(pub, 1));
  Tensor loan = pub.loan({4, 6}, DType::int16(), 10s);
  for (int i = 0; i < 24; ++i) loan.data<int16_t>()[i] = static_cast<int16_t>(i * 1000 - 7000);
  Tensor view = loan.slice(0, std::nullopt, std::nullopt, -1).transpose(0, 1);
  ASSERT_EQ(pub.send(view, tw::Metadata{{"step", 3}}, 10s), 1u);
  expect_arrived(fields(peer.line()), view, "shm", "3");
  const std::vector<float> values{1.5f, -2.f, 3.25f}, off_by_a_bit{1.5f, -2.f, 3.5f};
  const Tensor other = Tensor::copy_of(std::span<const float>(values), {3});
  ASSERT_EQ(pub.send(other, {}, 10s), 1u);  // (into the second pool buffer)
  const auto got = fields(peer.line());
  expect_arrived(got, other, "shm-copy");
  EXPECT_NE(got.at("bytes"), bytes_of(Tensor::copy_of(std::span<const float>(off_by_a_bit), {3})))
      << "the comparison sees a one-bit difference";
  ASSERT_TRUE(peer.expect("HOLDING"));
  loan = view = Tensor();
  peer.kill();
  EXPECT_EQ(peer.wait(), 128 + SIGKILL);
  // Both pool buffers come back from the killed holder.
  Tensor again = pub.loan({4, 6}, DType::int16(), 10s), more = pub.loan({4, 6}, DType::int16(), 10s);
  EXPECT_EQ(pub.pool_buffers(), 2u);
}

TEST(CudaIpcGpu, TheStackedPlaneOfADriverAllocationArrivesWithItsOffset) {
  TW_NEED_CUDA();
  // The seed bug, between two processes: two 2x3 planes in one cuMemAlloc allocation, the second sent first.
  const std::string name = topic("stack");
  tw::Publisher pub(name);
  Peer peer({"recv", name, "2"});
  ASSERT_TRUE(peer.expect("READY"));
  ASSERT_TRUE(has_subscribers(pub, 1));
  d::CUdeviceptr p = 0;
  {
    d::ContextGuard g(0);
    d::check(d::driver().api.cuMemAlloc(&p, 12 * sizeof(float)), "cuMemAlloc");
  }
  auto freed = std::make_shared<std::atomic<bool>>(false);
  std::shared_ptr<void> owner(reinterpret_cast<void*>(p), [freed](void* q) {
    freed->store(true);
    d::ContextGuard g(0);
    d::driver().api.cuMemFree(reinterpret_cast<d::CUdeviceptr>(q));
  });
  auto buf = std::make_shared<tw::Buffer>(reinterpret_cast<void*>(p), 12 * sizeof(float), Device::cuda(0), owner);
  owner.reset();
  Tensor stacked = Tensor::make(buf, tw::Layout{DType::float32(), {2, 2, 3}, {6, 3, 1}, 0, false}, false);
  buf.reset();
  tw::device_runtime().copy(arange_f32(12).view({2, 2, 3}), stacked, 1);
  tw::device_runtime().synchronize_stream(Device::cuda(0), 1);
  Tensor second = stacked.select(0, 1), first = stacked.select(0, 0);
  ASSERT_EQ(pub.send(second, tw::Metadata{{"step", 7}}, 20s), 1u);
  ASSERT_EQ(pub.send(first, {}, 20s), 1u);
  expect_arrived(fields(peer.line()), second, "cuda-ipc", "7");
  expect_arrived(fields(peer.line()), first, "cuda-ipc");
  EXPECT_EQ(bytes_of(second), bytes_of(on_device(arange_f32(12)).slice(0, 6, 12).view({2, 3})))
      << "the sender's own view changed";
  EXPECT_EQ(peer.wait(), 0);
  stacked = second = first = Tensor();
  pub.close();
  // (a subscriber that exited just before may not be known dead yet at close: its allocation then lingers until
  // the hang-up is seen, at once)
  const auto until = std::chrono::steady_clock::now() + 5s;
  while (!freed->load() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(freed->load()) << "closed, with its subscriber gone, the publisher lets the allocation go";
}

TEST(CudaIpcGpu, EveryLayoutOfADeviceLoanArrivesBitExact) {
  TW_NEED_CUDA();
  const std::string name = topic("layouts");
  tw::Publisher pub(name, tw::PublisherOptions{.depth = 16});
  for (const DType dt : {DType::float32(), DType::uint8(), DType::float64(), DType::complex128()}) {
    SCOPED_TRACE(dt.name());
    Tensor loan = pub.loan({4, 6, 5}, dt, Device::cuda(0), 20s);
    ASSERT_EQ(loan.device(), Device::cuda(0));
    Tensor host = Tensor::empty({4, 6, 5}, dt);
    auto* hb = static_cast<unsigned char*>(host.data_ptr());
    for (int64_t i = 0; i < host.nbytes(); ++i) hb[i] = static_cast<unsigned char>((i * 131 + 17) & 0xFF);
    tw::device_runtime().copy(host, loan, 1);
    const std::vector<Tensor> views = {loan,
                                       loan.select(0, 2),                                      // a plane at an offset
                                       loan.permute({2, 0, 1}),                                // permuted
                                       loan.slice(1, 1, 6, 2),                                 // steps, offset
                                       loan.slice(0, std::nullopt, std::nullopt, -1),          // negative stride
                                       loan.slice(0, 1, 2).expand({3, 6, 5}),                  // stride 0
                                       loan.slice(2, std::nullopt, std::nullopt, -2).transpose(0, 2)};
    Peer peer({"recv", name, std::to_string(views.size())});
    ASSERT_TRUE(peer.expect("READY"));
    ASSERT_TRUE(has_subscribers(pub, 1));
    for (const Tensor& v : views) {
      tw::SendOptions o;
      o.timeout = 20s;  // (every wait bounded)
      o.stream = 1;  // the copy above is queued there
      ASSERT_EQ(pub.send(v, o), 1u);
    }
    for (const Tensor& v : views) expect_arrived(fields(peer.line()), v, "cuda-vmm");
    EXPECT_EQ(peer.wait(), 0);
    EXPECT_EQ(bytes_of(loan), bytes_of(host)) << "a subscriber's reads changed the loan";
  }
}

TEST(CudaIpcGpu, FourSubscribersEachGetEveryMessage) {
  TW_NEED_CUDA();
  const std::string name = topic("fanout");
  tw::Publisher pub(name);
  std::vector<std::unique_ptr<Peer>> peers;
  for (int i = 0; i < 4; ++i) {
    peers.push_back(std::make_unique<Peer>(std::vector<std::string>{"recv", name, "2"}));
    ASSERT_TRUE(peers.back()->expect("READY"));
  }
  ASSERT_TRUE(has_subscribers(pub, 4));
  const Tensor a = on_device(arange_f32(600).view({20, 30})).transpose(0, 1);  // tensorwire's own device memory
  Tensor loan = pub.loan({3, 1000}, DType::float32(), Device::cuda(0), 20s);
  tw::device_runtime().copy(arange_f32(3000).view({3, 1000}), loan, 1);
  const Tensor plane = loan.select(0, 1);
  tw::SendOptions o;
  o.timeout = 20s;  // (every wait bounded)
  o.stream = 1;
  ASSERT_EQ(pub.send(a, o), 4u);
  ASSERT_EQ(pub.send(plane, o), 4u);
  for (auto& p : peers) {
    const auto first = fields(p->line());
    ASSERT_FALSE(first.empty());
    // (tensorwire's own device pool: VMM where the device has it, else cuMemAlloc, opened by a legacy handle)
    EXPECT_TRUE(first.at("transport") == "cuda-vmm" || first.at("transport") == "cuda-ipc") << first.at("transport");
    expect_arrived(first, a, first.at("transport"));
    expect_arrived(fields(p->line()), plane, "cuda-vmm");
    EXPECT_EQ(p->wait(), 0);
  }
}

TEST(CudaIpcGpu, ACopyStillRunningWhenSendReturnsIsWaitedForNotRaced) {
  TW_NEED_CUDA();
  // 64 MiB written over and over on a stream of the producer's and sent at once: the subscriber's reads must wait
  // on the publisher's event and see the last write whole.
  constexpr int64_t n = int64_t{64} << 20;
  const std::string name = topic("ordering");
  tw::Publisher pub(name);
  Peer peer({"recv", name, "1"});
  ASSERT_TRUE(peer.expect("READY"));
  ASSERT_TRUE(has_subscribers(pub, 1));
  d::CUstream s = nullptr;
  {
    d::ContextGuard g(0);
    d::check(d::driver().api.cuStreamCreate(&s, d::kStreamNonBlocking), "cuStreamCreate");
  }
  const auto stream = reinterpret_cast<intptr_t>(s);
  std::vector<Tensor> sources;
  for (int k = 0; k < 4; ++k) {
    Tensor h = Tensor::empty({n}, DType::uint8());
    auto* b = static_cast<unsigned char*>(h.data_ptr());
    for (int64_t i = 0; i < n; ++i) b[i] = static_cast<unsigned char>((i * (k + 3) + k) & 0xFF);
    sources.push_back(on_device(h));
  }
  Tensor loan = pub.loan({n}, DType::uint8(), Device::cuda(0), 20s);
  {
    d::ContextGuard g(0);
    d::check(d::driver().api.cuMemsetD8Async(reinterpret_cast<d::CUdeviceptr>(loan.data_ptr()), 0,
                                             static_cast<size_t>(n), s), "cuMemsetD8Async");
    d::check(d::driver().api.cuStreamSynchronize(s), "cuStreamSynchronize");
  }
  // The premise made certain, not hoped for (a GPU copies 64 MiB in tens of microseconds, quicker than the host
  // queues work): a host function holds the stream shut until the check after send has run, and the copies queue
  // behind it. (cuLaunchHostFunc, from the driver tensorwire loaded; the gate opens on every way out of this test.)
  using HostFn = void (*)(void*);
  using LaunchHostFunc = d::CUresult (*)(d::CUstream, HostFn, void*);
  void* libcuda = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(libcuda, nullptr) << ::dlerror();
  const auto launch_host_func = reinterpret_cast<LaunchHostFunc>(::dlsym(libcuda, "cuLaunchHostFunc"));
  ASSERT_NE(launch_host_func, nullptr) << ::dlerror();
  static std::atomic<bool> gate_open;
  gate_open = false;
  struct OpenGate {
    d::CUstream s;
    void* lib;
    ~OpenGate() {
      gate_open = true;
      d::ContextGuard g(0);
      d::driver().api.cuStreamSynchronize(s);
      ::dlclose(lib);
    }
  } open_gate{s, libcuda};
  {
    d::ContextGuard g(0);
    d::check(launch_host_func(s, [](void*) {
      const auto until = std::chrono::steady_clock::now() + 30s;  // (bounded, like every wait)
      while (!gate_open.load() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(100us);
    }, nullptr), "cuLaunchHostFunc");
  }
  // 64 copies of 64 MiB behind the gate, the last from sources.back().
  for (size_t k = 0; k < 64; ++k) tw::device_runtime().copy(sources[k % sources.size()], loan, stream);
  tw::SendOptions o;
  o.timeout = 20s;  // (every wait bounded)
  o.stream = stream;
  ASSERT_EQ(pub.send(std::move(loan), o), 1u);
  {
    // The premise: the copies cannot have run when send returns (else this test would prove no ordering at all).
    d::ContextGuard g(0);
    void* mark = tw::cuda::record_event(stream, 0);
    const d::CUresult q = d::driver().api.cuEventQuery(static_cast<d::CUevent>(mark));
    tw::cuda::destroy_event(mark);
    EXPECT_EQ(q, d::kErrorNotReady) << "the stream ran past the gate before it was opened";
  }
  // The subscriber has the message; its read waits on the publisher's event, which waits on the gate: open it a
  // moment after, so that a subscriber that did not wait reads the loan's zeros.
  std::this_thread::sleep_for(200ms);
  gate_open = true;
  expect_arrived(fields(peer.line()), sources.back(), "cuda-vmm");
  EXPECT_EQ(peer.wait(), 0);
  d::ContextGuard g(0);
  d::driver().api.cuStreamSynchronize(s);
}

TEST(CudaIpcGpu, AKilledSubscribersLeaseIsReclaimedAndNoDeviceMemoryStays) {
  TW_NEED_CUDA();
  constexpr int64_t n = int64_t{64} << 20;
  const size_t before = free_device_bytes();
  {
    const std::string name = topic("killsub");
    // One pool buffer: the next loan can only be had once the dead subscriber's lease is reclaimed.
    tw::Publisher pub(name, tw::PublisherOptions{.max_buffers = 1});
    Peer peer({"recv", name, "1", "hold"});
    ASSERT_TRUE(peer.expect("READY"));
    ASSERT_TRUE(has_subscribers(pub, 1));
    Tensor loan = pub.loan({n}, DType::uint8(), Device::cuda(0), 20s);
    tw::device_runtime().copy(Tensor::zeros({n}, DType::uint8()), loan, 1);
    tw::SendOptions o;
    o.timeout = 20s;  // (every wait bounded)
    o.stream = 1;
    ASSERT_EQ(pub.send(std::move(loan), o), 1u);
    ASSERT_FALSE(fields(peer.line()).empty());
    ASSERT_TRUE(peer.expect("HOLDING"));
    peer.kill();
    EXPECT_EQ(peer.wait(), 128 + SIGKILL);
    Tensor again = pub.loan({n}, DType::uint8(), Device::cuda(0), 10s);
    EXPECT_EQ(again.device(), Device::cuda(0));
    EXPECT_EQ(pub.pool_buffers(), 1u);
  }
  EXPECT_GE(free_device_bytes_once_back_to(before), before) << "device memory stayed allocated after everything closed";
}

// What cuda_ipc_peer's publish modes send: byte i is (i * 7 + 3) & 0xFF.
Tensor peer_pattern(int64_t n) {
  Tensor t = Tensor::empty({n}, DType::uint8());
  auto* b = static_cast<unsigned char*>(t.data_ptr());
  for (int64_t i = 0; i < n; ++i) b[i] = static_cast<unsigned char>((i * 7 + 3) & 0xFF);
  return t;
}

TEST(CudaIpcGpu, AKilledPublisherLeavesReceivedTensorsReadable) {
  TW_NEED_CUDA();
  constexpr int64_t n = int64_t{64} << 20;  // far above kMemSlack: a mapping left behind shows
  const size_t before = free_device_bytes();
  const std::string name = topic("killpub");
  {
    Peer peer({"publish", name, std::to_string(n)});
    ASSERT_TRUE(peer.expect("READY"));
    tw::Subscriber sub(name);
    ASSERT_TRUE(sub.connected());
    ASSERT_TRUE(peer.expect("SENT"));
    auto t = sub.recv(20s);
    ASSERT_TRUE(t);
    EXPECT_EQ(std::string(t->buffer().transport()), "cuda-vmm");
    peer.kill();
    EXPECT_EQ(peer.wait(), 128 + SIGKILL);
    const Tensor expected = peer_pattern(n);
    EXPECT_EQ(bytes_of(*t), bytes_of(expected)) << "the tensor must stay readable after its publisher died";
    // The stream ends (bounded): the publisher is gone.
    const auto until = std::chrono::steady_clock::now() + 20s;
    while (sub.connected() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(5ms);
    EXPECT_FALSE(sub.connected());
    t.reset();
  }
  EXPECT_GE(free_device_bytes_once_back_to(before), before) << "the imported mapping stayed after its last user went";
}

// "Send, then close (or exit)" is ordinary use: the subscriber reads the message after the publisher destroyed its
// interprocess event, which it must then neither open nor wait on (undefined behaviour); the publisher finished
// the event's work before its BYE, and the memory lives on through the fd this process was sent.
TEST(CudaIpcGpu, AMessageReadAfterItsPublisherClosedAndExitedArrivesWhole) {
  TW_NEED_CUDA();
  constexpr int64_t n = int64_t{16} << 20;
  const size_t before = free_device_bytes();
  const std::string name = topic("closedpub");
  {
    Peer peer({"publish-close", name, std::to_string(n)});
    ASSERT_TRUE(peer.expect("READY"));
    tw::Subscriber sub(name);
    ASSERT_TRUE(sub.connected());
    ASSERT_TRUE(peer.expect("CLOSED"));
    EXPECT_EQ(peer.wait(), 0);
    auto t = sub.recv(20s);  // only now: the publisher's process is gone
    ASSERT_TRUE(t);
    EXPECT_EQ(std::string(t->buffer().transport()), "cuda-vmm");
    const Tensor expected = peer_pattern(n);
    EXPECT_EQ(bytes_of(*t), bytes_of(expected));
    EXPECT_FALSE(sub.recv(2s));  // then the end of the stream, as the publisher announced it
    EXPECT_TRUE(sub.closed());
    EXPECT_NE(std::string(sub.why_ended()).find("closed the topic"), std::string::npos) << sub.why_ended();
    t.reset();
  }
  EXPECT_GE(free_device_bytes_once_back_to(before), before) << "the imported mapping stayed after its last user went";
}

}  // namespace
