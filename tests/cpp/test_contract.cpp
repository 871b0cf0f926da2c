// One contract, every path: a typed suite runs the same checks over each way a tensor enters or leaves
// tensorwire — DLPack versioned and legacy, the import/export policy, the C ABI, Arrow, and publish/subscribe —
// with one shared destruction counter on the producer's memory.
//
// The contract: (1) every element arrives bit-exact, read back through raw strides; (2) dtype and shape arrive
// as sent; (3) a zero-copy path shares the producer's memory and keeps it alive after the producer's own tensor is
// gone; (4) the producer's owner is released exactly once, when the last view of it dies (never early, never
// twice); (5) read-only stays read-only.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <unistd.h>
#include <vector>

#include "tensorwire/tensorwire.h"
#include "tensorwire/tensorwire.hpp"

namespace {

using tw::DType;
using tw::Tensor;

// The shared destruction counter: every producer's memory is owned by one of these.
struct Owner {
  static inline std::atomic<int> alive{0};
  static inline std::atomic<int> released{0};
  std::vector<float> data;
  explicit Owner(size_t n) : data(n) {
    for (size_t i = 0; i < n; ++i) data[i] = static_cast<float>(i) * 0.5f - 3.0f;
    ++alive;
  }
  ~Owner() {
    --alive;
    ++released;
  }
};

// A strided source: a (4, 6) float32 view (every other column of a 4x12 block, starting at column 1) over counted
// memory, optionally read-only.
Tensor make_source(bool readonly) {
  auto owner = std::make_shared<Owner>(48);
  float* base = owner->data.data();
  return Tensor::from_blob(base + 1, {4, 6}, DType::float32(), tw::Device::cpu(), owner, {12, 2}, readonly);
}

float at(const Tensor& t, int64_t i, int64_t j) {
  const auto* p = static_cast<const char*>(t.data_ptr());
  const auto isz = static_cast<int64_t>(sizeof(float));
  float v;
  std::memcpy(&v, p + (i * t.strides()[0] + j * t.strides()[1]) * isz, sizeof v);
  return v;
}

// Each path: carry(src) returns what arrives on the other side. `zero_copy` says whether it shares memory.
struct DLPackVersioned {
  static constexpr bool zero_copy = true;
  static Tensor carry(const Tensor& s) { return tw::from_dlpack(tw::to_dlpack(s)); }
};
struct DLPackLegacy {
  static constexpr bool zero_copy = true;
  static constexpr bool writable_only = true;  // a legacy struct cannot say read-only
  static Tensor carry(const Tensor& s) { return tw::from_dlpack(tw::to_dlpack_unversioned(s)); }
};
struct Policy {
  static constexpr bool zero_copy = true;
  static Tensor carry(const Tensor& s) {
    tw::ExportRequest out;
    out.consumer = tw::ConsumerProfile::strided;
    return tw::import_dlpack(tw::export_dlpack(s, out), tw::ImportRequest{});
  }
};
struct PolicyCopy {
  static constexpr bool zero_copy = false;
  static Tensor carry(const Tensor& s) {
    tw::ExportRequest out;
    out.copy = tw::CopyMode::always;
    return tw::import_dlpack(tw::export_dlpack(s, out), tw::ImportRequest{});
  }
};
struct CAbi {
  static constexpr bool zero_copy = true;
  static Tensor carry(const Tensor& s) {
    // Into the C ABI through DLPack and back out again: the handle's tensor, exported for a strided consumer.
    tw_tensor* h = nullptr;
    EXPECT_EQ(tw_tensor_from_dlpack(tw::to_dlpack(s), &h), TW_OK) << tw_last_error();
    tw_export_options o;
    tw_export_options_init(&o);
    o.consumer = TW_CONSUMER_STRIDED;
    DLManagedTensorVersioned* m = nullptr;
    EXPECT_EQ(tw_tensor_export_dlpack(h, &o, &m, nullptr), TW_OK) << tw_last_error();
    tw_tensor_free(h);
    tw_tensor* back = nullptr;
    EXPECT_EQ(tw_tensor_import_dlpack(m, nullptr, &back), TW_OK) << tw_last_error();
    DLManagedTensorVersioned* out = nullptr;
    EXPECT_EQ(tw_tensor_export_dlpack(back, &o, &out, nullptr), TW_OK);
    tw_tensor_free(back);
    return tw::from_dlpack(out);
  }
};
struct Arrow {
  static constexpr bool zero_copy = false;  // the strided source has gaps Arrow cannot describe: one copy
  static Tensor carry(const Tensor& s) {
    ArrowSchema schema{};
    ArrowArray array{};
    tw::to_arrow(s, &schema, &array);
    return tw::from_arrow(&schema, &array);
  }
};
struct PubSub {
  static constexpr bool zero_copy = false;  // into shared memory: one copy on send
  static Tensor carry(const Tensor& s) {
    const std::string name = "contract-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
    tw::Publisher pub(name);
    tw::Subscriber sub(name);
    EXPECT_EQ(pub.send(s), 1u);
    std::optional<Tensor> r = sub.recv(std::chrono::seconds(5));
    EXPECT_TRUE(r.has_value());
    return r ? *r : Tensor();
  }
  static inline int counter = 0;
};

template <class P>
class Contract : public ::testing::Test {};
using Paths = ::testing::Types<DLPackVersioned, DLPackLegacy, Policy, PolicyCopy, CAbi, Arrow, PubSub>;
TYPED_TEST_SUITE(Contract, Paths);

template <class P>
constexpr bool writable_only() {
  if constexpr (requires { P::writable_only; }) return P::writable_only;
  return false;
}

TYPED_TEST(Contract, ValuesShapeAndDtypeArriveExactly) {
  const Tensor src = make_source(false);
  const Tensor got = TypeParam::carry(src);
  ASSERT_TRUE(got.defined());
  EXPECT_EQ(got.dtype(), DType::float32());
  EXPECT_EQ(got.shape(), src.shape());
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 6; ++j) {
      const float a = at(src, i, j), b = at(got, i, j);
      EXPECT_EQ(std::memcmp(&a, &b, sizeof a), 0) << i << "," << j;
    }
  if (TypeParam::zero_copy) {
    EXPECT_EQ(got.data_ptr(), src.data_ptr());
  } else {
    EXPECT_NE(got.data_ptr(), src.data_ptr());
  }
}

TYPED_TEST(Contract, TheProducersOwnerIsReleasedExactlyOnceWhenTheLastViewDies) {
  const int alive0 = Owner::alive, released0 = Owner::released;
  Tensor got;
  {
    Tensor src = make_source(false);
    EXPECT_EQ(Owner::alive, alive0 + 1);
    got = TypeParam::carry(src);
  }  // the producer's own tensor is gone
  if (TypeParam::zero_copy) {
    EXPECT_EQ(Owner::alive, alive0 + 1) << "released while a view still reads it";
    EXPECT_EQ(at(got, 3, 5), at(got, 3, 5));  // still readable (ASan would report a use after free)
    Tensor view = got.slice(1, 1, 4, 2);
    got = Tensor();
    EXPECT_EQ(Owner::alive, alive0 + 1);
    view = Tensor();
  }
  got = Tensor();
  EXPECT_EQ(Owner::alive, alive0);
  EXPECT_EQ(Owner::released, released0 + 1);
}

TYPED_TEST(Contract, ReadOnlyStaysReadOnly) {
  const Tensor src = make_source(true);
  if constexpr (writable_only<TypeParam>()) {
    EXPECT_THROW(TypeParam::carry(src), tw::Error);
  } else {
    const Tensor got = TypeParam::carry(src);
    if (TypeParam::zero_copy) {
      EXPECT_TRUE(got.readonly());
    }
    EXPECT_EQ(at(got, 2, 3), at(src, 2, 3));
  }
}

}  // namespace
