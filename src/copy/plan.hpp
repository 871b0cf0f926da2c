// plan.hpp (private to the copy engines) — a copy problem reduced to its fewest dimensions.
// The host engine (copy.cpp) and the CUDA engine (src/cuda) both start here, so both see the same dimension order
// and coalescing, and a layout the host copies as one run the device copies as one run too.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tensorwire/layout.hpp"

namespace tw::detail {

/// Dimensions ordered outermost first by destination stride (destination walked forwards, so its strides are
/// non-negative), size-1 dimensions dropped, neighbours contiguous together on both sides merged. Strides in
/// bytes. src_start / dst_start: byte distance from element 0 to the first element the walk visits (non-zero when
/// a destination stride was negative). At least one dimension: a single element is {1, isz, isz}.
struct CopyDims {
  int nd = 0;
  int64_t n[kMaxRank];
  int64_t ss[kMaxRank];
  int64_t ds[kMaxRank];
  int64_t src_start = 0;
  int64_t dst_start = 0;
};

/// Reduces a copy of `src` into `dst` (equal shapes; `isz` bytes per element). Strides are taken in elements from
/// the layouts and scaled by isz.
CopyDims simplify_copy(const Layout& src, const Layout& dst, size_t isz) noexcept;

/// Whether the bytes `a` (at `a_data`, its element 0) may touch and those `b` may touch intersect: a copy between
/// them must go through a temporary, or an element could be overwritten before it is read (on a GPU, by another
/// thread of the same kernel).
inline bool spans_overlap(const void* a_data, const Layout& a, const void* b_data, const Layout& b) noexcept {
  if (a.numel() == 0 || b.numel() == 0) return false;
  const ByteSpan sa = a.byte_span(), sb = b.byte_span();
  const auto pa = reinterpret_cast<intptr_t>(a_data), pb = reinterpret_cast<intptr_t>(b_data);
  return pa + sa.begin < pb + sb.end && pb + sb.begin < pa + sa.end;
}

}  // namespace tw::detail
