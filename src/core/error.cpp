#include "tensorwire/error.hpp"
#include "tensorwire/version.hpp"

namespace tw {

const char* error_code_name(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::invalid_argument: return "invalid_argument";
    case ErrorCode::type_mismatch: return "type_mismatch";
    case ErrorCode::out_of_range: return "out_of_range";
    case ErrorCode::overflow: return "overflow";
    case ErrorCode::unsupported: return "unsupported";
    case ErrorCode::copy_required: return "copy_required";
    case ErrorCode::device_unavailable: return "device_unavailable";
    case ErrorCode::version_mismatch: return "version_mismatch";
    case ErrorCode::read_only: return "read_only";
    case ErrorCode::internal: return "internal";
    case ErrorCode::out_of_memory: return "out_of_memory";
    case ErrorCode::timeout: return "timeout";
  }
  return "unknown";
}

#define TW_STR2(x) #x
#define TW_STR(x) TW_STR2(x)
const char* version() noexcept {
  return TW_STR(TENSORWIRE_VERSION_MAJOR) "." TW_STR(TENSORWIRE_VERSION_MINOR) "." TW_STR(TENSORWIRE_VERSION_PATCH);
}

}  // namespace tw
