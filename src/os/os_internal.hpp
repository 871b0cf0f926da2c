// os_internal.hpp (private) — the small OS layer the transports share: move-only RAII handles for fds and
// mappings, sealed memfds, abstract SOCK_SEQPACKET sockets that carry fds (SCM_RIGHTS) and peer credentials, futexes,
// and how much memory this process can still get. Linux only; no policy: the transports (ipc/, later net/ and the
// CUDA pool) decide what to do with these.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tensorwire/error.hpp"

namespace tw::os {

// ---- OS handles -------------------------------------------------------------------------------------------------

/// A file descriptor: move-only, closed on destruction or reset().
class Fd {
 public:
  Fd() noexcept = default;
  explicit Fd(int fd) noexcept : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) reset(o.release());
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }

  int get() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }
  int release() noexcept {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset(int fd = -1) noexcept;

 private:
  int fd_ = -1;
};

/// A memory mapping: move-only, unmapped on destruction or reset().
class Mapping {
 public:
  Mapping() noexcept = default;
  Mapping(void* p, size_t n) noexcept : p_(p), n_(n) {}
  Mapping(Mapping&& o) noexcept : p_(o.p_), n_(o.n_), fork_private_(o.fork_private_) {
    o.p_ = nullptr, o.n_ = 0, o.fork_private_ = false;
  }
  Mapping& operator=(Mapping&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = o.p_, n_ = o.n_, fork_private_ = o.fork_private_;
      o.p_ = nullptr, o.n_ = 0, o.fork_private_ = false;
    }
    return *this;
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() { reset(); }

  /// Maps `size` bytes of `fd` shared; read-only unless `writable`. Pre-faults (MAP_POPULATE) when `prefault` and
  /// prefault_allowed(size). Throws Error(out_of_memory) when the address space or memory is exhausted.
  static Mapping map(int fd, size_t size, bool writable, bool prefault);
  /// Makes the mapping read-only or writable again (a sent loan). Returns false when the kernel refused.
  bool protect(bool writable) noexcept;
  /// In a fork()ed child this mapping of `fd` (which must stay open while the mapping lives) becomes a private one
  /// at the same address: what the child writes stays the child's (pages it has not written still show the file;
  /// where the private mapping cannot be had, the child's is made read-only). A publisher's pool memory is
  /// shared with every subscriber; a child writing a loan it inherited changed what they had already received.
  void private_in_forked_children(int fd);

  char* data() const noexcept { return static_cast<char*>(p_); }
  size_t size() const noexcept { return n_; }
  explicit operator bool() const noexcept { return p_ != nullptr; }
  void reset() noexcept;

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
  bool fork_private_ = false;
};

/// A sealed memfd of `size` bytes (F_SEAL_SHRINK | F_SEAL_GROW; the caller adds more seals after mapping).
Fd make_memfd(const std::string& debug_name, size_t size);
/// Adds seals; throws Error(internal) on failure.
void add_seals(int fd, int seals);
/// Checks that `fd` is a memfd sealed against shrinking whose size is at least `size`; throws Error otherwise.
void check_sealed(int fd, uint64_t size);

/// Errors from the OS: Error(internal) with strerror(errno) and the call (Error(out_of_memory) for ENOMEM/ENOSPC).
[[noreturn]] void throw_errno(const std::string& what);

/// Bytes of memory this process can still obtain: the smallest of MemAvailable (/proc/meminfo), the headroom of
/// its cgroup v2 memory.max, and what RLIMIT_AS leaves of the address space. UINT64_MAX when none can be read.
uint64_t memory_headroom() noexcept;
/// Throws Error(out_of_memory) naming `what` when `bytes` of shared memory cannot be had (more than
/// memory_headroom()): the kernel's OOM killer must never be how a too-large request ends.
void check_memory_available(uint64_t bytes, const std::string& what);
/// Whether a mapping of `bytes` may be pre-faulted: at most kMaxPrefaultBytes and half the headroom. Larger ones
/// fault in lazily (a peer chooses segment and channel sizes; pre-faulting them would let it allocate for us).
inline constexpr uint64_t kMaxPrefaultBytes = uint64_t{1} << 30;
bool prefault_allowed(uint64_t bytes) noexcept;

// ---- sockets ----------------------------------------------------------------------------------------------------


/// A non-blocking SOCK_SEQPACKET socket bound to the abstract `address`, listening. Returns an empty Fd when the
/// address is in use.
Fd listen_abstract(const std::string& address);
/// Connects a SOCK_SEQPACKET socket to the abstract `address`. Returns an empty Fd when nobody listens there.
Fd connect_abstract(const std::string& address);
/// Abstract addresses in /proc/net/unix that start with `prefix` and belong to listening sockets.
std::vector<std::string> find_listening(const std::string& prefix);
/// The peer's uid and pid (SO_PEERCRED).
struct PeerCred {
  uint32_t uid = 0;
  int32_t pid = 0;
};
PeerCred peer_credentials(int sock);

/// What send_packet achieved.
enum class SendResult : uint8_t {
  sent,  ///< the whole packet is queued at the peer
  full,  ///< the peer's socket buffer stayed full for the whole timeout, or the fds it has not read yet are
         ///< as many as the sender may have in flight (ETOOMANYREFS): a slow reader, still alive
  gone,  ///< the peer hung up, or the socket failed
};
/// Sends one packet with up to 4 fds, waiting for room up to `timeout_ms` (0: not at all).
SendResult send_packet(int sock, const void* data, size_t n, std::span<const int> fds, int timeout_ms);
/// Whether `fd` is an eventfd (a peer could send a pipe or a socket instead, which would block readers).
bool is_eventfd(int fd) noexcept;
/// Receives one packet without blocking. Returns: >0 bytes read (fds appended to `fds`, each owned),
/// 0 when the peer closed, -1 when nothing waits, -2 for a truncated packet (too long or too many fds).
long recv_packet(int sock, void* buf, size_t cap, std::vector<Fd>& fds);

// ---- process ----------------------------------------------------------------------------------------------------

/// getpid() without a system call per use (hot paths check that an object is used by the process that made it):
/// read once, and again in the child of every fork() (pthread_atfork).
int current_pid() noexcept;

// ---- futex ------------------------------------------------------------------------------------------------------

/// Sleeps while *word == expected, at most `timeout_ns` (>= 0). Returns false when interrupted by a signal.
bool futex_wait(uint32_t* word, uint32_t expected, int64_t timeout_ns) noexcept;
void futex_wake_all(uint32_t* word) noexcept;

}  // namespace tw::os
