// tensorwire/layout.hpp — shape, strides (in elements) and byte offset, and the predicates over them.
// Every arithmetic step that could overflow is checked; validate() is the one place a layout is proven sound.
#pragma once

#include <concepts>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "tensorwire/dtype.hpp"

namespace tw {

/// A list of dimension sizes or strides. Accepts braced lists of any integer type (`{2, 3}`, `{n}` with a
/// size_t n) without narrowing errors; values are validated where they are used, not here.
class Dims {
 public:
  Dims() = default;
  template <std::integral... Ts>
  Dims(Ts... values) : v_{static_cast<int64_t>(values)...} {}  // NOLINT(google-explicit-constructor)
  Dims(std::vector<int64_t> v) noexcept : v_(std::move(v)) {}  // NOLINT(google-explicit-constructor)
  Dims(std::span<const int64_t> s) : v_(s.begin(), s.end()) {}  // NOLINT(google-explicit-constructor)
  Dims(const int64_t* p, size_t n) : v_(p, p + n) {}

  size_t size() const noexcept { return v_.size(); }
  bool empty() const noexcept { return v_.empty(); }
  int64_t operator[](size_t i) const noexcept { return v_[i]; }
  int64_t& operator[](size_t i) noexcept { return v_[i]; }
  const int64_t* data() const noexcept { return v_.data(); }
  int64_t* data() noexcept { return v_.data(); }
  auto begin() const noexcept { return v_.begin(); }
  auto end() const noexcept { return v_.end(); }
  void push_back(int64_t x) { v_.push_back(x); }
  void resize(size_t n, int64_t fill = 0) { v_.resize(n, fill); }
  const std::vector<int64_t>& vec() const noexcept { return v_; }
  /// "(2, 3)" — for messages.
  std::string str() const;

  friend bool operator==(const Dims& a, const Dims& b) noexcept { return a.v_ == b.v_; }

 private:
  std::vector<int64_t> v_;
};

using Shape = Dims;
using Strides = Dims;

/// Memory orders for contiguity queries and allocation.
enum class MemoryOrder { C, F, Any };

/// A half-open byte range relative to the tensor's first element (may start below zero with negative strides).
struct ByteSpan {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const noexcept { return end - begin; }
};

/// How elements are laid out relative to a buffer. Strides are in elements; byte_offset is the distance in bytes
/// from the buffer base to element (0, ..., 0).
struct Layout {
  DType dtype;
  Shape shape;
  Strides strides;
  int64_t byte_offset = 0;
  /// Sub-byte types only: each element occupies a whole byte instead of being packed (DLPack's
  /// IS_SUBBYTE_TYPE_PADDED).
  bool subbyte_padded = false;

  size_t ndim() const noexcept { return shape.size(); }
  /// Product of the shape (validated layouts never overflow here).
  int64_t numel() const noexcept;
  /// Bits one element occupies in memory: 8 * itemsize, or dtype bits for packed sub-byte types.
  unsigned storage_bits() const noexcept;
  /// True for sub-byte dtypes stored packed (several elements per byte).
  bool is_packed_subbyte() const noexcept { return dtype.is_subbyte() && !subbyte_padded; }
  /// Bytes one element occupies when not packed (1 for padded sub-byte types).
  size_t element_bytes() const noexcept { return is_packed_subbyte() ? 0 : dtype.itemsize(); }
  /// Bytes the elements occupy when stored densely: numel * element_bytes, or ceil(numel * bits / 8) packed.
  int64_t nbytes() const noexcept;

  bool is_contiguous(MemoryOrder order = MemoryOrder::C) const noexcept;
  /// No gaps and no overlap, in any dimension order (a permutation of a contiguous tensor).
  bool is_dense() const noexcept;
  /// Some dimension of size > 1 has stride 0.
  bool has_broadcast() const noexcept;
  /// Two distinct indices could address the same element (sufficient test: false means no overlap).
  bool may_overlap() const noexcept;
  /// Bytes spanned by all elements relative to element 0; {0, 0} for zero-size tensors.
  ByteSpan byte_span() const noexcept;

  /// Throws Error naming the problem: negative sizes, rank mismatch, overflow of numel / offsets, rank > 64,
  /// packed sub-byte tensors whose first element or strides would not be expressible.
  void validate() const;

  /// Strides of a dense tensor of `shape` in `order` (C or F).
  static Strides contiguous_strides(const Shape& shape, MemoryOrder order = MemoryOrder::C);
};

/// Largest rank accepted anywhere (matches NumPy's NPY_MAXDIMS).
inline constexpr size_t kMaxRank = 64;

}  // namespace tw
