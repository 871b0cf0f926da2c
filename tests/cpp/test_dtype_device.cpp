// DType and Device: names round-trip, foreign (DLPack) values are validated, bad input is refused with the right
// error code.
#include <complex>
#include <cstdint>
#include <string>
#include <vector>

#include "tw_test_util.hpp"

namespace {

using tw::Device;
using tw::DType;
using tw::ErrorCode;

struct Expect {
  const char* name;
  uint8_t code;
  uint8_t bits;
  size_t itemsize;
  bool subbyte;
};

// Written out from the DLPack 1.4 specification, independently of the library's own table.
const std::vector<Expect> kAllNames = {
    {"bool", kDLBool, 8, 1, false},
    {"int8", kDLInt, 8, 1, false},
    {"int16", kDLInt, 16, 2, false},
    {"int32", kDLInt, 32, 4, false},
    {"int64", kDLInt, 64, 8, false},
    {"uint8", kDLUInt, 8, 1, false},
    {"uint16", kDLUInt, 16, 2, false},
    {"uint32", kDLUInt, 32, 4, false},
    {"uint64", kDLUInt, 64, 8, false},
    {"float16", kDLFloat, 16, 2, false},
    {"float32", kDLFloat, 32, 4, false},
    {"float64", kDLFloat, 64, 8, false},
    {"bfloat16", kDLBfloat, 16, 2, false},
    {"complex64", kDLComplex, 64, 8, false},
    {"complex128", kDLComplex, 128, 16, false},
    {"complex32", kDLComplex, 32, 4, false},
    {"bcomplex32", kDLBcomplex, 32, 4, false},
    {"float8_e3m4", kDLFloat8_e3m4, 8, 1, false},
    {"float8_e4m3", kDLFloat8_e4m3, 8, 1, false},
    {"float8_e4m3b11fnuz", kDLFloat8_e4m3b11fnuz, 8, 1, false},
    {"float8_e4m3fn", kDLFloat8_e4m3fn, 8, 1, false},
    {"float8_e4m3fnuz", kDLFloat8_e4m3fnuz, 8, 1, false},
    {"float8_e5m2", kDLFloat8_e5m2, 8, 1, false},
    {"float8_e5m2fnuz", kDLFloat8_e5m2fnuz, 8, 1, false},
    {"float8_e8m0fnu", kDLFloat8_e8m0fnu, 8, 1, false},
    {"float6_e2m3fn", kDLFloat6_e2m3fn, 6, 1, true},
    {"float6_e3m2fn", kDLFloat6_e3m2fn, 6, 1, true},
    {"float4_e2m1fn", kDLFloat4_e2m1fn, 4, 1, true},
    {"int1", kDLInt, 1, 1, true},
    {"int2", kDLInt, 2, 1, true},
    {"int4", kDLInt, 4, 1, true},
    {"uint1", kDLUInt, 1, 1, true},
    {"uint2", kDLUInt, 2, 1, true},
    {"uint4", kDLUInt, 4, 1, true},
};

TEST(DType, EveryNameRoundTripsThroughFromNameAndName) {
  for (const auto& e : kAllNames) {
    SCOPED_TRACE(e.name);
    DType d = DType::from_name(e.name);
    EXPECT_EQ(d.code, e.code);
    EXPECT_EQ(d.bits, e.bits);
    EXPECT_EQ(d.lanes, 1);
    EXPECT_EQ(d.itemsize(), e.itemsize);
    EXPECT_EQ(d.is_subbyte(), e.subbyte);
    EXPECT_EQ(d.name(), e.name);
    EXPECT_EQ(DType::from_name(d.name()), d);
    // The DLPack triple is accepted back unchanged.
    EXPECT_EQ(DType::from_dlpack(d.to_dlpack()), d);
  }
}

TEST(DType, NamedConstructorsMatchTheirNames) {
  const std::vector<std::pair<DType, const char*>> cases = {
      {DType::boolean(), "bool"},          {DType::int8(), "int8"},
      {DType::int16(), "int16"},           {DType::int32(), "int32"},
      {DType::int64(), "int64"},           {DType::uint8(), "uint8"},
      {DType::uint16(), "uint16"},         {DType::uint32(), "uint32"},
      {DType::uint64(), "uint64"},         {DType::float16(), "float16"},
      {DType::float32(), "float32"},       {DType::float64(), "float64"},
      {DType::bfloat16(), "bfloat16"},     {DType::complex64(), "complex64"},
      {DType::complex128(), "complex128"}, {DType::float8_e3m4(), "float8_e3m4"},
      {DType::float8_e4m3(), "float8_e4m3"}, {DType::float8_e4m3b11fnuz(), "float8_e4m3b11fnuz"},
      {DType::float8_e4m3fn(), "float8_e4m3fn"}, {DType::float8_e4m3fnuz(), "float8_e4m3fnuz"},
      {DType::float8_e5m2(), "float8_e5m2"}, {DType::float8_e5m2fnuz(), "float8_e5m2fnuz"},
      {DType::float8_e8m0fnu(), "float8_e8m0fnu"}, {DType::float6_e2m3fn(), "float6_e2m3fn"},
      {DType::float6_e3m2fn(), "float6_e3m2fn"}, {DType::float4_e2m1fn(), "float4_e2m1fn"},
      {DType::int4(), "int4"},             {DType::uint4(), "uint4"},
      {DType::int2(), "int2"},             {DType::uint2(), "uint2"},
  };
  for (const auto& [d, name] : cases) {
    SCOPED_TRACE(name);
    EXPECT_EQ(d.name(), name);
    EXPECT_EQ(DType::from_name(name), d);
  }
}

TEST(DType, VectorLanes) {
  DType d = DType::from_name("float32x4");
  EXPECT_EQ(d.code, kDLFloat);
  EXPECT_EQ(d.bits, 32);
  EXPECT_EQ(d.lanes, 4);
  EXPECT_EQ(d.itemsize(), 16u);
  EXPECT_EQ(d.total_bits(), 128u);
  EXPECT_EQ(d.name(), "float32x4");
  // Names that themselves contain an 'x' keep working with and without lanes.
  EXPECT_EQ(DType::from_name("complex64x2"), (DType{static_cast<uint8_t>(kDLComplex), 64, 2}));
  EXPECT_EQ(DType::from_name("complex64x2").name(), "complex64x2");
  EXPECT_EQ(DType::from_name("int8x16").itemsize(), 16u);
  // Two int4 lanes fill a byte exactly: allowed, and no longer sub-byte.
  DType i4x2 = DType::from_name("int4x2");
  EXPECT_EQ(i4x2.total_bits(), 8u);
  EXPECT_FALSE(i4x2.is_subbyte());
  EXPECT_EQ(i4x2.itemsize(), 1u);
}

TEST(DType, Aliases) {
  EXPECT_EQ(DType::from_name("bool_"), DType::boolean());
  EXPECT_EQ(DType::from_name("boolean"), DType::boolean());
}

TEST(DType, OfCppTypes) {
  EXPECT_EQ(DType::of<bool>(), DType::boolean());
  EXPECT_EQ(DType::of<int8_t>(), DType::int8());
  EXPECT_EQ(DType::of<int16_t>(), DType::int16());
  EXPECT_EQ(DType::of<int32_t>(), DType::int32());
  EXPECT_EQ(DType::of<int64_t>(), DType::int64());
  EXPECT_EQ(DType::of<uint8_t>(), DType::uint8());
  EXPECT_EQ(DType::of<uint16_t>(), DType::uint16());
  EXPECT_EQ(DType::of<uint32_t>(), DType::uint32());
  EXPECT_EQ(DType::of<uint64_t>(), DType::uint64());
  EXPECT_EQ(DType::of<float>(), DType::float32());
  EXPECT_EQ(DType::of<double>(), DType::float64());
  static_assert(DType::of<float>().itemsize() == 4);
  static_assert(DType::int4().is_subbyte() && DType::int4().itemsize() == 1);
  // Every integer type by size and signedness, not only the <cstdint> aliases; complex; _Float16.
  static_assert(DType::of<long long>() == DType::int64() && DType::of<unsigned long long>() == DType::uint64());
  static_assert(DType::of<long>() == DType::int64() && DType::of<unsigned long>() == DType::uint64());
  static_assert(DType::of<signed char>() == DType::int8() && DType::of<unsigned char>() == DType::uint8());
  static_assert(DType::of<char>() == (std::is_signed_v<char> ? DType::int8() : DType::uint8()));
  static_assert(DType::of<short>() == DType::int16() && DType::of<unsigned>() == DType::uint32());
  static_assert(DType::of<std::complex<float>>() == DType::complex64());
  static_assert(DType::of<std::complex<double>>() == DType::complex128());
#if defined(__FLT16_MAX__)
  static_assert(DType::of<_Float16>() == DType::float16());
#endif
}

TEST(DType, UnknownNamesAreInvalidArgumentAndListTheKnownOnes) {
  for (const char* bad : {"", "float", "float31", "Float32", "f4", "<f4", "complex", "int3", "x", "float32x",
                          "xint8", "float32 ", "bfloat8", "float32x99999"}) {
    SCOPED_TRACE(bad);
    TW_EXPECT_ERROR_MSG(DType::from_name(bad), ErrorCode::invalid_argument, "float8_e4m3fn");
  }
}

TEST(DType, BadLanesInNamesAreRefused) {
  // Zero lanes and sub-byte lanes that do not fill whole bytes never become a DType.
  for (const char* bad : {"float32x0", "int4x3", "float6_e2m3fnx2"}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW(DType::from_name(bad), tw::Error);
  }
}

TEST(DType, FromDlpackRejectsUnknownCodes) {
  for (int code : {18, 19, 64, 255}) {
    SCOPED_TRACE(code);
    TW_EXPECT_ERROR_MSG(DType::from_dlpack(DLDataType{static_cast<uint8_t>(code), 8, 1}), ErrorCode::unsupported,
                        "code=" + std::to_string(code));
  }
}

TEST(DType, FromDlpackRejectsBitsInvalidForTheCode) {
  const std::vector<DLDataType> bad = {
      {kDLInt, 3, 1},      {kDLInt, 0, 1},       {kDLInt, 128, 1},   {kDLUInt, 24, 1},  {kDLFloat, 8, 1},
      {kDLFloat, 128, 1},  {kDLFloat, 4, 1},     {kDLBfloat, 32, 1}, {kDLBfloat, 8, 1}, {kDLBcomplex, 64, 1},
      {kDLComplex, 16, 1}, {kDLBool, 1, 1},      {kDLBool, 16, 1},   {kDLFloat8_e4m3fn, 16, 1},
      {kDLFloat8_e5m2, 4, 1}, {kDLFloat6_e2m3fn, 8, 1}, {kDLFloat4_e2m1fn, 8, 1}, {kDLFloat8_e8m0fnu, 6, 1},
  };
  for (const auto& dt : bad) {
    SCOPED_TRACE(testing::Message() << int(dt.code) << "/" << int(dt.bits));
    TW_EXPECT_ERROR_MSG(DType::from_dlpack(dt), ErrorCode::unsupported, "bits=" + std::to_string(dt.bits));
  }
}

TEST(DType, FromDlpackRejectsOpaqueHandles) {
  for (int bits : {8, 32, 64}) {
    TW_EXPECT_ERROR_MSG(DType::from_dlpack(DLDataType{kDLOpaqueHandle, static_cast<uint8_t>(bits), 1}),
                        ErrorCode::unsupported, "opaque");
  }
}

TEST(DType, FromDlpackRejectsZeroLanesAndPartialSubbyteVectors) {
  TW_EXPECT_ERROR_MSG(DType::from_dlpack(DLDataType{kDLFloat, 32, 0}), ErrorCode::unsupported, "lanes");
  TW_EXPECT_ERROR(DType::from_dlpack(DLDataType{kDLInt, 4, 3}), ErrorCode::unsupported);
  TW_EXPECT_ERROR(DType::from_dlpack(DLDataType{kDLFloat6_e3m2fn, 6, 2}), ErrorCode::unsupported);
  // Whole bytes of sub-byte lanes and ordinary vectors are fine.
  EXPECT_EQ(DType::from_dlpack(DLDataType{kDLInt, 4, 4}).itemsize(), 2u);
  EXPECT_EQ(DType::from_dlpack(DLDataType{kDLFloat, 16, 8}).itemsize(), 16u);
}

TEST(DType, UnnamedTripleHasADescriptiveName) {
  DType d{static_cast<uint8_t>(kDLOpaqueHandle), 64, 1};
  EXPECT_NE(d.name().find("code=3"), std::string::npos) << d.name();
}

// ---- Device ----------------------------------------------------------------------------------------------------

struct DevName {
  const char* name;
  DLDeviceType type;
};
const std::vector<DevName> kDevices = {
    {"cpu", kDLCPU},         {"cuda", kDLCUDA},         {"cuda_host", kDLCUDAHost},   {"opencl", kDLOpenCL},
    {"vulkan", kDLVulkan},   {"metal", kDLMetal},       {"vpi", kDLVPI},              {"rocm", kDLROCM},
    {"rocm_host", kDLROCMHost}, {"ext_dev", kDLExtDev}, {"cuda_managed", kDLCUDAManaged}, {"oneapi", kDLOneAPI},
    {"webgpu", kDLWebGPU},   {"hexagon", kDLHexagon},   {"maia", kDLMAIA},            {"trn", kDLTrn},
    {"tpu", kDLTPU},         {"tpu_host", kDLTPUHost},  {"ascend", kDLAscend},
};

TEST(Device, FromStringParsesTypeAndId) {
  EXPECT_EQ(Device::from_string("cuda:1"), Device::cuda(1));
  EXPECT_EQ(Device::from_string("cuda"), Device::cuda(0));
  EXPECT_EQ(Device::from_string("cpu"), Device::cpu());
  EXPECT_EQ(Device::from_string("cpu:0"), Device::cpu());
  EXPECT_EQ(Device::from_string("cuda_host"), Device::cuda_host());
  EXPECT_EQ(Device::from_string("cuda_managed:3"), Device::cuda_managed(3));
  EXPECT_EQ(Device::from_string("rocm:12"), (Device{kDLROCM, 12}));
  EXPECT_EQ(Device::from_string("cuda:2147483647"), Device::cuda(2147483647));
}

TEST(Device, EveryTypeRoundTripsThroughStr) {
  for (const auto& d : kDevices) {
    SCOPED_TRACE(d.name);
    for (int32_t id : {0, 1, 5}) {
      Device dev{d.type, id};
      if (d.type == kDLCPU && id != 0) {  // the host is one device: "cpu:1" names none
        TW_EXPECT_ERROR_MSG(Device::from_string(dev.str()), ErrorCode::invalid_argument,
                            "does not exist: the host is one device");
        // a producer numbering host devices (JAX's several CPU devices) hands over host memory all the same
        EXPECT_EQ(Device::from_dlpack(dev.to_dlpack()), Device::cpu());
        continue;
      }
      EXPECT_STREQ(dev.type_name(), d.name);
      EXPECT_EQ(Device::from_string(dev.str()), dev);
      EXPECT_EQ(Device::from_string(std::string(d.name) + ":" + std::to_string(id)), dev);
      EXPECT_EQ(Device::from_dlpack(dev.to_dlpack()), dev);
    }
  }
  EXPECT_EQ(Device::cpu().str(), "cpu");
  EXPECT_EQ(Device::cuda(1).str(), "cuda:1");
  EXPECT_EQ(Device::cuda_host().str(), "cuda_host:0");
}

TEST(Device, BadStringsAreRefused) {
  for (const char* bad : {"", "gpu", "CUDA", "Cpu", "cuda:", "cuda:-1", "cuda:x", "cuda:1x", "cuda:1:2", " cuda",
                          "cuda ", "cuda: 1", ":1", "cuda:+1", "cuda:99999999999", "cuda:0x1"}) {
    SCOPED_TRACE(bad);
    TW_EXPECT_ERROR(Device::from_string(bad), ErrorCode::invalid_argument);
  }
  TW_EXPECT_ERROR_MSG(Device::from_string("gpu:0"), ErrorCode::invalid_argument, "cuda:1");
}

TEST(Device, FromDlpackRejectsUnknownTypesAndNegativeIds) {
  for (int t : {0, 5, 6, 22, 100, -1}) {
    SCOPED_TRACE(t);
    TW_EXPECT_ERROR(Device::from_dlpack(DLDevice{static_cast<DLDeviceType>(t), 0}), ErrorCode::unsupported);
  }
  TW_EXPECT_ERROR_MSG(Device::from_dlpack(DLDevice{kDLCUDA, -1}), ErrorCode::invalid_argument, "-1");
}

TEST(Device, HostAccessibility) {
  EXPECT_TRUE(Device::cpu().is_host_accessible());
  EXPECT_TRUE(Device::cuda_host().is_host_accessible());
  EXPECT_TRUE(Device::cuda_managed().is_host_accessible());
  EXPECT_TRUE((Device{kDLROCMHost, 0}).is_host_accessible());
  EXPECT_FALSE(Device::cuda(0).is_host_accessible());
  EXPECT_FALSE((Device{kDLROCM, 0}).is_host_accessible());
  EXPECT_FALSE((Device{kDLVulkan, 0}).is_host_accessible());
  EXPECT_STREQ((Device{static_cast<DLDeviceType>(99), 0}).type_name(), "unknown");
}

// ---- error codes and version ---------------------------------------------------------------------------------

TEST(Error, CodeNamesAreStableAndDistinct) {
  const std::vector<std::pair<ErrorCode, const char*>> codes = {
      {ErrorCode::invalid_argument, "invalid_argument"},
      {ErrorCode::type_mismatch, "type_mismatch"},
      {ErrorCode::out_of_range, "out_of_range"},
      {ErrorCode::overflow, "overflow"},
      {ErrorCode::unsupported, "unsupported"},
      {ErrorCode::copy_required, "copy_required"},
      {ErrorCode::device_unavailable, "device_unavailable"},
      {ErrorCode::version_mismatch, "version_mismatch"},
      {ErrorCode::read_only, "read_only"},
      {ErrorCode::internal, "internal"},
      {ErrorCode::out_of_memory, "out_of_memory"},
      {ErrorCode::timeout, "timeout"},
  };
  for (const auto& [c, n] : codes) EXPECT_STREQ(tw::error_code_name(c), n);
  tw::Error e(ErrorCode::copy_required, "needs a copy");
  EXPECT_EQ(e.code(), ErrorCode::copy_required);
  EXPECT_STREQ(e.what(), "needs a copy");
  const std::runtime_error& base = e;  // catchable as a standard exception
  EXPECT_STREQ(base.what(), "needs a copy");
}

TEST(Version, MatchesHeaders) {
  const std::string expected = std::to_string(TENSORWIRE_VERSION_MAJOR) + "." +
                               std::to_string(TENSORWIRE_VERSION_MINOR) + "." +
                               std::to_string(TENSORWIRE_VERSION_PATCH);
  EXPECT_EQ(std::string(tw::version()), expected);
}

}  // namespace
