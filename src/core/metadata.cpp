#include "tensorwire/metadata.hpp"

#include <algorithm>
#include <cstring>
#include <functional>
#include <string_view>

#include "core/utf8.hpp"
#include "tensorwire/error.hpp"

namespace tw {

int64_t Value::from_unsigned(unsigned long long v) {
  if (v > static_cast<unsigned long long>(INT64_MAX))
    throw Error(ErrorCode::overflow, "metadata integers are int64: " + std::to_string(v) + " does not fit");
  return static_cast<int64_t>(v);
}

const char* value_kind_name(Value::Kind k) noexcept {
  switch (k) {
    case Value::Kind::none: return "none";
    case Value::Kind::boolean: return "bool";
    case Value::Kind::integer: return "int";
    case Value::Kind::floating: return "float";
    case Value::Kind::string: return "str";
    case Value::Kind::bytes: return "bytes";
    case Value::Kind::list: return "list";
    case Value::Kind::tuple: return "tuple";
    case Value::Kind::dict: return "dict";
  }
  return "unknown";
}

void Value::expect(Kind k) const {
  if (kind_ != k)
    throw Error(ErrorCode::type_mismatch,
                std::string("metadata value is a ") + value_kind_name(kind_) + ", not a " + value_kind_name(k));
}

bool Value::as_bool() const { expect(Kind::boolean); return int_ != 0; }
int64_t Value::as_int() const { expect(Kind::integer); return int_; }
double Value::as_float() const { expect(Kind::floating); return float_; }
const std::string& Value::as_string() const { expect(Kind::string); return str_; }
const std::string& Value::as_bytes() const { expect(Kind::bytes); return str_; }

void Value::release_nested() noexcept {
  const auto nested = [](const Value& x) { return !x.items_.empty(); };
  if (std::none_of(items_.begin(), items_.end(), nested)) return;  // leaves only: the vector frees them
  try {
    std::vector<Value> pending;
    for (Value& x : items_)
      if (nested(x)) pending.push_back(std::move(x));  // (moving leaves x without items)
    while (!pending.empty()) {
      Value x = std::move(pending.back());
      pending.pop_back();
      for (Value& y : x.items_)
        if (nested(y)) pending.push_back(std::move(y));
    }  // each x is freed with leaves only
  } catch (...) {
    // Out of memory for the work list: what is still linked is freed by recursion, as it would have been.
  }
}

const std::vector<Value>& Value::items() const {
  if (kind_ != Kind::list && kind_ != Kind::tuple) expect(Kind::list);
  return items_;
}
std::vector<Value>& Value::items() {
  if (kind_ != Kind::list && kind_ != Kind::tuple) expect(Kind::list);
  return items_;
}
const std::vector<std::string>& Value::keys() const { expect(Kind::dict); return keys_; }
const std::vector<Value>& Value::values() const { expect(Kind::dict); return items_; }

size_t Value::position(std::string_view key) const noexcept {
  if (slots_.empty()) {
    for (size_t i = 0; i < keys_.size(); ++i)
      if (keys_[i] == key) return i;
    return keys_.size();
  }
  const size_t mask = slots_.size() - 1;
  for (size_t s = std::hash<std::string_view>{}(key) & mask;; s = (s + 1) & mask) {
    if (slots_[s] == 0) return keys_.size();
    if (keys_[slots_[s] - 1] == key) return slots_[s] - 1;
  }
}

void Value::reindex() {
  slots_.clear();
  if (keys_.size() < kIndexFrom) return;
  size_t size = 2 * kIndexFrom;
  while (size < 2 * keys_.size()) size *= 2;
  slots_.assign(size, 0);
  const size_t mask = size - 1;
  for (size_t i = 0; i < keys_.size(); ++i) {
    size_t s = std::hash<std::string_view>{}(keys_[i]) & mask;
    while (slots_[s] != 0) s = (s + 1) & mask;
    slots_[s] = i + 1;
  }
}

void Value::index_last() {
  if (keys_.size() < kIndexFrom) return;
  if (slots_.empty() || 2 * keys_.size() > slots_.size()) {
    reindex();  // doubles: amortized constant per key
    return;
  }
  const size_t mask = slots_.size() - 1;
  size_t s = std::hash<std::string_view>{}(keys_.back()) & mask;
  while (slots_[s] != 0) s = (s + 1) & mask;
  slots_[s] = keys_.size();
}

void Value::set(std::string key, Value value) {
  expect(Kind::dict);
  if (size_t i = position(key); i < keys_.size()) {
    items_[i] = std::move(value);
    return;
  }
  keys_.push_back(std::move(key));
  items_.push_back(std::move(value));
  index_last();
}

void Value::update(const Value& other) {
  expect(Kind::dict);
  other.expect(Kind::dict);
  if (keys_.empty()) {
    *this = other;
    return;
  }
  if (const size_t need = keys_.size() + other.keys_.size(); need > keys_.capacity()) {
    // Geometric, as push_back grows: an exact reserve per call made repeated small updates quadratic.
    keys_.reserve(std::max(need, 2 * keys_.capacity()));
    items_.reserve(keys_.capacity());
  }
  for (size_t j = 0; j < other.keys_.size(); ++j) set(other.keys_[j], other.items_[j]);
}

Value Value::dict(std::vector<std::string> keys, std::vector<Value> values) {
  if (keys.size() != values.size())
    throw Error(ErrorCode::invalid_argument, "Value::dict: " + std::to_string(keys.size()) + " keys but " +
                                                 std::to_string(values.size()) + " values");
  Value v;
  v.kind_ = Kind::dict;
  v.keys_.reserve(keys.size());
  for (std::string& k : keys) {
    if (v.position(k) < v.keys_.size()) throw Error(ErrorCode::invalid_argument, "duplicate key '" + k + "'");
    v.keys_.push_back(std::move(k));
    v.index_last();
  }
  v.items_ = std::move(values);
  return v;
}

Metadata Metadata::from_value(Value dict) {
  if (dict.kind() != Value::Kind::dict)
    throw Error(ErrorCode::type_mismatch, std::string("metadata must be a dict, not ") + value_kind_name(dict.kind()));
  Metadata m;
  m.root_ = std::move(dict);
  return m;
}

const Value* Value::find(std::string_view key) const {
  expect(Kind::dict);
  const size_t i = position(key);
  return i < keys_.size() ? &items_[i] : nullptr;
}
Value* Value::find(std::string_view key) { return const_cast<Value*>(std::as_const(*this).find(key)); }

bool Value::erase(std::string_view key) {
  expect(Kind::dict);
  const size_t i = position(key);
  if (i == keys_.size()) return false;
  keys_.erase(keys_.begin() + static_cast<std::ptrdiff_t>(i));
  items_.erase(items_.begin() + static_cast<std::ptrdiff_t>(i));
  reindex();  // positions after i moved
  return true;
}

bool operator==(const Value& a, const Value& b) noexcept {
  if (a.kind_ != b.kind_) return false;
  switch (a.kind_) {
    case Value::Kind::none: return true;
    case Value::Kind::boolean:
    case Value::Kind::integer: return a.int_ == b.int_;
    case Value::Kind::floating: return std::memcmp(&a.float_, &b.float_, sizeof(double)) == 0 || a.float_ == b.float_;
    case Value::Kind::string:
    case Value::Kind::bytes: return a.str_ == b.str_;
    case Value::Kind::list:
    case Value::Kind::tuple: return a.items_ == b.items_;
    case Value::Kind::dict: return a.keys_ == b.keys_ && a.items_ == b.items_;
  }
  return false;
}

const Value& Metadata::at(std::string_view key) const {
  if (const Value* v = find(key)) return *v;
  throw Error(ErrorCode::out_of_range, "metadata has no key '" + std::string(key) + "'");
}

// ---- binary encoding -------------------------------------------------------------------------------------------
// Layout: "TWMD" magic, u8 version (1), then one value (the root dict). A value is a u8 tag followed by:
//   none/true/false: nothing; int: 8 bytes LE; float: 8 bytes IEEE LE; str/bytes: u32 length + bytes;
//   list/tuple: u32 count + values; dict: u32 count + (u32 key length + key bytes + value) pairs.
namespace {

enum Tag : uint8_t { kNone = 0, kFalse = 1, kTrue = 2, kInt = 3, kFloat = 4, kStr = 5, kBytes = 6, kList = 7, kTuple = 8, kDict = 9 };
constexpr char kMagic[4] = {'T', 'W', 'M', 'D'};
constexpr uint8_t kVersion = 1;
constexpr int kMaxDepth = 64;

void put_u32(std::string& out, size_t n) {
  if (n > 0xFFFFFFFFu) throw Error(ErrorCode::overflow, "metadata item longer than 4 GiB cannot be encoded");
  uint32_t v = static_cast<uint32_t>(n);
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}
void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

void encode(std::string& out, const Value& v, int depth) {
  // The decoder refuses deeper nesting (a hostile peer's stack): what it would refuse is never encoded, so a
  // publisher cannot send its subscribers a message that ends their streams.
  if (depth > kMaxDepth)
    throw Error(ErrorCode::invalid_argument, "metadata nested deeper than " + std::to_string(kMaxDepth) +
                                                 " levels cannot be encoded (receivers refuse it)");
  switch (v.kind()) {
    case Value::Kind::none: out.push_back(kNone); break;
    case Value::Kind::boolean: out.push_back(v.as_bool() ? kTrue : kFalse); break;
    case Value::Kind::integer: out.push_back(kInt); put_u64(out, static_cast<uint64_t>(v.as_int())); break;
    case Value::Kind::floating: {
      out.push_back(kFloat);
      double d = v.as_float();
      uint64_t bits;
      std::memcpy(&bits, &d, 8);
      put_u64(out, bits);
      break;
    }
    case Value::Kind::string:
      // (the decoder refuses text that is not UTF-8: the sender hears it, not every receiver)
      if (!detail::valid_utf8(v.as_string()))
        throw Error(ErrorCode::invalid_argument, "metadata str values must be UTF-8 text (binary data goes in a "
                                                 "bytes value); this one is not, so it cannot be encoded");
      out.push_back(kStr);
      put_u32(out, v.as_string().size());
      out += v.as_string();
      break;
    case Value::Kind::bytes: out.push_back(kBytes); put_u32(out, v.as_bytes().size()); out += v.as_bytes(); break;
    case Value::Kind::list:
    case Value::Kind::tuple:
      out.push_back(v.kind() == Value::Kind::list ? kList : kTuple);
      put_u32(out, v.items().size());
      for (const auto& x : v.items()) encode(out, x, depth + 1);
      break;
    case Value::Kind::dict:
      out.push_back(kDict);
      put_u32(out, v.keys().size());
      for (size_t i = 0; i < v.keys().size(); ++i) {
        if (!detail::valid_utf8(v.keys()[i]))
          throw Error(ErrorCode::invalid_argument, "metadata keys must be UTF-8 text; one is not, so it cannot be "
                                                   "encoded");
        put_u32(out, v.keys()[i].size());
        out += v.keys()[i];
        encode(out, v.values()[i], depth + 1);
      }
      break;
  }
}

struct Reader {
  std::string_view in;
  size_t pos = 0;

  [[noreturn]] void fail(const std::string& why) const {
    throw Error(ErrorCode::invalid_argument, "malformed metadata encoding at byte " + std::to_string(pos) + ": " + why);
  }
  uint8_t u8() {
    if (pos >= in.size()) fail("truncated");
    return static_cast<uint8_t>(in[pos++]);
  }
  uint64_t le(int n) {
    if (in.size() - pos < size_t(n)) fail("truncated");
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= uint64_t(static_cast<uint8_t>(in[pos + size_t(i)])) << (8 * i);
    pos += size_t(n);
    return v;
  }
  std::string str() {
    uint64_t n = le(4);
    if (in.size() - pos < n) fail("string length " + std::to_string(n) + " runs past the end");
    std::string s(in.substr(pos, n));
    pos += n;
    return s;
  }
  // A key or a str value: text, so UTF-8 (bytes values are str() alone). Checked here, once, so that no reader of
  // a received or unpickled tensor's metadata meets undecodable text later (Python raised a bare conversion error).
  std::string text(const char* what) {
    const size_t start = pos + 4;
    std::string s = str();
    const char* why = nullptr;
    for (size_t i = 0; i < s.size();) {
      const size_t n = detail::utf8_sequence_length(s, i, &why);
      if (n == 0) {
        pos = start + i;
        fail(std::string(what) + " is not valid UTF-8 (" + why + ")");
      }
      i += n;
    }
    return s;
  }
  uint64_t count() {
    uint64_t n = le(4);
    if (n > in.size() - pos) fail("count " + std::to_string(n) + " exceeds the remaining bytes");  // each item >= 1 byte
    return n;
  }
  Value value(int depth) {
    if (depth > kMaxDepth) fail("nesting deeper than " + std::to_string(kMaxDepth));
    switch (u8()) {
      case kNone: return Value();
      case kFalse: return Value(false);
      case kTrue: return Value(true);
      case kInt: return Value(static_cast<long long>(le(8)));
      case kFloat: {
        uint64_t b = le(8);
        double d;
        std::memcpy(&d, &b, 8);
        return Value(d);
      }
      case kStr: return Value(text("a str value"));
      case kBytes: return Value::bytes(str());
      case kList:
      case kTuple: {
        bool is_list = in[pos - 1] == kList;
        uint64_t n = count();
        std::vector<Value> items;
        items.reserve(std::min<uint64_t>(n, 1024));  // a hostile count must not reserve 100x the input
        for (uint64_t i = 0; i < n; ++i) items.push_back(value(depth + 1));
        return is_list ? Value::list(std::move(items)) : Value::tuple(std::move(items));
      }
      case kDict: {
        // Linear in the number of keys (the dict's index finds duplicates): 64 MiB of hostile keys must not take hours.
        uint64_t n = count();
        Value d = Value::dict();
        for (uint64_t i = 0; i < n; ++i) {
          std::string k = text("a key");
          if (d.find(k) != nullptr) fail("duplicate key '" + k + "'");
          d.set(std::move(k), value(depth + 1));
        }
        return d;
      }
      default: pos--; fail("unknown tag " + std::to_string(static_cast<uint8_t>(in[pos])));
    }
  }
};

}  // namespace

std::string encode_metadata(const Metadata& m) {
  std::string out(kMagic, 4);
  out.push_back(static_cast<char>(kVersion));
  encode(out, m.as_value(), 0);
  return out;
}

Metadata decode_metadata(std::string_view bytes) {
  Reader r{bytes};
  if (bytes.size() < 5 || std::memcmp(bytes.data(), kMagic, 4) != 0) r.fail("missing the TWMD magic");
  r.pos = 4;
  if (uint8_t v = r.u8(); v != kVersion) r.fail("unsupported encoding version " + std::to_string(v));
  if (r.pos >= bytes.size() || static_cast<uint8_t>(bytes[r.pos]) != kDict) r.fail("the root is not a dict");
  Value root = r.value(0);
  if (r.pos != bytes.size()) r.fail(std::to_string(bytes.size() - r.pos) + " trailing bytes");
  return Metadata::from_value(std::move(root));
}

}  // namespace tw
