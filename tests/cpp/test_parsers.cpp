// Parsers of foreign descriptions: NumPy typestr, PEP 3118 buffer formats, and whole array-interface descriptions.
// All of them read untrusted input, so refusals are tested as carefully as acceptances.
#include <bit>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "tw_test_util.hpp"

namespace {

using tw::DType;
using tw::ErrorCode;
using tw::InterfaceDesc;
using tw::ParsedType;

static_assert(std::endian::native == std::endian::little, "the byteswap expectations below assume little-endian");

// ---- typestr ---------------------------------------------------------------------------------------------------

TEST(Typestr, Accepted) {
  struct C {
    const char* s;
    DType d;
    size_t itemsize;
    bool byteswap;
  };
  const std::vector<C> cases = {
      {"<f4", DType::float32(), 4, false},    {">f4", DType::float32(), 4, true},
      {"=f8", DType::float64(), 8, false},    {"<f2", DType::float16(), 2, false},
      {">i8", DType::int64(), 8, true},       {"<i8", DType::int64(), 8, false},
      {"|i1", DType::int8(), 1, false},       {">i1", DType::int8(), 1, false},  // one byte has no order
      {"<u2", DType::uint16(), 2, false},     {">u4", DType::uint32(), 4, true},
      {"|u1", DType::uint8(), 1, false},      {"|b1", DType::boolean(), 1, false},
      {"<c8", DType::complex64(), 8, false},  {"<c16", DType::complex128(), 16, false},
      {">c16", DType::complex128(), 16, true}, {"<i2", DType::int16(), 2, false},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.s);
    ParsedType p = tw::parse_typestr(c.s);
    EXPECT_EQ(p.dtype, c.d);
    EXPECT_EQ(p.itemsize, c.itemsize);
    EXPECT_EQ(p.byteswap, c.byteswap);
  }
}

TEST(Typestr, Refused) {
  for (const char* s : {"<V2", "|V1", "|O8", "|S5", "<U3", "|a1", "<M8", "<m8", "<f16", "<f1", "<c4", "<c32",
                        "|b2", "<i3", "<i16", "<u0", "f4", "<f", "", "<", "x<f4", "<f4 ", "<f-4", "<f+4", "<q8",
                        "?f4", "<f4x", "<F4", "<f99999999999999999999"}) {
    SCOPED_TRACE(s);
    TW_EXPECT_ERROR_MSG(tw::parse_typestr(s), ErrorCode::unsupported, std::string("'") + s + "'");
  }
  // NumPy's object typestr has no size: it was told to have one ("expected <byteorder><kind><size>").
  for (const char* s : {"|O", "|O8", "<O"}) {
    SCOPED_TRACE(s);
    TW_EXPECT_ERROR_MSG(tw::parse_typestr(s), ErrorCode::unsupported, "Python object arrays hold references");
  }
}

// ---- PEP 3118 buffer formats -----------------------------------------------------------------------------------

TEST(BufferFormat, Accepted) {
  struct C {
    const char* f;
    int64_t itemsize;
    DType d;
    bool byteswap;
  };
  const std::vector<C> cases = {
      {"f", 4, DType::float32(), false},   {"<f", 4, DType::float32(), false}, {">f", 4, DType::float32(), true},
      {"!f", 4, DType::float32(), true},   {"=f", 4, DType::float32(), false}, {"@f", 4, DType::float32(), false},
      {"d", 8, DType::float64(), false},   {"<d", 8, DType::float64(), false}, {"e", 2, DType::float16(), false},
      {"<e", 2, DType::float16(), false},  {"=e", 2, DType::float16(), false}, {"?", 1, DType::boolean(), false},
      {"b", 1, DType::int8(), false},      {"B", 1, DType::uint8(), false},    {">B", 1, DType::uint8(), false},
      {"h", 2, DType::int16(), false},     {"H", 2, DType::uint16(), false},   {"i", 4, DType::int32(), false},
      {"I", 4, DType::uint32(), false},    {"!I", 4, DType::uint32(), true},   {">i", 4, DType::int32(), true},
      {"q", 8, DType::int64(), false},     {"Q", 8, DType::uint64(), false},   {"Zf", 8, DType::complex64(), false},
      {"Zd", 16, DType::complex128(), false}, {"<Zd", 16, DType::complex128(), false},
      {"1f", 4, DType::float32(), false},  {"<1d", 8, DType::float64(), false},
      // 'l' is 4 bytes with standard sizes and native (8 on LP64) otherwise.
      {"=l", 4, DType::int32(), false},    {"<l", 4, DType::int32(), false},   {"<L", 4, DType::uint32(), false},
      {"l", 8, DType::int64(), false},     {"@l", 8, DType::int64(), false},   {"L", 8, DType::uint64(), false},
      {"n", 8, DType::int64(), false},     {"N", 8, DType::uint64(), false},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.f);
    ParsedType p = tw::parse_buffer_format(c.f, c.itemsize);
    EXPECT_EQ(p.dtype, c.d);
    EXPECT_EQ(p.itemsize, static_cast<size_t>(c.itemsize));
    EXPECT_EQ(p.byteswap, c.byteswap);
  }
}

TEST(BufferFormat, ItemsizeMismatchRefused) {
  TW_EXPECT_ERROR_MSG(tw::parse_buffer_format("f", 8), ErrorCode::unsupported, "itemsize 8");
  TW_EXPECT_ERROR(tw::parse_buffer_format("=l", 8), ErrorCode::unsupported);
  TW_EXPECT_ERROR(tw::parse_buffer_format("l", 4), ErrorCode::unsupported);
  TW_EXPECT_ERROR(tw::parse_buffer_format("Zf", 4), ErrorCode::unsupported);
  TW_EXPECT_ERROR(tw::parse_buffer_format("B", 0), ErrorCode::unsupported);
  TW_EXPECT_ERROR(tw::parse_buffer_format("d", -8), ErrorCode::unsupported);
}

TEST(BufferFormat, Refused) {
  const std::vector<std::pair<const char*, int64_t>> cases = {
      {"T{f:x:f:y:}", 8}, {"T{d}", 8},  {"{f}", 4},  {"g", 16},  {"Zg", 32}, {"P", 8},  {"c", 1},   {"s", 1},
      {"5s", 5},          {"p", 1},     {"2f", 8},   {"ff", 8},  {"", 1},    {"<", 4},  {"x", 1},   {"<n", 8},
      {"=N", 8},          {"O", 8},     {"w", 4},    {"Z", 8},   {"f ", 4},  {"<<f", 4}, {"(2)f", 8}, {"u", 4},
  };
  for (auto [f, isz] : cases) {
    SCOPED_TRACE(f);
    TW_EXPECT_ERROR_MSG(tw::parse_buffer_format(f, isz), ErrorCode::unsupported, std::string("'") + f + "'");
  }
}

// ---- validate_interface ----------------------------------------------------------------------------------------

InterfaceDesc desc(std::string typestr, std::vector<int64_t> shape,
                   std::optional<std::vector<int64_t>> byte_strides = std::nullopt, uintptr_t data = 0x10000) {
  InterfaceDesc d;
  d.typestr = std::move(typestr);
  d.shape = std::move(shape);
  d.byte_strides = std::move(byte_strides);
  d.data = data;
  return d;
}

TEST(Interface, CContiguousWithoutStrides) {
  auto r = tw::validate_interface(desc("<f4", {2, 3}));
  EXPECT_EQ(r.layout.dtype, DType::float32());
  EXPECT_EQ(r.layout.shape.vec(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(r.layout.strides.vec(), (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(r.layout.byte_offset, 0);
  EXPECT_EQ(r.span.begin, 0);
  EXPECT_EQ(r.span.end, 24);
  EXPECT_FALSE(r.byteswap);
  EXPECT_TRUE(tw::validate_interface(desc(">f4", {2})).byteswap);
}

TEST(Interface, ByteStridesBecomeElementStrides) {
  auto r = tw::validate_interface(desc("<f8", {3, 4}, std::vector<int64_t>{8, 24}));
  EXPECT_EQ(r.layout.strides.vec(), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(r.span.end, 8 * (2 + 9 + 1));
  // Negative strides: byte_offset is the distance from the lowest element to element 0.
  InterfaceDesc d = desc("<i2", {4}, std::vector<int64_t>{-2});
  d.buffer_before = 6;
  d.buffer_extent = 2;
  auto n = tw::validate_interface(d);
  EXPECT_EQ(n.layout.strides.vec(), (std::vector<int64_t>{-1}));
  EXPECT_EQ(n.span.begin, -6);
  EXPECT_EQ(n.span.end, 2);
  EXPECT_EQ(n.layout.byte_offset, 6);
}

TEST(Interface, StridesNotAMultipleOfTheItemsizeAreRefused) {
  TW_EXPECT_ERROR_MSG(tw::validate_interface(desc("<f4", {3, 2}, std::vector<int64_t>{6, 4})), ErrorCode::unsupported,
                      "multiple");
  TW_EXPECT_ERROR(tw::validate_interface(desc("<f8", {3}, std::vector<int64_t>{-12})), ErrorCode::unsupported);
  // ...unless the dimension never steps.
  auto r = tw::validate_interface(desc("<f4", {1, 3}, std::vector<int64_t>{7, 4}));
  EXPECT_EQ(r.layout.strides[1], 1);
}

TEST(Interface, MasksAreRefused) {
  InterfaceDesc d = desc("<f4", {3});
  d.has_mask = true;
  TW_EXPECT_ERROR_MSG(tw::validate_interface(d), ErrorCode::unsupported, "mask");
}

TEST(Interface, SpanOutsideTheBufferIsRefused) {
  InterfaceDesc d = desc("<f4", {2, 3});
  d.buffer_extent = 23;  // one byte short
  TW_EXPECT_ERROR_MSG(tw::validate_interface(d), ErrorCode::out_of_range, "[0, 24)");
  d.buffer_extent = 24;
  EXPECT_NO_THROW(tw::validate_interface(d));
  // Negative strides need room before the first element.
  InterfaceDesc n = desc("<f4", {3}, std::vector<int64_t>{-4});
  n.buffer_extent = 4;
  n.buffer_before = 4;
  TW_EXPECT_ERROR(tw::validate_interface(n), ErrorCode::out_of_range);
  n.buffer_before = 8;
  EXPECT_NO_THROW(tw::validate_interface(n));
  // No extent given: nothing to check against.
  EXPECT_NO_THROW(tw::validate_interface(desc("<f4", {1000}, std::vector<int64_t>{400})));
}

TEST(Interface, NullDataWithElementsIsRefusedZeroSizeIsAccepted) {
  TW_EXPECT_ERROR_MSG(tw::validate_interface(desc("<f4", {2}, std::nullopt, 0)), ErrorCode::invalid_argument, "data pointer");
  auto r = tw::validate_interface(desc("<f4", {0, 5}, std::nullopt, 0));
  EXPECT_EQ(r.layout.numel(), 0);
  EXPECT_EQ(r.span.size(), 0);
  EXPECT_EQ(r.layout.byte_offset, 0);
  InterfaceDesc z = desc("<f4", {0}, std::nullopt, 0);
  z.buffer_extent = 0;
  EXPECT_NO_THROW(tw::validate_interface(z));
}

TEST(Interface, MalformedDescriptionsAreRefused) {
  TW_EXPECT_ERROR(tw::validate_interface(desc("<f4", {2, -3})), ErrorCode::invalid_argument);
  TW_EXPECT_ERROR(tw::validate_interface(desc("<f4", {2, 3}, std::vector<int64_t>{4})), ErrorCode::invalid_argument);
  TW_EXPECT_ERROR(tw::validate_interface(desc("<V2", {2})), ErrorCode::unsupported);
  TW_EXPECT_ERROR(tw::validate_interface(desc("<f4", std::vector<int64_t>(65, 1))), ErrorCode::invalid_argument);
  TW_EXPECT_ERROR(tw::validate_interface(desc("<f4", {int64_t(1) << 40, int64_t(1) << 40})), ErrorCode::overflow);
  TW_EXPECT_ERROR(tw::validate_interface(desc("<f4", {3}, std::vector<int64_t>{int64_t(1) << 62})), ErrorCode::overflow);
  // Elements that would wrap around the address space.
  TW_EXPECT_ERROR(tw::validate_interface(desc("<f4", {3}, std::vector<int64_t>{-4}, 4)), ErrorCode::out_of_range);
  TW_EXPECT_ERROR(tw::validate_interface(desc("<f4", {3}, std::nullopt, UINTPTR_MAX - 4)), ErrorCode::out_of_range);
}

// ml_dtypes types reach NumPy's array interface as void typestrs ('<V2' for bfloat16); the binding passes the real
// dtype beside the typestr, whose byte order and size must still be honoured.
TEST(Interface, DtypeOverrideOfVoidTypestrs) {
  InterfaceDesc d = desc("<V2", {3});
  d.dtype = DType::bfloat16();
  auto r = tw::validate_interface(d);
  EXPECT_EQ(r.layout.dtype, DType::bfloat16());
  EXPECT_FALSE(r.byteswap);
  EXPECT_FALSE(r.layout.subbyte_padded);
  EXPECT_EQ(r.span.end, 6);
  d.typestr = "|V2";
  EXPECT_FALSE(tw::validate_interface(d).byteswap);
  // Sub-byte types arrive one per byte.
  InterfaceDesc i4 = desc("|V1", {4}, std::vector<int64_t>{2});
  i4.dtype = DType::int4();
  auto ri4 = tw::validate_interface(i4);
  EXPECT_TRUE(ri4.layout.subbyte_padded);
  EXPECT_EQ(ri4.layout.strides.vec(), (std::vector<int64_t>{2}));
  EXPECT_EQ(ri4.span.end, 7);
  InterfaceDesc f8 = desc("|V1", {2});
  f8.dtype = DType::float8_e4m3fn();
  EXPECT_EQ(tw::validate_interface(f8).layout.dtype, DType::float8_e4m3fn());
}

TEST(Interface, DtypeOverrideKeepsTheTypestrsByteOrder) {
  // A byte-swapped bfloat16 array: importing it without a swap would silently corrupt every value.
  InterfaceDesc d = desc(">V2", {3});
  d.dtype = DType::bfloat16();
  EXPECT_TRUE(tw::validate_interface(d).byteswap);
  // One-byte items have no byte order.
  InterfaceDesc f8 = desc(">V1", {2});
  f8.dtype = DType::float8_e5m2();
  EXPECT_FALSE(tw::validate_interface(f8).byteswap);
}

TEST(Interface, DtypeOverrideRefusesMismatchedTypestrs) {
  for (const char* ts : {"|V1", "<V4", "<V", "V2", "", "<V2x", "xV2", "<V-2"}) {
    SCOPED_TRACE(ts);
    InterfaceDesc d = desc(ts, {3});
    d.dtype = DType::bfloat16();
    EXPECT_THROW(tw::validate_interface(d), tw::Error);
  }
  InterfaceDesc bad = desc("<V4", {3});
  bad.dtype = DType{static_cast<uint8_t>(kDLFloat), 8, 1};  // no such dtype
  TW_EXPECT_ERROR(tw::validate_interface(bad), ErrorCode::unsupported);
}

TEST(Interface, Versions) {
  InterfaceDesc d = desc("<f4", {2});
  d.version = 2;
  TW_EXPECT_ERROR(tw::validate_interface(d), ErrorCode::version_mismatch);
  d.version = 4;
  TW_EXPECT_ERROR(tw::validate_interface(d), ErrorCode::version_mismatch);
  d.protocol = "__cuda_array_interface__";
  d.device = tw::Device::cuda(0);
  for (int v : {2, 3}) {
    d.version = v;
    EXPECT_NO_THROW(tw::validate_interface(d)) << v;
  }
  d.version = 4;
  TW_EXPECT_ERROR_MSG(tw::validate_interface(d), ErrorCode::version_mismatch, "__cuda_array_interface__");
  d.version = 1;
  TW_EXPECT_ERROR(tw::validate_interface(d), ErrorCode::version_mismatch);
}

}  // namespace

// The writers are the parsers' inverses: every dtype a writer names parses back to itself, natively ordered.
TEST(Writers, RoundTripThroughTheParsers) {
  const DType all[] = {DType::boolean(), DType::int8(),    DType::int16(),      DType::int32(),      DType::int64(),
                       DType::uint8(),   DType::uint16(),  DType::uint32(),     DType::uint64(),     DType::float16(),
                       DType::float32(), DType::float64(), DType::complex64(),  DType::complex128()};
  for (DType d : all) {
    SCOPED_TRACE(d.name());
    const std::string ts = tw::typestr_of(d);
    ASSERT_FALSE(ts.empty());
    const tw::ParsedType p = tw::parse_typestr(ts);
    EXPECT_EQ(p.dtype, d);
    EXPECT_FALSE(p.byteswap);
    const char* fmt = tw::buffer_format_of(d);
    ASSERT_NE(fmt, nullptr);
    EXPECT_EQ(tw::parse_buffer_format(fmt, static_cast<int64_t>(d.itemsize())).dtype, d);
  }
  // NumPy has these only through ml_dtypes: no typestr, no struct code.
  for (DType d : {DType::bfloat16(), DType::float8_e4m3fn(), DType::int4(), DType::complex32(), DType::bcomplex32()}) {
    SCOPED_TRACE(d.name());
    EXPECT_EQ(tw::typestr_of(d), "");
    EXPECT_EQ(tw::buffer_format_of(d), nullptr);
  }
  EXPECT_EQ(tw::typestr_of(DType{kDLFloat, 32, 4}), "");
}
