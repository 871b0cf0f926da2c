#include "tensorwire/layout.hpp"

#include <algorithm>
#include <cstdlib>
#include <numeric>

#include "checked.hpp"
#include "tensorwire/error.hpp"

namespace tw {

std::string Dims::str() const {
  std::string s = "(";
  for (size_t i = 0; i < n_; ++i) s += (i ? ", " : "") + std::to_string((*this)[i]);
  if (n_ == 1) s += ",";
  return s + ")";
}

int64_t Layout::numel() const noexcept {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

unsigned Layout::storage_bits() const noexcept {
  return is_packed_subbyte() ? dtype.total_bits() : unsigned(dtype.itemsize() * 8);
}

int64_t Layout::nbytes() const noexcept {
  int64_t n = numel();
  if (is_packed_subbyte()) return (n * dtype.total_bits() + 7) / 8;
  return n * static_cast<int64_t>(dtype.itemsize());
}

bool Layout::is_contiguous(MemoryOrder order) const noexcept {
  if (order == MemoryOrder::Any) return is_dense();
  if (numel() == 0) return true;
  int64_t expected = 1;
  const size_t n = shape.size();
  for (size_t k = 0; k < n; ++k) {
    size_t i = order == MemoryOrder::C ? n - 1 - k : k;
    if (shape[i] == 1) continue;
    if (strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

bool Layout::is_dense() const noexcept {
  if (numel() == 0) return true;
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) for sizes > 1
  for (size_t i = 0; i < shape.size(); ++i)
    if (shape[i] != 1) dims.emplace_back(strides[i], shape[i]);
  std::sort(dims.begin(), dims.end());
  int64_t expected = 1;
  for (auto [st, sz] : dims) {
    if (st != expected) return false;
    expected *= sz;
  }
  return true;
}

bool Layout::has_broadcast() const noexcept {
  for (size_t i = 0; i < shape.size(); ++i)
    if (shape[i] > 1 && strides[i] == 0) return true;
  return false;
}

bool Layout::may_overlap() const noexcept {
  if (numel() <= 1) return false;
  std::vector<std::pair<int64_t, int64_t>> dims;  // (|stride|, size) for sizes > 1
  for (size_t i = 0; i < shape.size(); ++i)
    if (shape[i] > 1) dims.emplace_back(std::llabs(strides[i]), shape[i]);
  std::sort(dims.begin(), dims.end());
  __int128 reach = 0;  // furthest element offset reachable by the smaller dims
  for (auto [st, sz] : dims) {
    if (st == 0 || st <= reach) return true;
    reach += static_cast<__int128>(st) * (sz - 1);
  }
  return false;
}

ByteSpan Layout::byte_span() const noexcept {
  if (numel() == 0) return {0, 0};
  int64_t lo = 0, hi = 0;  // element offsets
  for (size_t i = 0; i < shape.size(); ++i) {
    int64_t ext = (shape[i] - 1) * strides[i];
    (ext < 0 ? lo : hi) += ext;
  }
  if (is_packed_subbyte()) {
    const int64_t bits = dtype.total_bits();
    // lo * bits is a multiple of 8 only when aligned; floor toward -inf, ceil the end.
    // validate() proved lo * bits and (hi + 1) * bits representable; round without adding (hi_bits + 7 may not be).
    const int64_t lo_bits = lo * bits, hi_bits = (hi + 1) * bits;
    const int64_t b = lo_bits / 8 - (lo_bits % 8 < 0 ? 1 : 0);
    return {b, hi_bits / 8 + (hi_bits % 8 > 0 ? 1 : 0)};
  }
  const int64_t isz = static_cast<int64_t>(dtype.itemsize());
  return {lo * isz, (hi + 1) * isz};
}

void Layout::validate() const {
  using detail::add;
  using detail::mul;
  DType::from_dlpack(dtype.to_dlpack());
  if (shape.size() > kMaxRank)
    throw Error(ErrorCode::invalid_argument,
                "rank " + std::to_string(shape.size()) + " exceeds the maximum of " + std::to_string(kMaxRank));
  if (strides.size() != shape.size())
    throw Error(ErrorCode::invalid_argument, "strides " + strides.str() + " have " + std::to_string(strides.size()) +
                                                 " entries but shape " + shape.str() + " has " +
                                                 std::to_string(shape.size()));
  if (byte_offset < 0)
    throw Error(ErrorCode::invalid_argument, "byte_offset " + std::to_string(byte_offset) + " is negative");
  if (subbyte_padded && !dtype.is_subbyte())
    throw Error(ErrorCode::invalid_argument, "the sub-byte padded flag is set on " + dtype.name() +
                                                 ", which is not a sub-byte type");
  int64_t n = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0)
      throw Error(ErrorCode::invalid_argument,
                  "shape " + shape.str() + " has a negative size in dimension " + std::to_string(i));
    n = mul(n, shape[i], "the element count");
  }
  // The dense size (nbytes(), and what a copy allocates) must be expressible too, even when broadcasting makes the
  // span tiny.
  add(mul(n, int64_t(storage_bits()), "the element count times the element size"), 7,
      "the element count times the element size");
  if (n == 0) return;
  int64_t lo = 0, hi = 0;
  for (size_t i = 0; i < shape.size(); ++i) {
    int64_t ext = mul(shape[i] - 1, strides[i], "a stride times its dimension");
    if (ext < 0)
      lo = add(lo, ext, "the lowest element offset");
    else
      hi = add(hi, ext, "the highest element offset");
  }
  const int64_t unit = is_packed_subbyte() ? int64_t(dtype.total_bits()) : int64_t(dtype.itemsize()) * 8;
  int64_t lo_bits = mul(lo, unit, "the byte span"), hi_bits = mul(add(hi, 1, "the byte span"), unit, "the byte span");
  add(lo_bits / 8, byte_offset, "byte_offset plus the byte span");
  add(hi_bits / 8 + 1, byte_offset, "byte_offset plus the byte span");
}

Strides Layout::contiguous_strides(const Shape& shape, MemoryOrder order) {
  Strides s;
  s.resize(shape.size(), 1);
  int64_t acc = 1;
  const size_t n = shape.size();
  for (size_t k = 0; k < n; ++k) {
    size_t i = order == MemoryOrder::F ? k : n - 1 - k;
    s[i] = acc;
    acc = detail::mul(acc, std::max<int64_t>(shape[i], 1), "contiguous strides");
  }
  return s;
}

bool Layout::has_negative_stride() const noexcept {
  for (size_t i = 0; i < ndim(); ++i)
    if (shape[i] > 1 && strides[i] < 0) return true;
  return false;
}

}  // namespace tw
