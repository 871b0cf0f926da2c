// tensorwire/dtype.hpp — element types, as DLPack encodes them (code, bits, lanes).
// Names follow NumPy / PyTorch / ml_dtypes spelling ("float32", "bfloat16", "float8_e4m3fn", "bool").
#pragma once
#if defined(__cplusplus) && __cplusplus < 202002L && !(defined(_MSVC_LANG) && _MSVC_LANG >= 202002L)
#error "tensorwire's C++ headers need C++20 (-std=c++20); C and older C++ take the C API, tensorwire/tensorwire.h"
#endif

#include <complex>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

#include "tensorwire/dlpack.hpp"

namespace tw {

/// An element type. A plain value: (code, bits, lanes) exactly as in DLDataType.
/// Construct named types with the static functions; construct from foreign input with `from_dlpack` or
/// `from_name`, which validate.
struct DType {
  uint8_t code = kDLFloat;
  uint8_t bits = 32;
  uint16_t lanes = 1;

  static constexpr DType make(DLDataTypeCode c, int b) noexcept {
    return DType{static_cast<uint8_t>(c), static_cast<uint8_t>(b), 1};
  }
  static constexpr DType int8() noexcept { return make(kDLInt, 8); }
  static constexpr DType int16() noexcept { return make(kDLInt, 16); }
  static constexpr DType int32() noexcept { return make(kDLInt, 32); }
  static constexpr DType int64() noexcept { return make(kDLInt, 64); }
  static constexpr DType uint8() noexcept { return make(kDLUInt, 8); }
  static constexpr DType uint16() noexcept { return make(kDLUInt, 16); }
  static constexpr DType uint32() noexcept { return make(kDLUInt, 32); }
  static constexpr DType uint64() noexcept { return make(kDLUInt, 64); }
  static constexpr DType float16() noexcept { return make(kDLFloat, 16); }
  static constexpr DType float32() noexcept { return make(kDLFloat, 32); }
  static constexpr DType float64() noexcept { return make(kDLFloat, 64); }
  static constexpr DType bfloat16() noexcept { return make(kDLBfloat, 16); }
  static constexpr DType complex64() noexcept { return make(kDLComplex, 64); }
  static constexpr DType complex128() noexcept { return make(kDLComplex, 128); }
  /// Two float16 halves (DLPack kDLComplex, 32 bits; PyTorch complex32 / chalf, ml_dtypes.complex32).
  static constexpr DType complex32() noexcept { return make(kDLComplex, 32); }
  /// Two bfloat16 halves (DLPack 1.4 kDLBcomplex; ml_dtypes.bcomplex32).
  static constexpr DType bcomplex32() noexcept { return make(static_cast<DLDataTypeCode>(TW_DL_BCOMPLEX), 32); }
  static constexpr DType boolean() noexcept { return make(kDLBool, 8); }
  static constexpr DType float8_e3m4() noexcept { return make(kDLFloat8_e3m4, 8); }
  static constexpr DType float8_e4m3() noexcept { return make(kDLFloat8_e4m3, 8); }
  static constexpr DType float8_e4m3b11fnuz() noexcept { return make(kDLFloat8_e4m3b11fnuz, 8); }
  static constexpr DType float8_e4m3fn() noexcept { return make(kDLFloat8_e4m3fn, 8); }
  static constexpr DType float8_e4m3fnuz() noexcept { return make(kDLFloat8_e4m3fnuz, 8); }
  static constexpr DType float8_e5m2() noexcept { return make(kDLFloat8_e5m2, 8); }
  static constexpr DType float8_e5m2fnuz() noexcept { return make(kDLFloat8_e5m2fnuz, 8); }
  static constexpr DType float8_e8m0fnu() noexcept { return make(kDLFloat8_e8m0fnu, 8); }
  static constexpr DType float6_e2m3fn() noexcept { return make(kDLFloat6_e2m3fn, 6); }
  static constexpr DType float6_e3m2fn() noexcept { return make(kDLFloat6_e3m2fn, 6); }
  static constexpr DType float4_e2m1fn() noexcept { return make(kDLFloat4_e2m1fn, 4); }
  static constexpr DType int4() noexcept { return make(kDLInt, 4); }
  static constexpr DType uint4() noexcept { return make(kDLUInt, 4); }
  static constexpr DType int2() noexcept { return make(kDLInt, 2); }
  static constexpr DType uint2() noexcept { return make(kDLUInt, 2); }

  /// The element type of C++ type T: every integer type (by size and signedness), bool, float, double,
  /// std::complex<float/double>, _Float16 where the compiler has it; anything else fails to compile, saying so.
  template <class T>
  static constexpr DType of() noexcept;

  /// Validates a DLPack (code, bits, lanes) triple; throws Error(unsupported) naming the triple otherwise.
  static DType from_dlpack(DLDataType dt);
  /// Parses a name such as "float32", "bfloat16", "float8_e4m3fn", "bool", "complex64", "int4", "float32x4".
  /// Throws Error(invalid_argument) listing the accepted names.
  static DType from_name(std::string_view name);

  constexpr DLDataType to_dlpack() const noexcept { return DLDataType{code, bits, lanes}; }
  /// Bits one element occupies when packed: bits * lanes.
  constexpr unsigned total_bits() const noexcept { return unsigned(bits) * lanes; }
  /// True for types narrower than a byte (int4, float4_e2m1fn, float6_*...). Packed two-or-more per byte
  /// unless a tensor says it is padded (DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED).
  constexpr bool is_subbyte() const noexcept { return total_bits() < 8; }
  /// Bytes one element occupies when stored one per byte or wider: ceil(bits * lanes / 8).
  constexpr size_t itemsize() const noexcept { return (size_t(total_bits()) + 7) / 8; }
  /// The canonical name ("float32"); "float32x4" for vector lanes.
  std::string name() const;

  friend constexpr bool operator==(DType a, DType b) noexcept {
    return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
  }
};

namespace detail {
template <class> inline constexpr bool kNoDType = false;
template <class T> struct dtype_of {
  static_assert(kNoDType<T>, "tw::DType::of<T>: T has no tensorwire dtype (integers, bool, float, double, "
                             "std::complex<float>, std::complex<double>, _Float16)");
};
template <class T> inline constexpr bool kCharacter =
    std::is_same_v<T, wchar_t> || std::is_same_v<T, char8_t> || std::is_same_v<T, char16_t> || std::is_same_v<T, char32_t>;
// Every integer type by its size and signedness: int64_t, long long and long all map to int64 (char by its
// signedness on the platform: int8 on x86).
template <class T>
  requires(std::is_integral_v<T> && !std::is_same_v<T, bool> && !kCharacter<T>)
struct dtype_of<T> {
  static constexpr DType v = std::is_signed_v<T>
                                 ? (sizeof(T) == 1 ? DType::int8() : sizeof(T) == 2 ? DType::int16()
                                    : sizeof(T) == 4 ? DType::int32() : DType::int64())
                                 : (sizeof(T) == 1 ? DType::uint8() : sizeof(T) == 2 ? DType::uint16()
                                    : sizeof(T) == 4 ? DType::uint32() : DType::uint64());
};
template <> struct dtype_of<bool> { static constexpr DType v = DType::boolean(); };
template <> struct dtype_of<float> { static constexpr DType v = DType::float32(); };
template <> struct dtype_of<double> { static constexpr DType v = DType::float64(); };
template <> struct dtype_of<std::complex<float>> { static constexpr DType v = DType::complex64(); };
template <> struct dtype_of<std::complex<double>> { static constexpr DType v = DType::complex128(); };
#if defined(__FLT16_MAX__)
template <> struct dtype_of<_Float16> { static constexpr DType v = DType::float16(); };
#endif
}  // namespace detail

template <class T>
constexpr DType DType::of() noexcept {
  return detail::dtype_of<T>::v;
}

}  // namespace tw
