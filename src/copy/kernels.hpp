// kernels.hpp (private) — inner kernels of the copy engine. All strides in bytes.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tw::detail {

/// dst[i] = src[i * src_stride] for i < n, elements of `isz` bytes; dst stride is `dst_stride`. `stream`: the
/// whole copy is too big for the cache, so contiguous destinations get non-temporal stores (memcpy runs,
/// broadcast fills, stride-2 gathers). Streaming stores are weakly ordered: after the last kernel call with
/// `stream`, and before another thread may read the destination, the calling thread must call stream_fence().
void gather_1d(char* dst, int64_t dst_stride, const char* src, int64_t src_stride, int64_t n, size_t isz,
               bool stream = false);

/// Transpose-like 2-D copy: element (r, c) goes from src + r*isz + c*src_col to dst + r*dst_row + c*isz.
/// (The source is contiguous along r, the destination along c.) Walks the destination in line-wide column bands;
/// AVX2 in-register 8x8 / 4x4 tiles for 4- and 8-byte elements when the CPU has AVX2. `stream`: the whole copy is
/// too big for the cache, so use non-temporal stores where the destination's alignment allows (then
/// stream_fence(), as for gather_1d).
void transpose_2d(char* dst, int64_t dst_row, const char* src, int64_t src_col, int64_t rows, int64_t cols, size_t isz,
                  bool stream = false);

/// Orders this thread's streaming stores before its later stores (sfence): the end of a streaming copy.
void stream_fence() noexcept;

/// Reverses the bytes of each `unit`-byte piece of n elements of `isz` bytes at dst + i*stride.
void byteswap_1d(char* dst, int64_t stride, int64_t n, size_t isz, size_t unit);

bool cpu_has_avx2() noexcept;

}  // namespace tw::detail
