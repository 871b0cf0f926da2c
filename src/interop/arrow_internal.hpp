// arrow_internal.hpp (private) — what the three parts of the Arrow interop share: extension keys, limits and
// the element-type and error helpers (defined in arrow_schema.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tensorwire/arrow.hpp"

namespace tw::arrow_detail {

inline constexpr std::string_view kExtName = "ARROW:extension:name";
inline constexpr std::string_view kExtMetadata = "ARROW:extension:metadata";
inline constexpr int64_t kInt32Max = 2147483647;

[[noreturn]] void malformed(const std::string& where, const std::string& why);
[[noreturn]] void unsupported(const std::string& where, const std::string& why);
const char* format_of(DType d);
std::string unsupported_dtype_message(DType d);
bool is_identity(const std::vector<int64_t>& p);
std::vector<int64_t> to_vec(const Dims& d);

}  // namespace tw::arrow_detail
