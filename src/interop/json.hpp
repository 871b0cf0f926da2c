// json.hpp (private) — a strict JSON reader/writer, used for the Arrow canonical extensions' metadata.
//
// The reader accepts exactly RFC 8259 JSON (no comments, no trailing commas, no NaN, no leading zeros, no control
// characters in strings, well-formed UTF-8 and surrogate pairs only) and refuses duplicate object keys, nesting
// deeper than kMaxDepth and documents longer than kMaxBytes. Every failure is Error(invalid_argument) naming the
// byte offset. Recursion depth is bounded, so hostile input cannot exhaust the stack.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tw::detail::json {

inline constexpr int kMaxDepth = 32;
inline constexpr size_t kMaxBytes = size_t(1) << 20;

struct Value {
  enum class Type { null, boolean, number, string, array, object };
  Type type = Type::null;
  bool boolean = false;
  std::string text;          ///< a string's decoded contents, or a number's literal
  bool is_integer = false;   ///< a number without fraction or exponent that fits in int64
  int64_t integer = 0;
  std::vector<Value> items;      ///< array elements, or object member values (parallel to `keys`)
  std::vector<std::string> keys;  ///< object member names, in document order (a pair<string, Value> would need
                                  ///< Value complete here)

  /// The member named `key` of an object, or nullptr.
  const Value* find(std::string_view key) const;
};

/// Parses a whole document (surrounding whitespace allowed, nothing else after the value).
Value parse(std::string_view text);

/// `s` as a JSON string literal (quotes included; control characters, quote and backslash escaped).
std::string quote(std::string_view s);

/// Name of a JSON type for messages ("null", "bool", "number", "string", "array", "object").
const char* type_name(Value::Type t) noexcept;

}  // namespace tw::detail::json
