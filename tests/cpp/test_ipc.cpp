// IPC publish/subscribe: the wire format frozen, hostile input refused, the ring under threads (TSan: names with
// "Concurr" / "Thread"), and real processes (fork): every layout and dtype, metadata, fan-out, on_full policies,
// subscriber and publisher SIGKILL, leaks of fds and mappings.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <linux/capability.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <atomic>
#include <chrono>
#include <cstring>
#include <dirent.h>
#include <fstream>
#include <functional>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "../../src/core/text.hpp"
#include "../../src/ipc/ipc_internal.hpp"
#include "tensorwire/ipc.hpp"
#include "tw_test_util.hpp"

namespace {

using namespace std::chrono_literals;
using tw::DType;
using tw::Metadata;
using tw::Publisher;
using tw::PublisherOptions;
using tw::Shape;
using tw::Subscriber;
using tw::Tensor;
using tw::Value;
namespace ipc = tw::ipc_detail;

std::string topic(const char* what) {
  static std::atomic<int> n{0};
  return "test/ipc/" + std::to_string(::getpid()) + "/" + what + "/" + std::to_string(n++);
}

// A pipe between a test and the children it forks, closed when it goes. After the fork the parent closes its copy
// of the end only the children use (parent_reads / parent_writes): a child that dies early then ends the parent's
// read with EOF (a failed assertion, not a block until ctest's timeout), and a parent that returns early on a failed
// assertion ends a child's read the same way.
struct Pipe {
  int fd[2] = {-1, -1};
  Pipe() {
    if (::pipe2(fd, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
  }
  ~Pipe() {
    for (int f : fd)
      if (f >= 0) ::close(f);
  }
  Pipe(const Pipe&) = delete;
  Pipe& operator=(const Pipe&) = delete;
  int r() const { return fd[0]; }
  int w() const { return fd[1]; }
  // The parent's one byte to its children: false when none is left to read it. (A plain write would raise the
  // SIGPIPE that kills the test process instead of failing the assertion.)
  bool tell() const {
    sigset_t pipe_only, old;
    sigemptyset(&pipe_only);
    sigaddset(&pipe_only, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_only, &old);
    const char c = 1;
    const bool ok = ::write(fd[1], &c, 1) == 1;
    if (!ok && errno == EPIPE) {
      const timespec now{};
      sigtimedwait(&pipe_only, nullptr, &now);  // take the pending SIGPIPE back
    }
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    return ok;
  }
  void parent_reads() { drop(1); }   // children write
  void parent_writes() { drop(0); }  // children read
 private:
  void drop(int end) {
    if (fd[end] >= 0) ::close(fd[end]);
    fd[end] = -1;
  }
};

// Runs fn in a child process; its return value is the exit status (exceptions and gtest failures give 99).
pid_t spawn(const std::function<int()>& fn) {
  pid_t pid = ::fork();
  if (pid == 0) {
    int rc = 99;
    try {
      rc = fn();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child: %s\n", e.what());
    }
    std::fflush(stderr);
    ::_exit(rc);
  }
  return pid;
}

int wait_exit(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + WTERMSIG(status);
}

size_t count_fds() {
  size_t n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (::readdir(d)) ++n;
    ::closedir(d);
  }
  return n;
}

size_t count_tw_mappings() {
  std::ifstream f("/proc/self/maps");
  std::string line;
  size_t n = 0;
  while (std::getline(f, line)) n += line.find("memfd:tensorwire") != std::string::npos ? 1u : 0u;
  return n;
}

// A deterministic tensor of each test case, the same in every process.
Tensor fill(Tensor t) {  // t contiguous and writable
  auto* p = static_cast<uint8_t*>(t.data_ptr());
  for (int64_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<uint8_t>((i * 37 + 11) & 0xff);
  if (t.dtype() == DType::boolean())
    for (int64_t i = 0; i < t.nbytes(); ++i) p[i] &= 1;
  return t;
}

Tensor make_case(int c) {
  switch (c) {
    case 0: return fill(Tensor::empty({2, 3}, DType::float32()));
    case 1: return fill(Tensor::empty({4, 5}, DType::int32())).transpose(0, 1);
    case 2: return fill(Tensor::empty({6, 7}, DType::float64())).slice(0, std::nullopt, std::nullopt, -1);
    case 3: return fill(Tensor::empty({1, 5}, DType::int16())).expand({4, 5});
    case 4: return fill(Tensor::empty({5, 8}, DType::uint8())).slice(1, 2, 7, 2).select(0, 3);
    case 5: return fill(Tensor::empty({3, 4, 5}, DType::int64())).permute({2, 0, 1}).slice(0, 1, std::nullopt, 2);
    case 6: return fill(Tensor::empty({0, 3}, DType::float32()));
    case 7: return fill(Tensor::empty({}, DType::float64()));
    case 8: return fill(Tensor::empty({3, 3}, DType::boolean())).transpose(0, 1);
    case 9: return fill(Tensor::empty({4, 2}, DType::complex64())).slice(0, std::nullopt, std::nullopt, -2);
    case 10: return fill(Tensor::empty({7}, DType::bfloat16()));
    case 11: return fill(Tensor::empty({2, 2, 2}, DType::float16())).permute({1, 2, 0});
    case 12: return fill(Tensor::empty({9}, DType::uint64())).slice(0, 8, std::nullopt, -3);
    case 13: return fill(Tensor::empty({1000, 33}, DType::float32())).slice(1, 1, 30);
    default: return {};
  }
}
constexpr int kCases = 14;

std::string bytes_of(const Tensor& t) {
  Tensor c = t.copy();
  return std::string(static_cast<const char*>(c.data_ptr()), static_cast<size_t>(c.nbytes()));
}

bool same_values(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && bytes_of(a) == bytes_of(b);
}

// ---- wire format ----------------------------------------------------------------------------------------------

TEST(IpcWire, LayoutIsFrozen) {
  EXPECT_EQ(offsetof(ipc::MessageDescriptor, magic), 0u);
  EXPECT_EQ(offsetof(ipc::MessageDescriptor, sequence), 8u);
  EXPECT_EQ(offsetof(ipc::MessageDescriptor, segment_id), 16u);
  EXPECT_EQ(offsetof(ipc::MessageDescriptor, alloc_offset), 24u);
  EXPECT_EQ(offsetof(ipc::MessageDescriptor, alloc_bytes), 32u);
  EXPECT_EQ(offsetof(ipc::MessageDescriptor, byte_offset), 40u);
  EXPECT_EQ(offsetof(ipc::MessageDescriptor, ndim), 52u);
  EXPECT_EQ(offsetof(ipc::MessageDescriptor, strides), 72u + 8 * tw::kMaxRank);
  EXPECT_EQ(offsetof(ipc::ChannelHeader, tail), 64u);
  EXPECT_EQ(offsetof(ipc::ChannelHeader, head), 128u);
  EXPECT_EQ(offsetof(ipc::ChannelHeader, producer_waiting), 88u);
  EXPECT_EQ(offsetof(ipc::ChannelHeader, detached), 144u);
  EXPECT_EQ(offsetof(ipc::ChannelHeader, space_word), 148u);
  EXPECT_EQ(sizeof(ipc::ControlWire), 32u);
  EXPECT_TRUE(std::is_trivially_copyable_v<ipc::MessageDescriptor>);
  EXPECT_TRUE(std::is_trivially_copyable_v<ipc::ChannelHeader>);
  EXPECT_TRUE(std::atomic_ref<uint64_t>::is_always_lock_free);
  EXPECT_TRUE(std::atomic_ref<uint32_t>::is_always_lock_free);
}

TEST(IpcWire, TopicNames) {
  tw::validate_topic_name("camera/front");
  tw::validate_topic_name("a.b-c_d:1");
  TW_EXPECT_ERROR(tw::validate_topic_name(""), tw::ErrorCode::invalid_argument);
  TW_EXPECT_ERROR_MSG(tw::validate_topic_name(std::string(65, 'a')), tw::ErrorCode::invalid_argument, "at most 64");
  TW_EXPECT_ERROR(tw::validate_topic_name("/abs"), tw::ErrorCode::invalid_argument);
  TW_EXPECT_ERROR(tw::validate_topic_name("sp ace"), tw::ErrorCode::invalid_argument);
  TW_EXPECT_ERROR(tw::validate_topic_name(std::string("nul\0x", 5)), tw::ErrorCode::invalid_argument);
  // The message quotes the name whole: a NUL in it reads \x00 (C readers of what(), Python's too, stopped there).
  TW_EXPECT_ERROR_MSG(tw::validate_topic_name(std::string("nul\0x", 5)), tw::ErrorCode::invalid_argument,
                      "topic name 'nul\\x00x' contains a control character (\\x00)");
  // Each offending character as a person reads it (a UTF-8 byte read "character 195"; a newline printed raw).
  TW_EXPECT_ERROR_MSG(tw::validate_topic_name("sp ace"), tw::ErrorCode::invalid_argument, "contains ' '; use letters");
  TW_EXPECT_ERROR_MSG(tw::validate_topic_name("caf\xC3\xA9"), tw::ErrorCode::invalid_argument,
                      "topic name 'caf\\xC3\\xA9' contains a non-ASCII character");
  TW_EXPECT_ERROR_MSG(tw::validate_topic_name("a\nb"), tw::ErrorCode::invalid_argument,
                      "'a\\x0Ab' contains a control character (\\x0A)");
  TW_EXPECT_ERROR_MSG(tw::validate_topic_name(std::string(65, 'a')), tw::ErrorCode::invalid_argument,
                      "is 65 bytes long; at most 64");
  EXPECT_STREQ(tw::Error(tw::ErrorCode::internal, std::string("a\0\0b\0", 5)).what(), "a\\x00\\x00b\\x00");
  TW_EXPECT_ERROR(Publisher("bad#name"), tw::ErrorCode::invalid_argument);
  TW_EXPECT_ERROR(Subscriber(std::string(100, 'x')), tw::ErrorCode::invalid_argument);
  EXPECT_EQ(tw::on_full_from_string("drop_oldest"), tw::OnFull::drop_oldest);
  TW_EXPECT_ERROR(tw::on_full_from_string("sometimes"), tw::ErrorCode::invalid_argument);
  // An OnFull that is none of the three (a cast integer) is refused, not taken for one of them.
  PublisherOptions o;
  o.on_full = static_cast<tw::OnFull>(99);
  TW_EXPECT_ERROR_MSG(Publisher("bad-on-full", o), tw::ErrorCode::invalid_argument, "on_full must be");
}

ipc::MessageDescriptor good_descriptor() {
  ipc::MessageDescriptor d{};
  tw::Layout l{DType::float32(), {2, 3}, {3, 1}, 8, false};
  ipc::encode_message(d, l, 1, 5, 0, 4096, 2, 0);
  return d;
}

TEST(IpcWire, DecodeAcceptsAGoodMessage) {
  auto m = ipc::decode_message(good_descriptor(), {}, 4096, 8, 1024);
  EXPECT_EQ(m.layout.shape, Shape(2, 3));
  EXPECT_EQ(m.layout.byte_offset, 8);
  EXPECT_EQ(m.lease_slot, 2u);
  std::string meta = tw::encode_metadata(Metadata{{"ts", 1.5}});
  auto d = good_descriptor();
  d.metadata_bytes = static_cast<uint32_t>(meta.size());
  EXPECT_EQ(ipc::decode_message(d, meta, 4096, 8, 1024).metadata.at("ts"), Value(1.5));
}

TEST(IpcWire, DecodeRefusesHostileMessages) {
  using tw::ErrorCode;
  auto expect_bad = [](ipc::MessageDescriptor d, std::string_view meta = {}, uint64_t seg = 4096) {
    EXPECT_THROW(ipc::decode_message(d, meta, seg, 8, 1024), tw::Error);
  };
  auto d = good_descriptor();
  d.magic = 0;
  expect_bad(d);
  d = good_descriptor();
  d.version = 99;
  expect_bad(d);
  d = good_descriptor();
  d.ndim = 65;
  expect_bad(d);
  d = good_descriptor();
  d.lease_slot = 8;
  expect_bad(d);
  d = good_descriptor();
  expect_bad(d, {}, 0);  // segment never announced
  d = good_descriptor();
  d.alloc_bytes = 8192;  // allocation beyond the segment
  expect_bad(d);
  d = good_descriptor();
  d.alloc_offset = ~uint64_t{0} - 10;
  expect_bad(d);
  d = good_descriptor();
  d.byte_offset = 4090;  // span past the allocation
  expect_bad(d);
  d = good_descriptor();
  d.byte_offset = -4;  // span before the allocation
  expect_bad(d);
  d = good_descriptor();
  d.strides[0] = INT64_MAX / 2;  // overflow
  expect_bad(d);
  d = good_descriptor();
  d.shape[1] = -1;
  expect_bad(d);
  d = good_descriptor();
  d.dtype_code = 200;
  expect_bad(d);
  d = good_descriptor();
  d.metadata_bytes = 3;  // lies about its metadata
  expect_bad(d, "ab");
  d = good_descriptor();
  d.metadata_bytes = 4;
  expect_bad(d, "junk");
  d = good_descriptor();
  d.metadata_bytes = 5000;  // over capacity
  expect_bad(d, std::string(5000, 'x'));
}

TEST(IpcWire, DecodeControlRefusesHostilePackets) {
  auto w = ipc::encode_control(ipc::ControlType::segment, 3, 4096);
  auto bytes = [](const ipc::ControlWire& x) {
    return std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(&x), sizeof x);
  };
  EXPECT_EQ(ipc::decode_control(bytes(w), 1).id, 3u);
  EXPECT_THROW(ipc::decode_control(bytes(w), 0), tw::Error);  // a segment without its fd
  EXPECT_THROW(ipc::decode_control(bytes(w).first(10), 1), tw::Error);
  auto bad = w;
  bad.type = 77;
  EXPECT_THROW(ipc::decode_control(bytes(bad), 1), tw::Error);
  bad = w;
  bad.id = 0;
  EXPECT_THROW(ipc::decode_control(bytes(bad), 1), tw::Error);
  auto wel = ipc::encode_control(ipc::ControlType::welcome, 0, 8);  // a channel smaller than its header
  EXPECT_THROW(ipc::decode_control(bytes(wel), 2), tw::Error);
}

TEST(IpcWire, ValidateChannelRefusesInconsistentHeaders) {
  auto h = ipc::make_channel_header(8, 1024, 64, 1);
  ipc::validate_channel(h, h.total_bytes);
  EXPECT_THROW(ipc::validate_channel(h, h.total_bytes - 1), tw::Error);
  auto b = h;
  b.cells = 1;
  EXPECT_THROW(ipc::validate_channel(b, h.total_bytes), tw::Error);
  b = h;
  b.cell_bytes = 64;
  EXPECT_THROW(ipc::validate_channel(b, h.total_bytes), tw::Error);
  b = h;
  b.leases_offset = 0;
  EXPECT_THROW(ipc::validate_channel(b, h.total_bytes), tw::Error);
  b = h;
  b.version = ipc::kWireVersion + 1;
  EXPECT_THROW(ipc::validate_channel(b, h.total_bytes), tw::Error);
}

// ---- the ring under threads (TSan) -----------------------------------------------------------------------------

struct LocalChannel {
  explicit LocalChannel(size_t depth) : h(ipc::make_channel_header(depth, 64, 4, 1)), mem(h.total_bytes) {
    std::memcpy(mem.data(), &h, sizeof h);
    ring = ipc::Ring(mem.data(), h);
    ring.init_cells();
  }
  ipc::ChannelHeader h;
  std::vector<char> mem;
  ipc::Ring ring;
};

TEST(IpcRingConcurrent, OrderedAndNothingLostWithProducerDrops) {
  for (size_t depth : {size_t{1}, size_t{2}, size_t{3}, size_t{8}}) {
    LocalChannel ch(depth);
    constexpr uint64_t kN = 200000;
    std::atomic<bool> done{false};
    uint64_t dropped = 0, received = 0;
    std::thread consumer([&] {
      uint64_t last = 0;
      for (;;) {
        bool finished = done.load();
        uint64_t seq = 0;
        if (ch.ring.try_pop([&](ipc::CellHeader& c) { seq = c.msg.sequence; }) == ipc::Pop::popped) {
          EXPECT_GT(seq, last);
          last = seq;
          ++received;
        } else if (finished) {
          break;
        }
      }
    });
    for (uint64_t i = 1; i <= kN; ++i) {
      for (;;) {
        if (ipc::CellHeader* c = ch.ring.begin_push()) {
          c->msg.sequence = i;
          ch.ring.commit_push();
          break;
        }
        if (ch.ring.full() && ch.ring.try_pop([](ipc::CellHeader&) {}) == ipc::Pop::popped) ++dropped;  // drop_oldest
      }
    }
    done.store(true);
    consumer.join();
    EXPECT_EQ(received + dropped, kN) << "depth " << depth;
  }
}

TEST(IpcThreadPubSub, SameProcessThreadsChecksums) {
  const std::string name = topic("threads");
  Publisher pub(name, PublisherOptions{.depth = 4});
  Subscriber sub(name);
  ASSERT_TRUE(sub.connected());
  constexpr int kN = 5000;
  std::thread producer([&] {
    for (int i = 0; i < kN; ++i) {
      Tensor t = pub.loan({16}, DType::int32());
      int32_t* p = t.data<int32_t>();
      for (int j = 0; j < 16; ++j) p[j] = i * 16 + j;
      pub.send(t, Metadata{{"i", i}});
    }
    pub.close();
  });
  int got = 0;
  while (auto t = sub.recv(5s)) {
    const int32_t* p = t->data<const int32_t>();
    const int i = static_cast<int>(t->metadata().at("i").as_int());
    ASSERT_EQ(i, got);
    for (int j = 0; j < 16; ++j) ASSERT_EQ(p[j], i * 16 + j);
    ++got;
  }
  producer.join();
  EXPECT_TRUE(sub.closed());
  EXPECT_EQ(got, kN);
  EXPECT_LE(pub.pool_buffers(), 8u);
}

// The words of error messages: counts with their nouns, durations as a person writes them.
TEST(ErrorText, CountsAndDurations) {
  using tw::detail::counted;
  using tw::detail::duration_text;
  EXPECT_EQ(counted(1, "buffer"), "1 buffer");
  EXPECT_EQ(counted(0, "buffer"), "0 buffers");
  EXPECT_EQ(counted(2, "buffer"), "2 buffers");
  EXPECT_EQ(duration_text(0), "0 s");
  EXPECT_EQ(duration_text(750), "750 ns");
  EXPECT_EQ(duration_text(20'000), "20 us");
  EXPECT_EQ(duration_text(1'000'000), "1 ms");
  EXPECT_EQ(duration_text(50'000'000), "50 ms");
  EXPECT_EQ(duration_text(1'000'000'000), "1 s");
  EXPECT_EQ(duration_text(1'500'000'000), "1.5 s");
  EXPECT_EQ(duration_text(200'000'000'000), "3 min 20 s");
  EXPECT_EQ(duration_text(180'000'000'000), "3 min");
  EXPECT_EQ(duration_text(int64_t{36'000} * 1'000'000'000), "10 h");
  EXPECT_EQ(duration_text(-2'000'000), "-2 ms");
  EXPECT_EQ(duration_text(INT64_MIN).rfind("-", 0), 0u);
}

// A timeout says why nothing came: no publisher yet, or one that has sent nothing since this subscriber joined (a
// subscriber created after a send does not receive it: there is no history).
TEST(IpcThreadPubSub, WaitingForSaysWhyNothingArrived) {
  const std::string name = topic("waitingfor");
  Subscriber early(name);
  EXPECT_FALSE(early.recv(10ms));
  EXPECT_EQ(early.waiting_for(), "no publisher of '" + name + "' is running");
  Publisher pub(name);
  ASSERT_TRUE(early.recv(10ms) == std::nullopt);  // (completes the connection)
  Tensor x = Tensor::zeros({4}, DType::float32());
  pub.send(x);
  Subscriber late(name);
  ASSERT_TRUE(late.connected());
  EXPECT_FALSE(late.recv(20ms));
  EXPECT_NE(late.waiting_for().find("has sent nothing since this subscriber joined: a subscriber receives only the "
                                    "messages sent after it subscribed"),
            std::string::npos)
      << late.waiting_for();
  ASSERT_TRUE(early.recv(1s));
  EXPECT_EQ(early.waiting_for(), "");  // it has received: a later silence is not explained by joining late
  pub.send(x);
  ASSERT_TRUE(late.recv(1s));
  EXPECT_EQ(late.waiting_for(), "");
  late.close();
  EXPECT_EQ(late.waiting_for(), "");
}

TEST(IpcThreadPubSub, ConcurrentSendersAndLoanReleaseOnOtherThreads) {
  const std::string name = topic("senders");
  Publisher pub(name, PublisherOptions{.depth = 16});
  Subscriber sub(name);
  constexpr int kPer = 2000;
  std::vector<std::thread> ts;
  for (int w = 0; w < 3; ++w)
    ts.emplace_back([&, w] {
      for (int i = 0; i < kPer; ++i) {
        Tensor t = Tensor::copy_of(std::span<const int32_t>(std::vector<int32_t>{w, i}), {2});
        pub.send(t);
      }
    });
  std::vector<int> next(3, 0);
  std::vector<Tensor> held;
  for (int n = 0; n < 3 * kPer; ++n) {
    auto t = sub.recv(5s);
    ASSERT_TRUE(t);
    const int32_t* p = t->data<const int32_t>();
    ASSERT_EQ(p[1], next[static_cast<size_t>(p[0])]++);  // per-sender order
    held.push_back(*t);
    if (held.size() > 4) {  // drop leases on another thread
      std::thread([h = std::move(held)]() mutable { h.clear(); }).join();
      held.clear();
    }
  }
  for (auto& t : ts) t.join();
}

TEST(IpcThreadPubSub, GettersAndCloseNeverWaitForABlockedSend) {
  const std::string name = topic("blockedsend");
  Publisher pub(name, PublisherOptions{.depth = 1});
  Subscriber sub(name);  // never reads: its ring of one fills at once
  pub.send(Tensor::zeros({4}, DType::float32()));
  std::atomic<int> outcome{0};
  std::thread blocked([&] {
    try {
      pub.send(Tensor::zeros({4}, DType::float32()));  // waits for room until closed
      outcome = 1;
    } catch (const tw::Error&) {
      outcome = 2;
    }
  });
  std::this_thread::sleep_for(100ms);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(pub.subscriber_count(), 1u);
  EXPECT_EQ(pub.dropped(), 0u);
  EXPECT_GE(pub.pool_buffers(), 1u);
  EXPECT_THROW(pub.send(Tensor::zeros({1}, DType::int8()), {}, 50ms), tw::TimeoutError);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  pub.close();
  blocked.join();
  EXPECT_EQ(outcome.load(), 2);
}

TEST(IpcThreadPubSub, SeveralThreadsReceiveOnOneSubscriber) {
  const std::string name = topic("recvthreads");
  Publisher pub(name, PublisherOptions{.depth = 64});
  Subscriber sub(name);
  constexpr int kThreads = 4, kPer = 500;
  std::vector<std::vector<int>> got(kThreads);
  std::vector<std::thread> ts;
  for (int w = 0; w < kThreads; ++w)
    ts.emplace_back([&, w] {
      while (auto t = sub.recv(10s)) got[static_cast<size_t>(w)].push_back(t->data<const int32_t>()[0]);
    });
  for (int i = 0; i < kThreads * kPer; ++i) {
    Tensor t = Tensor::zeros({1}, DType::int32());
    t.data<int32_t>()[0] = i;
    ASSERT_EQ(pub.send(t, {}, 10s), 1u);
  }
  pub.close();
  for (auto& t : ts) t.join();
  std::vector<int> all;
  for (auto& g : got) all.insert(all.end(), g.begin(), g.end());
  std::sort(all.begin(), all.end());
  ASSERT_EQ(all.size(), static_cast<size_t>(kThreads * kPer));
  for (int i = 0; i < kThreads * kPer; ++i) ASSERT_EQ(all[static_cast<size_t>(i)], i);
}

// drop_oldest pops the oldest cells while the subscriber reads a message of several tensors: the publisher must
// drop only whole messages it claimed the header of, and the subscriber must never see half of one (nor take the
// race for a broken protocol).
TEST(IpcThreadPubSub, GroupsUnderDropOldestArriveWholeOrNotAtAll) {
  const std::string name = topic("groupdrops");
  Publisher pub(name, PublisherOptions{.depth = 7, .on_full = tw::OnFull::drop_oldest});
  Subscriber sub(name);
  constexpr int kN = 20000;
  std::thread producer([&] {
    for (int i = 0; i < kN; ++i) {
      tw::Message m;
      m.kind = tw::Message::Kind::list;
      for (int k = 0; k < 2; ++k) {
        Tensor t = Tensor::zeros({2}, DType::int32());
        t.data<int32_t>()[0] = i;
        t.data<int32_t>()[1] = k;
        m.tensors.push_back(std::move(t));
      }
      pub.send(m);
    }
    pub.close();
  });
  int received = 0, last = -1;
  try {
    while (auto r = sub.recv_message(10s)) {
      ASSERT_FALSE(r->single);
      ASSERT_EQ(r->message.tensors.size(), 2u);
      const int i = r->message.tensors[0].data<const int32_t>()[0];
      EXPECT_EQ(r->message.tensors[1].data<const int32_t>()[0], i);  // both parts from one message
      EXPECT_EQ(r->message.tensors[1].data<const int32_t>()[1], 1);
      EXPECT_GT(i, last);
      last = i;
      ++received;
    }
  } catch (const tw::Error& e) {
    ADD_FAILURE() << e.what();
  }
  producer.join();
  EXPECT_EQ(static_cast<uint64_t>(received) + sub.dropped(), static_cast<uint64_t>(kN));
}

// ---- a hostile publisher ----------------------------------------------------------------------------------------

// A fake publisher on the topic's address: accepts one subscriber and sends it `packet` with `fds`. The subscriber
// must refuse it with an error whose message contains `why`.
void fake_publisher(const std::string& name, const void* packet, size_t n, std::vector<int> fds, const char* why) {
  ipc::Fd l = ipc::listen_abstract(ipc::publisher_address(name));
  ASSERT_TRUE(l);
  std::thread t([&] {
    for (int i = 0; i < 2000; ++i) {
      ipc::Fd c(::accept4(l.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (c) {
        ipc::send_packet(c.get(), packet, n, fds, 1000);
        std::this_thread::sleep_for(200ms);
        return;
      }
      std::this_thread::sleep_for(1ms);
    }
  });
  try {
    Subscriber sub(name);
    auto r = sub.recv(200ms);  // whatever the constructor did not see yet
    ADD_FAILURE() << "a hostile welcome was accepted" << (r ? " and a message received" : "");
  } catch (const tw::Error& e) {
    EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
  }
  t.join();
}

TEST(IpcHostile, MalformedControlPacketsAreRejected) {
  const char junk[7] = "abcdef";
  fake_publisher(topic("junk"), junk, sizeof junk, {}, "control packet of 7 bytes");
  auto bad_type = ipc::encode_control(ipc::ControlType::welcome, 0, 4096);
  bad_type.type = 99;
  fake_publisher(topic("type"), &bad_type, sizeof bad_type, {}, "control type 99");
  auto no_fds = ipc::encode_control(ipc::ControlType::welcome, 0, 4096);
  fake_publisher(topic("nofds"), &no_fds, sizeof no_fds, {}, "0 fds, expected 2");
}

TEST(IpcHostile, UnsealedOrLyingChannelsAreRejected) {
  // An unsealed memfd: it could shrink under the reader.
  ipc::Fd unsealed(static_cast<int>(::syscall(SYS_memfd_create, "x", MFD_CLOEXEC)));
  ASSERT_EQ(::ftruncate(unsealed.get(), 4096), 0);
  ipc::Fd efd(::eventfd(0, EFD_CLOEXEC));
  auto w = ipc::encode_control(ipc::ControlType::welcome, 0, 4096);
  fake_publisher(topic("unsealed"), &w, sizeof w, {unsealed.get(), efd.get()}, "not sealed");
  // A sealed memfd smaller than announced.
  ipc::Fd small = ipc::make_memfd("small", 4096);
  auto big = ipc::encode_control(ipc::ControlType::welcome, 0, 1 << 20);
  fake_publisher(topic("small"), &big, sizeof big, {small.get(), efd.get()}, "but announced");
  // A sealed memfd of the right size whose header is garbage.
  ipc::Fd garbage = ipc::make_memfd("garbage", 4096);
  ASSERT_EQ(::pwrite(garbage.get(), "garbage!", 8, 0), 8);
  fake_publisher(topic("garbage"), &w, sizeof w, {garbage.get(), efd.get()}, "channel magic");
}

TEST(IpcHostile, AWakeUpDescriptorThatIsNotAnEventfdIsRefused) {
  // A valid channel, but a pipe where the eventfd belongs: its reader would block fileno() users.
  const ipc::ChannelHeader h = ipc::make_channel_header(2, 64, 2, 1);
  ipc::Fd chan = ipc::make_memfd("chan", h.total_bytes);
  ASSERT_EQ(::pwrite(chan.get(), &h, sizeof h, 0), static_cast<ssize_t>(sizeof h));
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  ipc::Fd r(p[0]), w(p[1]);
  const auto welcome = ipc::encode_control(ipc::ControlType::welcome, 0, h.total_bytes);
  fake_publisher(topic("pipe"), &welcome, sizeof welcome, {chan.get(), r.get()}, "not an eventfd");
}

// The tests' own pipe: a child that died before its parent's go-ahead fails the parent's assertion, not the process.
TEST(IpcProcess, ATestPipeToAGoneChildSaysSoInsteadOfRaisingSigpipe) {
  Pipe p;
  pid_t child = spawn([&] { return 0; });  // reads nothing, exits at once
  p.parent_writes();
  EXPECT_EQ(wait_exit(child), 0);  // its read end went with it: nobody can read now
  EXPECT_FALSE(p.tell());
  sigset_t pending;
  sigpending(&pending);
  EXPECT_FALSE(sigismember(&pending, SIGPIPE));  // taken back, not left for later
}

// Abstract socket names have no permissions: another user can bind a topic's address first. Both sides say so.
TEST(IpcHostile, ASquatterOfAnotherUserIsNamedNotConnected) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a squatter as another user";
  const std::string name = topic("squat");
  Pipe ready, done;
  pid_t child = spawn([&] {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) return 2;
    // Bind this user's (root's) address for the topic, as a hostile local user could.
    ipc::Fd l = ipc::listen_abstract("tw/0/" + name);
    if (!l) return 3;
    char c = 1;
    if (::write(ready.w(), &c, 1) != 1) return 4;
    if (::read(done.r(), &c, 1) != 1) return 5;
    return 0;
  });
  ready.parent_reads();
  done.parent_writes();
  char c;
  if (::read(ready.r(), &c, 1) != 1) {
    const int code = wait_exit(child);
    if (code == 2) GTEST_SKIP() << "this root cannot become user 65534 (setuid refused: no CAP_SETUID here)";
    FAIL() << "the squatter exited with " << code << " before it bound the topic's address";
  }
  try {
    Publisher pub(name);
    ADD_FAILURE() << "a publisher started on a squatted name";
  } catch (const tw::Error& e) {
    EXPECT_NE(std::string(e.what()).find("another user"), std::string::npos) << e.what();
  }
  try {
    Subscriber sub(name);
    ADD_FAILURE() << "a subscriber connected to a squatter";
  } catch (const tw::Error& e) {
    EXPECT_NE(std::string(e.what()).find("another user"), std::string::npos) << e.what();
  }
  ASSERT_TRUE(done.tell()) << "the squatter is gone: it exited with " << wait_exit(child);
  EXPECT_EQ(wait_exit(child), 0);
}

// A publisher that connects a subscriber properly, then rewrites the shared ring it handed over. The subscriber
// validated the geometry once and keeps its own copy: rewriting it must not matter, and a cell whose sequence word
// runs ahead of head ends the stream with an error instead of a spin that ignores the timeout.
struct RogueChannel {
  ipc::ChannelHeader h = ipc::make_channel_header(4, 256, 8, static_cast<uint32_t>(::getpid()));
  ipc::Fd fd = ipc::make_memfd("rogue", h.total_bytes);
  ipc::Mapping map = ipc::Mapping::map(fd.get(), h.total_bytes, true, false);
  ipc::Ring ring;
  RogueChannel() {
    std::memcpy(map.data(), &h, sizeof h);
    ring = ipc::Ring(map.data(), h);
    ring.init_cells();
  }
};

// The rogue runs in a second process, as a hostile publisher would: it welcomes the subscriber, waits for the
// go-ahead on a pipe, rewrites the shared channel, acknowledges, and keeps its socket open until told to stop.
void rogue_publisher(const std::string& name, const std::function<void(RogueChannel&)>& corrupt,
                     const std::function<void(Subscriber&)>& check) {
  Pipe go, ack;
  pid_t child = spawn([&] {
    ipc::Fd l = ipc::listen_abstract(ipc::publisher_address(name));
    if (!l) return 2;
    RogueChannel ch;
    ipc::Fd efd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    char c = 1;
    if (::write(ack.w(), &c, 1) != 1) return 3;  // listening
    pollfd p{l.get(), POLLIN, 0};
    if (::poll(&p, 1, 10000) != 1) return 4;
    ipc::Fd conn(::accept4(l.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!conn) return 5;
    const auto w = ipc::encode_control(ipc::ControlType::welcome, 0, ch.h.total_bytes);
    const int fds[2] = {ch.fd.get(), efd.get()};
    if (ipc::send_packet(conn.get(), &w, sizeof w, fds, 1000) != ipc::SendResult::sent) return 6;
    if (::read(go.r(), &c, 1) != 1) return 7;
    corrupt(ch);
    if (::write(ack.w(), &c, 1) != 1) return 8;
    if (::read(go.r(), &c, 1) != 1) return 9;  // stop
    return 0;
  });
  go.parent_writes();
  ack.parent_reads();
  char c = 1;
  ASSERT_EQ(::read(ack.r(), &c, 1), 1);
  {
    Subscriber sub(name);
    EXPECT_TRUE(sub.connected());
    ASSERT_TRUE(go.tell()) << "the rogue publisher is gone: it exited with " << wait_exit(child);
    ASSERT_EQ(::read(ack.r(), &c, 1), 1);  // the shared channel is rewritten now
    check(sub);
  }
  ASSERT_TRUE(go.tell()) << "the rogue publisher is gone: it exited with " << wait_exit(child);
  EXPECT_EQ(wait_exit(child), 0);
}

TEST(IpcHostile, RewrittenRingGeometryIsNeverReadAgain) {
  rogue_publisher(topic("geometry"), [](RogueChannel& ch) {
    auto* h = reinterpret_cast<ipc::ChannelHeader*>(ch.map.data());
    h->cells = 0;                      // a division by zero if the subscriber read it again
    h->cell_bytes = uint64_t{1} << 60; // an out-of-bounds cell if it did
    h->leases_offset = uint64_t{1} << 62;
    h->lease_slots = 0xffffffffu;
  }, [](Subscriber& sub) {
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_FALSE(sub.recv(100ms));  // nothing queued: a timeout, no crash
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  });
}

TEST(IpcHostile, ACellAheadOfHeadEndsTheStreamWithAnErrorWithinTheTimeout) {
  rogue_publisher(topic("seqahead"), [](RogueChannel& ch) {
    ipc::aref(ch.ring.cell(0).seq).store(5);  // "holds message 4" at position 0: no honest publisher writes that
    ipc::aref(ch.ring.header().tail).store(5);
  }, [](Subscriber& sub) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      sub.recv(200ms);
      ADD_FAILURE() << "a cell ahead of head was accepted";
    } catch (const tw::Error& e) {
      EXPECT_NE(std::string(e.what()).find("broke the protocol"), std::string::npos) << e.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
    EXPECT_FALSE(sub.recv(50ms));  // afterwards: end of stream
    EXPECT_TRUE(sub.closed());
  });
}

TEST(IpcHostile, HostileLeaseSlotsAndSegmentsAreRefused) {
  rogue_publisher(topic("lease"), [](RogueChannel& ch) {
    ipc::CellHeader* c = ch.ring.begin_push();
    if (!c) ::_exit(20);
    tw::Layout l{DType::uint8(), Shape{4}, tw::Strides{1}, 0, false};
    ipc::encode_message(c->msg, l, 1, 77, 0, 4096, 1u << 30, 0);  // lease slot far outside the table
    ch.ring.commit_push();
  }, [](Subscriber& sub) {
    try {
      sub.recv(1s);
      ADD_FAILURE() << "a lease slot outside the table was accepted";
    } catch (const tw::Error& e) {
      EXPECT_NE(std::string(e.what()).find("lease slot"), std::string::npos) << e.what();
    }
  });
}

// A subscriber that rewrites its ring's head (past tail): the publisher drops it and goes on.
TEST(IpcHostile, ASubscriberThatBreaksTheRingIsDroppedNotWaitedFor) {
  const std::string name = topic("roguesub");
  Publisher pub(name, PublisherOptions{.depth = 2});
  Subscriber honest(name);
  ipc::Fd c = ipc::connect_abstract(ipc::publisher_address(name));
  ASSERT_TRUE(c);
  std::vector<ipc::Fd> fds;
  alignas(8) uint8_t buf[64];
  long n = -1;
  for (int i = 0; i < 2000 && n == -1; ++i) {
    n = ipc::recv_packet(c.get(), buf, sizeof buf, fds);
    if (n == -1) std::this_thread::sleep_for(1ms);
  }
  ASSERT_GT(n, 0);
  ASSERT_EQ(fds.size(), 2u);
  const ipc::ControlMessage w = ipc::decode_control(std::span<const uint8_t>(buf, static_cast<size_t>(n)), 2);
  ipc::Mapping chan = ipc::Mapping::map(fds[0].get(), w.size, true, false);
  for (int i = 0; i < 2000 && pub.subscriber_count() < 2; ++i) std::this_thread::sleep_for(1ms);
  ASSERT_EQ(pub.subscriber_count(), 2u);
  ipc::aref(reinterpret_cast<ipc::ChannelHeader*>(chan.data())->head).store(1000);  // head far past tail
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(pub.send(Tensor::zeros({4}, DType::int32()), {}, 2s), 1u);  // only the honest one
    ASSERT_TRUE(honest.recv(2s));
  }
  EXPECT_EQ(pub.subscriber_count(), 1u);
  // And the rogue sees its socket shut down.
  pollfd p{c.get(), POLLIN | POLLRDHUP, 0};
  EXPECT_EQ(::poll(&p, 1, 2000), 1);
}

// A peer chooses segment and channel sizes: a huge sparse segment is mapped without pre-faulting it.
TEST(IpcHostile, HugeAnnouncedSegmentsAreNotPrefaulted) {
  EXPECT_FALSE(ipc::prefault_allowed(uint64_t{64} << 40));
  EXPECT_FALSE(ipc::prefault_allowed(ipc::kMaxPrefaultBytes + 1));
  EXPECT_TRUE(ipc::prefault_allowed(4096));
  ipc::Fd fd = ipc::make_memfd("huge", size_t{1} << 44);  // 16 TiB, sparse
  ipc::Mapping m = ipc::Mapping::map(fd.get(), size_t{1} << 44, false, true);  // must neither OOM nor take long
  EXPECT_TRUE(m);
}

TEST(IpcPublisher, HugeLoansThrowOutOfMemory) {
  Publisher pub(topic("hugeloan"));
  try {
    pub.loan({int64_t{1} << 46}, DType::uint8());
    ADD_FAILURE() << "a 64 TiB loan succeeded";
  } catch (const tw::Error& e) {
    EXPECT_EQ(e.code(), tw::ErrorCode::out_of_memory) << e.what();
  }
  EXPECT_EQ(pub.pool_buffers(), 0u);
}

TEST(IpcPublisher, HugeLoansThrowOutOfMemoryWhileTheCallerHoldsABuffer) {
  // With a buffer held (here by the caller itself) the request waited for the pool to free room it could never
  // use: forever without a timeout (a deadlock), a misleading TimeoutError with one.
  const std::string name = topic("hugeheld");
  Publisher pub(name);
  Subscriber sub(name);  // (a send with no subscriber stores nothing)
  ASSERT_TRUE(sub.connected());
  Tensor keep = pub.loan({4}, DType::float32());
  for (int attempt = 0; attempt < 2; ++attempt) {
    try {
      if (attempt == 0)
        (void)pub.loan({int64_t{1} << 50}, DType::float32(), tw::Device::cpu(), std::chrono::seconds(60));
      else
        (void)pub.send(Tensor::zeros({1}, DType::float32()).expand({int64_t{1} << 44}));
      ADD_FAILURE() << "a request beyond this machine's memory succeeded";
    } catch (const tw::Error& e) {
      EXPECT_EQ(e.code(), tw::ErrorCode::out_of_memory) << e.what();
      EXPECT_NE(std::string(e.what()).find("however long it waits"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(pub.pool_buffers(), 1u);
}

// Whether this process may write the page at `addr`, as the kernel reports it (writing to find out would fault).
bool writable_here(const void* addr) {
  const auto a = reinterpret_cast<uintptr_t>(addr);
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    uintptr_t lo = 0, hi = 0;
    char perms[5] = {};
    if (std::sscanf(line.c_str(), "%lx-%lx %4s", &lo, &hi, perms) == 3 && a >= lo && a < hi) return perms[1] == 'w';
  }
  ADD_FAILURE() << "no mapping holds " << addr;
  return false;
}

TEST(IpcPublisher, ASentLoanIsReadOnlyExactlyWhenSomethingCouldStillWriteIt) {
  const std::string name = topic("consume");
  Publisher pub(name);
  Subscriber sub(name);
  // A loan with a second handle kept: read-only after send, so a write through `keep` would fault.
  Tensor t = pub.loan({64}, DType::uint8());
  std::memset(t.data<uint8_t>(), 5, 64);
  Tensor keep = t;
  EXPECT_EQ(pub.send(std::move(t)), 1u);
  EXPECT_FALSE(t.defined());  // consumed
  auto r = sub.recv(2s);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->data<const uint8_t>()[63], 5);
  EXPECT_FALSE(writable_here(keep.data_ptr()));
  // ...and every tensor over it says so: tensorwire's own writes are errors, not faults.
  EXPECT_TRUE(keep.readonly());
  EXPECT_TRUE(keep.slice(0, 8, 16).readonly());
  TW_EXPECT_ERROR_MSG(keep.data<uint8_t>(), tw::ErrorCode::read_only, "a loan already sent");
  TW_EXPECT_ERROR(tw::copy(Tensor::zeros({64}, DType::uint8()), keep), tw::ErrorCode::read_only);
  EXPECT_EQ(keep.data<const uint8_t>()[0], 5);
  // Handed over whole, alone or in a message: nothing can write it, so no mprotect is paid for.
  Tensor whole = pub.loan({1 << 20}, DType::uint8());
  const void* whole_addr = whole.data_ptr();
  pub.send(std::move(whole));
  EXPECT_TRUE(writable_here(whole_addr));
  tw::Message m;
  m.tensors.push_back(pub.loan({1 << 21}, DType::uint8()));
  const void* part_addr = m.tensors[0].data_ptr();
  pub.send(std::move(m));
  EXPECT_TRUE(m.tensors.empty());
  EXPECT_TRUE(writable_here(part_addr));
  // A raw pointer that escaped accounting makes even a handed-over loan read-only.
  Tensor escaped = pub.loan({1 << 22}, DType::uint8());
  const void* escaped_addr = escaped.data_ptr();
  escaped.buffer().mark_escaped();
  pub.send(std::move(escaped));
  EXPECT_FALSE(writable_here(escaped_addr));
  // A later loan of a protected buffer is writable again.
  keep = Tensor();
  while (sub.recv_message(0ms)) {
  }
  r.reset();
  Tensor again = pub.loan({64}, DType::uint8());
  EXPECT_TRUE(writable_here(again.data_ptr()));
  again.data<uint8_t>()[0] = 1;
}

TEST(IpcPublisher, SendTimesOutWithNothingDeliveredAndNamesTheSubscriber) {
  const std::string name = topic("timeout");
  Publisher pub(name, PublisherOptions{.depth = 1});
  Subscriber full(name), idle(name);
  pub.send(Tensor::zeros({1}, DType::int8()));
  ASSERT_TRUE(idle.recv(2s));
  try {
    pub.send(Tensor::zeros({1}, DType::int8()), {}, 50ms);
    ADD_FAILURE() << "no timeout";
  } catch (const tw::TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("pid " + std::to_string(::getpid())), std::string::npos) << e.what();
  }
  EXPECT_FALSE(idle.try_recv());  // all or none
}

TEST(IpcPublisher, MetadataWithManyKeysDecodesInLinearTime) {
  // 200k keys: quadratic decoding needed ~2e10 key comparisons (minutes); linear takes milliseconds.
  Metadata m;
  std::vector<std::string> keys;
  std::vector<Value> values;
  for (int i = 0; i < 200000; ++i) {
    keys.push_back(std::string("k").append(std::to_string(i)));
    values.emplace_back(i);
  }
  m = Metadata::from_value(Value::dict(std::move(keys), std::move(values)));
  const std::string enc = tw::encode_metadata(m);
  const Metadata back = tw::decode_metadata(enc);
  ASSERT_EQ(back.size(), 200000u);
  EXPECT_EQ(back.at("k199999").as_int(), 199999);
  EXPECT_THROW(Value::dict({"a", "b", "a"}, {Value(1), Value(2), Value(3)}), tw::Error);
}

TEST(IpcMessage, SeveralTensorsCrossAtomicallyWithTheirStructure) {
  const std::string name = topic("message");
  Publisher pub(name, PublisherOptions{.depth = 8});
  Subscriber sub(name);
  Tensor loan = pub.loan({3, 4}, DType::float32());
  std::iota(loan.data<float>(), loan.data<float>() + 12, 0.0f);
  tw::Message m;
  m.kind = tw::Message::Kind::dict;
  m.keys = {"t", "z"};
  m.tensors = {loan.transpose(0, 1), Tensor::zeros({2}, DType::uint8())};
  loan = Tensor();
  EXPECT_EQ(pub.send(m, Metadata{{"frame", 3}}), 1u);
  auto r = sub.recv_message(2s);
  ASSERT_TRUE(r);
  EXPECT_FALSE(r->single);
  ASSERT_EQ(r->message.kind, tw::Message::Kind::dict);
  ASSERT_EQ(r->message.keys, (std::vector<std::string>{"t", "z"}));
  const Tensor& t = r->message.tensors[0];
  EXPECT_EQ(t.shape(), (Shape{4, 3}));
  EXPECT_EQ(t.strides(), (tw::Strides{1, 4}));  // the loan's view, as it was
  EXPECT_EQ(t.data<const float>()[4], 4.0f);
  EXPECT_EQ(r->message.tensors[1].metadata().at("frame").as_int(), 3);
  // recv() of a message of several tensors says what to use instead.
  m.kind = tw::Message::Kind::list;
  m.keys.clear();
  m.tensors = {Tensor::zeros({1}, DType::int8()), Tensor::zeros({1}, DType::int8())};
  pub.send(m);
  try {
    sub.recv(2s);
    ADD_FAILURE() << "recv() returned one tensor of a message of two";
  } catch (const tw::Error& e) {
    EXPECT_NE(std::string(e.what()).find("recv_message"), std::string::npos) << e.what();
  }
  // Duplicate keys and oversized messages are refused before anything is sent.
  m.kind = tw::Message::Kind::dict;
  m.keys = {"a", "a"};
  EXPECT_THROW(
      {
        try {
          pub.send(m);
        } catch (const tw::Error& e) {
          EXPECT_NE(std::string(e.what()).find("key 'a' twice"), std::string::npos) << e.what();
          throw;
        }
      },
      tw::Error);
  // Keys on a list or tuple were dropped silently (the receiver got a list without the names).
  for (const auto kind : {tw::Message::Kind::list, tw::Message::Kind::tuple}) {
    m.kind = kind;
    m.keys = {"a", "b"};
    try {
      pub.send(m);
      ADD_FAILURE() << "a list message with keys was sent";
    } catch (const tw::Error& e) {
      EXPECT_EQ(e.code(), tw::ErrorCode::invalid_argument);
      EXPECT_NE(std::string(e.what()).find("message has no keys, and this one has 2"), std::string::npos) << e.what();
    }
  }
  m.kind = tw::Message::Kind::list;
  m.keys.clear();
  m.tensors.assign(8, Tensor::zeros({1}, DType::int8()));
  EXPECT_THROW(pub.send(m), tw::Error);  // 9 cells in a ring of 8
  pub.send(Tensor::zeros({1}, DType::int8()));
  auto single = sub.recv_message(2s);
  ASSERT_TRUE(single);
  EXPECT_TRUE(single->single);
}

// ---- processes ------------------------------------------------------------------------------------------------

TEST(IpcProcess, EveryLayoutAndDtypeArrivesIdentical) {
  const std::string name = topic("layouts");
  Pipe ready;
  pid_t child = spawn([&] {
    Subscriber sub(name);
    char c = 1;
    if (::write(ready.w(), &c, 1) != 1) return 2;
    for (int k = 0; k < kCases; ++k) {
      auto t = sub.recv(10s);
      if (!t) return 10 + k;
      Tensor want = make_case(k);
      if (!same_values(*t, want)) return 40 + k;
      if (!t->readonly()) return 70;
      if (t->metadata().at("case").as_int() != k) return 71;
    }
    // a loaned buffer's permuted view keeps its strides and offset
    auto t = sub.recv(10s);
    if (!t || t->strides() != tw::Strides(1, 4) || t->byte_offset() != 4) return 80;
    if (t->data<const float>()[0] != 1.0f) return 81;
    auto meta = sub.recv(10s);
    if (!meta) return 82;
    const Metadata& m = meta->metadata();
    if (m.at("s") != Value("x") || m.at("b") != Value::bytes(std::string("\0\1", 2)) ||
        m.at("t") != Value::tuple({1, 2.5}) || m.at("own") != Value(true))
      return 83;
    if (sub.recv(10s) || !sub.closed()) return 84;
    return 0;
  });
  ready.parent_reads();
  char c;
  Publisher pub(name);
  ASSERT_EQ(::read(ready.r(), &c, 1), 1);
  for (int k = 0; k < kCases; ++k) pub.send(make_case(k), Metadata{{"case", k}});
  Tensor loaned = pub.loan({3, 4}, DType::float32());
  float* p = loaned.data<float>();
  std::iota(p, p + 12, 0.0f);
  pub.send(loaned.transpose(0, 1).slice(0, 1, std::nullopt));
  Tensor withmeta = Tensor::zeros({2}, DType::uint8());
  withmeta.metadata().set("own", true);
  withmeta.metadata().set("s", "overwritten");
  Value d = Value::dict();
  pub.send(withmeta, Metadata{{"s", "x"}, {"b", Value::bytes(std::string("\0\1", 2))}, {"t", Value::tuple({1, 2.5})}});
  pub.close();
  EXPECT_EQ(wait_exit(child), 0);
}

TEST(IpcProcess, SubscriberStartedBeforePublisherGetsEverything) {
  const std::string name = topic("early");
  pid_t child = spawn([&] {
    Subscriber sub(name);
    int n = 0;
    while (auto t = sub.recv(10s)) {
      if (t->data<const int64_t>()[0] != n) return 3;
      ++n;
    }
    return n == 100 && sub.closed() ? 0 : 4;
  });
  // Wait until the child's subscriber listens.
  for (int i = 0; i < 500 && ipc::find_listening(ipc::subscriber_address_prefix(name)).empty(); ++i)
    std::this_thread::sleep_for(10ms);
  Publisher pub(name, PublisherOptions{.depth = 4});
  EXPECT_EQ(pub.subscriber_count(), 1u);
  for (int64_t i = 0; i < 100; ++i) pub.send(Tensor::copy_of(std::span<const int64_t>(&i, 1), {1}));
  pub.close();
  EXPECT_EQ(wait_exit(child), 0);
}

// The publisher's constructor connects to every subscriber's waiting socket; a subscriber that connected to the
// publisher itself meanwhile closes its waiting socket, and that second channel is no subscriber. (FanOutToFour-
// Subscribers once counted 6 for 4 under ASan: the count waited for the monitor thread to notice.)
TEST(Ipc, AWaitingSocketClosedAfterThePublisherConnectedIsNotCounted) {
  const std::string name = topic("phantom");
  for (int round = 0; round < 20; ++round) {
    tw::os::Fd waiting = ipc::listen_abstract(ipc::subscriber_address_prefix(name) + "phantom");
    ASSERT_TRUE(waiting);
    Publisher pub(name);
    waiting.reset();  // the connection it never accepted goes with it
    EXPECT_EQ(pub.subscriber_count(), 0u) << "round " << round;
    Subscriber sub(name);
    EXPECT_EQ(pub.subscriber_count(), 1u) << "round " << round;
    EXPECT_EQ(pub.send(Tensor::zeros({4}, DType::float32())), 1u);
    pub.close();
  }
}

TEST(IpcProcess, FanOutToFourSubscribers) {
  const std::string name = topic("fanout");
  Pipe ready;
  std::vector<pid_t> kids;
  for (int s = 0; s < 4; ++s)
    kids.push_back(spawn([&] {
      Subscriber sub(name);
      char c = 1;
      if (::write(ready.w(), &c, 1) != 1) return 2;
      uint64_t sum = 0;
      int n = 0;
      while (auto t = sub.recv(10s)) {
        const uint32_t* p = t->data<const uint32_t>();
        for (int64_t i = 0; i < t->numel(); ++i) sum += p[i];
        ++n;
      }
      return (n == 300 && sum == 300ull * 1023 * 1024 / 2) ? 0 : 5;
    }));
  ready.parent_reads();
  Publisher pub(name);
  for (int s = 0; s < 4; ++s) {
    char c;
    ASSERT_EQ(::read(ready.r(), &c, 1), 1);
  }
  // subscribers that connected to us before we listened would be missed: they connect in their constructors
  for (int i = 0; i < 2000 && pub.subscriber_count() < 4; ++i) std::this_thread::sleep_for(5ms);
  ASSERT_EQ(pub.subscriber_count(), 4u);
  for (int m = 0; m < 300; ++m) {
    Tensor t = pub.loan({1024}, DType::uint32());
    std::iota(t.data<uint32_t>(), t.data<uint32_t>() + 1024, 0u);
    EXPECT_EQ(pub.send(t), 4u);
  }
  pub.close();
  for (pid_t k : kids) EXPECT_EQ(wait_exit(k), 0);
}

TEST(IpcProcess, OnFullPolicies) {
  for (tw::OnFull policy : {tw::OnFull::raise, tw::OnFull::drop_oldest}) {
    const std::string name = topic("onfull");
    Publisher pub(name, PublisherOptions{.depth = 2, .on_full = policy});
    Subscriber sub(name);  // never reads until the end
    Tensor x = Tensor::zeros({4}, DType::float32());
    pub.send(x);
    pub.send(x);
    if (policy == tw::OnFull::raise) {
      EXPECT_THROW(pub.send(x), tw::WouldBlockError);
      EXPECT_EQ(pub.dropped(), 0u);
    } else {
      for (int i = 0; i < 5; ++i) pub.send(x);
      EXPECT_EQ(pub.dropped(), 5u);
      EXPECT_EQ(sub.dropped(), 5u);
    }
    EXPECT_TRUE(sub.recv(1s));
    EXPECT_TRUE(sub.recv(1s));
    EXPECT_FALSE(sub.recv(10ms));
    EXPECT_FALSE(sub.closed());
  }
}

TEST(IpcProcess, BlockWaitsForTheSlowSubscriber) {
  const std::string name = topic("block");
  Pipe ready;
  pid_t child = spawn([&] {
    Subscriber sub(name);
    char c = 1;
    if (::write(ready.w(), &c, 1) != 1) return 2;
    int n = 0;
    while (auto t = sub.recv(10s)) {
      if (t->data<const int32_t>()[0] != n++) return 3;
      if (n % 10 == 0) std::this_thread::sleep_for(1ms);
    }
    return n == 500 ? 0 : 4;
  });
  ready.parent_reads();
  Publisher pub(name, PublisherOptions{.depth = 2});
  char c;
  ASSERT_EQ(::read(ready.r(), &c, 1), 1);
  for (int32_t i = 0; i < 500; ++i) pub.send(Tensor::copy_of(std::span<const int32_t>(&i, 1), {1}));
  pub.close();
  EXPECT_EQ(wait_exit(child), 0);
}

// Without CAP_SYS_RESOURCE, a user may have at most RLIMIT_NOFILE fds in flight in unread socket buffers; past that,
// sending one more fails with ETOOMANYREFS. The publisher took that for a dead subscriber: its leases went void
// (buffers it still maps reused under it) and it was dropped. It is a slow reader: the send waits for it (block).
TEST(IpcProcess, FdsInFlightPastTheLimitMakeASlowReaderNotADeadOne) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root, to give up CAP_SYS_RESOURCE and CAP_SYS_ADMIN in a child";
  const std::string name = topic("inflight");
  pid_t child = spawn([&] {
    const rlim_t limit = static_cast<rlim_t>(count_fds() + 40);
    const rlimit rl{limit, limit};
    if (::setrlimit(RLIMIT_NOFILE, &rl) != 0) return 77;
    __user_cap_header_struct h{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct d[2]{};
    if (::syscall(SYS_capget, &h, d) != 0) return 77;
    for (const unsigned cap : {unsigned{CAP_SYS_RESOURCE}, unsigned{CAP_SYS_ADMIN}}) {
      d[cap / 32].effective &= ~(1u << (cap % 32));
      d[cap / 32].permitted &= ~(1u << (cap % 32));
    }
    if (::syscall(SYS_capset, &h, d) != 0) return 77;
    Publisher pub(name, PublisherOptions{.depth = 256});
    std::vector<std::unique_ptr<Subscriber>> subs;
    for (int i = 0; i < 4; ++i) subs.push_back(std::make_unique<Subscriber>(name));
    for (int i = 0; i < 2000 && pub.subscriber_count() < 4; ++i) std::this_thread::sleep_for(5ms);
    if (pub.subscriber_count() != 4) return 2;
    // 20000-byte messages take a buffer each, and each buffer's fd goes to all four unread sockets.
    int sent = 0;
    std::string refused;
    for (; sent < 200; ++sent) {
      std::vector<uint8_t> v(20000, static_cast<uint8_t>(sent));
      try {
        pub.send(Tensor::copy_of(std::span<const uint8_t>(v), {20000}), {}, 300ms);
      } catch (const tw::TimeoutError& e) {
        refused = e.what();
        break;
      }
    }
    std::fprintf(stderr, "child: %d sent, then: %s\n", sent, refused.c_str());
    if (refused.find("has not read the announcements") == std::string::npos) return 3;
    if (pub.subscriber_count() != 4) return 4;  // all still there
    for (auto& sub : subs)
      for (int i = 0; i < sent; ++i) {
        auto t = sub->recv(5s);
        if (!t || t->data<const uint8_t>()[19999] != static_cast<uint8_t>(i)) return 5;
      }
    std::vector<uint8_t> v(20000, 7);
    return pub.send(Tensor::copy_of(std::span<const uint8_t>(v), {20000}), {}, 5s) == 4 ? 0 : 6;
  });
  const int rc = wait_exit(child);
  if (rc == 77) GTEST_SKIP() << "could not lower RLIMIT_NOFILE or give up capabilities here";
  EXPECT_EQ(rc, 0);
}

TEST(IpcProcess, KilledSubscriberLeasesAreReclaimed) {
  const std::string name = topic("killsub");
  Pipe ready;
  pid_t child = spawn([&] {
    Subscriber sub(name);
    std::vector<Tensor> hoard;
    char c = 1;
    if (::write(ready.w(), &c, 1) != 1) return 2;
    while (auto t = sub.recv(10s)) {
      hoard.push_back(*t);  // holds every buffer it gets
      if (hoard.size() == 3 && ::write(ready.w(), &c, 1) != 1) return 2;
    }
    return 0;
  });
  ready.parent_reads();
  Publisher pub(name, PublisherOptions{.depth = 8, .max_buffers = 4});
  char c;
  ASSERT_EQ(::read(ready.r(), &c, 1), 1);
  for (int i = 0; i < 3; ++i) {
    Tensor t = pub.loan({256}, DType::uint8());
    pub.send(t);
  }
  ASSERT_EQ(::read(ready.r(), &c, 1), 1);  // the child holds three buffers
  ::kill(child, SIGKILL);
  EXPECT_EQ(wait_exit(child), 128 + SIGKILL);
  // With four buffers and the dead child's three reclaimed, sending many more never blocks.
  Subscriber other(name);
  for (int i = 0; i < 100; ++i) {
    Tensor t = pub.loan({256}, DType::uint8());
    pub.send(t);
    ASSERT_TRUE(other.recv(5s));
  }
  EXPECT_EQ(pub.subscriber_count(), 1u);
  EXPECT_LE(pub.pool_buffers(), 4u);
}

TEST(IpcProcess, KilledPublisherLeavesDataValidThenEndOfStream) {
  const std::string name = topic("killpub");
  Pipe ready;
  Subscriber sub(name);
  pid_t child = spawn([&] {
    Publisher pub(name);
    for (int i = 0; i < 3; ++i) {
      Tensor t = pub.loan({1000}, DType::int32());
      std::fill(t.data<int32_t>(), t.data<int32_t>() + 1000, i + 7);
      pub.send(t);
    }
    char c = 1;
    if (::write(ready.w(), &c, 1) != 1) return 2;
    for (;;) ::pause();
  });
  ready.parent_reads();
  char c;
  ASSERT_EQ(::read(ready.r(), &c, 1), 1);
  auto first = sub.recv(5s);
  ASSERT_TRUE(first);
  ::kill(child, SIGKILL);
  EXPECT_EQ(wait_exit(child), 128 + SIGKILL);
  auto second = sub.recv(5s);  // queued before the kill: still delivered
  ASSERT_TRUE(second);
  ASSERT_TRUE(sub.recv(5s));
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(sub.recv(5s));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);  // within a few 50 ms slices, even on a loaded machine
  EXPECT_TRUE(sub.closed());
  EXPECT_EQ(first->data<const int32_t>()[999], 7);  // still mapped and intact
  EXPECT_EQ(second->data<const int32_t>()[0], 8);
  // The name is free again.
  Publisher again(name);
  Subscriber fresh(name);
  again.send(Tensor::zeros({1}, DType::int8()));
  EXPECT_TRUE(fresh.recv(5s));
}

TEST(IpcProcess, SecondPublisherOfANameIsRefused) {
  const std::string name = topic("dup");
  Publisher a(name);
  TW_EXPECT_ERROR_MSG(Publisher b(name), tw::ErrorCode::invalid_argument, "already running");
  a.close();
  Publisher c(name);
  TW_EXPECT_ERROR_MSG(a.send(Tensor::zeros({1}, DType::int8())), tw::ErrorCode::invalid_argument, "closed");
}

TEST(IpcProcess, NothingLeaks) {
  const size_t fds0 = count_fds(), maps0 = count_tw_mappings();
  {
    const std::string name = topic("leak");
    Publisher pub(name);
    Subscriber a(name), b(name);
    std::vector<Tensor> keep;
    for (int i = 0; i < 50; ++i) {
      pub.send(Tensor::zeros({static_cast<int64_t>(100 + 1000 * (i % 7))}, DType::float32()));
      keep.push_back(*a.recv(1s));
      ASSERT_TRUE(b.recv(1s));
    }
    a.close();
    b.close();
    EXPECT_EQ(keep.back().numel(), 100 + 1000 * (49 % 7));  // alive after close
    keep.clear();
    pub.close();
  }
  EXPECT_EQ(count_fds(), fds0);
  EXPECT_EQ(count_tw_mappings(), maps0);
}

TEST(IpcProcess, SegmentsAreSealedAndReadOnlyForSubscribers) {
  const std::string name = topic("seal");
  Publisher pub(name);
  Subscriber sub(name);
  pub.send(Tensor::zeros({16}, DType::float32()));
  auto t = sub.recv(1s);
  ASSERT_TRUE(t);
  EXPECT_TRUE(t->readonly());
  // The received mapping cannot be made writable.
  void* page = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(t->buffer().base()) & ~uintptr_t{4095});
  EXPECT_NE(::mprotect(page, 4096, PROT_READ | PROT_WRITE), 0);
}

TEST(IpcProcess, FilenoIsReadableExactlyWhenAMessageWaits) {
  const std::string name = topic("fileno");
  Publisher pub(name);
  Subscriber sub(name);
  const int fd = sub.fileno();
  auto readable = [&](int ms) {
    pollfd p{fd, POLLIN, 0};
    return ::poll(&p, 1, ms) == 1;
  };
  EXPECT_FALSE(readable(0));
  pub.send(Tensor::zeros({1}, DType::int8()));
  EXPECT_TRUE(readable(1000));
  EXPECT_TRUE(sub.try_recv());
  EXPECT_FALSE(readable(0));
  pub.send(Tensor::zeros({1}, DType::int8()));
  pub.send(Tensor::zeros({1}, DType::int8()));
  EXPECT_TRUE(readable(1000));
  EXPECT_TRUE(sub.try_recv());
  EXPECT_TRUE(readable(0));
  EXPECT_TRUE(sub.try_recv());
  EXPECT_FALSE(readable(0));
  pub.close();
  EXPECT_TRUE(readable(1000));  // end-of-stream wakes too
  EXPECT_FALSE(sub.try_recv());
  EXPECT_TRUE(sub.closed());
}

TEST(IpcProcess, ManyMessagesWithChecksums) {
  const std::string name = topic("many");
  const int n = std::getenv("TW_IPC_MESSAGES") ? std::atoi(std::getenv("TW_IPC_MESSAGES")) : 100000;
  Pipe ready;
  pid_t child = spawn([&] {
    Subscriber sub(name);
    char c = 1;
    if (::write(ready.w(), &c, 1) != 1) return 2;
    int64_t i = 0;
    while (auto t = sub.recv(30s)) {
      const uint64_t* p = t->data<const uint64_t>();
      const int64_t k = t->numel();
      uint64_t sum = 0;
      for (int64_t j = 1; j < k; ++j) sum += p[j];
      if (static_cast<int64_t>(p[0]) != i || sum != p[0] * static_cast<uint64_t>(k - 1)) return 3;
      ++i;
    }
    return i == n ? 0 : 4;
  });
  ready.parent_reads();
  Publisher pub(name, PublisherOptions{.depth = 64});
  char c;
  ASSERT_EQ(::read(ready.r(), &c, 1), 1);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = 1 + i % 61;
    Tensor t = pub.loan({k}, DType::uint64());
    std::fill(t.data<uint64_t>(), t.data<uint64_t>() + k, static_cast<uint64_t>(i));
    pub.send(t);
  }
  pub.close();
  EXPECT_EQ(wait_exit(child), 0);
}

}  // namespace

namespace {
// A subscriber made before its publisher learns of it on its first recv or fileno; polling connected() alone
// never got there (connected stayed false forever while the publisher counted it and sent to it).
TEST(Ipc, ConnectedAloneTakesTheHandshakeOfASubscriberMadeBeforeItsPublisher) {
  const std::string name = topic("connected-poll");
  Subscriber sub(name);
  EXPECT_FALSE(sub.connected());
  Publisher pub(name);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!sub.connected() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  ASSERT_TRUE(sub.connected());
  EXPECT_EQ(pub.subscriber_count(), 1u);
  EXPECT_EQ(pub.send(Tensor::zeros({4}, DType::float32())), 1u);
  auto t = sub.recv(std::chrono::seconds(5));
  ASSERT_TRUE(t);
  EXPECT_EQ(t->numel(), 4);
}

// A refusal that connected()'s handshake step meets (it cannot throw) is raised by the next recv, not lost.
TEST(Ipc, ARefusalMetByConnectedIsRaisedByTheNextRecv) {
  const std::string name = topic("connected-refused");
  Subscriber first(name), second(name);
  tw::PublisherOptions o;
  o.max_subscribers = 1;
  Publisher pub(name, o);  // takes one waiting subscriber and refuses the other
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  bool a = false, b = false;
  while (!(a = first.connected()) && !(b = second.connected()) && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  ASSERT_TRUE(a || b);
  Subscriber& other = a ? second : first;
  for (int i = 0; i < 100; ++i) {  // its handshake steps meet the refusal (0.2 s: the packet is already there)
    EXPECT_FALSE(other.connected());
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  bool refused_seen = false;
  try {
    (void)other.recv(std::chrono::milliseconds(0));
  } catch (const tw::Error& e) {
    EXPECT_NE(std::string(e.what()).find("refused this subscriber"), std::string::npos) << e.what();
    refused_seen = true;
  }
  EXPECT_TRUE(refused_seen) << "the refused subscriber's recv says so (it ended quietly)";
  EXPECT_EQ(pub.subscriber_count(), 1u);
}
}  // namespace
