// checked.hpp (private) — overflow-checked 64-bit arithmetic that throws tw::Error(overflow) with context.
#pragma once

#include <cstdint>
#include <string>

#include "tensorwire/error.hpp"

namespace tw::detail {

[[noreturn]] inline void throw_overflow(const char* what) {
  throw Error(ErrorCode::overflow, std::string(what) + " overflows 64-bit arithmetic");
}

inline int64_t mul(int64_t a, int64_t b, const char* what) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) throw_overflow(what);
  return r;
}

inline int64_t add(int64_t a, int64_t b, const char* what) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) throw_overflow(what);
  return r;
}

}  // namespace tw::detail
