// Arrow C Data / C Device Data interface: export of tensors as arrow.fixed_shape_tensor, arrow.variable_shape_tensor,
// primitive arrays and arrow.bool8, and import of the same (plus FixedSizeList, Arrow booleans, record batches and
// streams). See include/tensorwire/arrow.hpp for the hand-off contract.
#include "tensorwire/arrow.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <numeric>

#include "core/checked.hpp"
#include "arrow_internal.hpp"
#include "tensorwire/copy.hpp"
#include "tensorwire/device_runtime.hpp"

namespace tw {
namespace {

namespace json = detail::json;
using detail::add;
using detail::mul;

constexpr std::string_view kExtName = "ARROW:extension:name";
constexpr std::string_view kExtMetadata = "ARROW:extension:metadata";
constexpr int64_t kInt32Max = 2147483647;
constexpr int64_t kMaxChildren = 1 << 16;
constexpr int64_t kMaxMetadataPairs = 1 << 16;
constexpr int64_t kMaxMetadataItem = int64_t(1) << 30;

std::atomic<int64_t> g_exports_alive{0};

[[noreturn]] void malformed(const std::string& where, const std::string& why) {
  throw Error(ErrorCode::invalid_argument, "Arrow " + where + ": " + why);
}
[[noreturn]] void unsupported(const std::string& where, const std::string& why) {
  throw Error(ErrorCode::unsupported, "Arrow " + where + ": " + why);
}

// ---- element types ---------------------------------------------------------------------------------------------
struct FormatEntry {
  const char* format;
  DType dtype;
};
constexpr FormatEntry kFormats[] = {
    {"c", DType::int8()},    {"C", DType::uint8()},   {"s", DType::int16()},   {"S", DType::uint16()},
    {"i", DType::int32()},   {"I", DType::uint32()},  {"l", DType::int64()},   {"L", DType::uint64()},
    {"e", DType::float16()}, {"f", DType::float32()}, {"g", DType::float64()},
};

// The Arrow format of a tensor dtype (bool travels as int8 storage of arrow.bool8), or nullptr.
const char* format_of(DType d) {
  if (d == DType::boolean()) return "c";
  for (const auto& f : kFormats)
    if (f.dtype == d) return f.format;
  return nullptr;
}

std::optional<DType> primitive_dtype(std::string_view format) {
  for (const auto& f : kFormats)
    if (format == f.format) return f.dtype;
  return std::nullopt;
}

// A readable name for an Arrow format that has no tensor meaning.
std::string describe_format(std::string_view f) {
  auto starts = [&](std::string_view p) { return f.substr(0, p.size()) == p; };
  std::string what;
  if (f == "n") what = "null";
  else if (f == "z" || f == "Z" || f == "vz") what = "binary";
  else if (f == "u" || f == "U" || f == "vu") what = "string";
  else if (starts("d:")) what = "decimal";
  else if (starts("w:")) what = "fixed-size binary";
  else if (starts("t")) what = "date/time";
  else if (f == "+l" || f == "+L" || starts("+vl") || starts("+vL")) what = "list";
  else if (starts("+w:")) what = "fixed-size list";
  else if (f == "+s") what = "struct";
  else if (f == "+m") what = "map";
  else if (starts("+u")) what = "union";
  else if (f == "+r") what = "run-end encoded";
  else what = "unknown";
  return "format '" + std::string(f) + "' (" + what + ")";
}

std::string unsupported_dtype_message(DType d) {
  return d.name() + " has no canonical Arrow type (Arrow has none for bfloat16, float8, complex, sub-byte or "
                    "vector types); convert the tensor first (for example to float32)";
}

// "+w:N" -> N (0 <= N <= INT32_MAX), or nullopt when `format` is not a fixed-size list.
std::optional<int64_t> fixed_list_size(std::string_view format, const std::string& where) {
  if (format.substr(0, 3) != "+w:") return std::nullopt;
  std::string_view digits = format.substr(3);
  if (digits.empty() || digits.size() > 10) malformed(where, "bad fixed-size list format '" + std::string(format) + "'");
  if (digits.size() > 1 && digits[0] == '0')
    malformed(where, "bad fixed-size list format '" + std::string(format) + "' (leading zero)");
  int64_t n = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') malformed(where, "bad fixed-size list format '" + std::string(format) + "'");
    n = n * 10 + (c - '0');
  }
  if (n > kInt32Max) malformed(where, "fixed-size list size " + std::to_string(n) + " exceeds int32");
  return n;
}

// ---- the metadata framing ----------------------------------------------------------------------------------------
int32_t load_i32(const char* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
void store_i32(std::string& out, size_t v) {
  if (v > size_t(kInt32Max)) throw Error(ErrorCode::overflow, "Arrow metadata item longer than 2^31 - 1 bytes");
  int32_t x = static_cast<int32_t>(v);
  char b[4];
  std::memcpy(b, &x, 4);
  out.append(b, 4);
}

// The length of the metadata encoding at `p`, found by walking its own framing (the C interface gives no size).
size_t metadata_extent(const char* p, const std::string& where) {
  int32_t n = load_i32(p);
  if (n < 0 || n > kMaxMetadataPairs) malformed(where, "metadata pair count " + std::to_string(n) + " is invalid");
  size_t pos = 4;
  for (int32_t i = 0; i < 2 * n; ++i) {
    int32_t len = load_i32(p + pos);
    if (len < 0 || len > kMaxMetadataItem)
      malformed(where, "metadata item " + std::to_string(i) + " has invalid length " + std::to_string(len));
    pos += 4 + static_cast<size_t>(len);
  }
  return pos;
}

struct FieldMetadata {
  std::optional<std::string> ext_name, ext_metadata, tw_metadata;
};

FieldMetadata read_field_metadata(const ArrowSchema& s, const std::string& where) {
  FieldMetadata fm;
  if (!s.metadata) return fm;
  std::vector<std::pair<std::string, std::string>> pairs;
  const size_t extent = metadata_extent(s.metadata, where);
  try {
    pairs = decode_arrow_metadata(std::string_view(s.metadata, extent));
  } catch (const Error& e) {
    malformed(where, std::string("metadata: ") + e.what());
  }
  for (auto& [k, v] : pairs) {
    std::optional<std::string>* slot = nullptr;
    if (k == kExtName) slot = &fm.ext_name;
    else if (k == kExtMetadata) slot = &fm.ext_metadata;
    else if (k == kArrowMetadataKey) slot = &fm.tw_metadata;
    if (!slot) continue;
    if (*slot) malformed(where, "metadata key '" + k + "' appears twice");
    *slot = std::move(v);
  }
  return fm;
}

// ---- schema parsing ----------------------------------------------------------------------------------------------
struct SchemaView {
  std::string format;
  std::string name;
  std::vector<const ArrowSchema*> children;
  FieldMetadata md;
};

SchemaView view_schema(const ArrowSchema& s, const std::string& where) {
  if (!s.release) malformed(where, "the schema is released (its release callback is NULL)");
  if (!s.format) malformed(where, "null format string");
  SchemaView v;
  const size_t flen = strnlen(s.format, 4096);
  if (flen == 4096) malformed(where, "format string longer than 4095 bytes");
  v.format.assign(s.format, flen);
  if (s.name) v.name.assign(s.name, strnlen(s.name, size_t(1) << 20));
  if (s.n_children < 0 || s.n_children > kMaxChildren)
    malformed(where, "n_children " + std::to_string(s.n_children) + " is invalid");
  if (s.n_children > 0 && !s.children) malformed(where, "n_children is " + std::to_string(s.n_children) + " but children is NULL");
  for (int64_t i = 0; i < s.n_children; ++i) {
    if (!s.children[i]) malformed(where, "child " + std::to_string(i) + " is NULL");
    v.children.push_back(s.children[i]);
  }
  if (s.dictionary) unsupported(where, "dictionary-encoded arrays have no tensor meaning; decode them first");
  v.md = read_field_metadata(s, where);
  return v;
}

// The element type of a list's value field: a primitive, an Arrow boolean, or arrow.bool8.
void parse_value_field(const ArrowSchema& s, const std::string& where, ArrowTensorType& t) {
  SchemaView v = view_schema(s, where);
  if (!v.children.empty()) unsupported(where, "values of " + describe_format(v.format) + " have no tensor element type");
  if (v.md.ext_name) {
    if (*v.md.ext_name != kArrowBool8)
      unsupported(where, "values of extension type '" + *v.md.ext_name + "' have no tensor element type");
    if (v.format != "c") malformed(where, "arrow.bool8 storage must be int8 ('c'), not '" + v.format + "'");
    t.dtype = DType::boolean();
    t.bool8 = true;
    return;
  }
  if (v.format == "b") {
    t.dtype = DType::boolean();
    t.bit_packed = true;
    return;
  }
  auto d = primitive_dtype(v.format);
  if (!d) unsupported(where, describe_format(v.format) + " has no tensor element type");
  t.dtype = *d;
}

std::vector<int64_t> json_int_array(const json::Value& v, const char* key, const std::string& where, int64_t lo,
                                    int64_t hi) {
  if (v.type != json::Value::Type::array)
    malformed(where, std::string("'") + key + "' must be an array, not " + json::type_name(v.type));
  if (v.items.size() > kMaxRank)
    malformed(where, std::string("'") + key + "' has " + std::to_string(v.items.size()) + " entries; the rank limit is " +
                         std::to_string(kMaxRank));
  std::vector<int64_t> out;
  for (const auto& x : v.items) {
    if (x.type != json::Value::Type::number || !x.is_integer)
      malformed(where, std::string("'") + key + "' must hold integers, found " +
                           (x.type == json::Value::Type::number ? x.text : json::type_name(x.type)));
    if (x.integer < lo || x.integer > hi)
      malformed(where, std::string("'") + key + "' value " + std::to_string(x.integer) + " is outside [" +
                           std::to_string(lo) + ", " + std::to_string(hi) + "]");
    out.push_back(x.integer);
  }
  return out;
}

std::vector<std::string> json_string_array(const json::Value& v, const char* key, const std::string& where) {
  if (v.type != json::Value::Type::array)
    malformed(where, std::string("'") + key + "' must be an array, not " + json::type_name(v.type));
  std::vector<std::string> out;
  for (const auto& x : v.items) {
    if (x.type != json::Value::Type::string)
      malformed(where, std::string("'") + key + "' must hold strings, found " + json::type_name(x.type));
    out.push_back(x.text);
  }
  return out;
}

void check_permutation(const std::vector<int64_t>& p, int64_t ndim, const std::string& where) {
  if (static_cast<int64_t>(p.size()) != ndim)
    malformed(where, "'permutation' has " + std::to_string(p.size()) + " entries for " + std::to_string(ndim) +
                         " dimensions");
  std::vector<bool> seen(p.size(), false);
  for (int64_t x : p) {
    if (x < 0 || x >= ndim || seen[size_t(x)])
      malformed(where, "'permutation' is not a permutation of 0.." + std::to_string(ndim - 1));
    seen[size_t(x)] = true;
  }
}

bool is_identity(const std::vector<int64_t>& p) {
  for (size_t i = 0; i < p.size(); ++i)
    if (p[i] != static_cast<int64_t>(i)) return false;
  return true;
}

// The extension JSON: an object (empty text allowed when `empty_ok`). Keys tensorwire does not know are ignored
// (the spec may add some); those it knows are checked strictly.
json::Value extension_json(const std::optional<std::string>& text, bool empty_ok, const std::string& where) {
  if (!text || text->empty()) {
    if (!empty_ok) malformed(where, "the extension metadata (JSON with 'shape') is missing");
    json::Value v;
    v.type = json::Value::Type::object;
    return v;
  }
  json::Value v;
  try {
    v = json::parse(*text);
  } catch (const Error& e) {
    malformed(where, std::string("extension metadata: ") + e.what());
  }
  if (v.type != json::Value::Type::object)
    malformed(where, std::string("extension metadata must be a JSON object, not ") + json::type_name(v.type));
  return v;
}

void parse_common_params(const json::Value& j, ArrowTensorType& t, const std::string& where) {
  if (const json::Value* dn = j.find("dim_names")) {
    t.dim_names = json_string_array(*dn, "dim_names", where);
    if (static_cast<int64_t>(t.dim_names.size()) != t.ndim)
      malformed(where, "'dim_names' has " + std::to_string(t.dim_names.size()) + " entries for " +
                           std::to_string(t.ndim) + " dimensions");
  }
  if (const json::Value* p = j.find("permutation")) {
    t.permutation = json_int_array(*p, "permutation", where, 0, kInt32Max);
    check_permutation(t.permutation, t.ndim, where);
    if (is_identity(t.permutation)) t.permutation.clear();
  }
}

ArrowTensorType parse_field(const ArrowSchema& s, const std::string& where, int depth);

void parse_fixed_shape(const SchemaView& v, ArrowTensorType& t, const std::string& where) {
  auto n = fixed_list_size(v.format, where);
  if (!n)
    malformed(where, "arrow.fixed_shape_tensor storage must be a FixedSizeList ('+w:N'), not '" + v.format + "'");
  if (v.children.size() != 1) malformed(where, "a FixedSizeList has exactly one child, not " + std::to_string(v.children.size()));
  parse_value_field(*v.children[0], where + " values", t);
  json::Value j = extension_json(v.md.ext_metadata, false, where);
  const json::Value* shape = j.find("shape");
  if (!shape) malformed(where, "arrow.fixed_shape_tensor metadata has no 'shape'");
  t.shape = json_int_array(*shape, "shape", where, 0, kInt32Max);
  t.ndim = static_cast<int64_t>(t.shape.size());
  int64_t prod = 1;
  for (int64_t d : t.shape) prod = mul(prod, d, "the product of 'shape'");
  if (prod != *n)
    malformed(where, "'shape' holds " + std::to_string(prod) + " elements but the FixedSizeList size is " +
                         std::to_string(*n));
  parse_common_params(j, t, where);
  t.kind = ArrowTensorType::Kind::fixed_shape;
}

void parse_variable_shape(const SchemaView& v, ArrowTensorType& t, const std::string& where) {
  if (v.format != "+s")
    malformed(where, "arrow.variable_shape_tensor storage must be a struct ('+s'), not '" + v.format + "'");
  if (v.children.size() != 2)
    malformed(where, "arrow.variable_shape_tensor storage has " + std::to_string(v.children.size()) +
                         " fields; it must have 'data' and 'shape'");
  SchemaView data = view_schema(*v.children[0], where + " field 0");
  SchemaView shape = view_schema(*v.children[1], where + " field 1");
  if (data.name != "data" || shape.name != "shape")
    malformed(where, "arrow.variable_shape_tensor storage fields must be 'data' then 'shape', not '" + data.name +
                         "', '" + shape.name + "'");
  if (data.format == "+L") t.large_list = true;
  else if (data.format != "+l")
    malformed(where, "the 'data' field must be a List ('+l' or '+L'), not '" + data.format + "'");
  if (data.children.size() != 1) malformed(where, "the 'data' list must have exactly one child");
  if (data.md.ext_name) unsupported(where, "the 'data' field carries extension type '" + *data.md.ext_name + "'");
  parse_value_field(*data.children[0], where + " 'data' values", t);
  auto ndim = fixed_list_size(shape.format, where);
  if (!ndim) malformed(where, "the 'shape' field must be a FixedSizeList<int32> ('+w:N'), not '" + shape.format + "'");
  if (*ndim > int64_t(kMaxRank)) malformed(where, "rank " + std::to_string(*ndim) + " exceeds " + std::to_string(kMaxRank));
  if (shape.children.size() != 1) malformed(where, "the 'shape' FixedSizeList must have exactly one child");
  SchemaView sv = view_schema(*shape.children[0], where + " 'shape' values");
  if (sv.format != "i" || !sv.children.empty() || sv.md.ext_name)
    malformed(where, "the 'shape' values must be int32 ('i'), not '" + sv.format + "'");
  t.ndim = *ndim;
  json::Value j = extension_json(v.md.ext_metadata, true, where);
  parse_common_params(j, t, where);
  if (const json::Value* u = j.find("uniform_shape")) {
    if (u->type != json::Value::Type::array)
      malformed(where, std::string("'uniform_shape' must be an array, not ") + json::type_name(u->type));
    if (static_cast<int64_t>(u->items.size()) != t.ndim)
      malformed(where, "'uniform_shape' has " + std::to_string(u->items.size()) + " entries for " +
                           std::to_string(t.ndim) + " dimensions");
    for (const auto& x : u->items) {
      if (x.type == json::Value::Type::null) {
        t.uniform_shape.emplace_back(std::nullopt);
      } else if (x.type == json::Value::Type::number && x.is_integer && x.integer >= 0 && x.integer <= kInt32Max) {
        t.uniform_shape.emplace_back(x.integer);
      } else {
        malformed(where, "'uniform_shape' must hold null or int32 sizes, found " +
                             (x.type == json::Value::Type::number ? x.text : std::string(json::type_name(x.type))));
      }
    }
  }
  t.kind = ArrowTensorType::Kind::variable_shape;
}

ArrowTensorType parse_field(const ArrowSchema& s, const std::string& where_in, int depth) {
  SchemaView v = view_schema(s, where_in);
  const std::string where = v.name.empty() ? where_in : where_in + " '" + v.name + "'";
  ArrowTensorType t;
  t.name = v.name;
  if (v.md.tw_metadata) {
    try {
      t.metadata = decode_metadata(*v.md.tw_metadata);
    } catch (const Error& e) {
      malformed(where, "the '" + std::string(kArrowMetadataKey) + "' metadata is malformed: " + e.what());
    }
  }
  if (v.md.ext_name) {
    const std::string& ext = *v.md.ext_name;
    if (ext == kArrowFixedShapeTensor) {
      parse_fixed_shape(v, t, where);
    } else if (ext == kArrowVariableShapeTensor) {
      parse_variable_shape(v, t, where);
    } else if (ext == kArrowBool8) {
      if (v.format != "c" || !v.children.empty())
        malformed(where, "arrow.bool8 storage must be int8 ('c'), not '" + v.format + "'");
      t.dtype = DType::boolean();
      t.bool8 = true;
      t.kind = ArrowTensorType::Kind::primitive;
    } else {
      unsupported(where, "extension type '" + ext + "' is not a tensor type (tensorwire reads " +
                             std::string(kArrowFixedShapeTensor) + ", " + std::string(kArrowVariableShapeTensor) +
                             " and " + std::string(kArrowBool8) + ")");
    }
    return t;
  }
  if (auto d = primitive_dtype(v.format)) {
    if (!v.children.empty()) malformed(where, "primitive format '" + v.format + "' cannot have children");
    t.dtype = *d;
    t.kind = ArrowTensorType::Kind::primitive;
    return t;
  }
  if (v.format == "b") {
    if (!v.children.empty()) malformed(where, "boolean format 'b' cannot have children");
    t.dtype = DType::boolean();
    t.bit_packed = true;
    t.kind = ArrowTensorType::Kind::primitive;
    return t;
  }
  if (auto n = fixed_list_size(v.format, where)) {
    if (v.children.size() != 1)
      malformed(where, "a FixedSizeList has exactly one child, not " + std::to_string(v.children.size()));
    parse_value_field(*v.children[0], where + " values", t);
    t.shape = {*n};
    t.ndim = 1;
    t.kind = ArrowTensorType::Kind::fixed_size_list;
    return t;
  }
  if (v.format == "+s" && depth == 0) {
    t.kind = ArrowTensorType::Kind::record_batch;
    for (size_t i = 0; i < v.children.size(); ++i) {
      ArrowTensorType c = parse_field(*v.children[i], where + " column " + std::to_string(i), depth + 1);
      if (c.kind == ArrowTensorType::Kind::record_batch)
        unsupported(where, "column " + std::to_string(i) + " is a nested struct, which has no tensor meaning");
      t.columns.push_back(std::move(c));
    }
    return t;
  }
  if (v.format == "+s") unsupported(where, "a nested struct has no tensor meaning");
  unsupported(where, describe_format(v.format) + " has no tensor meaning");
}

// ---- export: owned schema and array trees --------------------------------------------------------------------------
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
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

std::string json_strings(const std::vector<std::string>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + json::quote(v[i]);
  return s + "]";
}

// The extension JSON for an exported type; checked by our own parser (dim_names must be valid UTF-8).
std::string extension_json_text(const ArrowTensorType& t) {
  std::string body;
  auto add_member = [&](const char* key, const std::string& value) {
    body += (body.empty() ? "" : ",") + std::string("\"") + key + "\":" + value;
  };
  if (t.kind == ArrowTensorType::Kind::fixed_shape) add_member("shape", json_ints(t.shape));
  if (!t.dim_names.empty()) add_member("dim_names", json_strings(t.dim_names));
  if (!t.permutation.empty()) add_member("permutation", json_ints(t.permutation));
  if (!t.uniform_shape.empty()) {
    std::string u = "[";
    for (size_t i = 0; i < t.uniform_shape.size(); ++i)
      u += (i ? "," : "") + (t.uniform_shape[i] ? std::to_string(*t.uniform_shape[i]) : std::string("null"));
    add_member("uniform_shape", u + "]");
  }
  // The spec allows "" for a variable-shape tensor without parameters, but Arrow C++ (PyArrow) cannot parse it: "{}".
  std::string text = "{" + body + "}";
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
  if (!src.device().is_host_accessible())
    throw Error(ErrorCode::unsupported, "to_arrow: a copy is needed and the host copy engine cannot read memory on " +
                                            src.device().str());
  auto buf = Buffer::allocate(static_cast<size_t>(std::max<int64_t>(src.nbytes(), 0)));
  std::vector<int64_t> logical(src.shape().begin(), src.shape().end());
  Tensor dst = allocate_ordered(src.dtype(), logical, order, std::move(buf), 0);
  copy(src, dst);
  dst.metadata() = src.metadata();
  return dst;
}

std::vector<int64_t> to_vec(const Dims& d) { return std::vector<int64_t>(d.begin(), d.end()); }

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

// ---- public: metadata framing ----------------------------------------------------------------------------------
std::vector<std::pair<std::string, std::string>> decode_arrow_metadata(std::string_view b) {
  auto fail = [&](size_t at, const std::string& why) -> void {
    throw Error(ErrorCode::invalid_argument, "malformed Arrow metadata at byte " + std::to_string(at) + ": " + why);
  };
  std::vector<std::pair<std::string, std::string>> out;
  if (b.size() < 4) fail(0, "shorter than its 4-byte pair count");
  const int32_t n = load_i32(b.data());
  if (n < 0) fail(0, "negative pair count " + std::to_string(n));
  if (static_cast<size_t>(n) > (b.size() - 4) / 8)
    fail(0, "pair count " + std::to_string(n) + " cannot fit in " + std::to_string(b.size()) + " bytes");
  size_t pos = 4;
  auto item = [&](const char* what) {
    if (b.size() - pos < 4) fail(pos, std::string("truncated ") + what + " length");
    const int32_t len = load_i32(b.data() + pos);
    if (len < 0) fail(pos, std::string("negative ") + what + " length " + std::to_string(len));
    pos += 4;
    if (b.size() - pos < static_cast<size_t>(len))
      fail(pos, std::string(what) + " of " + std::to_string(len) + " bytes runs past the end");
    std::string s(b.substr(pos, static_cast<size_t>(len)));
    pos += static_cast<size_t>(len);
    return s;
  };
  out.reserve(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    std::string k = item("key");
    std::string v = item("value");
    out.emplace_back(std::move(k), std::move(v));
  }
  if (pos != b.size()) fail(pos, std::to_string(b.size() - pos) + " trailing bytes");
  return out;
}

std::string encode_arrow_metadata(const std::vector<std::pair<std::string, std::string>>& pairs) {
  std::string out;
  store_i32(out, pairs.size());
  for (const auto& [k, v] : pairs) {
    store_i32(out, k.size());
    out += k;
    store_i32(out, v.size());
    out += v;
  }
  return out;
}

// ---- public: schema ---------------------------------------------------------------------------------------------
std::vector<int64_t> ArrowTensorType::logical_shape() const {
  if (permutation.empty()) return shape;
  std::vector<int64_t> out(permutation.size());
  for (size_t i = 0; i < permutation.size(); ++i) out[i] = shape[size_t(permutation[i])];
  return out;
}

std::vector<std::string> ArrowTensorType::logical_dim_names() const {
  if (dim_names.empty() || permutation.empty()) return dim_names;
  std::vector<std::string> out(permutation.size());
  for (size_t i = 0; i < permutation.size(); ++i) out[i] = dim_names[size_t(permutation[i])];
  return out;
}

ArrowTensorType parse_arrow_schema(const ArrowSchema& schema) { return parse_field(schema, "schema", 0); }

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
  if ((dev.type == kDLCUDA || dev.type == kDLCUDAManaged) && stream && *stream != -1 && device_runtime().available())
    event = device_runtime().record_event(*stream);
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

// ---- import -------------------------------------------------------------------------------------------------------
namespace {

// Owns a moved ArrowArray: the producer's release callback runs exactly once, when the last view is gone.
struct ImportedArray {
  ArrowArray array{};
  ImportedArray() = default;
  ImportedArray(const ImportedArray&) = delete;
  ImportedArray& operator=(const ImportedArray&) = delete;
  ~ImportedArray() {
    if (array.release) array.release(&array);
  }
};

std::shared_ptr<ImportedArray> take_array(ArrowArray* src) {
  if (!src) throw Error(ErrorCode::invalid_argument, "from_arrow: null ArrowArray");
  if (!src->release)
    throw Error(ErrorCode::invalid_argument, "from_arrow: the ArrowArray is released (its release callback is NULL): "
                                             "it was consumed or moved already");
  std::shared_ptr<ImportedArray> owner;
  try {
    owner = std::make_shared<ImportedArray>();
  } catch (...) {
    src->release(src);
    throw;
  }
  owner->array = *src;  // the move of the C Data Interface: bitwise copy, then mark the source released
  src->release = nullptr;
  return owner;
}

// Releases a schema the import owns; the NULL store guards against producers that forget to mark it released.
struct SchemaGuard {
  ArrowSchema* s;
  void release() {
    if (s && s->release) {
      s->release(s);
      s->release = nullptr;
    }
  }
  ~SchemaGuard() { release(); }
};

struct ImportCtx {
  std::shared_ptr<const void> keep;
  Device device = Device::cpu();
  bool host = true;
  std::optional<bool> copy;
};

void check_node(const ArrowArray& a, int64_t n_buffers, int64_t n_children, const std::string& where) {
  if (!a.release) malformed(where, "the array is released (its release callback is NULL)");
  if (a.length < 0) malformed(where, "negative length " + std::to_string(a.length));
  if (a.offset < 0) malformed(where, "negative offset " + std::to_string(a.offset));
  if (a.null_count < -1) malformed(where, "invalid null_count " + std::to_string(a.null_count));
  add(a.offset, a.length, "the array's offset plus length");
  if (a.n_buffers != n_buffers)
    malformed(where, "n_buffers is " + std::to_string(a.n_buffers) + " but the type has " + std::to_string(n_buffers) +
                         " buffers");
  if (n_buffers > 0 && !a.buffers) malformed(where, "buffers is NULL");
  if (a.n_children != n_children)
    malformed(where, "n_children is " + std::to_string(a.n_children) + " but the type has " +
                         std::to_string(n_children));
  if (n_children > 0 && !a.children) malformed(where, "children is NULL");
  for (int64_t i = 0; i < n_children; ++i)
    if (!a.children[i]) malformed(where, "child " + std::to_string(i) + " is NULL");
  if (a.dictionary) malformed(where, "a dictionary array is attached to a type without one");
}

void check_range(const ArrowArray& a, int64_t first, int64_t count, const std::string& where) {
  if (add(first, count, "a row range") > a.length)
    malformed(where, "needs slots [" + std::to_string(first) + ", " + std::to_string(first + count) +
                         ") but the array's length is " + std::to_string(a.length));
}

// Slots [a.offset + first, + count) must all be valid.
void check_no_nulls(const ArrowArray& a, int64_t first, int64_t count, const ImportCtx& ctx, const std::string& where) {
  if (count == 0 || a.null_count == 0) return;
  const auto* bitmap = static_cast<const uint8_t*>(a.buffers[0]);
  if (!bitmap) {
    if (a.null_count > 0)
      malformed(where, "null_count is " + std::to_string(a.null_count) + " but the validity bitmap is NULL");
    return;
  }
  if (!ctx.host)
    unsupported(where, "the array may hold nulls and its validity bitmap is in " + ctx.device.str() +
                           " memory, which the host cannot check; tensors cannot hold nulls");
  const int64_t begin = a.offset + first, end = begin + count;
  for (int64_t i = begin; i < end;) {
    if ((i & 7) == 0 && end - i >= 8) {
      if (bitmap[i >> 3] != 0xFF) {
        for (int64_t k = i; k < i + 8; ++k)
          if (!((bitmap[k >> 3] >> (k & 7)) & 1))
            malformed(where, "slot " + std::to_string(k - a.offset) + " is null; tensors cannot hold nulls (fill or "
                                                                      "drop them first)");
      }
      i += 8;
      continue;
    }
    if (!((bitmap[i >> 3] >> (i & 7)) & 1))
      malformed(where, "slot " + std::to_string(i - a.offset) + " is null; tensors cannot hold nulls (fill or drop "
                                                               "them first)");
    ++i;
  }
}

// A value array's slots [first, first + count): validated; returns the address of slot `first` (bit-packed
// booleans: of its byte, with the bit index in `bit`).
const char* value_slots(const ArrowArray& a, const ArrowTensorType& t, int64_t first, int64_t count,
                        const ImportCtx& ctx, const std::string& where, int64_t* bit = nullptr) {
  check_node(a, 2, 0, where);
  check_range(a, first, count, where);
  check_no_nulls(a, first, count, ctx, where);
  const auto* base = static_cast<const char*>(a.buffers[1]);
  if (count == 0) return base;
  if (!base) malformed(where, "the data buffer is NULL for " + std::to_string(count) + " values");
  const int64_t slot = a.offset + first;
  if (t.bit_packed) {
    *bit = slot & 7;
    return base + (slot >> 3);
  }
  return base + mul(slot, static_cast<int64_t>(t.dtype.itemsize()), "the data offset");
}

// Bytes of arrow.bool8 values are any non-zero for true; tensorwire's bool is 0 or 1.
bool bytes_are_01(const char* p, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (static_cast<unsigned char>(p[i]) > 1) return false;
  return true;
}

Tensor values_tensor(const char* p, int64_t bit, int64_t n, const ArrowTensorType& t, const ImportCtx& ctx,
                     const std::string& where) {
  if (t.bit_packed) {
    if (ctx.copy == false)
      throw Error(ErrorCode::copy_required, "Arrow " + where + ": Arrow booleans are bit-packed; unpacking them "
                                            "into a bool tensor is a copy, which copy=False forbids (arrow.bool8 "
                                            "imports without one)");
    if (!ctx.host) unsupported(where, "bit-packed booleans in " + ctx.device.str() + " memory cannot be unpacked");
    Tensor out = Tensor::empty(Shape(n), DType::boolean());
    auto* dst = static_cast<uint8_t*>(out.data_ptr());
    const auto* src = reinterpret_cast<const uint8_t*>(p);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t b = bit + i;
      dst[i] = (src[b >> 3] >> (b & 7)) & 1;
    }
    return out;
  }
  Tensor v = Tensor::from_blob(const_cast<char*>(p), Shape(n), t.dtype, ctx.device, ctx.keep, {}, true);
  if (t.bool8 && ctx.host && n > 0 && !bytes_are_01(p, n)) {
    if (ctx.copy == false)
      throw Error(ErrorCode::copy_required, "Arrow " + where + ": arrow.bool8 values other than 0 and 1 must be "
                                            "normalised into a copy, which copy=False forbids");
    Tensor out = Tensor::empty(Shape(n), DType::boolean());
    auto* dst = static_cast<uint8_t*>(out.data_ptr());
    for (int64_t i = 0; i < n; ++i) dst[i] = p[i] != 0;
    return out;
  }
  return v;
}

// Reshapes a flat tensor of rows * prod(shape) elements into (rows, *logical), zero-copy (strided for a permutation).
// One Tensor::make over the flat tensor's buffer (no intermediate views: this is the per-import fast path).
Tensor shape_rows(const Tensor& flat, int64_t rows, const std::vector<int64_t>& phys, const std::vector<int64_t>& perm,
                  bool with_rows) {
  const size_t lead = with_rows ? 1 : 0, n = lead + phys.size();
  std::vector<int64_t> pshape(n), pstrides(n);
  if (with_rows) pshape[0] = rows;
  std::copy(phys.begin(), phys.end(), pshape.begin() + static_cast<std::ptrdiff_t>(lead));
  int64_t st = 1;
  for (size_t k = n; k-- > 0;) {
    pstrides[k] = st;
    st *= pshape[k];
  }
  Layout l{flat.dtype(), {}, {}, flat.byte_offset(), false};
  if (perm.empty()) {
    l.shape = Shape(pshape);
    l.strides = Strides(pstrides);
  } else {
    std::vector<int64_t> lshape(n), lstrides(n);
    if (with_rows) {
      lshape[0] = pshape[0];
      lstrides[0] = pstrides[0];
    }
    for (size_t i = 0; i < perm.size(); ++i) {
      lshape[lead + i] = pshape[lead + size_t(perm[i])];
      lstrides[lead + i] = pstrides[lead + size_t(perm[i])];
    }
    l.shape = Shape(lshape);
    l.strides = Strides(lstrides);
  }
  return Tensor::make(flat.buffer_ptr(), std::move(l), flat.readonly());
}

Tensor import_batch(const ArrowTensorType& t, const ArrowArray& a, int64_t first, int64_t rows, const ImportCtx& ctx,
                    const std::string& where) {
  if (t.kind == ArrowTensorType::Kind::primitive) {
    int64_t bit = 0;
    const char* p = value_slots(a, t, first, rows, ctx, where, &bit);
    return values_tensor(p, bit, rows, t, ctx, where);
  }
  // FixedSizeList (with or without the fixed_shape_tensor extension).
  check_node(a, 1, 1, where);
  check_range(a, first, rows, where);
  check_no_nulls(a, first, rows, ctx, where);
  int64_t n = 1;
  for (int64_t d : t.shape) n = mul(n, d, "the list size");
  const int64_t start = mul(add(a.offset, first, "a row index"), n, "the first value index");
  const int64_t count = mul(rows, n, "the value count");
  int64_t bit = 0;
  const std::string vwhere = where + " values";
  const char* p = value_slots(*a.children[0], t, start, count, ctx, vwhere, &bit);
  Tensor flat = values_tensor(p, bit, count, t, ctx, vwhere);
  return shape_rows(flat, rows, t.shape, t.permutation, true);
}

int64_t read_offset(const void* buf, bool large, int64_t i) {
  if (large) return static_cast<const int64_t*>(buf)[i];
  return static_cast<const int32_t*>(buf)[i];
}

std::vector<Tensor> import_list(const ArrowTensorType& t, const ArrowArray& a, int64_t first, int64_t rows,
                                const ImportCtx& ctx, const std::string& where) {
  check_node(a, 1, 2, where);
  check_range(a, first, rows, where);
  check_no_nulls(a, first, rows, ctx, where);
  if (rows > 0 && !ctx.host)
    unsupported(where, "arrow.variable_shape_tensor offsets and shapes in " + ctx.device.str() +
                           " memory cannot be read by the host");
  const int64_t srow = add(a.offset, first, "a row index");  // row index in the children
  const ArrowArray& data = *a.children[0];
  const ArrowArray& shape = *a.children[1];
  const std::string dwhere = where + " 'data'", swhere = where + " 'shape'";
  check_node(data, 2, 1, dwhere);
  check_range(data, srow, rows, dwhere);
  check_no_nulls(data, srow, rows, ctx, dwhere);
  check_node(shape, 1, 1, swhere);
  check_range(shape, srow, rows, swhere);
  check_no_nulls(shape, srow, rows, ctx, swhere);
  std::vector<Tensor> out;
  if (rows == 0) return out;
  const int64_t ndim = t.ndim;
  // Shapes: int32 values of the shape list's rows.
  ArrowTensorType i32;
  i32.dtype = DType::int32();
  const int64_t sstart = mul(add(shape.offset, srow, "a row index"), ndim, "the first shape value");
  const auto* shapes = reinterpret_cast<const int32_t*>(
      value_slots(*shape.children[0], i32, sstart, mul(rows, ndim, "the shape value count"), ctx, swhere + " values"));
  // Offsets: rows + 1 entries from slot data.offset + srow.
  if (!data.buffers[1]) malformed(dwhere, "the offsets buffer is NULL");
  const int64_t o0 = add(data.offset, srow, "an offset index");
  std::vector<int64_t> offs(static_cast<size_t>(rows) + 1);
  for (int64_t i = 0; i <= rows; ++i) {
    offs[size_t(i)] = read_offset(data.buffers[1], t.large_list, o0 + i);
    if (offs[size_t(i)] < 0) malformed(dwhere, "offset " + std::to_string(o0 + i) + " is negative");
    if (i > 0 && offs[size_t(i)] < offs[size_t(i) - 1])
      malformed(dwhere, "offsets decrease at row " + std::to_string(first + i - 1));
  }
  const int64_t vfirst = offs[0], vcount = offs[size_t(rows)] - offs[0];
  int64_t bit = 0;
  const std::string vwhere = dwhere + " values";
  const char* base = value_slots(*data.children[0], t, vfirst, vcount, ctx, vwhere, &bit);
  Tensor flat = values_tensor(base, bit, vcount, t, ctx, vwhere);
  out.reserve(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int64_t> phys(static_cast<size_t>(ndim));
    int64_t n = 1;
    for (int64_t k = 0; k < ndim; ++k) {
      const int32_t d = shapes[r * ndim + k];
      if (d < 0) malformed(swhere, "row " + std::to_string(first + r) + " has a negative size " + std::to_string(d));
      if (!t.uniform_shape.empty() && t.uniform_shape[size_t(k)] && *t.uniform_shape[size_t(k)] != d)
        malformed(swhere, "row " + std::to_string(first + r) + " has size " + std::to_string(d) + " in dimension " +
                              std::to_string(k) + " which uniform_shape fixes at " +
                              std::to_string(*t.uniform_shape[size_t(k)]));
      phys[size_t(k)] = d;
      n = mul(n, d, "a row's element count");
    }
    const int64_t len = offs[size_t(r) + 1] - offs[size_t(r)];
    if (n != len)
      malformed(where, "row " + std::to_string(first + r) + ": shape holds " + std::to_string(n) +
                           " elements but its data list holds " + std::to_string(len));
    Tensor row = flat.slice(0, offs[size_t(r)] - vfirst, offs[size_t(r) + 1] - vfirst);
    out.push_back(shape_rows(row, 1, phys, t.permutation, false));
  }
  return out;
}

void finish_tensor(Tensor& x, const ArrowTensorType& t, bool force_copy) {
  if (force_copy) {
    if (!x.device().is_host_accessible())
      throw Error(ErrorCode::unsupported, "from_arrow: copy=True for memory on " + x.device().str() +
                                              ": the host copy engine cannot copy it");
    x = x.copy(MemoryOrder::C);
  }
  if (t.metadata) x.metadata() = *t.metadata;
}

ArrowColumn import_column(const ArrowTensorType& t, const ArrowArray& a, int64_t first, int64_t rows,
                          const ImportCtx& ctx, const std::string& where, bool force_copy) {
  ArrowColumn c;
  c.name = t.name;
  c.dim_names = t.logical_dim_names();
  if (t.kind == ArrowTensorType::Kind::variable_shape) {
    c.variable_shape = true;
    c.tensors = import_list(t, a, first, rows, ctx, where);
  } else {
    c.tensors.push_back(import_batch(t, a, first, rows, ctx, where));
  }
  for (Tensor& x : c.tensors) finish_tensor(x, t, force_copy);
  return c;
}

std::vector<ArrowColumn> import_all(const ArrowTensorType& t, const ArrowArray& a, const ImportCtx& ctx,
                                    bool force_copy) {
  std::vector<ArrowColumn> out;
  if (t.kind != ArrowTensorType::Kind::record_batch) {
    check_range(a, 0, a.length, "array");
    out.push_back(import_column(t, a, 0, a.length, ctx, "array", force_copy));
    return out;
  }
  const std::string where = "record batch";
  check_node(a, 1, static_cast<int64_t>(t.columns.size()), where);
  check_no_nulls(a, 0, a.length, ctx, where);
  for (size_t i = 0; i < t.columns.size(); ++i) {
    const std::string cw = "column " + std::to_string(i) + (t.columns[i].name.empty() ? "" : " '" + t.columns[i].name + "'");
    out.push_back(import_column(t.columns[i], *a.children[i], a.offset, a.length, ctx, cw, force_copy));
  }
  return out;
}

Device device_of(const ArrowDeviceArray& d) {
  // Arrow C++ (PyArrow) writes device_id -1 for CPU memory, which has one device.
  if (d.device_type == ARROW_DEVICE_CPU && d.device_id == -1) return Device::cpu();
  if (d.device_id < 0 || d.device_id > kInt32Max)
    throw Error(ErrorCode::invalid_argument, "from_arrow: device_id " + std::to_string(d.device_id) + " is invalid");
  return Device::from_dlpack(DLDevice{static_cast<DLDeviceType>(d.device_type), static_cast<int32_t>(d.device_id)});
}

ArrowColumns columns_from(ArrowSchema* schema, const std::shared_ptr<ImportedArray>& owner, Device dev,
                          const ArrowImportOptions& options) {
  SchemaGuard guard{schema};
  if (!schema) throw Error(ErrorCode::invalid_argument, "from_arrow: null ArrowSchema");
  ArrowTensorType t = parse_arrow_schema(*schema);
  guard.release();  // parsed: the schema is no longer needed
  ImportCtx ctx;
  ctx.keep = owner;
  ctx.device = dev;
  ctx.host = dev.is_host_accessible();
  ctx.copy = options.copy;
  ArrowColumns out;
  out.record_batch = t.kind == ArrowTensorType::Kind::record_batch;
  out.columns = import_all(t, owner->array, ctx, options.copy == true);
  return out;
}

Tensor single_tensor(ArrowColumns all) {
  std::vector<ArrowColumn>& cols = all.columns;
  if (all.record_batch)
    throw Error(ErrorCode::unsupported, "from_arrow: a record batch of " + std::to_string(cols.size()) +
                                            " columns is not one tensor; use from_arrow_columns (Python: "
                                            "tw.from_arrow, which returns a dict of columns)");
  if (cols[0].variable_shape)
    throw Error(ErrorCode::unsupported, "from_arrow: an arrow.variable_shape_tensor array holds tensors of different "
                                        "shapes, not one tensor; use from_arrow_columns (Python: tw.from_arrow, "
                                        "which returns a list of tensors)");
  return std::move(cols[0].tensors[0]);
}

Tensor empty_batch(const ArrowTensorType& t) {
  std::vector<int64_t> dims{0};
  if (t.kind != ArrowTensorType::Kind::primitive) {
    auto l = t.logical_shape();
    dims.insert(dims.end(), l.begin(), l.end());
  }
  Tensor x = Tensor::empty(Shape(dims), t.dtype);
  if (t.metadata) x.metadata() = *t.metadata;
  return x;
}

// Concatenates one column's chunks.
ArrowColumn concat_column(const ArrowTensorType& t, std::vector<ArrowColumn> parts, const ArrowImportOptions& options) {
  ArrowColumn c;
  c.name = t.name;
  c.dim_names = t.logical_dim_names();
  c.variable_shape = t.kind == ArrowTensorType::Kind::variable_shape;
  if (c.variable_shape) {
    for (auto& p : parts)
      for (auto& x : p.tensors) c.tensors.push_back(std::move(x));
    if (options.copy == true)
      for (auto& x : c.tensors)
        if (x.readonly()) x = x.copy(MemoryOrder::C);
    return c;
  }
  std::vector<Tensor> batches;
  for (auto& p : parts)
    if (p.tensors[0].shape()[0] > 0) batches.push_back(std::move(p.tensors[0]));
  if (batches.empty()) {
    c.tensors.push_back(parts.empty() ? empty_batch(t) : std::move(parts[0].tensors[0]));
  } else if (batches.size() == 1) {
    c.tensors.push_back(std::move(batches[0]));
  } else {
    if (options.copy == false)
      throw Error(ErrorCode::copy_required, "from_arrow: the stream holds " + std::to_string(batches.size()) +
                                                " non-empty chunks; concatenating them is a copy, which copy=False "
                                                "forbids");
    int64_t rows = 0;
    for (auto& b : batches) rows = add(rows, b.shape()[0], "the row count");
    std::vector<int64_t> dims = to_vec(batches[0].shape());
    dims[0] = rows;
    Tensor out = Tensor::empty(Shape(dims), t.dtype);
    int64_t at = 0;
    for (auto& b : batches) {
      if (!b.device().is_host_accessible())
        throw Error(ErrorCode::unsupported, "from_arrow: cannot concatenate chunks on " + b.device().str());
      copy(b, out.slice(0, at, at + b.shape()[0]));
      at += b.shape()[0];
    }
    if (t.metadata) out.metadata() = *t.metadata;
    c.tensors.push_back(std::move(out));
  }
  if (options.copy == true && c.tensors[0].readonly()) c.tensors[0] = c.tensors[0].copy(MemoryOrder::C);
  return c;
}

struct StreamGuard {
  ArrowArrayStream s{};
  ~StreamGuard() {
    if (s.release) s.release(&s);
  }
};

std::string stream_error(ArrowArrayStream* s, const char* op, int rc) {
  std::string msg = "from_arrow: the stream's " + std::string(op) + " failed with error " + std::to_string(rc);
  if (s->get_last_error) {
    if (const char* e = s->get_last_error(s)) msg += ": " + std::string(e, strnlen(e, 4096));
  }
  return msg;
}

}  // namespace

ArrowColumns from_arrow_columns(ArrowSchema* schema, ArrowArray* array, const ArrowImportOptions& options) {
  SchemaGuard guard{schema};
  auto owner = take_array(array);
  guard.s = nullptr;
  return columns_from(schema, owner, Device::cpu(), options);
}

ArrowColumns from_arrow_columns(ArrowSchema* schema, ArrowDeviceArray* array, const ArrowImportOptions& options) {
  SchemaGuard guard{schema};
  if (!array) throw Error(ErrorCode::invalid_argument, "from_arrow: null ArrowDeviceArray");
  auto owner = take_array(&array->array);
  const Device dev = device_of(*array);
  if (array->sync_event && dev.type != kDLCPU) {
    if (dev.type != kDLCUDA && dev.type != kDLCUDAManaged && dev.type != kDLCUDAHost)
      throw Error(ErrorCode::unsupported, "from_arrow: tensorwire cannot wait on a sync_event of a " +
                                              std::string(dev.type_name()) + " device");
    device_runtime().synchronize_event(*static_cast<void**>(array->sync_event));
  }
  guard.s = nullptr;
  return columns_from(schema, owner, dev, options);
}

ArrowColumns from_arrow_columns(ArrowArrayStream* stream, const ArrowImportOptions& options) {
  if (!stream) throw Error(ErrorCode::invalid_argument, "from_arrow: null ArrowArrayStream");
  if (!stream->release)
    throw Error(ErrorCode::invalid_argument, "from_arrow: the ArrowArrayStream is released: it was consumed already");
  StreamGuard g;
  g.s = *stream;
  stream->release = nullptr;
  ArrowArrayStream* s = &g.s;
  if (!s->get_schema || !s->get_next)
    throw Error(ErrorCode::invalid_argument, "from_arrow: the stream lacks get_schema or get_next");
  ArrowSchema schema{};
  schema.release = nullptr;
  if (int rc = s->get_schema(s, &schema); rc != 0) throw Error(ErrorCode::invalid_argument, stream_error(s, "get_schema", rc));
  ArrowTensorType t;
  {
    SchemaGuard sg{&schema};
    if (!schema.release) throw Error(ErrorCode::invalid_argument, "from_arrow: get_schema returned a released schema");
    t = parse_arrow_schema(schema);
  }
  // Chunks import without copy=True's copy (the concatenation, or the final pass below, makes it once).
  const bool forbid_copy = options.copy == false;
  std::vector<std::vector<ArrowColumn>> chunks;
  for (;;) {
    ArrowArray a{};
    a.release = nullptr;
    if (int rc = s->get_next(s, &a); rc != 0) throw Error(ErrorCode::invalid_argument, stream_error(s, "get_next", rc));
    if (!a.release) break;
    auto owner = take_array(&a);
    ImportCtx ctx;
    ctx.keep = owner;
    if (forbid_copy) ctx.copy = false;
    chunks.push_back(import_all(t, owner->array, ctx, false));
  }
  ArrowColumns out;
  out.record_batch = t.kind == ArrowTensorType::Kind::record_batch;
  if (!out.record_batch) {
    std::vector<ArrowColumn> parts;
    for (auto& c : chunks) parts.push_back(std::move(c[0]));
    out.columns.push_back(concat_column(t, std::move(parts), options));
    return out;
  }
  for (size_t i = 0; i < t.columns.size(); ++i) {
    std::vector<ArrowColumn> parts;
    for (auto& c : chunks) parts.push_back(std::move(c[i]));
    out.columns.push_back(concat_column(t.columns[i], std::move(parts), options));
  }
  return out;
}

Tensor from_arrow(ArrowSchema* schema, ArrowArray* array, const ArrowImportOptions& options) {
  return single_tensor(from_arrow_columns(schema, array, options));
}
Tensor from_arrow(ArrowSchema* schema, ArrowDeviceArray* array, const ArrowImportOptions& options) {
  return single_tensor(from_arrow_columns(schema, array, options));
}
Tensor from_arrow(ArrowArrayStream* stream, const ArrowImportOptions& options) {
  return single_tensor(from_arrow_columns(stream, options));
}

}  // namespace tw
