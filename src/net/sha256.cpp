// sha256.cpp — SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104) for the UCX transport's token challenge.
// See sha256.hpp for what this is (and is not) for.
#include "sha256.hpp"

#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "tensorwire/error.hpp"

namespace tw::net_detail {

namespace {

// FIPS 180-4 section 4.2.2: the first 32 bits of the fractional parts of the cube roots of the first 64 primes.
constexpr std::array<uint32_t, 64> kRound = {
    0x428a2f98u, 0x71374491u, 0xb5c0fbcfu, 0xe9b5dba5u, 0x3956c25bu, 0x59f111f1u, 0x923f82a4u, 0xab1c5ed5u,
    0xd807aa98u, 0x12835b01u, 0x243185beu, 0x550c7dc3u, 0x72be5d74u, 0x80deb1feu, 0x9bdc06a7u, 0xc19bf174u,
    0xe49b69c1u, 0xefbe4786u, 0x0fc19dc6u, 0x240ca1ccu, 0x2de92c6fu, 0x4a7484aau, 0x5cb0a9dcu, 0x76f988dau,
    0x983e5152u, 0xa831c66du, 0xb00327c8u, 0xbf597fc7u, 0xc6e00bf3u, 0xd5a79147u, 0x06ca6351u, 0x14292967u,
    0x27b70a85u, 0x2e1b2138u, 0x4d2c6dfcu, 0x53380d13u, 0x650a7354u, 0x766a0abbu, 0x81c2c92eu, 0x92722c85u,
    0xa2bfe8a1u, 0xa81a664bu, 0xc24b8b70u, 0xc76c51a3u, 0xd192e819u, 0xd6990624u, 0xf40e3585u, 0x106aa070u,
    0x19a4c116u, 0x1e376c08u, 0x2748774cu, 0x34b0bcb5u, 0x391c0cb3u, 0x4ed8aa4au, 0x5b9cca4fu, 0x682e6ff3u,
    0x748f82eeu, 0x78a5636fu, 0x84c87814u, 0x8cc70208u, 0x90befffau, 0xa4506cebu, 0xbef9a3f7u, 0xc67178f2u,
};

// FIPS 180-4 section 5.3.3: the first 32 bits of the fractional parts of the square roots of the first 8 primes.
constexpr std::array<uint32_t, 8> kInitial = {
    0x6a09e667u, 0xbb67ae85u, 0x3c6ef372u, 0xa54ff53au, 0x510e527fu, 0x9b05688cu, 0x1f83d9abu, 0x5be0cd19u,
};

constexpr size_t kBlock = 64;  // bytes per SHA-256 message block (512 bits)

// FIPS 180-4 section 3.2 / 4.1.2. Every operand is uint32_t; the casts keep -Wconversion quiet about the
// integer promotions of the shifts (they cannot change a value here).
constexpr uint32_t rotr(uint32_t x, unsigned n) noexcept {
  return static_cast<uint32_t>((x >> n) | (x << (32u - n)));
}
constexpr uint32_t ch(uint32_t x, uint32_t y, uint32_t z) noexcept { return (x & y) ^ (~x & z); }
constexpr uint32_t maj(uint32_t x, uint32_t y, uint32_t z) noexcept { return (x & y) ^ (x & z) ^ (y & z); }
constexpr uint32_t big_sigma0(uint32_t x) noexcept { return rotr(x, 2) ^ rotr(x, 13) ^ rotr(x, 22); }
constexpr uint32_t big_sigma1(uint32_t x) noexcept { return rotr(x, 6) ^ rotr(x, 11) ^ rotr(x, 25); }
constexpr uint32_t small_sigma0(uint32_t x) noexcept { return rotr(x, 7) ^ rotr(x, 18) ^ (x >> 3); }
constexpr uint32_t small_sigma1(uint32_t x) noexcept { return rotr(x, 17) ^ rotr(x, 19) ^ (x >> 10); }

inline uint32_t load_be32(const uint8_t* p) noexcept {
  return (static_cast<uint32_t>(p[0]) << 24) | (static_cast<uint32_t>(p[1]) << 16) |
         (static_cast<uint32_t>(p[2]) << 8) | static_cast<uint32_t>(p[3]);
}

inline void store_be32(uint8_t* p, uint32_t v) noexcept {
  p[0] = static_cast<uint8_t>(v >> 24);
  p[1] = static_cast<uint8_t>(v >> 16);
  p[2] = static_cast<uint8_t>(v >> 8);
  p[3] = static_cast<uint8_t>(v);
}

}  // namespace

Sha256::Sha256() : state_(kInitial) {}

// FIPS 180-4 section 6.2.2: one block of the hash computation.
void Sha256::compress(const uint8_t* block) noexcept {
  std::array<uint32_t, 64> w;  // the message schedule
  for (size_t t = 0; t < 16; ++t) w[t] = load_be32(block + 4 * t);
  for (size_t t = 16; t < 64; ++t) {
    w[t] = small_sigma1(w[t - 2]) + w[t - 7] + small_sigma0(w[t - 15]) + w[t - 16];
  }

  uint32_t a = state_[0], b = state_[1], c = state_[2], d = state_[3];
  uint32_t e = state_[4], f = state_[5], g = state_[6], h = state_[7];
  for (size_t t = 0; t < 64; ++t) {
    const uint32_t t1 = h + big_sigma1(e) + ch(e, f, g) + kRound[t] + w[t];
    const uint32_t t2 = big_sigma0(a) + maj(a, b, c);
    h = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  state_[0] += a;
  state_[1] += b;
  state_[2] += c;
  state_[3] += d;
  state_[4] += e;
  state_[5] += f;
  state_[6] += g;
  state_[7] += h;
}

void Sha256::update(const void* data, size_t n) {
  if (n == 0) return;
  const auto* p = static_cast<const uint8_t*>(data);
  total_bytes_ += n;

  if (buffered_ > 0) {  // top up a partial block first
    const size_t take = std::min(n, kBlock - buffered_);
    std::memcpy(buffer_.data() + buffered_, p, take);
    buffered_ += take;
    p += take;
    n -= take;
    if (buffered_ < kBlock) return;
    compress(buffer_.data());
    buffered_ = 0;
  }
  for (; n >= kBlock; p += kBlock, n -= kBlock) compress(p);  // whole blocks straight from the input
  if (n > 0) {
    std::memcpy(buffer_.data(), p, n);
    buffered_ = n;
  }
}

// FIPS 180-4 section 5.1.1: append bit '1', then zeros up to 56 mod 64 bytes, then the length in bits as a
// 64-bit big-endian integer.
Digest Sha256::finish() {
  const uint64_t bit_length = total_bytes_ * 8u;  // wraps mod 2^64, as the standard's length field does

  buffer_[buffered_++] = 0x80;
  if (buffered_ > kBlock - 8) {  // no room for the length: pad this block out and start another
    std::memset(buffer_.data() + buffered_, 0, kBlock - buffered_);
    compress(buffer_.data());
    buffered_ = 0;
  }
  std::memset(buffer_.data() + buffered_, 0, kBlock - 8 - buffered_);
  store_be32(buffer_.data() + 56, static_cast<uint32_t>(bit_length >> 32));
  store_be32(buffer_.data() + 60, static_cast<uint32_t>(bit_length));
  compress(buffer_.data());
  buffered_ = 0;

  Digest out;
  for (size_t i = 0; i < 8; ++i) store_be32(out.data() + 4 * i, state_[i]);
  return out;
}

Digest sha256(std::span<const uint8_t> data) {
  Sha256 h;
  h.update(data.data(), data.size());
  return h.finish();
}

// RFC 2104 section 2: H(K XOR opad, H(K XOR ipad, text)), K zero-padded to the block size (hashed first if longer).
Digest hmac_sha256(std::span<const uint8_t> key, std::span<const uint8_t> message) {
  std::array<uint8_t, kBlock> k{};
  if (key.size() > kBlock) {
    const Digest kd = sha256(key);
    std::memcpy(k.data(), kd.data(), kd.size());
  } else if (!key.empty()) {
    std::memcpy(k.data(), key.data(), key.size());
  }

  std::array<uint8_t, kBlock> pad;
  for (size_t i = 0; i < kBlock; ++i) pad[i] = static_cast<uint8_t>(k[i] ^ 0x36u);
  Sha256 inner;
  inner.update(pad.data(), pad.size());
  inner.update(message.data(), message.size());
  const Digest inner_digest = inner.finish();

  for (size_t i = 0; i < kBlock; ++i) pad[i] = static_cast<uint8_t>(k[i] ^ 0x5cu);
  Sha256 outer;
  outer.update(pad.data(), pad.size());
  outer.update(inner_digest.data(), inner_digest.size());
  return outer.finish();
}

bool equal_constant_time(std::span<const uint8_t> a, std::span<const uint8_t> b) noexcept {
  if (a.size() != b.size()) return false;
  // Accumulate every difference; volatile keeps the compiler from turning the loop into an early-exit compare.
  volatile uint8_t diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff = static_cast<uint8_t>(diff | (a[i] ^ b[i]));
  return diff == 0;
}

void random_bytes(std::span<uint8_t> out) {
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t got = ::getrandom(out.data() + done, out.size() - done, 0);
    if (got < 0) {
      const int err = errno;
      if (err == EINTR) continue;
      const ErrorCode code = (err == ENOSYS || err == EPERM) ? ErrorCode::unsupported : ErrorCode::internal;
      throw Error(code, "getrandom(2) failed while reading " + std::to_string(out.size()) +
                            " random bytes for the token challenge: " + std::strerror(err) +
                            "; the kernel's random source must be available (Linux 3.17+, not blocked by seccomp)");
    }
    done += static_cast<size_t>(got);
  }
}

}  // namespace tw::net_detail
