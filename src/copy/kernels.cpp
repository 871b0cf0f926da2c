#include "kernels.hpp"

#include <algorithm>
#include <cstdint>
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
// Streaming (non-temporal) stores go to memory in whole lines without reading the destination first. They pay off
// only when the destination would not stay in cache anyway (the caller's `stream`), and only on 32-byte aligned
// addresses: a kernel first copies head elements one by one up to the first aligned one. They are weakly ordered:
// the kernels leave the fence to the caller (stream_fence), once per batch of rows rather than once per row: a fence
// per row held a 64 MiB broadcast of 16 KiB rows to ~14 GB/s, against ~17.5 without.

// Elements before dst + k * isz is 32-byte aligned, or -1 when no element ever is.
int64_t elements_to_align32(const char* dst, size_t isz) {
  const auto mis = static_cast<size_t>(reinterpret_cast<uintptr_t>(dst) & 31);
  if (mis == 0) return 0;
  const size_t gap = 32 - mis;
  return gap % isz == 0 ? static_cast<int64_t>(gap / isz) : -1;
}

__attribute__((target("avx2"))) void copy_stream_avx2(char* dst, const char* src, size_t bytes) {
  const size_t head = std::min(bytes, static_cast<size_t>((32 - (reinterpret_cast<uintptr_t>(dst) & 31)) & 31));
  std::memcpy(dst, src, head);
  size_t i = head;
  for (; i + 128 <= bytes; i += 128) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 32));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 64));
    const __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 96), d);
  }
  for (; i + 32 <= bytes; i += 32)
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i),
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
  std::memcpy(dst + i, src + i, bytes - i);
}

// n copies of one `isz`-byte element (32 % isz == 0): the destination is a byte pattern of period isz, so one
// 32-byte vector, rotated to the first aligned address, fills every aligned block.
__attribute__((target("avx2"))) void fill_stream_avx2(char* dst, const char* elem, int64_t n, size_t isz) {
  const size_t bytes = static_cast<size_t>(n) * isz;
  const size_t head = std::min(bytes, static_cast<size_t>((32 - (reinterpret_cast<uintptr_t>(dst) & 31)) & 31));
  alignas(32) char pattern[32];
  for (size_t x = 0; x < 32; ++x) pattern[x] = elem[(head + x) % isz];
  for (size_t x = 0; x < head; ++x) dst[x] = elem[x % isz];
  const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(pattern));
  size_t i = head;
  for (; i + 32 <= bytes; i += 32) _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i), v);
  for (; i < bytes; ++i) dst[i] = elem[i % isz];
}

template <bool NT>
__attribute__((target("avx2"))) inline void store_si256(char* p, __m256i v) {
  if constexpr (NT) _mm256_stream_si256(reinterpret_cast<__m256i*>(p), v);
  else _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
}

// Every other element into a contiguous destination, 32 bytes out per step from two 32-byte loads. The second
// load ends one element past the last one the step uses, so a step runs only while the element after its last one
// exists. (The loads are unaligned; with NT the stores are aligned: dst must be 32-byte aligned.)
template <bool NT>
__attribute__((target("avx2"))) void gather_stride2_u8(char* dst, const char* src, int64_t n) {
  const __m256i even = _mm256_set1_epi16(0x00FF);
  int64_t i = 0;
  for (; i + 32 < n; i += 32) {
    const __m256i a = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 2 * i)), even);
    const __m256i b = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 2 * i + 32)), even);
    // packus keeps each 16-bit value (0..255 after the mask) as a byte, lane by lane: fix the lane order after.
    store_si256<NT>(dst + i, _mm256_permute4x64_epi64(_mm256_packus_epi16(a, b), 0xD8));
  }
  for (; i < n; ++i) dst[i] = src[2 * i];
}

template <bool NT>
__attribute__((target("avx2"))) void gather_stride2_u16(char* dst, const char* src, int64_t n) {
  const __m256i even = _mm256_set1_epi32(0xFFFF);
  int64_t i = 0;
  for (; i + 16 < n; i += 16) {
    const __m256i a = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 4 * i)), even);
    const __m256i b = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 4 * i + 32)), even);
    store_si256<NT>(dst + 2 * i, _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xD8));
  }
  for (; i < n; ++i) std::memcpy(dst + 2 * i, src + 4 * i, 2);
}

template <bool NT>
__attribute__((target("avx2"))) void gather_stride2_f32(char* dst, const char* src, int64_t n) {
  int64_t i = 0;
  for (; i + 8 < n; i += 8) {
    __m256 a = _mm256_loadu_ps(reinterpret_cast<const float*>(src + 8 * i));
    __m256 b = _mm256_loadu_ps(reinterpret_cast<const float*>(src + 8 * i + 32));
    __m256 ev = _mm256_shuffle_ps(a, b, 0x88);  // a0 a2 b0 b2 | a4 a6 b4 b6
    ev = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(ev), 0xD8));
    store_si256<NT>(dst + 4 * i, _mm256_castps_si256(ev));
  }
  for (; i < n; ++i) std::memcpy(dst + 4 * i, src + 8 * i, 4);
}

template <bool NT>
__attribute__((target("avx2"))) void gather_stride2_f64(char* dst, const char* src, int64_t n) {
  int64_t i = 0;
  for (; i + 4 < n; i += 4) {
    __m256d a = _mm256_loadu_pd(reinterpret_cast<const double*>(src + 16 * i));
    __m256d b = _mm256_loadu_pd(reinterpret_cast<const double*>(src + 16 * i + 32));
    __m256d ev = _mm256_unpacklo_pd(a, b);  // a0 b0 | a2 b2
    ev = _mm256_permute4x64_pd(ev, 0xD8);
    store_si256<NT>(dst + 8 * i, _mm256_castpd_si256(ev));
  }
  for (; i < n; ++i) std::memcpy(dst + 8 * i, src + 16 * i, 8);
}

using Stride2Fn = void (*)(char*, const char*, int64_t);

// The stride-2 gather, with streaming stores after an unaligned head when asked and possible.
void gather_stride2(char* dst, const char* src, int64_t n, size_t isz, bool stream, Stride2Fn regular,
                    Stride2Fn nt) {
  const int64_t head = stream ? elements_to_align32(dst, isz) : -1;
  if (head < 0 || head >= n) return regular(dst, src, n);
  const int64_t is = static_cast<int64_t>(isz);
  regular(dst, src, head);
  nt(dst + head * is, src + 2 * head * is, n - head);
}
#endif

// Runs shorter than this keep ordinary stores even in a streaming copy: a streamed run should cover whole lines.
constexpr size_t kMinStreamRun = 1024;

}  // namespace

void gather_1d(char* dst, int64_t ds, const char* src, int64_t ss, int64_t n, size_t isz, bool stream) {
  const int64_t is = static_cast<int64_t>(isz);
  const size_t bytes = static_cast<size_t>(n) * isz;
  if (ds == is && ss == is) {
#ifdef TW_X86
    if (stream && bytes >= kMinStreamRun && cpu_has_avx2()) return copy_stream_avx2(dst, src, bytes);
#endif
    std::memcpy(dst, src, bytes);
    return;
  }
#ifdef TW_X86
  if (ds == is && cpu_has_avx2()) {
    if (ss == 0 && stream && bytes >= kMinStreamRun && 32 % isz == 0) return fill_stream_avx2(dst, src, n, isz);
    if (ss == 2 * is) {
      switch (isz) {
        case 1: return gather_stride2(dst, src, n, isz, stream, gather_stride2_u8<false>, gather_stride2_u8<true>);
        case 2: return gather_stride2(dst, src, n, isz, stream, gather_stride2_u16<false>, gather_stride2_u16<true>);
        case 4: return gather_stride2(dst, src, n, isz, stream, gather_stride2_f32<false>, gather_stride2_f32<true>);
        case 8: return gather_stride2(dst, src, n, isz, stream, gather_stride2_f64<false>, gather_stride2_f64<true>);
        default: break;
      }
    }
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
// In-register transposes. A source "column" holds consecutive r (contiguous in the source); a destination row
// holds consecutive c (contiguous in the destination).

// 8x8 of 4-byte elements: loads 8 source columns (8 elements each), leaves destination row k in o[k].
__attribute__((target("avx2"))) inline void t8x8_f32(const char* src, int64_t sc, __m256 o[8]) {
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
  o[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
  o[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  o[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
  o[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  o[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
  o[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  o[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
  o[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

// 4x4 of 8-byte elements, the same way.
__attribute__((target("avx2"))) inline void t4x4_f64(const char* src, int64_t sc, __m256d o[4]) {
  __m256d c0 = _mm256_loadu_pd(reinterpret_cast<const double*>(src + 0 * sc));
  __m256d c1 = _mm256_loadu_pd(reinterpret_cast<const double*>(src + 1 * sc));
  __m256d c2 = _mm256_loadu_pd(reinterpret_cast<const double*>(src + 2 * sc));
  __m256d c3 = _mm256_loadu_pd(reinterpret_cast<const double*>(src + 3 * sc));
  __m256d t0 = _mm256_unpacklo_pd(c0, c1), t1 = _mm256_unpackhi_pd(c0, c1);
  __m256d t2 = _mm256_unpacklo_pd(c2, c3), t3 = _mm256_unpackhi_pd(c2, c3);
  o[0] = _mm256_permute2f128_pd(t0, t2, 0x20);
  o[1] = _mm256_permute2f128_pd(t1, t3, 0x20);
  o[2] = _mm256_permute2f128_pd(t0, t2, 0x31);
  o[3] = _mm256_permute2f128_pd(t1, t3, 0x31);
}

template <bool NT>
__attribute__((target("avx2"))) inline void store32(char* p, __m256 v) {
  if constexpr (NT) _mm256_stream_ps(reinterpret_cast<float*>(p), v);
  else _mm256_storeu_ps(reinterpret_cast<float*>(p), v);
}
template <bool NT>
__attribute__((target("avx2"))) inline void store32(char* p, __m256d v) {
  if constexpr (NT) _mm256_stream_pd(reinterpret_cast<double*>(p), v);
  else _mm256_storeu_pd(reinterpret_cast<double*>(p), v);
}

// A "line tile": T destination rows x one 64-byte line of each. Two T x T transposes side by side, then each row's
// two halves are stored back to back, so a line is complete before the next one starts — what non-temporal
// (write-combining) stores need to go out as whole lines without the destination ever being read.
template <bool NT>
__attribute__((target("avx2"))) inline void line_tile_f32(char* dst, int64_t dr, const char* src, int64_t sc) {
  __m256 a[8], b[8];
  t8x8_f32(src, sc, a);
  t8x8_f32(src + 8 * sc, sc, b);
  for (int k = 0; k < 8; ++k) {
    store32<NT>(dst + k * dr, a[k]);
    store32<NT>(dst + k * dr + 32, b[k]);
  }
}
template <bool NT>
__attribute__((target("avx2"))) inline void line_tile_f64(char* dst, int64_t dr, const char* src, int64_t sc) {
  __m256d a[4], b[4];
  t4x4_f64(src, sc, a);
  t4x4_f64(src + 4 * sc, sc, b);
  for (int k = 0; k < 4; ++k) {
    store32<NT>(dst + k * dr, a[k]);
    store32<NT>(dst + k * dr + 32, b[k]);
  }
}
// A single T x T tile (32 bytes per destination row), for a ragged strip narrower than a line.
__attribute__((target("avx2"))) inline void half_tile_f32(char* dst, int64_t dr, const char* src, int64_t sc) {
  __m256 a[8];
  t8x8_f32(src, sc, a);
  for (int k = 0; k < 8; ++k) store32<false>(dst + k * dr, a[k]);
}
__attribute__((target("avx2"))) inline void half_tile_f64(char* dst, int64_t dr, const char* src, int64_t sc) {
  __m256d a[4];
  t4x4_f64(src, sc, a);
  for (int k = 0; k < 4; ++k) store32<false>(dst + k * dr, a[k]);
}

using TileFn = void (*)(char*, int64_t, const char*, int64_t);

// 16x16 bytes and 8x8 16-bit elements with SSE2 (baseline on x86-64): x[j] holds source column j on entry and
// destination row j on exit. Each stage interleaves pairs, doubling the unit (8 -> 16 -> 32 -> 64 bits).
inline void t16x16_u8(__m128i x[16]) {
  __m128i t[16];
  for (int k = 0; k < 8; ++k) {  // t[k]: rows 0-7 of columns 2k, 2k+1 (16-bit units); t[8 + k]: rows 8-15
    t[k] = _mm_unpacklo_epi8(x[2 * k], x[2 * k + 1]);
    t[8 + k] = _mm_unpackhi_epi8(x[2 * k], x[2 * k + 1]);
  }
  for (int h = 0; h < 2; ++h)
    for (int k = 0; k < 4; ++k) {  // x[4g + k]: rows 4g..4g+3 of columns 4k..4k+3 (32-bit units)
      x[8 * h + k] = _mm_unpacklo_epi16(t[8 * h + 2 * k], t[8 * h + 2 * k + 1]);
      x[8 * h + 4 + k] = _mm_unpackhi_epi16(t[8 * h + 2 * k], t[8 * h + 2 * k + 1]);
    }
  for (int g = 0; g < 4; ++g)
    for (int k = 0; k < 2; ++k) {  // t[4g + 2s + k]: rows 4g+2s, 4g+2s+1 of columns 8k..8k+7 (64-bit units)
      t[4 * g + k] = _mm_unpacklo_epi32(x[4 * g + 2 * k], x[4 * g + 2 * k + 1]);
      t[4 * g + 2 + k] = _mm_unpackhi_epi32(x[4 * g + 2 * k], x[4 * g + 2 * k + 1]);
    }
  for (int p = 0; p < 8; ++p) {  // rows 2p, 2p+1 whole
    x[2 * p] = _mm_unpacklo_epi64(t[2 * p], t[2 * p + 1]);
    x[2 * p + 1] = _mm_unpackhi_epi64(t[2 * p], t[2 * p + 1]);
  }
}

inline void t8x8_u16(__m128i x[8]) {
  __m128i t[8];
  for (int k = 0; k < 4; ++k) {  // t[k]: rows 0-3 of columns 2k, 2k+1 (32-bit units); t[4 + k]: rows 4-7
    t[k] = _mm_unpacklo_epi16(x[2 * k], x[2 * k + 1]);
    t[4 + k] = _mm_unpackhi_epi16(x[2 * k], x[2 * k + 1]);
  }
  for (int h = 0; h < 2; ++h)
    for (int k = 0; k < 2; ++k) {  // x[4h + 2s + k]: rows 4h+2s, 4h+2s+1 of columns 4k..4k+3 (64-bit units)
      x[4 * h + k] = _mm_unpacklo_epi32(t[4 * h + 2 * k], t[4 * h + 2 * k + 1]);
      x[4 * h + 2 + k] = _mm_unpackhi_epi32(t[4 * h + 2 * k], t[4 * h + 2 * k + 1]);
    }
  for (int p = 0; p < 4; ++p) {  // rows 2p, 2p+1 whole
    t[2 * p] = _mm_unpacklo_epi64(x[2 * p], x[2 * p + 1]);
    t[2 * p + 1] = _mm_unpackhi_epi64(x[2 * p], x[2 * p + 1]);
  }
  for (int k = 0; k < 8; ++k) x[k] = t[k];
}

template <int64_t T, void (*Transpose)(__m128i*)>
inline void sse_tile(char* dst, int64_t dr, const char* src, int64_t sc) {
  __m128i x[static_cast<size_t>(T)];
  for (int64_t k = 0; k < T; ++k) x[k] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + k * sc));
  Transpose(x);
  for (int64_t k = 0; k < T; ++k) _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + k * dr), x[k]);
}

// 1- and 2-byte elements: the same column bands as below, a line (64 bytes) wide, of 16-byte tiles. Ordinary
// stores: a line is completed by the band's four tiles while it is still in L1.
template <size_t N, int64_t T, TileFn Tile>
void transpose_sse2(char* dst, int64_t dr, const char* src, int64_t sc, int64_t rows, int64_t cols) {
  constexpr int64_t is = static_cast<int64_t>(N), L = 64 / is, kBandRows = 2048 / is;
  const int64_t rows_t = rows / T * T, cols_t = cols / T * T;
  for (int64_t r0 = 0; r0 < rows_t; r0 += kBandRows) {
    const int64_t r1 = std::min(rows_t, r0 + kBandRows);
    for (int64_t c0 = 0; c0 < cols_t; c0 += L) {
      const int64_t c1 = std::min(cols_t, c0 + L);
      for (int64_t r = r0; r < r1; r += T)
        for (int64_t c = c0; c < c1; c += T) Tile(dst + r * dr + c * is, dr, src + r * is + c * sc, sc);
    }
  }
  if (cols_t < cols) transpose_scalar<N>(dst + cols_t * is, dr, src + cols_t * sc, sc, rows, cols - cols_t);
  if (rows_t < rows) transpose_scalar<N>(dst + rows_t * dr, dr, src + rows_t * is, sc, rows - rows_t, cols_t);
}

// Column bands: the destination is written one line (64 bytes) wide, 2 KiB of each source column down, then the
// next band across, then the next rows. Every source column is read as a sequential stream and every destination
// line is written whole, once; nothing has to stay in cache between tiles. (Square blocks, which this replaced,
// re-touch lines and at power-of-two strides thrash L1 sets: 2-4x slower on 16-64 MiB transposes.) `stream` asks
// for non-temporal stores, for destinations too big to stay in cache; they need 64-byte aligned lines.
template <size_t N, int64_t T, TileFn Line, TileFn LineNT, TileFn Half>
__attribute__((target("avx2"))) void transpose_avx2(char* dst, int64_t dr, const char* src, int64_t sc, int64_t rows,
                                                    int64_t cols, bool stream) {
  constexpr int64_t is = static_cast<int64_t>(N), L = 64 / is, kBandRows = 2048 / is;
  // Peel a few leading rows so the tiles load aligned 32-byte source vectors, and a few leading columns so they
  // store whole 64-byte destination lines (and may stream them): NumPy arrays are only 16-byte aligned, and split
  // loads and split lines cost half the speed of a 64 MiB transpose. The peeled rows and columns, and the ragged
  // ends, are copied element by element inside the same bands, while their lines are in cache.
  const auto smis = reinterpret_cast<uintptr_t>(src) % 32, dmis = reinterpret_cast<uintptr_t>(dst) % 64;
  const int64_t r0 = sc % 32 == 0 && smis % N == 0 ? std::min(rows, static_cast<int64_t>((32 - smis) % 32 / N)) : 0;
  const int64_t c0 = dr % 64 == 0 && dmis % N == 0 ? std::min(cols, static_cast<int64_t>((64 - dmis) % 64 / N)) : 0;
  const int64_t r1 = r0 + (rows - r0) / T * T;  // tiles cover rows [r0, r1),
  const int64_t c1 = c0 + (cols - c0) / L * L;  // whole lines columns [c0, c1),
  const int64_t c2 = c0 + (cols - c0) / T * T;  // and at most one half-line strip [c1, c2)
  const bool nt = stream && reinterpret_cast<uintptr_t>(dst + c0 * is) % 64 == 0 && dr % 64 == 0;
  auto scalar = [&](int64_t ra, int64_t rb, int64_t ca, int64_t cb) {  // rows [ra, rb) x columns [ca, cb)
    if (ra < rb && ca < cb)
      transpose_scalar<N>(dst + ra * dr + ca * is, dr, src + ra * is + ca * sc, sc, rb - ra, cb - ca);
  };
  // Row blocks start on the tile grid: [0, r0 + kBandRows), then every kBandRows.
  for (int64_t b0 = 0; b0 < rows;) {
    const int64_t b1 = std::min(rows, (b0 == 0 ? r0 : b0) + kBandRows);
    const int64_t t0 = std::min(std::max(b0, r0), r1), t1 = std::max(std::min(b1, r1), t0);  // tiled rows here
    scalar(b0, b1, 0, c0);
    for (int64_t c = c0; c < c1; c += L) {
      scalar(b0, t0, c, c + L);
      if (nt) {
        for (int64_t r = t0; r < t1; r += T) LineNT(dst + r * dr + c * is, dr, src + r * is + c * sc, sc);
      } else {
        for (int64_t r = t0; r < t1; r += T) Line(dst + r * dr + c * is, dr, src + r * is + c * sc, sc);
      }
      scalar(t1, b1, c, c + L);
    }
    for (int64_t c = c1; c < c2; c += T) {  // (cols - c0) % L >= T: one half-line strip
      scalar(b0, t0, c, c + T);
      for (int64_t r = t0; r < t1; r += T) Half(dst + r * dr + c * is, dr, src + r * is + c * sc, sc);
      scalar(t1, b1, c, c + T);
    }
    scalar(b0, b1, c2, cols);
    b0 = b1;
  }
}
#endif

}  // namespace

void transpose_2d(char* dst, int64_t dr, const char* src, int64_t sc, int64_t rows, int64_t cols, size_t isz,
                  bool stream) {
#ifdef TW_X86
  if (cpu_has_avx2()) {
    if (isz == 4)
      return transpose_avx2<4, 8, line_tile_f32<false>, line_tile_f32<true>, half_tile_f32>(dst, dr, src, sc, rows,
                                                                                            cols, stream);
    if (isz == 8)
      return transpose_avx2<8, 4, line_tile_f64<false>, line_tile_f64<true>, half_tile_f64>(dst, dr, src, sc, rows,
                                                                                            cols, stream);
  }
#endif
#ifdef TW_X86
  if (isz == 1) return transpose_sse2<1, 16, sse_tile<16, t16x16_u8>>(dst, dr, src, sc, rows, cols);
  if (isz == 2) return transpose_sse2<2, 8, sse_tile<8, t8x8_u16>>(dst, dr, src, sc, rows, cols);
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

void stream_fence() noexcept {
#ifdef TW_X86
  _mm_sfence();
#endif
}

void byteswap_1d(char* dst, int64_t stride, int64_t n, size_t isz, size_t unit) {
  if (unit <= 1) return;
  for (int64_t i = 0; i < n; ++i) {
    char* e = dst + i * stride;
    for (size_t p = 0; p + unit <= isz; p += unit) std::reverse(e + p, e + p + unit);
  }
}

}  // namespace tw::detail
