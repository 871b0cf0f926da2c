// os.cpp — the OS layer the transports share: fds, mappings, sealed memfds, abstract SOCK_SEQPACKET sockets with
// SCM_RIGHTS, peer credentials, futexes, and the memory this process can still get.
#include <fcntl.h>
#include <pthread.h>
#include <linux/futex.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <climits>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "os_internal.hpp"

namespace tw::os {

void throw_errno(const std::string& what) {
  const int e = errno;
  const ErrorCode code = (e == ENOMEM || e == ENOSPC || e == EFBIG) ? ErrorCode::out_of_memory : ErrorCode::internal;
  throw Error(code, "tensorwire: " + what + " failed: " + std::strerror(e));
}

namespace {

// One number from a "Key:   123 kB" line of /proc/meminfo, in bytes; UINT64_MAX when absent.
uint64_t meminfo_bytes(const char* key) noexcept {
  FILE* f = std::fopen("/proc/meminfo", "re");
  if (!f) return UINT64_MAX;
  char line[256];
  uint64_t out = UINT64_MAX;
  const size_t klen = std::strlen(key);
  while (std::fgets(line, sizeof line, f)) {
    if (std::strncmp(line, key, klen) == 0 && line[klen] == ':') {
      unsigned long long kb = 0;
      if (std::sscanf(line + klen + 1, "%llu", &kb) == 1) out = static_cast<uint64_t>(kb) * 1024;
      break;
    }
  }
  std::fclose(f);
  return out;
}

// A number in a one-line cgroup file ("max" or unreadable: UINT64_MAX).
uint64_t cgroup_value(const std::string& path) noexcept {
  FILE* f = std::fopen(path.c_str(), "re");
  if (!f) return UINT64_MAX;
  unsigned long long v = 0;
  const bool ok = std::fscanf(f, "%llu", &v) == 1;
  std::fclose(f);
  return ok ? static_cast<uint64_t>(v) : UINT64_MAX;
}

// The cgroup v2 directory of this process ("" when not on the unified hierarchy).
std::string cgroup_dir() {
  FILE* f = std::fopen("/proc/self/cgroup", "re");
  if (!f) return "";
  char line[4096];
  std::string dir;
  while (std::fgets(line, sizeof line, f)) {
    if (std::strncmp(line, "0::", 3) == 0) {
      dir = line + 3;
      while (!dir.empty() && (dir.back() == '\n' || dir.back() == '\r')) dir.pop_back();
      break;
    }
  }
  std::fclose(f);
  return dir.empty() ? "" : "/sys/fs/cgroup" + (dir == "/" ? std::string() : dir);
}

}  // namespace

uint64_t memory_headroom() noexcept {
  uint64_t room = meminfo_bytes("MemAvailable");
  try {
    // Every cgroup from ours up to the root may limit us: the tightest headroom counts.
    for (std::string dir = cgroup_dir(); dir.size() > std::strlen("/sys/fs/cgroup");
         dir = dir.substr(0, dir.rfind('/'))) {
      const uint64_t max = cgroup_value(dir + "/memory.max"), cur = cgroup_value(dir + "/memory.current");
      if (max != UINT64_MAX && cur != UINT64_MAX) room = std::min(room, max > cur ? max - cur : 0);
    }
  } catch (...) {
    // no memory for the path strings: MemAvailable alone
  }
  rlimit rl{};
  if (::getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
    // What the address space has left: the limit minus what is mapped now (VmSize in /proc/self/status).
    uint64_t vm = UINT64_MAX;
    if (FILE* f = std::fopen("/proc/self/status", "re")) {
      char line[256];
      while (std::fgets(line, sizeof line, f)) {
        unsigned long long kb;
        if (std::sscanf(line, "VmSize: %llu kB", &kb) == 1) {
          vm = static_cast<uint64_t>(kb) * 1024;
          break;
        }
      }
      std::fclose(f);
    }
    if (vm != UINT64_MAX) room = std::min<uint64_t>(room, rl.rlim_cur > vm ? rl.rlim_cur - vm : 0);
  }
  return room;
}

void check_memory_available(uint64_t bytes, const std::string& what) {
  const uint64_t room = memory_headroom();
  if (bytes > room)
    throw Error(ErrorCode::out_of_memory, what + " needs " + std::to_string(bytes) +
                                              " bytes of shared memory but this process can get about " +
                                              std::to_string(room) + " (available memory, cgroup and address-space "
                                              "limits); ask for less, or free memory first");
}

bool prefault_allowed(uint64_t bytes) noexcept {
  if (bytes > kMaxPrefaultBytes) return false;
  const uint64_t room = memory_headroom();
  return room == UINT64_MAX || bytes <= room / 2;
}

namespace {
std::atomic<int> g_pid{0};
void refresh_pid() noexcept { g_pid.store(static_cast<int>(::getpid()), std::memory_order_relaxed); }
}  // namespace

int current_pid() noexcept {
  int pid = g_pid.load(std::memory_order_relaxed);
  if (pid == 0) {
    static const bool registered = [] {
      ::pthread_atfork(nullptr, nullptr, &refresh_pid);  // (a child refreshes before any of its code runs)
      return true;
    }();
    (void)registered;
    refresh_pid();
    pid = g_pid.load(std::memory_order_relaxed);
  }
  return pid;
}

bool is_eventfd(int fd) noexcept {
  char path[64], target[64];
  std::snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  const ssize_t n = ::readlink(path, target, sizeof target - 1);
  if (n <= 0) return false;
  target[n] = 0;
  return std::strcmp(target, "anon_inode:[eventfd]") == 0;
}

void Fd::reset(int fd) noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

Mapping Mapping::map(int fd, size_t size, bool writable, bool prefault) {
  int flags = MAP_SHARED;
  if (prefault && prefault_allowed(size)) flags |= MAP_POPULATE;
  void* p = ::mmap(nullptr, size, writable ? PROT_READ | PROT_WRITE : PROT_READ, flags, fd, 0);
  if (p == MAP_FAILED) throw_errno("mmap of " + std::to_string(size) + " bytes");
  return Mapping(p, size);
}

bool Mapping::protect(bool writable) noexcept {
  return p_ && ::mprotect(p_, n_, writable ? PROT_READ | PROT_WRITE : PROT_READ) == 0;
}

namespace {

// Mappings made private in fork()ed children: address -> (size, fd). Its lock is a leaf (nothing else is taken
// while it is held) and is held across fork() so that the child sees the set whole: its fork handlers are
// registered when the library loads, before any other of tensorwire's, because prepare handlers run in reverse
// order of registration. Taken first, it deadlocked a fork() against a thread that held a publisher's lock (taken
// by the publisher's own prepare handler) and wanted this one to make a pool segment.
struct ForkPrivate {
  std::mutex mu;
  std::map<void*, std::pair<size_t, int>> live;
};
ForkPrivate& fork_private() noexcept {
  static auto* r = new ForkPrivate();  // never destroyed: fork handlers may run during exit
  return *r;
}
void fork_private_child() noexcept {
  ForkPrivate& r = fork_private();
  for (const auto& [addr, what] : r.live) {
    // A private copy made elsewhere first, then moved over the shared one: a failure leaves the shared mapping in
    // place (a failed mmap(MAP_FIXED) may have unmapped it), which is then at least never written through here.
    void* p = ::mmap(nullptr, what.first, PROT_READ | PROT_WRITE, MAP_PRIVATE, what.second, 0);
    if (p != MAP_FAILED && ::mremap(p, what.first, what.first, MREMAP_MAYMOVE | MREMAP_FIXED, addr) != MAP_FAILED)
      continue;
    if (p != MAP_FAILED) ::munmap(p, what.first);
    ::mprotect(addr, what.first, PROT_READ);
  }
  r.mu.unlock();
}
const bool g_fork_private_registered = [] {
  ::pthread_atfork([] { fork_private().mu.lock(); }, [] { fork_private().mu.unlock(); }, &fork_private_child);
  return true;
}();

}  // namespace

void Mapping::private_in_forked_children(int fd) {
  (void)g_fork_private_registered;
  if (!p_ || fork_private_) return;
  ForkPrivate& r = fork_private();
  std::lock_guard lk(r.mu);
  r.live[p_] = {n_, fd};
  fork_private_ = true;
}

void Mapping::reset() noexcept {
  if (p_ && fork_private_) {
    ForkPrivate& r = fork_private();
    std::lock_guard lk(r.mu);
    r.live.erase(p_);
  }
  fork_private_ = false;
  if (p_) ::munmap(p_, n_);
  p_ = nullptr;
  n_ = 0;
}

Fd make_memfd(const std::string& debug_name, size_t size) {
  Fd fd(static_cast<int>(::syscall(SYS_memfd_create, debug_name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING)));
  if (!fd) throw_errno("memfd_create");
  if (::ftruncate(fd.get(), static_cast<off_t>(size)) != 0) throw_errno("ftruncate of a memfd to " + std::to_string(size));
  add_seals(fd.get(), F_SEAL_SHRINK | F_SEAL_GROW);
  return fd;
}

void add_seals(int fd, int seals) {
  if (::fcntl(fd, F_ADD_SEALS, seals) != 0) throw_errno("F_ADD_SEALS");
}

void check_sealed(int fd, uint64_t size) {
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0 || !(seals & F_SEAL_SHRINK))
    throw Error(ErrorCode::invalid_argument, "tensorwire: a peer sent a memory fd that is not sealed against "
                                             "shrinking; refusing to map it (it could SIGBUS a reader)");
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw_errno("fstat");
  if (st.st_size < 0 || static_cast<uint64_t>(st.st_size) < size)
    throw Error(ErrorCode::invalid_argument, "tensorwire: a peer sent a memory fd of " + std::to_string(st.st_size) +
                                                 " bytes but announced " + std::to_string(size));
}

// ---- sockets ----------------------------------------------------------------------------------------------------

namespace {

socklen_t fill_address(sockaddr_un& a, const std::string& address) {
  std::memset(&a, 0, sizeof a);
  a.sun_family = AF_UNIX;
  if (address.size() + 1 > sizeof a.sun_path)
    throw Error(ErrorCode::invalid_argument, "tensorwire: socket address '" + address + "' is too long");
  std::memcpy(a.sun_path + 1, address.data(), address.size());  // sun_path[0] == 0: abstract namespace
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + address.size());
}

}  // namespace

Fd listen_abstract(const std::string& address) {
  sockaddr_un a;
  const socklen_t len = fill_address(a, address);
  Fd s(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!s) throw_errno("socket");
  if (::bind(s.get(), reinterpret_cast<sockaddr*>(&a), len) != 0) {
    if (errno == EADDRINUSE) return Fd();
    throw_errno("bind to @" + address);
  }
  if (::listen(s.get(), 64) != 0) throw_errno("listen");
  return s;
}

Fd connect_abstract(const std::string& address) {
  sockaddr_un a;
  const socklen_t len = fill_address(a, address);
  Fd s(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!s) throw_errno("socket");
  int r;
  do r = ::connect(s.get(), reinterpret_cast<sockaddr*>(&a), len);
  while (r != 0 && errno == EINTR);
  if (r != 0) {
    if (errno == ECONNREFUSED || errno == ENOENT || errno == EAGAIN) return Fd();
    throw_errno("connect to @" + address);
  }
  return s;
}

std::vector<std::string> find_listening(const std::string& prefix) {
  // Lines: "Num RefCount Protocol Flags Type St Inode Path"; listening sockets have __SO_ACCEPTCON (0x10000) in
  // Flags; abstract names are printed with a leading '@'.
  std::ifstream f("/proc/net/unix");
  std::set<std::string> found;
  std::string line;
  std::getline(f, line);  // header
  while (std::getline(f, line)) {
    std::istringstream in(line);
    std::string num, refs, proto, flags, type, st, inode, path;
    if (!(in >> num >> refs >> proto >> flags >> type >> st >> inode >> path)) continue;
    if (path.size() < 2 || path[0] != '@') continue;
    unsigned long fl = std::strtoul(flags.c_str(), nullptr, 16);
    if (!(fl & 0x10000UL)) continue;
    std::string addr = path.substr(1);
    if (addr.compare(0, prefix.size(), prefix) == 0) found.insert(addr);
  }
  return {found.begin(), found.end()};
}

PeerCred peer_credentials(int sock) {
  ucred c{};
  socklen_t n = sizeof c;
  if (::getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &c, &n) != 0) throw_errno("getsockopt(SO_PEERCRED)");
  return PeerCred{c.uid, c.pid};
}

SendResult send_packet(int sock, const void* data, size_t n, std::span<const int> fds, int timeout_ms) {
  iovec iov{const_cast<void*>(data), n};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)];
  if (!fds.empty()) {
    if (fds.size() > 4) throw Error(ErrorCode::internal, "send_packet: too many fds");
    std::memset(control, 0, sizeof control);
    m.msg_control = control;
    m.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  for (;;) {
    ssize_t r = ::sendmsg(sock, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r == static_cast<ssize_t>(n)) return SendResult::sent;
    if (r >= 0) return SendResult::gone;  // SOCK_SEQPACKET sends whole packets; a short write means trouble
    if (errno == EINTR) continue;
    // ETOOMANYREFS: this user has more fds in flight in unread socket buffers than its RLIMIT_NOFILE (checked
    // without CAP_SYS_RESOURCE): a slow reader, like a full buffer, not a dead peer.
    if (errno == ETOOMANYREFS) return SendResult::full;
    if (errno != EAGAIN && errno != ENOBUFS) return SendResult::gone;
    if (timeout_ms <= 0) return SendResult::full;
    pollfd p{sock, POLLOUT, 0};
    int pr = ::poll(&p, 1, timeout_ms);
    if (pr == 0) return SendResult::full;
    if (pr < 0 && errno != EINTR) return SendResult::gone;
    if (p.revents & (POLLHUP | POLLERR)) return SendResult::gone;
    timeout_ms = 0;  // one wait at most: a second EAGAIN reports full
  }
}

long recv_packet(int sock, void* buf, size_t cap, std::vector<Fd>& fds) {
  iovec iov{buf, cap};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 16)];
  m.msg_control = control;
  m.msg_controllen = sizeof control;
  ssize_t r;
  do r = ::recvmsg(sock, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  while (r < 0 && errno == EINTR);
  if (r < 0) {
    if (errno == EAGAIN) return -1;
    return 0;  // ECONNRESET and friends: the peer is gone
  }
  for (cmsghdr* c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < n; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      fds.emplace_back(fd);
    }
  }
  if (m.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
    return -2;  // an oversized packet or too many fds: malformed (the fds that did arrive are owned and closed)
  }
  if (r == 0) return 0;
  return static_cast<long>(r);
}

// ---- futex ------------------------------------------------------------------------------------------------------

bool futex_wait(uint32_t* word, uint32_t expected, int64_t timeout_ns) noexcept {
  if (timeout_ns < 0) timeout_ns = 0;
  timespec ts{static_cast<time_t>(timeout_ns / 1000000000), static_cast<long>(timeout_ns % 1000000000)};
  // Shared (not FUTEX_PRIVATE_FLAG): the word lives in memory mapped by two processes.
  long r = ::syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, nullptr, 0);
  return !(r != 0 && errno == EINTR);
}

void futex_wake_all(uint32_t* word) noexcept { ::syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0); }

}  // namespace tw::os
