// channel.cpp — the publisher's side of one subscriber (channel_internal.hpp): channel set-up, segment
// announcements, liveness, and what happens when a control packet cannot go out.
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "ipc/channel_internal.hpp"

namespace tw::ipc_detail {

std::shared_ptr<SubscriberChannel> SubscriberChannel::open(os::Fd& sock, const ChannelHeader& proto, size_t pool_slots,
                                                           int32_t pid, const std::string& topic) {
  auto sub = std::make_shared<SubscriberChannel>();
  sub->pid = pid;
  os::Fd chan_fd = os::make_memfd("tensorwire:" + topic + ":channel", proto.total_bytes);
  sub->chan_ = os::Mapping::map(chan_fd.get(), proto.total_bytes, true, true);
  std::memcpy(sub->chan_.data(), &proto, sizeof proto);
  os::add_seals(chan_fd.get(), F_SEAL_SEAL);
  sub->ring = Ring(sub->chan_.data(), proto);  // geometry from our own copy, never from the shared page
  sub->ring.init_cells();
  sub->efd_ = os::Fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!sub->efd_) os::throw_errno("eventfd");
  sub->sent.assign(pool_slots, 0);
  sub->announced.assign(pool_slots, 0);
  sub->sock_ = std::move(sock);
  const ControlWire w = encode_control(ControlType::welcome, 0, proto.total_bytes);
  const int fds[2] = {chan_fd.get(), sub->efd_.get()};
  if (os::send_packet(sub->sock_.get(), &w, sizeof w, fds, 100) != SendResult::sent) return nullptr;
  return sub;
}

void SubscriberChannel::refuse(os::Fd& sock, RefuseReason why) noexcept {
  const ControlWire w = encode_control(ControlType::refused, static_cast<uint64_t>(why), 0);
  try {
    os::send_packet(sock.get(), &w, sizeof w, {}, 0);
  } catch (...) {
    // the socket closes anyway: the peer sees end of stream
  }
}

uint32_t SubscriberChannel::released(size_t slot) const noexcept {
  uint32_t* r = ring.released(static_cast<uint32_t>(slot));
  return r ? aref(*r).load(std::memory_order_acquire) : 0;
}

void SubscriberChannel::notify() noexcept {
  uint64_t one = 1;
  [[maybe_unused]] ssize_t r = ::write(efd_.get(), &one, sizeof one);
}

bool SubscriberChannel::hung_up() noexcept {
  if (dead.load(std::memory_order_acquire)) return true;
  pollfd p{sock_.get(), POLLRDHUP, 0};
  if (::poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLERR | POLLRDHUP))) dead.store(true);
  return dead.load(std::memory_order_acquire);
}

os::SendResult SubscriberChannel::flush_retires() {
  size_t n = 0;
  os::SendResult r = os::SendResult::sent;
  for (; n < pending_retires_.size(); ++n) {
    const ControlWire w = encode_control(ControlType::retire, pending_retires_[n], 0);
    r = os::send_packet(sock_.get(), &w, sizeof w, {}, 0);
    if (r != os::SendResult::sent) break;
  }
  pending_retires_.erase(pending_retires_.begin(), pending_retires_.begin() + static_cast<std::ptrdiff_t>(n));
  control_failed(r);
  return r;
}

os::SendResult SubscriberChannel::announce(size_t slot, uint64_t segment_id, uint64_t bytes, int fd) {
  if (knows(slot, segment_id)) return os::SendResult::sent;
  if (const os::SendResult r = flush_retires(); r != os::SendResult::sent) return r;
  const ControlWire w = encode_control(ControlType::segment, segment_id, bytes);
  const os::SendResult r = os::send_packet(sock_.get(), &w, sizeof w, std::span<const int>(&fd, 1), 0);
  if (r == os::SendResult::sent) announced[slot] = segment_id;
  control_failed(r);
  return r;
}

os::SendResult SubscriberChannel::announce_cuda(size_t slot, uint64_t segment_id, uint64_t bytes,
                                                const CudaSegmentInfo& info, int fd) {
  if (knows(slot, segment_id)) return os::SendResult::sent;
  if (const os::SendResult r = flush_retires(); r != os::SendResult::sent) return r;
  const CudaSegmentWire w = encode_cuda_segment(segment_id, bytes, info);
  const os::SendResult r = os::send_packet(sock_.get(), &w, sizeof w,
                                           fd >= 0 ? std::span<const int>(&fd, 1) : std::span<const int>(), 0);
  if (r == os::SendResult::sent) announced[slot] = segment_id;
  control_failed(r);
  return r;
}

void SubscriberChannel::retire(size_t slot, uint64_t segment_id) {
  if (announced[slot] != segment_id) return;
  announced[slot] = 0;
  // In order, after any still pending. One that cannot go out now waits for the next announcement (the subscriber
  // keeps a mapping no message names again meanwhile; the pending list is bounded by the segments it was told of).
  pending_retires_.push_back(segment_id);
  (void)flush_retires();
}

void SubscriberChannel::wait_writable(int timeout_ms) noexcept {
  pollfd p{sock_.get(), POLLOUT | POLLRDHUP, 0};
  const int r = ::poll(&p, 1, std::max(0, timeout_ms));
  if (r > 0 && (p.revents & (POLLHUP | POLLERR | POLLRDHUP))) dead.store(true);
}

void SubscriberChannel::bye() noexcept {
  ring.close();
  notify();
  const ControlWire w = encode_control(ControlType::bye, 0, 0);
  try {
    os::send_packet(sock_.get(), &w, sizeof w, {}, 0);
  } catch (...) {
  }
}

void SubscriberChannel::drop_broken() noexcept {
  dead.store(true);
  ::shutdown(sock_.get(), SHUT_RDWR);
}

// A hung-up peer is dead (its leases go). A full socket is the caller's to handle (announce, retire).
void SubscriberChannel::control_failed(os::SendResult r) noexcept {
  if (r == os::SendResult::gone) dead.store(true);
}

}  // namespace tw::ipc_detail
