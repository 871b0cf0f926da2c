// tensorwire/copy.hpp — the strided copy engine.
// copy(src, dst) moves the elements of any layout into any other layout of the same shape and dtype:
// dimensions are ordered by the destination's strides and coalesced where both sides are contiguous together,
// then the best kernel runs — one memcpy, runs of memcpy, a cache-blocked transpose with in-register 8x8 (4-byte)
// and 4x4 (8-byte) AVX2 transposes, or a gather loop. Copies of more than a few MiB are split across a thread pool
// (`set_num_threads`). Overlapping source and destination are handled through a temporary.
#pragma once
#if defined(__cplusplus) && __cplusplus < 202002L && !(defined(_MSVC_LANG) && _MSVC_LANG >= 202002L)
#error "tensorwire's C++ headers need C++20 (-std=c++20); C and older C++ take the C API, tensorwire/tensorwire.h"
#endif

#include "tensorwire/tensor.hpp"

namespace tw {

struct CopyOptions {
  /// Reverse the bytes of every element (or of each half of a complex element): imports of non-native byte order.
  bool byteswap = false;
};

/// Copies every element of `src` into `dst`. Both must be host-accessible, have equal shape and dtype; `dst`
/// must be writable and must not overlap itself (no stride-0 or overlapping destination).
/// Thread-safe for disjoint destinations. Throws Error naming the mismatch.
void copy(const Tensor& src, const Tensor& dst, CopyOptions options = {});

/// Most threads set_num_threads takes.
inline constexpr int kMaxThreads = 1024;
/// Threads used by large copies (the calling thread included). n <= 0 resets to the number of CPUs; more than
/// kMaxThreads throws Error(invalid_argument). Fewer threads run when the system refuses to start more.
void set_num_threads(int n);
int get_num_threads() noexcept;

}  // namespace tw
