// A strict, bounded JSON reader and a string quoter: just enough JSON for the Arrow canonical extensions' metadata.
#include <cstring>
#include <string>

#include "json.hpp"
#include "core/utf8.hpp"
#include "tensorwire/error.hpp"

namespace tw::detail::json {
namespace {

class Parser {
 public:
  explicit Parser(std::string_view in) : in_(in) {}

  Value document() {
    if (in_.size() > kMaxBytes)
      fail("the document is " + std::to_string(in_.size()) + " bytes, more than the " + std::to_string(kMaxBytes) +
           " accepted");
    skip_ws();
    Value v = value(0);
    skip_ws();
    if (pos_ != in_.size()) fail("unexpected content after the value");
    return v;
  }

 private:
  std::string_view in_;
  size_t pos_ = 0;

  [[noreturn]] void fail(const std::string& why) const {
    throw Error(ErrorCode::invalid_argument, "invalid JSON at byte " + std::to_string(pos_) + ": " + why);
  }

  bool at_end() const { return pos_ >= in_.size(); }
  char peek() const { return at_end() ? '\0' : in_[pos_]; }

  void skip_ws() {
    while (!at_end()) {
      char c = in_[pos_];
      if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
      ++pos_;
    }
  }

  void expect_literal(std::string_view lit) {
    if (in_.substr(pos_, lit.size()) != lit) fail("expected '" + std::string(lit) + "'");
    pos_ += lit.size();
  }

  Value value(int depth) {
    if (depth >= kMaxDepth) fail("nesting deeper than " + std::to_string(kMaxDepth) + " levels");
    if (at_end()) fail("unexpected end of input, expected a value");
    Value v;
    switch (peek()) {
      case 'n': expect_literal("null"); v.type = Value::Type::null; return v;
      case 't': expect_literal("true"); v.type = Value::Type::boolean; v.boolean = true; return v;
      case 'f': expect_literal("false"); v.type = Value::Type::boolean; v.boolean = false; return v;
      case '"': v.type = Value::Type::string; v.text = string(); return v;
      case '[': return array(depth);
      case '{': return object(depth);
      default:
        if (peek() == '-' || (peek() >= '0' && peek() <= '9')) return number();
        fail(std::string("unexpected character '") + printable(peek()) + "'");
    }
  }

  static std::string printable(char c) {
    unsigned char u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f) return std::string(1, c);
    static const char* hex = "0123456789abcdef";
    return std::string("\\x") + hex[u >> 4] + hex[u & 15];
  }

  Value array(int depth) {
    Value v;
    v.type = Value::Type::array;
    ++pos_;  // '['
    skip_ws();
    if (peek() == ']') {
      ++pos_;
      return v;
    }
    for (;;) {
      skip_ws();
      v.items.push_back(value(depth + 1));
      skip_ws();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() == ']') {
        ++pos_;
        return v;
      }
      fail("expected ',' or ']' in an array");
    }
  }

  Value object(int depth) {
    Value v;
    v.type = Value::Type::object;
    ++pos_;  // '{'
    skip_ws();
    if (peek() == '}') {
      ++pos_;
      return v;
    }
    for (;;) {
      skip_ws();
      if (peek() != '"') fail("expected a string key in an object");
      const size_t key_at = pos_;
      std::string key = string();
      for (const auto& k : v.keys)
        if (k == key) {
          pos_ = key_at;
          fail("duplicate key " + quote(key));
        }
      skip_ws();
      if (peek() != ':') fail("expected ':' after an object key");
      ++pos_;
      skip_ws();
      Value member = value(depth + 1);
      v.keys.push_back(std::move(key));
      v.items.push_back(std::move(member));
      skip_ws();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() == '}') {
        ++pos_;
        return v;
      }
      fail("expected ',' or '}' in an object");
    }
  }

  static bool digit(char c) { return c >= '0' && c <= '9'; }

  Value number() {
    const size_t start = pos_;
    bool negative = false, integral = true;
    if (peek() == '-') {
      negative = true;
      ++pos_;
    }
    if (!digit(peek())) fail("expected a digit");
    if (peek() == '0') {
      ++pos_;
      if (digit(peek())) fail("leading zeros are not allowed");
    } else {
      while (digit(peek())) ++pos_;
    }
    if (peek() == '.') {
      integral = false;
      ++pos_;
      if (!digit(peek())) fail("expected a digit after '.'");
      while (digit(peek())) ++pos_;
    }
    if (peek() == 'e' || peek() == 'E') {
      integral = false;
      ++pos_;
      if (peek() == '+' || peek() == '-') ++pos_;
      if (!digit(peek())) fail("expected a digit in the exponent");
      while (digit(peek())) ++pos_;
    }
    Value v;
    v.type = Value::Type::number;
    v.text = std::string(in_.substr(start, pos_ - start));
    if (integral) {
      // Accumulate negatively so INT64_MIN parses; any overflow leaves is_integer false.
      int64_t acc = 0;
      bool ok = true;
      for (size_t i = negative ? 1 : 0; i < v.text.size() && ok; ++i) {
        int64_t d = v.text[i] - '0';
        ok = !__builtin_mul_overflow(acc, int64_t{10}, &acc) && !__builtin_sub_overflow(acc, d, &acc);
      }
      if (ok && !negative) ok = !__builtin_mul_overflow(acc, int64_t{-1}, &acc);
      v.is_integer = ok;
      v.integer = ok ? acc : 0;
    }
    return v;
  }

  unsigned hex4() {
    if (in_.size() - pos_ < 4) fail("truncated \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; ++i) {
      char c = in_[pos_++];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= unsigned(c - '0');
      else if (c >= 'a' && c <= 'f') v |= unsigned(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= unsigned(c - 'A' + 10);
      else fail("bad hex digit in a \\u escape");
    }
    return v;
  }

  static void put_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }

  // Copies one well-formed UTF-8 sequence starting at pos_ (a lead byte >= 0x80) into out.
  void utf8_sequence(std::string& out) {
    const char* why = nullptr;
    const size_t n = utf8_sequence_length(in_, pos_, &why);
    if (n == 0) fail(why);
    out.append(in_.substr(pos_, n));
    pos_ += n;
  }

  std::string string() {
    ++pos_;  // opening quote
    std::string out;
    for (;;) {
      if (at_end()) fail("unterminated string");
      const char c = in_[pos_];
      const unsigned char u = static_cast<unsigned char>(c);
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (u < 0x20) fail("unescaped control character in a string");
      if (u >= 0x80) {
        utf8_sequence(out);
        continue;
      }
      if (c != '\\') {
        out.push_back(c);
        ++pos_;
        continue;
      }
      ++pos_;
      if (at_end()) fail("unterminated escape");
      const char e = in_[pos_++];
      switch (e) {
        case '"': out.push_back('"'); break;
        case '\\': out.push_back('\\'); break;
        case '/': out.push_back('/'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xDC00 && cp <= 0xDFFF) fail("unpaired low surrogate in a \\u escape");
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (in_.substr(pos_, 2) != "\\u") fail("unpaired high surrogate in a \\u escape");
            pos_ += 2;
            unsigned lo = hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) fail("a high surrogate must be followed by a low surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          put_utf8(out, cp);
          break;
        }
        default: --pos_; fail(std::string("invalid escape '\\") + printable(e) + "'");
      }
    }
  }
};

}  // namespace

const Value* Value::find(std::string_view key) const {
  if (type != Type::object) return nullptr;
  for (size_t i = 0; i < keys.size(); ++i)
    if (keys[i] == key) return &items[i];
  return nullptr;
}

Value parse(std::string_view text) { return Parser(text).document(); }

std::string quote(std::string_view s) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  out.reserve(s.size() + 2);
  out.push_back('"');
  for (char c : s) {
    const unsigned char u = static_cast<unsigned char>(c);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (u < 0x20) {
          out += "\\u00";
          out.push_back(hex[u >> 4]);
          out.push_back(hex[u & 15]);
        } else {
          out.push_back(c);
        }
    }
  }
  out.push_back('"');
  return out;
}

const char* type_name(Value::Type t) noexcept {
  switch (t) {
    case Value::Type::null: return "null";
    case Value::Type::boolean: return "bool";
    case Value::Type::number: return "number";
    case Value::Type::string: return "string";
    case Value::Type::array: return "array";
    case Value::Type::object: return "object";
  }
  return "unknown";
}

}  // namespace tw::detail::json
