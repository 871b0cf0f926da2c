// Arrow C Data / C Device Data interface: the ABI frozen by offsets, exports (fixed shape, permuted, primitive,
// bool8, variable shape) read back field by field, zero-copy round trips, the release contract (exactly once, on
// success when the last view dies and on every failure; moved structs), and hostile schemas, metadata and arrays.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "tensorwire/arrow.hpp"
#include "tensorwire/device_runtime.hpp"
#include "tensorwire/interop.hpp"
#include "tw_test_util.hpp"

namespace {

// Leaves no device runtime installed, before and after a test that installs one (it is process-wide).
struct RuntimeReset {
  RuntimeReset() { tw::install_device_runtime(nullptr); }
  ~RuntimeReset() { tw::install_device_runtime(nullptr); }
};

using tw::DType;
using tw::ErrorCode;
using tw::Tensor;

// ---- the ABI (LP64): a consumer compiled against the spec's declarations reads our structs at these offsets ------
static_assert(sizeof(void*) == 8, "these offsets are the LP64 layout");
static_assert(ARROW_FLAG_DICTIONARY_ORDERED == 1 && ARROW_FLAG_NULLABLE == 2 && ARROW_FLAG_MAP_KEYS_SORTED == 4);

static_assert(sizeof(ArrowSchema) == 72);
static_assert(offsetof(ArrowSchema, format) == 0);
static_assert(offsetof(ArrowSchema, name) == 8);
static_assert(offsetof(ArrowSchema, metadata) == 16);
static_assert(offsetof(ArrowSchema, flags) == 24);
static_assert(offsetof(ArrowSchema, n_children) == 32);
static_assert(offsetof(ArrowSchema, children) == 40);
static_assert(offsetof(ArrowSchema, dictionary) == 48);
static_assert(offsetof(ArrowSchema, release) == 56);
static_assert(offsetof(ArrowSchema, private_data) == 64);

static_assert(sizeof(ArrowArray) == 80);
static_assert(offsetof(ArrowArray, length) == 0);
static_assert(offsetof(ArrowArray, null_count) == 8);
static_assert(offsetof(ArrowArray, offset) == 16);
static_assert(offsetof(ArrowArray, n_buffers) == 24);
static_assert(offsetof(ArrowArray, n_children) == 32);
static_assert(offsetof(ArrowArray, buffers) == 40);
static_assert(offsetof(ArrowArray, children) == 48);
static_assert(offsetof(ArrowArray, dictionary) == 56);
static_assert(offsetof(ArrowArray, release) == 64);
static_assert(offsetof(ArrowArray, private_data) == 72);

static_assert(sizeof(ArrowArrayStream) == 40);
static_assert(offsetof(ArrowArrayStream, get_schema) == 0);
static_assert(offsetof(ArrowArrayStream, get_next) == 8);
static_assert(offsetof(ArrowArrayStream, get_last_error) == 16);
static_assert(offsetof(ArrowArrayStream, release) == 24);
static_assert(offsetof(ArrowArrayStream, private_data) == 32);

static_assert(sizeof(ArrowDeviceType) == 4);
static_assert(sizeof(ArrowDeviceArray) == 128, "the spec sizes it to exactly 128 bytes on 64-bit systems");
static_assert(offsetof(ArrowDeviceArray, array) == 0);
static_assert(offsetof(ArrowDeviceArray, device_id) == 80);
static_assert(offsetof(ArrowDeviceArray, device_type) == 88);
static_assert(offsetof(ArrowDeviceArray, sync_event) == 96);
static_assert(offsetof(ArrowDeviceArray, reserved) == 104);

static_assert(sizeof(ArrowDeviceArrayStream) == 48);
static_assert(offsetof(ArrowDeviceArrayStream, device_type) == 0);
static_assert(offsetof(ArrowDeviceArrayStream, get_schema) == 8);
static_assert(offsetof(ArrowDeviceArrayStream, get_next) == 16);
static_assert(offsetof(ArrowDeviceArrayStream, get_last_error) == 24);
static_assert(offsetof(ArrowDeviceArrayStream, release) == 32);
static_assert(offsetof(ArrowDeviceArrayStream, private_data) == 40);

// The device types equal DLPack's (the spec keeps them in sync), so a Device converts by value.
static_assert(ARROW_DEVICE_CPU == kDLCPU && ARROW_DEVICE_CUDA == kDLCUDA && ARROW_DEVICE_CUDA_HOST == kDLCUDAHost);
static_assert(ARROW_DEVICE_OPENCL == kDLOpenCL && ARROW_DEVICE_VULKAN == kDLVulkan && ARROW_DEVICE_METAL == kDLMetal);
static_assert(ARROW_DEVICE_VPI == kDLVPI && ARROW_DEVICE_ROCM == kDLROCM && ARROW_DEVICE_ROCM_HOST == kDLROCMHost);
static_assert(ARROW_DEVICE_EXT_DEV == kDLExtDev && ARROW_DEVICE_CUDA_MANAGED == kDLCUDAManaged);
static_assert(ARROW_DEVICE_ONEAPI == kDLOneAPI && ARROW_DEVICE_WEBGPU == kDLWebGPU && ARROW_DEVICE_HEXAGON == kDLHexagon);

// ---- helpers ----------------------------------------------------------------------------------------------------
tw::ArrowExportOptions with_copy(bool copy) {
  tw::ArrowExportOptions o;
  o.copy = copy;
  return o;
}

Tensor arange(tw::Shape shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::vector<float> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0.f);
  return Tensor::adopt(std::move(v), std::move(shape));
}

// Elements in logical row-major order, read through the strides.
template <class T = float>
std::vector<T> elements(const Tensor& t) {
  std::vector<T> out;
  if (t.numel() == 0) return out;
  const size_t nd = t.ndim();
  std::vector<int64_t> idx(nd, 0);
  const auto* base = static_cast<const T*>(t.data_ptr());
  for (int64_t e = 0; e < t.numel(); ++e) {
    int64_t off = 0;
    for (size_t i = 0; i < nd; ++i) off += idx[i] * t.strides()[i];
    out.push_back(base[off]);
    for (size_t k = nd; k-- > 0;) {
      if (++idx[k] < t.shape()[k]) break;
      idx[k] = 0;
    }
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> schema_metadata(const ArrowSchema& s) {
  if (!s.metadata) return {};
  // Walk the framing to find the length, then decode it with the library's strict decoder.
  size_t pos = 4;
  int32_t n;
  std::memcpy(&n, s.metadata, 4);
  for (int32_t i = 0; i < 2 * n; ++i) {
    int32_t len;
    std::memcpy(&len, s.metadata + pos, 4);
    pos += 4 + static_cast<size_t>(len);
  }
  return tw::decode_arrow_metadata(std::string_view(s.metadata, pos));
}

std::string meta_value(const ArrowSchema& s, const std::string& key) {
  for (auto& [k, v] : schema_metadata(s))
    if (k == key) return v;
  return "<absent>";
}

// A hand-built producer: owned schema and array trees whose release callbacks count how often they run.
struct Counts {
  int schema_releases = 0;
  int array_releases = 0;
};

struct OwnedSchema {
  std::string format, name, metadata;
  std::vector<std::unique_ptr<OwnedSchema>> kids;
  std::vector<ArrowSchema*> kid_ptrs;
  ArrowSchema s{};
};

struct SchemaSpec {
  std::string format;
  std::string name;
  std::vector<std::pair<std::string, std::string>> metadata;
  std::vector<SchemaSpec> children;
};

void release_test_schema(ArrowSchema* s) {
  auto* pair = static_cast<std::pair<OwnedSchema*, Counts*>*>(s->private_data);
  for (ArrowSchema* k : pair->first->kid_ptrs) k->release = nullptr;  // children go with the root
  pair->second->schema_releases++;
  delete pair->first;
  delete pair;
  s->release = nullptr;
}

void noop_schema_release(ArrowSchema* s) { s->release = nullptr; }

OwnedSchema* build_schema(const SchemaSpec& spec) {
  auto* o = new OwnedSchema;
  o->format = spec.format;
  o->name = spec.name;
  if (!spec.metadata.empty()) o->metadata = tw::encode_arrow_metadata(spec.metadata);
  for (const auto& c : spec.children) {
    o->kids.emplace_back(build_schema(c));
    o->kid_ptrs.push_back(&o->kids.back()->s);
  }
  o->s.format = o->format.c_str();
  o->s.name = o->name.c_str();
  o->s.metadata = o->metadata.empty() ? nullptr : o->metadata.data();
  o->s.flags = ARROW_FLAG_NULLABLE;
  o->s.n_children = static_cast<int64_t>(o->kids.size());
  o->s.children = o->kid_ptrs.empty() ? nullptr : o->kid_ptrs.data();
  o->s.release = noop_schema_release;
  return o;
}

// Fills `out` with a schema the test owns; its release bumps counts->schema_releases.
void make_schema(const SchemaSpec& spec, ArrowSchema* out, Counts* counts) {
  OwnedSchema* o = build_schema(spec);
  *out = o->s;
  out->release = release_test_schema;
  out->private_data = new std::pair<OwnedSchema*, Counts*>(o, counts);
}

std::vector<std::pair<std::string, std::string>> ext(const std::string& name, const std::string& json) {
  return {{"ARROW:extension:name", name}, {"ARROW:extension:metadata", json}};
}

struct ArraySpec {
  int64_t length = 0, null_count = 0, offset = 0;
  std::vector<const void*> buffers;
  std::vector<ArraySpec> children;
};

struct OwnedArray {
  std::vector<const void*> buffers;
  std::vector<std::unique_ptr<OwnedArray>> kids;
  std::vector<ArrowArray*> kid_ptrs;
  ArrowArray a{};
};

void noop_array_release(ArrowArray* a) { a->release = nullptr; }

void release_test_array(ArrowArray* a) {
  auto* pair = static_cast<std::pair<OwnedArray*, Counts*>*>(a->private_data);
  pair->second->array_releases++;
  delete pair->first;
  delete pair;
  a->release = nullptr;
}

OwnedArray* build_array(const ArraySpec& spec) {
  auto* o = new OwnedArray;
  o->buffers = spec.buffers;
  for (const auto& c : spec.children) {
    o->kids.emplace_back(build_array(c));
    o->kid_ptrs.push_back(&o->kids.back()->a);
  }
  o->a.length = spec.length;
  o->a.null_count = spec.null_count;
  o->a.offset = spec.offset;
  o->a.n_buffers = static_cast<int64_t>(o->buffers.size());
  o->a.n_children = static_cast<int64_t>(o->kids.size());
  o->a.buffers = o->buffers.empty() ? nullptr : o->buffers.data();
  o->a.children = o->kid_ptrs.empty() ? nullptr : o->kid_ptrs.data();
  o->a.release = noop_array_release;
  return o;
}

void make_array(const ArraySpec& spec, ArrowArray* out, Counts* counts) {
  OwnedArray* o = build_array(spec);
  *out = o->a;
  out->release = release_test_array;
  out->private_data = new std::pair<OwnedArray*, Counts*>(o, counts);
}

SchemaSpec fixed_shape_schema(const std::string& value_format, int64_t list_size, const std::string& json) {
  return SchemaSpec{"+w:" + std::to_string(list_size), "", ext("arrow.fixed_shape_tensor", json),
                    {SchemaSpec{value_format, "item", {}, {}}}};
}

ArraySpec fixed_shape_array(int64_t rows, int64_t list_size, const void* data, int64_t offset = 0,
                            int64_t child_offset = 0) {
  ArraySpec child{(offset + rows) * list_size + child_offset, 0, child_offset, {nullptr, data}, {}};
  return ArraySpec{rows, 0, offset, {nullptr}, {child}};
}

// Imports a hand-built (schema, array) pair, checking that both were taken over (released or moved) whatever happens.
struct Imported {
  Counts counts;
  ArrowSchema schema{};
  ArrowArray array{};
};

// ---- export -----------------------------------------------------------------------------------------------------
TEST(ArrowExport, FixedShapeBatchIsZeroCopyWithCanonicalMetadata) {
  Tensor t = arange({2, 3, 4});
  ArrowSchema s;
  ArrowArray a;
  tw::to_arrow(t, &s, &a);
  EXPECT_STREQ(s.format, "+w:12");
  EXPECT_EQ(s.n_children, 1);
  EXPECT_STREQ(s.children[0]->format, "f");
  EXPECT_EQ(meta_value(s, "ARROW:extension:name"), "arrow.fixed_shape_tensor");
  EXPECT_EQ(meta_value(s, "ARROW:extension:metadata"), R"({"shape":[3,4]})");
  EXPECT_EQ(a.length, 2);
  EXPECT_EQ(a.null_count, 0);
  EXPECT_EQ(a.n_buffers, 1);
  ASSERT_EQ(a.n_children, 1);
  EXPECT_EQ(a.children[0]->length, 24);
  EXPECT_EQ(a.children[0]->n_buffers, 2);
  EXPECT_EQ(a.children[0]->buffers[0], nullptr);
  EXPECT_EQ(a.children[0]->buffers[1], t.data_ptr());  // zero-copy
  a.release(&a);
  s.release(&s);
  EXPECT_EQ(a.release, nullptr);
  EXPECT_EQ(s.release, nullptr);
}

TEST(ArrowExport, ExportOutlivesTheTensorAndReleasesExactlyOnce) {
  const int64_t before = tw::arrow_exports_alive();
  ArrowSchema s;
  ArrowArray a;
  const float* p;
  {
    Tensor t = arange({4, 2});
    p = static_cast<const float*>(t.data_ptr());
    tw::to_arrow(t, &s, &a);
  }
  EXPECT_GT(tw::arrow_exports_alive(), before);
  EXPECT_EQ(static_cast<const float*>(a.children[0]->buffers[1]), p);
  EXPECT_EQ(p[7], 7.f);  // still alive: the export holds the buffer
  // A consumer may move the struct: bitwise copy, then mark the source released.
  ArrowArray moved = a;
  a.release = nullptr;
  moved.release(&moved);
  EXPECT_EQ(tw::arrow_exports_alive(), before);
  s.release(&s);
}

TEST(ArrowExport, MovedChildOutlivesItsParent) {
  Tensor t = arange({3, 2});
  ArrowSchema s;
  ArrowArray a;
  tw::to_arrow(t, &s, &a);
  ArrowArray child = *a.children[0];  // move the child out
  a.children[0]->release = nullptr;
  a.release(&a);
  EXPECT_EQ(static_cast<const float*>(child.buffers[1])[5], 5.f);
  child.release(&child);
  s.release(&s);
}

TEST(ArrowExport, DensePermutedLayoutKeepsItsMemoryAndWritesPermutation) {
  Tensor nchw = arange({2, 3, 4, 5});
  Tensor nhwc = nchw.permute({0, 2, 3, 1});
  tw::ArrowExportOptions o;
  o.copy = false;
  o.dim_names = {"H", "W", "C"};
  auto arr = tw::ArrowTensorArray::from_tensor(nhwc, o);
  EXPECT_FALSE(arr.copied());
  EXPECT_EQ(arr.type().shape, (std::vector<int64_t>{3, 4, 5}));
  EXPECT_EQ(arr.type().permutation, (std::vector<int64_t>{1, 2, 0}));
  EXPECT_EQ(arr.type().logical_shape(), (std::vector<int64_t>{4, 5, 3}));
  EXPECT_EQ(arr.type().dim_names, (std::vector<std::string>{"C", "H", "W"}));  // physical order, as the spec says
  ArrowSchema s;
  ArrowArray a;
  arr.export_to(&s, &a);
  EXPECT_EQ(meta_value(s, "ARROW:extension:metadata"),
            R"({"shape":[3,4,5],"dim_names":["C","H","W"],"permutation":[1,2,0]})");
  EXPECT_EQ(a.children[0]->buffers[1], nchw.data_ptr());
  // Back: the same memory, the logical NHWC view.
  Tensor back = tw::from_arrow(&s, &a);
  EXPECT_EQ(back.data_ptr(), nchw.data_ptr());
  EXPECT_EQ(back.shape(), nhwc.shape());
  EXPECT_EQ(back.strides(), nhwc.strides());
  EXPECT_TRUE(back.readonly());
  EXPECT_EQ(elements(back), elements(nhwc));
}

TEST(ArrowExport, TransposedMatrixRowsAreAPermutation) {
  Tensor base = arange({4, 3, 2});
  Tensor t = base.transpose(1, 2);  // rows stay outermost; each row is a transposed matrix
  auto arr = tw::ArrowTensorArray::from_tensor(t, with_copy(false));
  EXPECT_EQ(arr.type().permutation, (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(arr.type().shape, (std::vector<int64_t>{3, 2}));
}

TEST(ArrowExport, LayoutsArrowCannotDescribeAreCopiedOnceOrRefused) {
  Tensor base = arange({4, 6});
  const std::vector<Tensor> cases = {
      base.slice(1, 0, 6, 2),              // gaps inside a row
      base.slice(0, 0, 4, 2),              // row stride of two rows
      base.slice(1, std::nullopt, std::nullopt, -1),  // negative stride
      arange({1, 6}).expand({4, 6}),       // zero stride (broadcast rows)
      base.transpose(0, 1),                // rows not outermost
  };
  for (const Tensor& t : cases) {
    SCOPED_TRACE(t.strides().str());
    TW_EXPECT_ERROR_MSG(tw::ArrowTensorArray::from_tensor(t, with_copy(false)), ErrorCode::copy_required, "copy=False");
    auto arr = tw::ArrowTensorArray::from_tensor(t);
    EXPECT_TRUE(arr.copied());
    ArrowSchema s;
    ArrowArray a;
    arr.export_to(&s, &a);
    Tensor back = tw::from_arrow(&s, &a);
    EXPECT_EQ(back.shape(), t.shape());
    EXPECT_EQ(elements(back), elements(t));
  }
}

TEST(ArrowExport, GappedRowsOfAPermutedBatchKeepTheirOrderInTheCopy) {
  Tensor nhwc = arange({4, 3, 2, 5}).permute({0, 2, 3, 1});
  Tensor every_other = nhwc.slice(0, 0, 4, 2);
  auto arr = tw::ArrowTensorArray::from_tensor(every_other);
  EXPECT_TRUE(arr.copied());
  EXPECT_EQ(arr.type().permutation, (std::vector<int64_t>{1, 2, 0}));  // a memcpy-friendly copy, not a transpose
}

TEST(ArrowExport, CopyTrueAlwaysCopies) {
  Tensor t = arange({2, 2});
  auto arr = tw::ArrowTensorArray::from_tensor(t, with_copy(true));
  EXPECT_TRUE(arr.copied());
  EXPECT_NE(arr.data().data_ptr(), t.data_ptr());
}

TEST(ArrowExport, OneDimensionalIsAPrimitiveArrayAndZeroDimensionalIsRefused) {
  Tensor t = arange({5});
  ArrowSchema s;
  ArrowArray a;
  tw::to_arrow(t, &s, &a);
  EXPECT_STREQ(s.format, "f");
  EXPECT_EQ(s.n_children, 0);
  EXPECT_EQ(s.metadata, nullptr);
  EXPECT_EQ(a.length, 5);
  EXPECT_EQ(a.n_buffers, 2);
  EXPECT_EQ(a.buffers[1], t.data_ptr());
  a.release(&a);
  s.release(&s);
  TW_EXPECT_ERROR_MSG(tw::to_arrow(arange({}), &s, &a), ErrorCode::invalid_argument, "0-d");
}

TEST(ArrowExport, EveryPrimitiveDtypeHasItsFormat) {
  const std::pair<DType, const char*> cases[] = {
      {DType::int8(), "c"},     {DType::uint8(), "C"},   {DType::int16(), "s"},   {DType::uint16(), "S"},
      {DType::int32(), "i"},    {DType::uint32(), "I"},  {DType::int64(), "l"},   {DType::uint64(), "L"},
      {DType::float16(), "e"},  {DType::float32(), "f"}, {DType::float64(), "g"},
  };
  for (auto [d, f] : cases) {
    Tensor t = Tensor::zeros({3, 2}, d);
    ArrowSchema s;
    ArrowArray a;
    tw::to_arrow(t, &s, &a);
    EXPECT_STREQ(s.children[0]->format, f) << d.name();
    Tensor back = tw::from_arrow(&s, &a);
    EXPECT_EQ(back.dtype(), d);
    EXPECT_EQ(back.data_ptr(), t.data_ptr());
  }
}

TEST(ArrowExport, BoolTravelsAsBool8ZeroCopy) {
  Tensor t = Tensor::zeros({2, 3}, DType::boolean());
  static_cast<uint8_t*>(t.data_ptr())[4] = 1;
  ArrowSchema s;
  ArrowArray a;
  tw::to_arrow(t, &s, &a);
  EXPECT_STREQ(s.children[0]->format, "c");
  EXPECT_EQ(meta_value(*s.children[0], "ARROW:extension:name"), "arrow.bool8");
  EXPECT_EQ(meta_value(*s.children[0], "ARROW:extension:metadata"), "");
  Tensor back = tw::from_arrow(&s, &a);
  EXPECT_EQ(back.dtype(), DType::boolean());
  EXPECT_EQ(back.data_ptr(), t.data_ptr());
}

TEST(ArrowExport, DtypesWithoutACanonicalArrowTypeAreRefused) {
  for (DType d : {DType::bfloat16(), DType::complex64(), DType::complex128(), DType::float8_e4m3fn(),
                  DType::float8_e5m2(), DType::int4(), DType{kDLFloat, 32, 4}}) {
    Tensor t = Tensor::zeros({2, 2}, d);
    ArrowSchema s;
    ArrowArray a;
    TW_EXPECT_ERROR_MSG(tw::to_arrow(t, &s, &a), ErrorCode::unsupported, d.name());
  }
}

TEST(ArrowExport, MetadataTravelsUnderTheDocumentedKey) {
  Tensor t = arange({2, 2});
  t.metadata().set("frame", tw::Value(int64_t{7}));
  t.metadata().set("tags", tw::Value::list({tw::Value("a"), tw::Value::bytes(std::string("\0b", 2))}));
  ArrowSchema s;
  ArrowArray a;
  tw::to_arrow(t, &s, &a);
  EXPECT_EQ(tw::decode_metadata(meta_value(s, std::string(tw::kArrowMetadataKey))), t.metadata());
  Tensor back = tw::from_arrow(&s, &a);
  EXPECT_EQ(back.metadata(), t.metadata());
}

TEST(ArrowExport, FieldNameAndDimNamesAreWritten) {
  tw::ArrowExportOptions o;
  o.name = "images";
  o.dim_names = {"x", "y"};
  ArrowSchema s;
  ArrowArray a;
  tw::to_arrow(arange({1, 2, 3}), &s, &a, o);
  EXPECT_STREQ(s.name, "images");
  EXPECT_EQ(meta_value(s, "ARROW:extension:metadata"), R"({"shape":[2,3],"dim_names":["x","y"]})");
  auto cols = tw::from_arrow_columns(&s, &a);
  EXPECT_EQ(cols.columns[0].name, "images");
  EXPECT_EQ(cols.columns[0].dim_names, (std::vector<std::string>{"x", "y"}));
  o.dim_names = {"x"};
  TW_EXPECT_ERROR(tw::to_arrow(arange({1, 2, 3}), &s, &a, o), ErrorCode::invalid_argument);
  o.dim_names = {"x", std::string("\xff")};
  TW_EXPECT_ERROR_MSG(tw::to_arrow(arange({1, 2, 3}), &s, &a, o), ErrorCode::invalid_argument, "UTF-8");
}

TEST(ArrowExport, EmptyBatchesHaveNonNullBuffers) {
  ArrowSchema s;
  ArrowArray a;
  tw::to_arrow(Tensor::zeros({0, 3}, DType::float32()), &s, &a);
  EXPECT_EQ(a.length, 0);
  EXPECT_NE(a.children[0]->buffers[1], nullptr);
  Tensor back = tw::from_arrow(&s, &a);
  EXPECT_EQ(back.shape(), (tw::Shape{0, 3}));
}

// ---- variable shape ---------------------------------------------------------------------------------------------
TEST(ArrowVariableShape, ListsPackIntoOneBufferWithShapesAndOffsets) {
  std::vector<Tensor> ts = {arange({2, 3}), arange({4, 3}), arange({0, 3})};
  ts[0].metadata().set("k", tw::Value(true));
  ts[1].metadata().set("k", tw::Value(true));
  ts[2].metadata().set("k", tw::Value(true));
  ArrowSchema s;
  ArrowArray a;
  tw::to_arrow(std::span<const Tensor>(ts), &s, &a);
  EXPECT_STREQ(s.format, "+s");
  ASSERT_EQ(s.n_children, 2);
  EXPECT_STREQ(s.children[0]->name, "data");
  EXPECT_STREQ(s.children[0]->format, "+l");
  EXPECT_STREQ(s.children[1]->name, "shape");
  EXPECT_STREQ(s.children[1]->format, "+w:2");
  EXPECT_STREQ(s.children[1]->children[0]->format, "i");
  EXPECT_EQ(meta_value(s, "ARROW:extension:name"), "arrow.variable_shape_tensor");
  EXPECT_EQ(meta_value(s, "ARROW:extension:metadata"), R"({"uniform_shape":[null,3]})");
  EXPECT_EQ(a.length, 3);
  const auto* offs = static_cast<const int32_t*>(a.children[0]->buffers[1]);
  EXPECT_EQ(std::vector<int32_t>(offs, offs + 4), (std::vector<int32_t>{0, 6, 18, 18}));
  const auto* shapes = static_cast<const int32_t*>(a.children[1]->children[0]->buffers[1]);
  EXPECT_EQ(std::vector<int32_t>(shapes, shapes + 6), (std::vector<int32_t>{2, 3, 4, 3, 0, 3}));
  // Back, as a list of views into the one buffer.
  TW_EXPECT_ERROR_MSG(
      {
        ArrowSchema s2;
        ArrowArray a2;
        tw::to_arrow(std::span<const Tensor>(ts), &s2, &a2);
        tw::from_arrow(&s2, &a2);
      },
      ErrorCode::unsupported, "from_arrow_columns");
  auto cols = tw::from_arrow_columns(&s, &a);
  ASSERT_EQ(cols.columns.size(), 1u);
  EXPECT_TRUE(cols.columns[0].variable_shape);
  ASSERT_EQ(cols.columns[0].tensors.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(cols.columns[0].tensors[i].shape(), ts[i].shape());
    EXPECT_EQ(elements(cols.columns[0].tensors[i]), elements(ts[i]));
    EXPECT_EQ(cols.columns[0].tensors[i].metadata(), ts[0].metadata());
  }
}

TEST(ArrowVariableShape, ACommonDenseOrderIsKeptAsAPermutation) {
  std::vector<Tensor> ts = {arange({3, 2, 4}).permute({1, 2, 0}), arange({5, 1, 2}).permute({1, 2, 0})};
  auto arr = tw::ArrowTensorArray::from_tensors(ts);
  EXPECT_EQ(arr.type().permutation, (std::vector<int64_t>{1, 2, 0}));
  ArrowSchema s;
  ArrowArray a;
  arr.export_to(&s, &a);
  auto cols = tw::from_arrow_columns(&s, &a);
  for (size_t i = 0; i < ts.size(); ++i) {
    EXPECT_EQ(cols.columns[0].tensors[i].shape(), ts[i].shape());
    EXPECT_EQ(elements(cols.columns[0].tensors[i]), elements(ts[i]));
  }
}

TEST(ArrowVariableShape, RefusesWhatItCannotPack) {
  std::vector<Tensor> ts = {arange({2}), arange({3})};
  TW_EXPECT_ERROR_MSG(tw::ArrowTensorArray::from_tensors(ts, with_copy(false)), ErrorCode::copy_required, "copy=False");
  TW_EXPECT_ERROR(tw::ArrowTensorArray::from_tensors({}), ErrorCode::invalid_argument);
  std::vector<Tensor> mixed_dtype = {arange({2}), Tensor::zeros({2}, DType::int32())};
  TW_EXPECT_ERROR(tw::ArrowTensorArray::from_tensors(mixed_dtype), ErrorCode::type_mismatch);
  std::vector<Tensor> mixed_rank = {arange({2}), arange({2, 1})};
  TW_EXPECT_ERROR(tw::ArrowTensorArray::from_tensors(mixed_rank), ErrorCode::invalid_argument);
  std::vector<Tensor> scalars = {arange({}), arange({})};
  TW_EXPECT_ERROR(tw::ArrowTensorArray::from_tensors(scalars), ErrorCode::invalid_argument);
  std::vector<Tensor> md = {arange({2}), arange({2})};
  md[1].metadata().set("x", tw::Value(1.5));
  TW_EXPECT_ERROR_MSG(tw::ArrowTensorArray::from_tensors(md), ErrorCode::invalid_argument, "metadata");
  // More elements than int32 offsets can count: a broadcast view names them without memory.
  std::vector<Tensor> huge = {arange({1}).expand({int64_t(1) << 31})};
  TW_EXPECT_ERROR_MSG(tw::ArrowTensorArray::from_tensors(huge), ErrorCode::overflow, "int32");
}

// ---- import of hand-built arrays -----------------------------------------------------------------------------------
TEST(ArrowImport, PrimitiveWithOffsetIsAZeroCopyView) {
  std::vector<int32_t> data = {10, 11, 12, 13, 14};
  Imported im;
  make_schema({"i", "x", {}, {}}, &im.schema, &im.counts);
  make_array({3, 0, 2, {nullptr, data.data()}, {}}, &im.array, &im.counts);
  {
    Tensor t = tw::from_arrow(&im.schema, &im.array);
    EXPECT_EQ(im.schema.release, nullptr);  // released
    EXPECT_EQ(im.array.release, nullptr);   // moved
    EXPECT_EQ(im.counts.schema_releases, 1);
    EXPECT_EQ(im.counts.array_releases, 0);
    EXPECT_EQ(t.data_ptr(), data.data() + 2);
    EXPECT_EQ(elements<int32_t>(t), (std::vector<int32_t>{12, 13, 14}));
    Tensor view = t.slice(0, 1, 2);
    t = Tensor();
    EXPECT_EQ(im.counts.array_releases, 0);  // the view keeps it
  }
  EXPECT_EQ(im.counts.array_releases, 1);
}

TEST(ArrowImport, FixedShapeHonoursParentAndChildOffsets) {
  std::vector<float> data(40);
  std::iota(data.begin(), data.end(), 0.f);
  Imported im;
  make_schema(fixed_shape_schema("f", 6, R"({"shape": [2, 3]})"), &im.schema, &im.counts);
  make_array(fixed_shape_array(2, 6, data.data(), /*offset=*/1, /*child_offset=*/4), &im.array, &im.counts);
  Tensor t = tw::from_arrow(&im.schema, &im.array);
  EXPECT_EQ(t.shape(), (tw::Shape{2, 2, 3}));
  EXPECT_EQ(t.data_ptr(), data.data() + 4 + 6);
  EXPECT_EQ(elements(t)[0], 10.f);
}

TEST(ArrowImport, PermutationFollowsTheSpec) {
  // Physical (2, 3, 4) per row; permutation [2, 0, 1]: logical shape (4, 2, 3), logical i = physical perm[i].
  std::vector<float> data(48);
  std::iota(data.begin(), data.end(), 0.f);
  Imported im;
  make_schema(fixed_shape_schema("f", 24, R"({"shape":[2,3,4],"permutation":[2,0,1],"dim_names":["a","b","c"]})"),
              &im.schema, &im.counts);
  make_array(fixed_shape_array(2, 24, data.data()), &im.array, &im.counts);
  auto cols = tw::from_arrow_columns(&im.schema, &im.array);
  const Tensor& t = cols.columns[0].tensors[0];
  EXPECT_EQ(t.shape(), (tw::Shape{2, 4, 2, 3}));
  EXPECT_EQ(t.strides(), (tw::Strides{24, 1, 12, 4}));
  EXPECT_EQ(cols.columns[0].dim_names, (std::vector<std::string>{"c", "a", "b"}));
}

TEST(ArrowImport, NullsAreRefusedAndAnAllValidBitmapIsAccepted) {
  std::vector<float> data(4, 1.f);
  uint8_t some_null = 0b1011, all_valid = 0xFF;
  for (auto [bitmap, null_count, ok] : {std::tuple{&some_null, int64_t{1}, false}, std::tuple{&some_null, int64_t{-1}, false},
                                        std::tuple{&all_valid, int64_t{-1}, true}, std::tuple{&all_valid, int64_t{0}, true}}) {
    Imported im;
    make_schema({"f", "", {}, {}}, &im.schema, &im.counts);
    make_array({4, null_count, 0, {bitmap, data.data()}, {}}, &im.array, &im.counts);
    if (ok) {
      EXPECT_EQ(tw::from_arrow(&im.schema, &im.array).numel(), 4);
    } else {
      TW_EXPECT_ERROR_MSG(tw::from_arrow(&im.schema, &im.array), ErrorCode::invalid_argument, "null");
    }
    EXPECT_EQ(im.counts.array_releases, 1);
    EXPECT_EQ(im.counts.schema_releases, 1);
    EXPECT_EQ(im.array.release, nullptr);
  }
  // Nulls among the values of a fixed-size list too, but only inside the rows imported.
  std::vector<float> vals(6, 2.f);
  uint8_t child_bits = 0b001111;  // values 4 and 5 null: the second row
  Imported im;
  make_schema(fixed_shape_schema("f", 2, R"({"shape":[2]})"), &im.schema, &im.counts);
  ArraySpec arr = fixed_shape_array(3, 2, vals.data());
  arr.children[0].buffers[0] = &child_bits;
  arr.children[0].null_count = 2;
  make_array(arr, &im.array, &im.counts);
  TW_EXPECT_ERROR_MSG(tw::from_arrow(&im.schema, &im.array), ErrorCode::invalid_argument, "slot 4 is null");
  Imported ok;
  make_schema(fixed_shape_schema("f", 2, R"({"shape":[2]})"), &ok.schema, &ok.counts);
  ArraySpec first_two = fixed_shape_array(2, 2, vals.data());
  first_two.children[0].buffers[0] = &child_bits;
  first_two.children[0].null_count = 2;
  make_array(first_two, &ok.array, &ok.counts);
  EXPECT_EQ(tw::from_arrow(&ok.schema, &ok.array).shape(), (tw::Shape{2, 2}));
}

TEST(ArrowImport, MalformedArraysAreRefusedAndStillReleasedOnce) {
  std::vector<float> data(12, 0.f);
  struct Case {
    const char* what;
    ArraySpec array;
    const char* message;
  };
  ArraySpec short_child = fixed_shape_array(2, 6, data.data());
  short_child.children[0].length = 11;  // inconsistent: two rows of 6 need 12 values
  ArraySpec null_data = fixed_shape_array(2, 6, nullptr);
  ArraySpec too_few_buffers = fixed_shape_array(2, 6, data.data());
  too_few_buffers.children[0].buffers = {nullptr};
  ArraySpec no_children = ArraySpec{2, 0, 0, {nullptr}, {}};
  ArraySpec negative_length = fixed_shape_array(2, 6, data.data());
  negative_length.length = -1;
  ArraySpec negative_offset = fixed_shape_array(2, 6, data.data());
  negative_offset.offset = -3;
  ArraySpec bad_null_count = fixed_shape_array(2, 6, data.data());
  bad_null_count.null_count = -7;
  ArraySpec count_without_bitmap = fixed_shape_array(2, 6, data.data());
  count_without_bitmap.null_count = 1;
  const Case cases[] = {
      {"child too short", short_child, "length is 11"},
      {"null data buffer", null_data, "data buffer is NULL"},
      {"too few buffers", too_few_buffers, "n_buffers"},
      {"no child", no_children, "n_children"},
      {"negative length", negative_length, "negative length"},
      {"negative offset", negative_offset, "negative offset"},
      {"bad null count", bad_null_count, "null_count"},
      {"null count without bitmap", count_without_bitmap, "validity bitmap is NULL"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    Imported im;
    make_schema(fixed_shape_schema("f", 6, R"({"shape":[6]})"), &im.schema, &im.counts);
    make_array(c.array, &im.array, &im.counts);
    TW_EXPECT_ERROR_MSG(tw::from_arrow(&im.schema, &im.array), ErrorCode::invalid_argument, c.message);
    EXPECT_EQ(im.counts.array_releases, 1);
    EXPECT_EQ(im.counts.schema_releases, 1);
    EXPECT_EQ(im.array.release, nullptr);
    EXPECT_EQ(im.schema.release, nullptr);
  }
}

TEST(ArrowImport, ReleasedStructsAreRefused) {
  Imported im;
  make_schema({"f", "", {}, {}}, &im.schema, &im.counts);
  ArrowArray released{};
  TW_EXPECT_ERROR_MSG(tw::from_arrow(&im.schema, &released), ErrorCode::invalid_argument, "released");
  EXPECT_EQ(im.counts.schema_releases, 1);  // the schema was still taken over
  TW_EXPECT_ERROR(tw::from_arrow(nullptr, static_cast<ArrowArray*>(nullptr)), ErrorCode::invalid_argument);
}

TEST(ArrowImport, BitPackedBooleansAreUnpackedOnlyWithACopy) {
  uint8_t bits[2] = {0b10110010, 0b1};
  Imported im;
  make_schema({"b", "", {}, {}}, &im.schema, &im.counts);
  make_array({6, 0, 3, {nullptr, bits}, {}}, &im.array, &im.counts);  // bits 3..8
  Tensor t = tw::from_arrow(&im.schema, &im.array);
  EXPECT_EQ(t.dtype(), DType::boolean());
  EXPECT_EQ(elements<uint8_t>(t), (std::vector<uint8_t>{0, 1, 1, 0, 1, 1}));
  EXPECT_FALSE(t.readonly());  // a copy
  EXPECT_EQ(im.counts.array_releases, 1);  // nothing views the producer's memory
  Imported never;
  make_schema({"b", "", {}, {}}, &never.schema, &never.counts);
  make_array({6, 0, 0, {nullptr, bits}, {}}, &never.array, &never.counts);
  TW_EXPECT_ERROR_MSG(tw::from_arrow(&never.schema, &never.array, {.copy = false}), ErrorCode::copy_required, "bit-packed");
}

TEST(ArrowImport, Bool8ValuesOtherThanOneAreNormalised) {
  int8_t raw[4] = {0, 1, 0, 1};
  Imported clean;
  make_schema({"c", "", ext("arrow.bool8", ""), {}}, &clean.schema, &clean.counts);
  make_array({4, 0, 0, {nullptr, raw}, {}}, &clean.array, &clean.counts);
  Tensor t = tw::from_arrow(&clean.schema, &clean.array);
  EXPECT_EQ(t.data_ptr(), raw);  // zero-copy
  int8_t loose[3] = {0, 5, -1};
  Imported im;
  make_schema({"c", "", ext("arrow.bool8", ""), {}}, &im.schema, &im.counts);
  make_array({3, 0, 0, {nullptr, loose}, {}}, &im.array, &im.counts);
  Tensor n = tw::from_arrow(&im.schema, &im.array);
  EXPECT_EQ(elements<uint8_t>(n), (std::vector<uint8_t>{0, 1, 1}));
}

TEST(ArrowImport, CopyTrueReturnsWritableCopiesAndReleasesAtOnce) {
  std::vector<float> data = {1, 2, 3};
  Imported im;
  make_schema({"f", "", {}, {}}, &im.schema, &im.counts);
  make_array({3, 0, 0, {nullptr, data.data()}, {}}, &im.array, &im.counts);
  Tensor t = tw::from_arrow(&im.schema, &im.array, {.copy = true});
  EXPECT_NE(t.data_ptr(), data.data());
  EXPECT_FALSE(t.readonly());
  EXPECT_EQ(im.counts.array_releases, 1);
}

TEST(ArrowImport, RecordBatchesGiveOneColumnPerField) {
  std::vector<float> a_data(6, 1.f);
  std::vector<int64_t> b_data = {7, 8, 9};
  Imported im;
  Tensor meta_src = arange({1});
  meta_src.metadata().set("unit", tw::Value("m"));
  SchemaSpec a_field = fixed_shape_schema("f", 2, R"({"shape":[2]})");
  a_field.name = "a";
  a_field.metadata.emplace_back(std::string(tw::kArrowMetadataKey), tw::encode_metadata(meta_src.metadata()));
  make_schema({"+s", "", {}, {a_field, SchemaSpec{"l", "b", {}, {}}}}, &im.schema, &im.counts);
  ArraySpec rb{2, 0, 1, {nullptr}, {fixed_shape_array(3, 2, a_data.data()), ArraySpec{3, 0, 0, {nullptr, b_data.data()}, {}}}};
  make_array(rb, &im.array, &im.counts);
  auto cols = tw::from_arrow_columns(&im.schema, &im.array);
  EXPECT_TRUE(cols.record_batch);
  ASSERT_EQ(cols.columns.size(), 2u);
  EXPECT_EQ(cols.columns[0].name, "a");
  EXPECT_EQ(cols.columns[0].tensors[0].shape(), (tw::Shape{2, 2}));
  EXPECT_EQ(cols.columns[0].tensors[0].metadata(), meta_src.metadata());
  EXPECT_EQ(elements<int64_t>(cols.columns[1].tensors[0]), (std::vector<int64_t>{8, 9}));  // the batch's offset
}

// ---- schemas ------------------------------------------------------------------------------------------------------
tw::ArrowTensorType parse(const SchemaSpec& spec) {
  Counts c;
  ArrowSchema s;
  make_schema(spec, &s, &c);
  struct Release {
    ArrowSchema* s;
    ~Release() { s->release(s); }
  } r{&s};
  return tw::parse_arrow_schema(s);
}

TEST(ArrowSchemaParse, MalformedFormatsAndParametersAreRefused) {
  struct Case {
    SchemaSpec spec;
    ErrorCode code;
    const char* message;
  };
  const Case cases[] = {
      {fixed_shape_schema("f", 6, R"({"shape":[2,4]})"), ErrorCode::invalid_argument, "FixedSizeList size is 6"},
      {fixed_shape_schema("f", 6, R"({"shape":[2,-3]})"), ErrorCode::invalid_argument, "outside"},
      {fixed_shape_schema("f", 6, R"({"shape":[2,3.0]})"), ErrorCode::invalid_argument, "integers"},
      {fixed_shape_schema("f", 6, R"({"dim_names":["a"]})"), ErrorCode::invalid_argument, "no 'shape'"},
      {fixed_shape_schema("f", 6, R"({"shape":[2,3],"permutation":[0,0]})"), ErrorCode::invalid_argument, "permutation"},
      {fixed_shape_schema("f", 6, R"({"shape":[2,3],"permutation":[1]})"), ErrorCode::invalid_argument, "permutation"},
      {fixed_shape_schema("f", 6, R"({"shape":[2,3],"dim_names":["a"]})"), ErrorCode::invalid_argument, "dim_names"},
      {fixed_shape_schema("f", 6, R"({"shape":[2,3],"dim_names":[1,2]})"), ErrorCode::invalid_argument, "strings"},
      {fixed_shape_schema("f", 6, R"({"shape":[2,3],)"), ErrorCode::invalid_argument, "invalid JSON"},
      {fixed_shape_schema("f", 6, R"({"shape":[2,3],"shape":[6]})"), ErrorCode::invalid_argument, "duplicate key"},
      {fixed_shape_schema("f", 6, R"([2,3])"), ErrorCode::invalid_argument, "JSON object"},
      {fixed_shape_schema("f", 6, ""), ErrorCode::invalid_argument, "missing"},
      {fixed_shape_schema("u", 6, R"({"shape":[6]})"), ErrorCode::unsupported, "string"},
      {SchemaSpec{"+w:abc", "", ext("arrow.fixed_shape_tensor", R"({"shape":[1]})"), {{"f", "", {}, {}}}},
       ErrorCode::invalid_argument, "fixed-size list format"},
      {SchemaSpec{"+w:", "", {}, {{"f", "", {}, {}}}}, ErrorCode::invalid_argument, "fixed-size list format"},
      {SchemaSpec{"+w:-1", "", {}, {{"f", "", {}, {}}}}, ErrorCode::invalid_argument, "fixed-size list format"},
      {SchemaSpec{"+w:99999999999", "", {}, {{"f", "", {}, {}}}}, ErrorCode::invalid_argument, "fixed-size list"},
      {SchemaSpec{"+w:4", "", {}, {}}, ErrorCode::invalid_argument, "exactly one child"},
      {SchemaSpec{"f", "", {}, {{"f", "", {}, {}}}}, ErrorCode::invalid_argument, "children"},
      {SchemaSpec{"+l", "", ext("arrow.fixed_shape_tensor", R"({"shape":[1]})"), {{"f", "", {}, {}}}},
       ErrorCode::invalid_argument, "FixedSizeList"},
      {SchemaSpec{"u", "", {}, {}}, ErrorCode::unsupported, "string"},
      {SchemaSpec{"tsu:UTC", "", {}, {}}, ErrorCode::unsupported, "date/time"},
      {SchemaSpec{"", "", {}, {}}, ErrorCode::unsupported, "format ''"},
      {SchemaSpec{"g", "", ext("some.other", ""), {}}, ErrorCode::unsupported, "not a tensor type"},
      {SchemaSpec{"f", "", ext("arrow.bool8", ""), {}}, ErrorCode::invalid_argument, "int8"},
      {SchemaSpec{"f", "", {{"ARROW:extension:name", "a"}, {"ARROW:extension:name", "b"}}, {}},
       ErrorCode::invalid_argument, "twice"},
      {SchemaSpec{"f", "", {{std::string(tw::kArrowMetadataKey), "TWMD\x02"}}, {}}, ErrorCode::invalid_argument,
       "tensorwire.metadata"},
      {SchemaSpec{"+s", "", {}, {{"+s", "inner", {}, {}}}}, ErrorCode::unsupported, "nested struct"},
      {SchemaSpec{"+s", "", ext("arrow.variable_shape_tensor", ""), {{"+l", "shape", {}, {{"f", "", {}, {}}}},
                                                                     {"+w:2", "data", {}, {{"i", "", {}, {}}}}}},
       ErrorCode::invalid_argument, "'data' then 'shape'"},
      {SchemaSpec{"+s", "", ext("arrow.variable_shape_tensor", ""), {{"+l", "data", {}, {{"f", "", {}, {}}}},
                                                                     {"+w:2", "shape", {}, {{"l", "", {}, {}}}}}},
       ErrorCode::invalid_argument, "int32"},
      {SchemaSpec{"+s", "", ext("arrow.variable_shape_tensor", R"({"uniform_shape":[1,"x"]})"),
                  {{"+l", "data", {}, {{"f", "", {}, {}}}}, {"+w:2", "shape", {}, {{"i", "", {}, {}}}}}},
       ErrorCode::invalid_argument, "uniform_shape"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.spec.format + " " + (c.spec.metadata.empty() ? "" : c.spec.metadata.back().second));
    TW_EXPECT_ERROR_MSG(parse(c.spec), c.code, c.message);
  }
}

TEST(ArrowSchemaParse, DictionariesAndReleasedSchemasAreRefused) {
  Counts c;
  ArrowSchema s, dict;
  make_schema({"i", "", {}, {}}, &s, &c);
  make_schema({"u", "", {}, {}}, &dict, &c);
  s.dictionary = &dict;
  TW_EXPECT_ERROR_MSG(tw::parse_arrow_schema(s), ErrorCode::unsupported, "dictionary");
  s.dictionary = nullptr;
  s.release(&s);
  dict.release(&dict);
  TW_EXPECT_ERROR_MSG(tw::parse_arrow_schema(s), ErrorCode::invalid_argument, "released");
}

TEST(ArrowSchemaParse, TheJsonReaderIsStrict) {
  const char* bad[] = {
      R"({"shape":[6],})",          R"({"shape":[06]})",         R"({"shape":[6]} x)",
      R"({'shape':[6]})",           R"({"shape":[NaN]})",        R"({"shape":[6] /* c */})",
      "{\"shape\":[6],\"dim_names\":[\"a\tb\"]}",  // raw control character
      "{\"shape\":[6],\"dim_names\":[\"\xc0\xaf\"]}",  // overlong UTF-8
      "{\"shape\":[6],\"dim_names\":[\"\xed\xa0\x80\"]}",  // encoded surrogate
      R"({"shape":[6],"dim_names":["\ud800"]})",  // lone surrogate
      R"({"shape":[6],"dim_names":["\x41"]})",    // invalid escape
      R"({"shape":[6],"x":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]})",  // too deep
      R"({"shape":[6],"x":1e})",    R"({"shape":[6],"x":-})",    R"({"shape":[6],"x":tru})",
      R"({"shape":[6])",            R"({"shape":[6]}})",          "",
  };
  for (const char* json : bad) {
    SCOPED_TRACE(json);
    if (*json == '\0') {
      TW_EXPECT_ERROR_MSG(parse(fixed_shape_schema("f", 6, json)), ErrorCode::invalid_argument, "missing");
    } else {
      TW_EXPECT_ERROR_MSG(parse(fixed_shape_schema("f", 6, json)), ErrorCode::invalid_argument, "JSON");
    }
  }
  // Accepted: whitespace, escapes, surrogate pairs, unknown keys with any value.
  auto t = parse(fixed_shape_schema(
      "f", 6, " {\n\"shape\" : [ 2 , 3 ], \"dim_names\": [\"\\u00e9\\ud83d\\ude00\", \"\\\"q\\\"\"], "
              "\"future\": {\"a\": [1.5e3, null, true]} }\t"));
  EXPECT_EQ(t.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(t.dim_names[0], "\xc3\xa9\xf0\x9f\x98\x80");
  EXPECT_EQ(t.dim_names[1], "\"q\"");
}

TEST(ArrowSchemaParse, MetadataFramingIsDecodedStrictly) {
  std::vector<std::pair<std::string, std::string>> pairs = {{"a", "1"}, {"", std::string("\0\1", 2)}};
  std::string enc = tw::encode_arrow_metadata(pairs);
  EXPECT_EQ(tw::decode_arrow_metadata(enc), pairs);
  TW_EXPECT_ERROR(tw::decode_arrow_metadata(enc.substr(0, enc.size() - 1)), ErrorCode::invalid_argument);
  TW_EXPECT_ERROR_MSG(tw::decode_arrow_metadata(enc + "x"), ErrorCode::invalid_argument, "trailing");
  TW_EXPECT_ERROR(tw::decode_arrow_metadata("ab"), ErrorCode::invalid_argument);
  std::string negative = enc;
  const int32_t minus_one = -1;
  std::memcpy(negative.data() + 4, &minus_one, 4);
  TW_EXPECT_ERROR_MSG(tw::decode_arrow_metadata(negative), ErrorCode::invalid_argument, "negative");
  std::string too_many = enc;
  const int32_t big = 1 << 30;
  std::memcpy(too_many.data(), &big, 4);
  TW_EXPECT_ERROR_MSG(tw::decode_arrow_metadata(too_many), ErrorCode::invalid_argument, "cannot fit");
}

// ---- streams ------------------------------------------------------------------------------------------------------
// A stream of hand-built fixed-shape chunks; counts its own release.
struct TestStream {
  std::vector<std::vector<float>> chunks;
  int64_t row_size = 2;
  size_t next = 0;
  Counts counts;
  int stream_releases = 0;
  int fail_at = -1;

  static TestStream* self(ArrowArrayStream* s) { return static_cast<TestStream*>(s->private_data); }
  static int get_schema(ArrowArrayStream* s, ArrowSchema* out) {
    make_schema(fixed_shape_schema("f", self(s)->row_size, "{\"shape\":[" + std::to_string(self(s)->row_size) + "]}"),
                out, &self(s)->counts);
    return 0;
  }
  static int get_next(ArrowArrayStream* s, ArrowArray* out) {
    TestStream* t = self(s);
    if (static_cast<int>(t->next) == t->fail_at) return 5;  // EIO
    if (t->next == t->chunks.size()) {
      out->release = nullptr;
      return 0;
    }
    const auto& c = t->chunks[t->next++];
    make_array(fixed_shape_array(static_cast<int64_t>(c.size()) / t->row_size, t->row_size, c.data()), out, &t->counts);
    return 0;
  }
  static const char* last_error(ArrowArrayStream*) { return "the test stream failed on purpose"; }
  static void release(ArrowArrayStream* s) {
    self(s)->stream_releases++;
    s->release = nullptr;
  }
  ArrowArrayStream make() { return ArrowArrayStream{get_schema, get_next, last_error, release, this}; }
};

TEST(ArrowStream, OneChunkIsZeroCopyAndSeveralConcatenateWithACopy) {
  TestStream one;
  one.chunks = {{1, 2, 3, 4}};
  ArrowArrayStream s = one.make();
  Tensor t = tw::from_arrow(&s);
  EXPECT_EQ(s.release, nullptr);
  EXPECT_EQ(one.stream_releases, 1);
  EXPECT_EQ(t.data_ptr(), one.chunks[0].data());
  EXPECT_EQ(t.shape(), (tw::Shape{2, 2}));

  TestStream many;
  many.chunks = {{1, 2}, {}, {3, 4, 5, 6}};
  ArrowArrayStream s2 = many.make();
  Tensor c = tw::from_arrow(&s2);
  EXPECT_EQ(c.shape(), (tw::Shape{3, 2}));
  EXPECT_EQ(elements(c), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(many.counts.array_releases, 3);  // copied: every chunk released already
  EXPECT_EQ(many.stream_releases, 1);

  TestStream forbid;
  forbid.chunks = {{1, 2}, {3, 4}};
  ArrowArrayStream s3 = forbid.make();
  TW_EXPECT_ERROR_MSG(tw::from_arrow(&s3, {.copy = false}), ErrorCode::copy_required, "2 non-empty chunks");
  EXPECT_EQ(forbid.counts.array_releases, 2);
  EXPECT_EQ(forbid.stream_releases, 1);

  TestStream none;
  ArrowArrayStream s4 = none.make();
  EXPECT_EQ(tw::from_arrow(&s4).shape(), (tw::Shape{0, 2}));
}

TEST(ArrowStream, ProducerErrorsCarryItsMessage) {
  TestStream bad;
  bad.chunks = {{1, 2}, {3, 4}};
  bad.fail_at = 1;
  ArrowArrayStream s = bad.make();
  TW_EXPECT_ERROR_MSG(tw::from_arrow(&s), ErrorCode::invalid_argument, "failed on purpose");
  EXPECT_EQ(bad.stream_releases, 1);
  EXPECT_EQ(bad.counts.array_releases, 1);
}

// ---- devices ------------------------------------------------------------------------------------------------------
TEST(ArrowDevice, CpuExportHasNoSyncEvent) {
  Tensor t = arange({2, 2});
  ArrowSchema s;
  ArrowDeviceArray d;
  std::memset(&d, 0xAB, sizeof(d));
  tw::to_arrow(t, &s, &d);
  EXPECT_EQ(d.device_type, ARROW_DEVICE_CPU);
  EXPECT_EQ(d.device_id, 0);
  EXPECT_EQ(d.sync_event, nullptr);
  EXPECT_EQ(d.reserved[0], 0);
  EXPECT_EQ(d.reserved[2], 0);
  Tensor back = tw::from_arrow(&s, &d);
  EXPECT_EQ(back.data_ptr(), t.data_ptr());
  EXPECT_EQ(d.array.release, nullptr);
}

TEST(ArrowDevice, CudaTensorsTravelOnlyThroughTheDeviceInterface) {
  // A CUDA tensor over a fake device address: export and import read no element, so no GPU is needed.
  void* fake = reinterpret_cast<void*>(uintptr_t{0x7f0000001000});
  Tensor t = Tensor::from_blob(fake, {4, 8}, DType::float32(), tw::Device::cuda(1), nullptr);
  ArrowSchema s;
  ArrowArray a;
  TW_EXPECT_ERROR_MSG(tw::to_arrow(t, &s, &a), ErrorCode::unsupported, "Device Data Interface");
  ArrowDeviceArray d;
  tw::to_arrow(t, &s, &d);
  EXPECT_EQ(d.device_type, ARROW_DEVICE_CUDA);
  EXPECT_EQ(d.device_id, 1);
  EXPECT_EQ(d.sync_event, nullptr);  // no stream: the data is ready
  EXPECT_EQ(d.array.children[0]->buffers[1], fake);
  Tensor back = tw::from_arrow(&s, &d);
  EXPECT_EQ(back.device(), tw::Device::cuda(1));
  EXPECT_EQ(back.data_ptr(), fake);
  // A layout needing a copy is copied on the device (tests/cpp/test_cuda_host.cpp runs that against a fake driver).
  // Where no driver reaches cuda:1 it fails naming why; where one does, the fake address must not reach a kernel.
  if (tw::cuda::device_count() < 2) {
    try {
      tw::to_arrow(t.slice(1, 0, 8, 2), &s, &d);
      ADD_FAILURE() << "a strided cuda:1 tensor was exported with no device to copy it";
    } catch (const tw::Error& e) {
      EXPECT_TRUE(e.code() == ErrorCode::device_unavailable || e.code() == ErrorCode::invalid_argument) << e.what();
      EXPECT_NE(std::string(e.what()).find("CUDA"), std::string::npos) << e.what();
    }
  }
  // Lists are packed on the host.
  std::vector<Tensor> list = {t};
  TW_EXPECT_ERROR(tw::to_arrow(std::span<const Tensor>(list), &s, &d), ErrorCode::unsupported);
}

TEST(ArrowDevice, DeviceImportsRefuseWhatTheHostWouldHaveToRead) {
  std::vector<int32_t> offsets = {0, 2};
  std::vector<int32_t> shapes = {2};
  std::vector<float> data = {1, 2};
  Counts c;
  ArrowSchema s;
  make_schema({"+s", "", ext("arrow.variable_shape_tensor", "{}"),
               {{"+l", "data", {}, {{"f", "", {}, {}}}}, {"+w:1", "shape", {}, {{"i", "", {}, {}}}}}},
              &s, &c);
  ArrowDeviceArray d{};
  make_array({1, 0, 0, {nullptr},
              {ArraySpec{1, 0, 0, {nullptr, offsets.data()}, {ArraySpec{2, 0, 0, {nullptr, data.data()}, {}}}},
               ArraySpec{1, 0, 0, {nullptr}, {ArraySpec{1, 0, 0, {nullptr, shapes.data()}, {}}}}}},
             &d.array, &c);
  d.device_type = ARROW_DEVICE_CUDA;
  d.device_id = 0;
  TW_EXPECT_ERROR_MSG(tw::from_arrow_columns(&s, &d), ErrorCode::unsupported, "cannot be read by the host");
  EXPECT_EQ(c.array_releases, 1);
  EXPECT_EQ(c.schema_releases, 1);
}

TEST(ArrowDevice, BadDeviceFieldsAreRefused) {
  std::vector<float> data = {1, 2};
  Counts c;
  ArrowSchema s;
  make_schema({"f", "", {}, {}}, &s, &c);
  ArrowDeviceArray d{};
  make_array({2, 0, 0, {nullptr, data.data()}, {}}, &d.array, &c);
  d.device_type = 99;
  TW_EXPECT_ERROR(tw::from_arrow(&s, &d), ErrorCode::unsupported);
  EXPECT_EQ(c.array_releases, 1);
  ArrowSchema s2;
  make_schema({"f", "", {}, {}}, &s2, &c);
  ArrowDeviceArray d2{};
  make_array({2, 0, 0, {nullptr, data.data()}, {}}, &d2.array, &c);
  d2.device_type = ARROW_DEVICE_CUDA;
  d2.device_id = -4;
  TW_EXPECT_ERROR_MSG(tw::from_arrow(&s2, &d2), ErrorCode::invalid_argument, "device_id");
  EXPECT_EQ(c.array_releases, 2);
}

TEST(ArrowDevice, SyncEventsNeedTheDriver) {
  if (tw::cuda::driver_available()) GTEST_SKIP() << "a CUDA driver is present: the no-driver path cannot be shown";
  std::vector<float> data = {1, 2};
  Counts c;
  ArrowSchema s;
  make_schema({"f", "", {}, {}}, &s, &c);
  ArrowDeviceArray d{};
  make_array({2, 0, 0, {nullptr, data.data()}, {}}, &d.array, &c);
  void* event = reinterpret_cast<void*>(uintptr_t{1});
  d.device_type = ARROW_DEVICE_CUDA;
  d.sync_event = &event;
  TW_EXPECT_ERROR(tw::from_arrow(&s, &d), ErrorCode::device_unavailable);
  EXPECT_EQ(c.array_releases, 1);
  EXPECT_EQ(c.schema_releases, 1);
  // A CUDA tensor on a stream records an event when exported; without a driver no work can be pending: NULL.
  // Without a device runtime installed nothing can tell, so the export is refused rather than left unordered.
  // (The installed runtime is process-wide: start from none, and leave none, whatever ran before or runs after.)
  RuntimeReset reset;
  Tensor t = Tensor::from_blob(reinterpret_cast<void*>(uintptr_t{0x1000}), {2}, DType::float32(), tw::Device::cuda(),
                               nullptr);
  t.set_stream(intptr_t{1});
  ArrowSchema s2;
  ArrowDeviceArray d2;
  TW_EXPECT_ERROR_MSG(tw::to_arrow(t, &s2, &d2), ErrorCode::device_unavailable, "no device runtime is installed");
  // A layout Arrow cannot describe on a device tensorwire does not copy on: refused as such, not as a CUDA failure.
  Tensor rocm = Tensor::from_blob(reinterpret_cast<void*>(uintptr_t{0x1000}), {4, 4}, DType::float32(),
                                  tw::Device{kDLROCM, 0}, nullptr)
                    .slice(1, 0, std::nullopt, 2);
  TW_EXPECT_ERROR_MSG(tw::to_arrow(rocm, &s2, &d2), ErrorCode::unsupported, "rocm:0");
  tw::cuda::install_runtime();
  TW_EXPECT_ERROR_MSG(tw::to_arrow(rocm, &s2, &d2), ErrorCode::unsupported, "copies only CUDA device memory");
  tw::to_arrow(t, &s2, &d2);
  EXPECT_EQ(d2.sync_event, nullptr);
  EXPECT_EQ(d2.device_type, ARROW_DEVICE_CUDA);
  d2.array.release(&d2.array);
  s2.release(&s2);
}

TEST(ArrowDevice, AStreamOrderedImportIsRefusedWithoutARuntime) {
  // The import side of the same rule: a producer's stream cannot be waited for with no runtime installed.
  RuntimeReset reset;
  static float data[2];
  tw::InterfaceDesc desc;
  desc.protocol = "__cuda_array_interface__";
  desc.typestr = "<f4";
  desc.shape = {2};
  desc.data = reinterpret_cast<uintptr_t>(data);
  desc.device = tw::Device::cuda();
  desc.stream = 1;
  TW_EXPECT_ERROR_MSG(tw::import_interface(desc, nullptr, tw::ImportRequest{}), ErrorCode::device_unavailable,
                      "no device runtime is installed to wait for it");
  tw::cuda::install_runtime();
  if (tw::device_runtime().available()) GTEST_SKIP() << "a CUDA driver is present: the wait is the GPU suite's";
  // Without a driver nothing can be pending on any stream: the import goes on, recording the stream.
  tw::Tensor t = tw::import_interface(desc, nullptr, tw::ImportRequest{});
  EXPECT_EQ(t.data_ptr(), static_cast<void*>(data));
  EXPECT_EQ(t.stream(), std::optional<intptr_t>(1));
}

}  // namespace
