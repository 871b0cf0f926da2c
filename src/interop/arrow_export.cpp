// Arrow interop, part 2 of 3: tensors as Arrow arrays (owned schema and array trees; tensorwire/arrow.hpp).
#include "tensorwire/arrow.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <numeric>

#include "arrow_internal.hpp"
#include "core/checked.hpp"
#include "json.hpp"
#include "tensorwire/copy.hpp"
#include "tensorwire/device_runtime.hpp"

namespace tw {
namespace {

using namespace arrow_detail;
namespace json = detail::json;
using detail::add;
using detail::mul;

std::atomic<int64_t> g_exports_alive{0};

struct SchemaPrivate {
  std::string format, name, metadata;
  std::vector<ArrowSchema*> children;
};

void release_schema(ArrowSchema* s) noexcept {
  if (!s || !s->release) return;
  auto* p = static_cast<SchemaPrivate*>(s->private_data);
  for (ArrowSchema* c : p->children) {
    if (c->release) c->release(c);
    delete c;
  }
  delete p;
  s->release = nullptr;
}

struct SchemaDeleter {
  void operator()(ArrowSchema* s) const noexcept {
    release_schema(s);
    delete s;
  }
};
using SchemaPtr = std::unique_ptr<ArrowSchema, SchemaDeleter>;

// Fills `out` (which must not be live) with one schema node; takes the children.
void fill_schema(ArrowSchema* out, std::string format, std::string name, std::string metadata,
                 std::vector<SchemaPtr> children) {
  auto p = std::make_unique<SchemaPrivate>();
  p->format = std::move(format);
  p->name = std::move(name);
  p->metadata = std::move(metadata);
  p->children.reserve(children.size());
  for (auto& c : children) p->children.push_back(c.release());  // no throw after the reserve
  std::memset(out, 0, sizeof(*out));
  out->format = p->format.c_str();
  out->name = p->name.c_str();
  out->metadata = p->metadata.empty() ? nullptr : p->metadata.data();
  out->flags = ARROW_FLAG_NULLABLE;
  out->n_children = static_cast<int64_t>(p->children.size());
  out->children = p->children.empty() ? nullptr : p->children.data();
  out->dictionary = nullptr;
  out->release = release_schema;
  out->private_data = p.release();
}

SchemaPtr make_schema(std::string format, std::string name, std::string metadata, std::vector<SchemaPtr> children = {}) {
  SchemaPtr s(new ArrowSchema{});
  s->release = nullptr;
  fill_schema(s.get(), std::move(format), std::move(name), std::move(metadata), std::move(children));
  return s;
}

struct ArrayPrivate {
  std::shared_ptr<const void> keep;
  const void* buffers[2] = {nullptr, nullptr};
  std::vector<ArrowArray*> children;
  void* event = nullptr;  // a CUDA event to destroy with the array (the device export's sync_event)
};

void release_array(ArrowArray* a) noexcept {
  if (!a || !a->release) return;
  auto* p = static_cast<ArrayPrivate*>(a->private_data);
  for (ArrowArray* c : p->children) {
    if (c->release) c->release(c);
    delete c;
  }
  if (p->event) device_runtime().destroy_event(p->event);
  delete p;
  a->release = nullptr;
  g_exports_alive.fetch_sub(1, std::memory_order_relaxed);
}

struct ArrayDeleter {
  void operator()(ArrowArray* a) const noexcept {
    release_array(a);
    delete a;
  }
};
using ArrayPtr = std::unique_ptr<ArrowArray, ArrayDeleter>;

void fill_array(ArrowArray* out, std::shared_ptr<const void> keep, int64_t length, int n_buffers, const void* b0,
                const void* b1, std::vector<ArrayPtr> children) {
  auto p = std::make_unique<ArrayPrivate>();
  p->keep = std::move(keep);
  p->buffers[0] = b0;
  p->buffers[1] = b1;
  p->children.reserve(children.size());
  for (auto& c : children) p->children.push_back(c.release());
  std::memset(out, 0, sizeof(*out));
  out->length = length;
  out->null_count = 0;
  out->offset = 0;
  out->n_buffers = n_buffers;
  out->n_children = static_cast<int64_t>(p->children.size());
  out->buffers = p->buffers;
  out->children = p->children.empty() ? nullptr : p->children.data();
  out->dictionary = nullptr;
  out->release = release_array;
  out->private_data = p.release();
  g_exports_alive.fetch_add(1, std::memory_order_relaxed);
}

ArrayPtr make_array(std::shared_ptr<const void> keep, int64_t length, int n_buffers, const void* b0, const void* b1,
                    std::vector<ArrayPtr> children = {}) {
  ArrayPtr a(new ArrowArray{});
  a->release = nullptr;
  fill_array(a.get(), std::move(keep), length, n_buffers, b0, b1, std::move(children));
  return a;
}

// Non-null storage for empty buffers (consumers may refuse NULL data buffers), including a list's single offset 0.
alignas(64) const int64_t kEmptyBuffer[8] = {0, 0, 0, 0, 0, 0, 0, 0};

std::string pairs_metadata(std::optional<std::string_view> ext_name, std::string_view ext_metadata,
                           const Metadata* tw_md) {
  std::vector<std::pair<std::string, std::string>> pairs;
  if (ext_name) {
    pairs.emplace_back(std::string(kExtName), std::string(*ext_name));
    pairs.emplace_back(std::string(kExtMetadata), std::string(ext_metadata));
  }
  if (tw_md && !tw_md->empty()) pairs.emplace_back(std::string(kArrowMetadataKey), encode_metadata(*tw_md));
  if (pairs.empty()) return {};
  return encode_arrow_metadata(pairs);
}

std::string json_ints(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s.append(i ? "," : "").append(std::to_string(v[i]));
  return s.append("]");
}

std::string json_strings(const std::vector<std::string>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s.append(i ? "," : "").append(json::quote(v[i]));
  return s.append("]");
}

// The extension JSON for an exported type; checked by our own parser (dim_names must be valid UTF-8).
std::string extension_json_text(const ArrowTensorType& t) {
  std::string body;
  auto add_member = [&](const char* key, const std::string& value) {
    body.append(body.empty() ? "" : ",").append("\"").append(key).append("\":").append(value);
  };
  if (t.kind == ArrowTensorType::Kind::fixed_shape) add_member("shape", json_ints(t.shape));
  if (!t.dim_names.empty()) add_member("dim_names", json_strings(t.dim_names));
  if (!t.permutation.empty()) add_member("permutation", json_ints(t.permutation));
  if (!t.uniform_shape.empty()) {
    std::string u = "[";
    for (size_t i = 0; i < t.uniform_shape.size(); ++i)
      u.append(i ? "," : "").append(t.uniform_shape[i] ? std::to_string(*t.uniform_shape[i]) : std::string("null"));
    add_member("uniform_shape", u.append("]"));
  }
  // The spec allows "" for a variable-shape tensor without parameters, but Arrow C++ (PyArrow) cannot parse it: "{}".
  std::string text = std::string("{").append(body).append("}");
  try {
    json::parse(text);
  } catch (const Error&) {
    throw Error(ErrorCode::invalid_argument, "to_arrow: dim_names must be valid UTF-8 strings");
  }
  return text;
}

// The encoded metadata of an exported type's top field: extension name and JSON, tensorwire metadata. Computed once
// per prepared array (and validated then: dim_names that are not UTF-8 fail at to_arrow, not at export).
std::string top_metadata(const ArrowTensorType& t) {
  const Metadata* md = t.metadata ? &*t.metadata : nullptr;
  switch (t.kind) {
    case ArrowTensorType::Kind::primitive:
      return pairs_metadata(t.bool8 ? std::optional<std::string_view>(kArrowBool8) : std::nullopt, "", md);
    case ArrowTensorType::Kind::fixed_shape: return pairs_metadata(kArrowFixedShapeTensor, extension_json_text(t), md);
    case ArrowTensorType::Kind::variable_shape:
      return pairs_metadata(kArrowVariableShapeTensor, extension_json_text(t), md);
    default: break;
  }
  throw Error(ErrorCode::internal, "to_arrow: cannot export a type of this kind");
}

// The schema of a list's value field (primitive, or int8 storage of arrow.bool8).
SchemaPtr value_schema(DType d) {
  static const std::string bool8_metadata = pairs_metadata(kArrowBool8, "", nullptr);
  return make_schema(format_of(d), "item", d == DType::boolean() ? bool8_metadata : std::string());
}

SchemaPtr type_schema(const ArrowTensorType& t, const std::string& metadata) {
  switch (t.kind) {
    case ArrowTensorType::Kind::primitive: return make_schema(format_of(t.dtype), t.name, metadata);
    case ArrowTensorType::Kind::fixed_shape: {
      int64_t n = 1;
      for (int64_t d : t.shape) n *= d;
      std::vector<SchemaPtr> ch;
      ch.push_back(value_schema(t.dtype));
      return make_schema("+w:" + std::to_string(n), t.name, metadata, std::move(ch));
    }
    case ArrowTensorType::Kind::variable_shape: {
      std::vector<SchemaPtr> data_ch, shape_ch, fields;
      data_ch.push_back(value_schema(t.dtype));
      shape_ch.push_back(make_schema("i", "item", ""));
      fields.push_back(make_schema(t.large_list ? "+L" : "+l", "data", "", std::move(data_ch)));
      fields.push_back(make_schema("+w:" + std::to_string(t.ndim), "shape", "", std::move(shape_ch)));
      return make_schema("+s", t.name, metadata, std::move(fields));
    }
    default: break;
  }
  throw Error(ErrorCode::internal, "to_arrow: cannot export a type of this kind");
}

// ---- export: layouts -------------------------------------------------------------------------------------------
// Physical order of a dense layout: order[j] is the logical dimension stored j-th outermost. Size-1 dimensions
// take the stride of the next dimension so they keep their place; ties keep logical order.
std::vector<int64_t> physical_order(const int64_t* shape, const int64_t* strides, size_t n) {
  std::vector<int64_t> eff(n);
  int64_t next = 1;
  for (size_t k = n; k-- > 0;) {
    eff[k] = shape[k] == 1 ? next : strides[k];
    next = eff[k];
  }
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return eff[size_t(a)] > eff[size_t(b)]; });
  return order;
}

// Arrow's permutation (logical i = physical perm[i]) from a physical order.
std::vector<int64_t> inverse(const std::vector<int64_t>& order) {
  std::vector<int64_t> perm(order.size());
  for (size_t j = 0; j < order.size(); ++j) perm[size_t(order[j])] = static_cast<int64_t>(j);
  return perm;
}

// A writable host tensor of logical shape `logical`, stored row-major in the physical `order` (one copy target).
Tensor allocate_ordered(DType dtype, const std::vector<int64_t>& logical, const std::vector<int64_t>& order,
                        std::shared_ptr<Buffer> buf, int64_t byte_offset) {
  const size_t n = logical.size();
  std::vector<int64_t> phys(n), strides(n);
  for (size_t j = 0; j < n; ++j) phys[j] = logical[size_t(order[j])];
  int64_t st = 1;
  for (size_t j = n; j-- > 0;) {
    strides[size_t(order[j])] = st;
    st *= phys[j];
  }
  Layout l{dtype, Shape(logical), Strides(strides), byte_offset, false};
  return Tensor::make(std::move(buf), std::move(l), false);
}

Tensor copy_ordered(const Tensor& src, const std::vector<int64_t>& order) {
  std::vector<int64_t> logical(src.shape().begin(), src.shape().end());
  const auto nbytes = static_cast<size_t>(std::max<int64_t>(src.nbytes(), 0));
  if (src.device().is_host_accessible()) {
    Tensor dst = allocate_ordered(src.dtype(), logical, order, Buffer::allocate(nbytes), 0);
    copy(src, dst);
    dst.metadata() = src.metadata();
    return dst;
  }
  // Device memory: a device copy (the CUDA layer's kernels) into a block of the device pool, queued on the legacy
  // default stream after the source's stream; the export's sync_event is recorded on that stream.
  if (src.device().type != kDLCUDA)
    throw Error(ErrorCode::unsupported, "to_arrow: Arrow cannot describe this layout of a tensor on " +
                                            src.device().str() + ", and tensorwire copies only CUDA device memory "
                                            "into a layout it can; make it contiguous first");
  if (!device_runtime_installed())
    throw Error(ErrorCode::device_unavailable, "to_arrow: a copy of memory on " + src.device().str() +
                                                   " is needed and no device runtime is installed to make it "
                                                   "(tw::cuda::install_runtime())");
  constexpr intptr_t kLegacy = 1;
  const DeviceRuntime& rt = device_runtime();
  Tensor dst = allocate_ordered(src.dtype(), logical, order, rt.allocate(src.device(), std::max<size_t>(nbytes, 1), kLegacy), 0);
  if (src.numel() > 0) rt.copy(src, dst, kLegacy);
  dst.set_stream(kLegacy);
  dst.metadata() = src.metadata();
  return dst;
}

void check_exportable_dtype(DType d, const char* who) {
  if (!format_of(d)) throw Error(ErrorCode::unsupported, std::string(who) + ": " + unsupported_dtype_message(d));
}

std::vector<std::string> physical_names(const std::vector<std::string>& logical, const std::vector<int64_t>& order,
                                        size_t ndim, const char* who) {
  if (logical.empty()) return {};
  if (logical.size() != ndim)
    throw Error(ErrorCode::invalid_argument, std::string(who) + ": " + std::to_string(logical.size()) +
                                                 " dim_names for a row of " + std::to_string(ndim) + " dimensions");
  std::vector<std::string> phys(ndim);
  for (size_t j = 0; j < ndim; ++j) phys[j] = logical[size_t(order[j])];
  return phys;
}

}  // namespace

// ---- public: export ---------------------------------------------------------------------------------------------
struct detail::ArrowExportState {
  ArrowTensorType type;
  int64_t length = 0;
  bool copied = false;
  Tensor data;                   // batch (physical order known from type.permutation) or packed 1-D elements
  std::vector<int32_t> offsets;  // variable shape: length + 1
  std::vector<int32_t> shapes;   // variable shape: length * ndim, physical
  std::string metadata;          // the top field's encoded metadata (top_metadata)
};

ArrowTensorArray ArrowTensorArray::from_tensor(const Tensor& t, const ArrowExportOptions& options) {
  constexpr const char* who = "to_arrow";
  if (!t.defined()) throw Error(ErrorCode::invalid_argument, "to_arrow: the tensor is undefined");
  if (t.ndim() == 0)
    throw Error(ErrorCode::invalid_argument, "to_arrow: a 0-d tensor has no row dimension; reshape it to (1,) to "
                                             "export a one-row array");
  check_exportable_dtype(t.dtype(), who);
  auto st = std::make_shared<detail::ArrowExportState>();
  st->length = t.shape()[0];
  st->type.name = options.name;
  st->type.dtype = t.dtype();
  st->type.bool8 = t.dtype() == DType::boolean();
  if (!t.metadata().empty()) st->type.metadata = t.metadata();
  const size_t ndim = t.ndim();
  const size_t inner = ndim - 1;
  // One row's layout: dims 1.. of the tensor.
  const int64_t* shp = t.shape().data();
  const int64_t* str = t.strides().data();
  int64_t row_elems = 1;
  for (size_t i = 1; i < ndim; ++i) row_elems *= shp[i];
  Layout row{t.dtype(), Shape(shp + 1, inner), Strides(str + 1, inner), 0, false};
  const bool row_dense = row_elems == 0 || row.is_dense();
  bool fits = row_dense;
  if (st->length > 1 && row_elems > 0 && str[0] != row_elems) fits = false;
  std::vector<int64_t> order(inner);
  std::iota(order.begin(), order.end(), 0);
  if (row_dense && row_elems > 0) order = physical_order(shp + 1, str + 1, inner);

  if (options.copy == true || !fits) {
    if (options.copy == false)
      throw Error(ErrorCode::copy_required,
                  "to_arrow: strides " + t.strides().str() + " of shape " + t.shape().str() +
                      " cannot be described by Arrow (it needs the row dimension outermost with a stride of one row, "
                      "and each row dense in some order: no gaps, no negative or zero strides), and copy=False "
                      "forbids the copy");
    std::vector<int64_t> full(ndim);
    full[0] = 0;
    for (size_t i = 0; i < inner; ++i) full[i + 1] = order[i] + 1;
    st->data = copy_ordered(t, full);
    st->copied = true;
  } else {
    st->data = t;
  }
  if (ndim == 1) {
    st->type.kind = ArrowTensorType::Kind::primitive;
    st->type.ndim = 0;
    if (!options.dim_names.empty())
      throw Error(ErrorCode::invalid_argument, "to_arrow: a 1-D tensor exports a plain array, which has no dim_names");
  } else {
    st->type.kind = ArrowTensorType::Kind::fixed_shape;
    st->type.ndim = static_cast<int64_t>(inner);
    for (size_t j = 0; j < inner; ++j) st->type.shape.push_back(shp[1 + size_t(order[j])]);
    if (row_elems > kInt32Max)
      throw Error(ErrorCode::overflow, "to_arrow: a row of " + std::to_string(row_elems) +
                                           " elements exceeds the int32 list size of a FixedSizeList");
    for (size_t j = 0; j < inner; ++j)
      if (st->type.shape[j] > kInt32Max)
        throw Error(ErrorCode::overflow, "to_arrow: dimension size " + std::to_string(st->type.shape[j]) + " exceeds int32");
    std::vector<int64_t> perm = inverse(order);
    if (!is_identity(perm)) st->type.permutation = perm;
    st->type.dim_names = physical_names(options.dim_names, order, inner, who);
  }
  st->metadata = top_metadata(st->type);
  return ArrowTensorArray(std::move(st));
}

ArrowTensorArray ArrowTensorArray::from_tensors(std::span<const Tensor> tensors, const ArrowExportOptions& options) {
  constexpr const char* who = "to_arrow";
  if (tensors.empty())
    throw Error(ErrorCode::invalid_argument, "to_arrow: an empty list has no dtype or rank to export");
  const Tensor& first = tensors[0];
  if (!first.defined()) throw Error(ErrorCode::invalid_argument, "to_arrow: tensor 0 of the list is undefined");
  const DType dtype = first.dtype();
  const size_t ndim = first.ndim();
  check_exportable_dtype(dtype, who);
  if (ndim == 0)
    throw Error(ErrorCode::invalid_argument, "to_arrow: arrow.variable_shape_tensor needs tensors of rank >= 1; tensor 0 is 0-d");
  if (options.copy == false)
    throw Error(ErrorCode::copy_required, "to_arrow: arrow.variable_shape_tensor packs the tensors' data into one "
                                          "buffer, which is a copy, and copy=False forbids it");
  std::optional<std::vector<int64_t>> common;  // the dense order every non-empty tensor shares, if any
  bool all_dense = true;
  int64_t total = 0;
  for (size_t k = 0; k < tensors.size(); ++k) {
    const Tensor& t = tensors[k];
    const std::string which = "tensor " + std::to_string(k) + " of the list";
    if (!t.defined()) throw Error(ErrorCode::invalid_argument, "to_arrow: " + which + " is undefined");
    if (!(t.dtype() == dtype))
      throw Error(ErrorCode::type_mismatch, "to_arrow: " + which + " is " + t.dtype().name() + " but tensor 0 is " +
                                                dtype.name() + "; arrow.variable_shape_tensor holds one dtype");
    if (t.ndim() != ndim)
      throw Error(ErrorCode::invalid_argument, "to_arrow: " + which + " has rank " + std::to_string(t.ndim()) +
                                                   " but tensor 0 has rank " + std::to_string(ndim) +
                                                   "; arrow.variable_shape_tensor holds one rank");
    if (!t.device().is_host_accessible())
      throw Error(ErrorCode::unsupported, "to_arrow: " + which + " is on " + t.device().str() +
                                              "; packing a list needs host memory");
    if (!(t.metadata() == first.metadata()))
      throw Error(ErrorCode::invalid_argument, "to_arrow: " + which + " carries metadata different from tensor 0's; "
                                                "Arrow keeps one metadata per field, so unify or clear it first");
    for (int64_t d : t.shape())
      if (d > kInt32Max)
        throw Error(ErrorCode::overflow, "to_arrow: " + which + " has a dimension of size " + std::to_string(d) +
                                             ", beyond the int32 shapes of arrow.variable_shape_tensor");
    total = add(total, t.numel(), "the list's element count");
    if (total > kInt32Max)
      throw Error(ErrorCode::overflow, "to_arrow: the list holds more than 2^31 - 1 elements, the limit of the int32 "
                                       "offsets of arrow.variable_shape_tensor; split it into several arrays");
    if (t.numel() == 0) continue;
    if (!t.is_dense()) {
      all_dense = false;
      continue;
    }
    auto ord = physical_order(t.shape().data(), t.strides().data(), ndim);
    if (!common) common = ord;
    else if (*common != ord) all_dense = false;
  }
  std::vector<int64_t> order(ndim);
  std::iota(order.begin(), order.end(), 0);
  if (all_dense && common) order = *common;

  auto st = std::make_shared<detail::ArrowExportState>();
  st->copied = true;
  st->length = static_cast<int64_t>(tensors.size());
  st->type.kind = ArrowTensorType::Kind::variable_shape;
  st->type.name = options.name;
  st->type.dtype = dtype;
  st->type.bool8 = dtype == DType::boolean();
  st->type.ndim = static_cast<int64_t>(ndim);
  if (!first.metadata().empty()) st->type.metadata = first.metadata();
  std::vector<int64_t> perm = inverse(order);
  if (!is_identity(perm)) st->type.permutation = perm;
  st->type.dim_names = physical_names(options.dim_names, order, ndim, who);

  const int64_t isz = static_cast<int64_t>(dtype.itemsize());
  auto buf = Buffer::allocate(static_cast<size_t>(total * isz));
  st->offsets.reserve(tensors.size() + 1);
  st->shapes.reserve(tensors.size() * ndim);
  st->offsets.push_back(0);
  int64_t at = 0;
  std::vector<std::optional<int64_t>> uniform(ndim);
  for (size_t k = 0; k < tensors.size(); ++k) {
    const Tensor& t = tensors[k];
    std::vector<int64_t> logical = to_vec(t.shape());
    for (size_t j = 0; j < ndim; ++j) {
      const int64_t d = logical[size_t(order[j])];
      st->shapes.push_back(static_cast<int32_t>(d));
      if (k == 0) uniform[j] = d;
      else if (uniform[j] && *uniform[j] != d) uniform[j].reset();
    }
    if (t.numel() > 0) {
      Tensor dst = allocate_ordered(dtype, logical, order, buf, at * isz);
      copy(t, dst);
    }
    at += t.numel();
    st->offsets.push_back(static_cast<int32_t>(at));
  }
  bool any_uniform = false;
  for (auto& u : uniform) any_uniform = any_uniform || u.has_value();
  if (any_uniform) st->type.uniform_shape = uniform;
  Layout flat{dtype, Shape(total), Strides(int64_t{1}), 0, false};
  st->data = Tensor::make(std::move(buf), std::move(flat), false);
  st->metadata = top_metadata(st->type);
  return ArrowTensorArray(std::move(st));
}

const ArrowTensorType& ArrowTensorArray::type() const noexcept { return state_->type; }
int64_t ArrowTensorArray::length() const noexcept { return state_->length; }
bool ArrowTensorArray::copied() const noexcept { return state_->copied; }
Device ArrowTensorArray::device() const noexcept { return state_->data.buffer().device(); }
const Tensor& ArrowTensorArray::data() const noexcept { return state_->data; }

void ArrowTensorArray::export_schema(ArrowSchema* schema) const {
  if (!schema) throw Error(ErrorCode::invalid_argument, "to_arrow: null ArrowSchema");
  SchemaPtr s = type_schema(state_->type, state_->metadata);
  *schema = *s;  // move: the heap node keeps nothing once its fields are copied out
  s->release = nullptr;
}

namespace {

// Builds the array tree of a prepared export.
ArrayPtr build_array(const std::shared_ptr<const detail::ArrowExportState>& st) {
  const ArrowTensorType& t = st->type;
  std::shared_ptr<const void> keep = st;
  const void* data = st->data.numel() > 0 ? st->data.data_ptr() : static_cast<const void*>(kEmptyBuffer);
  switch (t.kind) {
    case ArrowTensorType::Kind::primitive: return make_array(keep, st->length, 2, nullptr, data);
    case ArrowTensorType::Kind::fixed_shape: {
      int64_t n = 1;
      for (int64_t d : t.shape) n *= d;
      std::vector<ArrayPtr> ch;
      ch.push_back(make_array(keep, st->length * n, 2, nullptr, data));
      return make_array(keep, st->length, 1, nullptr, nullptr, std::move(ch));
    }
    case ArrowTensorType::Kind::variable_shape: {
      std::vector<ArrayPtr> values, shape_values, fields;
      values.push_back(make_array(keep, st->offsets.back(), 2, nullptr, data));
      const void* shapes = st->shapes.empty() ? static_cast<const void*>(kEmptyBuffer) : st->shapes.data();
      shape_values.push_back(make_array(keep, static_cast<int64_t>(st->shapes.size()), 2, nullptr, shapes));
      fields.push_back(make_array(keep, st->length, 2, nullptr, st->offsets.data(), std::move(values)));
      fields.push_back(make_array(keep, st->length, 1, nullptr, nullptr, std::move(shape_values)));
      return make_array(keep, st->length, 1, nullptr, nullptr, std::move(fields));
    }
    default: break;
  }
  throw Error(ErrorCode::internal, "to_arrow: cannot export a type of this kind");
}

}  // namespace

void ArrowTensorArray::export_to(ArrowSchema* schema, ArrowArray* array) const {
  if (!schema || !array) throw Error(ErrorCode::invalid_argument, "to_arrow: null ArrowSchema or ArrowArray");
  if (!device().is_host_accessible())
    throw Error(ErrorCode::unsupported, "to_arrow: the tensor is on " + device().str() +
                                            "; the Arrow C Data Interface carries host memory only, use the C Device "
                                            "Data Interface (ArrowDeviceArray, __arrow_c_device_array__)");
  SchemaPtr s = type_schema(state_->type, state_->metadata);
  ArrayPtr a = build_array(state_);
  *schema = *s;
  s->release = nullptr;
  *array = *a;
  a->release = nullptr;
}

void ArrowTensorArray::export_to(ArrowSchema* schema, ArrowDeviceArray* array) const {
  if (!schema || !array) throw Error(ErrorCode::invalid_argument, "to_arrow: null ArrowSchema or ArrowDeviceArray");
  const Device dev = device();
  void* event = nullptr;
  const auto stream = state_->data.stream();
  // Without a driver no GPU work can be pending in this process, so there is nothing to wait for (NULL event).
  if ((dev.type == kDLCUDA || dev.type == kDLCUDAManaged) && stream && *stream != -1) {
    if (!device_runtime_installed())
      throw Error(ErrorCode::device_unavailable,
                  "to_arrow: the tensor is ordered on a CUDA stream and no device runtime is installed to record "
                  "its sync_event (call tw::cuda::install_runtime())");
    const DeviceRuntime& rt = device_runtime();
    if (rt.available()) {  // no driver: nothing pending
      const intptr_t after = state_->data.ready_event() ? *stream_for_consumers(state_->data) : *stream;
      event = rt.record_event(dev, after);
    }
  }
  SchemaPtr s;
  ArrayPtr a;
  try {
    s = type_schema(state_->type, state_->metadata);
    a = build_array(state_);
  } catch (...) {
    device_runtime().destroy_event(event);
    throw;
  }
  auto* p = static_cast<ArrayPrivate*>(a->private_data);
  p->event = event;
  std::memset(array, 0, sizeof(*array));
  array->array = *a;
  a->release = nullptr;
  array->device_id = dev.id;
  array->device_type = static_cast<ArrowDeviceType>(dev.type);
  // The spec's cudaEvent_t*: a pointer to the event handle, which lives in the array's private data.
  array->sync_event = event ? static_cast<void*>(&p->event) : nullptr;
  *schema = *s;
  s->release = nullptr;
}

void to_arrow(const Tensor& t, ArrowSchema* schema, ArrowArray* array, const ArrowExportOptions& options) {
  ArrowTensorArray::from_tensor(t, options).export_to(schema, array);
}
void to_arrow(const Tensor& t, ArrowSchema* schema, ArrowDeviceArray* array, const ArrowExportOptions& options) {
  ArrowTensorArray::from_tensor(t, options).export_to(schema, array);
}
void to_arrow(std::span<const Tensor> tensors, ArrowSchema* schema, ArrowArray* array,
              const ArrowExportOptions& options) {
  ArrowTensorArray::from_tensors(tensors, options).export_to(schema, array);
}
void to_arrow(std::span<const Tensor> tensors, ArrowSchema* schema, ArrowDeviceArray* array,
              const ArrowExportOptions& options) {
  ArrowTensorArray::from_tensors(tensors, options).export_to(schema, array);
}

int64_t arrow_exports_alive() noexcept { return g_exports_alive.load(std::memory_order_relaxed); }
}  // namespace tw
