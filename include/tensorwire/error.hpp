// tensorwire/error.hpp — the one error type of the C++ API.
// Every failure throws tw::Error with a code saying which kind of failure it is and a message that names the
// offending value and what to do about it. Non-errors (a timeout, an empty queue) are return values instead.
#pragma once
#if defined(__cplusplus) && __cplusplus < 202002L && !(defined(_MSVC_LANG) && _MSVC_LANG >= 202002L)
#error "tensorwire's C++ headers need C++20 (-std=c++20); C and older C++ take the C API, tensorwire/tensorwire.h"
#endif

#include <stdexcept>
#include <string>

namespace tw {

/// What kind of failure an Error reports. Bindings map these to their languages' conventions
/// (Python: ValueError, TypeError, BufferError, IndexError, OverflowError, tw.CopyError).
enum class ErrorCode : int {
  invalid_argument = 1,   ///< A value is malformed (negative shape, bad dtype name, wrong rank...).
  type_mismatch = 2,      ///< A value has the wrong type (e.g. metadata value that is not JSON-like).
  out_of_range = 3,       ///< An index or a span lies outside what it indexes.
  overflow = 4,           ///< A size, stride or offset computation does not fit in 64 bits.
  unsupported = 5,        ///< Well-formed but not supported (an unknown dtype code, a layout a consumer can't take).
  copy_required = 6,      ///< The operation needs a copy and the caller forbade one (copy=false).
  device_unavailable = 7, ///< The device is absent or its driver cannot be reached.
  version_mismatch = 8,   ///< A protocol's major version is not one we understand.
  read_only = 9,          ///< A write was attempted through a read-only tensor.
  internal = 10,          ///< A bug in tensorwire. Please report it.
  out_of_memory = 11,     ///< Memory (host, shared or device) that cannot be had: nothing was allocated.
  timeout = 12,           ///< A bounded wait ended with nothing done (see TimeoutError).
};

/// Returns a stable lower-case name for `code`, e.g. "copy_required".
const char* error_code_name(ErrorCode code) noexcept;

/// The exception type thrown by every tensorwire API.
class Error : public std::runtime_error {
 public:
  /// An embedded NUL in `message` (a caller's string quoted in it: a topic, a dtype text) reads "\x00": what()
  /// is a C string, and every reader of it (C, Python's exceptions, Rust) would stop there.
  Error(ErrorCode code, const std::string& message) : std::runtime_error(visible_nul(message)), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  static std::string visible_nul(std::string m) {
    for (size_t i = m.find('\0'); i != std::string::npos; i = m.find('\0', i + 4)) m.replace(i, 1, "\\x00");
    return m;
  }
  ErrorCode code_;
};

}  // namespace tw
