// tensorwire/layout.hpp — shape, strides (in elements) and byte offset, and the predicates over them.
// Every arithmetic step that could overflow is checked; validate() is the one place a layout is proven sound.
#pragma once
#if defined(__cplusplus) && __cplusplus < 202002L && !(defined(_MSVC_LANG) && _MSVC_LANG >= 202002L)
#error "tensorwire's C++ headers need C++20 (-std=c++20); C and older C++ take the C API, tensorwire/tensorwire.h"
#endif

#include <concepts>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tensorwire/dtype.hpp"

namespace tw {

/// A list of dimension sizes or strides. Accepts braced lists of any integer type (`{2, 3}`, `{n}` with a
/// size_t n) without narrowing errors; values are validated where they are used, not here.
class Dims {
 public:
  Dims() noexcept = default;
  template <std::integral... Ts>
  Dims(Ts... values) {  // NOLINT(google-explicit-constructor)
    reserve(sizeof...(Ts));
    (push_back(static_cast<int64_t>(values)), ...);
  }
  Dims(const std::vector<int64_t>& v) : Dims(v.data(), v.size()) {}  // NOLINT(google-explicit-constructor)
  Dims(std::span<const int64_t> s) : Dims(s.data(), s.size()) {}     // NOLINT(google-explicit-constructor)
  Dims(const int64_t* p, size_t n) {
    reserve(n);
    for (size_t i = 0; i < n; ++i) ptr()[i] = p[i];
    n_ = n;
  }
  Dims(const Dims& o) : Dims(o.data(), o.size()) {}
  Dims(Dims&& o) noexcept { *this = std::move(o); }
  Dims& operator=(const Dims& o) {
    if (this != &o) {
      n_ = 0;
      reserve(o.n_);
      for (size_t i = 0; i < o.n_; ++i) ptr()[i] = o.data()[i];
      n_ = o.n_;
    }
    return *this;
  }
  Dims& operator=(Dims&& o) noexcept {
    if (this != &o) {
      n_ = o.n_;
      cap_ = o.cap_;
      heap_ = std::move(o.heap_);
      if (!heap_)
        for (size_t i = 0; i < n_; ++i) inline_[i] = o.inline_[i];
      o.n_ = 0;
      o.cap_ = kInline;
    }
    return *this;
  }

  size_t size() const noexcept { return n_; }
  bool empty() const noexcept { return n_ == 0; }
  int64_t operator[](size_t i) const noexcept { return data()[i]; }
  int64_t& operator[](size_t i) noexcept { return ptr()[i]; }
  const int64_t* data() const noexcept { return heap_ ? heap_.get() : inline_; }
  int64_t* data() noexcept { return ptr(); }
  const int64_t* begin() const noexcept { return data(); }
  const int64_t* end() const noexcept { return data() + n_; }
  void push_back(int64_t x) {
    if (n_ == cap_) reserve(cap_ * 2);
    ptr()[n_++] = x;
  }
  void resize(size_t n, int64_t fill = 0) {
    reserve(n);
    for (size_t i = n_; i < n; ++i) ptr()[i] = fill;
    n_ = n;
  }
  std::vector<int64_t> vec() const { return std::vector<int64_t>(begin(), end()); }
  /// "(2, 3)" — for messages.
  std::string str() const;

  friend bool operator==(const Dims& a, const Dims& b) noexcept {
    if (a.n_ != b.n_) return false;
    for (size_t i = 0; i < a.n_; ++i)
      if (a[i] != b[i]) return false;
    return true;
  }

 private:
  // Ranks up to kInline live inside the object: no allocation for the shapes almost every tensor has.
  static constexpr size_t kInline = 6;
  int64_t* ptr() noexcept { return heap_ ? heap_.get() : inline_; }
  void reserve(size_t n) {
    if (n <= cap_) return;
    auto grown = std::make_unique<int64_t[]>(n);
    for (size_t i = 0; i < n_; ++i) grown[i] = data()[i];
    heap_ = std::move(grown);
    cap_ = n;
  }

  size_t n_ = 0;
  size_t cap_ = kInline;
  int64_t inline_[kInline] = {};
  std::unique_ptr<int64_t[]> heap_;
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
  /// True when some dimension of size > 1 steps backwards (a negative stride).
  bool has_negative_stride() const noexcept;
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
