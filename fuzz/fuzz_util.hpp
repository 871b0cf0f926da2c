// fuzz_util.hpp — shared helpers for the libFuzzer targets in this folder.
//
// Inputs are read front to back, little-endian, by ByteReader; a read past the end yields zeros, so every input
// (including the empty one) decodes to something and fuzz/make_corpus.py can write seeds field by field.
// TW_FUZZ_CHECK reports a broken property and aborts, which libFuzzer records as a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tensorwire/tensor.hpp"

#define TW_FUZZ_CHECK(cond, ...)                                                          \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      std::fprintf(stderr, "\n%s:%d: property violated: %s\n  ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                                  \
      std::fprintf(stderr, "\n");                                                         \
      std::abort();                                                                       \
    }                                                                                     \
  } while (0)

// Harness-only loops (buffer fills, element-by-element checks) are kept out of the coverage map: their branches
// say nothing about the library and would only slow the fuzzer and distract it.
#define TW_FUZZ_NO_COVERAGE __attribute__((no_sanitize("coverage")))

namespace twfuzz {

class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size) : p_(data), n_(size) {}

  size_t remaining() const { return n_ - pos_; }

  template <class T>
  T read() {  // little-endian integer of sizeof(T) bytes; missing bytes read as zero
    uint64_t v = 0;
    for (size_t i = 0; i < sizeof(T); ++i) v |= uint64_t(byte()) << (8 * i);
    T out;
    std::memcpy(&out, &v, sizeof(T));  // truncating little-endian reinterpretation
    return out;
  }
  uint8_t u8() { return read<uint8_t>(); }

  /// A signed value: one signed byte when !wide (easy for the fuzzer to hit small sizes), eight bytes when wide.
  int64_t sval(bool wide) { return wide ? read<int64_t>() : int64_t(read<int8_t>()); }

  std::string str(size_t len) {
    std::string s;
    for (size_t i = 0; i < len && remaining() > 0; ++i) s.push_back(static_cast<char>(byte()));
    return s;
  }
  /// Copies the rest of the input into `out` cyclically (or a fixed pattern when the input is exhausted).
  TW_FUZZ_NO_COVERAGE void fill_rest(uint8_t* out, size_t len) {
    const size_t r = remaining();
    for (size_t i = 0; i < len; ++i) out[i] = r ? p_[pos_ + i % r] : static_cast<uint8_t>(i * 131u + 7u);
    pos_ = n_;
  }

 private:
  uint8_t byte() { return pos_ < n_ ? p_[pos_++] : 0; }
  const uint8_t* p_;
  size_t n_;
  size_t pos_ = 0;
};

/// Reads the `bits`-wide element starting at bit `bit` of `base` (little bit-endian, as DLPack packs sub-bytes).
TW_FUZZ_NO_COVERAGE inline unsigned read_bits(const uint8_t* base, int64_t bit, unsigned bits) {
  unsigned v = 0;
  for (unsigned k = 0; k < bits; ++k) {
    const int64_t b = bit + int64_t(k);
    const int64_t byte = b >= 0 ? b / 8 : -((-b + 7) / 8);
    const int64_t sh = b - byte * 8;
    v |= ((unsigned(base[byte]) >> sh) & 1u) << k;
  }
  return v;
}

/// Proves a contiguous copy honest: `c` (C-contiguous, host) holds, element for element, what a naive walk over
/// `layout` reads from `elem0` (the address of element 0). Reads every element of the source, so ASan sees any
/// layout that reaches outside the memory it claims. `byteswap` undoes a swap of each `unit`-byte piece.
TW_FUZZ_NO_COVERAGE inline void check_gather(const tw::Layout& layout, const uint8_t* elem0, const tw::Tensor& c, bool byteswap,
                         size_t unit) {
  TW_FUZZ_CHECK(c.is_contiguous(), "contiguous() returned strides %s", c.strides().str().c_str());
  TW_FUZZ_CHECK(c.shape() == layout.shape, "shape changed: %s -> %s", layout.shape.str().c_str(),
                c.shape().str().c_str());
  const int64_t n = layout.numel();
  if (n == 0) return;
  const auto* out = static_cast<const uint8_t*>(c.data_ptr());
  const size_t nd = layout.ndim();
  std::vector<int64_t> idx(nd, 0);
  int64_t off = 0;  // element offset of the current index
  const bool packed = layout.is_packed_subbyte();
  const unsigned bits = layout.dtype.total_bits();
  const size_t isz = layout.element_bytes();
  for (int64_t e = 0; e < n; ++e) {
    if (packed) {
      const unsigned want = read_bits(elem0, off * int64_t(bits), bits);
      const unsigned got = read_bits(out, e * int64_t(bits), bits);
      TW_FUZZ_CHECK(want == got, "packed element %lld: expected %u, got %u", static_cast<long long>(e), want, got);
    } else {
      const uint8_t* src = elem0 + off * static_cast<int64_t>(isz);
      const uint8_t* dst = out + static_cast<size_t>(e) * isz;
      for (size_t b = 0; b < isz; ++b) {
        size_t sb = b;
        if (byteswap && unit > 1) sb = b / unit * unit + (unit - 1 - b % unit);
        TW_FUZZ_CHECK(src[sb] == dst[b], "element %lld byte %zu: expected %u, got %u", static_cast<long long>(e), b,
                      unsigned(src[sb]), unsigned(dst[b]));
      }
    }
    for (size_t k = nd; k-- > 0;) {
      if (++idx[k] < layout.shape[k]) {
        off += layout.strides[k];
        break;
      }
      off -= (layout.shape[k] - 1) * layout.strides[k];
      idx[k] = 0;
    }
  }
}

/// Largest element count the harnesses copy and compare (broadcast layouts can name billions of elements that fit
/// in a few bytes; materialising them would only measure the allocator).
inline constexpr int64_t kMaxCheckedElements = int64_t(1) << 16;

}  // namespace twfuzz
