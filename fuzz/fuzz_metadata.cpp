// fuzz_metadata — the metadata wire format: tw::decode_metadata on hostile bytes.
//
// Properties checked:
//  1. Only tw::Error escapes; no sanitizer report, no unbounded recursion or allocation.
//  2. Round trip: for every decodable input m = decode(bytes), decode(encode(m)) == m.
//  3. The encoding is canonical: every value has exactly one encoding, so encode(decode(bytes)) == bytes.
//
// Input: the encoded bytes themselves ("TWMD", version 1, then the root dict; see src/core/metadata.cpp).
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_util.hpp"
#include "tensorwire/metadata.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  tw::Metadata m;
  try {
    m = tw::decode_metadata(bytes);
  } catch (const tw::Error&) {
    return 0;
  }
  const std::string enc = tw::encode_metadata(m);
  tw::Metadata back;
  try {
    back = tw::decode_metadata(enc);
  } catch (const tw::Error& e) {
    TW_FUZZ_CHECK(false, "encode_metadata wrote %zu bytes that decode_metadata refuses: %s", enc.size(), e.what());
  }
  TW_FUZZ_CHECK(back == m, "decode(encode(m)) != m (%zu keys, %zu after the round trip)", m.size(), back.size());
  TW_FUZZ_CHECK(enc == bytes, "the encoding is not canonical: %zu input bytes re-encode to %zu different bytes", size,
                enc.size());
  return 0;
}
