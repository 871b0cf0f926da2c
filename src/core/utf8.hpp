// utf8.hpp (private) — the one UTF-8 validator: the JSON reader and the C ABI's string arguments both use it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace tw::detail {

// The length of the well-formed UTF-8 sequence starting at s[pos], or 0 with *why saying what is wrong
// (overlong forms, surrogates and code points beyond U+10FFFF are not well-formed).
inline size_t utf8_sequence_length(std::string_view s, size_t pos, const char** why) noexcept {
  const unsigned char b0 = static_cast<unsigned char>(s[pos]);
  if (b0 < 0x80) return 1;
  size_t n;
  uint32_t cp, min;
  if (b0 >= 0xC2 && b0 <= 0xDF) { n = 2; cp = b0 & 0x1Fu; min = 0x80; }
  else if (b0 >= 0xE0 && b0 <= 0xEF) { n = 3; cp = b0 & 0x0Fu; min = 0x800; }
  else if (b0 >= 0xF0 && b0 <= 0xF4) { n = 4; cp = b0 & 0x07u; min = 0x10000; }
  else return *why = "invalid UTF-8 lead byte", 0;
  if (s.size() - pos < n) return *why = "truncated UTF-8 sequence", 0;
  for (size_t i = 1; i < n; ++i) {
    const unsigned char b = static_cast<unsigned char>(s[pos + i]);
    if ((b & 0xC0) != 0x80) return *why = "invalid UTF-8 continuation byte", 0;
    cp = (cp << 6) | (b & 0x3Fu);
  }
  if (cp < min) return *why = "overlong UTF-8 encoding", 0;
  if (cp > 0x10FFFF) return *why = "UTF-8 code point beyond U+10FFFF", 0;
  if (cp >= 0xD800 && cp <= 0xDFFF) return *why = "UTF-8 encoded surrogate", 0;
  return n;
}

inline bool valid_utf8(std::string_view s) noexcept {
  const char* why = nullptr;
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_sequence_length(s, i, &why);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

}  // namespace tw::detail
