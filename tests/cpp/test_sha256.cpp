// SHA-256 and HMAC-SHA256 for the UCX token challenge: FIPS 180-4 / NIST example vectors, streaming equals one-shot
// for any chunking, RFC 4231 HMAC test cases, the constant-time comparison, and OS randomness.
#include <algorithm>
#include <array>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "net/sha256.hpp"
#include "tw_test_util.hpp"

namespace {

using tw::net_detail::Digest;
using tw::net_detail::Sha256;

std::string hex(const Digest& d) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s;
  for (uint8_t b : d) {
    s.push_back(kDigits[b >> 4]);
    s.push_back(kDigits[b & 0x0f]);
  }
  return s;
}

std::span<const uint8_t> bytes(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

std::string sha_hex(std::string_view s) { return hex(tw::net_detail::sha256(bytes(s))); }

std::string hmac_hex(const std::vector<uint8_t>& key, const std::vector<uint8_t>& msg) {
  return hex(tw::net_detail::hmac_sha256(key, msg));
}

std::vector<uint8_t> repeat(uint8_t b, size_t n) { return std::vector<uint8_t>(n, b); }

std::vector<uint8_t> vec(std::string_view s) { return {s.begin(), s.end()}; }

// --- FIPS 180-4 / NIST CSRC example vectors ---

TEST(Sha256, EmptyMessage) {
  EXPECT_EQ(sha_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  Sha256 h;
  h.update(nullptr, 0);
  EXPECT_EQ(hex(h.finish()), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(Sha256, Abc) {
  EXPECT_EQ(sha_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(Sha256, TwoBlockMessage448Bits) {
  // 56 bytes: the padding's length field no longer fits, so padding spills into a second block.
  EXPECT_EQ(sha_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Sha256, OneMillionAStreamedInOddChunks) {
  const std::string chunk(997, 'a');
  const std::array<size_t, 7> sizes = {1, 3, 63, 65, 127, 997, 13};
  Sha256 h;
  size_t left = 1000000, i = 0;
  while (left > 0) {
    const size_t n = std::min(sizes[i++ % sizes.size()], left);
    h.update(chunk.data(), n);
    left -= n;
  }
  EXPECT_EQ(hex(h.finish()), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, StreamingEqualsOneShotForRandomChunkings) {
  std::mt19937 rng(20240601u);
  std::uniform_int_distribution<int> byte(0, 255);
  // Lengths around the block (64) and padding (56) boundaries, plus a few longer ones.
  const std::vector<size_t> lengths = {0, 1, 55, 56, 57, 63, 64, 65, 119, 120, 127, 128, 129, 1000, 4097};
  for (size_t len : lengths) {
    std::vector<uint8_t> data(len);
    for (auto& b : data) b = static_cast<uint8_t>(byte(rng));
    const Digest expected = tw::net_detail::sha256(data);
    for (int trial = 0; trial < 20; ++trial) {
      std::uniform_int_distribution<size_t> chunk(0, 150);
      Sha256 h;
      size_t pos = 0;
      while (pos < len) {
        const size_t n = std::min(chunk(rng), len - pos);
        h.update(data.data() + pos, n);
        pos += n;
      }
      EXPECT_EQ(hex(h.finish()), hex(expected)) << "length " << len << ", trial " << trial;
    }
  }
}

// --- RFC 4231 HMAC-SHA256 test cases (case 5, a truncated output, is not used by the token challenge) ---

TEST(HmacSha256, Rfc4231Case1) {
  EXPECT_EQ(hmac_hex(repeat(0x0b, 20), vec("Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
}

TEST(HmacSha256, Rfc4231Case2KeyShorterThanOutput) {
  EXPECT_EQ(hmac_hex(vec("Jefe"), vec("what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST(HmacSha256, Rfc4231Case3) {
  EXPECT_EQ(hmac_hex(repeat(0xaa, 20), repeat(0xdd, 50)),
            "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
}

TEST(HmacSha256, Rfc4231Case4) {
  std::vector<uint8_t> key;
  for (uint8_t b = 0x01; b <= 0x19; ++b) key.push_back(b);
  ASSERT_EQ(key.size(), 25u);
  EXPECT_EQ(hmac_hex(key, repeat(0xcd, 50)), "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
}

TEST(HmacSha256, Rfc4231Case6KeyLongerThanBlock) {
  EXPECT_EQ(hmac_hex(repeat(0xaa, 131), vec("Test Using Larger Than Block-Size Key - Hash Key First")),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

TEST(HmacSha256, Rfc4231Case7KeyAndDataLongerThanBlock) {
  EXPECT_EQ(hmac_hex(repeat(0xaa, 131),
                     vec("This is a test using a larger than block-size key and a larger than block-size data. "
                         "The key needs to be hashed before being used by the HMAC algorithm.")),
            "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
}

// --- constant-time comparison ---

TEST(EqualConstantTime, EqualDifferentAndMismatchedLengths) {
  using tw::net_detail::equal_constant_time;
  const Digest a = tw::net_detail::sha256(bytes("abc"));
  Digest b = a;
  EXPECT_TRUE(equal_constant_time(a, b));

  b[31] = static_cast<uint8_t>(b[31] ^ 0x01);
  EXPECT_FALSE(equal_constant_time(a, b));

  b = a;
  b[0] = static_cast<uint8_t>(b[0] ^ 0x80);
  EXPECT_FALSE(equal_constant_time(a, b));

  EXPECT_FALSE(equal_constant_time(std::span<const uint8_t>(a).first(31), a));
  EXPECT_FALSE(equal_constant_time(a, std::span<const uint8_t>(a).first(31)));
  EXPECT_TRUE(equal_constant_time(std::span<const uint8_t>(), std::span<const uint8_t>()));
}

// --- OS randomness ---

TEST(RandomBytes, TwoCallsDiffer) {
  std::array<uint8_t, 32> x{}, y{};
  tw::net_detail::random_bytes(x);
  tw::net_detail::random_bytes(y);
  EXPECT_NE(x, y);  // equal with probability 2^-256
  tw::net_detail::random_bytes(std::span<uint8_t>());  // an empty request is fine
}

}  // namespace
