// The CUDA layer on a real device, through the C++ API: allocation on cuda:0 and in pinned host memory; host ->
// device -> host round trips, bit-exact, for every element size (1, 2, 4, 8, 16 bytes) over every layout family
// (contiguous, transposed, steps 2 and 3, negative strides, stride 0, offsets, rank 0, rank 1, 5-D permuted, zero
// size); the same views taken on the device and brought back or made contiguous there; the copy policy of
// Tensor::to (copy=nullopt/true/false, same and other device), explicit default streams, pin(), the pools' counters
// and an invalid device index.
//
// Every test skips on a machine without a CUDA device, naming why (tw::cuda::status()). TW_REQUIRE_CUDA=1 turns
// that skip into a failure, and TW_EXPECT_CUDA_KERNELS=1 requires the strided kernels: scripts/test-gpu.sh sets
// both on the GPU machine, so a driver that fails to load there cannot pass as a run of skips.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "tensorwire/cuda.hpp"
#include "tw_test_cuda.hpp"
#include "tw_test_util.hpp"

namespace {

using tw::Device;
using tw::DType;
using tw::ErrorCode;
using tw::MemoryOrder;
using tw::Shape;
using tw::Tensor;

using tw_test::env_is_one;

constexpr uint32_t kSeed = 20240917;

// A new C-contiguous host tensor of random bytes (fixed seed: every run sees the same data).
Tensor random_host(const Shape& shape, DType dtype, uint32_t seed, MemoryOrder order = MemoryOrder::C) {
  Tensor t = Tensor::empty(shape, dtype, order);
  std::mt19937 rng(seed);
  auto* p = static_cast<unsigned char*>(t.data_ptr());
  const auto n = static_cast<size_t>(t.nbytes());
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<unsigned char>(rng() & 0xFFu);
  return t;
}

// Same shape and dtype, and every element the same bytes, walking each tensor by its own strides (so any two
// layouts compare). Both must be host-accessible.
::testing::AssertionResult same_elements(const Tensor& a, const Tensor& b) {
  if (!(a.shape() == b.shape()))
    return ::testing::AssertionFailure() << "shapes differ: " << a.shape().str() << " vs " << b.shape().str();
  if (!(a.dtype() == b.dtype()))
    return ::testing::AssertionFailure() << "dtypes differ: " << a.dtype().name() << " vs " << b.dtype().name();
  if (!a.device().is_host_accessible() || !b.device().is_host_accessible())
    return ::testing::AssertionFailure() << "not host-accessible: " << a.device().str() << ", " << b.device().str();
  const size_t nd = a.ndim();
  for (size_t d = 0; d < nd; ++d)
    if (a.shape()[d] == 0) return ::testing::AssertionSuccess();
  const auto item = static_cast<int64_t>(a.dtype().itemsize());
  const auto* pa = static_cast<const unsigned char*>(a.data_ptr());
  const auto* pb = static_cast<const unsigned char*>(b.data_ptr());
  std::vector<int64_t> idx(nd, 0);
  for (int64_t n = 0;; ++n) {
    int64_t oa = 0;
    int64_t ob = 0;
    for (size_t d = 0; d < nd; ++d) {
      oa += idx[d] * a.strides()[d];
      ob += idx[d] * b.strides()[d];
    }
    if (std::memcmp(pa + oa * item, pb + ob * item, static_cast<size_t>(item)) != 0) {
      auto r = ::testing::AssertionFailure() << "element " << n << " (index";
      for (int64_t i : idx) r << ' ' << i;
      return r << ") differs";
    }
    bool done = true;
    for (size_t k = nd; k-- > 0;) {
      if (++idx[k] < a.shape()[k]) {
        done = false;
        break;
      }
      idx[k] = 0;
    }
    if (done) return ::testing::AssertionSuccess();
  }
}

// Runs `fn`; when the library was built without its strided kernels and `fn` throws Error(unsupported) (the
// documented refusal of a layout the driver's dense copies cannot express), returns nullopt instead.
std::optional<Tensor> unless_kernels_missing(const std::function<Tensor()>& fn, std::string& why) {
  try {
    return fn();
  } catch (const tw::Error& e) {
    if (e.code() == ErrorCode::unsupported && !tw::cuda::kernels_built()) {
      why = std::string("this build has no strided CUDA kernels: ") + e.what();
      return std::nullopt;
    }
    throw;
  }
}

// A pinned (or device) result of to() is ordered on its stream: wait for it before the host reads it.
void wait_for(const Tensor& t) { tw::cuda::synchronize_stream(t.stream().value_or(tw::cuda::kLegacyStream)); }

// ---- layouts: a base shape and the view taken of it ----------------------------------------------------------

enum class View {
  contiguous,
  transposed,
  step2,
  step3,
  reversed,
  broadcast,
  offset_rows,
  offset_window,
  rank0,
  rank1,
  permuted5d,
  zero_size,
  large_transposed,
};

struct ViewSpec {
  const char* name;
  Shape base;
  std::function<Tensor(const Tensor&)> take;
};

ViewSpec spec(View v) {
  switch (v) {
    case View::contiguous:
      return {"contiguous", {6, 7}, [](const Tensor& t) { return t; }};
    case View::transposed:
      return {"transposed", {5, 8}, [](const Tensor& t) { return t.permute({1, 0}); }};
    case View::step2:
      return {"step2", {9, 10}, [](const Tensor& t) {
                return t.slice(0, std::nullopt, std::nullopt, 2).slice(1, 1, std::nullopt, 2);
              }};
    case View::step3:
      return {"step3", {10, 11}, [](const Tensor& t) {
                return t.slice(0, 1, std::nullopt, 3).slice(1, std::nullopt, std::nullopt, 3);
              }};
    case View::reversed:
      return {"reversed", {7, 6}, [](const Tensor& t) {
                return t.slice(0, std::nullopt, std::nullopt, -1).slice(1, 4, std::nullopt, -1);
              }};
    case View::broadcast:  // a new leading dimension and a size-1 dimension, both stride 0
      return {"broadcast", {5, 1}, [](const Tensor& t) { return t.expand({3, 5, 4}); }};
    case View::offset_rows:  // dense, starting at a byte offset
      return {"offset_rows", {8, 9}, [](const Tensor& t) { return t.slice(0, 3, 7); }};
    case View::offset_window:  // an offset and gaps between rows
      return {"offset_window", {8, 9}, [](const Tensor& t) { return t.slice(0, 2, 7).slice(1, 3, 8); }};
    case View::rank0:  // a scalar at an offset
      return {"rank0", {5}, [](const Tensor& t) { return t.select(0, 3); }};
    case View::rank1:
      return {"rank1", {257}, [](const Tensor& t) { return t; }};
    case View::permuted5d:
      return {"permuted5d", {2, 3, 4, 5, 6}, [](const Tensor& t) { return t.permute({4, 2, 0, 3, 1}); }};
    case View::zero_size:
      return {"zero_size", {3, 0, 2}, [](const Tensor& t) { return t.permute({2, 0, 1}); }};
    case View::large_transposed:  // big enough for the multi-threaded and bulk paths
      return {"large_transposed", {300, 517}, [](const Tensor& t) { return t.permute({1, 0}); }};
  }
  return {"?", {1}, [](const Tensor& t) { return t; }};
}

const DType kDTypes[] = {DType::uint8(), DType::float16(), DType::float32(), DType::float64(), DType::complex128()};
const View kViews[] = {View::contiguous,  View::transposed,    View::step2, View::step3, View::reversed,
                       View::broadcast,   View::offset_rows,   View::offset_window,      View::rank0,
                       View::rank1,       View::permuted5d,    View::zero_size,          View::large_transposed};

class RoundTrip : public ::testing::TestWithParam<std::tuple<DType, View>> {
 protected:
  Tensor host_base() const {
    const auto [dt, v] = GetParam();
    return random_host(spec(v).base, dt, kSeed + static_cast<uint32_t>(v) * 31u + static_cast<uint32_t>(dt.bits));
  }
  Tensor host_view() const { return spec(std::get<1>(GetParam())).take(host_base()); }
};

TEST_P(RoundTrip, HostViewToDeviceAndBackIsBitExact) {
  TW_NEED_CUDA();
  const Tensor src = host_view();
  const Tensor dev = src.to(Device::cuda(0));
  EXPECT_EQ(dev.device(), Device::cuda(0));
  EXPECT_EQ(dev.shape(), src.shape());
  EXPECT_EQ(dev.dtype(), src.dtype());
  EXPECT_NE(dev.buffer_ptr(), src.buffer_ptr());
  const Tensor back = dev.to(Device::cpu());
  EXPECT_EQ(back.device(), Device::cpu());
  EXPECT_TRUE(same_elements(src, back));
}

TEST_P(RoundTrip, ThroughPinnedMemoryIsBitExact) {
  TW_NEED_CUDA();
  const Tensor src = host_view();
  const Tensor pinned = src.pin();
  EXPECT_TRUE(pinned.pinned());
  const Tensor dev = pinned.to(Device::cuda(0));
  const Tensor back = dev.to(Device::cuda_host());  // host memory: returns with the data there
  EXPECT_TRUE(back.pinned());
  wait_for(back);
  EXPECT_TRUE(same_elements(src, back));
}

TEST_P(RoundTrip, DeviceViewToHostIsBitExact) {
  TW_NEED_CUDA();
  const Tensor base = host_base();
  const Tensor dev_base = base.to(Device::cuda(0));
  const ViewSpec s = spec(std::get<1>(GetParam()));
  const Tensor dev_view = s.take(dev_base);
  EXPECT_EQ(dev_view.device(), Device::cuda(0));
  EXPECT_EQ(dev_view.buffer_ptr(), dev_base.buffer_ptr());  // a view on the device: nothing copied
  std::string why;
  const std::optional<Tensor> back = unless_kernels_missing([&] { return dev_view.to(Device::cpu()); }, why);
  if (!back) GTEST_SKIP() << why;
  EXPECT_TRUE(same_elements(s.take(base), *back));
}

TEST_P(RoundTrip, DeviceContiguousEqualsHostContiguous) {
  TW_NEED_CUDA();
  const Tensor base = host_base();
  const ViewSpec s = spec(std::get<1>(GetParam()));
  const Tensor dev_view = s.take(base.to(Device::cuda(0)));
  std::string why;
  const std::optional<Tensor> dev_c = unless_kernels_missing([&] { return dev_view.contiguous(); }, why);
  if (!dev_c) GTEST_SKIP() << why;
  EXPECT_EQ(dev_c->device(), Device::cuda(0));
  EXPECT_TRUE(dev_c->is_contiguous());
  if (dev_view.is_contiguous()) {
    EXPECT_EQ(dev_c->buffer_ptr(), dev_view.buffer_ptr());  // already: no copy
  }
  const Tensor host_c = s.take(base).contiguous();
  const Tensor back = dev_c->to(Device::cpu());
  ASSERT_TRUE(back.is_contiguous());
  EXPECT_TRUE(same_elements(host_c, back));
  EXPECT_EQ(std::memcmp(back.data_ptr(), host_c.data_ptr(), static_cast<size_t>(host_c.nbytes())), 0);
}

TEST_P(RoundTrip, DeviceToDeviceCopyIsBitExact) {
  TW_NEED_CUDA();
  const Tensor base = host_base();
  const ViewSpec s = spec(std::get<1>(GetParam()));
  const Tensor dev_view = s.take(base.to(Device::cuda(0)));
  std::string why;
  const std::optional<Tensor> copied =
      unless_kernels_missing([&] { return dev_view.to(Device::cuda(0), std::nullopt, true); }, why);
  if (!copied) GTEST_SKIP() << why;
  EXPECT_EQ(copied->device(), Device::cuda(0));
  EXPECT_NE(copied->buffer_ptr(), dev_view.buffer_ptr());
  EXPECT_TRUE(same_elements(s.take(base), copied->to(Device::cpu())));
}

std::string round_trip_name(const ::testing::TestParamInfo<std::tuple<DType, View>>& info) {
  return std::get<0>(info.param).name() + "_" + spec(std::get<1>(info.param)).name;
}

INSTANTIATE_TEST_SUITE_P(EveryItemSizeAndLayout, RoundTrip,
                         ::testing::Combine(::testing::ValuesIn(kDTypes), ::testing::ValuesIn(kViews)),
                         round_trip_name);

// ---- the device itself ----------------------------------------------------------------------------------------

TEST(CudaDevice, SaysWhatItIs) {
  TW_NEED_CUDA();
  EXPECT_GE(tw::cuda::device_count(), 1);
  EXPECT_GE(tw::cuda::driver_version(), 1000);
  EXPECT_TRUE(tw::cuda::driver_available());
  EXPECT_EQ(tw::cuda::driver_status(), "");
  EXPECT_FALSE(tw::cuda::status().empty());
  EXPECT_NE(tw::cuda::status().find("CUDA"), std::string::npos) << tw::cuda::status();
}

TEST(CudaDevice, KernelsAreBuiltWhenTheBuildHadNvcc) {
  TW_NEED_CUDA();
  if (!env_is_one("TW_EXPECT_CUDA_KERNELS")) GTEST_SKIP() << "TW_EXPECT_CUDA_KERNELS is not 1";
  EXPECT_TRUE(tw::cuda::kernels_built());
}

// ---- empty ----------------------------------------------------------------------------------------------------

TEST(CudaEmpty, OnDeviceZero) {
  TW_NEED_CUDA();
  const Tensor t = Tensor::empty({3, 4}, DType::float32(), Device::cuda(0));
  EXPECT_EQ(t.device(), Device::cuda(0));
  EXPECT_EQ(t.shape(), (Shape{3, 4}));
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.nbytes(), 48);
  EXPECT_FALSE(t.pinned());
  ASSERT_NE(t.data_ptr(), nullptr);
  EXPECT_EQ(tw::cuda::device_of_pointer(reinterpret_cast<uintptr_t>(t.data_ptr())), std::optional<int>(0));

  const Tensor f = Tensor::empty({3, 4}, DType::float64(), Device::cuda(0), MemoryOrder::F);
  EXPECT_TRUE(f.is_contiguous(MemoryOrder::F));
  EXPECT_FALSE(f.is_contiguous(MemoryOrder::C));

  const Tensor scalar = Tensor::empty(Shape{}, DType::int64(), Device::cuda(0));
  EXPECT_EQ(scalar.ndim(), 0u);
  EXPECT_EQ(scalar.numel(), 1);

  const Tensor none = Tensor::empty({0, 5}, DType::uint8(), Device::cuda(0));
  EXPECT_EQ(none.numel(), 0);
  EXPECT_EQ(none.device(), Device::cuda(0));
  EXPECT_EQ(none.to(Device::cpu()).numel(), 0);
}

TEST(CudaEmpty, PinnedHostMemoryIsHostAccessible) {
  TW_NEED_CUDA();
  Tensor t = Tensor::empty({64}, DType::uint32(), Device::cuda_host());
  EXPECT_TRUE(t.pinned());
  EXPECT_EQ(t.device(), Device::cuda_host());
  auto* p = t.data<uint32_t>();
  for (uint32_t i = 0; i < 64; ++i) p[i] = i * 2654435761u;
  const Tensor dev = t.to(Device::cuda(0));
  const Tensor back = dev.to(Device::cpu());
  EXPECT_TRUE(same_elements(t, back));
}

// ---- Tensor::to: the copy policy and streams ------------------------------------------------------------------

TEST(CudaTo, SameDeviceWithoutCopyIsTheSameBuffer) {
  TW_NEED_CUDA();
  const Tensor h = random_host({16, 16}, DType::float32(), kSeed);
  const Tensor d = h.to(Device::cuda(0));
  const Tensor same = d.to(Device::cuda(0));
  EXPECT_EQ(same.buffer_ptr(), d.buffer_ptr());
  EXPECT_EQ(same.data_ptr(), d.data_ptr());
  const Tensor same_no_copy = d.to(Device::cuda(0), std::nullopt, false);
  EXPECT_EQ(same_no_copy.buffer_ptr(), d.buffer_ptr());
  EXPECT_EQ(h.to(Device::cpu()).buffer_ptr(), h.buffer_ptr());

  const Tensor forced = d.to(Device::cuda(0), std::nullopt, true);
  EXPECT_NE(forced.data_ptr(), d.data_ptr());
  EXPECT_EQ(forced.device(), Device::cuda(0));
  EXPECT_TRUE(same_elements(h, forced.to(Device::cpu())));
  const Tensor host_forced = h.to(Device::cpu(), std::nullopt, true);
  EXPECT_NE(host_forced.data_ptr(), h.data_ptr());
  EXPECT_TRUE(same_elements(h, host_forced));
}

TEST(CudaTo, CopyFalseAcrossDevicesThrowsCopyRequired) {
  TW_NEED_CUDA();
  const Tensor h = random_host({4, 4}, DType::float32(), kSeed);
  TW_EXPECT_ERROR(h.to(Device::cuda(0), std::nullopt, false), ErrorCode::copy_required);
  TW_EXPECT_ERROR(h.to(Device::cuda_host(), std::nullopt, false), ErrorCode::copy_required);
  const Tensor d = h.to(Device::cuda(0));
  TW_EXPECT_ERROR(d.to(Device::cpu(), std::nullopt, false), ErrorCode::copy_required);
  TW_EXPECT_ERROR(d.to(Device::cuda_host(), std::nullopt, false), ErrorCode::copy_required);
}

TEST(CudaTo, ExplicitDefaultStreamsAreCarried) {
  TW_NEED_CUDA();
  const Tensor h = random_host({32, 33}, DType::float64(), kSeed + 1);
  for (intptr_t s : {tw::cuda::kLegacyStream, tw::cuda::kPerThreadStream}) {
    SCOPED_TRACE(s);
    const Tensor d = h.to(Device::cuda(0), s);
    EXPECT_EQ(d.stream(), std::optional<intptr_t>(s));
    const Tensor dt = d.permute({1, 0});
    EXPECT_EQ(dt.stream(), std::optional<intptr_t>(s)) << "a view keeps its stream";
    EXPECT_TRUE(same_elements(h, d.to(Device::cpu(), s)));
    EXPECT_TRUE(same_elements(h, d.to(Device::cpu())));  // default: the tensor's own stream
    const Tensor p = d.to(Device::cuda_host(), s);
    EXPECT_EQ(p.stream(), std::nullopt) << "host memory (pinned too): the data is there when to() returns";
    wait_for(p);
    EXPECT_TRUE(same_elements(h, p));
  }
  // Across the two default streams: made on one, read on the other.
  const Tensor d1 = h.to(Device::cuda(0), tw::cuda::kPerThreadStream);
  EXPECT_TRUE(same_elements(h, d1.to(Device::cpu(), tw::cuda::kLegacyStream)));
}

TEST(CudaTo, KeepsTheDimensionOrderOfADenseSourceAndMetadata) {
  TW_NEED_CUDA();
  Tensor f = random_host({5, 7}, DType::int32(), kSeed + 2, MemoryOrder::F);
  f.metadata().set("unit", "m/s");
  f.metadata().set("k", 1);
  const Tensor d = f.to(Device::cuda(0));
  EXPECT_TRUE(d.is_contiguous(MemoryOrder::F));
  EXPECT_EQ(d.metadata(), f.metadata());
  const Tensor back = d.to(Device::cpu());
  EXPECT_TRUE(back.is_contiguous(MemoryOrder::F));
  EXPECT_EQ(back.metadata(), f.metadata());
  EXPECT_TRUE(same_elements(f, back));

  const Tensor p = random_host({2, 3, 4}, DType::float32(), kSeed + 3).permute({2, 0, 1});
  const Tensor dp = p.to(Device::cuda(0));
  EXPECT_EQ(dp.strides(), p.strides());  // dense, permuted: the order is kept
  EXPECT_TRUE(same_elements(p, dp.to(Device::cpu())));
}

// ---- pin ------------------------------------------------------------------------------------------------------

TEST(CudaPin, KeepsShapeStridesMetadata) {
  TW_NEED_CUDA();
  const Tensor h = random_host({6, 8}, DType::float32(), kSeed + 4);
  for (const Tensor& src0 : {h, h.permute({1, 0}), h.permute({1, 0}).slice(0, 1, std::nullopt, 2)}) {
    Tensor src = src0;
    src.metadata().set("k", 1);
    src.metadata().set("name", "frame");
    const Tensor p = src.pin();
    EXPECT_TRUE(p.pinned());
    EXPECT_EQ(p.device(), Device::cuda_host());
    EXPECT_EQ(p.shape(), src.shape());
    EXPECT_EQ(p.strides(), src.strides());
    EXPECT_EQ(p.dtype(), src.dtype());
    EXPECT_EQ(p.metadata(), src.metadata());
    EXPECT_NE(p.buffer_ptr(), src.buffer_ptr());
    EXPECT_TRUE(same_elements(src, p));
    EXPECT_EQ(p.pin().buffer_ptr(), p.buffer_ptr()) << "already pinned: the same tensor";
  }
  EXPECT_FALSE(h.pinned());
}

// ---- pools ----------------------------------------------------------------------------------------------------

TEST(CudaPool, DeviceBlockFreedAndAskedForAgainIsAHit) {
  TW_NEED_CUDA();
  const Shape shape{3, 1 << 18};  // 3 MiB of float32
  // (earlier tests' copies may still hold blocks, released at the next allocation: all of them back first, so that
  // `before` counts only what stays)
  tw::cuda::empty_cache();
  const tw::cuda::PoolStats before = tw::cuda::device_pool_stats(0);
  {
    const Tensor a = Tensor::empty(shape, DType::float32(), Device::cuda(0));
    const tw::cuda::PoolStats mid = tw::cuda::device_pool_stats(0);
    EXPECT_GE(mid.in_use_bytes, before.in_use_bytes + static_cast<size_t>(a.nbytes()));
    EXPECT_GE(mid.reserved_bytes, mid.in_use_bytes);
  }
  const tw::cuda::PoolStats freed = tw::cuda::device_pool_stats(0);
  EXPECT_EQ(freed.in_use_bytes, before.in_use_bytes);
  EXPECT_GE(freed.cached_blocks, 1u);
  {
    const Tensor b = Tensor::empty(shape, DType::float32(), Device::cuda(0));
    (void)b;
  }
  const tw::cuda::PoolStats after = tw::cuda::device_pool_stats(0);
  EXPECT_GE(after.hits, freed.hits + 1) << "the second allocation of the same size reuses the cached block";
  EXPECT_EQ(after.in_use_bytes, before.in_use_bytes);
}

TEST(CudaPool, PinnedBlockFreedAndAskedForAgainIsAHit) {
  TW_NEED_CUDA();
  const Shape shape{1 << 20};
  // (earlier tests' copies may still hold blocks, released at the next allocation: all of them back first, so that
  // `before` counts only what stays)
  tw::cuda::empty_cache();
  const tw::cuda::PoolStats before = tw::cuda::pinned_pool_stats();
  {
    const Tensor a = Tensor::empty(shape, DType::uint8(), Device::cuda_host());
    EXPECT_GE(tw::cuda::pinned_pool_stats().in_use_bytes, before.in_use_bytes + static_cast<size_t>(a.nbytes()));
  }
  const tw::cuda::PoolStats freed = tw::cuda::pinned_pool_stats();
  EXPECT_EQ(freed.in_use_bytes, before.in_use_bytes);
  {
    const Tensor b = Tensor::empty(shape, DType::uint8(), Device::cuda_host());
    (void)b;
  }
  const tw::cuda::PoolStats after = tw::cuda::pinned_pool_stats();
  EXPECT_GE(after.hits, freed.hits + 1);
  EXPECT_EQ(after.in_use_bytes, before.in_use_bytes);
}

TEST(CudaPool, EmptyCacheReturnsCachedBlocks) {
  TW_NEED_CUDA();
  {
    const Tensor d = Tensor::empty({1 << 20}, DType::float32(), Device::cuda(0));
    const Tensor p = Tensor::empty({1 << 20}, DType::float32(), Device::cuda_host());
    (void)d;
    (void)p;
  }
  tw::cuda::synchronize_stream(tw::cuda::kLegacyStream);
  tw::cuda::synchronize_stream(tw::cuda::kPerThreadStream);
  tw::cuda::empty_cache();
  const tw::cuda::PoolStats dev = tw::cuda::device_pool_stats(0);
  EXPECT_EQ(dev.cached_blocks, 0u);
  EXPECT_EQ(dev.reserved_bytes, dev.in_use_bytes);
  const tw::cuda::PoolStats pin = tw::cuda::pinned_pool_stats();
  EXPECT_EQ(pin.cached_blocks, 0u);
  EXPECT_EQ(pin.reserved_bytes, pin.in_use_bytes);
}

// ---- invalid devices ------------------------------------------------------------------------------------------

TEST(CudaDevice, InvalidIndexThrowsNamingIt) {
  TW_NEED_CUDA();
  const Tensor h = random_host({4}, DType::float32(), kSeed);
  for (const std::function<Tensor()>& fn : std::vector<std::function<Tensor()>>{
           [] { return Tensor::empty({4}, DType::float32(), Device::cuda(99)); },
           [&] { return h.to(Device::cuda(99)); },
       }) {
    try {
      fn();
      ADD_FAILURE() << "cuda:99 was accepted";
    } catch (const tw::Error& e) {
      EXPECT_NE(std::string(e.what()).find("99"), std::string::npos) << e.what();
    }
  }
  const tw::cuda::PoolStats none = tw::cuda::device_pool_stats(99);  // noexcept: an empty pool
  EXPECT_EQ(none.in_use_bytes, 0u);
}

}  // namespace
