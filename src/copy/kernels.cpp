#include "kernels.hpp"

#include <algorithm>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TW_X86 1
#endif

namespace tw::detail {

bool cpu_has_avx2() noexcept {
#ifdef TW_X86
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
#else
  return false;
#endif
}

namespace {

template <size_t N>
struct Bytes {
  unsigned char b[N];
};

// Typed strided loops; the constant-stride variants let the compiler vectorise the common cases
// (every-other element, broadcast, contiguous). Pointers may be misaligned for T (tensors can start at any byte),
// so every access goes through memcpy on char pointers: never a T* store or T* arithmetic.
template <class T>
void gather_t(char* dst, int64_t ds, const char* src, int64_t ss, int64_t n) {
  constexpr int64_t sz = static_cast<int64_t>(sizeof(T));
  if (ds == sz) {
    if (ss == 0) {
      T v;
      std::memcpy(&v, src, sizeof(T));
      for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * sz, &v, sizeof(T));
      return;
    }
    if (ss == 2 * sz) {
      for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * sz, src + 2 * i * sz, sizeof(T));
      return;
    }
    for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * sz, src + i * ss, sizeof(T));
    return;
  }
  for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * ds, src + i * ss, sizeof(T));
}

#ifdef TW_X86
__attribute__((target("avx2"))) void gather_f32_stride2_avx2(char* dst, const char* src, int64_t n) {
  int64_t i = 0;
  // The second load reaches the odd element after the block's last even one: only safe while element i + 8 exists.
  for (; i + 8 < n; i += 8) {
    __m256 a = _mm256_loadu_ps(reinterpret_cast<const float*>(src + 8 * i));
    __m256 b = _mm256_loadu_ps(reinterpret_cast<const float*>(src + 8 * i + 32));
    __m256 ev = _mm256_shuffle_ps(a, b, 0x88);  // a0 a2 b0 b2 | a4 a6 b4 b6
    ev = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(ev), 0xD8));
    _mm256_storeu_ps(reinterpret_cast<float*>(dst + 4 * i), ev);
  }
  for (; i < n; ++i) std::memcpy(dst + 4 * i, src + 8 * i, 4);
}

__attribute__((target("avx2"))) void gather_f64_stride2_avx2(char* dst, const char* src, int64_t n) {
  int64_t i = 0;
  // As above: the second load ends past the last element read unless element i + 4 exists.
  for (; i + 4 < n; i += 4) {
    __m256d a = _mm256_loadu_pd(reinterpret_cast<const double*>(src + 16 * i));
    __m256d b = _mm256_loadu_pd(reinterpret_cast<const double*>(src + 16 * i + 32));
    __m256d ev = _mm256_unpacklo_pd(a, b);  // a0 b0 | a2 b2
    ev = _mm256_permute4x64_pd(ev, 0xD8);
    _mm256_storeu_pd(reinterpret_cast<double*>(dst + 8 * i), ev);
  }
  for (; i < n; ++i) std::memcpy(dst + 8 * i, src + 16 * i, 8);
}
#endif

}  // namespace

void gather_1d(char* dst, int64_t ds, const char* src, int64_t ss, int64_t n, size_t isz) {
  const int64_t is = static_cast<int64_t>(isz);
  if (ds == is && ss == is) {
    std::memcpy(dst, src, static_cast<size_t>(n) * isz);
    return;
  }
#ifdef TW_X86
  if (ds == is && ss == 2 * is && cpu_has_avx2()) {
    if (isz == 4) return gather_f32_stride2_avx2(dst, src, n);
    if (isz == 8) return gather_f64_stride2_avx2(dst, src, n);
  }
#endif
  switch (isz) {
    case 1: return gather_t<uint8_t>(dst, ds, src, ss, n);
    case 2: return gather_t<uint16_t>(dst, ds, src, ss, n);
    case 4: return gather_t<uint32_t>(dst, ds, src, ss, n);
    case 8: return gather_t<uint64_t>(dst, ds, src, ss, n);
    case 16: return gather_t<Bytes<16>>(dst, ds, src, ss, n);
    default:
      for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * ds, src + i * ss, isz);
  }
}

namespace {

// Portable blocked transpose for any element size: tiles of B x B keep both sides' lines in L1.
template <size_t N>
void transpose_scalar(char* dst, int64_t dr, const char* src, int64_t sc, int64_t rows, int64_t cols) {
  constexpr int64_t B = N >= 8 ? 16 : 32;
  const int64_t is = static_cast<int64_t>(N);
  for (int64_t r0 = 0; r0 < rows; r0 += B) {
    const int64_t r1 = std::min(rows, r0 + B);
    for (int64_t c0 = 0; c0 < cols; c0 += B) {
      const int64_t c1 = std::min(cols, c0 + B);
      for (int64_t r = r0; r < r1; ++r) {
        char* d = dst + r * dr;
        const char* s = src + r * is;
        for (int64_t c = c0; c < c1; ++c) std::memcpy(d + c * is, s + c * sc, N);
      }
    }
  }
}

void transpose_generic(char* dst, int64_t dr, const char* src, int64_t sc, int64_t rows, int64_t cols, size_t isz) {
  const int64_t is = static_cast<int64_t>(isz);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) std::memcpy(dst + r * dr + c * is, src + r * is + c * sc, isz);
}

#ifdef TW_X86
// 8x8 tile of 4-byte elements: load 8 source columns (each contiguous along r), transpose in registers,
// store 8 destination rows (each contiguous along c).
__attribute__((target("avx2"))) inline void tile8x8_f32(char* dst, int64_t dr, const char* src, int64_t sc) {
  __m256 c0 = _mm256_loadu_ps(reinterpret_cast<const float*>(src + 0 * sc));
  __m256 c1 = _mm256_loadu_ps(reinterpret_cast<const float*>(src + 1 * sc));
  __m256 c2 = _mm256_loadu_ps(reinterpret_cast<const float*>(src + 2 * sc));
  __m256 c3 = _mm256_loadu_ps(reinterpret_cast<const float*>(src + 3 * sc));
  __m256 c4 = _mm256_loadu_ps(reinterpret_cast<const float*>(src + 4 * sc));
  __m256 c5 = _mm256_loadu_ps(reinterpret_cast<const float*>(src + 5 * sc));
  __m256 c6 = _mm256_loadu_ps(reinterpret_cast<const float*>(src + 6 * sc));
  __m256 c7 = _mm256_loadu_ps(reinterpret_cast<const float*>(src + 7 * sc));
  __m256 t0 = _mm256_unpacklo_ps(c0, c1), t1 = _mm256_unpackhi_ps(c0, c1);
  __m256 t2 = _mm256_unpacklo_ps(c2, c3), t3 = _mm256_unpackhi_ps(c2, c3);
  __m256 t4 = _mm256_unpacklo_ps(c4, c5), t5 = _mm256_unpackhi_ps(c4, c5);
  __m256 t6 = _mm256_unpacklo_ps(c6, c7), t7 = _mm256_unpackhi_ps(c6, c7);
  __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  _mm256_storeu_ps(reinterpret_cast<float*>(dst + 0 * dr), _mm256_permute2f128_ps(u0, u4, 0x20));
  _mm256_storeu_ps(reinterpret_cast<float*>(dst + 1 * dr), _mm256_permute2f128_ps(u1, u5, 0x20));
  _mm256_storeu_ps(reinterpret_cast<float*>(dst + 2 * dr), _mm256_permute2f128_ps(u2, u6, 0x20));
  _mm256_storeu_ps(reinterpret_cast<float*>(dst + 3 * dr), _mm256_permute2f128_ps(u3, u7, 0x20));
  _mm256_storeu_ps(reinterpret_cast<float*>(dst + 4 * dr), _mm256_permute2f128_ps(u0, u4, 0x31));
  _mm256_storeu_ps(reinterpret_cast<float*>(dst + 5 * dr), _mm256_permute2f128_ps(u1, u5, 0x31));
  _mm256_storeu_ps(reinterpret_cast<float*>(dst + 6 * dr), _mm256_permute2f128_ps(u2, u6, 0x31));
  _mm256_storeu_ps(reinterpret_cast<float*>(dst + 7 * dr), _mm256_permute2f128_ps(u3, u7, 0x31));
}

__attribute__((target("avx2"))) inline void tile4x4_f64(char* dst, int64_t dr, const char* src, int64_t sc) {
  __m256d c0 = _mm256_loadu_pd(reinterpret_cast<const double*>(src + 0 * sc));
  __m256d c1 = _mm256_loadu_pd(reinterpret_cast<const double*>(src + 1 * sc));
  __m256d c2 = _mm256_loadu_pd(reinterpret_cast<const double*>(src + 2 * sc));
  __m256d c3 = _mm256_loadu_pd(reinterpret_cast<const double*>(src + 3 * sc));
  __m256d t0 = _mm256_unpacklo_pd(c0, c1), t1 = _mm256_unpackhi_pd(c0, c1);
  __m256d t2 = _mm256_unpacklo_pd(c2, c3), t3 = _mm256_unpackhi_pd(c2, c3);
  _mm256_storeu_pd(reinterpret_cast<double*>(dst + 0 * dr), _mm256_permute2f128_pd(t0, t2, 0x20));
  _mm256_storeu_pd(reinterpret_cast<double*>(dst + 1 * dr), _mm256_permute2f128_pd(t1, t3, 0x20));
  _mm256_storeu_pd(reinterpret_cast<double*>(dst + 2 * dr), _mm256_permute2f128_pd(t0, t2, 0x31));
  _mm256_storeu_pd(reinterpret_cast<double*>(dst + 3 * dr), _mm256_permute2f128_pd(t1, t3, 0x31));
}

// Blocks of B x B elements (B a multiple of the tile), tiles inside; ragged edges fall back to scalar.
template <int64_t T, size_t N, void (*Tile)(char*, int64_t, const char*, int64_t)>
__attribute__((target("avx2"))) void transpose_avx2(char* dst, int64_t dr, const char* src, int64_t sc, int64_t rows,
                                                    int64_t cols) {
  constexpr int64_t B = 64;
  const int64_t is = static_cast<int64_t>(N);
  const int64_t rows_t = rows / T * T, cols_t = cols / T * T;
  for (int64_t r0 = 0; r0 < rows_t; r0 += B) {
    const int64_t r1 = std::min(rows_t, r0 + B);
    for (int64_t c0 = 0; c0 < cols_t; c0 += B) {
      const int64_t c1 = std::min(cols_t, c0 + B);
      for (int64_t r = r0; r < r1; r += T)
        for (int64_t c = c0; c < c1; c += T) Tile(dst + r * dr + c * is, dr, src + r * is + c * sc, sc);
    }
  }
  if (cols_t < cols) transpose_scalar<N>(dst + cols_t * is, dr, src + cols_t * sc, sc, rows, cols - cols_t);
  if (rows_t < rows) transpose_scalar<N>(dst + rows_t * dr, dr, src + rows_t * is, sc, rows - rows_t, cols_t);
}
#endif

}  // namespace

void transpose_2d(char* dst, int64_t dr, const char* src, int64_t sc, int64_t rows, int64_t cols, size_t isz) {
#ifdef TW_X86
  if (cpu_has_avx2()) {
    if (isz == 4) return transpose_avx2<8, 4, tile8x8_f32>(dst, dr, src, sc, rows, cols);
    if (isz == 8) return transpose_avx2<4, 8, tile4x4_f64>(dst, dr, src, sc, rows, cols);
  }
#endif
  switch (isz) {
    case 1: return transpose_scalar<1>(dst, dr, src, sc, rows, cols);
    case 2: return transpose_scalar<2>(dst, dr, src, sc, rows, cols);
    case 4: return transpose_scalar<4>(dst, dr, src, sc, rows, cols);
    case 8: return transpose_scalar<8>(dst, dr, src, sc, rows, cols);
    case 16: return transpose_scalar<16>(dst, dr, src, sc, rows, cols);
    default: return transpose_generic(dst, dr, src, sc, rows, cols, isz);
  }
}

void byteswap_1d(char* dst, int64_t stride, int64_t n, size_t isz, size_t unit) {
  if (unit <= 1) return;
  for (int64_t i = 0; i < n; ++i) {
    char* e = dst + i * stride;
    for (size_t p = 0; p + unit <= isz; p += unit) std::reverse(e + p, e + p + unit);
  }
}

}  // namespace tw::detail
