// Small helpers for the text of error messages.
#pragma once

#include <cstdint>
#include <string>

namespace tw::detail {

/// "1 buffer", "2 buffers": a count and its noun, the noun made plural by an "s" when the count is not one.
inline std::string counted(int64_t n, const char* noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}

}  // namespace tw::detail
