// sha256.hpp (private) — SHA-256 and HMAC-SHA256, for the UCX transport's token challenge.
//
// The UCX transport authenticates a peer by challenge-response: the server sends a random nonce, the client answers
// with HMAC-SHA256(token, nonce), and the server compares that answer with its own in constant time. This module
// supplies exactly those pieces: a hash, a MAC, a constant-time comparison and OS randomness for the nonce. It is
// never used for encryption and is not a general-purpose cryptography library.
//
// Written from the specifications:
//   - FIPS 180-4, Secure Hash Standard (SHA-256: section 4.1.2 functions, 4.2.2 constants, 5 padding, 6.2 hashing);
//   - RFC 2104, HMAC: Keyed-Hashing for Message Authentication;
//   - RFC 4231, test vectors for HMAC-SHA224/256/384/512 (used by tests/cpp/test_sha256.cpp).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

namespace tw::net_detail {

/// A SHA-256 digest: 32 bytes, big-endian words as FIPS 180-4 writes them.
using Digest = std::array<uint8_t, 32>;

/// Streaming SHA-256 (FIPS 180-4). Feed bytes with update() any number of times, then call finish() once.
class Sha256 {
 public:
  Sha256();

  /// Appends `n` bytes at `data` to the message. `data` may be null when `n` is 0.
  void update(const void* data, size_t n);

  /// Pads the message, returns its digest. Call once; the object is spent afterwards (call neither again).
  Digest finish();

 private:
  void compress(const uint8_t* block) noexcept;

  std::array<uint32_t, 8> state_;
  std::array<uint8_t, 64> buffer_{};
  size_t buffered_ = 0;      // bytes in buffer_ (always < 64 between calls)
  uint64_t total_bytes_ = 0; // message length so far, in bytes
};

/// SHA-256 of `data` in one call.
Digest sha256(std::span<const uint8_t> data);

/// HMAC-SHA256 (RFC 2104) of `message` under `key`. Keys longer than the 64-byte block are hashed first.
Digest hmac_sha256(std::span<const uint8_t> key, std::span<const uint8_t> message);

/// True when `a` and `b` hold the same bytes. False at once on different lengths (lengths are not secret); for
/// equal lengths, the time taken does not depend on where (or whether) the contents differ.
bool equal_constant_time(std::span<const uint8_t> a, std::span<const uint8_t> b) noexcept;

/// Fills `out` with bytes from the kernel's CSPRNG (getrandom(2)), retrying on EINTR and short reads.
/// Throws tw::Error(unsupported) when the OS refuses (no getrandom, or forbidden by a sandbox), and
/// tw::Error(internal) on any other failure.
void random_bytes(std::span<uint8_t> out);

}  // namespace tw::net_detail
