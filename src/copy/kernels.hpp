// kernels.hpp (private) — inner kernels of the copy engine. All strides in bytes.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tw::detail {

/// dst[i] = src[i * src_stride] for i < n, elements of `isz` bytes; dst stride is `dst_stride`.
void gather_1d(char* dst, int64_t dst_stride, const char* src, int64_t src_stride, int64_t n, size_t isz);

/// Transpose-like 2-D copy: element (r, c) goes from src + r*isz + c*src_col to dst + r*dst_row + c*isz.
/// (The source is contiguous along r, the destination along c.) Cache-blocked; AVX2 in-register 8x8 / 4x4
/// tiles for 4- and 8-byte elements when the CPU has AVX2.
void transpose_2d(char* dst, int64_t dst_row, const char* src, int64_t src_col, int64_t rows, int64_t cols, size_t isz);

/// Reverses the bytes of each `unit`-byte piece of n elements of `isz` bytes at dst + i*stride.
void byteswap_1d(char* dst, int64_t stride, int64_t n, size_t isz, size_t unit);

bool cpu_has_avx2() noexcept;

}  // namespace tw::detail
