// tensorwire/metadata.hpp — user metadata that travels with a tensor (e.g. a bounding-box format, a timestamp).
// A Value is JSON-like plus bytes and tuples, so Python values round-trip with their exact types. Metadata is an
// insertion-ordered map from string keys to Values. Both are plain value types: copying deep-copies.
#pragma once
#if defined(__cplusplus) && __cplusplus < 202002L && !(defined(_MSVC_LANG) && _MSVC_LANG >= 202002L)
#error "tensorwire's C++ headers need C++20 (-std=c++20); C and older C++ take the C API, tensorwire/tensorwire.h"
#endif

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tw {

/// One metadata value: none, bool, int64, float64, string, bytes, list, tuple or dict (string keys, ordered).
class Value {
 public:
  enum class Kind : uint8_t { none, boolean, integer, floating, string, bytes, list, tuple, dict };

  Value() noexcept = default;
  Value(const Value&) = default;
  Value(Value&&) noexcept = default;
  Value& operator=(const Value&) = default;
  Value& operator=(Value&&) noexcept = default;
  /// Frees a tree of any depth without recursion (a C caller can build one deeper than the stack allows).
  ~Value() { if (!items_.empty()) release_nested(); }
  Value(std::nullptr_t) noexcept {}
  Value(bool b) noexcept : kind_(Kind::boolean), int_(b) {}
  Value(int v) noexcept : kind_(Kind::integer), int_(v) {}
  Value(long v) noexcept : kind_(Kind::integer), int_(v) {}
  Value(long long v) noexcept : kind_(Kind::integer), int_(v) {}
  /// Unsigned integers (a size(), a uint64_t id) are stored as int64: one past INT64_MAX throws Error(overflow).
  Value(unsigned v) noexcept : kind_(Kind::integer), int_(v) {}
  Value(unsigned long v) : kind_(Kind::integer), int_(from_unsigned(v)) {}
  Value(unsigned long long v) : kind_(Kind::integer), int_(from_unsigned(v)) {}
  /// A char is text or a number only the caller knows: Value(std::string(1, c)) or Value(int{c}).
  Value(char) = delete;
  Value(double v) noexcept : kind_(Kind::floating), float_(v) {}
  Value(const char* s) : kind_(Kind::string), str_(s) {}
  Value(std::string s) noexcept : kind_(Kind::string), str_(std::move(s)) {}
  Value(std::string_view s) : kind_(Kind::string), str_(s) {}

  static Value bytes(std::string data) { Value v; v.kind_ = Kind::bytes; v.str_ = std::move(data); return v; }
  static Value list(std::vector<Value> items = {}) { Value v; v.kind_ = Kind::list; v.items_ = std::move(items); return v; }
  static Value tuple(std::vector<Value> items = {}) { Value v; v.kind_ = Kind::tuple; v.items_ = std::move(items); return v; }
  static Value dict() { Value v; v.kind_ = Kind::dict; return v; }
  /// A dict from parallel keys and values in one step (linear time); throws Error(invalid_argument) naming the
  /// first duplicate key, or when the sizes differ.
  static Value dict(std::vector<std::string> keys, std::vector<Value> values);

  Kind kind() const noexcept { return kind_; }
  bool is_none() const noexcept { return kind_ == Kind::none; }

  /// Typed accessors: throw Error(type_mismatch) naming both kinds when the kind differs.
  bool as_bool() const;
  int64_t as_int() const;
  double as_float() const;
  const std::string& as_string() const;  ///< kind string
  const std::string& as_bytes() const;   ///< kind bytes
  const std::vector<Value>& items() const;  ///< kind list or tuple
  std::vector<Value>& items();
  /// Dict access (kind dict): keys in insertion order, values parallel to them.
  const std::vector<std::string>& keys() const;
  const std::vector<Value>& values() const;
  /// Inserts or replaces `key` in a dict, keeping the first insertion's position (amortized constant time).
  void set(std::string key, Value value);
  /// set() of each of another dict's entries in its order, in time linear in the other's size.
  void update(const Value& other);
  /// The value under `key` in a dict, or nullptr (constant time: dicts past a few keys keep a hash index).
  const Value* find(std::string_view key) const;
  Value* find(std::string_view key);
  /// Removes `key` from a dict, keeping the others' order; returns whether it was there (linear time).
  bool erase(std::string_view key);

  friend bool operator==(const Value& a, const Value& b) noexcept;

 private:
  static int64_t from_unsigned(unsigned long long v);

  Kind kind_ = Kind::none;
  int64_t int_ = 0;
  double float_ = 0.0;
  std::string str_;
  std::vector<Value> items_;      // list / tuple elements, or dict values
  std::vector<std::string> keys_; // dict keys
  // A dict's hash index once it has kIndexFrom keys: open addressing, linear probing, a power-of-two size at least
  // twice the key count; each slot holds 1 + a position in keys_, or 0 when empty. Positions, not pointers, so a
  // copied Value's index is valid as copied.
  std::vector<size_t> slots_;
  static constexpr size_t kIndexFrom = 16;
  void expect(Kind k) const;
  void release_nested() noexcept;  // unlinks nested children onto a work list, so that none is freed by recursion
  size_t position(std::string_view key) const noexcept;  // keys_.size() when absent
  void index_last();     // adds keys_.back() to the index, building or growing it as needed
  void reindex();        // builds the index from scratch (or drops it below kIndexFrom keys)
};

/// Returns "none", "bool", "int", "float", "str", "bytes", "list", "tuple" or "dict".
const char* value_kind_name(Value::Kind k) noexcept;

/// A tensor's metadata: insertion-ordered string keys to Values.
class Metadata {
 public:
  Metadata() : root_(Value::dict()) {}
  Metadata(std::initializer_list<std::pair<std::string, Value>> init) : root_(Value::dict()) {
    for (auto& kv : init) root_.set(kv.first, kv.second);
  }

  size_t size() const noexcept { return root_.keys().size(); }
  bool empty() const noexcept { return size() == 0; }
  void set(std::string key, Value value) { root_.set(std::move(key), std::move(value)); }
  /// set() of each of `other`'s entries in its order (linear time).
  void update(const Metadata& other) { root_.update(other.root_); }
  const Value* find(std::string_view key) const { return root_.find(key); }
  Value* find(std::string_view key) { return root_.find(key); }
  /// The value under `key`; throws Error(out_of_range) naming the key when absent.
  const Value& at(std::string_view key) const;
  bool contains(std::string_view key) const { return find(key) != nullptr; }
  bool erase(std::string_view key) { return root_.erase(key); }
  void clear() { root_ = Value::dict(); }
  const std::vector<std::string>& keys() const { return root_.keys(); }
  const std::vector<Value>& values() const { return root_.values(); }
  /// The whole map as a dict Value.
  const Value& as_value() const noexcept { return root_; }
  /// Metadata holding a dict Value's entries; throws Error(type_mismatch) for any other kind.
  static Metadata from_value(Value dict);

  friend bool operator==(const Metadata& a, const Metadata& b) noexcept { return a.root_ == b.root_; }

 private:
  Value root_;
};

/// Encodes metadata to a self-describing, versioned binary form (used by pickling and inter-process transports).
std::string encode_metadata(const Metadata& m);
/// Decodes what encode_metadata wrote. Hostile input is safe: throws Error(invalid_argument) on any malformation,
/// and nesting deeper than 64 levels is refused.
Metadata decode_metadata(std::string_view bytes);

}  // namespace tw
