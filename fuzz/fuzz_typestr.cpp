// fuzz_typestr — the two type-description parsers: tw::parse_typestr (NumPy array interface) and
// tw::parse_buffer_format (PEP 3118).
//
// Properties checked: only tw::Error escapes; an accepted description names a valid dtype whose size is the size
// the text states (and, for buffer formats, the itemsize the exporter reported); one-byte types never need a swap.
//
// Input: i8 itemsize for parse_buffer_format, then the string (both parsers get the same string).
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_util.hpp"
#include "tensorwire/interop.hpp"

namespace {

void check_parsed(const tw::ParsedType& p, std::string_view text) {
  const std::string s(text);
  TW_FUZZ_CHECK(p.itemsize > 0 && p.dtype.itemsize() == p.itemsize, "'%s': dtype %s has itemsize %zu, parsed %zu",
                s.c_str(), p.dtype.name().c_str(), p.dtype.itemsize(), p.itemsize);
  TW_FUZZ_CHECK(!(p.byteswap && p.itemsize == 1), "'%s': a one-byte type cannot need a byte swap", s.c_str());
  try {
    (void)tw::DType::from_dlpack(p.dtype.to_dlpack());
  } catch (const tw::Error& e) {
    TW_FUZZ_CHECK(false, "'%s' parsed to an invalid dtype: %s", s.c_str(), e.what());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int64_t itemsize = static_cast<int8_t>(data[0]);
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    const tw::ParsedType p = tw::parse_typestr(text);
    check_parsed(p, text);
  } catch (const tw::Error&) {
  }
  try {
    const tw::ParsedType p = tw::parse_buffer_format(text, itemsize);
    check_parsed(p, text);
    TW_FUZZ_CHECK(static_cast<int64_t>(p.itemsize) == itemsize, "format accepted with itemsize %zu, reported %lld",
                  p.itemsize, static_cast<long long>(itemsize));
  } catch (const tw::Error&) {
  }
  return 0;
}
