#include "tensorwire/dtype.hpp"

#include <string>

#include "tensorwire/error.hpp"

namespace tw {
namespace {

struct Named {
  const char* name;
  DType dtype;
};

// Every named dtype, in the order error messages list them.
constexpr Named kNamed[] = {
    {"bool", DType::boolean()},
    {"int8", DType::int8()},
    {"int16", DType::int16()},
    {"int32", DType::int32()},
    {"int64", DType::int64()},
    {"uint8", DType::uint8()},
    {"uint16", DType::uint16()},
    {"uint32", DType::uint32()},
    {"uint64", DType::uint64()},
    {"float16", DType::float16()},
    {"float32", DType::float32()},
    {"float64", DType::float64()},
    {"bfloat16", DType::bfloat16()},
    {"complex64", DType::complex64()},
    {"complex128", DType::complex128()},
    {"complex32", DType::complex32()},
    {"bcomplex32", DType::bcomplex32()},
    {"float8_e3m4", DType::float8_e3m4()},
    {"float8_e4m3", DType::float8_e4m3()},
    {"float8_e4m3b11fnuz", DType::float8_e4m3b11fnuz()},
    {"float8_e4m3fn", DType::float8_e4m3fn()},
    {"float8_e4m3fnuz", DType::float8_e4m3fnuz()},
    {"float8_e5m2", DType::float8_e5m2()},
    {"float8_e5m2fnuz", DType::float8_e5m2fnuz()},
    {"float8_e8m0fnu", DType::float8_e8m0fnu()},
    {"float6_e2m3fn", DType::float6_e2m3fn()},
    {"float6_e3m2fn", DType::float6_e3m2fn()},
    {"float4_e2m1fn", DType::float4_e2m1fn()},
    {"int1", DType::make(kDLInt, 1)},
    {"int2", DType::int2()},
    {"int4", DType::int4()},
    {"uint1", DType::make(kDLUInt, 1)},
    {"uint2", DType::uint2()},
    {"uint4", DType::uint4()},
};

std::string triple(DLDataType dt) {
  return "(code=" + std::to_string(dt.code) + ", bits=" + std::to_string(dt.bits) +
         ", lanes=" + std::to_string(dt.lanes) + ")";
}

bool scalar_valid(uint8_t code, uint8_t bits) {
  switch (code) {
    case kDLInt:
    case kDLUInt:
      return bits == 1 || bits == 2 || bits == 4 || bits == 8 || bits == 16 || bits == 32 || bits == 64;
    case kDLFloat: return bits == 16 || bits == 32 || bits == 64;
    case kDLBfloat: return bits == 16;
    case kDLComplex: return bits == 32 || bits == 64 || bits == 128;
    case kDLBcomplex: return bits == 32;
    case kDLBool: return bits == 8;
    case kDLFloat8_e3m4:
    case kDLFloat8_e4m3:
    case kDLFloat8_e4m3b11fnuz:
    case kDLFloat8_e4m3fn:
    case kDLFloat8_e4m3fnuz:
    case kDLFloat8_e5m2:
    case kDLFloat8_e5m2fnuz:
    case kDLFloat8_e8m0fnu: return bits == 8;
    case kDLFloat6_e2m3fn:
    case kDLFloat6_e3m2fn: return bits == 6;
    case kDLFloat4_e2m1fn: return bits == 4;
    default: return false;
  }
}

}  // namespace

DType DType::from_dlpack(DLDataType dt) {
  if (dt.code == kDLOpaqueHandle)
    throw Error(ErrorCode::unsupported, "DLPack dtype " + triple(dt) +
                                            " is an opaque handle, whose meaning only its producer knows; "
                                            "tensorwire cannot interpret it");
  if (!scalar_valid(dt.code, dt.bits))
    throw Error(ErrorCode::unsupported, "DLPack dtype " + triple(dt) +
                                            " is not a known DLPack 1.4 type (unknown code, or bits not valid "
                                            "for the code)");
  if (dt.lanes == 0)
    throw Error(ErrorCode::unsupported, "DLPack dtype " + triple(dt) + " has zero lanes");
  if (dt.lanes > 1 && dt.bits * dt.lanes % 8 != 0)
    throw Error(ErrorCode::unsupported, "DLPack dtype " + triple(dt) + ": vector lanes of sub-byte types are not supported");
  return DType{dt.code, dt.bits, dt.lanes};
}

DType DType::from_name(std::string_view name) {
  std::string_view base = name;
  uint16_t lanes = 1;
  bool exact = name == "bool_" || name == "boolean";
  for (const auto& n : kNamed) exact = exact || name == n.name;
  if (auto x = name.rfind('x'); !exact && x != std::string_view::npos && x + 1 < name.size() && x > 0) {
    std::string_view tail = name.substr(x + 1);
    bool digits = true;
    for (char c : tail) digits = digits && c >= '0' && c <= '9';
    if (digits && tail.size() <= 4) {
      base = name.substr(0, x);
      lanes = static_cast<uint16_t>(std::stoi(std::string(tail)));
    }
  }
  if (base == "bool_" || base == "boolean") base = "bool";
  for (const auto& n : kNamed) {
    if (base == n.name) {
      DType d = n.dtype;
      d.lanes = lanes;
      return from_dlpack(d.to_dlpack());
    }
  }
  std::string all;
  for (const auto& n : kNamed) all += std::string(all.empty() ? "" : ", ") + n.name;
  throw Error(ErrorCode::invalid_argument, "unknown dtype name '" + std::string(name) + "'; known names: " + all);
}

std::string DType::name() const {
  DType base{code, bits, 1};
  for (const auto& n : kNamed) {
    if (n.dtype == base) return lanes == 1 ? std::string(n.name) : std::string(n.name) + "x" + std::to_string(lanes);
  }
  return "dtype" + triple(to_dlpack());
}

}  // namespace tw
