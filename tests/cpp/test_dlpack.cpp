// DLPack in and out: zero-copy round trips, the deleter contract (exactly once, on success when the last view dies
// and on every failure), flags both ways, version negotiation, and validation of hand-built foreign structs.
#include <cstdint>
#include <memory>
#include <numeric>
#include <optional>
#include <type_traits>
#include <vector>

#include "tw_test_util.hpp"

namespace {

using tw::Device;
using tw::DType;
using tw::ErrorCode;
using tw::Tensor;

struct Counter {
  int released = 0;
  std::shared_ptr<const void> keep_alive() {
    return std::shared_ptr<const void>(static_cast<const void*>(this), [this](const void*) { ++released; });
  }
};

Tensor arange(tw::Shape shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::vector<float> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0.f);
  return Tensor::adopt(std::move(v), std::move(shape));
}

std::vector<float> elements(const Tensor& t) {
  std::vector<float> out;
  if (t.numel() == 0) return out;
  std::vector<int64_t> idx(t.ndim(), 0);
  for (;;) {
    int64_t off = 0;
    for (size_t i = 0; i < idx.size(); ++i) off += idx[i] * t.strides()[i];
    out.push_back(static_cast<const float*>(t.data_ptr())[off]);
    size_t k = t.ndim();
    for (; k-- > 0;) {
      if (++idx[k] < t.shape()[k]) break;
      idx[k] = 0;
    }
    if (k == static_cast<size_t>(-1)) return out;
  }
}

// A foreign producer: owns its data and arrays, counts deleter calls, and checks the deleter gets its own struct.
template <class Managed>
struct Producer {
  std::vector<float> data = std::vector<float>(64, 1.5f);
  int64_t shape[4] = {2, 3, 0, 0};
  int64_t strides[4] = {3, 1, 0, 0};
  Managed m{};
  int deleted = 0;
  bool wrong_self = false;

  Producer() {
    m.manager_ctx = this;
    m.deleter = [](Managed* self) {
      auto* p = static_cast<Producer*>(self->manager_ctx);
      if (self != &p->m) p->wrong_self = true;
      ++p->deleted;
    };
    DLTensor& dl = m.dl_tensor;
    dl.data = data.data();
    dl.device = DLDevice{kDLCPU, 0};
    dl.ndim = 2;
    dl.dtype = DLDataType{kDLFloat, 32, 1};
    dl.shape = shape;
    dl.strides = strides;
    dl.byte_offset = 0;
    if constexpr (std::is_same_v<Managed, DLManagedTensorVersioned>) {
      m.version = DLPackVersion{1, 3};
      m.flags = 0;
    }
  }
  Producer(const Producer&) = delete;
};
using VProducer = Producer<DLManagedTensorVersioned>;
using LProducer = Producer<DLManagedTensor>;

// ---- export / import round trips -----------------------------------------------------------------------------

TEST(DLPack, RoundTripIsZeroCopy) {
  Tensor t = arange({3, 4});
  DLManagedTensorVersioned* m = tw::to_dlpack(t);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->version.major, 1u);
  EXPECT_EQ(m->version.minor, 4u);
  EXPECT_EQ(m->flags, 0u);
  const DLTensor& dl = m->dl_tensor;
  EXPECT_EQ(dl.data, t.data_ptr());
  EXPECT_EQ(dl.byte_offset, 0u);
  EXPECT_EQ(dl.device.device_type, kDLCPU);
  EXPECT_EQ(dl.device.device_id, 0);
  EXPECT_EQ(dl.ndim, 2);
  EXPECT_EQ(dl.dtype.code, kDLFloat);
  EXPECT_EQ(dl.dtype.bits, 32);
  EXPECT_EQ(dl.dtype.lanes, 1);
  ASSERT_NE(dl.shape, nullptr);
  ASSERT_NE(dl.strides, nullptr);
  EXPECT_EQ(dl.shape[0], 3);
  EXPECT_EQ(dl.shape[1], 4);
  EXPECT_EQ(dl.strides[0], 4);
  EXPECT_EQ(dl.strides[1], 1);

  Tensor u = tw::from_dlpack(m);
  EXPECT_EQ(u.data_ptr(), t.data_ptr());
  EXPECT_EQ(u.shape(), t.shape());
  EXPECT_EQ(u.strides(), t.strides());
  EXPECT_EQ(u.dtype(), t.dtype());
  EXPECT_EQ(u.device(), Device::cpu());
  EXPECT_FALSE(u.readonly());
  static_cast<float*>(u.data_ptr())[5] = -1.f;  // writes are visible through the original: shared memory
  EXPECT_EQ(static_cast<const float*>(t.data_ptr())[5], -1.f);
}

TEST(DLPack, ExportKeepsTheBufferAliveUntilTheConsumerDeletes) {
  Counter c;
  std::vector<float> storage(12, 2.f);
  std::optional<Tensor> t = Tensor::from_blob(storage.data(), {12}, DType::float32(), Device::cpu(), c.keep_alive());
  DLManagedTensorVersioned* m = tw::to_dlpack(*t);
  DLManagedTensor* legacy = tw::to_dlpack_unversioned(*t);
  t.reset();
  EXPECT_EQ(c.released, 0);
  m->deleter(m);  // a consumer that never imports still releases exactly its reference
  EXPECT_EQ(c.released, 0);
  std::optional<Tensor> u = tw::from_dlpack(legacy);
  std::optional<Tensor> view = u->slice(0, 2, 4);
  u.reset();
  EXPECT_EQ(c.released, 0);
  EXPECT_EQ(elements(*view), (std::vector<float>{2.f, 2.f}));
  view.reset();
  EXPECT_EQ(c.released, 1);
}

TEST(DLPack, StridedViewsExportElementZeroAndTheirStrides) {
  Tensor base = arange({4, 6});
  const std::vector<Tensor> views = {base.transpose(0, 1), base.slice(0, 1, 4).slice(1, 2, 6, 2),
                                     base.slice(0, std::nullopt, std::nullopt, -1),
                                     base.slice(1, std::nullopt, std::nullopt, -2).transpose(0, 1),
                                     base.select(1, 3), base.select(0, 2).select(0, 5), base.slice(0, 0, 1).expand({3, 4, 6})};
  for (const Tensor& v : views) {
    SCOPED_TRACE(v.strides().str());
    DLManagedTensorVersioned* m = tw::to_dlpack(v);
    EXPECT_EQ(m->dl_tensor.data, v.data_ptr());
    EXPECT_EQ(m->dl_tensor.byte_offset, 0u);
    EXPECT_EQ(m->dl_tensor.ndim, static_cast<int32_t>(v.ndim()));
    for (size_t i = 0; i < v.ndim(); ++i) {
      EXPECT_EQ(m->dl_tensor.shape[i], v.shape()[i]);
      EXPECT_EQ(m->dl_tensor.strides[i], v.strides()[i]);
    }
    Tensor u = tw::from_dlpack(m);
    EXPECT_EQ(u.data_ptr(), v.data_ptr());
    EXPECT_EQ(u.strides(), v.strides());
    EXPECT_EQ(elements(u), elements(v));
  }
}

TEST(DLPack, ExportedShapeAndStridesOutliveTheTensor) {
  for (size_t rank : {size_t{2}, size_t{6}, size_t{7}, size_t{12}}) {  // inline and heap-held dimension storage
    SCOPED_TRACE(rank);
    std::vector<int64_t> shape(rank, 1);
    shape[0] = 3;
    shape[rank - 1] = 2;
    DLManagedTensorVersioned* m = nullptr;
    DLManagedTensor* l = nullptr;
    {
      Tensor t = arange(tw::Shape(shape)).transpose(0, -1);
      m = tw::to_dlpack(t);
      l = tw::to_dlpack_unversioned(t);
    }  // the tensor (and its own shape storage) is gone; the exported arrays must not be
    for (const DLTensor* dl : {&m->dl_tensor, &l->dl_tensor}) {
      ASSERT_EQ(dl->ndim, static_cast<int32_t>(rank));
      EXPECT_EQ(dl->shape[0], 2);
      EXPECT_EQ(dl->shape[rank - 1], 3);
      EXPECT_EQ(dl->strides[0], 1);
      for (size_t i = 1; i + 1 < rank; ++i) EXPECT_EQ(dl->shape[i], 1);
    }
    Tensor u = tw::from_dlpack(m);
    Tensor v = tw::from_dlpack(l);
    EXPECT_EQ(u.ndim(), rank);
    EXPECT_EQ(elements(u), elements(v));
  }
}

TEST(DLPack, ExportsAlwaysFillStrides) {
  Tensor t = arange({2, 3, 4});
  DLManagedTensorVersioned* m = tw::to_dlpack(t);
  ASSERT_NE(m->dl_tensor.strides, nullptr);
  EXPECT_EQ(std::vector<int64_t>(m->dl_tensor.strides, m->dl_tensor.strides + 3), (std::vector<int64_t>{12, 4, 1}));
  m->deleter(m);
  DLManagedTensor* l = tw::to_dlpack_unversioned(t);
  ASSERT_NE(l->dl_tensor.strides, nullptr);
  EXPECT_EQ(std::vector<int64_t>(l->dl_tensor.strides, l->dl_tensor.strides + 3), (std::vector<int64_t>{12, 4, 1}));
  l->deleter(l);
}

TEST(DLPack, ScalarsAndZeroSize) {
  Tensor s = arange({});
  DLManagedTensorVersioned* m = tw::to_dlpack(s);
  EXPECT_EQ(m->dl_tensor.ndim, 0);
  EXPECT_EQ(m->dl_tensor.data, s.data_ptr());
  Tensor u = tw::from_dlpack(m);
  EXPECT_EQ(u.ndim(), 0u);
  EXPECT_EQ(u.data_ptr(), s.data_ptr());

  Tensor z = Tensor::zeros({0, 3}, DType::float64());
  DLManagedTensorVersioned* mz = tw::to_dlpack(z);
  EXPECT_EQ(mz->dl_tensor.data, nullptr);  // the spec's form for zero-size tensors
  EXPECT_EQ(mz->dl_tensor.shape[0], 0);
  EXPECT_EQ(mz->dl_tensor.shape[1], 3);
  Tensor uz = tw::from_dlpack(mz);
  EXPECT_EQ(uz.shape().vec(), (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(uz.dtype(), DType::float64());
}

TEST(DLPack, UndefinedTensorsAreNotExported) {
  TW_EXPECT_ERROR(tw::to_dlpack(Tensor()), ErrorCode::invalid_argument);
  TW_EXPECT_ERROR(tw::to_dlpack_unversioned(Tensor()), ErrorCode::invalid_argument);
  TW_EXPECT_ERROR(tw::from_dlpack(static_cast<DLManagedTensorVersioned*>(nullptr)), ErrorCode::invalid_argument);
  TW_EXPECT_ERROR(tw::from_dlpack(static_cast<DLManagedTensor*>(nullptr)), ErrorCode::invalid_argument);
}

// ---- foreign producers: the deleter contract -------------------------------------------------------------------

TEST(DLPack, ImportCallsTheDeleterOnceWhenTheLastViewDies) {
  VProducer p;
  std::optional<Tensor> t = tw::from_dlpack(&p.m);
  EXPECT_EQ(t->data_ptr(), p.data.data());
  EXPECT_EQ(t->shape().vec(), (std::vector<int64_t>{2, 3}));
  std::optional<Tensor> v = t->transpose(0, 1);
  std::optional<Tensor> w = *t;
  t.reset();
  w.reset();
  EXPECT_EQ(p.deleted, 0);
  EXPECT_EQ(elements(*v), std::vector<float>(6, 1.5f));
  v.reset();
  EXPECT_EQ(p.deleted, 1);
  EXPECT_FALSE(p.wrong_self);
}

TEST(DLPack, LegacyImportCallsTheDeleterOnce) {
  LProducer p;
  {
    Tensor t = tw::from_dlpack(&p.m);
    EXPECT_EQ(t.data_ptr(), p.data.data());
    EXPECT_FALSE(t.readonly());
    EXPECT_EQ(p.deleted, 0);
  }
  EXPECT_EQ(p.deleted, 1);
  EXPECT_FALSE(p.wrong_self);
}

// Each mutation makes the struct invalid; from_dlpack must throw `code` and call the deleter exactly once.
template <class P>
void expect_refused(const char* what, void (*mutate)(P&), ErrorCode code) {
  SCOPED_TRACE(what);
  P p;
  mutate(p);
  TW_EXPECT_ERROR(tw::from_dlpack(&p.m), code);
  EXPECT_EQ(p.deleted, 1) << "deleter calls after a refused import";
  EXPECT_FALSE(p.wrong_self);
}

template <class P>
void refuse_invalid_structs() {
  expect_refused<P>("unknown dtype code", [](P& p) { p.m.dl_tensor.dtype.code = 99; }, ErrorCode::unsupported);
  expect_refused<P>("bad bits", [](P& p) { p.m.dl_tensor.dtype.bits = 24; }, ErrorCode::unsupported);
  expect_refused<P>("opaque handle", [](P& p) { p.m.dl_tensor.dtype = DLDataType{kDLOpaqueHandle, 64, 1}; },
                    ErrorCode::unsupported);
  expect_refused<P>("zero lanes", [](P& p) { p.m.dl_tensor.dtype.lanes = 0; }, ErrorCode::unsupported);
  expect_refused<P>("negative shape", [](P& p) { p.shape[1] = -3; }, ErrorCode::invalid_argument);
  expect_refused<P>("negative ndim", [](P& p) { p.m.dl_tensor.ndim = -1; }, ErrorCode::invalid_argument);
  expect_refused<P>("ndim 65", [](P& p) { p.m.dl_tensor.ndim = 65; }, ErrorCode::invalid_argument);
  expect_refused<P>("null shape", [](P& p) { p.m.dl_tensor.shape = nullptr; }, ErrorCode::invalid_argument);
  expect_refused<P>("null data", [](P& p) { p.m.dl_tensor.data = nullptr; }, ErrorCode::invalid_argument);
  expect_refused<P>("unknown device", [](P& p) { p.m.dl_tensor.device.device_type = static_cast<DLDeviceType>(99); },
                    ErrorCode::unsupported);
  expect_refused<P>("negative device id",
                    [](P& p) { p.m.dl_tensor.device = DLDevice{kDLCUDA, -1}; }, ErrorCode::invalid_argument);
  expect_refused<P>("huge byte_offset", [](P& p) { p.m.dl_tensor.byte_offset = uint64_t(1) << 63; },
                    ErrorCode::overflow);
  expect_refused<P>("stride overflow", [](P& p) { p.strides[0] = int64_t(1) << 62; }, ErrorCode::overflow);
  expect_refused<P>("shape overflow",
                    [](P& p) {
                      p.shape[0] = int64_t(1) << 40;
                      p.shape[1] = int64_t(1) << 40;
                    },
                    ErrorCode::overflow);
  expect_refused<P>("elements below address 0",
                    [](P& p) {
                      p.m.dl_tensor.data = reinterpret_cast<void*>(uintptr_t{16});
                      p.strides[0] = -1000;
                    },
                    ErrorCode::out_of_range);
  expect_refused<P>("elements past the address space",
                    [](P& p) {
                      p.m.dl_tensor.data = reinterpret_cast<void*>(UINTPTR_MAX - 64);
                      p.m.dl_tensor.byte_offset = 48;  // 48 + 24 bytes of elements > 64
                    },
                    ErrorCode::overflow);
}

TEST(DLPack, VersionedImportFailuresCallTheDeleterOnce) { refuse_invalid_structs<VProducer>(); }
TEST(DLPack, LegacyImportFailuresCallTheDeleterOnce) { refuse_invalid_structs<LProducer>(); }

TEST(DLPack, UnknownMajorVersionIsRefusedAndDeleted) {
  for (uint32_t major : {0u, 2u, 7u}) {
    SCOPED_TRACE(major);
    VProducer p;
    p.m.version = DLPackVersion{major, 0};
    p.m.dl_tensor.dtype.code = 200;  // the rest of the struct must not even be looked at
    TW_EXPECT_ERROR_MSG(tw::from_dlpack(&p.m), ErrorCode::version_mismatch, std::to_string(major));
    EXPECT_EQ(p.deleted, 1);
  }
  // A newer minor of major 1 is fine.
  VProducer p;
  p.m.version = DLPackVersion{1, 9};
  EXPECT_NO_THROW(tw::from_dlpack(&p.m));
  EXPECT_EQ(p.deleted, 1);
}

TEST(DLPack, NullDeleterIsAccepted) {
  VProducer p;
  p.m.deleter = nullptr;
  {
    Tensor t = tw::from_dlpack(&p.m);
    EXPECT_EQ(t.data_ptr(), p.data.data());
  }
  VProducer q;
  q.m.deleter = nullptr;
  q.m.dl_tensor.dtype.code = 99;
  TW_EXPECT_ERROR(tw::from_dlpack(&q.m), ErrorCode::unsupported);
  EXPECT_EQ(p.deleted + q.deleted, 0);
}

// ---- layouts of foreign structs --------------------------------------------------------------------------------

TEST(DLPack, NullStridesMeanCContiguous) {
  VProducer p;
  p.shape[0] = 2;
  p.shape[1] = 3;
  p.shape[2] = 4;
  p.m.dl_tensor.ndim = 3;
  p.m.dl_tensor.strides = nullptr;
  Tensor t = tw::from_dlpack(&p.m);
  EXPECT_EQ(t.strides().vec(), (std::vector<int64_t>{12, 4, 1}));
  EXPECT_TRUE(t.is_contiguous());
  LProducer l;
  l.m.dl_tensor.strides = nullptr;
  EXPECT_EQ(tw::from_dlpack(&l.m).strides().vec(), (std::vector<int64_t>{3, 1}));
}

TEST(DLPack, ByteOffsetIsHonoured) {
  VProducer p;
  p.m.dl_tensor.byte_offset = 16;
  std::iota(p.data.begin(), p.data.end(), 0.f);
  Tensor t = tw::from_dlpack(&p.m);
  EXPECT_EQ(t.data_ptr(), p.data.data() + 4);
  EXPECT_EQ(elements(t), (std::vector<float>{4, 5, 6, 7, 8, 9}));
  // Re-exported, the offset is folded into the data pointer.
  DLManagedTensorVersioned* m = tw::to_dlpack(t);
  EXPECT_EQ(m->dl_tensor.data, p.data.data() + 4);
  EXPECT_EQ(m->dl_tensor.byte_offset, 0u);
  m->deleter(m);
}

TEST(DLPack, NegativeStridesImport) {
  VProducer p;
  std::iota(p.data.begin(), p.data.end(), 0.f);
  p.m.dl_tensor.data = p.data.data() + 5;  // element 0 is the last in memory
  p.strides[0] = -3;
  p.strides[1] = -1;
  Tensor t = tw::from_dlpack(&p.m);
  EXPECT_EQ(t.data_ptr(), p.data.data() + 5);
  EXPECT_EQ(elements(t), (std::vector<float>{5, 4, 3, 2, 1, 0}));
  EXPECT_EQ(t.buffer().base(), p.data.data());
  EXPECT_EQ(t.buffer().size(), 24u);
}

TEST(DLPack, DevicesAreKeptAndNeverDereferenced) {
  VProducer p;
  p.m.dl_tensor.device = DLDevice{kDLCUDA, 1};
  p.m.dl_tensor.data = reinterpret_cast<void*>(uintptr_t{0x7f0000001000});  // a device address, not ours to read
  Tensor t = tw::from_dlpack(&p.m);
  EXPECT_EQ(t.device(), Device::cuda(1));
  DLManagedTensorVersioned* m = tw::to_dlpack(t);
  EXPECT_EQ(m->dl_tensor.device.device_type, kDLCUDA);
  EXPECT_EQ(m->dl_tensor.device.device_id, 1);
  EXPECT_EQ(m->dl_tensor.data, reinterpret_cast<void*>(uintptr_t{0x7f0000001000}));
  m->deleter(m);
  EXPECT_EQ(t.contiguous().data_ptr(), t.data_ptr());  // already contiguous: no copy, no access
  // The host never copies device memory: the CUDA layer does, and without a driver it says so (with one, the
  // address is not a real allocation, so this is for machines without a GPU).
  if (!tw::cuda::is_available()) {
    TW_EXPECT_ERROR_MSG(t.transpose(0, 1).contiguous(), ErrorCode::device_unavailable, tw::cuda::status());
  }
}

// ---- flags -----------------------------------------------------------------------------------------------------

TEST(DLPack, ReadOnlyFlagBothWays) {
  VProducer p;
  p.m.flags = DLPACK_FLAG_BITMASK_READ_ONLY;
  Tensor t = tw::from_dlpack(&p.m);
  EXPECT_TRUE(t.readonly());
  TW_EXPECT_ERROR(t.data<float>(), ErrorCode::read_only);
  TW_EXPECT_ERROR(tw::copy(arange({2, 3}), t), ErrorCode::read_only);
  // Export of a read-only tensor says so; the legacy struct cannot, so it is refused.
  DLManagedTensorVersioned* m = tw::to_dlpack(t);
  EXPECT_EQ(m->flags & DLPACK_FLAG_BITMASK_READ_ONLY, DLPACK_FLAG_BITMASK_READ_ONLY);
  Tensor back = tw::from_dlpack(m);
  EXPECT_TRUE(back.readonly());
  TW_EXPECT_ERROR_MSG(tw::to_dlpack_unversioned(t), ErrorCode::read_only, "versioned");
  TW_EXPECT_ERROR(tw::to_dlpack_unversioned(arange({2}).as_readonly()), ErrorCode::read_only);
  // A writable tensor exports no READ_ONLY flag.
  DLManagedTensorVersioned* w = tw::to_dlpack(arange({2}));
  EXPECT_EQ(w->flags & DLPACK_FLAG_BITMASK_READ_ONLY, 0u);
  w->deleter(w);
}

TEST(DLPack, IsCopiedFlag) {
  tw::DLPackExportOptions opt;
  opt.is_copied = true;
  DLManagedTensorVersioned* m = tw::to_dlpack(arange({3}), opt);
  EXPECT_EQ(m->flags, DLPACK_FLAG_BITMASK_IS_COPIED);
  Tensor t = tw::from_dlpack(m);  // importable, and writable: the copy is the consumer's
  EXPECT_FALSE(t.readonly());
  DLManagedTensorVersioned* n = tw::to_dlpack(arange({3}));
  EXPECT_EQ(n->flags & DLPACK_FLAG_BITMASK_IS_COPIED, 0u);
  n->deleter(n);
}

TEST(DLPack, SubbytePaddedFlagBothWays) {
  VProducer p;
  std::vector<uint8_t> bytes = {1, 2, 3, 4, 5, 6};
  p.m.dl_tensor.data = bytes.data();
  p.m.dl_tensor.dtype = DType::int4().to_dlpack();
  p.m.flags = DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED;
  Tensor t = tw::from_dlpack(&p.m);
  EXPECT_TRUE(t.subbyte_padded());
  EXPECT_EQ(t.nbytes(), 6);
  EXPECT_EQ(t.buffer().size(), 6u);
  EXPECT_EQ(t.slice(1, 1, 3).data_ptr(), bytes.data() + 1);  // padded: any start is a byte boundary
  DLManagedTensorVersioned* m = tw::to_dlpack(t);
  EXPECT_EQ(m->flags & DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED, DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED);
  m->deleter(m);
  TW_EXPECT_ERROR(tw::to_dlpack_unversioned(t), ErrorCode::unsupported);

  // Without the flag the same struct is packed: 6 int4 in 3 bytes.
  VProducer q;
  q.m.dl_tensor.data = bytes.data();
  q.m.dl_tensor.dtype = DType::int4().to_dlpack();
  Tensor packed = tw::from_dlpack(&q.m);
  EXPECT_FALSE(packed.subbyte_padded());
  EXPECT_EQ(packed.nbytes(), 3);
  EXPECT_EQ(packed.buffer().size(), 3u);
  DLManagedTensorVersioned* mp = tw::to_dlpack(packed);
  EXPECT_EQ(mp->flags & DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED, 0u);
  mp->deleter(mp);

  // The flag means nothing for whole-byte types.
  VProducer r;
  r.m.flags = DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED;
  EXPECT_FALSE(tw::from_dlpack(&r.m).subbyte_padded());
}

// ---- version negotiation ---------------------------------------------------------------------------------------

TEST(DLPack, ExportedVersionIsCappedAtTheConsumersMax) {
  for (auto [req, got] : std::vector<std::pair<uint32_t, uint32_t>>{{0, 0}, {1, 1}, {2, 2}, {3, 3}, {4, 4}, {5, 4}, {99, 4}}) {
    tw::DLPackExportOptions opt;
    opt.max_version = DLPackVersion{1, req};
    DLManagedTensorVersioned* m = tw::to_dlpack(arange({2}), opt);
    EXPECT_EQ(m->version.major, 1u);
    EXPECT_EQ(m->version.minor, got) << "asked for 1." << req;
    m->deleter(m);
  }
  for (uint32_t major : {0u, 2u}) {
    tw::DLPackExportOptions opt;
    opt.max_version = DLPackVersion{major, 5};
    TW_EXPECT_ERROR(tw::to_dlpack(arange({2}), opt), ErrorCode::version_mismatch);
  }
  // Types that DLPack 1.0 did not have cannot go to a 1.0 consumer; the message names both versions.
  tw::DLPackExportOptions v10;
  v10.max_version = DLPackVersion{1, 0};
  TW_EXPECT_ERROR_MSG(tw::to_dlpack(Tensor::zeros({2}, DType::float8_e4m3fn()), v10), ErrorCode::version_mismatch,
                      "float8_e4m3fn needs DLPack 1.1 but the consumer understands at most 1.0");
  TW_EXPECT_ERROR(tw::to_dlpack(Tensor::zeros({2}, DType::float4_e2m1fn()), v10), ErrorCode::version_mismatch);
  tw::DLPackExportOptions v13;
  v13.max_version = DLPackVersion{1, 3};
  TW_EXPECT_ERROR_MSG(tw::to_dlpack(Tensor::zeros({2}, DType::bcomplex32()), v13), ErrorCode::version_mismatch,
                      "bcomplex32 needs DLPack 1.4 but the consumer understands at most 1.3");
  // complex32 (kDLComplex, 32 bits) was always expressible.
  DLManagedTensorVersioned* c = tw::to_dlpack(Tensor::zeros({2}, DType::complex32()), v10);
  EXPECT_EQ(c->dl_tensor.dtype.code, kDLComplex);
  EXPECT_EQ(c->dl_tensor.dtype.bits, 32);
  c->deleter(c);
  // Devices added after 1.0 likewise.
  static char blob[8];
  Tensor tpu = Tensor::from_blob(blob, {2}, DType::float32(), Device{kDLTPU, 0}, nullptr);
  TW_EXPECT_ERROR_MSG(tw::to_dlpack(tpu, v13), ErrorCode::version_mismatch, "device tpu:0 needs DLPack 1.4");
  tw::DLPackExportOptions v11;
  v11.max_version = DLPackVersion{1, 1};
  DLManagedTensorVersioned* m = tw::to_dlpack(Tensor::zeros({2}, DType::float8_e4m3fn()), v11);
  EXPECT_EQ(m->dl_tensor.dtype.code, kDLFloat8_e4m3fn);
  m->deleter(m);
}

// ---- legacy export ---------------------------------------------------------------------------------------------

TEST(DLPack, LegacyExportRoundTrip) {
  Tensor t = arange({3, 2}).transpose(0, 1);
  DLManagedTensor* m = tw::to_dlpack_unversioned(t);
  EXPECT_EQ(m->dl_tensor.data, t.data_ptr());
  EXPECT_EQ(m->dl_tensor.strides[0], 1);
  EXPECT_EQ(m->dl_tensor.strides[1], 2);
  Tensor u = tw::from_dlpack(m);
  EXPECT_EQ(u.data_ptr(), t.data_ptr());
  EXPECT_EQ(elements(u), (std::vector<float>{0, 2, 4, 1, 3, 5}));
}

// ---- validate_dltensor -----------------------------------------------------------------------------------------

TEST(DLPack, ValidateDltensorReturnsTheLayoutRelativeToData) {
  int64_t shape[2] = {2, 3};
  int64_t strides[2] = {1, 2};
  float data[8] = {};
  DLTensor dl{data, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, shape, strides, 8};
  tw::Layout l = tw::validate_dltensor(dl, false);
  EXPECT_EQ(l.dtype, DType::float32());
  EXPECT_EQ(l.shape.vec(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(l.strides.vec(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(l.byte_offset, 8);
  EXPECT_FALSE(l.subbyte_padded);
  dl.dtype = DLDataType{kDLUInt, 4, 1};
  EXPECT_TRUE(tw::validate_dltensor(dl, true).subbyte_padded);
  EXPECT_FALSE(tw::validate_dltensor(dl, false).subbyte_padded);
  dl.data = nullptr;
  TW_EXPECT_ERROR(tw::validate_dltensor(dl, false), ErrorCode::invalid_argument);
  shape[0] = 0;  // zero-size: a NULL data pointer is fine
  EXPECT_NO_THROW(tw::validate_dltensor(dl, false));
}

}  // namespace
