// channel_internal.hpp (private) — the publisher's side of one subscriber: its connection, its channel (the ring of
// message descriptors and the lease table, in a memfd only the two of them map) and its bookkeeping of which pool
// buffers it holds.
//
// Per subscriber, step by step:
//  1. open(): the channel memfd is made (sealed: neither side can resize it), the ring initialised from the
//     publisher's private copy of its geometry, an eventfd made, and both fds sent with WELCOME.
//  2. announce(): before the first message that names a pool segment, its fd is sent once (SEGMENT); retire()
//     tells the subscriber to drop a mapping the pool gave up (RETIRE).
//  3. Each pushed message counts in sent[slot]; the subscriber bumps its release counter for the slot when the
//     last view of the tensor goes. The slot is held while the two differ.
//  4. A control packet that cannot go out because the peer's socket is full (a subscriber that has not read its
//     announcements yet: it reads them when a message names a buffer it has not mapped) is not lost: an
//     announcement is tried again by the send, which applies its on_full policy to such a subscriber as to a full
//     ring (publisher.cpp); a retirement waits in `pending_retires_` and goes out before the next announcement. A
//     subscriber whose peer hung up, or that broke the ring protocol, is dead: its leases are void and it is
//     dropped.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ipc/ipc_internal.hpp"
#include "os/os_internal.hpp"

namespace tw::ipc_detail {

class SubscriberChannel {
 public:
  /// Sets up the channel for an accepted connection and sends WELCOME; the socket moves into the channel then.
  /// Returns nullptr when the peer went away meanwhile; throws Error when this process lacks the fds or memory
  /// (`sock` is still the caller's, to refuse the peer).
  static std::shared_ptr<SubscriberChannel> open(os::Fd& sock, const ChannelHeader& proto, size_t pool_slots,
                                                 int32_t pid, const std::string& topic);
  /// Turns a peer away with a reason it can report (REFUSED), then the socket closes.
  static void refuse(os::Fd& sock, RefuseReason why) noexcept;

  Ring ring;
  std::vector<uint32_t> sent;       ///< per slot: messages pushed holding that slot, minus those taken back
  std::vector<uint64_t> announced;  ///< per slot: the segment id this subscriber was told about
  std::atomic<bool> dead{false};    ///< hung up (or broke the protocol): its leases are void
  int32_t pid = 0;

  int socket() const noexcept { return sock_.get(); }
  bool detached() const noexcept { return aref(ring.header().detached).load(std::memory_order_acquire) != 0; }
  /// Receives messages: not dead, not detached (closed on its side).
  bool active() const noexcept { return !dead.load(std::memory_order_acquire) && !detached(); }
  uint32_t released(size_t slot) const noexcept;
  bool holds(size_t slot) const noexcept { return sent[slot] != released(slot); }
  /// Writes the eventfd (a subscriber in fileno() mode polls it).
  void notify() noexcept;
  /// True when the peer hung up (checked without blocking; marks it dead).
  bool hung_up() noexcept;

  /// Whether the subscriber was told about this segment (a message may name it).
  bool knows(size_t slot, uint64_t segment_id) const noexcept { return announced[slot] == segment_id; }
  /// Sends a segment's fd once (SEGMENT), after the retirements still pending. `sent`: the subscriber has it (now or
  /// before); `full`: its control socket has no room now (a slow reader; nothing was lost: try again later);
  /// `gone`: it hung up (marked dead).
  os::SendResult announce(size_t slot, uint64_t segment_id, uint64_t bytes, int fd);
  /// The same for a CUDA segment (CUDA_SEGMENT): `fd` is the VMM fd, or -1 for a legacy handle.
  os::SendResult announce_cuda(size_t slot, uint64_t segment_id, uint64_t bytes, const CudaSegmentInfo& info, int fd);
  /// Tells the subscriber a segment left the pool, if it had mapped it (queued while its socket is full).
  void retire(size_t slot, uint64_t segment_id);
  /// Waits up to `timeout_ms` for room in the control socket, or for the peer to hang up (then marked dead).
  void wait_writable(int timeout_ms) noexcept;
  /// Ends the stream (the publisher closes): the ring says closed, BYE goes out.
  void bye() noexcept;
  /// The subscriber broke the protocol: dead, and its socket shut down so it sees its stream end.
  void drop_broken() noexcept;

 private:
  os::SendResult flush_retires();
  void control_failed(os::SendResult r) noexcept;
  std::vector<uint64_t> pending_retires_;  ///< RETIREs not sent yet (the socket was full), oldest first
  os::Fd sock_, efd_;
  os::Mapping chan_;
};

}  // namespace tw::ipc_detail
