// Tensor: ownership (from_blob / adopt / copy_of), views (slice, select, permute, transpose, view, reshape,
// expand) and the metadata they carry. Values are always read back through raw strides, never through the library's
// own copy engine, so a wrong stride or offset cannot hide behind a matching wrong copy.
#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <array>
#include <cstdint>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <span>
#include <vector>

#include "tw_test_util.hpp"

namespace {

using tw::Device;
using tw::DType;
using tw::ErrorCode;
using tw::MemoryOrder;
using tw::Tensor;

// A keep-alive whose destruction is counted.
struct Counter {
  int released = 0;
  std::shared_ptr<const void> keep_alive() {
    return std::shared_ptr<const void>(static_cast<const void*>(this), [this](const void*) { ++released; });
  }
};

std::vector<float> iota_f(size_t n, float start = 0.f) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

Tensor arange(tw::Shape shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  auto v = iota_f(static_cast<size_t>(n));
  return Tensor::copy_of(std::span<const float>(v), std::move(shape));
}

// Element at `idx`, read through the raw layout.
template <class T = float>
T at(const Tensor& t, const std::vector<int64_t>& idx) {
  EXPECT_EQ(idx.size(), t.ndim());
  int64_t off = 0;
  for (size_t i = 0; i < idx.size(); ++i) off += idx[i] * t.strides()[i];
  T v;
  std::memcpy(&v, static_cast<const char*>(t.data_ptr()) + off * static_cast<int64_t>(sizeof(T)), sizeof(T));
  return v;
}

// All elements in C order, read through the raw layout.
template <class T = float>
std::vector<T> elements(const Tensor& t) {
  std::vector<T> out;
  if (t.numel() == 0) return out;
  std::vector<int64_t> idx(t.ndim(), 0);
  for (;;) {
    out.push_back(at<T>(t, idx));
    size_t k = t.ndim();
    for (; k-- > 0;) {
      if (++idx[k] < t.shape()[k]) break;
      idx[k] = 0;
    }
    if (k == static_cast<size_t>(-1)) return out;
  }
}

// ---- ownership -------------------------------------------------------------------------------------------------

TEST(Tensor, FromBlobKeepAliveReleasedExactlyWhenTheLastViewDies) {
  Counter c;
  std::vector<float> storage = iota_f(12);
  std::optional<Tensor> t = Tensor::from_blob(storage.data(), {3, 4}, DType::float32(), Device::cpu(), c.keep_alive());
  EXPECT_EQ(t->data_ptr(), storage.data());
  std::optional<Tensor> v1 = t->slice(0, 1, 3);
  std::optional<Tensor> v2 = t->transpose(0, 1).select(0, 2);
  std::optional<Tensor> v3 = *t;  // a copy shares the buffer
  std::optional<Tensor> v4 = t->view({12}).as_readonly();
  t.reset();
  EXPECT_EQ(c.released, 0);
  v1.reset();
  v3.reset();
  EXPECT_EQ(c.released, 0);
  EXPECT_EQ(at(*v2, {1}), 6.f);  // still readable
  v2.reset();
  EXPECT_EQ(c.released, 0);
  v4.reset();
  EXPECT_EQ(c.released, 1);
}

TEST(Tensor, FromBlobKeepAliveReleasedWhenFactoryThrows) {
  Counter c;
  float x = 0;
  EXPECT_THROW(Tensor::from_blob(&x, {-1}, DType::float32(), Device::cpu(), c.keep_alive()), tw::Error);
  EXPECT_EQ(c.released, 1);
}

TEST(Tensor, DataOfMisalignedMemoryIsRefusedNotHandedOutAsATypedPointer) {
  // from_blob over an odd address is legal (the copy engine reads it bytewise), but a float* to it is undefined
  // behaviour in C++: data<float>() said nothing and returned one.
  alignas(8) unsigned char raw[64] = {};
  const float values[4] = {1.5f, -2.0f, 3.25f, 8.0f};
  std::memcpy(raw + 1, values, sizeof values);
  Tensor u = Tensor::from_blob(raw + 1, {4}, DType::float32(), tw::Device::cpu(), nullptr);
  TW_EXPECT_ERROR_MSG(u.data<float>(), ErrorCode::invalid_argument, "starts 1 byte past a 4-byte boundary");
  TW_EXPECT_ERROR_MSG(u.data<const float>(), ErrorCode::invalid_argument, "std::memcpy");
  Tensor c = u.copy();  // aligned memory, the same values
  EXPECT_EQ(c.data<const float>()[2], 3.25f);
  Tensor a = Tensor::from_blob(raw + 4, {4}, DType::float32(), tw::Device::cpu(), nullptr);
  EXPECT_EQ(static_cast<const void*>(a.data<float>()), static_cast<const void*>(raw + 4));
  EXPECT_EQ(Tensor::from_blob(raw + 1, {4}, DType::uint8(), tw::Device::cpu(), nullptr).data<uint8_t>()[0], 0);
}

TEST(Tensor, EmptyViewsKeepAnOffsetInsideTheirBuffer) {
  // Selecting along a dimension of a tensor empty in another one moved the offset anyway: outside the buffer
  // (below 0 with a negative stride), and the next operation that validates refused "byte_offset -16".
  Tensor z = Tensor::zeros({3, 0, 2}, DType::float64());
  Tensor r = z.slice(0, std::nullopt, std::nullopt, -1);
  for (const Tensor& v : {r, r.select(0, 1), z.select(0, 2), r.slice(0, 1, std::nullopt)}) {
    SCOPED_TRACE(v.shape().str() + " strides " + v.strides().str());
    EXPECT_GE(v.layout().byte_offset, 0);
    EXPECT_LE(static_cast<uint64_t>(v.layout().byte_offset), v.buffer().size());
    EXPECT_EQ(v.reshape({0}).numel(), 0);
    EXPECT_EQ(v.contiguous().numel(), 0);
  }
}

TEST(Tensor, FromBlobOfAConstPointerIsReadOnly) {
  static const float table[3] = {1.0f, 2.0f, 4.0f};  // (a const_cast was needed, and the tensor was writable)
  Tensor t = Tensor::from_blob(table, {3}, DType::float32(), Device::cpu(), nullptr);
  EXPECT_TRUE(t.readonly());
  EXPECT_EQ(t.data<const float>()[2], 4.0f);
  TW_EXPECT_ERROR(t.data<float>(), ErrorCode::read_only);
  float mutable_table[2] = {0, 0};
  EXPECT_FALSE(Tensor::from_blob(mutable_table, {2}, DType::float32(), Device::cpu(), nullptr).readonly());
  char bytes[4] = {};
  EXPECT_FALSE(Tensor::from_blob(bytes, {4}, DType::uint8(), Device::cpu(), nullptr).readonly());
  const char* cbytes = bytes;
  EXPECT_TRUE(Tensor::from_blob(cbytes, {4}, DType::uint8(), Device::cpu(), nullptr).readonly());
  // a null pointer constant, of any spelling, still means the writable overload (not ambiguous)
  EXPECT_FALSE(Tensor::from_blob(nullptr, {0}, DType::uint8(), Device::cpu(), nullptr).readonly());
  EXPECT_FALSE(Tensor::from_blob(0, {0}, DType::uint8(), Device::cpu(), nullptr).readonly());
}

TEST(Tensor, FromBlobRefusesADeviceDLPackDoesNotDefineOrANegativeId) {
  float x[4] = {};
  TW_EXPECT_ERROR_MSG(Tensor::from_blob(x, {4}, DType::float32(), tw::Device{static_cast<DLDeviceType>(99), 0}, nullptr),
                      ErrorCode::unsupported, "device type 99");
  TW_EXPECT_ERROR_MSG(Tensor::from_blob(x, {4}, DType::float32(), tw::Device::cuda(-1), nullptr),
                      ErrorCode::invalid_argument, "device id -1 is negative");
  EXPECT_EQ(Tensor::from_blob(x, {4}, DType::float32(), tw::Device::cpu(), nullptr).device(), tw::Device::cpu());
}

TEST(Tensor, FromBlobWithNegativeStridesAddressesElementZero) {
  std::vector<float> storage = iota_f(12);
  // Rows reversed: element (0, j) is the last row in memory.
  Tensor t = Tensor::from_blob(storage.data() + 8, {3, 4}, DType::float32(), Device::cpu(), nullptr, {-4, 1});
  EXPECT_EQ(t.data_ptr(), storage.data() + 8);
  EXPECT_EQ(elements(t), (std::vector<float>{8, 9, 10, 11, 4, 5, 6, 7, 0, 1, 2, 3}));
  // The buffer is the whole span, so a view back to the first row is in bounds.
  EXPECT_EQ(t.buffer().base(), storage.data());
  EXPECT_EQ(t.buffer().size(), 48u);
  EXPECT_EQ(t.byte_offset(), 32);
}

TEST(Tensor, FromBlobNullData) {
  TW_EXPECT_ERROR(Tensor::from_blob(nullptr, {2}, DType::float32(), Device::cpu(), nullptr), ErrorCode::invalid_argument);
  Tensor z = Tensor::from_blob(nullptr, {0, 3}, DType::float32(), Device::cpu(), nullptr);
  EXPECT_EQ(z.numel(), 0);
  EXPECT_EQ(z.shape().vec(), (std::vector<int64_t>{0, 3}));
}

TEST(Tensor, FromBlobValidates) {
  float x[4] = {};
  TW_EXPECT_ERROR(Tensor::from_blob(x, {2, 2}, DType::float32(), Device::cpu(), nullptr, {1}), ErrorCode::invalid_argument);
  TW_EXPECT_ERROR(Tensor::from_blob(x, {2, -2}, DType::float32(), Device::cpu(), nullptr), ErrorCode::invalid_argument);
  TW_EXPECT_ERROR(Tensor::from_blob(x, {4}, DType::float32(), Device::cpu(), nullptr, {int64_t(1) << 62}),
                  ErrorCode::overflow);
  TW_EXPECT_ERROR(Tensor::from_blob(x, {4}, DType{static_cast<uint8_t>(kDLOpaqueHandle), 64, 1}, Device::cpu(), nullptr),
                  ErrorCode::unsupported);
}

TEST(Tensor, FromBlobKeepsDeviceAndReadonly) {
  float x[6] = {};
  Tensor t = Tensor::from_blob(x, {2, 3}, DType::float32(), Device::cuda(1), nullptr, {}, true);
  EXPECT_EQ(t.device(), Device::cuda(1));
  EXPECT_TRUE(t.readonly());
  TW_EXPECT_ERROR(t.data<const float>(), ErrorCode::unsupported);  // not host-accessible
}

TEST(Tensor, AdoptIsZeroCopy) {
  std::vector<int32_t> v(1000);
  std::iota(v.begin(), v.end(), 0);
  const int32_t* before = v.data();
  Tensor t = Tensor::adopt(std::move(v), {10, 100});
  EXPECT_EQ(t.data_ptr(), before);
  EXPECT_EQ(t.dtype(), DType::int32());
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(at<int32_t>(t, {7, 42}), 742);
  // The storage outlives the vector object it came from and every view but the last.
  Tensor row = t.select(0, 9);
  t = Tensor();
  EXPECT_EQ(at<int32_t>(row, {99}), 999);
}

TEST(Tensor, AdoptWithoutAShapeIsOneDimensionalAndTakesComplex) {
  std::vector<std::complex<float>> v{{1, 2}, {3, 4}, {5, 6}};
  const void* before = v.data();
  Tensor t = Tensor::adopt(std::move(v));
  EXPECT_EQ(t.data_ptr(), before);
  EXPECT_EQ(t.shape(), (tw::Shape{3}));
  EXPECT_EQ(t.dtype(), DType::complex64());
  EXPECT_EQ(t.data<const std::complex<float>>()[2], std::complex<float>(5, 6));
  std::vector<long long> w{7, 8};
  EXPECT_EQ(Tensor::adopt(std::move(w)).dtype(), DType::int64());
}

TEST(Tensor, ToTheCpuWithAStreamIsRefused) {
  const Tensor t = Tensor::zeros({3}, DType::float32());
  TW_EXPECT_ERROR_MSG(t.to(tw::Device::cpu(), intptr_t{1}), ErrorCode::invalid_argument, "orders CUDA work");
  TW_EXPECT_ERROR_MSG(t.to(tw::Device::cpu(), intptr_t{2}, true), ErrorCode::invalid_argument, "cpu to cpu");
  EXPECT_EQ(t.to(tw::Device::cpu()).buffer_ptr(), t.buffer_ptr());
}

TEST(Tensor, AdoptRefusesWrongElementCount) {
  std::vector<double> v(6);
  TW_EXPECT_ERROR_MSG(Tensor::adopt(std::move(v), {2, 4}), ErrorCode::invalid_argument, "(2, 4)");
}

TEST(Tensor, CopyOfCopies) {
  std::vector<uint16_t> v = {1, 2, 3, 4, 5, 6};
  Tensor t = Tensor::copy_of(std::span<const uint16_t>(v), {3, 2});
  EXPECT_NE(t.data_ptr(), v.data());
  v[0] = 99;
  EXPECT_EQ(at<uint16_t>(t, {0, 0}), 1);
  EXPECT_EQ(at<uint16_t>(t, {2, 1}), 6);
  EXPECT_EQ(t.dtype(), DType::uint16());
  // The mutable-span overload too.
  std::span<uint16_t> s(v);
  EXPECT_EQ(at<uint16_t>(Tensor::copy_of(s, {6}), {0}), 99);
  TW_EXPECT_ERROR(Tensor::copy_of(std::span<const uint16_t>(v), {7}), ErrorCode::invalid_argument);
}

TEST(Tensor, BracedShapesWithSizeTVariablesCompile) {
  size_t n = 4, m = 3;
  Tensor a = Tensor::empty({n}, DType::float32());
  Tensor b = Tensor::zeros({n, m}, DType::float64());
  Tensor c = Tensor::empty({2, n}, DType::uint8(), MemoryOrder::F);
  EXPECT_EQ(a.shape().vec(), (std::vector<int64_t>{4}));
  EXPECT_EQ(b.shape().vec(), (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(c.strides().vec(), (std::vector<int64_t>{1, 2}));
  for (double x : elements<double>(b)) EXPECT_EQ(x, 0.0);
  std::vector<float> v(n * m);
  Tensor d = Tensor::adopt(std::move(v), {n, m});
  EXPECT_EQ(d.numel(), 12);
}

TEST(Tensor, EmptyIsAlignedAndZerosAreZero) {
  Tensor t = Tensor::zeros({7, 3}, DType::complex128());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data_ptr()) % 64, 0u);
  EXPECT_EQ(t.nbytes(), 7 * 3 * 16);
  const auto* p = static_cast<const unsigned char*>(t.data_ptr());
  EXPECT_TRUE(std::all_of(p, p + t.nbytes(), [](unsigned char b) { return b == 0; }));
  Tensor s = Tensor::zeros({}, DType::float32());
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(at(s, {}), 0.f);
  Tensor z = Tensor::empty({0}, DType::float32());
  EXPECT_EQ(z.numel(), 0);
}

TEST(Buffer, AllocateHonoursAlignmentAndRefusesImpossibleRequests) {
  for (size_t align : {size_t{8}, size_t{64}, size_t{4096}}) {
    auto b = tw::Buffer::allocate(100, align);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b->base()) % align, 0u) << align;
    EXPECT_EQ(b->size(), 100u);
    EXPECT_EQ(b->device(), Device::cpu());
    std::memset(b->base(), 1, 100);  // writable (AddressSanitizer checks the extent)
  }
  EXPECT_EQ(tw::Buffer::allocate(0)->size(), 0u);
  TW_EXPECT_ERROR(tw::Buffer::allocate(16, 3), ErrorCode::invalid_argument);
  TW_EXPECT_ERROR(tw::Buffer::allocate(16, 4), ErrorCode::invalid_argument);  // below sizeof(void*)
  TW_EXPECT_ERROR(tw::Buffer::allocate(std::numeric_limits<size_t>::max()), ErrorCode::overflow);
}

TEST(Tensor, UndefinedTensorThrowsOnAccess) {
  Tensor t;
  EXPECT_FALSE(t.defined());
  TW_EXPECT_ERROR(t.shape(), ErrorCode::invalid_argument);
  TW_EXPECT_ERROR(t.data_ptr(), ErrorCode::invalid_argument);
  TW_EXPECT_ERROR(t.contiguous(), ErrorCode::invalid_argument);
  TW_EXPECT_ERROR(t.slice(0, 0, 1), ErrorCode::invalid_argument);
}

TEST(Tensor, MakeChecksTheBufferBounds) {
  auto buf = tw::Buffer::allocate(64);
  tw::Layout ok{DType::float32(), {4, 4}, {4, 1}, 0, false};
  EXPECT_NO_THROW(Tensor::make(buf, ok));
  tw::Layout past{DType::float32(), {4, 4}, {4, 1}, 4, false};
  TW_EXPECT_ERROR(Tensor::make(buf, past), ErrorCode::out_of_range);
  tw::Layout below{DType::float32(), {4}, {-1}, 8, false};  // reaches 4 bytes below the base
  TW_EXPECT_ERROR(Tensor::make(buf, below), ErrorCode::out_of_range);
  tw::Layout reversed{DType::float32(), {4}, {-1}, 12, false};
  EXPECT_NO_THROW(Tensor::make(buf, reversed));
  TW_EXPECT_ERROR(Tensor::make(nullptr, ok), ErrorCode::invalid_argument);
  auto null_base = std::make_shared<tw::Buffer>(nullptr, 64, Device::cpu(), nullptr);
  TW_EXPECT_ERROR(Tensor::make(null_base, ok), ErrorCode::invalid_argument);
}

TEST(Tensor, TypedDataChecksTypeAndReadonly) {
  Tensor t = arange({2, 2});
  EXPECT_EQ(t.data<float>(), t.data_ptr());
  TW_EXPECT_ERROR(t.data<double>(), ErrorCode::type_mismatch);
  TW_EXPECT_ERROR(t.data<int32_t>(), ErrorCode::type_mismatch);
  Tensor r = t.as_readonly();
  EXPECT_TRUE(r.readonly());
  EXPECT_FALSE(t.readonly());
  TW_EXPECT_ERROR(r.data<float>(), ErrorCode::read_only);
  EXPECT_EQ(r.data<const float>(), t.data_ptr());
  // Views of a read-only tensor stay read-only.
  EXPECT_TRUE(r.slice(0, 0, 1).readonly());
  EXPECT_TRUE(r.transpose(0, 1).readonly());
}

TEST(Tensor, SizeAndByteStrides) {
  Tensor t = arange({2, 3, 4});
  EXPECT_EQ(t.size(0), 2);
  EXPECT_EQ(t.size(-1), 4);
  TW_EXPECT_ERROR(t.size(3), ErrorCode::out_of_range);
  TW_EXPECT_ERROR(t.size(-4), ErrorCode::out_of_range);
  EXPECT_EQ(t.byte_strides(), (std::vector<int64_t>{48, 16, 4}));
  EXPECT_EQ(t.slice(2, std::nullopt, std::nullopt, -2).byte_strides(), (std::vector<int64_t>{48, 16, -8}));
  // Packed sub-byte: only whole-byte strides can be stated in bytes; a dimension that never steps is exempt.
  Tensor p = Tensor::zeros({4, 6}, DType::int4()).slice(1, 0, 1);  // (4, 1) strides (6, 1)
  EXPECT_EQ(p.byte_strides(), (std::vector<int64_t>{3, 0}));
  EXPECT_EQ(Tensor::zeros({6}, DType::int4()).slice(0, 0, 6, 2).byte_strides(), (std::vector<int64_t>{1}));
  TW_EXPECT_ERROR(Tensor::zeros({4, 6}, DType::int4()).byte_strides(), ErrorCode::unsupported);
  TW_EXPECT_ERROR(Tensor::zeros({3, 3}, DType::int4()).slice(1, 0, 1).byte_strides(), ErrorCode::unsupported);
}

// ---- contiguous / copy -----------------------------------------------------------------------------------------

TEST(Tensor, ContiguousIsFreeWhenAlreadyContiguous) {
  Tensor t = arange({3, 4});
  t.metadata().set("k", 1);
  Tensor c = t.contiguous();
  EXPECT_EQ(c.data_ptr(), t.data_ptr());
  EXPECT_EQ(c.buffer_ptr(), t.buffer_ptr());
  EXPECT_EQ(c.metadata(), t.metadata());
  // Size-1 dims with odd strides are still C-contiguous: no copy.
  Tensor col = t.slice(1, 2, 3);  // shape (3, 1), strides (4, 1): not contiguous
  Tensor row = t.slice(0, 1, 2);  // shape (1, 4), strides (4, 1): contiguous
  EXPECT_EQ(row.contiguous().data_ptr(), row.data_ptr());
  EXPECT_NE(col.contiguous().data_ptr(), col.data_ptr());
}

TEST(Tensor, ContiguousCopiesWhenNeeded) {
  Tensor t = arange({3, 4});
  Tensor tt = t.transpose(0, 1);
  Tensor c = tt.contiguous();
  EXPECT_NE(c.buffer_ptr(), t.buffer_ptr());
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.shape().vec(), (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(c.strides().vec(), (std::vector<int64_t>{3, 1}));
  const float* p = static_cast<const float*>(c.data_ptr());
  EXPECT_EQ(std::vector<float>(p, p + 12), (std::vector<float>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));
  EXPECT_FALSE(c.readonly());
}

TEST(Tensor, CopyInEachOrder) {
  Tensor t = arange({2, 3, 4}).permute({2, 0, 1});  // shape (4, 2, 3), strides (1, 12, 4)
  Tensor c = t.copy(MemoryOrder::C);
  EXPECT_EQ(c.strides().vec(), (std::vector<int64_t>{6, 3, 1}));
  Tensor f = t.copy(MemoryOrder::F);
  EXPECT_EQ(f.strides().vec(), (std::vector<int64_t>{1, 4, 8}));
  Tensor a = t.copy(MemoryOrder::Any);  // keeps the dense source's dimension order
  EXPECT_EQ(a.strides().vec(), (std::vector<int64_t>{1, 12, 4}));
  for (const Tensor* x : {&c, &f, &a}) {
    EXPECT_NE(x->buffer_ptr(), t.buffer_ptr());
    EXPECT_EQ(elements(*x), elements(t));
  }
  // Any on a non-dense source falls back to C.
  Tensor g = arange({4, 6}).slice(1, 0, 6, 2);
  EXPECT_EQ(g.copy(MemoryOrder::Any).strides().vec(), (std::vector<int64_t>{3, 1}));
  // Any on a reversed tensor must not keep negative strides over a fresh buffer.
  Tensor rev = arange({5}).slice(0, std::nullopt, std::nullopt, -1);
  Tensor ra = rev.copy(MemoryOrder::Any);
  EXPECT_EQ(elements(ra), (std::vector<float>{4, 3, 2, 1, 0}));
  EXPECT_EQ(ra.strides().vec(), (std::vector<int64_t>{1}));
  // copy() of a contiguous tensor still copies.
  Tensor src = arange({3});
  EXPECT_NE(src.copy().data_ptr(), src.data_ptr());
}

// ---- slice -----------------------------------------------------------------------------------------------------

// Python's list slicing, by membership test rather than by index arithmetic.
std::vector<int64_t> py_slice(int64_t n, std::optional<int64_t> start, std::optional<int64_t> stop, int64_t step) {
  std::vector<int64_t> out;
  auto norm = [&](int64_t v) { return v < 0 ? v + n : v; };
  if (step > 0) {
    int64_t b = start ? norm(*start) : 0, e = stop ? norm(*stop) : n;
    for (int64_t i = 0; i < n; ++i)
      if (i >= b && i < e && (i - std::max<int64_t>(b, 0)) % step == 0) out.push_back(i);
  } else {
    int64_t b = start ? std::min(norm(*start), n - 1) : n - 1, e = stop ? norm(*stop) : -1;
    for (int64_t i = n - 1; i >= 0; --i)
      if (i <= b && i > e && (b - i) % (-step) == 0) out.push_back(i);
  }
  return out;
}

TEST(Tensor, SliceHandComputedCases) {
  Tensor t = arange({10});
  auto vals = [](const Tensor& x) { return elements(x); };
  // Values from Python: list(range(10))[a:b:c].
  EXPECT_EQ(vals(t.slice(0, 8, 2, -3)), (std::vector<float>{8, 5}));
  EXPECT_EQ(vals(t.slice(0, std::nullopt, std::nullopt, -1)), (std::vector<float>{9, 8, 7, 6, 5, 4, 3, 2, 1, 0}));
  EXPECT_EQ(vals(t.slice(0, -3, -100, -2)), (std::vector<float>{7, 5, 3, 1}));
  EXPECT_EQ(vals(t.slice(0, 100, std::nullopt, -4)), (std::vector<float>{9, 5, 1}));
  EXPECT_EQ(vals(t.slice(0, 2, 9, 3)), (std::vector<float>{2, 5, 8}));
  EXPECT_EQ(vals(t.slice(0, -2, std::nullopt)), (std::vector<float>{8, 9}));
  EXPECT_EQ(vals(t.slice(0, 5, 5)), (std::vector<float>{}));
  EXPECT_EQ(vals(t.slice(0, 3, 7, -1)), (std::vector<float>{}));
  EXPECT_EQ(vals(t.slice(0, std::nullopt, 0, -1)), (std::vector<float>{9, 8, 7, 6, 5, 4, 3, 2, 1}));
  // The view shares the buffer; its strides carry the step.
  Tensor r = t.slice(0, 8, 2, -3);
  EXPECT_EQ(r.buffer_ptr(), t.buffer_ptr());
  EXPECT_EQ(r.strides().vec(), (std::vector<int64_t>{-3}));
  EXPECT_EQ(r.data_ptr(), static_cast<float*>(t.data_ptr()) + 8);
}

TEST(Tensor, SliceSweepMatchesPythonSemantics) {
  for (int64_t n : {0, 1, 2, 5, 7}) {
    Tensor t = arange({n});
    std::vector<std::optional<int64_t>> bounds = {std::nullopt};
    for (int64_t b = -n - 3; b <= n + 3; ++b) bounds.push_back(b);
    for (int64_t step : {-5, -3, -2, -1, 1, 2, 3, 4, 9}) {
      for (auto start : bounds) {
        for (auto stop : bounds) {
          std::vector<float> expect;
          for (int64_t i : py_slice(n, start, stop, step)) expect.push_back(static_cast<float>(i));
          Tensor s = t.slice(0, start, stop, step);
          ASSERT_EQ(elements(s), expect) << "n=" << n << " start=" << (start ? std::to_string(*start) : "None")
                                         << " stop=" << (stop ? std::to_string(*stop) : "None") << " step=" << step;
          ASSERT_NO_THROW(s.layout().validate());
          ASSERT_NO_THROW(Tensor::make(s.buffer_ptr(), s.layout()));  // in bounds of the buffer
        }
      }
    }
  }
}

TEST(Tensor, SliceOfTwoDimsWithNegativeSteps) {
  Tensor t = arange({4, 5});
  Tensor s = t.slice(0, std::nullopt, std::nullopt, -1).slice(1, 4, 0, -2);  // rows 3..0, cols 4, 2
  EXPECT_EQ(s.shape().vec(), (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(elements(s), (std::vector<float>{19, 17, 14, 12, 9, 7, 4, 2}));
  // Negative dim index.
  EXPECT_EQ(elements(t.slice(-1, 1, 2)), (std::vector<float>{1, 6, 11, 16}));
}

TEST(Tensor, SliceWithExtremeStepsAndBounds) {
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min(), kMax = std::numeric_limits<int64_t>::max();
  Tensor t = arange({5});
  // Python: list(range(5))[::-2**63] == [4], [::2**63-1] == [0], [-2**63:2**63-1] == everything.
  EXPECT_EQ(elements(t.slice(0, std::nullopt, std::nullopt, kMin)), (std::vector<float>{4}));
  EXPECT_EQ(elements(t.slice(0, std::nullopt, std::nullopt, kMax)), (std::vector<float>{0}));
  EXPECT_EQ(elements(t.slice(0, kMin, kMax)), (std::vector<float>{0, 1, 2, 3, 4}));
  EXPECT_EQ(elements(t.slice(0, kMax, kMin, -1)), (std::vector<float>{4, 3, 2, 1, 0}));
  EXPECT_EQ(elements(t.slice(0, kMin, kMax, kMax)), (std::vector<float>{0}));
  EXPECT_EQ(elements(t.slice(0, kMax, kMin, kMin)), (std::vector<float>{4}));
  // A one-element result never steps, so a step whose stride product would overflow still gives that element.
  EXPECT_EQ(elements(t.slice(0, std::nullopt, std::nullopt, 2).slice(0, std::nullopt, std::nullopt, kMin)),
            (std::vector<float>{4}));
  EXPECT_EQ(elements(arange({0}).slice(0, std::nullopt, std::nullopt, kMin)), (std::vector<float>{}));
}

TEST(Tensor, ByteStridesOfDimensionsThatNeverStep) {
  // A size-1 dimension may carry any stride (DLPack producers do this); stating it in bytes must not overflow.
  float x[3] = {1, 2, 3};
  const int64_t huge = std::numeric_limits<int64_t>::max() / 2;
  Tensor t = Tensor::from_blob(x, {1, 3}, DType::float32(), Device::cpu(), nullptr, {huge, 1});
  std::vector<int64_t> bs = t.byte_strides();
  ASSERT_EQ(bs.size(), 2u);
  EXPECT_EQ(bs[1], 4);
  Tensor p = Tensor::from_blob(x, {1, 2}, DType::int4(), Device::cpu(), nullptr, {huge, 1});
  EXPECT_NO_THROW(p.slice(1, 0, 2, 2).byte_strides());
}

TEST(Tensor, SliceErrors) {
  Tensor t = arange({4});
  TW_EXPECT_ERROR(t.slice(0, 0, 4, 0), ErrorCode::invalid_argument);
  TW_EXPECT_ERROR(t.slice(1, 0, 4), ErrorCode::out_of_range);
  TW_EXPECT_ERROR(t.slice(-2, 0, 4), ErrorCode::out_of_range);
}

// ---- select / permute / transpose ------------------------------------------------------------------------------

TEST(Tensor, Select) {
  Tensor t = arange({3, 4});
  Tensor row = t.select(0, 1);
  EXPECT_EQ(row.shape().vec(), (std::vector<int64_t>{4}));
  EXPECT_EQ(elements(row), (std::vector<float>{4, 5, 6, 7}));
  Tensor col = t.select(1, -1);
  EXPECT_EQ(col.shape().vec(), (std::vector<int64_t>{3}));
  EXPECT_EQ(col.strides().vec(), (std::vector<int64_t>{4}));
  EXPECT_EQ(elements(col), (std::vector<float>{3, 7, 11}));
  Tensor s = t.select(0, 2).select(0, 1);
  EXPECT_EQ(s.ndim(), 0u);
  EXPECT_EQ(at(s, {}), 9.f);
  TW_EXPECT_ERROR(t.select(0, 3), ErrorCode::out_of_range);
  TW_EXPECT_ERROR(t.select(0, -4), ErrorCode::out_of_range);
  TW_EXPECT_ERROR(t.select(2, 0), ErrorCode::out_of_range);
  TW_EXPECT_ERROR(arange({0, 2}).select(0, 0), ErrorCode::out_of_range);
}

TEST(Tensor, Permute) {
  Tensor t = arange({2, 3, 4});
  Tensor p = t.permute({2, 0, 1});
  EXPECT_EQ(p.shape().vec(), (std::vector<int64_t>{4, 2, 3}));
  EXPECT_EQ(p.strides().vec(), (std::vector<int64_t>{1, 12, 4}));
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t k = 0; k < 4; ++k) ASSERT_EQ(at(p, {k, i, j}), at(t, {i, j, k}));
  EXPECT_EQ(t.permute({-1, 0, 1}).strides(), p.strides());
  TW_EXPECT_ERROR(t.permute({0, 1}), ErrorCode::invalid_argument);
  TW_EXPECT_ERROR(t.permute({0, 1, 1}), ErrorCode::invalid_argument);
  TW_EXPECT_ERROR(t.permute({0, 1, 3}), ErrorCode::out_of_range);
}

TEST(Tensor, Transpose) {
  Tensor t = arange({2, 3, 4});
  Tensor x = t.transpose(0, -1);
  EXPECT_EQ(x.shape().vec(), (std::vector<int64_t>{4, 3, 2}));
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t k = 0; k < 4; ++k) ASSERT_EQ(at(x, {k, j, i}), at(t, {i, j, k}));
  EXPECT_EQ(t.transpose(1, 1).strides(), t.strides());
  TW_EXPECT_ERROR(t.transpose(0, 3), ErrorCode::out_of_range);
}

// ---- view / reshape / expand -----------------------------------------------------------------------------------

TEST(Tensor, ViewLegal) {
  Tensor t = arange({2, 3, 4});
  Tensor v = t.view({6, 4});
  EXPECT_EQ(v.data_ptr(), t.data_ptr());
  EXPECT_EQ(v.strides().vec(), (std::vector<int64_t>{4, 1}));
  EXPECT_EQ(elements(v), elements(t));
  EXPECT_EQ(t.view({-1}).shape().vec(), (std::vector<int64_t>{24}));
  EXPECT_EQ(t.view({4, -1, 3}).shape().vec(), (std::vector<int64_t>{4, 2, 3}));
  EXPECT_EQ(elements(t.view({1, 24, 1})), elements(t));
  // A strided but chunk-compatible source: two of every six columns, split the rows.
  Tensor g = arange({4, 6}).slice(1, 0, 4, 2);  // (4, 2) strides (6, 2)
  Tensor gv = g.view({2, 2, 2});
  EXPECT_EQ(gv.strides().vec(), (std::vector<int64_t>{12, 6, 2}));
  EXPECT_EQ(elements(gv), elements(g));
  EXPECT_EQ(elements(g.view({4, 2, 1})), elements(g));
  // Every other column of rows of six is one uniform stride-2 run: flattening it needs no copy.
  Tensor e = arange({4, 6}).slice(1, 0, 6, 2);  // (4, 3) strides (6, 2)
  Tensor ev = e.view({12});
  EXPECT_EQ(ev.strides().vec(), (std::vector<int64_t>{2}));
  EXPECT_EQ(elements(ev), elements(e));
  // Transposed then split along a single old dimension.
  Tensor tt = arange({4, 6}).transpose(0, 1);  // (6, 4) strides (1, 6)
  Tensor tv = tt.view({2, 3, 4});
  EXPECT_EQ(tv.strides().vec(), (std::vector<int64_t>{3, 1, 6}));
  EXPECT_EQ(elements(tv), elements(tt));
  // Reversed 1-D splits with negative strides.
  Tensor r = arange({6}).slice(0, std::nullopt, std::nullopt, -1);
  EXPECT_EQ(elements(r.view({2, 3})), (std::vector<float>{5, 4, 3, 2, 1, 0}));
  // Zero-size.
  EXPECT_EQ(arange({0, 4}).view({4, 0, 2}).shape().vec(), (std::vector<int64_t>{4, 0, 2}));
  // Scalar <-> one element.
  EXPECT_EQ(arange({1}).view({}).ndim(), 0u);
  EXPECT_EQ(arange({}).view({1, 1}).numel(), 1);
}

TEST(Tensor, ViewIllegalNeedsCopy) {
  Tensor tt = arange({3, 4}).transpose(0, 1);
  TW_EXPECT_ERROR_MSG(tt.view({12}), ErrorCode::copy_required, "reshape");
  Tensor g = arange({4, 6}).slice(1, 0, 4, 2);  // (4, 2) strides (6, 2)
  TW_EXPECT_ERROR(g.view({8}), ErrorCode::copy_required);
  TW_EXPECT_ERROR(g.view({2, 4}), ErrorCode::copy_required);
  Tensor e = arange({3, 1}).expand({3, 4});
  TW_EXPECT_ERROR(e.view({12}), ErrorCode::copy_required);
}

TEST(Tensor, ViewBadShapes) {
  Tensor t = arange({2, 3});
  TW_EXPECT_ERROR(t.view({-1, -1}), ErrorCode::invalid_argument);
  TW_EXPECT_ERROR(t.view({4, 2}), ErrorCode::invalid_argument);
  TW_EXPECT_ERROR(t.view({-1, 4}), ErrorCode::invalid_argument);
  TW_EXPECT_ERROR(t.view({-2, 3}), ErrorCode::invalid_argument);
  TW_EXPECT_ERROR(t.view({0, -1}), ErrorCode::invalid_argument);
}

TEST(Tensor, ReshapeCopiesOnlyWhenNeeded) {
  Tensor t = arange({3, 4});
  Tensor same = t.reshape({4, 3});
  EXPECT_EQ(same.buffer_ptr(), t.buffer_ptr());
  Tensor tt = t.transpose(0, 1);
  Tensor r = tt.reshape({12});
  EXPECT_NE(r.buffer_ptr(), t.buffer_ptr());
  EXPECT_EQ(elements(r), (std::vector<float>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));
  TW_EXPECT_ERROR(tt.reshape({5}), ErrorCode::invalid_argument);  // not a copy_required masquerade
}

TEST(Tensor, Expand) {
  Tensor t = arange({3, 1});
  Tensor e = t.expand({3, 4});
  EXPECT_EQ(e.shape().vec(), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(e.strides().vec(), (std::vector<int64_t>{1, 0}));
  EXPECT_TRUE(e.has_broadcast());
  EXPECT_EQ(e.data_ptr(), t.data_ptr());
  EXPECT_EQ(elements(e), (std::vector<float>{0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2}));
  Tensor lead = t.expand({2, -1, 2});
  EXPECT_EQ(lead.shape().vec(), (std::vector<int64_t>{2, 3, 2}));
  EXPECT_EQ(lead.strides().vec(), (std::vector<int64_t>{0, 1, 0}));
  EXPECT_EQ(elements(lead), (std::vector<float>{0, 0, 1, 1, 2, 2, 0, 0, 1, 1, 2, 2}));
  EXPECT_EQ(t.expand({3, 0}).numel(), 0);
  // Contiguous copies materialise the broadcast.
  Tensor c = e.contiguous();
  EXPECT_NE(c.buffer_ptr(), e.buffer_ptr());
  EXPECT_EQ(elements(c), elements(e));
  TW_EXPECT_ERROR(t.expand({4, 4}), ErrorCode::invalid_argument);
  TW_EXPECT_ERROR(t.expand({4}), ErrorCode::invalid_argument);
  TW_EXPECT_ERROR(t.expand({-1, 3, 4}), ErrorCode::invalid_argument);
  TW_EXPECT_ERROR(t.expand({3, -2}), ErrorCode::invalid_argument);
}

// ---- metadata in views -----------------------------------------------------------------------------------------

TEST(Tensor, MetadataIsDeepCopiedIntoViews) {
  Tensor t = arange({4, 4});
  t.metadata().set("format", "xyxy");
  t.metadata().set("boxes", tw::Value::list({1, 2, tw::Value::list({3})}));
  t.set_stream(7);
  const tw::Metadata before = t.metadata();

  std::vector<Tensor> views = {t.slice(0, 1, 3), t.select(1, 2),    t.permute({1, 0}),   t.transpose(0, 1),
                               t.view({16}),     t.reshape({2, 8}), t.expand({2, 4, 4}), t.as_readonly(),
                               t.contiguous(),   t};
  const size_t n_views = views.size();
  views.push_back(t.transpose(0, 1).contiguous());  // copies carry the metadata too
  views.push_back(t.copy());
  for (size_t i = 0; i < views.size(); ++i) {
    Tensor& v = views[i];
    EXPECT_EQ(v.metadata(), before);
    if (i < n_views) {
      EXPECT_EQ(v.stream(), std::optional<intptr_t>(7));
    }
    v.metadata().set("format", "cxcywh");
    v.metadata().find("boxes")->items()[2].items().push_back(4);
    v.metadata().set("new", true);
    EXPECT_EQ(t.metadata(), before) << "mutating a view's metadata changed the source's";
  }
  // And the other way round: the source's later changes do not reach existing views.
  Tensor v = t.slice(0, 0, 1);
  t.metadata().clear();
  EXPECT_EQ(v.metadata(), before);
}

// ---- packed sub-byte views -------------------------------------------------------------------------------------

TEST(Tensor, PackedSubbyteSlicingAtOddStartsIsRefused) {
  for (DType d : {DType::int4(), DType::float4_e2m1fn(), DType::uint4()}) {
    SCOPED_TRACE(d.name());
    Tensor t = Tensor::zeros({8}, d);
    EXPECT_EQ(t.nbytes(), 4);
    TW_EXPECT_ERROR_MSG(t.slice(0, 1, 8), ErrorCode::unsupported, "byte boundary");
    TW_EXPECT_ERROR(t.slice(0, 3, std::nullopt), ErrorCode::unsupported);
    TW_EXPECT_ERROR(t.select(0, 1), ErrorCode::unsupported);
    Tensor even = t.slice(0, 2, 8);
    EXPECT_EQ(even.data_ptr(), static_cast<char*>(t.data_ptr()) + 1);
    EXPECT_EQ(even.numel(), 6);
    EXPECT_NO_THROW(t.select(0, 4));
    // Reversal starts at the last element: index 7 is odd, index 6 of a 7-element view is even.
    TW_EXPECT_ERROR(t.slice(0, std::nullopt, std::nullopt, -1), ErrorCode::unsupported);
    Tensor r = t.slice(0, 0, 7).slice(0, std::nullopt, std::nullopt, -1);
    EXPECT_EQ(r.data_ptr(), static_cast<char*>(t.data_ptr()) + 3);
    // An empty slice has no first element to misplace.
    EXPECT_NO_THROW(t.slice(0, 3, 3));
  }
  // 2-D: rows of 3 int4 start at bit 12, 24, ...: only even rows are on a byte boundary.
  Tensor m = Tensor::zeros({4, 3}, DType::int4());
  TW_EXPECT_ERROR(m.select(0, 1), ErrorCode::unsupported);
  EXPECT_NO_THROW(m.select(0, 2));
  // float6: 4 elements make 3 bytes; element 1 starts at bit 6.
  Tensor f6 = Tensor::zeros({8}, DType::float6_e2m3fn());
  EXPECT_EQ(f6.nbytes(), 6);
  TW_EXPECT_ERROR(f6.slice(0, 1, 8), ErrorCode::unsupported);
  TW_EXPECT_ERROR(f6.slice(0, 2, 8), ErrorCode::unsupported);
  EXPECT_EQ(f6.slice(0, 4, 8).data_ptr(), static_cast<char*>(f6.data_ptr()) + 3);
}

TEST(Tensor, PaddedSubbyteSlicesAnywhere) {
  // A padded int4 tensor (one element per byte), e.g. imported from DLPack with IS_SUBBYTE_TYPE_PADDED.
  auto buf = tw::Buffer::allocate(8);
  Tensor t = Tensor::make(buf, tw::Layout{DType::int4(), {8}, {1}, 0, true});
  EXPECT_TRUE(t.subbyte_padded());
  Tensor s = t.slice(0, 3, 8);
  EXPECT_EQ(s.data_ptr(), static_cast<char*>(t.data_ptr()) + 3);
  EXPECT_TRUE(s.subbyte_padded());
}

}  // namespace

// ---- the buffer cache of large host blocks ------------------------------------------------------------------------
namespace {

bool mapped(const void* p) {
  // msync fails with ENOMEM on an address that no mapping covers.
  const auto page = reinterpret_cast<uintptr_t>(p) & ~uintptr_t(4095);
  return msync(reinterpret_cast<void*>(page), 4096, MS_ASYNC) == 0;
}

struct CacheLimit {  // restores the default whatever a test does
  explicit CacheLimit(size_t bytes) { tw::set_buffer_cache_limit(bytes); }
  ~CacheLimit() { tw::set_buffer_cache_limit(tw::kDefaultBufferCacheLimit); }
};

constexpr size_t kMiB = size_t(1) << 20;

}  // namespace

TEST(BufferCache, ASameSizedAllocationReusesTheFreedBlock) {
  CacheLimit limit(256 * kMiB);
  EXPECT_EQ(tw::buffer_cache_limit(), 256 * kMiB);
  void* first;
  {
    auto b = tw::Buffer::allocate(64 * kMiB);
    first = b->base();
    std::memset(first, 1, 64 * kMiB);
  }
  const tw::BufferCacheStats before = tw::buffer_cache_stats();
  EXPECT_EQ(before.bytes, 64 * kMiB);
  EXPECT_EQ(before.blocks, 1u);
  EXPECT_TRUE(mapped(first));
  auto again = tw::Buffer::allocate(64 * kMiB - 100);  // the same 2 MiB-rounded size
  EXPECT_EQ(again->base(), first);
  EXPECT_EQ(again->size(), 64 * kMiB - 100);
  EXPECT_EQ(tw::buffer_cache_stats().hits, before.hits + 1);
  EXPECT_EQ(tw::buffer_cache_stats().bytes, 0u);
  auto other = tw::Buffer::allocate(40 * kMiB);  // another size: fresh memory
  EXPECT_NE(other->base(), first);
  EXPECT_EQ(tw::buffer_cache_stats().misses, before.misses + 1);
}

TEST(BufferCache, ZeroDisablesItAndMemoryReturnsToTheSystem) {
  CacheLimit limit(0);
  void* p;
  {
    auto b = tw::Buffer::allocate(48 * kMiB);
    p = b->base();
    EXPECT_TRUE(mapped(p));
  }
  EXPECT_EQ(tw::buffer_cache_stats().bytes, 0u);
  EXPECT_FALSE(mapped(p));
}

TEST(BufferCache, TheLeastRecentlyFreedGoFirstAndLoweringTheLimitEvicts) {
  CacheLimit limit(100 * kMiB);
  void *a, *b;
  {
    auto x = tw::Buffer::allocate(64 * kMiB);
    auto y = tw::Buffer::allocate(64 * kMiB);
    a = x->base();
    b = y->base();
    x.reset();  // cached
    y.reset();  // evicts x: 128 MiB would exceed 100
  }
  EXPECT_EQ(tw::buffer_cache_stats().bytes, 64 * kMiB);
  EXPECT_FALSE(mapped(a));
  EXPECT_TRUE(mapped(b));
  tw::set_buffer_cache_limit(32 * kMiB);
  EXPECT_EQ(tw::buffer_cache_stats().bytes, 0u);
  EXPECT_FALSE(mapped(b));
  {
    auto big = tw::Buffer::allocate(64 * kMiB);  // larger than the limit: never kept
    a = big->base();
  }
  EXPECT_FALSE(mapped(a));
}

TEST(BufferCache, ContiguousInALoopWritesIntoWarmMemory) {
  CacheLimit limit(256 * kMiB);
  Tensor src = Tensor::zeros({2048, 4096}, DType::float32()).transpose(0, 1);  // 32 MiB, strided
  const uint64_t hits = tw::buffer_cache_stats().hits;
  for (int i = 0; i < 3; ++i) {
    Tensor out = src.contiguous();
    EXPECT_TRUE(out.is_contiguous());
  }
  EXPECT_GE(tw::buffer_cache_stats().hits, hits + 2);
}
