// Arrow interop, part 1 of 3: element types, the metadata framing and schema parsing (tensorwire/arrow.hpp).
// Part 2 (arrow_export.cpp) builds schema and array trees; part 3 (arrow_import.cpp) views producers' arrays.
#include "tensorwire/arrow.hpp"

#include <cstring>

#include "arrow_internal.hpp"
#include "core/checked.hpp"
#include "json.hpp"

namespace tw {

namespace {

using namespace arrow_detail;

namespace json = detail::json;
using detail::add;
using detail::mul;

constexpr int64_t kMaxChildren = 1 << 16;
constexpr int64_t kMaxMetadataPairs = 1 << 16;
constexpr int64_t kMaxMetadataItem = int64_t(1) << 30;

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

}  // namespace

namespace arrow_detail {

[[noreturn]] void malformed(const std::string& where, const std::string& why) {
  throw Error(ErrorCode::invalid_argument, "Arrow " + where + ": " + why);
}

[[noreturn]] void unsupported(const std::string& where, const std::string& why) {
  throw Error(ErrorCode::unsupported, "Arrow " + where + ": " + why);
}

const char* format_of(DType d) {
  if (d == DType::boolean()) return "c";
  for (const auto& f : kFormats)
    if (f.dtype == d) return f.format;
  return nullptr;
}

std::string unsupported_dtype_message(DType d) {
  return d.name() + " has no canonical Arrow type (Arrow has none for bfloat16, float8, complex, sub-byte or "
                    "vector types); convert the tensor first (for example to float32)";
}

bool is_identity(const std::vector<int64_t>& p) {
  for (size_t i = 0; i < p.size(); ++i)
    if (p[i] != static_cast<int64_t>(i)) return false;
  return true;
}

std::vector<int64_t> to_vec(const Dims& d) { return std::vector<int64_t>(d.begin(), d.end()); }

}  // namespace arrow_detail

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
}  // namespace tw
